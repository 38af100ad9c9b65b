//! A request sent with an engine priority, on engines that schedule by it: its estimate counts
//! the queued work that runs before it, not the less urgent work queued behind a step.

use serde_json::json;

use crate::decision::config::sync::LoadLimits;
use crate::decision::config::FilterConfig;
use crate::decision::request::{parse, Endpoint, ParsedRequest};
use crate::decision::router::{Decision, Router};
use crate::flow::claim::claim;
use crate::shared::fake::{MemStore, Tally};
use crate::shared::load::{AtPriority, LoadView, Shard};

const A: &str = "127.0.0.1:1";
const B: &str = "127.0.0.1:2";
const INTERACTIVE: i32 = 0;
const BATCH: i32 = 10;

fn router() -> Router {
    let cfg =
        json!({"models":[{"name":"m","workers":[A, B]}], "tie_band":{"abs_ms":0.0,"rel":0.0}});
    Router::new(&FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap()).unwrap()
}

fn req() -> ParsedRequest {
    let body =
        json!({"model":"m","messages":[{"role":"user","content":"a new prompt ".repeat(50)}]});
    parse(Endpoint::Chat, body.to_string().as_bytes()).unwrap()
}

/// `s.wait_ms` without its [`crate::decision::cost::passed_factor`], on a busy worker running
/// `decoding` requests past prefill (the default profile's batch fill and interference).
fn unpassed(s: &crate::decision::cost::Score, decoding: u32) -> f64 {
    let p = crate::decision::cost::Profile::default();
    let rest = p.queue_terms().batch_fill_ms + f64::from(decoding) * p.decode_interference_ms;
    rest + (s.wait_ms - rest) / s.wait_factor
}

fn wait_on(d: &Decision, worker: &str) -> f64 {
    d.ranked.iter().find(|s| s.worker.as_str() == worker).unwrap().wait_ms
}

/// `A` has 12 batch prompts of 2 000 tokens queued, `B` 6 interactive ones: of `A`'s, the
/// first five may be in the engine's step already (less than the default 8 192-token budget
/// sent before each), the other seven wait for anything more urgent.
fn pool(store: &MemStore, t: &Tally) -> Shard {
    let mut s = Shard::register(store, t, LoadLimits::default(), 0, 1);
    for i in 0..12 {
        s.start_at(t, A, (2_000, BATCH), i);
    }
    for i in 0..6 {
        s.start_at(t, B, (2_000, INTERACTIVE), i);
    }
    s.flush(store, t, 20);
    s
}

#[test]
fn an_urgent_request_waits_only_for_what_runs_before_it() {
    let (store, t) = (MemStore::new(), Tally::default());
    let shard = pool(&store, &t);
    let view = LoadView::read(&store, &t, &shard, 20);
    let r = router();
    let q = req();
    let urgent =
        r.decide(&q, 0, &AtPriority { view: &view, priority: INTERACTIVE }, 20, 0).unwrap();
    let late = r.decide(&q, 0, &AtPriority { view: &view, priority: BATCH }, 20, 0).unwrap();
    let blind = r.decide(&q, 0, &view, 20, 0).unwrap();
    // Counted in full, A's 24 000 queued tokens are more than B's 12 000: both the batch
    // request and a view without priorities go to B.
    assert_eq!(late.primary().unwrap().worker.as_str(), B);
    assert_eq!(blind.primary().unwrap().worker.as_str(), B);
    // The interactive request waits on A for five prompts only (10 000 tokens): A.
    assert_eq!(urgent.primary().unwrap().worker.as_str(), A);
    let (a, b) = (wait_on(&urgent, A), wait_on(&urgent, B));
    assert!(a < b && a < wait_on(&late, A), "A {a} ms, B {b} ms, batch on A {}", wait_on(&late, A));
    // Nothing on B is behind anybody; the batch request there also waits for the
    // interactive prompts foreseen to arrive meanwhile (the pool's, per worker: B's six over two).
    let late_b = late.ranked.iter().find(|s| s.worker.as_str() == B).unwrap();
    assert_eq!(late_b.load.passing_tokens_per_s, 3_000);
    assert!((b - unpassed(late_b, 0)).abs() < 1e-9, "{b} {}", late_b.wait_ms);
    assert_eq!(urgent.ranked[0].load.prefilling_requests, 5);
    assert_eq!(
        late.ranked.iter().find(|s| s.worker.as_str() == A).unwrap().load.prefilling_requests,
        12
    );
}

