//! Many models, LoRA adapters, plan swaps and the token cache on the decision path.

use std::collections::BTreeSet;

use super::super::*;
use crate::decision::request::{parse, Endpoint};
use crate::wire::snapshot::{Snapshot, SnapshotWorker};
use serde_json::{json, Value};

const W: [&str; 5] = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4", "127.0.0.1:9"];

/// Model `a` on workers 1 and 2 with adapter `a-sql` configured, model `b` on workers 3 and 4;
/// worker 9 is in no pool.
fn router() -> Router {
    let cfg = json!({"models": [
            {"name": "a", "workers": [W[0], W[1]], "adapters": ["a-sql"]},
            {"name": "b", "workers": [W[2], W[3]]}],
        "tie_band": {"abs_ms": 0.0, "rel": 0.0}});
    Router::new(&FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap()).unwrap()
}

fn req(model: &str, text: &str) -> ParsedRequest {
    let body = json!({"model": model, "messages": [{"role": "user", "content": text}]});
    parse(Endpoint::Chat, body.to_string().as_bytes()).unwrap()
}

fn idle(_: &str) -> WorkerLoad {
    WorkerLoad::default()
}

fn workers(d: &Decision) -> BTreeSet<&str> {
    d.ranked.iter().map(|s| s.worker.as_str()).collect()
}

const LONG: &str = "a long shared system prompt that every request of this test repeats again ";

#[test]
fn requests_never_leave_their_models_pool() {
    let mut r = router();
    let (qa, qb) = (req("a", &LONG.repeat(20)), req("b", &LONG.repeat(20)));
    let ha = r.decide(&qa, 0, &idle, 0, 0).unwrap().block_hashes;
    let hb = r.decide(&qb, 0, &idle, 0, 0).unwrap().block_hashes;
    // Every worker outside each pool holds everything; the pools' own workers hold nothing.
    for (w, h) in [(W[4], &ha), (W[4], &hb), (W[2], &ha), (W[0], &hb)] {
        r.observe(w, h, Source::Feedback, 0);
    }
    let view = |w: &str| SnapshotWorker {
        worker: w.into(),
        observed_at_ms: 0,
        compatible: true,
        gpu: ha.iter().chain(&hb).copied().collect::<BTreeSet<_>>().into_iter().collect(),
        ..Default::default()
    };
    r.apply_snapshot(&Snapshot { version: 1, workers: vec![view(W[4])], ..Default::default() });
    r.events_checked(0);
    for pick in 0..8 {
        let da = r.decide(&qa, 0, &idle, 1, pick).unwrap();
        assert_eq!(workers(&da), BTreeSet::from([W[0], W[1]]));
        assert_eq!(da.predicted_cached_tokens(), 0);
        let db = r.decide(&qb, 0, &idle, 1, pick).unwrap();
        assert_eq!(workers(&db), BTreeSet::from([W[2], W[3]]));
        assert_eq!(db.model.name, "b");
    }
}

#[test]
fn adapters_route_in_their_base_pool_in_their_own_cache_domain() {
    let mut r = router();
    let text = LONG.repeat(20);
    let base = r.decide(&req("a", &text), 0, &idle, 0, 0).unwrap();
    let sql = r.decide(&req("a-sql", &text), 0, &idle, 0, 0).unwrap();
    assert_eq!((sql.model.name.as_str(), sql.adapter.as_deref()), ("a", Some("a-sql")));
    assert_eq!(workers(&sql), BTreeSet::from([W[0], W[1]]));
    // Learned from a worker's report: `a-law` is an adapter of `a`.
    assert_eq!(r.decide(&req("a-law", &text), 0, &idle, 0, 0).unwrap_err().status, 404);
    r.set_adapters(W[1], "a", &["a-law".to_string()]);
    let law = r.decide(&req("a-law", &text), 0, &idle, 0, 0).unwrap();
    assert_eq!(law.primary().unwrap().worker, W[1], "the worker with the adapter loaded");
    let sets = [&base, &sql, &law].map(|d| d.block_hashes.iter().collect::<BTreeSet<_>>());
    assert!(sets[0].len() > 10);
    for (i, j) in [(0, 1), (0, 2), (1, 2)] {
        assert!(sets[i].is_disjoint(&sets[j]), "domains {i} and {j} share a block hash");
    }
    // An adapter reported under a base no pool serves is still unknown.
    r.set_adapters(W[4], "elsewhere", &["x-ad".to_string()]);
    let e = r.decide(&req("x-ad", &text), 0, &idle, 0, 0).unwrap_err();
    assert_eq!((e.status, e.code), (404, "model_not_found"));
}

