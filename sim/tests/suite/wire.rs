//! A worker seen from outside over real sockets: KV events on ZMQ PUB (three frames, sequence
//! numbers, gaps after dropped batches), the replay ROUTER in both reply shapes, restarts,
//! tenant isolation by `cache_salt`, and a misconfigured template visible on `/tokenize`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_sim::events::{
    encode_batch, encode_batch_shaped, EventConfig, EventEncoding, EventShape, KvEvent, ReplyShape,
    END_SEQ,
};
use kvroute_sim::profile::HardwareProfile;
use kvroute_sim::worker::{Ports, Worker, WorkerSpec};
use rmpv::Value as Msgpack;
use serde_json::{json, Value};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

async fn worker(encoding: EventEncoding, shape: ReplyShape) -> (Arc<Worker>, Ports) {
    let mut profile = HardwareProfile::load("llama3-8b-h100").unwrap();
    profile.num_gpu_blocks = 512;
    let events =
        EventConfig { topic: "kv-events".into(), encoding, reply_shape: shape, buffer_steps: 1000 };
    let spec = WorkerSpec::loopback("kvroute-demo", profile, events);
    let w = Worker::new(spec, ModelBundle::demo().unwrap(), Ports::default());
    let ports = w.start().await.unwrap();
    (w, ports)
}

fn chat(words: usize, seed: u64, salt: Option<&str>) -> Value {
    let mut b = json!({"model": "kvroute-demo", "max_tokens": 2,
        "messages": [{"role": "user", "content": kvroute_testkit::textgen::words(seed, words)}]});
    if let Some(s) = salt {
        b["cache_salt"] = json!(s);
    }
    b
}

async fn post(port: u16, body: &Value) -> Value {
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    r.json().await.unwrap()
}

async fn subscriber(port: u16) -> zeromq::SubSocket {
    let mut sub = zeromq::SubSocket::new();
    sub.connect(&format!("tcp://127.0.0.1:{port}")).await.unwrap();
    sub.subscribe("").await.unwrap();
    sub
}

/// Receives the next message with a deadline: (topic, seq, payload).
async fn next(sub: &mut zeromq::SubSocket) -> Option<(Bytes, u64, Bytes)> {
    let m = tokio::time::timeout(Duration::from_secs(5), sub.recv()).await.ok()?.ok()?;
    let f = m.into_vec();
    assert_eq!(f.len(), 3, "a KV-event message has three frames");
    let seq = u64::from_be_bytes(f[1].as_ref().try_into().unwrap());
    Some((f[0].clone(), seq, f[2].clone()))
}

/// Sends requests until the subscriber has seen its first message (ZMQ's slow joiner).
async fn first_message(sub: &mut zeromq::SubSocket, http: u16) -> (Bytes, u64, Bytes) {
    for i in 0..50 {
        post(http, &chat(40, 1000 + i, None)).await;
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(200), next(sub)).await {
            return m;
        }
    }
    panic!("no KV event arrived");
}

fn first_event_tag(payload: &[u8]) -> String {
    let v = rmpv::decode::read_value(&mut &payload[..]).unwrap();
    let ev = &v[1][0];
    match ev {
        rmpv::Value::Array(a) => a[0].as_str().unwrap().to_owned(),
        rmpv::Value::Map(m) => m
            .iter()
            .find(|(k, _)| k.as_str() == Some("type"))
            .unwrap()
            .1
            .as_str()
            .unwrap()
            .to_owned(),
        _ => panic!("unexpected event {ev}"),
    }
}

#[tokio::test]
async fn events_have_three_frames_increasing_sequence_and_both_encodings() {
    for enc in [EventEncoding::Array, EventEncoding::Map] {
        let (_w, p) = worker(enc, ReplyShape::Triple).await;
        let mut sub = subscriber(p.events).await;
        let (topic, seq, payload) = first_message(&mut sub, p.http).await;
        assert_eq!(&topic[..], b"kv-events");
        assert_eq!(first_event_tag(&payload), "BlockStored");
        post(p.http, &chat(40, 1, None)).await;
        let (_, seq2, _) = next(&mut sub).await.unwrap();
        assert!(seq2 > seq, "sequence numbers increase");
    }
}

