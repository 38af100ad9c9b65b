//! Decoding engines' KV-event batches (vLLM, SGLang, TensorRT-LLM share the format): msgpack
//! `[ts, [event...], rank]` with events as positional arrays or maps with `"type"`. Untrusted
//! bytes: the decoder returns an error, never panics (fuzz target `event_decode`).

use rmpv::Value;
use thiserror::Error;

/// An engine's block identity: an integer or bytes, normalized to a map key.
pub type EngineKey = u64;

/// Memory tier of stored blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    Gpu,
    Cpu,
    Storage,
}

impl Tier {
    fn parse(v: Option<&Value>) -> Tier {
        match v.and_then(Value::as_str).map(str::to_ascii_uppercase).as_deref() {
            Some("CPU") | Some("CPU_PINNED") => Tier::Cpu,
            Some("STORAGE") | Some("DISK") => Tier::Storage,
            _ => Tier::Gpu,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Tier::Gpu => "GPU",
            Tier::Cpu => "CPU",
            Tier::Storage => "STORAGE",
        }
    }
}

/// One decoded event.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    Stored {
        hashes: Vec<EngineKey>,
        parent: Option<EngineKey>,
        token_ids: Vec<u32>,
        block_size: usize,
        tier: Tier,
        lora_name: Option<String>,
        /// `cache_salt` of the chain, when these blocks start it.
        salt: Option<String>,
    },
    Removed {
        hashes: Vec<EngineKey>,
        tier: Tier,
    },
    AllCleared,
    /// A tag this decoder does not know (ignored, counted).
    Unknown(String),
}

/// One decoded batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub ts: f64,
    pub events: Vec<EngineEvent>,
    pub rank: Option<u64>,
}

#[derive(Debug, Error, PartialEq)]
pub enum DecodeError {
    #[error("payload is not msgpack: {0}")]
    Msgpack(String),
    #[error("batch is not [ts, events, rank]")]
    Shape,
    #[error("event field '{0}' is missing or has the wrong type")]
    Field(&'static str),
}

fn key(v: &Value) -> Option<EngineKey> {
    match v {
        Value::Integer(i) => i.as_u64().or_else(|| i.as_i64().map(|x| x as u64)),
        Value::Binary(b) => Some(xxhash_rust::xxh3::xxh3_64(b)),
        Value::String(s) => s.as_str().map(|s| xxhash_rust::xxh3::xxh3_64(s.as_bytes())),
        _ => None,
    }
}

fn keys(v: Option<&Value>, name: &'static str) -> Result<Vec<EngineKey>, DecodeError> {
    match v {
        Some(Value::Array(a)) => a.iter().map(|x| key(x).ok_or(DecodeError::Field(name))).collect(),
        // Single-hash form (one event per page in SGLang).
        Some(v) => key(v).map(|k| vec![k]).ok_or(DecodeError::Field(name)),
        None => Err(DecodeError::Field(name)),
    }
}

/// Named access to an event's fields, whichever encoding it came in.
struct Fields<'a> {
    tag: &'a str,
    positional: Option<&'a [Value]>,
    named: Option<&'a [(Value, Value)]>,
}

impl<'a> Fields<'a> {
    fn of(v: &'a Value) -> Result<Fields<'a>, DecodeError> {
        match v {
            Value::Array(a) => {
                let tag = a.first().and_then(Value::as_str).ok_or(DecodeError::Field("tag"))?;
                Ok(Fields { tag, positional: Some(&a[1..]), named: None })
            }
            Value::Map(m) => {
                let tag = m
                    .iter()
                    .find(|(k, _)| k.as_str() == Some("type"))
                    .and_then(|(_, v)| v.as_str())
                    .ok_or(DecodeError::Field("type"))?;
                Ok(Fields { tag, positional: None, named: Some(m) })
            }
            _ => Err(DecodeError::Field("event")),
        }
    }

    /// Field `name`, at position `pos` in the array form. Nil reads as absent.
    fn get(&self, name: &str, pos: usize) -> Option<&'a Value> {
        let v = match (self.positional, self.named) {
            (Some(p), _) => p.get(pos),
            (_, Some(m)) => m.iter().find(|(k, _)| k.as_str() == Some(name)).map(|(_, v)| v),
            _ => None,
        };
        v.filter(|v| !v.is_nil())
    }

    /// SGLang's salted stores carry a trailing `{"cache_salt": ...}` map.
    fn trailing_salt(&self) -> Option<String> {
        let salt_in = |m: &[(Value, Value)]| {
            m.iter()
                .find(|(k, _)| k.as_str() == Some("cache_salt"))
                .and_then(|(_, v)| v.as_str())
                .map(str::to_owned)
        };
        match (self.positional, self.named) {
            (Some(p), _) => p.iter().rev().find_map(|v| v.as_map().and_then(|m| salt_in(m))),
            (_, Some(m)) => salt_in(m).or_else(|| {
                m.iter()
                    .find(|(k, _)| k.as_str() == Some("metadata"))
                    .and_then(|(_, v)| v.as_map())
                    .and_then(|m| salt_in(m))
            }),
            _ => None,
        }
    }
}

/// The salt in the first block's extra keys: the last string of `extra_keys[0]` after the
/// LoRA adapter's name, which vLLM puts first in every block's keys.
fn extra_keys_salt(v: Option<&Value>, lora: Option<&str>) -> Option<String> {
    let first = v?.as_array()?.first()?.as_array()?;
    let skip = usize::from(lora.is_some() && first.first().and_then(Value::as_str) == lora);
    first[skip..].iter().rev().find_map(|x| x.as_str()).map(str::to_owned)
}