#[test]
fn the_claim_keeps_the_priority_the_request_is_sent_with() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut shard = pool(&store, &t);
    let view = LoadView::read(&store, &t, &shard, 20);
    let r = router();
    let q = req();
    let mut d = r.decide(&q, 0, &AtPriority { view: &view, priority: INTERACTIVE }, 20, 0).unwrap();
    claim(&store, &t, &mut shard, None, &mut d, -3, 20, |_, _| None);
    let last = shard.entries().last().copied().unwrap();
    assert_eq!((last.worker, last.priority), (crate::decision::load::worker_key(A), -3));
    // Another thread reads it back: the request at -3 goes before every queued one of A's
    // (the seven batch prompts behind a step's budget are behind it), and a request at -5
    // would go before it too.
    let other = Shard::register(&store, &t, LoadLimits::default(), 0, 2);
    let seen = LoadView::read(&store, &t, &other, 20);
    let a = crate::decision::load::worker_key(A);
    assert_eq!(seen.behind(a, 0, 8_192).prefilling_requests, 7);
    assert_eq!(seen.behind(a, -3, 8_192).prefilling_requests, 7);
    assert_eq!(seen.behind(a, -5, 8_192).prefilling_requests, 8);
}

/// `A` and `B` each have eight batch prompts of 2 000 tokens queued (sent 10 ms ago: about twice
/// a step's 8 192-token budget) and three
/// requests of 2 000 tokens decoding, sent half a second ago: batch ones on `A`, interactive
/// ones on `B`. Interactive prompts keep arriving (3 000 tokens per second on `B` over the
/// default 2-second window, 1 500 per worker of the pool), each started before a batch request
/// waiting where it lands.
fn passing_pool(store: &MemStore, t: &Tally, now: u64) -> Shard {
    let mut s = Shard::register(store, t, LoadLimits::default(), 0, 1);
    for (worker, class) in [(A, BATCH), (B, INTERACTIVE)] {
        for _ in 0..3 {
            let d = s.start_at(t, worker, (2_000, class), now - 500);
            s.first_byte(d);
        }
        for _ in 0..8 {
            s.start_at(t, worker, (2_000, BATCH), now - 10);
        }
    }
    s.flush(store, t, now);
    s
}

fn on(d: &Decision, w: &str) -> crate::decision::cost::Score {
    d.ranked.iter().find(|s| s.worker.as_str() == w).cloned().unwrap()
}

#[test]
fn a_less_urgent_request_waits_also_for_the_urgent_prompts_that_pass_it() {
    let now = 100_000;
    let (store, t) = (MemStore::new(), Tally::default());
    let shard = passing_pool(&store, &t, now);
    let view = LoadView::read(&store, &t, &shard, now);
    let (a, b) = (crate::decision::load::worker_key(A), crate::decision::load::worker_key(B));
    assert_eq!((view.passing(a, BATCH), view.passing(b, BATCH)), (0, 3_000));
    assert_eq!(view.passing(b, INTERACTIVE), 0);
    let r = router();
    let q = req();
    let late = r.decide(&q, 0, &AtPriority { view: &view, priority: BATCH }, now, 0).unwrap();
    let urgent =
        r.decide(&q, 0, &AtPriority { view: &view, priority: INTERACTIVE }, now, 0).unwrap();
    let blind = r.decide(&q, 0, &view, now, 0).unwrap();
    // The batch request: on each worker the part of its queued prefill beyond the next step's
    // budget is the work ahead over the share of the worker's prefill time that the pool's
    // interactive arrivals per worker take.
    let profile = crate::decision::cost::Profile::default();
    let share = 1_500.0 * profile.prefill_ms_per_token / 1000.0;
    assert!(share > 0.0 && share < crate::decision::cost::PASSED_SHARE_MAX);
    for w in [A, B] {
        let s = on(&late, w);
        assert_eq!(s.load.passing_tokens_per_s, 1_500);
        let queued = s.load.prefill_tokens as f64;
        let beyond = (queued - profile.step_token_budget as f64) / queued;
        assert!(beyond > 0.4, "{beyond}");
        let want = 1.0 + (1.0 / (1.0 - share) - 1.0) * beyond;
        assert!((s.wait_factor - want).abs() < 1e-12, "factor {} want {want}", s.wait_factor);
        // Without priorities nothing is behind it or passes it: the work ahead is the same.
        let plain = on(&blind, w);
        assert_eq!(plain.wait_factor, 1.0);
        assert!(s.wait_ms > plain.wait_ms);
        assert!((unpassed(&s, 3) - plain.wait_ms).abs() < 1e-9, "{} {}", s.wait_ms, plain.wait_ms);
        assert!((s.wait_ms - plain.wait_ms - s.passed_ms).abs() < 1e-9);
        // The ranking leaves the passing out.
        assert!((s.cost_ms - plain.cost_ms).abs() < 1e-9);
        // Nothing passes the interactive request.
        assert_eq!(on(&urgent, w).wait_factor, 1.0);
    }
}