#[tokio::test]
async fn dropped_batches_show_as_a_gap_and_replay_fills_it() {
    for shape in [ReplyShape::Pair, ReplyShape::Triple] {
        let (w, p) = worker(EventEncoding::Array, shape).await;
        let mut sub = subscriber(p.events).await;
        let (_, seen, _) = first_message(&mut sub, p.http).await;
        let (_, log) = w.current().await.unwrap();
        log.drop_remaining.store(2, std::sync::atomic::Ordering::SeqCst);
        for i in 0..3 {
            post(p.http, &chat(40, 2000 + i, None)).await;
        }
        let (_, after, _) = next(&mut sub).await.unwrap();
        assert!(after >= seen + 3, "no gap: {seen} then {after}");
        // Replay from just after the last seen batch returns the missing ones, then END.
        let mut dealer = zeromq::DealerSocket::new();
        dealer.connect(&format!("tcp://127.0.0.1:{}", p.replay)).await.unwrap();
        let req = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&(seen + 1).to_be_bytes()),
        ])
        .unwrap();
        dealer.send(req).await.unwrap();
        let mut got = Vec::new();
        loop {
            let m = tokio::time::timeout(Duration::from_secs(5), dealer.recv())
                .await
                .unwrap()
                .unwrap()
                .into_vec();
            assert!(m[0].is_empty(), "delimiter frame first");
            let body = &m[1..];
            let (seq_frame, payload) = match shape {
                ReplyShape::Pair => (&body[0], &body[1]),
                ReplyShape::Triple => (&body[1], &body[2]),
            };
            assert_eq!(body.len(), if shape == ReplyShape::Pair { 2 } else { 3 });
            if seq_frame.as_ref() == END_SEQ {
                assert!(payload.is_empty());
                break;
            }
            got.push(u64::from_be_bytes(seq_frame.as_ref().try_into().unwrap()));
        }
        assert!(got.starts_with(&[seen + 1, seen + 2]), "replay returned {got:?}");
    }
}

#[tokio::test]
async fn restart_empties_the_cache_and_resets_the_sequence() {
    let (w, p) = worker(EventEncoding::Map, ReplyShape::Triple).await;
    let body = chat(200, 7, None);
    post(p.http, &body).await;
    let again = post(p.http, &body).await;
    assert!(again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0);
    let (_, log) = w.current().await.unwrap();
    assert!(log.next_seq() > 0);
    w.crash().await;
    assert!(
        reqwest::get(format!("http://127.0.0.1:{}/health", p.http)).await.is_err(),
        "port still open after crash"
    );
    let p2 = w.start().await.unwrap();
    assert_eq!(p2.http, p.http, "restart reuses the ports");
    let (_, log) = w.current().await.unwrap();
    assert_eq!(log.next_seq(), 0);
    let fresh = post(p.http, &body).await;
    assert_eq!(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn cache_salt_isolates_tenants() {
    let (_w, p) = worker(EventEncoding::Array, ReplyShape::Triple).await;
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    post(p.http, &chat(200, 9, Some("tenant-a"))).await;
    assert!(cached(&post(p.http, &chat(200, 9, Some("tenant-a"))).await) > 0);
    assert_eq!(cached(&post(p.http, &chat(200, 9, Some("tenant-b"))).await), 0);
    assert_eq!(cached(&post(p.http, &chat(200, 9, None)).await), 0);
}

#[tokio::test]
async fn a_misconfigured_template_shows_on_tokenize() {
    let (w, p) = worker(EventEncoding::Array, ReplyShape::Triple).await;
    let canary =
        json!({"model": "kvroute-demo", "messages": [{"role": "user", "content": "canary"}]});
    let tokenize = |port: u16| {
        let canary = canary.clone();
        async move {
            let r = reqwest::Client::new()
                .post(format!("http://127.0.0.1:{port}/tokenize"))
                .json(&canary)
                .send()
                .await
                .unwrap();
            r.json::<Value>().await.unwrap()["tokens"].clone()
        }
    };
    let before = tokenize(p.http).await;
    w.misconfig.lock().unwrap().chat_template =
        Some("{% for m in messages %}{{ m.content }}{% endfor %}".into());
    w.start().await.unwrap();
    let after = tokenize(p.http).await;
    assert_ne!(before, after);
}

// The engines' event shapes (vLLM 0.33's groups, offloading placeholders, duplicate stores;
// SGLang's pages and EAGLE pairs), as the simulator publishes them on request.

fn stored() -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: vec![7],
        parent_block_hash: None,
        token_ids: vec![1, 2, 3, 4],
        block_size: 4,
        medium: "GPU",
        lora_name: None,
        salt: None,
    }
}

