//! A worker seen from outside over real sockets: KV events on ZMQ PUB (three frames, sequence
//! numbers, gaps after dropped batches), the replay ROUTER in both reply shapes, restarts,
//! tenant isolation by `cache_salt`, and a misconfigured template visible on `/tokenize`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvroute_core::model::ModelBundle;
use kvroute_sim::events::{EventConfig, EventEncoding, ReplyShape, END_SEQ};
use kvroute_sim::profile::Profile;
use kvroute_sim::worker::{Ports, Worker, WorkerSpec};
use serde_json::{json, Value};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

async fn worker(encoding: EventEncoding, shape: ReplyShape) -> (Arc<Worker>, Ports) {
    let mut profile = Profile::load("llama3-8b-h100").unwrap();
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
        "messages": [{"role": "user", "content": kvroute_core::textgen::words(seed, words)}]});
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
