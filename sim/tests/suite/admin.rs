//! The fault endpoint over real HTTP: evict, stall, reset, crash and restart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvroute_sim::worker::Worker;
use serde_json::{json, Value};

use crate::common;

async fn start() -> (Arc<Worker>, u16, u16) {
    let w = common::demo_worker();
    let admin = w.bind_admin().await.unwrap();
    let admin_port = admin.local_addr().unwrap().port();
    let http = w.start().await.unwrap().http;
    let app = kvroute_sim::admin::router(Arc::clone(&w));
    tokio::spawn(async move { axum::serve(admin, app).await });
    (w, http, admin_port)
}

async fn admin(port: u16, path: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/admin/{path}"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// One chat request of `words` words from `seed`, one output token.
async fn chat(http: u16, seed: u64, words: usize) -> reqwest::Response {
    let body = json!({"model": "kvroute-demo", "max_tokens": 1,
        "messages": [{"role": "user", "content": kvroute_testkit::textgen::words(seed, words)}]});
    reqwest::Client::new()
        .post(format!("http://127.0.0.1:{http}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn cached(http: u16) -> u64 {
    let v: Value = chat(http, 5, 300).await.json().await.unwrap();
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn faults_change_what_the_worker_does() {
    let (_w, http, port) = start().await;
    assert_eq!(cached(http).await, 0);
    assert!(cached(http).await > 0);
    let (code, v) = admin(port, "evict?percent=100").await;
    assert_eq!(code, 200);
    assert!(v["evicted_blocks"].as_u64().unwrap() > 0);
    assert_eq!(cached(http).await, 0, "evicted blocks were still reused");
    let (code, _) = admin(port, "evict?all=true").await;
    assert_eq!(code, 200);
    assert_eq!(cached(http).await, 0);
    assert_eq!(admin(port, "evict?percent=300").await.0, 400);
    // A stall holds the next request back.
    assert_eq!(admin(port, "stall?ms=400").await.0, 200);
    let t = Instant::now();
    cached(http).await;
    assert!(t.elapsed() >= Duration::from_millis(350), "stall had no effect: {:?}", t.elapsed());
    // Crash closes the port; restart brings it back empty.
    assert_eq!(admin(port, "crash").await.0, 200);
    assert!(reqwest::get(format!("http://127.0.0.1:{http}/health")).await.is_err());
    let status: Value = reqwest::get(format!("http://127.0.0.1:{port}/admin/status"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["up"], false);
    assert_eq!(admin(port, "evict?percent=10").await.0, 409);
    assert_eq!(admin(port, "restart").await.0, 200);
    assert_eq!(cached(http).await, 0);
    assert!(cached(http).await > 0);
}

/// Time of one uncached request of ~2 k tokens (wall clock).
async fn timed(http: u16, seed: u64) -> Duration {
    let t = Instant::now();
    let r = chat(http, seed, 2000).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    t.elapsed()
}

#[tokio::test]
async fn slow_makes_every_step_take_longer_until_set_back() {
    let (w, http, port) = start().await;
    assert_eq!(admin(port, "slow?factor=0").await.0, 400);
    assert_eq!(admin(port, "slow?factor=1000").await.0, 400);
    // The prefill of ~2 k uncached tokens is ~80 ms of engine time in the demo profile; at the
    // worker's speedup and 20x slower it sleeps at least this long (a lower bound: a slow
    // host only adds to it).
    let p = &w.spec.profile;
    let engine_ms = p.step_floor_ms + p.prefill_ms_per_token * 2000.0;
    let floor = Duration::from_secs_f64(engine_ms * 20.0 / w.spec.speedup / 1000.0);
    let (code, v) = admin(port, "slow?factor=20").await;
    assert_eq!((code, v["slowed_by"].as_f64()), (200, Some(20.0)));
    let slowed = timed(http, 11).await;
    assert!(slowed >= floor, "slowed request took {slowed:?}, expected >= {floor:?}");
    assert_eq!(admin(port, "slow?factor=1").await.0, 200);
    assert_eq!(admin(port, "crash").await.0, 200);
    assert_eq!(admin(port, "slow?factor=2").await.0, 409);
}
