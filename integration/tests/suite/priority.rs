//! Priority classes that reach the engine, through real Envoy + the kvroute filter + simulated
//! workers: with `admission.classes[].engine_priority` the filter writes the class's value into
//! the forwarded body's `priority` (replacing the client's, with a correct `content-length`),
//! and a worker scheduling by priority (`kvroute-sim --scheduling-policy priority`, one request
//! at a time) serves a queued interactive request before batch requests that arrived earlier,
//! whatever `priority` the clients wrote. Against an FCFS worker, which refuses a non-zero
//! `priority` with a 400, the rewritten and the stripped bodies are taken over HTTP/1.1 and h2c.
//! The filter's own estimate knows the engine's order too: an interactive request is not
//! estimated to wait for the batch requests queued behind the engine's step, and the batch
//! requests an interactive one passed over are learned only for their priority's promise margin.
//! A batch request's estimate foresees the interactive prompts that pass it (`passed_ms`).
//! A busy worker's promise (the decision header's `promised_ttft_ms`) foresees the prompts sent
//! there lately filling the step the request's prompt runs in, and not with that count off.
//! Nothing depends on timing: the queue is made by a stream held open, and the order checked is
//! the order of first tokens.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvroute_stack::client;
use kvroute_stack::rawhttp::{self, Proto, RawRequest};
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use kvroute_stack::workload::Conversation;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const PRIORITY: &str = "x-request-priority";
const WITHIN: Duration = Duration::from_secs(30);

fn classes() -> Value {
    json!({"admission": {"classes": [
        {"name": "interactive", "engine_priority": 0},
        {"name": "batch", "engine_priority": 10, "queue_weight": 2},
        {"name": "bulk"},
    ]}})
}

fn body(id: usize, max_tokens: u64, stream: bool, client_priority: Option<i64>) -> Value {
    let mut b = Conversation::new(11, id, 200, 10, 1).body(MODEL, 0, max_tokens, stream);
    if let Some(p) = client_priority {
        b["priority"] = json!(p);
    }
    b
}

async fn stream(base_url: &str, class: &str, body: &Value) -> reqwest::Response {
    let send = reqwest::Client::new()
        .post(format!("{base_url}{CHAT}"))
        .header(PRIORITY, class)
        .json(body)
        .send();
    let r = tokio::time::timeout(WITHIN, send).await.expect("no answer").unwrap();
    assert_eq!(r.status(), 200, "{class}");
    r
}

/// Reads a stream until its first content chunk.
async fn first_token(mut r: reqwest::Response) -> Instant {
    let read = async {
        let mut seen = String::new();
        while let Some(chunk) = r.chunk().await.unwrap() {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("\"content\"") {
                return Instant::now();
            }
        }
        panic!("stream ended without a token: {seen}");
    };
    tokio::time::timeout(WITHIN, read).await.expect("no first token")
}

/// The worker's queue length, from its own `/metrics`.
/// One worker scheduling by priority, one request at a time, its slot taken by a stream held
/// open: everything sent after it queues in the engine. `model`: the model's overrides.
async fn held_worker(model: Value) -> (Stack, reqwest::Response) {
    hold(1, &[], model).await
}

/// [`held_worker`] with `threads` Envoy threads and more `sim_args` for the worker.
async fn hold(threads: u32, sim_args: &[&str], model: Value) -> (Stack, reqwest::Response) {
    hold_with(threads, sim_args, classes(), model).await
}

/// [`hold`] with the filter configuration `filter`.
async fn hold_with(
    threads: u32,
    sim_args: &[&str],
    filter: Value,
    model: Value,
) -> (Stack, reqwest::Response) {
    let opts = StackOptions {
        workers: 1,
        envoy_concurrency: threads,
        sim_args: ["--scheduling-policy", "priority", "--max-num-seqs", "1"]
            .iter()
            .chain(sim_args)
            .map(|a| a.to_string())
            .collect(),
        filter,
        model_overrides: model,
        ..Default::default()
    };
    let stack = Stack::start(opts).await.unwrap();
    let mut held = stream(&stack.envoy.base_url(), "interactive", &body(0, 3000, true, None)).await;
    let ran = tokio::time::timeout(WITHIN, held.chunk()).await.expect("held stream silent");
    assert!(ran.unwrap().is_some(), "the held stream sent nothing");
    (stack, held)
}

#[tokio::test]
async fn the_engine_serves_interactive_before_earlier_batch_whatever_clients_wrote() {
    let (stack, held) = held_worker(json!({})).await;
    let url = stack.envoy.base_url();
    // Two batch requests, the second claiming the most urgent priority; then an interactive
    // one claiming the least. The classes decide: 0 for interactive, 10 for both batch.
    let queued = [("batch", None), ("batch", Some(-1000)), ("interactive", Some(1000))];
    let mut tasks = Vec::new();
    for (i, (class, claim)) in queued.into_iter().enumerate() {
        let (url, b) = (url.clone(), body(i + 1, 2, true, claim));
        tasks.push(tokio::spawn(async move { first_token(stream(&url, class, &b).await).await }));
        stack.workers[0].until_waiting(i as u64 + 1).await.unwrap();
    }
    drop(held);
    let mut firsts = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        firsts.push((t.await.unwrap(), i));
    }
    firsts.sort();
    let order: Vec<usize> = firsts.into_iter().map(|(_, i)| i).collect();
    assert_eq!(order, vec![2, 0, 1], "interactive first, then batch in arrival order");
}

