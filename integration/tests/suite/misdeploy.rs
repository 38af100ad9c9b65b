//! A misdeployed kvroute never holds traffic and says what is wrong: run against real Envoy
//! with the pieces a control plane may leave out (`allow_on_headers_stop_iteration`, the
//! updater, `override_host`), every POST completes, and the metrics, the decision header and
//! one warning in Envoy's log name the missing piece.

use std::collections::HashMap;
use std::time::Duration;

use kvroute_stack::client::{self, decision_field, Reply};
use kvroute_stack::eventually;
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use kvroute_stack::workload::Conversation;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const STOP_ITERATION: &str = "allow_on_headers_stop_iteration: true";
const BUFFER_FILTER: &str = "          - name: envoy.filters.http.buffer
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer
              max_request_bytes: 8388608
";

/// One Envoy thread (one watch), a short body wait and quick warnings.
fn opts(filter: Value, edits: &[(&str, &str)]) -> StackOptions {
    let mut f = json!({"tick_ms": 100, "load": {"shard_timeout_ms": 1500}});
    kvroute_stack::stack::merge(&mut f, &filter);
    StackOptions {
        filter: f,
        envoy_concurrency: 1,
        envoy_edits: edits.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(),
        ..Default::default()
    }
}

async fn metrics(stack: &Stack) -> HashMap<String, f64> {
    stack.envoy.prometheus().await.unwrap_or_default()
}

fn value(m: &HashMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}

fn fallback_key(reason: &str) -> String {
    format!("kvroute_fallback_requests{{kvroute_fallback=\"{reason}\"}}")
}

fn symptom_key(symptom: &str) -> String {
    format!("kvroute_misdeployed_present{{kvroute_symptom=\"{symptom}\"}}")
}

fn log_lines(stack: &Stack, needle: &str) -> usize {
    std::fs::read_to_string(&stack.envoy.log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

async fn chat(http: &reqwest::Client, stack: &Stack, conv: usize, turn: usize) -> Reply {
    let c = Conversation::new(11, conv, 60, 8, 4);
    let body = c.body(MODEL, turn, 2, false);
    tokio::time::timeout(Duration::from_secs(20), client::chat(http, &stack.base_url(), &body))
        .await
        .expect("a POST hung")
        .expect("a POST failed")
}

fn field(r: &Reply, key: &str) -> String {
    let d = r.decision.as_deref().unwrap_or_else(|| panic!("no decision header: {r:?}"));
    decision_field(d, key).unwrap_or_else(|| panic!("no {key} in {d}")).to_owned()
}

#[tokio::test]
async fn without_stop_iteration_every_post_completes_counted_and_named() {
    let filter = json!({"misdeployment": {"body_wait_ms": 500, "knowledge_within_ms": 0}});
    let edits = [(STOP_ITERATION, "allow_on_headers_stop_iteration: false")];
    let stack = Stack::start(opts(filter, &edits)).await.unwrap();
    let http = reqwest::Client::new();

    // The first POST waits for a body that never comes, then goes on unrouted; the thread now
    // knows, and the next ones go on at once (no wait is measured: each just completes).
    for i in 0..6 {
        let r = chat(&http, &stack, i, 0).await;
        assert_eq!(r.status, 200, "request {i}");
        assert_eq!(field(&r, "fallback"), "body_not_delivered", "request {i}");
        assert_eq!(field(&r, "misdeployed"), "body_not_delivered", "request {i}");
        assert!(r.worker.is_some(), "request {i} served by a worker");
    }
    let m = metrics(&stack).await;
    assert_eq!(value(&m, &fallback_key("body_not_delivered")), 6.0, "{m:?}");
    eventually("the gauge names the symptom", Duration::from_secs(10), || async {
        (value(&metrics(&stack).await, &symptom_key("body_not_delivered")) == 1.0).then_some(())
    })
    .await
    .unwrap();
    // One warning, loud and plain, however many requests (at most once a minute).
    eventually("the warning is logged", Duration::from_secs(10), || async {
        (log_lines(&stack, "misdeployed (body_not_delivered)") == 1).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(log_lines(&stack, "misdeployed (body_not_delivered)"), 1);
    assert!(
        std::fs::read_to_string(&stack.envoy.log)
            .unwrap_or_default()
            .contains("allow_on_headers_stop_iteration: true"),
        "the warning names the setting"
    );
}

#[tokio::test]
async fn with_stop_iteration_requests_are_routed_and_nothing_is_misdeployed() {
    let filter = json!({"misdeployment": {"knowledge_within_ms": 0}});
    let stack = Stack::start(opts(filter, &[])).await.unwrap();
    let http = reqwest::Client::new();
    for turn in 0..4 {
        let r = chat(&http, &stack, 0, turn).await;
        assert_eq!(r.status, 200);
        assert_eq!(field(&r, "fallback"), "none");
        assert_eq!(field(&r, "misdeployed"), "none");
        assert_eq!(r.worker.as_deref(), Some(field(&r, "worker").as_str()), "served as chosen");
    }
    let m = metrics(&stack).await;
    for s in ["body_not_delivered", "no_knowledge", "override_ignored"] {
        assert_eq!(value(&m, &symptom_key(s)), 0.0, "{s}");
    }
    assert_eq!(value(&m, &fallback_key("body_not_delivered")), 0.0);
}

/// A client that sends part of its body and stalls gets 408 after the body wait, counted
/// `body_timeout` (with the shipped chain the native buffer filter before kvroute holds such a
/// request instead, until `request_timeout`); a stall is not taken for a misconfigured host.
#[tokio::test]
async fn a_body_stalled_part_way_gets_408() {
    let filter = json!({"misdeployment": {"body_wait_ms": 500, "knowledge_within_ms": 0}});
    // Without the native buffer filter before kvroute (Istio's and Envoy Gateway's chains have
    // none), body chunks reach the filter as they come.
    let stack = Stack::start(opts(filter, &[(BUFFER_FILTER, "")])).await.unwrap();
    let http = reqwest::Client::new();
    assert_eq!(field(&chat(&http, &stack, 0, 0).await, "fallback"), "none");

    let body = Conversation::new(11, 1, 60, 8, 4).body(MODEL, 0, 2, false).to_string();
    let head = &body.as_bytes()[..body.len() / 2];
    let mut conn =
        tokio::net::TcpStream::connect(("127.0.0.1", stack.envoy.listen_port)).await.unwrap();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: kvroute\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    conn.write_all(head).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut answer))
        .await
        .expect("the stalled request was never answered")
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"request_timeout\""), "{text}");
    let m = metrics(&stack).await;
    assert_eq!(value(&m, &fallback_key("body_timeout")), 1.0);
    assert_eq!(value(&m, &symptom_key("body_not_delivered")), 0.0);
    // The thread still pauses for bodies: the next request is routed.
    assert_eq!(field(&chat(&http, &stack, 2, 0).await, "fallback"), "none");
}

