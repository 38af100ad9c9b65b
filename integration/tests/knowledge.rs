//! The knowledge plane end to end: simulated workers publish KV events, kvroute-updater
//! re-hashes them, Envoy's singleton pulls snapshots into shared data, and the filter routes
//! with them.

use std::time::Duration;

use kvroute_core::audit::{classify, AuditClass};
use kvroute_integration::client::{self, Reply};
use kvroute_integration::eventually;
use kvroute_integration::stack::{Stack, StackOptions, MODEL};
use kvroute_integration::workload::Conversation;
use serde_json::json;

fn opts() -> StackOptions {
    StackOptions {
        updater: true,
        filter: json!({"knowledge": {"max_event_age_ms": 1000, "event_grace_ms": 300}}),
        ..Default::default()
    }
}

fn field(r: &Reply, k: &str) -> u64 {
    r.decision_field(k).and_then(|v| v.parse().ok()).unwrap_or(0)
}

async fn chat(stack: &Stack, c: &Conversation, turn: usize) -> Reply {
    let http = reqwest::Client::new();
    let r = client::chat(&http, &stack.base_url(), &c.body(MODEL, turn, 4, false)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    r
}

/// Waits until the filter's decisions credit blocks from events (the snapshot arrived); on
/// timeout, fails with the updater's status and the singleton's counters.
async fn events_reach_the_filter(stack: &Stack, c: &Conversation, turn: usize) -> Reply {
    let found = eventually("event knowledge in decisions", Duration::from_secs(40), || async {
        let r = chat(stack, c, turn).await;
        (field(&r, "blocks_from_events") > 0).then_some(r)
    })
    .await;
    match found {
        Ok(r) => r,
        Err(e) => {
            let status = match &stack.updater {
                Some(u) => {
                    u.status().await.map(|v| v.to_string()).unwrap_or_else(|e| e.to_string())
                }
                None => "no updater".into(),
            };
            let m = stack.envoy.prometheus().await.unwrap_or_default();
            let sync: Vec<_> = m.iter().filter(|(k, _)| k.starts_with("kvroute_sync")).collect();
            panic!(
                "{e}\nupdater status: {status}\nsingleton: {sync:?}\nlogs in {}",
                stack.dir.display()
            );
        }
    }
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
    // Wait for the removal to reach the updater, then for ten snapshot ticks (100 ms each) so
    // Envoy's singleton holds a snapshot that includes it.
    let updater = stack.updater.as_ref().unwrap();
    eventually("eviction seen by the updater", Duration::from_secs(20), || async {
        let s = updater.status().await.ok()?;
        (s["workers"][&worker]["blocks"]["GPU"].as_u64().unwrap_or(0) == 0).then_some(())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
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
    tokio::time::sleep(Duration::from_millis(500)).await;
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
