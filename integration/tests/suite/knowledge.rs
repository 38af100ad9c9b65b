//! The knowledge plane end to end: simulated workers publish KV events, kvroute-updater
//! re-hashes them, Envoy's singleton pulls snapshots and deltas into shared data, and the
//! filter routes with them.

use std::cell::Cell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvroute_core::decision::audit::{classify, AuditClass};
use kvroute_stack::client::{self, Reply};
use kvroute_stack::eventually;
use kvroute_stack::sim::SimWorker;
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use kvroute_stack::workload::Conversation;
use serde_json::{json, Value};

/// `knowledge.event_grace_ms` of the test stacks: routing history older than a worker's last
/// event by more than this gives way to the events.
const GRACE_MS: u64 = 300;

fn opts() -> StackOptions {
    StackOptions {
        updater: true,
        filter: json!({"knowledge": {"max_event_age_ms": 1000, "event_grace_ms": GRACE_MS}}),
        ..Default::default()
    }
}

fn field(r: &Reply, k: &str) -> u64 {
    r.decision_field(k).and_then(|v| v.parse().ok()).unwrap_or(0)
}

async fn chat_body(stack: &Stack, body: &Value) -> Reply {
    let http = reqwest::Client::new();
    let r = client::chat(&http, &stack.base_url(), body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    r
}

async fn chat(stack: &Stack, c: &Conversation, turn: usize) -> Reply {
    chat_body(stack, &c.body(MODEL, turn, 4, false)).await
}

/// Sends `body` to a worker directly, not through Envoy: only its KV events can tell kvroute.
async fn chat_direct(sim: &SimWorker, body: &Value) -> Reply {
    let http = reqwest::Client::new();
    let r = client::chat(&http, &format!("http://{}", sim.addr), body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    r
}

/// The updater's `/status`, Envoy's knowledge counters and where the logs are, for failures.
async fn diagnostics(stack: &Stack) -> String {
    let status = match &stack.updater {
        Some(u) => u.status().await.map(|v| v.to_string()).unwrap_or_else(|e| e.to_string()),
        None => "no updater".into(),
    };
    let m = stack.envoy.prometheus().await.unwrap_or_default();
    let mut counters: Vec<String> = m
        .iter()
        .filter(|(k, _)| k.starts_with("kvroute_knowledge"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    counters.sort();
    for name in SYNC_COUNTERS {
        counters.push(format!("{name}={:?}", unlabelled(stack, name).await));
    }
    format!(
        "updater status: {status}\nenvoy knowledge counters: {counters:?}\nlogs in {}",
        stack.dir.display()
    )
}

/// [`eventually`], failing with [`diagnostics`].
async fn until<T, F, Fut>(stack: &Stack, what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match eventually(what, timeout, check).await {
        Ok(v) => v,
        Err(e) => panic!("{e}\n{}", diagnostics(stack).await),
    }
}

/// The singleton's counters (fetches from the updater).
const SYNC_COUNTERS: [&str; 3] =
    ["kvroute_sync_full_snapshots", "kvroute_sync_deltas", "kvroute_sync_fetch_failures"];

/// A stat without labels from Envoy's `/stats/prometheus` (written `name{} 3` by Envoy).
async fn unlabelled(stack: &Stack, name: &str) -> Option<f64> {
    stack.envoy.prometheus().await.ok()?.get(name).copied()
}

/// Waits until Envoy's singleton holds the updater's current snapshot version (threads apply it
/// on their next request).
async fn envoy_catches_up(stack: &Stack) {
    let updater = stack.updater.as_ref().unwrap();
    let v = updater.status().await.unwrap()["version"].as_u64().unwrap() as f64;
    let caught_up =
        eventually("Envoy at the updater's version", Duration::from_secs(20), || async {
            let have = unlabelled(stack, "kvroute_sync_snapshot_version").await?;
            (have >= v).then_some(())
        })
        .await;
    if let Err(e) = caught_up {
        panic!("{e}\n{}", diagnostics(stack).await);
    }
}

/// How many times Envoy's worker threads applied a `kind` ("full" or "delta") knowledge update.
fn knowledge_updates(m: &HashMap<String, f64>, kind: &str) -> f64 {
    m.get(&format!("kvroute_knowledge_updates{{kvroute_kind=\"{kind}\"}}")).copied().unwrap_or(0.0)
}

/// `worker`'s entry in the updater's `/status`.
async fn worker_status(stack: &Stack, worker: &str) -> Option<Value> {
    let s = stack.updater.as_ref()?.status().await.ok()?;
    Some(s["workers"][worker].clone()).filter(|w| w.is_object())
}

fn stat(w: &Value, k: &str) -> u64 {
    w["stats"][k].as_u64().unwrap_or(0)
}

fn gpu_blocks(w: &Value) -> u64 {
    w["blocks"]["GPU"].as_u64().unwrap_or(0)
}

/// Waits until the filter's decisions credit blocks from events (the snapshot arrived); on
/// timeout, fails with the updater's status and the singleton's counters.
async fn events_reach_the_filter(stack: &Stack, c: &Conversation, turn: usize) -> Reply {
    until(stack, "event knowledge in decisions", Duration::from_secs(40), || async {
        let r = chat(stack, c, turn).await;
        (field(&r, "blocks_from_events") > 0).then_some(r)
    })
    .await
}

#[tokio::test]
async fn event_predictions_match_what_workers_reuse() {
    let stack = Stack::start(opts()).await.unwrap();
    let convs: Vec<Conversation> = (0..6).map(|i| Conversation::new(77, i, 200, 15, 5)).collect();
    for c in &convs {
        chat(&stack, c, 0).await;
    }
    events_reach_the_filter(&stack, &convs[0], 1).await;
    let (mut total, mut false_hits, mut from_events) = (0, 0, 0);
    for turn in 1..5 {
        for c in &convs {
            let r = chat(&stack, c, turn).await;
            let predicted = field(&r, "predicted_cached_tokens");
            let actual = r.cached_tokens.unwrap_or(0);
            let class = classify(predicted, actual, r.prompt_tokens.unwrap_or(0), 16);
            total += 1;
            false_hits += usize::from(class == AuditClass::FalseHit);
            from_events += usize::from(field(&r, "blocks_from_events") > 0);
        }
    }
    assert!(from_events * 2 >= total, "events credited in only {from_events}/{total} decisions");
    assert!(false_hits * 100 < total, "false-hit rate {false_hits}/{total} is not below 1 %");
    // 24 turns changed the knowledge after the threads' first full snapshot: the singleton
    // received those changes as deltas and the threads followed the delta chain.
    let m = stack.envoy.prometheus().await.unwrap();
    let (full, delta) = (knowledge_updates(&m, "full"), knowledge_updates(&m, "delta"));
    let diag = diagnostics(&stack).await;
    assert!(full >= 1.0, "no thread applied a full snapshot\n{diag}");
    assert!(delta >= 1.0, "threads applied {full} full snapshots and no delta\n{diag}");
    let received = unlabelled(&stack, "kvroute_sync_deltas").await.unwrap_or(0.0);
    assert!(received >= 1.0, "the singleton received no delta from the updater\n{diag}");
}

#[tokio::test]
async fn an_eviction_reaches_the_next_prediction() {
    let stack = Stack::start(opts()).await.unwrap();
    let c = Conversation::new(78, 0, 300, 15, 4);
    chat(&stack, &c, 0).await;
    let r = events_reach_the_filter(&stack, &c, 1).await;
    let worker = r.worker.clone().unwrap();
    assert!(field(&r, "predicted_cached_tokens") > 0);
    // Older guesses must be past the grace period before the events can overrule them.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let w = stack.workers.iter().find(|w| w.addr == worker).unwrap();
    let evicted = w.admin("evict?percent=100", None).await.unwrap();
    assert!(evicted["evicted_blocks"].as_u64().unwrap() > 0);
    // Wait for the removal to reach the updater, then for Envoy's singleton to hold a snapshot
    // version that includes it.
    let updater = stack.updater.as_ref().unwrap();
    eventually("eviction seen by the updater", Duration::from_secs(20), || async {
        let s = updater.status().await.ok()?;
        (s["workers"][&worker]["blocks"]["GPU"].as_u64().unwrap_or(0) == 0).then_some(())
    })
    .await
    .unwrap();
    envoy_catches_up(&stack).await;
    let after = chat(&stack, &c, 2).await;
    assert_eq!(after.cached_tokens, Some(0), "the worker still reused blocks after eviction");
    assert_eq!(
        field(&after, "predicted_cached_tokens"),
        0,
        "the filter still predicted evicted blocks: {:?}",
        after.decision
    );
}

#[tokio::test]
async fn routing_survives_an_updater_outage_and_recovers() {
    let mut stack = Stack::start(opts()).await.unwrap();
    let c = Conversation::new(79, 0, 200, 10, 12);
    chat(&stack, &c, 0).await;
    events_reach_the_filter(&stack, &c, 1).await;
    stack.updater.as_mut().unwrap().stop().await;
    // Past the age limit the filter stops trusting events, and says so.
    let stale = eventually("stale_events fallback", Duration::from_secs(10), || async {
        let r = chat(&stack, &c, 2).await;
        (r.decision_field("fallback").as_deref() == Some("stale_events")).then_some(r)
    })
    .await
    .unwrap();
    assert_eq!(field(&stale, "blocks_from_events"), 0);
    for t in 3..6 {
        chat(&stack, &c, t).await;
    }
    stack.updater.as_mut().unwrap().restart().await.unwrap();
    let back = eventually("knowledge back", Duration::from_secs(20), || async {
        // New traffic makes the restarted updater learn from fresh events.
        let r = chat(&stack, &c, 6).await;
        (r.decision_field("fallback").as_deref() == Some("none")).then_some(r)
    })
    .await
    .unwrap();
    assert_eq!(back.status, 200);
    let m = stack.envoy.prometheus().await.unwrap();
    assert!(
        m.get("kvroute_fallback_requests{kvroute_fallback=\"stale_events\"}")
            .copied()
            .unwrap_or(0.0)
            >= 1.0
    );
}

#[tokio::test]
async fn a_worker_serving_another_template_is_flagged_incompatible() {
    let stack = Stack::start(opts()).await.unwrap();
    let c = Conversation::new(80, 0, 200, 10, 4);
    let first = chat(&stack, &c, 0).await;
    let addr = first.worker.clone().unwrap();
    let sim = stack.workers.iter().find(|w| w.addr == addr).unwrap();
    let template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
    sim.admin("misconfig", Some(json!({"chat_template": template}))).await.unwrap();
    sim.admin("restart", None).await.unwrap();
    let updater = stack.updater.as_ref().unwrap();
    let reason = eventually("incompatible verdict", Duration::from_secs(15), || async {
        let s = updater.status().await.ok()?;
        let w = &s["workers"][&addr];
        (w["compatible"] == false).then(|| w["alignment"].as_str().unwrap_or("").to_owned())
    })
    .await
    .unwrap();
    assert!(reason.contains("canary"), "unexpected reason: {reason}");
    // The filter gives the misconfigured worker no cache credit.
    envoy_catches_up(&stack).await;
    for t in 1..4 {
        let r = chat(&stack, &c, t).await;
        if r.worker.as_deref() == Some(addr.as_str()) {
            assert_eq!(
                field(&r, "predicted_cached_tokens"),
                0,
                "credit for an incompatible worker"
            );
        }
    }
}

#[tokio::test]
async fn envoy_health_checks_decide_membership_and_load_is_scraped() {
    let stack = Stack::start(opts()).await.unwrap();
    let c = Conversation::new(81, 0, 200, 10, 3);
    chat(&stack, &c, 0).await;
    let addr = events_reach_the_filter(&stack, &c, 1).await.worker.unwrap();
    let updater = stack.updater.as_ref().unwrap();
    let status = updater.status().await.unwrap();
    let w = &status["workers"][&addr];
    assert!(w["reported_load"]["running"].is_number(), "no scraped load: {w}");
    assert!(w["reported_load_age_ms"].as_u64().is_some());
    assert!(w["blocks"]["GPU"].as_u64().unwrap_or(0) > 0);
    // The worker's HTTP port goes away: Envoy's health checks drop it, the updater purges it.
    let sim = stack.workers.iter().find(|s| s.addr == addr).unwrap();
    sim.admin("crash", None).await.unwrap();
    eventually("worker purged", Duration::from_secs(20), || async {
        let s = updater.status().await.ok()?;
        let w = &s["workers"][&addr];
        (w["member"] == false && w["blocks"]["GPU"].as_u64().unwrap_or(0) == 0).then_some(())
    })
    .await
    .unwrap();
    sim.admin("restart", None).await.unwrap();
    eventually("worker back in the pool", Duration::from_secs(20), || async {
        let s = updater.status().await.ok()?;
        (s["workers"][&addr]["member"] == true).then_some(())
    })
    .await
    .unwrap();
}

/// A worker restarts with an empty cache (sequence back to 0), then loses event batches on its
/// PUB socket: the updater resyncs, then fills the gap from replay, and Envoy's decisions
/// follow both: first no credit for the blocks the restart lost, then credit for the blocks
/// that only the replay carried.
#[tokio::test]
async fn a_worker_restart_and_dropped_events_resync_through_envoy() {
    let stack = Stack::start(opts()).await.unwrap();
    let grace = Duration::from_millis(GRACE_MS);
    let n = Cell::new(0usize);
    let next = || {
        n.set(n.get() + 1);
        n.get()
    };

    // (1) A conversation on one worker, credited from that worker's events. Its later turns
    // follow its routed credit there, so no other worker holds its blocks.
    let c = Conversation::new(82, 0, 200, 15, 4);
    chat(&stack, &c, 0).await;
    let warm = events_reach_the_filter(&stack, &c, 1).await;
    // Every routing and feedback observation of `c` is older than this.
    let history_until = Instant::now();
    let addr = warm.worker.clone().unwrap();
    assert!(field(&warm, "predicted_cached_tokens") > 0, "{:?}", warm.decision);
    let sim = stack.workers.iter().find(|w| w.addr == addr).unwrap();
    let before = worker_status(&stack, &addr).await.unwrap();
    assert!(gpu_blocks(&before) > 0, "the updater holds no blocks of {addr}: {before}");

    // (2) Restart: empty cache, sequence back to 0. The updater resyncs and forgets the blocks.
    sim.admin("restart", None).await.unwrap();
    until(
        &stack,
        "the updater resyncing the restarted worker",
        Duration::from_secs(20),
        || async {
            let w = worker_status(&stack, &addr).await?;
            let resynced = stat(&w, "resyncs") > stat(&before, "resyncs");
            (resynced && w["connected"] == true && gpu_blocks(&w) == 0).then_some(())
        },
    )
    .await;
    // The restarted worker serves other traffic (sent to it directly here). Its new events are
    // what retire the filter's own routing history of `c` on it: history older than the
    // worker's last event by more than the grace period gives way to the events. Until the
    // worker publishes again, that history still counts (the resync itself carries no time).
    let fresh =
        until(&stack, "new events from the restarted worker", Duration::from_secs(20), || {
            let d = Conversation::new(83, next(), 120, 10, 1);
            async move {
                let sent = Instant::now();
                chat_direct(sim, &d.body(MODEL, 0, 4, false)).await;
                (sent.duration_since(history_until) > grace * 2).then_some(d)
            }
        })
        .await;
    // Envoy credits the worker's new blocks from events: its threads hold a version after the
    // resync, with the worker's last event past the grace period of `c`'s history.
    until(
        &stack,
        "the restarted worker's new blocks in decisions",
        Duration::from_secs(20),
        || {
            let body = fresh.body(MODEL, 0, 4, false);
            let addr = addr.as_str();
            let stack = &stack;
            async move {
                let r = chat_body(stack, &body).await;
                (r.worker.as_deref() == Some(addr) && field(&r, "blocks_from_events") > 0)
                    .then_some(())
            }
        },
    )
    .await;
    let after = chat(&stack, &c, 2).await;
    let predicted = field(&after, "predicted_cached_tokens");
    let class =
        classify(predicted, after.cached_tokens.unwrap_or(0), after.prompt_tokens.unwrap_or(0), 16);
    let diag = diagnostics(&stack).await;
    assert_eq!(
        field(&after, "blocks_from_events"),
        0,
        "blocks lost in the restart still credited from events: {:?}\n{diag}",
        after.decision
    );
    assert_eq!(
        predicted, 0,
        "blocks lost in the restart still credited: {:?}\n{diag}",
        after.decision
    );
    assert_ne!(
        class,
        AuditClass::FalseHit,
        "{:?} cached {:?}\n{diag}",
        after.decision,
        after.cached_tokens
    );

    // (3) The worker's PUB socket drops the next batches (replay keeps them). A new
    // conversation stored on the worker directly is only in those dropped batches.
    let before = worker_status(&stack, &addr).await.unwrap();
    let dropping = sim.admin("drop-events?count=3", None).await.unwrap();
    let seq0 = dropping["next_seq"].as_u64().unwrap();
    let e = Conversation::new(84, 0, 200, 15, 2);
    chat_direct(sim, &e.body(MODEL, 0, 4, false)).await;
    let status: Value = reqwest::get(format!("http://127.0.0.1:{}/admin/status", sim.admin_port))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        status["next_seq"].as_u64().unwrap() > seq0,
        "the worker published nothing for the new conversation: {status}"
    );
    // More traffic: the first batch published after the dropped ones reveals the gap.
    let filled =
        until(&stack, "the updater filling the gap from replay", Duration::from_secs(20), || {
            let filler = Conversation::new(85, next(), 60, 10, 1);
            let (stack, addr, before) = (&stack, addr.as_str(), &before);
            async move {
                chat_direct(sim, &filler.body(MODEL, 0, 4, false)).await;
                let w = worker_status(stack, addr).await?;
                let gap = stat(&w, "gaps") > stat(before, "gaps");
                (gap && stat(&w, "replays") > stat(before, "replays")).then_some(w)
            }
        })
        .await;
    assert_eq!(
        stat(&filled, "resyncs"),
        stat(&before, "resyncs"),
        "the gap ended in a full resync instead of a replay: {filled}"
    );
    let hit =
        until(&stack, "replayed blocks credited from events", Duration::from_secs(20), || {
            let body = e.body(MODEL, 0, 4, false);
            let (stack, addr) = (&stack, addr.as_str());
            async move {
                let r = chat_body(stack, &body).await;
                (r.worker.as_deref() == Some(addr) && field(&r, "blocks_from_events") > 0)
                    .then_some(r)
            }
        })
        .await;
    let predicted = field(&hit, "predicted_cached_tokens");
    let actual = hit.cached_tokens.unwrap_or(0);
    assert!(actual > 0, "the worker did not reuse the replayed blocks: {:?}", hit.decision);
    assert_ne!(
        classify(predicted, actual, hit.prompt_tokens.unwrap_or(0), 16),
        AuditClass::FalseHit,
        "{:?} cached {actual}",
        hit.decision
    );
}

/// A thread applies what it journaled (each decision's routing credit, each answer's
/// confirmation) when the stream ends, where no request waits, not before its next decision:
/// with one Envoy thread and one request at a time, no request has a journal entry left to
/// apply.
#[tokio::test]
async fn a_threads_journal_is_applied_when_its_streams_end() {
    let stack = Stack::start(StackOptions {
        envoy_concurrency: 1,
        // No time limit: a stream's end applies everything waiting.
        filter: json!({"knowledge": {"catch_up_budget_us": 0}}),
        ..Default::default()
    })
    .await
    .unwrap();
    const TURNS: usize = 6;
    let c = Conversation::new(80, 0, 200, 10, TURNS);
    for turn in 0..TURNS {
        chat(&stack, &c, turn).await;
    }
    // The last stream's end may be counted just after its answer reached the client.
    let m = until(
        &stack,
        "every stream's journal applied at its end",
        Duration::from_secs(10),
        || async {
            let m = stack.envoy.prometheus().await.ok()?;
            (knowledge_updates(&m, "journal_stream_end") >= TURNS as f64).then_some(m)
        },
    )
    .await;
    assert_eq!(
        knowledge_updates(&m, "journal_request"),
        0.0,
        "a decision applied journal entries its thread's earlier streams left:\n{}",
        diagnostics(&stack).await
    );
}

/// When Envoy's singleton publishes the updater's knowledge, it wakes the filter threads
/// (proxy-wasm shared queues), and they apply it then: here no request goes through Envoy at
/// all, and a thread still applies the deltas the worker's KV events made.
#[tokio::test]
async fn published_knowledge_wakes_the_threads() {
    let stack = Stack::start(StackOptions { envoy_concurrency: 1, ..opts() }).await.unwrap();
    let c = Conversation::new(81, 0, 200, 10, 2);
    chat_direct(&stack.workers[0], &c.body(MODEL, 0, 4, false)).await;
    until(&stack, "a woken thread applying deltas", Duration::from_secs(30), || async {
        let m = stack.envoy.prometheus().await.ok()?;
        (knowledge_updates(&m, "delta_wake") >= 1.0).then_some(())
    })
    .await;
    let wakes = unlabelled(&stack, "kvroute_sync_thread_wakes").await.unwrap_or(0.0);
    assert!(wakes >= 1.0, "the singleton counted no wake\n{}", diagnostics(&stack).await);
}