#[tokio::test]
async fn no_knowledge_and_an_ignored_header_are_named() {
    // No updater runs; the cluster's override_host reads another header, so it balances on
    // its own (round robin) whatever kvroute chooses.
    let filter = json!({"misdeployment": {
        "knowledge_within_ms": 500, "override_window": 8, "warn_interval_ms": 600000}});
    let edits = [("- header: x-gateway-destination-endpoint", "- header: x-not-kvroute")];
    let stack = Stack::start(opts(filter, &edits)).await.unwrap();
    let http = reqwest::Client::new();
    eventually("no_knowledge", Duration::from_secs(15), || async {
        (value(&metrics(&stack).await, &symptom_key("no_knowledge")) == 1.0).then_some(())
    })
    .await
    .unwrap();
    // One conversation: kvroute keeps choosing the worker that holds its prefix; round robin
    // over three workers serves another one two times in three.
    let mut last = None;
    for turn in 0..12 {
        last = Some(chat(&http, &stack, 0, turn % 4).await);
    }
    let last = last.unwrap();
    let named = field(&last, "misdeployed");
    assert!(named.contains("no_knowledge"), "{named}");
    assert!(named.contains("override_ignored"), "{named}");
    eventually("override_ignored gauge", Duration::from_secs(10), || async {
        (value(&metrics(&stack).await, &symptom_key("override_ignored")) == 1.0).then_some(())
    })
    .await
    .unwrap();
    eventually("both warnings logged once", Duration::from_secs(10), || async {
        (log_lines(&stack, "misdeployed (no_knowledge)") == 1
            && log_lines(&stack, "misdeployed (override_ignored)") == 1)
            .then_some(())
    })
    .await
    .unwrap();
}

/// `kvroute-doctor` against a running stack: its exit status and what it printed.
async fn doctor(stack: &Stack) -> (bool, String) {
    let mut cmd = tokio::process::Command::new(kvroute_stack::paths::doctor_bin().unwrap());
    cmd.args(["--envoy-admin", &stack.envoy.admin_url()]).kill_on_drop(true);
    if stack.updater.is_some() {
        cmd.args(["--updater", &format!("http://127.0.0.1:{}", stack.updater_port)]);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("kvroute-doctor hung")
        .expect("kvroute-doctor runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test]
async fn the_doctor_says_ok_on_a_complete_stack_and_names_a_missing_setting() {
    let stack = Stack::start(StackOptions { updater: true, ..opts(json!({}), &[]) }).await.unwrap();
    let http = reqwest::Client::new();
    assert_eq!(chat(&http, &stack, 0, 0).await.status, 200);
    // Knowledge arrives and every worker is followed: then nothing is wrong.
    let said = eventually("the doctor says ok", Duration::from_secs(30), || async {
        let (ok, out) = doctor(&stack).await;
        ok.then_some(out)
    })
    .await;
    let said = match said {
        Ok(s) => s,
        Err(e) => panic!("{e}:\n{}", doctor(&stack).await.1),
    };
    assert!(said.contains("ok: kvroute is deployed as it needs to be"), "{said}");
    assert!(!said.contains("PROBLEM"), "{said}");
    drop(stack);

    let edits = [(STOP_ITERATION, "allow_on_headers_stop_iteration: false")];
    let filter = json!({"misdeployment": {"body_wait_ms": 500, "knowledge_within_ms": 0}});
    let stack = Stack::start(opts(filter, &edits)).await.unwrap();
    assert_eq!(chat(&http, &stack, 0, 0).await.status, 200);
    let (ok, out) = doctor(&stack).await;
    assert!(!ok, "{out}");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("PROBLEM")).collect();
    assert!(
        lines.iter().any(|l| l.contains("lacks allow_on_headers_stop_iteration: true")),
        "{out}"
    );
    assert!(lines.iter().any(|l| l.contains("body_not_delivered")), "{out}");
}