#[test]
fn the_adapter_holder_wins_until_its_queue_costs_more_than_loading_elsewhere() {
    let mut r = router();
    r.set_adapters(W[0], "a", &["a-sql".to_string()]);
    let q = req("a-sql", "short question");
    for pick in 0..8 {
        assert_eq!(r.decide(&q, 0, &idle, 0, pick).unwrap().primary().unwrap().worker, W[0]);
    }
    let busy = |w: &str| WorkerLoad {
        inflight_requests: 1,
        prefilling_requests: 1,
        prefill_tokens: if w == W[0] { 20_000 } else { 0 },
        prefill_elapsed_ms: 0,
        prefill_sq_tokens: 0,
        arriving_tokens_per_s: 0,
        behind_tokens: 0,
        passing_tokens_per_s: 0,
    };
    let d = r.decide(&q, 0, &busy, 0, 0).unwrap();
    assert_eq!(d.primary().unwrap().worker, W[1]);
    assert!(d.primary().unwrap().adapter_ms > 0.0);
}

#[test]
fn snapshots_teach_adapters_and_decisions_keep_their_plan() {
    let mut r = router();
    let view = SnapshotWorker {
        worker: W[3].into(),
        compatible: true,
        model: "b".into(),
        adapters: vec!["b-chat".into()],
        ..Default::default()
    };
    r.apply_snapshot(&Snapshot { version: 1, workers: vec![view], ..Default::default() });
    let q = req("b-chat", "hello");
    let d = r.decide(&q, 0, &idle, 0, 0).unwrap();
    assert_eq!(d.primary().unwrap().worker, W[3]);
    let fp = d.model.fingerprint();
    assert!(fp.is_some());
    // The bundle goes away (a new plan); the decision in flight keeps the entry it used.
    let old = Arc::clone(r.plan());
    r.set_bundle("b", None);
    assert!(!Arc::ptr_eq(&old, r.plan()));
    assert_eq!(d.model.fingerprint(), fp);
    let now = r.decide(&q, 0, &idle, 0, 0).unwrap();
    assert_eq!(now.fallback, Some(FallbackReason::NoBundle));
    r.swap_plan(old);
    assert_eq!(r.decide(&q, 0, &idle, 0, 0).unwrap().fallback, None);
}

#[test]
fn chat_prompts_go_through_the_token_cache() {
    let r = router();
    let mut body = json!({"model": "a", "messages": [{"role": "user", "content": LONG}]});
    let first = parse(Endpoint::Chat, body.to_string().as_bytes()).unwrap();
    let d1 = r.decide(&first, 0, &idle, 0, 0).unwrap();
    body["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": "ok"}),
        json!({"role": "user", "content": "more"}),
    ]);
    let second = parse(Endpoint::Chat, body.to_string().as_bytes()).unwrap();
    let d2 = r.decide(&second, 0, &idle, 0, 0).unwrap();
    assert_eq!(d2.block_hashes[..d1.block_hashes.len()], d1.block_hashes[..]);
    let stats = r.token_cache_stats();
    assert_eq!((stats.misses, stats.hits), (1, 1), "{stats:?}");
    assert!(stats.saved_tokens > 0);
}

#[test]
fn a_conversation_under_way_is_kept_in_the_token_caches_protected_part() {
    let chat = |messages: Value| {
        let body = json!({"model": "a", "messages": messages});
        parse(Endpoint::Chat, body.to_string().as_bytes()).unwrap()
    };
    let long = LONG.repeat(8);
    let first = json!([{"role": "user", "content": long}]);
    // A prompt seen once stays on probation (but for the shared opening segment, reused).
    let r = router();
    r.decide(&chat(first.clone()), 0, &idle, 0, 0).unwrap();
    r.decide(&chat(json!([{"role": "user", "content": "another question"}])), 0, &idle, 0, 0)
        .unwrap();
    let once = r.token_cache_stats();
    assert!(once.protected_bytes < once.bytes / 4, "{once:?}");
    // Its next turn carries an answer: the whole conversation is protected.
    let r = router();
    r.decide(&chat(first), 0, &idle, 0, 0).unwrap();
    let turn = json!([
        {"role": "user", "content": long},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "more"},
    ]);
    r.decide(&chat(turn), 0, &idle, 0, 0).unwrap();
    let kept = r.token_cache_stats();
    assert_eq!(kept.protected_bytes, kept.bytes, "{kept:?}");
}

