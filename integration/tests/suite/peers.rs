//! The peer routers kvroute is compared with (`kvroute_stack::peers`: smg and vllm-router from
//! their pinned wheels) in front of two simulated workers: each starts, routes a chat request
//! (Qwen3's tokenizer and chat template when `./dev setup` fetched them, else the demo model),
//! and keeps a long prefix on the worker that holds it: for vllm-router's kv_aware the worker
//! warmed directly (so only its KV events can tell), in both directions; for the cache_aware
//! policies the worker the router itself chose. A peer that stops working (a new wheel, a sim
//! change its event decoder refuses) fails here. Skipped without the peers' venv, except in CI.

use std::time::Duration;

use kvroute_stack::client::{self, Reply};
use kvroute_stack::paths;
use kvroute_stack::peers::{self, PeerConfig, PeerKind, PeerRouter, PeerWorker};
use kvroute_stack::sim::SimWorker;
use kvroute_stack::stack::{MODEL, QWEN3_MODEL};
use serde_json::{json, Value};

/// The served model and its bundle directory: Qwen3 when present, else the built-in demo.
pub(crate) fn model() -> (String, Option<std::path::PathBuf>) {
    let dir = kvroute_core::decision::tokenize::model::qwen3_dir();
    if dir.join("tokenizer.json").is_file() && dir.join("tokenizer_config.json").is_file() {
        (QWEN3_MODEL.into(), Some(dir))
    } else {
        (MODEL.into(), None)
    }
}

/// Two workers, the peer in front of them, or `None` (skipped) without the venv outside CI.
async fn start(kind: PeerKind) -> Option<(Vec<SimWorker>, PeerRouter)> {
    if let Err(why) = peers::venv() {
        assert!(std::env::var_os("CI").is_none(), "{why} (in CI the peer-router tests must run)");
        paths::skipped(&format!("kvroute-integration peers::{}", kind.name()), &why);
        return None;
    }
    let (sims, cfg, dir) = two_workers(kind, kind.sim_args()).await;
    let t = std::time::Instant::now();
    let router = PeerRouter::start(&cfg, &dir).await.unwrap();
    eprintln!(
        "{} ready in {:?}, pid {:?}, rss {:?} kB",
        kind.name(),
        t.elapsed(),
        router.pid(),
        router.rss_kb()
    );
    Some((sims, router))
}

/// Two simulated workers (block size 16, [`model`], `sim_args`) and a peer configuration for
/// them, in a fresh scratch directory.
pub(crate) async fn two_workers(
    kind: PeerKind,
    sim_args: &[&str],
) -> (Vec<SimWorker>, PeerConfig, std::path::PathBuf) {
    let dir = paths::scratch_dir(&format!("peer-{}", kind.name())).unwrap();
    let (model, model_dir) = model();
    let mut args = vec!["--model".to_string(), model.clone(), "--block-size".into(), "16".into()];
    if let Some(d) = &model_dir {
        args.extend(["--model-dir".into(), d.display().to_string()]);
    }
    args.extend(sim_args.iter().map(|s| s.to_string()));
    let mut sims = Vec::new();
    for i in 0..2 {
        sims.push(SimWorker::start(i, &args, &dir).await.unwrap());
    }
    let workers = sims.iter().map(PeerWorker::of).collect();
    (sims, PeerConfig { kind, workers, model, block_size: 16, tokenizer_dir: model_dir }, dir)
}

fn body(prefix: &str, tail: &str) -> Value {
    let (model, _) = model();
    json!({"model": model, "messages": [{"role": "user", "content": format!("{prefix} {tail}")}],
           "max_tokens": 2})
}

async fn chat(base: &str, body: &Value) -> Reply {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let r = client::chat(&http, base, body).await.unwrap();
    assert_eq!(r.status, 200, "{base}: {}", r.body);
    r
}

/// Who served `r` (the sim's `x-worker-id`, its address, passed through by every peer).
fn served(r: &Reply) -> &str {
    r.worker.as_deref().unwrap_or("(no x-worker-id)")
}

/// A request through the peer: 200 with a completion.
async fn routes(router: &PeerRouter) {
    let r =
        chat(&router.base_url(), &body(&kvroute_testkit::textgen::words(1, 40), "Hello?")).await;
    let v: Value = serde_json::from_str(&r.body).unwrap();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
    assert!(!text.is_empty(), "no completion: {}", r.body);
}

/// A ~1 k-token prefix unique to `seed`.
fn prefix(seed: u64) -> String {
    kvroute_testkit::textgen::words(seed.wrapping_mul(7919) ^ 0x5eed, 600)
}

