//! Deadlines, shedding and priority classes through real Envoy + the kvroute filter + simulated
//! workers: a deadline no worker can meet is answered 429 with `Retry-After` and an
//! OpenAI-style body (or routed best-effort when configured), generous deadlines and garbage
//! header values go through, and a batch request is shed on a busy pool while an interactive
//! one is admitted. Every outcome is checked in Envoy's stats. Nothing here depends on timing:
//! the estimates that decide are the configured profile's, and "busy" is a stream held open.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use kvroute_stack::rawhttp::{self, Proto, RawRequest, RawResponse};
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use kvroute_stack::workload::Conversation;
use serde_json::json;

const CHAT: &str = "/v1/chat/completions";
const TIMEOUT: Duration = Duration::from_secs(30);
const DEADLINE: &str = "x-ttft-deadline-ms";
const PRIORITY: &str = "x-request-priority";

fn listener(stack: &Stack) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], stack.envoy.listen_port))
}

fn body(id: usize) -> String {
    Conversation::new(7, id, 200, 10, 1).body(MODEL, 0, 2, false).to_string()
}

async fn post(stack: &Stack, proto: Proto, id: usize, headers: &[(&str, &[u8])]) -> RawResponse {
    let mut req = RawRequest::post(CHAT, body(id));
    for (k, v) in headers {
        req = req.header(k, v.to_vec());
    }
    rawhttp::send(listener(stack), proto, &req, TIMEOUT).await.unwrap()
}

