//! `POST /sim/what_if` and `POST /reset_prefix_cache` over real HTTP.

use std::sync::Arc;

use kvroute_sim::engine::{Chunk, Timing};
use kvroute_sim::profile::HardwareProfile;
use kvroute_sim::worker::Worker;
use serde_json::{json, Value};

use crate::common;
use common::MODEL;

async fn start() -> (Arc<Worker>, u16) {
    let w = common::demo_worker();
    let http = w.start().await.unwrap().http;
    (w, http)
}

async fn post(http: u16, path: &str, body: &Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{http}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn what_if(http: u16, endpoint: &str, request: &Value) -> (u16, Value) {
    let (code, text) =
        post(http, "/sim/what_if", &json!({"endpoint": endpoint, "request": request})).await;
    (code, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn chat(seed: u64, words: usize, max_tokens: u64) -> Value {
    json!({"model": MODEL, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": kvroute_testkit::textgen::words(seed, words)}]})
}

async fn metric(http: u16, name: &str) -> f64 {
    let text = reqwest::get(format!("http://127.0.0.1:{http}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    kvroute_updater::engine_metrics::EngineMetrics::parse(&text).sum(name).unwrap_or(f64::NAN)
}

#[tokio::test]
async fn what_if_renders_like_the_endpoint_and_answers_the_modelled_ttft() {
    let (_w, http) = start().await;
    let req = chat(3, 400, 4);
    let (code, a) = what_if(http, "/v1/chat/completions", &req).await;
    assert_eq!(code, 200, "{a}");
    // The prompt is rendered and tokenized exactly as the endpoint (and /tokenize) does.
    let (_, tok) =
        post(http, "/tokenize", &json!({"model": MODEL, "messages": req["messages"]})).await;
    let count = serde_json::from_str::<Value>(&tok).unwrap()["count"].as_u64().unwrap();
    assert_eq!(a["prompt_tokens"].as_u64(), Some(count));
    assert_eq!((a["cached_tokens"].as_u64(), a["running"].as_u64()), (Some(0), Some(0)));
    assert_eq!(a["waiting"].as_u64(), Some(0));
    // An idle worker: one step of the whole prompt, as the profile's timing says (plus the
    // moment the question takes to reach the engine).
    let t = Timing::from_profile(&HardwareProfile::load("llama3-8b-h100").unwrap(), 1.0);
    let want = t.step_ms(&[Chunk { cached: 0, new: count as usize }], 0, 0);
    let got = a["ttft_ms"].as_f64().unwrap();
    assert!(got >= want - 1e-9 && got < want + 100.0, "{got} vs {want}");
    // Asking changed nothing: no prefix-cache query was counted, nothing ran.
    assert_eq!(metric(http, "vllm:prefix_cache_queries_total").await, 0.0);
    // Serve it; the same question now reuses the cached prefix and costs less.
    let (code, _) = post(http, "/v1/chat/completions", &req).await;
    assert_eq!(code, 200);
    let (_, again) = what_if(http, "/v1/chat/completions", &req).await;
    assert!(again["cached_tokens"].as_u64().unwrap() > 0, "{again}");
    assert!(again["ttft_ms"].as_f64().unwrap() < got, "{again} vs {a}");
    // A tenant's salt enters the hash: nothing reused.
    let mut salted = req.clone();
    salted["cache_salt"] = json!("tenant-b");
    let (_, s) = what_if(http, "/v1/chat/completions", &salted).await;
    assert_eq!(s["cached_tokens"].as_u64(), Some(0));
    // The completions endpoint too.
    let (code, c) = what_if(
        http,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "hello there", "max_tokens": 3}),
    )
    .await;
    assert_eq!(code, 200, "{c}");
    assert!(c["prompt_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn what_if_refuses_what_the_endpoint_refuses() {
    let (_w, http) = start().await;
    // The endpoint's own errors, status and body alike.
    for req in [
        json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
        json!({"model": MODEL, "max_tokens": 200_000,
            "messages": [{"role": "user", "content": "hi"}]}),
        json!({"model": MODEL}),
    ] {
        let (code, body) = post(http, "/v1/chat/completions", &req).await;
        let (wcode, wbody) = post(
            http,
            "/sim/what_if",
            &json!({"endpoint": "/v1/chat/completions", "request": req}),
        )
        .await;
        assert!((400..500).contains(&code), "{code} {body}");
        assert_eq!((wcode, wbody), (code, body), "for {req}");
    }
    let (code, v) = what_if(http, "/v1/embeddings", &json!({})).await;
    assert_eq!(code, 400, "{v}");
    assert_eq!(v["error"]["param"], "endpoint");
    let (code, _) = post(http, "/sim/what_if", &json!({"request": {}})).await;
    assert_eq!(code, 400);
}

#[tokio::test]
async fn reset_prefix_cache_answers_like_vllm() {
    let (_w, http) = start().await;
    let req = chat(9, 300, 1);
    post(http, "/v1/chat/completions", &req).await;
    let (_, a) = what_if(http, "/v1/chat/completions", &req).await;
    assert!(a["cached_tokens"].as_u64().unwrap() > 0);
    let (code, body) = post(http, "/reset_prefix_cache", &json!({})).await;
    assert_eq!((code, body.as_str()), (200, ""));
    let (_, a) = what_if(http, "/v1/chat/completions", &req).await;
    assert_eq!(a["cached_tokens"].as_u64(), Some(0), "{a}");
    // While a request holds blocks the engine refuses, and vLLM's server still answers 200.
    post(http, "/v1/chat/completions", &req).await;
    let mut stream = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{http}/v1/chat/completions"))
        .json(&json!({"model": MODEL, "max_tokens": 2000, "stream": true,
            "messages": [{"role": "user", "content": "keep going"}]}))
        .send()
        .await
        .unwrap();
    assert!(stream.chunk().await.unwrap().is_some());
    let (code, body) = post(http, "/reset_prefix_cache", &json!({})).await;
    assert_eq!((code, body.as_str()), (200, ""));
    let (_, a) = what_if(http, "/v1/chat/completions", &req).await;
    assert!(a["cached_tokens"].as_u64().unwrap() > 0, "the cache was reset while in use: {a}");
}