/// cache_aware: a long prefix the router placed goes where it placed it, for three prefixes.
async fn follows_its_own_placement(kind: PeerKind) {
    let Some((_sims, router)) = start(kind).await else { return };
    routes(&router).await;
    if kind == PeerKind::SmgCacheAware {
        // It tells the workers for vLLM engines (whose load it polls), not generic OpenAI servers:
        // the simulator answers `/version` and `owned_by: "vllm"` as vLLM does.
        let url = format!("{}/workers", router.base_url());
        let v: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
        let kinds: Vec<&str> = v["workers"]
            .as_array()
            .map(|ws| ws.iter().filter_map(|w| w["runtime_type"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(kinds, ["vllm", "vllm"], "{v}");
    }
    for seed in 0..3 {
        let p = prefix(seed);
        let first = chat(&router.base_url(), &body(&p, "First question?")).await;
        let again = chat(&router.base_url(), &body(&p, "A different follow-up.")).await;
        assert_eq!(served(&first), served(&again), "prefix {seed} moved\n{}", router.log_tail(20));
        assert!(
            again.cached_tokens.unwrap_or(0) > 0,
            "prefix {seed}: no cache hit: {}",
            again.body
        );
    }
    // Its own count of requests matched in its prefix trees.
    let matched = match kind {
        PeerKind::SmgCacheAware => r#"smg_cache_aware_policy_branch_total{branch="tree_match"}"#,
        _ => {
            r#"vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="prefix_hit"}"#
        }
    };
    let hits = metric(&router, matched).await;
    assert!(hits >= 3.0, "{matched} = {hits}");
}

/// The value of the sample of the peer's Prometheus text whose line starts with `series`.
async fn metric(router: &PeerRouter, series: &str) -> f64 {
    let text = reqwest::get(router.metrics_url()).await.unwrap().text().await.unwrap();
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or(0.0)
}

/// kv_aware: a prefix served directly by worker `a` (only its KV events tell the router) is
/// routed to `a` as a placement hit, both ways round; the router decoded every batch.
async fn follows_kv_events(kind: PeerKind) {
    let Some((sims, router)) = start(kind).await else { return };
    routes(&router).await;
    let hits = r#"vllm_router_kv_placement_lookups_total{result="hit"}"#;
    for (a, seed) in [(0usize, 10u64), (1, 20)] {
        let warm = format!("http://{}", sims[a].addr);
        // Events reach the router asynchronously and it has no index query: a fresh prefix per
        // attempt, bounded. An attempt counts only when the router also counted a placement hit
        // for it: its default worker (a tie with no events known) may be the warm one by chance.
        let mut got = Vec::new();
        let mut followed = false;
        for attempt in 0..5 {
            let p = prefix(seed + attempt);
            let w = chat(&warm, &body(&p, "First question?")).await;
            assert_eq!(served(&w), sims[a].addr);
            let before = metric(&router, hits).await;
            let r = chat(&router.base_url(), &body(&p, "A different follow-up.")).await;
            let hit = metric(&router, hits).await > before;
            got.push(format!("{} (placement hit: {hit})", served(&r)));
            if served(&r) == sims[a].addr && hit {
                assert!(
                    r.cached_tokens.unwrap_or(0) > 0,
                    "routed to the warm worker, no hit: {}",
                    r.body
                );
                followed = true;
                break;
            }
        }
        assert!(followed, "warmed {}, routed to {got:?}\n{}", sims[a].addr, router.log_tail(20));
    }
    let undecoded = router.undecoded_event_batches();
    assert_eq!(undecoded, 0, "undecoded event batches:\n{}", router.log_tail(20));
}

#[tokio::test]
async fn smg_cache_aware() {
    follows_its_own_placement(PeerKind::SmgCacheAware).await;
}

#[tokio::test]
async fn vllm_router_cache_aware() {
    follows_its_own_placement(PeerKind::VllmRouterCacheAware).await;
}

#[tokio::test]
async fn vllm_router_kv_aware() {
    follows_kv_events(PeerKind::VllmRouterKvAware).await;
}

/// Dropping a peer stops its whole process group: nothing of it is left.
#[tokio::test]
async fn stopped_on_drop() {
    let Some((_sims, router)) = start(PeerKind::SmgCacheAware).await else { return };
    let pid = router.pid().unwrap();
    drop(router);
    let gone =
        kvroute_stack::eventually("the peer's process to go", Duration::from_secs(10), || {
            let alive = std::path::Path::new(&format!("/proc/{pid}/stat")).exists()
                && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .unwrap_or_default()
                    .contains(") Z ");
            async move { (!alive).then_some(()) }
        });
    gone.await.unwrap();
}
