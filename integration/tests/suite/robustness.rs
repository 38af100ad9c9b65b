//! Bad input, worker loss, streaming and load accounting through real Envoy + kvroute.

use std::time::Duration;

use kvroute_stack::client::{self, Reply};
use kvroute_stack::eventually;
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use kvroute_stack::workload::Conversation;
use serde_json::{json, Value};

async fn raw(stack: &Stack, body: Vec<u8>) -> Reply {
    let http = reqwest::Client::new();
    client::send(&http, &stack.base_url(), "/v1/chat/completions", body, &[]).await.unwrap()
}

fn error_code(r: &Reply) -> Value {
    let v = r.json().unwrap_or_else(|| panic!("not a JSON error body: {}", r.body));
    assert!(v["error"]["message"].is_string(), "no error.message: {v}");
    v["error"]["code"].clone()
}

#[tokio::test]
async fn bad_requests_get_openai_style_errors() {
    let stack = Stack::start(StackOptions::default()).await.unwrap();
    let r = raw(&stack, b"{\"model\": \"kvroute-demo\", \"messages\": [".to_vec()).await;
    assert_eq!((r.status, error_code(&r)), (400, json!("invalid_json")));
    let r = raw(
        &stack,
        json!({"messages": [{"role": "user", "content": "hi"}]}).to_string().into_bytes(),
    )
    .await;
    assert_eq!((r.status, error_code(&r)), (400, json!("missing_model")));
    let r = raw(
        &stack,
        json!({"model": "gpt-unknown", "messages": [{"role": "user", "content": "hi"}]})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!((r.status, error_code(&r)), (404, json!("model_not_found")));
    let huge =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "x".repeat(10 << 20)}]});
    let r = raw(&stack, huge.to_string().into_bytes()).await;
    assert_eq!((r.status, error_code(&r)), (413, json!("request_too_large")));
    // A 7 MiB body is within Envoy's limit but past the filter's tokenization bound: it is
    // routed load-only and reaches a worker, which refuses its length itself.
    let big = json!({"model": MODEL, "messages": [{"role": "user", "content": "word ".repeat((7 << 20) / 5)}], "max_tokens": 1});
    let r = raw(&stack, big.to_string().into_bytes()).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(error_code(&r), json!("context_length_exceeded"));
    assert_eq!(r.decision_field("fallback").as_deref(), Some("too_long"));
    // The stack still serves normal traffic.
    let ok = raw(
        &stack,
        Conversation::new(1, 1, 50, 5, 1).body(MODEL, 0, 2, false).to_string().into_bytes(),
    )
    .await;
    assert_eq!(ok.status, 200);
}

#[tokio::test]
async fn requests_survive_a_killed_worker() {
    let mut stack = Stack::start(StackOptions::default()).await.unwrap();
    let http = reqwest::Client::new();
    let c = Conversation::new(9, 0, 300, 20, 12);
    let first = client::chat(&http, &stack.base_url(), &c.body(MODEL, 0, 2, false)).await.unwrap();
    let a = first.worker.unwrap();
    let idx = stack.addrs().iter().position(|w| *w == a).unwrap();
    stack.kill_worker(idx).await;
    // kvroute still believes `a` holds the prefix: the retry must move to the fallback.
    for t in 1..12 {
        let r = client::chat(&http, &stack.base_url(), &c.body(MODEL, t, 2, false)).await.unwrap();
        assert_eq!(r.status, 200, "turn {t} failed after the worker died: {}", r.body);
        assert_ne!(r.worker.as_deref(), Some(a.as_str()));
        if t == 5 {
            // Envoy's health checks notice the loss too.
            stack.wait_healthy(2).await.unwrap();
        }
    }
}

#[tokio::test]
async fn streams_arrive_chunk_by_chunk() {
    let opts = StackOptions {
        sim_args: ["--step-floor-ms", "60"].map(String::from).to_vec(),
        ..Default::default()
    };
    let stack = Stack::start(opts).await.unwrap();
    let http = reqwest::Client::new();
    let body = Conversation::new(5, 0, 100, 10, 1).body(MODEL, 0, 10, true);
    let r = client::chat(&http, &stack.base_url(), &body).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.chunks.len() >= 8, "only {} body chunks: the stream was buffered", r.chunks.len());
    let first = r.chunks[0];
    let last = *r.chunks.last().unwrap();
    // Ten tokens at 60 ms a step: the first must arrive long before the last.
    assert!(last - first >= Duration::from_millis(400), "chunks arrived together: {:?}", r.chunks);
    assert!(r.cached_tokens.is_some(), "final usage chunk missing");
}

#[tokio::test]
async fn load_returns_to_zero_after_finished_failed_and_aborted_requests() {
    let opts = StackOptions {
        sim_args: ["--step-floor-ms", "30"].map(String::from).to_vec(),
        ..Default::default()
    };
    let stack = Stack::start(opts).await.unwrap();
    let http = reqwest::Client::new();
    let c = Conversation::new(11, 0, 200, 10, 4);
    // Finished, streamed and non-streamed.
    for t in 0..2 {
        let r = client::chat(&http, &stack.base_url(), &c.body(MODEL, t, 3, t == 1)).await.unwrap();
        assert_eq!(r.status, 200);
    }
    // Aborted mid-stream by the client.
    for _ in 0..3 {
        let mut resp = http
            .post(format!("{}/v1/chat/completions", stack.base_url()))
            .json(&c.body(MODEL, 2, 200, true))
            .send()
            .await
            .unwrap();
        assert!(resp.chunk().await.unwrap().is_some());
        drop(resp);
    }
    // Aborted before the first byte.
    let slow = c.body(MODEL, 3, 200, true);
    let _ = tokio::time::timeout(
        Duration::from_millis(5),
        client::chat(&http, &stack.base_url(), &slow),
    )
    .await;
    let addrs = stack.addrs();
    eventually("load back to zero", Duration::from_secs(20), || async {
        let m = stack.envoy.prometheus().await.ok()?;
        let zero = addrs.iter().all(|w| {
            let seg: String =
                w.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
            let reqs = m
                .get(&format!("kvroute_worker_inflight_requests{{kvroute_worker=\"{seg}\"}}"))
                .copied();
            let toks = m
                .get(&format!("kvroute_worker_inflight_prefill_tokens{{kvroute_worker=\"{seg}\"}}"))
                .copied();
            reqs.unwrap_or(0.0) == 0.0 && toks.unwrap_or(0.0) == 0.0
        });
        let seen = m.keys().any(|k| k.starts_with("kvroute_worker_inflight_requests"));
        (zero && seen).then_some(())
    })
    .await
    .unwrap();
}
