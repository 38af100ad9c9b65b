//! Two Envoy replicas sharing one updater: a decision on replica A reaches replica B through
//! the updater (A's singleton reports it, the updater publishes it at once, B's long poll
//! brings it) before any KV event could explain it — the updater here follows no events — and
//! B counts A's in-flight request in its load estimate, and A's arrivals in the step fill its
//! promise on a busy worker foresees.

use std::time::Duration;

use kvroute_stack::client::{self, Reply};
use kvroute_stack::eventually;
use kvroute_stack::replicas::{ReplicaOptions, Replicas};
use kvroute_stack::stack::MODEL;
use serde_json::{json, Value};

fn body(seed: u64, words: usize, max_tokens: u32) -> Value {
    json!({"model": MODEL, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": kvroute_testkit::textgen::words(seed, words)}]})
}

fn field(r: &Reply, key: &str) -> u64 {
    r.decision_field(key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The updater's version once it holds what `found` looks for in its peer status.
async fn updater_has(r: &Replicas, what: &str, found: impl Fn(&Value) -> bool) -> u64 {
    eventually(what, Duration::from_secs(20), || async {
        let s = r.status().await.ok()?;
        found(&s["peers"]).then(|| s["version"].as_u64()).flatten()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_decision_on_one_replica_is_credited_on_the_other_without_events() {
    let opts = ReplicaOptions { workers: 2, events: false, ..Default::default() };
    let r = Replicas::start(opts).await.unwrap();
    r.wait_aligned().await.unwrap();
    let http = reqwest::Client::new();
    let prompt = body(0x5EED_0001, 400, 1);
    let on_a = client::chat(&http, &r.a().base_url(), &prompt).await.unwrap();
    assert_eq!(on_a.status, 200, "{}", on_a.body);
    let worker = on_a.decision_field("worker").unwrap();
    let v = updater_has(&r, "A's credit at the updater", |p| {
        p["replicas"]
            .as_object()
            .is_some_and(|m| m.values().any(|x| x["hashes"].as_u64() > Some(0)))
    })
    .await;
    Replicas::wait_version(&r.b, v).await.unwrap();
    let on_b = client::chat(&http, &r.b.base_url(), &prompt).await.unwrap();
    assert_eq!(on_b.status, 200, "{}", on_b.body);
    assert_eq!(on_b.decision_field("worker").as_deref(), Some(worker.as_str()), "{on_b:?}");
    assert!(field(&on_b, "blocks_from_peers") > 0, "not credited from A: {:?}", on_b.decision);
    assert_eq!(field(&on_b, "blocks_from_events"), 0, "no events are followed");
    assert!(field(&on_b, "predicted_cached_tokens") > 0);
    // A's own decision, relayed back to A, is not A's peer knowledge. (A fresh prompt: the
    // first one's credit from B's decision is rightly A's peer knowledge.)
    let held = |p: &Value| {
        p["replicas"]
            .as_object()
            .map_or(0, |m| m.values().map(|x| x["hashes"].as_u64().unwrap_or(0)).sum::<u64>())
    };
    let before = held(&r.status().await.unwrap()["peers"]);
    let own = body(0x5EED_0002, 400, 1);
    let first = client::chat(&http, &r.a().base_url(), &own).await.unwrap();
    assert_eq!(first.status, 200, "{}", first.body);
    let v = updater_has(&r, "A's second credit at the updater", |p| held(p) > before).await;
    Replicas::wait_version(r.a(), v).await.unwrap();
    let again = client::chat(&http, &r.a().base_url(), &own).await.unwrap();
    assert_eq!(field(&again, "blocks_from_peers"), 0, "{:?}", again.decision);
    assert!(field(&again, "predicted_cached_tokens") > 0, "its own routing credit counts");
}

#[tokio::test]
async fn simultaneous_requests_on_two_replicas_spread_over_two_idle_workers() {
    let opts = ReplicaOptions {
        workers: 2,
        events: false,
        // Slow decoding keeps A's request in flight; no load scrapes, so only A's report can
        // tell B about it.
        sim_args: vec!["--decode-ms-per-seq".into(), "60".into()],
        updater_args: vec!["--scrape-interval-ms".into(), "600000".into()],
        ..Default::default()
    };
    let r = Replicas::start(opts).await.unwrap();
    r.wait_aligned().await.unwrap();
    let http = reqwest::Client::new();
    let keys: Vec<(String, String)> = r
        .stack
        .addrs()
        .into_iter()
        .map(|a| (format!("{:016x}", kvroute_core::decision::load::worker_key(&a)), a))
        .collect();
    for round in 0..3u64 {
        // A long request through A: in flight (prefilling as far as a non-streamed answer
        // shows) for seconds.
        let long = {
            let (http, url) = (http.clone(), r.a().base_url());
            tokio::spawn(
                async move { client::chat(&http, &url, &body(900 + round, 800, 40)).await },
            )
        };
        let mut busy = String::new();
        let v = updater_has(&r, "A's in-flight load at the updater", |p| {
            let Some(m) = p["replicas"].as_object() else { return false };
            m.values()
                .flat_map(|x| x["loads"].as_array().cloned().unwrap_or_default())
                .any(|l| l["prefilling"].as_u64() > Some(0))
        })
        .await;
        let s = r.status().await.unwrap();
        for x in s["peers"]["replicas"].as_object().unwrap().values() {
            for l in x["loads"].as_array().unwrap() {
                let key = l["worker_key"].as_str().unwrap();
                busy = keys.iter().find(|(k, _)| k == key).unwrap().1.clone();
            }
        }
        Replicas::wait_version(&r.b, v).await.unwrap();
        let on_b = client::chat(&http, &r.b.base_url(), &body(1900 + round, 50, 1)).await.unwrap();
        assert_eq!(on_b.status, 200, "{}", on_b.body);
        let chosen = on_b.decision_field("worker").unwrap();
        assert_ne!(
            chosen, busy,
            "round {round}: B piled onto A's busy worker: {:?}",
            on_b.decision
        );
        let done = long.await.unwrap().unwrap();
        assert_eq!(done.status, 200);
        assert_eq!(done.decision_field("worker").as_deref(), Some(busy.as_str()));
        // The next round must not mistake this request's load, until A reports it gone, for
        // its own.
        updater_has(&r, "A's load gone at the updater", |p| {
            p["replicas"].as_object().is_some_and(|m| {
                m.values().flat_map(|x| x["loads"].as_array().cloned().unwrap_or_default()).all(
                    |l| l["prefilling"].as_u64() == Some(0) && l["inflight"].as_u64() == Some(0),
                )
            })
        })
        .await;
    }
}

/// The worker's queue length, from its own `/metrics`.
/// One streamed request of class `class` (the filter's admission class), its reply once it
/// ended.
fn send(url: &str, class: &'static str, seed: u64) -> tokio::task::JoinHandle<Reply> {
    let b = json!({"model": MODEL, "max_tokens": 2, "stream": true,
        "messages": [{"role": "user", "content": kvroute_testkit::textgen::words(seed, 200)}]});
    let (url, b) = (url.to_owned(), b.to_string().into_bytes());
    tokio::spawn(async move {
        let (http, headers) = (reqwest::Client::new(), [("x-request-priority", class)]);
        let r = client::send(&http, &url, "/v1/chat/completions", b, &headers);
        tokio::time::timeout(Duration::from_secs(60), r).await.expect("no answer").unwrap()
    })
}

/// Replica B's promise on a worker replica A keeps busy (`promised_ttft_ms` −
/// `predicted_ttft_ms`, ms), with `window_ms` as the filters' `load.arrival_window_ms`. The
/// singletons are not told it: each counts its replica's rate over the window its filter's
/// threads published.
async fn peer_foreseen_fill(window_ms: u64) -> f64 {
    let opts = ReplicaOptions {
        workers: 1,
        events: false,
        // One request at a time: a stream held open takes the worker, the rest queue there.
        sim_args: ["--scheduling-policy", "priority", "--max-num-seqs", "1"]
            .map(String::from)
            .to_vec(),
        filter: json!({
            "admission": {"classes": [{"name": "interactive", "engine_priority": 0}]},
            "load": {"arrival_window_ms": window_ms},
        }),
        // The configured profile (no calibration yet) takes the worker for slow, 50 ms a
        // token, in steps of 1 000 tokens: a queue is a long wait, and the prompts sent there
        // lately fill the step.
        model_overrides: json!({"profile": {"prefill_ms_per_token": 50.0, "step_token_budget": 1000}}),
        ..Default::default()
    };
    let r = Replicas::start(opts).await.unwrap();
    r.wait_aligned().await.unwrap();
    // Through A: a stream that holds the worker, then three prompts queued behind it.
    let a = r.a().base_url();
    let body = json!({"model": MODEL, "max_tokens": 3000, "stream": true,
        "messages": [{"role": "user", "content": kvroute_testkit::textgen::words(0x5EED_0100, 200)}]});
    let post = reqwest::Client::new()
        .post(format!("{a}/v1/chat/completions"))
        .header("x-request-priority", "interactive")
        .json(&body)
        .send();
    let mut held = tokio::time::timeout(Duration::from_secs(30), post).await.unwrap().unwrap();
    let ran = tokio::time::timeout(Duration::from_secs(30), held.chunk()).await.unwrap();
    assert!(ran.unwrap().is_some(), "the held stream sent nothing");
    let mut queued = Vec::new();
    for i in 1..=3u64 {
        queued.push(send(&a, "interactive", 0x5EED_0100 + i));
        r.stack.workers[0].until_waiting(i).await.unwrap();
    }
    // B learns A's queue, and its arrivals, from the updater only. A's rate is counted over
    // its filter's window: the four prompts sent (about 1 000 tokens) over `window_ms`, not
    // over the singleton's default 2 s, which would read 60 times more.
    let over_window = |rate: u64| rate > 0 && rate.saturating_mul(window_ms) / 1000 <= 10_000;
    let v = updater_has(&r, "A's queue and its arrivals at the updater", |p| {
        let Some(m) = p["replicas"].as_object() else { return false };
        m.values().flat_map(|x| x["loads"].as_array().cloned().unwrap_or_default()).any(|l| {
            l["prefilling"].as_u64() >= Some(3)
                && (window_ms == 0 || l["arriving_tokens_per_s"].as_u64().is_some_and(over_window))
        })
    })
    .await;
    Replicas::wait_version(&r.b, v).await.unwrap();
    let on_b = send(&r.b.base_url(), "interactive", 0x5EED_0200);
    r.stack.workers[0].until_waiting(4).await.unwrap();
    // The worker goes free: everything is served.
    drop(held);
    for q in queued {
        assert_eq!(q.await.unwrap().status, 200);
    }
    let on_b = on_b.await.unwrap();
    assert_eq!(on_b.status, 200, "{}", on_b.body);
    let ms = |k: &str| -> f64 { on_b.decision_field(k).and_then(|v| v.parse().ok()).unwrap() };
    assert!(ms("predicted_wait_ms") > 0.0, "B saw A's queue: {:?}", on_b.decision);
    ms("promised_ttft_ms") - ms("predicted_ttft_ms")
}

#[tokio::test]
async fn a_busy_workers_promise_on_one_replica_foresees_the_arrivals_the_other_sent() {
    // B itself sent nothing there lately: what its promise foresees beyond the estimate is A's.
    // (Windows longer than the test, so that no arrival ages out of them.)
    let with = peer_foreseen_fill(120_000).await;
    assert!(with > 100.0, "foreseen fill {with} ms");
    // With the forecast off, B adds nothing, whatever A reports.
    let off = peer_foreseen_fill(0).await;
    assert!(off.abs() < 0.15, "without arrivals {off} ms");
}