fn event(v: &Value) -> Result<EngineEvent, DecodeError> {
    let f = Fields::of(v)?;
    match f.tag {
        "BlockStored" | "BlockStoredWithMetadata" => {
            let token_ids = match f.get("token_ids", 2) {
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|t| {
                        t.as_u64()
                            .and_then(|t| u32::try_from(t).ok())
                            .ok_or(DecodeError::Field("token_ids"))
                    })
                    .collect::<Result<Vec<u32>, _>>()?,
                _ => return Err(DecodeError::Field("token_ids")),
            };
            let block_size = f
                .get("block_size", 3)
                .and_then(Value::as_u64)
                .ok_or(DecodeError::Field("block_size"))? as usize;
            let lora_name = f.get("lora_name", 6).and_then(Value::as_str).map(str::to_owned);
            let salt = extra_keys_salt(f.get("extra_keys", 7), lora_name.as_deref())
                .or_else(|| f.trailing_salt());
            Ok(EngineEvent::Stored {
                hashes: keys(f.get("block_hashes", 0), "block_hashes")?,
                parent: f.get("parent_block_hash", 1).and_then(key),
                token_ids,
                block_size,
                tier: Tier::parse(f.get("medium", 5)),
                lora_name,
                salt,
            })
        }
        "BlockRemoved" => Ok(EngineEvent::Removed {
            hashes: keys(f.get("block_hashes", 0), "block_hashes")?,
            tier: Tier::parse(f.get("medium", 1)),
        }),
        "AllBlocksCleared" => Ok(EngineEvent::AllCleared),
        other => Ok(EngineEvent::Unknown(other.to_owned())),
    }
}

/// Deepest msgpack nesting read, as rmpv counts it (a container and its contents are two
/// levels). A batch needs about a dozen (batch, events, event, extra keys, one block's keys,
/// a key tuple); rmpv's own default (1024) lets a hostile payload recurse so deep that a debug
/// build overflows a 2 MiB thread stack (fuzz seed `event_decode/deep-nesting.msgpack`).
const MAX_DEPTH: usize = 64;

/// Decodes one batch payload.
pub fn decode_batch(payload: &[u8]) -> Result<Batch, DecodeError> {
    let v = rmpv::decode::read_value_with_max_depth(&mut &payload[..], MAX_DEPTH)
        .map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    let a = v.as_array().ok_or(DecodeError::Shape)?;
    let ts = match a.first() {
        Some(Value::F64(f)) => *f,
        Some(Value::F32(f)) => f64::from(*f),
        Some(Value::Integer(i)) => i.as_f64().unwrap_or(0.0),
        _ => return Err(DecodeError::Shape),
    };
    let events = a.get(1).and_then(Value::as_array).ok_or(DecodeError::Shape)?;
    let events = events.iter().map(event).collect::<Result<Vec<_>, _>>()?;
    Ok(Batch { ts, events, rank: a.get(2).and_then(Value::as_u64) })
}

#[cfg(test)]
mod tests {
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
            vec![EngineEvent::Stored {
                hashes: vec![7],
                parent: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 4,
                tier: Tier::Gpu,
                lora_name: None,
                salt: None
            }]
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
        let removed = m(vec![
            ("type", "BlockRemoved".into()),
            ("block_hashes", Value::Array(vec![9.into()])),
        ]);
        let batch = Value::Array(vec![
            Value::F64(2.0),
            Value::Array(vec![stored, removed, m(vec![("type", "Future".into())])]),
            Value::Nil,
        ]);
        let b = decode_batch(&enc(batch)).unwrap();
        match &b.events[0] {
            EngineEvent::Stored { hashes, tier, salt, .. } => {
                assert_eq!(hashes.len(), 1);
                assert_eq!(*tier, Tier::Cpu);
                assert_eq!(salt.as_deref(), Some("tenant"));
            }
            e => panic!("{e:?}"),
        }
        assert_eq!(b.events[1], EngineEvent::Removed { hashes: vec![9], tier: Tier::Gpu });
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
                EngineEvent::Stored { lora_name, salt, .. } => (lora_name, salt),
                e => panic!("{e:?}"),
            }
        };
        let keys = |k: Vec<&str>| {
            Value::Array(vec![Value::Array(k.into_iter().map(Value::from).collect())])
        };
        assert_eq!(stored(keys(vec!["sql"])), (Some("sql".into()), None));
        assert_eq!(
            stored(keys(vec!["sql", "tenant"])),
            (Some("sql".into()), Some("tenant".into()))
        );
        // Older releases keyed adapters by their integer id.
        let int_key = Value::Array(vec![Value::Array(vec![3.into(), "tenant".into()])]);
        assert_eq!(stored(int_key).1.as_deref(), Some("tenant"));
    }

    #[test]
    fn bad_payloads_are_errors() {
        assert!(decode_batch(&[0xc1]).is_err());
        assert_eq!(decode_batch(&enc(Value::from(3))), Err(DecodeError::Shape));
        let no_tokens = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![Value::Array(vec![
                "BlockStored".into(),
                Value::Array(vec![1.into()]),
            ])]),
            Value::Nil,
        ]);
        assert_eq!(decode_batch(&enc(no_tokens)), Err(DecodeError::Field("token_ids")));
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
        assert!(matches!(r, Err(DecodeError::Msgpack(_))), "{r:?}");
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_batch(&bytes);
        }
    }
}