fn decoded(shape: &str, events: &[KvEvent], block_size: usize) -> Vec<Msgpack> {
    let shape = EventShape::parse(shape).unwrap();
    let b = encode_batch_shaped(1.0, events, None, EventEncoding::Map, &shape, block_size);
    let v = rmpv::decode::read_value(&mut &b[..]).unwrap();
    v.as_array().unwrap()[1].as_array().unwrap().clone()
}

/// (type, group_idx, kv_cache_spec_kind, medium) of one event.
type Tagged<'a> = (&'a str, Option<u64>, Option<&'a str>, Option<&'a str>);

fn field<'a>(e: &'a Msgpack, k: &str) -> Option<&'a Msgpack> {
    e.as_map().unwrap().iter().find(|(n, _)| n.as_str() == Some(k)).map(|(_, v)| v)
}

#[test]
fn the_default_shape_publishes_as_before() {
    let events = [stored(), KvEvent::AllBlocksCleared];
    let plain = encode_batch(1.5, &events, Some(0), EventEncoding::Array);
    let shape = EventShape::parse("").unwrap();
    assert_eq!(encode_batch_shaped(1.5, &events, Some(0), EventEncoding::Array, &shape, 4), plain);
    assert!(EventShape::parse("pages=3").is_err());
}

#[test]
fn vllm_shapes_groups_placeholders_and_repeats() {
    let removed = KvEvent::BlockRemoved { block_hashes: vec![7], medium: "GPU" };
    let events = [stored(), removed, KvEvent::AllBlocksCleared];
    let got = decoded("groups=full_attention,sliding_window;offload;repeat", &events, 4);
    // Per group: the store twice, then its placeholder; the removal twice per group;
    // one reset.
    let tags: Vec<Tagged<'_>> = got
        .iter()
        .map(|e| {
            (
                field(e, "type").and_then(Msgpack::as_str).unwrap(),
                field(e, "group_idx").and_then(Msgpack::as_u64),
                field(e, "kv_cache_spec_kind").and_then(Msgpack::as_str),
                field(e, "medium").and_then(Msgpack::as_str),
            )
        })
        .collect();
    let s = |g, k| ("BlockStored", Some(g), Some(k), Some("GPU"));
    let p = |g| ("BlockStored", Some(g), None, Some("CPU"));
    let r = |g| ("BlockRemoved", Some(g), None, Some("GPU"));
    assert_eq!(
        tags,
        vec![
            s(0, "full_attention"),
            s(0, "full_attention"),
            p(0),
            s(1, "sliding_window"),
            s(1, "sliding_window"),
            p(1),
            r(0),
            r(0),
            r(1),
            r(1),
            ("AllBlocksCleared", None, None, None),
        ]
    );
    let placeholder = &got[2];
    assert_eq!(field(placeholder, "block_size").and_then(Msgpack::as_u64), Some(0));
    assert_eq!(field(placeholder, "token_ids").and_then(Msgpack::as_array).map(Vec::len), Some(0));
}

#[test]
fn sglang_shapes_pages_and_pairs() {
    let removed = KvEvent::BlockRemoved { block_hashes: vec![7], medium: "GPU" };
    let got = decoded("page=1;pairs", &[stored(), removed], 4);
    let hashes = |e: &Msgpack| field(e, "block_hashes").unwrap().as_array().unwrap().clone();
    let stored_hashes = hashes(&got[0]);
    assert_eq!(stored_hashes.len(), 4);
    assert_eq!(stored_hashes[3], Msgpack::from(7u64), "the last page keeps the block's hash");
    assert_eq!(hashes(&got[1]), stored_hashes, "a removal names every page");
    assert_eq!(field(&got[0], "block_size").and_then(Msgpack::as_u64), Some(1));
    let pairs = field(&got[0], "token_ids").unwrap().as_array().unwrap();
    let pair = |a: u64, b: u64| Msgpack::Array(vec![a.into(), b.into()]);
    assert_eq!(pairs, &vec![pair(1, 2), pair(2, 3), pair(3, 4), pair(4, 4)]);
}
