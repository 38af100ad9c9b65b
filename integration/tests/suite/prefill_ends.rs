//! The work a worker has done on its queue counts from its last prefill that ended, through
//! real Envoy + the kvroute filter + one simulated worker: a request sent while the worker is
//! busy with another one's prefill gets none of its own computed until that prefill ends, so
//! the next decision must not credit it with the time it spent waiting.
//!
//! Nothing depends on timing: the worker runs one request at a time (`--max-num-seqs 1`), the
//! long request holds its slot by a stream left open after its first token, and the filter's
//! cost profile (configured, calibration off) is what prices the queue, not the worker's
//! speed. The filter before this change estimated the next request's wait at 140 ms of the
//! queued prompt's 2 430 (it credited the 2.3 s the prompt had waited), and fails here.

use std::time::Duration;

use kvroute_stack::client;
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const WITHIN: Duration = Duration::from_secs(30);
/// The filter's configured prefill cost: ten times the worker's, so that the queued prompt
/// (~250 tokens) is priced at seconds and the client's own latency is small beside it.
const PROFILE_MS_PER_TOKEN: f64 = 10.0;

fn body(tag: &str, words: usize, max_tokens: u64) -> Value {
    json!({"model": MODEL, "max_tokens": max_tokens, "stream": true, "messages": [
        {"role": "user", "content": format!("{tag} {}", kvroute_testkit::textgen::words(5, words))}
    ]})
}

/// The worker's gauge `name`, from its own `/metrics`.
async fn gauge(stack: &Stack, name: &str) -> Option<u64> {
    let url = format!("http://{}/metrics", stack.workers[0].addr);
    let text = reqwest::get(url).await.ok()?.text().await.ok()?;
    let line = text.lines().find(|l| l.starts_with(&format!("{name}{{")))?;
    Some(line.rsplit(' ').next()?.parse::<f64>().ok()? as u64)
}

async fn until(stack: &Stack, name: &str, n: u64) {
    kvroute_stack::eventually(name, Duration::from_secs(20), || async {
        gauge(stack, name).await.filter(|&v| v >= n)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: want {name} >= {n}"));
}

fn predicted_wait_ms(r: &client::Reply) -> f64 {
    let w = r.decision_field("predicted_wait_ms").expect("no decision header");
    w.parse().unwrap()
}

/// Sends `body` in a task; the reply (with its decision header) comes back once served.
fn send_later(url: &str, body: &Value) -> tokio::task::JoinHandle<client::Reply> {
    let (url, b) = (url.to_owned(), body.to_string().into_bytes());
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        let r = client::send(&http, &url, CHAT, b, &[]);
        tokio::time::timeout(WITHIN, r).await.expect("no answer").unwrap()
    })
}

#[tokio::test]
async fn a_request_queued_behind_a_prefill_is_not_credited_with_the_time_it_waited() {
    let opts = StackOptions {
        workers: 1,
        envoy_concurrency: 1,
        // A slow prefill (2 000 tokens at 1 ms: about 2 s) that the queued request waits
        // behind; one request at a time, so the queue stays queued while the first decodes.
        sim_args: ["--max-num-seqs", "1", "--prefill-ms-per-token", "1"].map(String::from).to_vec(),
        filter: json!({"calibration": {"enabled": false}}),
        model_overrides: json!({"profile": {
            "prefill_base_ms": 0.0,
            "prefill_ms_per_token": PROFILE_MS_PER_TOKEN,
            "prefill_ms_per_token_sq": 0.0,
            "decode_interference_ms": 0.0,
            // No step that later arrivals fill: the queue is the whole wait.
            "step_token_budget": 0,
        }}),
        ..Default::default()
    };
    let stack = Stack::start(opts).await.unwrap();
    let url = stack.envoy.base_url();
    // The long request starts its prefill (the worker answers a stream's headers when it
    // takes the request); a short one queues behind it.
    let send =
        reqwest::Client::new().post(format!("{url}{CHAT}")).json(&body("long", 2_000, 3_000));
    let mut long = tokio::time::timeout(WITHIN, send.send()).await.expect("no answer").unwrap();
    assert_eq!(long.status(), 200);
    let sent = std::time::Instant::now();
    let queued = send_later(&url, &body("queued", 200, 2));
    until(&stack, "vllm:num_requests_waiting", 1).await;
    // The long prefill ends (its first chunk); it keeps decoding, holding the slot.
    let first = tokio::time::timeout(WITHIN, long.chunk()).await.expect("long stream silent");
    assert!(first.unwrap().is_some(), "the long stream sent nothing");
    let queued_age = sent.elapsed();
    // The next request waits for the whole queued prompt: none of it has run, though it was
    // sent over 2 s ago (its age would say most of it had).
    let next = send_later(&url, &body("next", 50, 2));
    until(&stack, "vllm:num_requests_waiting", 2).await;
    drop(long);
    let (queued, next) = (queued.await.unwrap(), next.await.unwrap());
    assert_eq!((queued.status, next.status), (200, 200), "{} {}", queued.body, next.body);
    let queued_tokens: f64 = queued.decision_field("prompt_tokens").unwrap().parse().unwrap();
    let wait = predicted_wait_ms(&next);
    let whole = queued_tokens * PROFILE_MS_PER_TOKEN;
    eprintln!("next: wait {wait} ms, queued prompt {whole} ms, sent {queued_age:?} before");
    assert!(queued_tokens >= 150.0, "the queued prompt: {queued_tokens} tokens");
    assert!(
        wait >= 0.8 * whole,
        "the next request is estimated to wait {wait} ms, the queued prompt costs {whole} ms"
    );
}
