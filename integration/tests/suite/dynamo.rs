//! NVIDIA Dynamo's KV router (`kvroute_stack::dynamo`: its frontend from the pinned wheels, one
//! bridge per worker) in front of two simulated workers (Qwen3's tokenizer and chat template when
//! `./dev setup` fetched them, else the demo model): a chat request is answered, and a long prefix
//! served directly by one worker (so only that worker's KV events, relayed by its bridge, can
//! tell) is routed to it, both ways round, twice, with the overlap credited. Dynamo's frontend does not pass the workers' headers
//! on; who served comes from its `nvext.worker_id`, mapped back to the worker by the bridges'
//! instance ids. Skipped without Dynamo's venv, except in CI.

use std::time::Duration;

use kvroute_stack::client::{self, Reply};
use kvroute_stack::dynamo::{self, DynamoRouter};
use kvroute_stack::paths;
use kvroute_stack::peers::PeerKind;
use kvroute_stack::sim::SimWorker;
use serde_json::{json, Value};

use crate::peers::{model, two_workers};

/// Two workers and Dynamo in front of them, or `None` (skipped) without the venv outside CI.
async fn start() -> Option<(Vec<SimWorker>, DynamoRouter)> {
    if let Err(why) = dynamo::dynamo_venv() {
        assert!(std::env::var_os("CI").is_none(), "{why} (in CI the Dynamo test must run)");
        paths::skipped("kvroute-integration dynamo::kv_router", &why);
        return None;
    }
    // The kind is the peers' field; Dynamo's start reads the workers, model and block size.
    let (sims, cfg, dir) = two_workers(PeerKind::VllmRouterKvAware, &[]).await;
    let t = std::time::Instant::now();
    let router = DynamoRouter::start(&cfg, &dir).await.unwrap();
    eprintln!(
        "dynamo ready in {:?}, frontend pid {:?}, rss {:?} kB, bridges+broker {:?} kB",
        t.elapsed(),
        router.pid(),
        router.rss_kb(),
        router.bridge_rss_kb()
    );
    Some((sims, router))
}

/// A chat request asking Dynamo to say which worker served (`nvext.worker_id`).
fn body(prefix: &str, tail: &str) -> Value {
    let (model, _) = model();
    json!({"model": model, "messages": [{"role": "user", "content": format!("{prefix} {tail}")}],
           "max_tokens": 2, "nvext": {"extra_fields": ["worker_id"]}})
}

async fn chat(base: &str, body: &Value) -> Reply {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let r = client::chat(&http, base, body).await.unwrap();
    assert_eq!(r.status, 200, "{base}: {}", r.body);
    r
}

/// The worker index Dynamo says served `r`.
fn served(router: &DynamoRouter, r: &Reply) -> Option<usize> {
    let v: Value = serde_json::from_str(&r.body).ok()?;
    router.worker_of(v["nvext"]["worker_id"]["decode_worker_id"].as_u64()?)
}

/// How long the warm worker's KV events may take to reach Dynamo's router.
const EVENTS: Duration = Duration::from_secs(10);

/// The sum of the samples of Dynamo's Prometheus text whose line starts with `series` and
/// carries every label in `labels`.
async fn metric(base: &str, series: &str, labels: &[&str]) -> f64 {
    let text = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .filter(|l| l.starts_with(series) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// A ~1 k-token prefix unique to `seed`.
fn prefix(seed: u64) -> String {
    kvroute_testkit::textgen::words(seed.wrapping_mul(7919) ^ 0xd1a0, 600)
}

#[tokio::test]
async fn kv_router() {
    let Some((sims, router)) = start().await else { return };
    let base = router.base_url();

    // A chat request through Dynamo: 200 with a completion, served by one of our workers.
    let r = chat(&base, &body(&kvroute_testkit::textgen::words(1, 40), "Hello?")).await;
    let v: Value = serde_json::from_str(&r.body).unwrap();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
    assert!(!text.is_empty(), "no completion: {}", r.body);
    assert!(served(&router, &r).is_some(), "no known nvext.worker_id: {}", r.body);

    // A prefix warmed on worker `a` directly goes to `a`: Dynamo learnt it from a's KV events
    // (relayed by a's bridge; the router counts what it applied), and credits the overlap.
    const APPLIED: &str = "dynamo_component_kv_cache_events_applied{";
    const SELECTED: &str = "dynamo_component_router_kv_selected_cached_prefix_tokens_total{";
    for (a, seed) in [(0usize, 10u64), (1, 20), (0, 30), (1, 40)] {
        let p = prefix(seed);
        let applied = metric(&base, APPLIED, &[r#"event_type="stored""#, r#"status="ok""#]).await;
        let w = chat(&format!("http://{}", sims[a].addr), &body(&p, "First question?")).await;
        assert_eq!(w.worker.as_deref(), Some(sims[a].addr.as_str()));
        let seen = kvroute_stack::eventually("the warm worker's KV events", EVENTS, || {
            let base = base.clone();
            async move {
                let now = metric(&base, APPLIED, &[r#"event_type="stored""#, r#"status="ok""#]);
                (now.await > applied).then_some(())
            }
        });
        seen.await.unwrap_or_else(|e| panic!("{e:#}\n{}", router.bridge_log_tail(a, 10)));
        let cached = metric(&base, SELECTED, &[]).await;
        let r = chat(&base, &body(&p, "A different follow-up.")).await;
        assert_eq!(served(&router, &r), Some(a), "warmed worker {a}\n{}", router.log_tail(10));
        // At least 20 blocks of the ~50-block prefix were credited to the chosen worker.
        let credited = metric(&base, SELECTED, &[]).await - cached;
        assert!(credited >= 320.0, "prefix {seed}: {credited} cached tokens credited");
    }

    // Dropping it stops every process it started.
    let pid = router.pid().unwrap();
    drop(router);
    let gone = kvroute_stack::eventually("the frontend to go", Duration::from_secs(10), || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let alive = !stat.is_empty() && !stat.contains(") Z ");
        async move { (!alive).then_some(()) }
    });
    gone.await.unwrap();
}
