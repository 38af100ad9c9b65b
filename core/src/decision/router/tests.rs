//! The router end to end: credit, tenants, load, snapshots and deltas (moved from `router.rs`);
//! pools, adapters and plan swaps in `tests/pools.rs`.

mod lookahead;
mod pools;
mod topology;

use super::*;
use crate::decision::audit::AuditClass;
use crate::decision::request::{parse, Endpoint};
use serde_json::json;

fn router() -> Router {
    let cfg = FilterConfig::from_json(
        json!({"models":[{"name":"m","workers":["127.0.0.1:1","127.0.0.1:2","127.0.0.1:3"]}],
               "tie_band":{"abs_ms":0.0,"rel":0.0}})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    Router::new(&cfg).unwrap()
}

fn req(salt: Option<&str>, text: &str) -> ParsedRequest {
    let mut body = json!({"model":"m","messages":[{"role":"user","content":text}]});
    if let Some(s) = salt {
        body["cache_salt"] = json!(s);
    }
    parse(Endpoint::Chat, body.to_string().as_bytes()).unwrap()
}

const LONG: &str = "the quick brown fox jumps over the lazy dog and keeps running far away ";

#[test]
fn media_and_batch_requests_are_routed_on_load_alone() {
    let r = router();
    let idle = |_: &str| WorkerLoad::default();
    let body = json!({"model":"m","messages":[{"role":"user","content":[
        {"type":"text","text":LONG},{"type":"image_url","image_url":{"url":"x"}}]}]});
    let q = parse(Endpoint::Chat, body.to_string().as_bytes()).unwrap();
    let d = r.decide(&q, 400, &idle, 0, 0).unwrap();
    assert_eq!(d.fallback, Some(FallbackReason::Multimodal));
    assert!(d.block_hashes.is_empty() && d.primary().is_some());
    let body = json!({"model":"m","prompt":[LONG, LONG]});
    let q = parse(Endpoint::Completions, body.to_string().as_bytes()).unwrap();
    let d = r.decide(&q, 400, &idle, 0, 0).unwrap();
    assert_eq!(d.fallback, Some(FallbackReason::Batch));
    assert!(d.block_hashes.is_empty());
}

#[test]
fn credited_worker_wins_and_unknown_model_is_404() {
    let mut r = router();
    let idle = |_: &str| WorkerLoad::default();
    let q = req(None, &LONG.repeat(20));
    let d = r.decide(&q, 0, &idle, 0, 0).unwrap();
    assert!(d.block_hashes.len() > 10);
    assert_eq!(d.predicted_cached_tokens(), 0);
    r.observe("127.0.0.1:2", &d.block_hashes, Source::Routed, 0);
    let d2 = r.decide(&q, 0, &idle, 10, 0).unwrap();
    assert_eq!(d2.primary().unwrap().worker, "127.0.0.1:2");
    assert_eq!(d2.knowledge_age_ms, 10);
    assert_eq!(d2.predicted_cached_tokens(), d.block_hashes.len() as u64 * 16);
    assert_eq!(d2.header_value().split(',').count(), 2);
    let mut other = q.clone();
    other.model = "nope".into();
    assert_eq!(r.decide(&other, 0, &idle, 0, 0).unwrap_err().status, 404);
}

/// vLLM recomputes the last prompt token, so a worker holding every block of a prompt that is
/// an exact multiple of the block size reuses one block less: the prediction says so, and the
/// audit finds no error (the simulator reports the same, see sim's engine tests).
#[test]
fn exact_multiples_of_the_block_size_are_predicted_as_the_engine_reuses_them() {
    let mut r = router();
    let idle = |_: &str| WorkerLoad::default();
    for n in [16u32, 17, 32, 63, 64, 65, 160, 1024] {
        let ids: Vec<u32> = (0..n).map(|i| 1000 + i).collect();
        let body = json!({"model":"m","prompt":ids});
        let q = parse(Endpoint::Completions, body.to_string().as_bytes()).unwrap();
        let d = r.decide(&q, 0, &idle, 0, 0).unwrap();
        assert_eq!(d.block_hashes.len() as u32, n / 16);
        r.observe("127.0.0.1:2", &d.block_hashes, Source::Routed, 0);
        let d2 = r.decide(&q, 0, &idle, 10, 0).unwrap();
        let reused = u64::from((n - 1) / 16 * 16);
        assert_eq!(d2.predicted_cached_tokens(), reused, "{n}");
        assert_eq!(d2.uncached_tokens(), u64::from(n) - reused);
        assert_eq!(d2.prediction_error(reused), 0, "{n}");
        let want = if reused == 0 { AuditClass::OrdinaryMiss } else { AuditClass::HitAsPredicted };
        assert_eq!(d2.audit(reused), want, "{n}");
    }
}

/// vLLM does not read its prefix cache for a request asking for prompt logprobs: no worker is
/// credited, the prompt's blocks are still hashed (the engine stores them).
#[test]
fn a_request_the_engine_does_not_look_up_is_credited_nothing() {
    let mut r = router();
    let idle = |_: &str| WorkerLoad::default();
    let q = req(None, &LONG.repeat(20));
    let d = r.decide(&q, 0, &idle, 0, 0).unwrap();
    r.observe("127.0.0.1:2", &d.block_hashes, Source::Routed, 0);
    let mut logprobs = q.clone();
    logprobs.skips_cache_read = true;
    let d2 = r.decide(&logprobs, 0, &idle, 10, 0).unwrap();
    assert_eq!(d2.predicted_cached_tokens(), 0);
    assert_eq!(d2.block_hashes, d.block_hashes);
    assert!(r.decide(&q, 0, &idle, 10, 0).unwrap().predicted_cached_tokens() > 0);
}

#[test]
fn cache_blind_ablation_credits_nothing_but_still_ranks_on_load() {
    let cfg = FilterConfig::from_json(
        json!({"models":[{"name":"m","workers":["127.0.0.1:1","127.0.0.1:2"]}],
               "tie_band":{"abs_ms":0.0,"rel":0.0},"knowledge":{"cache_aware":false}})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let mut r = Router::new(&cfg).unwrap();
    let q = req(None, &LONG.repeat(20));
    let idle = |_: &str| WorkerLoad::default();
    let d = r.decide(&q, 0, &idle, 0, 0).unwrap();
    r.observe("127.0.0.1:1", &d.block_hashes, Source::Routed, 0);
    // Worker 1 holds the whole prefix but is busier: blind to the cache, the router goes to 2.
    let busy = |w: &str| WorkerLoad {
        inflight_requests: if w == "127.0.0.1:1" { 3 } else { 0 },
        prefilling_requests: if w == "127.0.0.1:1" { 3 } else { 0 },
        prefill_tokens: if w == "127.0.0.1:1" { 3000 } else { 0 },
        prefill_elapsed_ms: 0,
        prefill_sq_tokens: 0,
        arriving_tokens_per_s: 0,
        behind_tokens: 0,
        passing_tokens_per_s: 0,
    };
    let d2 = r.decide(&q, 0, &busy, 10, 0).unwrap();
    assert_eq!(d2.predicted_cached_tokens(), 0);
    assert_eq!(d2.primary().unwrap().worker, "127.0.0.1:2");
}

#[test]
fn tenants_never_share_cache_credit() {
    let mut r = router();
    let idle = |_: &str| WorkerLoad::default();
    let a = r.decide(&req(Some("tenant-a"), &LONG.repeat(20)), 0, &idle, 0, 0).unwrap();
    r.observe("127.0.0.1:3", &a.block_hashes, Source::Routed, 0);
    let b = r.decide(&req(Some("tenant-b"), &LONG.repeat(20)), 0, &idle, 0, 0).unwrap();
    assert_eq!(b.predicted_cached_tokens(), 0);
    assert!(a.block_hashes.iter().all(|h| !b.block_hashes.contains(h)));
    let a2 = r.decide(&req(Some("tenant-a"), &LONG.repeat(20)), 0, &idle, 0, 0).unwrap();
    assert!(a2.predicted_cached_tokens() > 0);
}

#[test]
fn busy_holder_loses_to_recompute_once_waiting_costs_more() {
    let mut r = router();
    let q = req(None, &LONG.repeat(20));
    let d = r.decide(&q, 0, &|_: &str| WorkerLoad::default(), 0, 0).unwrap();
    r.observe("127.0.0.1:1", &d.block_hashes, Source::Routed, 0);
    let busy = |w: &str| {
        if w == "127.0.0.1:1" {
            WorkerLoad {
                inflight_requests: 20,
                prefilling_requests: 20,
                prefill_tokens: 80_000,
                prefill_elapsed_ms: 0,
                prefill_sq_tokens: 0,
                arriving_tokens_per_s: 0,
                behind_tokens: 0,
                passing_tokens_per_s: 0,
            }
        } else {
            WorkerLoad::default()
        }
    };
    let d2 = r.decide(&q, 0, &busy, 1, 0).unwrap();
    assert_ne!(d2.primary().unwrap().worker, "127.0.0.1:1");
}

#[test]
fn snapshots_credit_events_and_incompatible_workers_get_none() {
    use crate::wire::snapshot::{Snapshot, SnapshotWorker};
    let mut r = router();
    let idle = |_: &str| WorkerLoad::default();
    let q = req(None, &LONG.repeat(20));
    let d = r.decide(&q, 0, &idle, 0, 0).unwrap();
    let view = |w: &str, compatible| SnapshotWorker {
        worker: w.into(),
        observed_at_ms: 100,
        compatible,
        gpu: d.block_hashes.clone(),
        offloaded: vec![],
        load: None,
        ..Default::default()
    };
    let snap = Snapshot {
        version: 2,
        generated_at_ms: 100,
        workers: vec![view("127.0.0.1:2", true), view("127.0.0.1:3", false)],
        ..Default::default()
    };
    r.apply_snapshot(&snap);
    r.events_checked(100);
    let d2 = r.decide(&q, 0, &idle, 150, 0).unwrap();
    assert_eq!(d2.primary().unwrap().worker, "127.0.0.1:2");
    assert_eq!(d2.blocks_from_events, d.block_hashes.len());
    assert_eq!(d2.fallback, None);
    let incompatible = d2.ranked.iter().find(|s| s.worker == "127.0.0.1:3").unwrap();
    assert_eq!(incompatible.cached_tokens, 0, "an incompatible worker got cache credit");
    // Unconfirmed past the age limit: events no longer count, and the decision says so.
    let d3 = r.decide(&q, 0, &idle, 100 + 6_000, 0).unwrap();
    assert_eq!(d3.fallback, Some(FallbackReason::StaleEvents));
    assert_eq!(d3.blocks_from_events, 0);
}

#[test]
fn deltas_move_the_view_like_full_snapshots_and_offloaded_blocks_cost_a_transfer() {
    use crate::wire::delta::Delta;
    use crate::wire::snapshot::{Snapshot, SnapshotWorker};
    let idle = |_: &str| WorkerLoad::default();
    let q = req(None, &LONG.repeat(20));
    let r = router();
    let hashes = r.decide(&q, 0, &idle, 0, 0).unwrap().block_hashes;
    let mut sorted = hashes.clone();
    sorted.sort_unstable();
    let view = |w: &str, gpu: Vec<u64>, offloaded: Vec<u64>| SnapshotWorker {
        worker: w.into(),
        observed_at_ms: 100,
        compatible: true,
        gpu,
        offloaded,
        load: None,
        ..Default::default()
    };
    let s1 = Snapshot {
        version: 1,
        generated_at_ms: 100,
        workers: vec![view("127.0.0.1:1", vec![], vec![]), view("127.0.0.1:2", vec![], vec![])],
        ..Default::default()
    };
    // Worker 2 holds the whole prefix, but only in CPU memory.
    let s2 = Snapshot {
        version: 2,
        generated_at_ms: 100,
        workers: vec![
            view("127.0.0.1:1", vec![], vec![]),
            view("127.0.0.1:2", vec![], sorted.clone()),
        ],
        ..Default::default()
    };
    // Then it is loaded back to the GPU, and worker 1 computes the first half.
    let half = {
        let mut h = hashes[..hashes.len() / 2].to_vec();
        h.sort_unstable();
        h
    };
    let s3 = Snapshot {
        version: 3,
        generated_at_ms: 100,
        workers: vec![view("127.0.0.1:1", half, vec![]), view("127.0.0.1:2", sorted, vec![])],
        ..Default::default()
    };
    let mut full = router();
    let mut delta = router();
    full.events_checked(100);
    delta.events_checked(100);
    full.apply_snapshot(&s1);
    delta.apply_snapshot(&s1);
    let decide = |r: &Router| r.decide(&q, 0, &idle, 150, 0).unwrap();
    for s in [&s2, &s3] {
        let prev = if s.version == 2 { &s1 } else { &s2 };
        full.apply_snapshot(s);
        delta.apply_delta(&Delta::between(prev, s));
        assert_eq!(decide(&full).ranked, decide(&delta).ranked, "version {}", s.version);
    }
    let mut r = router();
    r.events_checked(100);
    r.apply_snapshot(&s2);
    let d = decide(&r);
    let w2 = d.primary().unwrap();
    assert_eq!(w2.worker, "127.0.0.1:2", "loading from CPU beats recomputing");
    assert!(w2.cached_tokens > 0 && w2.transfer_ms > 0.0);
    r.apply_delta(&Delta::between(&s2, &s3));
    let d = decide(&r);
    assert_eq!(d.primary().unwrap().worker, "127.0.0.1:2");
    assert_eq!(d.primary().unwrap().transfer_ms, 0.0, "back on the GPU: no transfer");
}

#[test]
fn reported_load_counts_what_other_replicas_sent() {
    use crate::wire::snapshot::SnapshotLoad;
    let own = WorkerLoad {
        inflight_requests: 3,
        prefilling_requests: 1,
        prefill_tokens: 500,
        prefill_elapsed_ms: 0,
        prefill_sq_tokens: 0,
        arriving_tokens_per_s: 0,
        behind_tokens: 0,
        passing_tokens_per_s: 0,
    };
    assert_eq!(combine_load(own, None, 1000), own);
    let busy = SnapshotLoad { running: 10, waiting: 4, observed_at_ms: 0 };
    let c = combine_load(own, Some(&busy), 0);
    assert_eq!((c.prefilling_requests, c.decoding_requests(), c.prefill_tokens), (4, 10, 500));
    // The three waiting requests kvroute did not send are costed as typical ones.
    let c = combine_load(own, Some(&busy), 1000);
    assert_eq!(c.prefill_tokens, 3_500);
    let quiet = SnapshotLoad { running: 0, waiting: 0, observed_at_ms: 0 };
    assert_eq!(combine_load(own, Some(&quiet), 1000), own, "a lagging report never hides own load");
}

#[test]
fn a_clock_times_rendering_and_tokenization_only_when_given() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NOW: AtomicU64 = AtomicU64::new(0);
    // Each reading moves the fake clock by 7 µs: one render + tokenize span is one step.
    fn tick() -> u64 {
        NOW.fetch_add(7_000, Ordering::Relaxed)
    }
    let mut r = router();
    let q = req(None, &LONG.repeat(4));
    let idle = |_: &str| WorkerLoad::default();
    assert_eq!(r.decide(&q, 0, &idle, 0, 0).unwrap().tokenize_us, 0);
    r.set_clock(tick);
    assert_eq!(r.decide(&q, 0, &idle, 0, 0).unwrap().tokenize_us, 7);
}

#[test]
fn down_workers_are_never_primary_or_fallback_unless_all_are_down() {
    let mut r = router();
    let idle = |_: &str| WorkerLoad::default();
    let q = req(None, &LONG.repeat(20));
    let d = r.decide(&q, 0, &idle, 0, 0).unwrap();
    // The down worker holds the whole prompt and is idle: it would win on every count.
    r.observe("127.0.0.1:2", &d.block_hashes, Source::Routed, 0);
    r.set_down(["127.0.0.1:2"]);
    for pick in 0..20 {
        let d = r.decide(&q, 0, &idle, 10, pick).unwrap();
        let named: Vec<&str> = d.ranked.iter().map(|s| s.worker.as_str()).collect();
        assert!(!named.contains(&"127.0.0.1:2"), "{named:?}");
        assert_eq!(d.header_value().split(',').count(), 2);
    }
    r.set_down(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);
    let d = r.decide(&q, 0, &idle, 10, 0).unwrap();
    assert_eq!(d.primary().unwrap().worker, "127.0.0.1:2", "all down: every worker is a choice");
    r.set_down([]);
    let d = r.decide(&q, 0, &idle, 10, 0).unwrap();
    assert_eq!(d.primary().unwrap().worker, "127.0.0.1:2", "back up: its cache wins again");
}

#[test]
fn workers_the_updater_reports_down_are_left_out_until_it_lists_them_up() {
    use crate::wire::snapshot::Snapshot;
    let mut r = router();
    let idle = |_: &str| WorkerLoad::default();
    let q = req(None, &LONG.repeat(20));
    let s1 = Snapshot {
        version: 1,
        down: vec!["127.0.0.1:1".into(), "127.0.0.1:3".into()],
        ..Default::default()
    };
    r.apply_snapshot(&s1);
    for pick in 0..10 {
        let d = r.decide(&q, 0, &idle, 0, pick).unwrap();
        assert_eq!(d.header_value(), "127.0.0.1:2", "only the worker up is named");
    }
    let s2 = Snapshot { version: 2, down: vec!["127.0.0.1:1".into()], ..s1.clone() };
    r.apply_delta(&crate::wire::delta::Delta::between(&s1, &s2));
    let named: Vec<String> = (0..10)
        .flat_map(|pick| r.decide(&q, 0, &idle, 0, pick).unwrap().ranked)
        .map(|s| s.worker.to_string())
        .collect();
    assert!(named.iter().any(|w| w == "127.0.0.1:3"), "3 is back");
    assert!(!named.iter().any(|w| w == "127.0.0.1:1"), "1 is still down");
}

/// Requests to `worker` this Envoy sent at these times (all threads).
struct SentAt(&'static str, Vec<u64>);

impl LoadSource for SentAt {
    fn load(&self, _: &WorkerName) -> WorkerLoad {
        WorkerLoad::default()
    }

    fn started_within(&self, w: &WorkerName, from_ms: u64, to_ms: u64) -> usize {
        let mine = self.1.iter().filter(|t| (from_ms..=to_ms).contains(*t));
        if w.as_str() == self.0 {
            mine.count()
        } else {
            0
        }
    }
}

#[test]
fn a_first_byte_another_request_may_have_raced_is_told_apart() {
    use crate::wire::peers::{PeerCredit, PeerSection};
    use crate::wire::snapshot::Snapshot;
    let (w1, w2) = (WorkerName::from("127.0.0.1:1"), WorkerName::from("127.0.0.1:2"));
    let mut r = router();
    r.knowledge_mut().set_replica(7);
    let credit = |replica, at_ms| PeerCredit {
        replica,
        worker: "127.0.0.1:1".into(),
        at_ms,
        hashes: vec![1, 2],
    };
    // Replica 8 routed to worker 1, stamped at 1 000 ms; this replica's own credit comes back
    // too (ignored).
    let s = PeerSection {
        ttl_ms: 10_000,
        load_ttl_ms: 3_000,
        loads: vec![],
        credits: vec![credit(8, 1_000), credit(7, 2_000)],
    };
    r.apply_snapshot(&Snapshot { peers: Some(s.clone()), ..Default::default() });
    let k = r.knowledge();
    let alone = SentAt("127.0.0.1:1", vec![1_005]);
    assert!(k.instant_shared(&w1, 1_005, &alone), "replica 8's credit 5 ms before");
    assert!(k.instant_shared(&w1, 992, &alone), "and 8 ms after");
    assert!(!k.instant_shared(&w1, 1_020, &alone), "20 ms apart");
    assert!(!k.instant_shared(&w1, 2_000, &alone), "its own credit is not another's");
    assert!(!k.instant_shared(&w2, 1_000, &alone), "another worker");
    // Another thread's request in the same millisecond, or the one before.
    let two = SentAt("127.0.0.1:1", vec![3_000, 3_000]);
    assert!(k.instant_shared(&w1, 3_000, &two));
    assert!(k.instant_shared(&w1, 3_001, &SentAt("127.0.0.1:1", vec![3_000, 3_001])));
    assert!(!k.instant_shared(&w1, 3_005, &SentAt("127.0.0.1:1", vec![3_000, 3_005])));
    // A full snapshot without the credit forgets its stamp.
    let empty = PeerSection { credits: vec![], ..s };
    r.apply_snapshot(&Snapshot { peers: Some(empty), ..Default::default() });
    assert!(!r.knowledge().instant_shared(&w1, 1_005, &alone));
}

/// Behind several Envoy replicas each sees only its share of a worker's arrivals: the rates
/// the others report through the updater count in a busy worker's step-fill forecast, unless
/// this filter turned the forecast off (`load.arrival_window_ms: 0`).
#[test]
fn other_replicas_arrivals_count_in_a_busy_workers_step_fill() {
    use crate::wire::peers::{PeerLoad, PeerSection};
    use crate::wire::snapshot::Snapshot;
    let forecast = |window: u64, rate: u32| {
        let cfg = json!({"models":[{"name":"m","workers":["127.0.0.1:1"]}],
                         "load": {"arrival_window_ms": window}});
        let cfg = FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap();
        let mut r = Router::new(&cfg).unwrap();
        r.knowledge_mut().set_replica(7);
        // Replica 8 has three prompts queued there, and sends it `rate` tokens a second.
        let busy = PeerLoad {
            replica: 8,
            worker_key: crate::decision::load::worker_key("127.0.0.1:1"),
            at_ms: 1_000,
            inflight: 3,
            prefilling: 3,
            prefill_tokens: 6_000,
            arriving_tokens_per_s: rate,
        };
        let peers =
            PeerSection { ttl_ms: 10_000, load_ttl_ms: 3_000, loads: vec![busy], credits: vec![] };
        r.apply_snapshot(&Snapshot { peers: Some(peers), ..Default::default() });
        let idle = |_: &str| WorkerLoad::default();
        let d = r.decide(&req(None, &LONG.repeat(20)), 0, &idle, 1_100, 0).unwrap();
        let s = &d.ranked[0];
        assert!(s.wait_ms > 0.0, "the peer's queue is counted: {s:?}");
        s.fill_forecast_ms
    };
    assert_eq!(forecast(2_000, 0), 0.0, "no arrivals, nothing foreseen");
    assert!(forecast(2_000, 4_000) > 0.0, "the peer's arrivals fill the request's step");
    assert_eq!(forecast(0, 4_000), 0.0, "off here, whatever the peers send");
}