/// Waits until every `(metric, at least)` of `want` shows in `/stats/prometheus`.
async fn counted(stack: &Stack, want: &[(&str, f64)]) -> HashMap<String, f64> {
    kvroute_stack::eventually("admission counters", Duration::from_secs(10), || async {
        let m = stack.envoy.prometheus().await.ok()?;
        want.iter().all(|(k, v)| m.get(*k).is_some_and(|got| got >= v)).then_some(m)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: want {want:?}"))
}

fn assert_shed(r: &RawResponse, code: &str) {
    assert_eq!(r.status, 429, "{}", r.text());
    let retry: u32 = r.header("retry-after").and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(retry >= 1, "Retry-After: {:?}", r.header("retry-after"));
    assert_eq!(r.header("content-type").as_deref(), Some("application/json"));
    let v = r.json().unwrap_or_else(|| panic!("not JSON: {}", r.text()));
    assert_eq!(v["error"]["code"], code, "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    // Not routed: the decision header says why it was shed and what the best worker promised.
    let detail = r.header("x-kvroute-decision").unwrap_or_default();
    let reason = if code == "pool_saturated" { "saturated" } else { "deadline" };
    assert!(detail.starts_with(&format!("shed={reason}; ")), "{detail}");
    let field = |k: &str| {
        detail.split("; ").find_map(|kv| kv.strip_prefix(k)?.strip_prefix('=')).unwrap_or("")
    };
    assert!(field("best_worker").starts_with("127.0.0.1:"), "{detail}");
    let promised: f64 = field("promised_ttft_ms").parse().unwrap_or(-1.0);
    if let Some(deadline) =
        field("deadline_ms").parse::<f64>().ok().filter(|_| reason == "deadline")
    {
        assert!(promised > deadline, "{detail}");
    }
    assert_eq!(field("retry_after_s"), r.header("retry-after").unwrap_or_default(), "{detail}");
}

#[tokio::test]
async fn unmeetable_deadlines_are_shed_and_generous_or_garbage_ones_go_through() {
    let stack = Stack::start(StackOptions::default()).await.unwrap();
    // Any prefill costs more than 1 ms in the configured profile (5 ms base).
    for proto in [Proto::Http1, Proto::H2c] {
        let r = post(&stack, proto, 1, &[(DEADLINE, b"1")]).await;
        assert_shed(&r, "ttft_deadline_unmeetable");
    }
    let ok = post(&stack, Proto::Http1, 2, &[(DEADLINE, b"600000")]).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert!(ok.header("x-kvroute-decision").is_some());
    // Garbage deadline and priority values fall back to the defaults (no deadline,
    // interactive): routed as usual, over both protocols, bytes that are not UTF-8 included.
    let garbage: [&[u8]; 7] =
        [b"abc", b"-5", b"1.5", b"0", b"99999999999999999999999", b"\xff\xfe", b" 1e3 "];
    for proto in [Proto::Http1, Proto::H2c] {
        for (i, g) in garbage.iter().enumerate() {
            let r = post(&stack, proto, 10 + i, &[(DEADLINE, g), (PRIORITY, g)]).await;
            assert_eq!(r.status, 200, "{} {g:?}: {}", proto.name(), r.text());
        }
    }
    counted(
        &stack,
        &[
            ("kvroute_shed_deadline", 2.0),
            ("kvroute_class_shed_deadline{kvroute_class=\"interactive\"}", 2.0),
            ("kvroute_class_admitted{kvroute_class=\"interactive\"}", 15.0),
        ],
    )
    .await;
}

#[tokio::test]
async fn best_effort_routes_a_missed_model_default_deadline_and_counts_it() {
    let opts = StackOptions {
        workers: 2,
        model_overrides: json!({"ttft_deadline_ms": 1}),
        filter: json!({"admission": {"on_deadline_miss": "best_effort"}}),
        ..Default::default()
    };
    let stack = Stack::start(opts).await.unwrap();
    // No header: the model's 1 ms default applies, and is missed.
    let r = post(&stack, Proto::Http1, 1, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("x-kvroute-decision").is_some());
    // A header overrides the model's default.
    let r = post(&stack, Proto::Http1, 2, &[(DEADLINE, b"600000")]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let m = counted(
        &stack,
        &[
            ("kvroute_best_effort_deadline", 1.0),
            ("kvroute_class_best_effort_deadline{kvroute_class=\"interactive\"}", 1.0),
            ("kvroute_class_admitted{kvroute_class=\"interactive\"}", 1.0),
        ],
    )
    .await;
    assert_eq!(m.get("kvroute_shed_deadline").copied().unwrap_or(0.0), 0.0);
}

#[tokio::test]
async fn batch_is_shed_on_a_busy_pool_while_interactive_is_admitted() {
    // One worker, one Envoy thread; batch may only take idle workers (max_wait_ms 0).
    let opts = StackOptions {
        workers: 1,
        envoy_concurrency: 1,
        sim_args: ["--step-floor-ms", "20"].map(String::from).to_vec(),
        filter: json!({"admission": {"classes": [
            {"name": "interactive"},
            {"name": "batch", "max_wait_ms": 0, "queue_weight": 2}
        ]}}),
        ..Default::default()
    };
    let stack = Stack::start(opts).await.unwrap();
    let idle = post(&stack, Proto::Http1, 1, &[(PRIORITY, b"batch")]).await;
    assert_eq!(idle.status, 200, "batch on an idle pool: {}", idle.text());
    // Hold a long stream open: the worker is busy (decoding) until it is dropped.
    let http = reqwest::Client::new();
    let mut long = Conversation::new(7, 99, 200, 10, 1).body(MODEL, 0, 3000, true);
    long["stream"] = json!(true);
    let mut held =
        http.post(format!("{}{CHAT}", stack.base_url())).json(&long).send().await.unwrap();
    assert_eq!(held.status(), 200);
    assert!(held.chunk().await.unwrap().is_some(), "the held stream sent nothing");
    let batch = post(&stack, Proto::Http1, 2, &[(PRIORITY, b"batch")]).await;
    assert_shed(&batch, "pool_saturated");
    // The same request as interactive (explicitly, and by default) is admitted.
    for headers in [&[(PRIORITY, &b"interactive"[..])][..], &[]] {
        let r = post(&stack, Proto::Http1, 2, headers).await;
        assert_eq!(r.status, 200, "interactive on a busy pool: {}", r.text());
    }
    drop(held);
    counted(
        &stack,
        &[
            ("kvroute_shed_saturated", 1.0),
            ("kvroute_class_shed_saturated{kvroute_class=\"batch\"}", 1.0),
            ("kvroute_class_admitted{kvroute_class=\"batch\"}", 1.0),
            ("kvroute_class_admitted{kvroute_class=\"interactive\"}", 3.0),
        ],
    )
    .await;
}