#[test]
fn the_updaters_pool_replaces_the_configured_one_while_it_names_members() {
    let mut r = router();
    let q = req("a", &LONG.repeat(20));
    let view = |w: &str, model: &str| SnapshotWorker {
        worker: w.into(),
        compatible: true,
        model: model.into(),
        ..Default::default()
    };
    // A partial view (no pool flag): the configured pool.
    let partial = Snapshot { version: 1, workers: vec![view(W[4], "a")], ..Default::default() };
    r.apply_snapshot(&partial);
    assert_eq!(workers(&r.decide(&q, 0, &idle, 1, 0).unwrap()), BTreeSet::from([W[0], W[1]]));
    // The whole pool: worker 9 (configured nowhere) and 2 serve `a`; 3 serves `b`, 4 is not
    // identified yet.
    let pool = Snapshot {
        version: 2,
        pool: true,
        workers: vec![view(W[1], "a"), view(W[2], "b"), view(W[3], ""), view(W[4], "a")],
        ..Default::default()
    };
    r.apply_snapshot(&pool);
    for pick in 0..8 {
        let d = r.decide(&q, 0, &idle, 1, pick).unwrap();
        assert_eq!(workers(&d), BTreeSet::from([W[1], W[4]]));
    }
    assert_eq!(r.pool("a").unwrap(), [W[1], W[4]]);
    assert_eq!(r.pool("b").unwrap(), [W[2]]);
    assert_eq!(r.workers("a").unwrap(), [W[0], W[1]], "the configured pool is unchanged");
    // Stats and reconciliation cover the discovered worker 9 as well as the configured ones.
    assert_eq!(r.routable_workers(), W.to_vec());
    // Worker 4 is identified as `a`, 9 leaves (a delta).
    let next = Snapshot {
        version: 3,
        workers: vec![view(W[1], "a"), view(W[2], "b"), view(W[3], "a")],
        ..pool.clone()
    };
    r.apply_delta(&crate::wire::delta::Delta::between(&pool, &next));
    let d = r.decide(&q, 0, &idle, 1, 0).unwrap();
    assert_eq!(workers(&d), BTreeSet::from([W[1], W[3]]));
    // No member of `b` left: its configured workers are the fallback.
    let none = Snapshot { version: 4, workers: vec![view(W[1], "a")], ..next.clone() };
    r.apply_delta(&crate::wire::delta::Delta::between(&next, &none));
    let db = r.decide(&req("b", "hi"), 0, &idle, 1, 0).unwrap();
    assert_eq!(workers(&db), BTreeSet::from([W[2], W[3]]));
}

#[test]
fn a_large_pool_keeps_its_best_the_least_waiting_and_the_longest_holder() {
    let names: Vec<String> =
        (0..300).map(|i| format!("10.0.{}.{}:8000", i / 100, i % 100)).collect();
    let cfg = json!({"models": [{"name": "a", "workers": names}]});
    let mut r = Router::new(&FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap()).unwrap();
    let q = req("a", &LONG.repeat(40));
    let hashes = r.decide(&q, 0, &idle, 0, 0).unwrap().block_hashes;
    // The last worker holds the prompt and has the longest queue; every other worker's queue
    // grows with its position, so the first one waits least.
    let holder = names[299].as_str();
    r.observe(holder, &hashes, Source::Feedback, 0);
    let position = |w: &str| names.iter().position(|n| n == w).unwrap_or(0) as u64;
    let load = |w: &str| WorkerLoad {
        inflight_requests: 1,
        prefilling_requests: 1,
        prefill_tokens: 1_000 + 400 * position(w),
        prefill_elapsed_ms: 0,
        prefill_sq_tokens: 0,
        arriving_tokens_per_s: 0,
        behind_tokens: 0,
        passing_tokens_per_s: 0,
    };
    for pick in 0..4 {
        let d = r.decide(&q, 0, &load, 1, pick).unwrap();
        assert!(d.ranked.len() <= crate::decision::cost::MAX_RANKED + 3, "{}", d.ranked.len());
        let kept = workers(&d);
        assert!(kept.contains(names[0].as_str()), "the least waiting worker is kept");
        assert!(kept.contains(holder), "the holder of the longest match is kept");
        let holder_score = d.ranked.iter().find(|s| s.worker == holder).unwrap();
        assert_eq!(
            holder_score.cached_tokens,
            d.ranked.iter().map(|s| s.cached_tokens).max().unwrap()
        );
        // The kept workers past the primary follow in cost order.
        assert!(d.ranked[1..].windows(2).all(|p| p[0].cost_ms <= p[1].cost_ms));
    }
}