#[test]
fn a_worker_with_nothing_queued_is_not_stretched_and_old_arrivals_pass_nothing() {
    let now = 100_000;
    let (store, t) = (MemStore::new(), Tally::default());
    let mut s = Shard::register(&store, &t, LoadLimits::default(), 0, 1);
    // On A, interactive prompts arrive but nothing is queued: a batch request starts at once.
    for _ in 0..3 {
        let d = s.start_at(&t, A, (2_000, INTERACTIVE), now - 500);
        s.first_byte(d);
    }
    // On B, six batch prompts are queued, and interactive prompts were sent before the window.
    for _ in 0..3 {
        let d = s.start_at(&t, B, (2_000, INTERACTIVE), now - 5_000);
        s.first_byte(d);
    }
    for _ in 0..6 {
        s.start_at(&t, B, (2_000, BATCH), now - 10);
    }
    s.flush(&store, &t, now);
    let view = LoadView::read(&store, &t, &s, now);
    let (a, b) = (crate::decision::load::worker_key(A), crate::decision::load::worker_key(B));
    assert_eq!((view.passing(a, BATCH), view.passing(b, BATCH)), (3_000, 0));
    let late = router().decide(&req(), 0, &AtPriority { view: &view, priority: BATCH }, now, 0);
    let late = late.unwrap();
    // A starts it at once; on B the pool's arrivals (1 500 tokens/s per worker) pass it.
    assert_eq!(on(&late, A).wait_factor, 1.0);
    assert!(on(&late, B).wait_factor > 1.0);
    // Sent long ago, they count for nobody.
    let later = LoadView::read(&store, &t, &s, now + 2_000);
    assert_eq!((later.passing(a, BATCH), later.passing(b, BATCH)), (0, 0));
    assert!(!later.passes(BATCH));
}

/// Behind two replicas each sees only its share of the urgent arrivals: the other's loads carry
/// its arrival rate without priorities, taken to hold the same share of urgent work.
#[test]
fn other_replicas_arrivals_count_at_this_replicas_share_of_urgent_work() {
    use crate::wire::peers::{PeerLoad, PeerSection};
    use crate::wire::snapshot::Snapshot;
    let now = 100_000;
    let (store, t) = (MemStore::new(), Tally::default());
    let shard = passing_pool(&store, &t, now);
    let view = LoadView::read(&store, &t, &shard, now);
    // This replica sent 11 000 tokens a second to each worker, 3 000 of them urgent (all on B).
    assert_eq!(view.load(A).arriving_tokens_per_s + view.load(B).arriving_tokens_per_s, 22_000);
    let passing = |peer_rate: u32| {
        let mut r = router();
        r.knowledge_mut().set_replica(7);
        let loads = [A, B]
            .map(|w| PeerLoad {
                replica: 8,
                worker_key: crate::decision::load::worker_key(w),
                at_ms: now - 100,
                arriving_tokens_per_s: peer_rate,
                ..PeerLoad::default()
            })
            .to_vec();
        let peers = PeerSection { ttl_ms: 10_000, load_ttl_ms: 3_000, loads, credits: vec![] };
        r.apply_snapshot(&Snapshot { peers: Some(peers), ..Default::default() });
        let d = r.decide(&req(), 0, &AtPriority { view: &view, priority: BATCH }, now, 0);
        on(&d.unwrap(), A).load.passing_tokens_per_s
    };
    assert_eq!(passing(0), 1_500, "the peer sends nothing: this replica's own");
    assert_eq!(passing(11_000), 3_000, "the peer sends as much: twice the urgent work");
    assert_eq!(passing(22_000), 4_500);
}