#[tokio::test]
async fn batch_requests_passed_over_are_learned_only_for_their_margin() {
    // Two Envoy threads (the passes reach the calibration through shared data as well as a
    // thread's own table), a worker slow enough that each first token is hundreds of
    // milliseconds after the one before.
    let (stack, held) = hold(2, &["--prefill-ms-per-token", "1"], json!({})).await;
    let url = stack.envoy.base_url();
    // Two batch requests queue, then an interactive one, which the engine runs first.
    let mut tasks = Vec::new();
    for (i, class) in ["batch", "batch", "interactive"].into_iter().enumerate() {
        tasks.push(send_later(&url, class, i + 1));
        stack.workers[0].until_waiting(i as u64 + 1).await.unwrap();
    }
    drop(held);
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // The held stream and the interactive request are learned from; the two batch requests,
    // passed over by it, only for their priority's promise margin.
    let calibration = |m: HashMap<String, f64>| -> HashMap<String, f64> {
        m.into_iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("kvroute_calibration_")?.into(), v)))
            .collect()
    };
    let stats = kvroute_stack::eventually("the samples", WITHIN, || async {
        let m = calibration(stack.envoy.prometheus().await.unwrap_or_default());
        let seen = |name: &str| m.get(name).copied().unwrap_or(0.0);
        (seen("estimates") >= 4.0 && seen("samples") >= 2.0).then_some(m)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: logs in {}", stack.dir.display()));
    let get = |name: &str| stats.get(name).copied();
    assert_eq!(get("passed_samples"), Some(2.0), "{stats:?}");
    assert_eq!((get("shared_samples"), get("samples")), (Some(0.0), Some(2.0)), "{stats:?}");
}

/// Sends a request of `class` in a task; its decision header comes back once it is served.
fn send_later(url: &str, class: &'static str, id: usize) -> tokio::task::JoinHandle<client::Reply> {
    let (url, b) = (url.to_owned(), body(id, 2, true, None).to_string().into_bytes());
    tokio::spawn(async move {
        let (http, headers) = (reqwest::Client::new(), [(PRIORITY, class)]);
        let r = client::send(&http, &url, CHAT, b, &headers);
        tokio::time::timeout(WITHIN, r).await.expect("no answer").unwrap()
    })
}

/// Queues one request of each of `classes` in turn behind the `held` stream, then lets it go:
/// every reply, in the order sent, each served.
async fn queue_then_serve(
    stack: &Stack,
    held: reqwest::Response,
    classes: &[&'static str],
) -> Vec<client::Reply> {
    let url = stack.envoy.base_url();
    let mut tasks = Vec::new();
    for (i, class) in classes.iter().enumerate() {
        tasks.push(send_later(&url, class, i + 1));
        stack.workers[0].until_waiting(i as u64 + 1).await.unwrap();
    }
    drop(held);
    let mut replies = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        replies.push(r);
    }
    replies
}

fn predicted_wait_ms(r: &client::Reply) -> f64 {
    let w = r.decision_field("predicted_wait_ms").expect("no decision header");
    w.parse().unwrap()
}

#[tokio::test]
async fn an_interactive_request_is_not_estimated_to_wait_for_the_batch_queue_it_jumps() {
    // A step budget of one token: the engine can have started only the oldest request queued.
    let (stack, held) = held_worker(json!({"profile": {"step_token_budget": 1}})).await;
    // Three batch requests queue; then an interactive one, then one more batch request.
    let classes = ["batch", "batch", "batch", "interactive", "batch"];
    let replies = queue_then_serve(&stack, held, &classes).await;
    let waits: Vec<f64> = replies.iter().map(predicted_wait_ms).collect();
    // The interactive request waits for the oldest batch prompt only; the last batch request
    // for all three and the interactive one.
    let (interactive, last) = (waits[3], waits[4]);
    assert!(interactive > 0.0, "the oldest batch prompt is ahead: {waits:?}");
    assert!(interactive * 2.0 < last, "interactive {interactive} ms, batch {last} ms: {waits:?}");
    assert!(waits[2] * 1.2 < last && waits[0] < waits[2], "the batch queue grows: {waits:?}");
    // Each engine priority the classes send has its promise margin gauge.
    let stats = stack.envoy.prometheus().await.unwrap_or_default();
    let model: String =
        MODEL.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    for p in ["0", "10"] {
        let name = format!("kvroute_calibration_{model}_priority_{p}_promise_margin_permille");
        assert!(stats.iter().any(|(k, _)| *k == name), "no {name}");
    }
}

#[tokio::test]
async fn rewritten_and_stripped_bodies_reach_an_fcfs_engine_over_both_protocols() {
    // An FCFS worker refuses any non-zero priority: a 200 means the filter rewrote the body
    // (and its content-length) before it went upstream.
    let opts = StackOptions { workers: 1, filter: classes(), ..Default::default() };
    let stack = Stack::start(opts).await.unwrap();
    let listener = SocketAddr::from(([127, 0, 0, 1], stack.envoy.listen_port));
    for proto in [Proto::Http1, Proto::H2c] {
        // interactive: set to 0 over the client's 7; bulk (no engine_priority): the client's
        // removed. A batch request gets 10, which this worker refuses: proof it was written.
        for (i, (class, want)) in
            [("interactive", 200), ("bulk", 200), ("batch", 400)].into_iter().enumerate()
        {
            let b = body(20 + i, 2, false, Some(7)).to_string();
            let req = RawRequest::post(CHAT, b).header(PRIORITY, class.as_bytes().to_vec());
            let r = rawhttp::send(listener, proto, &req, WITHIN).await.unwrap();
            assert_eq!(r.status, want, "{} {class}: {}", proto.name(), r.text());
            if want == 400 {
                let msg = r.json().unwrap()["error"]["message"].clone();
                assert_eq!(msg, "Got priority 10 but Priority scheduling is not enabled.");
            }
        }
    }
}

#[tokio::test]
async fn a_busy_workers_promise_foresees_the_arrivals_that_fill_its_next_step() {
    // The configured profile (too few samples to calibrate) takes the worker for slow, 50 ms a
    // token, with steps of 1 000 tokens: three requests queued ahead are a long wait, and
    // what was sent there lately fills the step the next request's prompt runs in.
    let model = json!({"profile": {"prefill_ms_per_token": 50.0, "step_token_budget": 1000}});
    let mut gaps = Vec::new();
    for window_ms in [120_000u64, 0] {
        let mut filter = classes();
        filter["load"] = json!({"arrival_window_ms": window_ms});
        let (stack, held) = hold_with(1, &[], filter, model.clone()).await;
        let replies = queue_then_serve(&stack, held, &["interactive"; 4]).await;
        let field = |r: &client::Reply, k: &str| -> f64 {
            r.decision_field(k).and_then(|v| v.parse().ok()).expect("no decision header")
        };
        // The last one waited behind three prompts: its promise foresees the fill.
        let last = &replies[3];
        let (estimate, promise) =
            (field(last, "predicted_ttft_ms"), field(last, "promised_ttft_ms"));
        assert!(field(last, "predicted_wait_ms") > 0.0, "{:?}", last.decision);
        // At most a whole step beyond the estimate (1 000 tokens at 50 ms).
        assert!(promise >= estimate && promise - estimate <= 50_000.0, "{:?}", last.decision);
        // The first request had nothing queued ahead: its promise is its estimate.
        let first = &replies[0];
        let idle_gap = field(first, "promised_ttft_ms") - field(first, "predicted_ttft_ms");
        assert!(idle_gap.abs() < 0.15, "{:?}", first.decision);
        gaps.push(promise - estimate);
    }
    // Counting the arrivals (the held stream and the three queued, all within the window)
    // adds to the promise; with the window at 0 nothing is foreseen.
    assert!(gaps[0] > 100.0, "foreseen fill {} ms", gaps[0]);
    assert!(gaps[1].abs() < 0.15, "without arrivals {} ms", gaps[1]);
}

#[tokio::test]
async fn a_batch_request_foresees_the_interactive_requests_that_pass_it() {
    // The configured profile takes the worker for slow (50 ms a token) with steps of one
    // token: every queued prompt is beyond the next step, and the interactive prompts sent
    // within the (long) window take a share of the worker that stretches a batch request's
    // wait for them.
    let model = json!({"profile": {"prefill_ms_per_token": 50.0, "step_token_budget": 1}});
    let mut filter = classes();
    filter["load"] = json!({"arrival_window_ms": 120_000});
    let (stack, held) = hold_with(1, &[], filter, model).await;
    let classes = ["batch", "batch", "interactive", "interactive", "batch", "interactive"];
    let replies = queue_then_serve(&stack, held, &classes).await;
    let field = |r: &client::Reply, k: &str| -> f64 {
        r.decision_field(k).and_then(|v| v.parse().ok()).expect("no decision header")
    };
    let passed: Vec<f64> = replies.iter().map(|r| field(r, "passed_ms")).collect();
    // The first batch request queued behind nothing (the held stream decodes): not stretched.
    assert_eq!(passed[0], 0.0, "{passed:?}");
    // The second waits behind the first while the held interactive stream's kind arrives;
    // the third batch one also behind two more interactive prompts: stretched more.
    assert!(passed[1] > 0.0 && passed[4] > passed[1], "{passed:?}");
    // What the stretch adds is in the predicted wait; nothing passes the interactive ones.
    assert!(field(&replies[4], "predicted_wait_ms") > passed[4], "{:?}", replies[4].decision);
    for i in [2, 3, 5] {
        assert_eq!(passed[i], 0.0, "interactive {i}: {passed:?}");
    }
}
