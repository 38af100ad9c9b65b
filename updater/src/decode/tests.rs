use super::*;
use proptest::prelude::*;

/// The reference's 42-byte example batch (older array form).
#[test]
fn decodes_the_reference_example() {
    let mut b = vec![0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x91, 0x9a, 0xab];
    b.extend_from_slice(b"BlockStored");
    b.extend_from_slice(&[0x91, 0x07, 0xc0, 0x94, 1, 2, 3, 4, 4, 0xc0, 0xa3]);
    b.extend_from_slice(b"GPU");
    b.extend_from_slice(&[0xc0, 0xc0, 0x00, 0x00]);
    let batch = decode_batch(&b).unwrap();
    assert_eq!(batch.ts, 1.5);
    assert_eq!(batch.rank, Some(0));
    assert_eq!(
        batch.events,
        vec![EngineEvent::stored(Stored {
            hashes: vec![7],
            parent: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 4,
            place: Place::Gpu,
            lora_name: None,
            salt: None,
            group: Some(0),
            kind: None,
            lookahead: false,
            pairs: false,
        })]
    );
}

fn enc(v: Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &v).unwrap();
    out
}

#[test]
fn decodes_map_form_sglang_variants_and_bytes_hashes() {
    let m = |pairs: Vec<(&str, Value)>| {
        Value::Map(pairs.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
    };
    let stored = m(vec![
        ("type", "BlockStoredWithMetadata".into()),
        ("block_hashes", Value::Binary(vec![1, 2, 3])),
        ("token_ids", Value::Array(vec![5.into(), 6.into()])),
        ("block_size", 2.into()),
        ("medium", "CPU".into()),
        ("metadata", m(vec![("cache_salt", "tenant".into())])),
    ]);
    let removed =
        m(vec![("type", "BlockRemoved".into()), ("block_hashes", Value::Array(vec![9.into()]))]);
    let batch = Value::Array(vec![
        Value::F64(2.0),
        Value::Array(vec![stored, removed, m(vec![("type", "Future".into())])]),
        Value::Nil,
    ]);
    let b = decode_batch(&enc(batch)).unwrap();
    match &b.events[0] {
        EngineEvent::Stored(s) => {
            assert_eq!(s.hashes.len(), 1);
            assert_eq!(s.place, Place::Cpu);
            assert_eq!(s.salt.as_deref(), Some("tenant"));
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(
        b.events[1],
        EngineEvent::Removed { hashes: vec![9], place: Place::Gpu, group: None }
    );
    assert_eq!(b.events[2], EngineEvent::Unknown("Future".into()));
}

/// vLLM puts the adapter's name first in every block's extra keys: it is not a salt.
#[test]
fn an_adapters_extra_keys_are_not_a_salt() {
    let stored = |extra: Value| {
        let event = Value::Array(vec![
            "BlockStored".into(),
            Value::Array(vec![7.into()]),
            Value::Nil,
            Value::Array(vec![1.into(), 2.into()]),
            2.into(),
            3.into(),
            "GPU".into(),
            "sql".into(),
            extra,
        ]);
        let batch = Value::Array(vec![Value::F64(1.0), Value::Array(vec![event]), Value::Nil]);
        match decode_batch(&enc(batch)).unwrap().events.remove(0) {
            EngineEvent::Stored(s) => (s.lora_name, s.salt),
            e => panic!("{e:?}"),
        }
    };
    let keys =
        |k: Vec<&str>| Value::Array(vec![Value::Array(k.into_iter().map(Value::from).collect())]);
    assert_eq!(stored(keys(vec!["sql"])), (Some("sql".into()), None));
    assert_eq!(stored(keys(vec!["sql", "tenant"])), (Some("sql".into()), Some("tenant".into())));
    // Older releases keyed adapters by their integer id.
    let int_key = Value::Array(vec![Value::Array(vec![3.into(), "tenant".into()])]);
    assert_eq!(stored(int_key).1.as_deref(), Some("tenant"));
}

#[test]
fn bad_payloads_are_errors() {
    assert!(decode_batch(&[0xc1]).is_err());
    assert_eq!(decode_batch(&enc(Value::from(3))), Err(DecodeError::PayloadShape));
    let no_tokens = Value::Array(vec![
        Value::F64(0.0),
        Value::Array(vec![Value::Array(vec!["BlockStored".into(), Value::Array(vec![1.into()])])]),
        Value::Nil,
    ]);
    // One bad event is not a bad batch.
    assert_eq!(
        decode_batch(&enc(no_tokens)).map(|b| b.events),
        Ok(vec![EngineEvent::Bad(DecodeError::Field("token_ids"))])
    );
}

#[test]
fn deep_nesting_is_an_error() {
    let mut deep = vec![0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0];
    deep.extend(std::iter::repeat_n(0x91, 3000));
    deep.push(0xc0);
    let r = std::thread::Builder::new()
        .stack_size(1024 * 1024)
        .spawn(move || decode_batch(&deep))
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(r, Err(DecodeError::Bounds(BoundError::Depth(DEFAULT_MAX_DEPTH))));
}

#[test]
fn bombs_are_refused_before_decoding() {
    // 4 MiB of nils in the events array: 4 Mi real elements, over the element cap.
    let n = 4usize << 20;
    let mut nils = vec![0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd];
    nils.extend_from_slice(&(n as u32).to_be_bytes());
    nils.extend(std::iter::repeat_n(0xc0, n));
    nils.push(0xc0);
    assert_eq!(
        decode_batch(&nils),
        Err(DecodeError::Bounds(BoundError::Elements(DEFAULT_MAX_ELEMENTS)))
    );
    let small = Bounds { max_elements: 64, ..Bounds::default() };
    let ok = enc(Value::Array(vec![Value::F64(1.0), Value::Array(vec![]), Value::Nil]));
    assert!(decode_batch_with(&ok, &small).is_ok());
    // A map declaring 2^32 - 1 entries in 20 bytes.
    let mut map = vec![0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff];
    map.extend([0xc0; 4]);
    assert!(matches!(
        decode_batch(&map),
        Err(DecodeError::Bounds(BoundError::Declared { what: "elements", .. }))
    ));
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
}

fn ints(v: &[u64]) -> Value {
    Value::Array(v.iter().map(|&x| Value::from(x)).collect())
}

fn events_of(events: Vec<Value>) -> Vec<EngineEvent> {
    let batch = Value::Array(vec![Value::F64(1.0), Value::Array(events), Value::Nil]);
    decode_batch(&enc(batch)).unwrap().events
}

/// vLLM 0.33's map form: groups, kinds, locality, lookahead, offloading placeholders.
#[test]
fn decodes_vllm_033_fields() {
    let full = map(vec![
        ("type", "BlockStored".into()),
        ("block_hashes", ints(&[11, 12])),
        ("parent_block_hash", Value::Nil),
        ("token_ids", ints(&[1, 2, 3, 4])),
        ("block_size", 2.into()),
        ("lora_id", Value::Nil),
        ("medium", "GPU".into()),
        ("lora_name", Value::Nil),
        ("group_idx", 1.into()),
        ("kv_cache_spec_kind", "sliding_window".into()),
        ("kv_cache_spec_sliding_window", 128.into()),
        ("lookahead_token_ids", Value::Array(vec![ints(&[3]), ints(&[5])])),
    ]);
    let placeholder = map(vec![
        ("type", "BlockStored".into()),
        ("block_hashes", ints(&[12])),
        ("parent_block_hash", Value::Nil),
        ("token_ids", ints(&[])),
        ("block_size", 0.into()),
        ("medium", "CPU".into()),
        ("group_idx", 0.into()),
        ("locality", "REMOTE".into()),
    ]);
    let removed = map(vec![
        ("type", "BlockRemoved".into()),
        ("block_hashes", ints(&[12])),
        ("medium", "lmcache-disk".into()),
        ("group_idx", 2.into()),
    ]);
    let cleared = map(vec![("type", "AllBlocksCleared".into())]);
    let ev = events_of(vec![full, placeholder, removed, cleared]);
    let EngineEvent::Stored(s) = &ev[0] else { panic!("{ev:?}") };
    assert_eq!((s.group, s.kind.as_deref()), (Some(1), Some("sliding_window")));
    assert!(s.lookahead && !s.pairs);
    assert_eq!(s.token_ids, [1, 2, 3, 4]);
    let EngineEvent::Stored(p) = &ev[1] else { panic!("{ev:?}") };
    assert_eq!((p.block_size, p.token_ids.len(), p.place), (0, 0, Place::Remote));
    assert_eq!(
        ev[2],
        EngineEvent::Removed { hashes: vec![12], place: Place::Unknown, group: Some(2) }
    );
    assert_eq!(ev[3], EngineEvent::AllCleared { place: None });
}

/// SGLang: media names, EAGLE's `[t_i, t_i+1]` pairs, negative int64 hashes.
#[test]
fn decodes_sglang_media_and_speculative_pairs() {
    let pair = |a: u64, b: u64| ints(&[a, b]);
    let stored = |medium: &str, tokens: Value| {
        map(vec![
            ("type", "BlockStored".into()),
            ("block_hashes", Value::Array(vec![Value::from(-5i64)])),
            ("parent_block_hash", Value::Nil),
            ("token_ids", tokens),
            ("block_size", 2.into()),
            ("medium", medium.into()),
        ])
    };
    let ev = events_of(vec![
        stored("GPU", Value::Array(vec![pair(7, 8), pair(8, 9)])),
        stored("CPU_PINNED", ints(&[7, 8])),
        stored("EXTERNAL", ints(&[7, 8])),
        stored("DISK", ints(&[7, 8])),
        stored("GPU", Value::Array(vec![pair(7, 8), 9.into()])),
    ]);
    let EngineEvent::Stored(s) = &ev[0] else { panic!("{ev:?}") };
    assert_eq!(s.token_ids, [7, 8], "the token stream the pairs start with");
    assert!(s.pairs && s.lookahead);
    assert_eq!(s.hashes, [(-5i64) as u64]);
    let places: Vec<Place> = ev[1..4]
        .iter()
        .map(|e| match e {
            EngineEvent::Stored(s) => s.place,
            e => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(places, [Place::HostPinned, Place::Remote, Place::Storage]);
    assert_eq!(ev[4], EngineEvent::Bad(DecodeError::Field("token_ids")), "mixed forms");
}

proptest! {
    #[test]
    fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode_batch(&bytes);
    }
}
