use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::shared::fake::{MemStore, Tally};

const W: &str = "127.0.0.1:8001";
const LIMITS: LoadLimits = LoadLimits {
    lease_ms: 60_000,
    shard_timeout_ms: 3_000,
    reconcile_slack_ms: 500,
    max_inflight_per_thread: 100,
    order_decisions: true,
    arrival_window_ms: 0,
};

fn view(store: &MemStore, t: &Tally, own: &Shard, now: u64) -> WorkerLoad {
    LoadView::read(store, t, own, now).load(W)
}

#[test]
fn threads_see_each_others_requests_through_their_shards() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut a = Shard::register(&store, &t, LIMITS, 0, 1);
    let mut b = Shard::register(&store, &t, LIMITS, 0, 2);
    assert_ne!(a.id(), b.id());
    let r1 = a.start(&t, W, 100, 10);
    let r2 = a.start(&t, W, 50, 10);
    a.first_byte(r1);
    a.flush(&store, &t, 10);
    let seen = view(&store, &t, &b, 20);
    assert_eq!(
        seen,
        WorkerLoad {
            inflight_requests: 2,
            prefilling_requests: 1,
            prefill_tokens: 50,
            // The request still in prefill was sent 10 ms before the view.
            prefill_elapsed_ms: 10,
            // 50 uncached tokens, squared (the attention part of their prefill).
            prefill_sq_tokens: 2_500,
            arriving_tokens_per_s: 0,
            behind_tokens: 0,
            passing_tokens_per_s: 0,
        }
    );
    b.start(&t, W, 7, 20);
    b.flush(&store, &t, 20);
    assert_eq!(view(&store, &t, &b, 20).inflight_requests, 3, "own shard read from memory");
    a.end(r1);
    a.end(r2);
    a.end(r2);
    a.flush(&store, &t, 30);
    assert_eq!(view(&store, &t, &b, 30).inflight_requests, 1);
    assert_eq!(view(&store, &t, &a, 30).prefill_tokens, 7);
}

#[test]
fn dropped_ends_stop_counting_when_their_lease_runs_out() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut a = Shard::register(&store, &t, LIMITS, 0, 3);
    for _ in 0..5 {
        a.start(&t, W, 10, 1_000); // ends never arrive
    }
    a.tick(&store, &t, 1_000);
    assert_eq!(view(&store, &t, &a, 60_999).inflight_requests, 5);
    // Within the bound, whether or not the owner has ticked since.
    assert_eq!(view(&store, &t, &a, 61_000).inflight_requests, 0);
    a.tick(&store, &t, 61_000);
    assert_eq!(t.get(Counter::LeaseExpired), 5);
    assert!(a.entries().is_empty());
}

/// Two threads' shards: the first holds four requests and is last rewritten at 1 000 ms (its
/// VM then traps), the second lives on.
fn dying_and_live(store: &MemStore, t: &Tally) -> (Shard, Shard) {
    let mut dead = Shard::register(store, t, LIMITS, 0, 4);
    let live = Shard::register(store, t, LIMITS, 0, 5);
    for _ in 0..4 {
        dead.start(t, W, 10, 0);
    }
    dead.flush(store, t, 1_000);
    (dead, live)
}

#[test]
fn a_dead_threads_shard_stops_counting_and_is_unlisted() {
    let (store, t) = (MemStore::new(), Tally::default());
    let (mut dead, live) = dying_and_live(&store, &t);
    // The VM traps: no more heartbeats. Until the timeout its requests still count.
    assert_eq!(view(&store, &t, &live, 4_000).inflight_requests, 4);
    assert_eq!(view(&store, &t, &live, 4_001).inflight_requests, 0);
    assert_eq!(t.get(Counter::ShardDropped), 4);
    assert_eq!(decode_registry(&store.get(REGISTRY_KEY).0.unwrap()), Some(vec![live.id()]));
    // A second reader noticing the same death counts nothing more.
    view(&store, &t, &live, 5_000);
    assert_eq!(t.get(Counter::ShardDropped), 4);
    // A thread that was only slow comes back listed on its next tick.
    dead.tick(&store, &t, 5_000);
    assert_eq!(view(&store, &t, &live, 5_001).inflight_requests, 4);
}

#[test]
fn a_reader_without_a_shard_leaves_dead_shards_for_the_threads_to_count() {
    let (store, t) = (MemStore::new(), Tally::default());
    let (_dead, live) = dying_and_live(&store, &t);
    // The singleton reads first, as it does every few milliseconds: the dead shard no longer
    // counts for it, but stays listed and uncounted.
    let singleton = Tally::default();
    let v = LoadView::read_all(&store, &singleton, LIMITS, 4_001);
    assert_eq!(v.load(W).inflight_requests, 0);
    assert_eq!(singleton.get(Counter::ShardDropped), 0);
    assert_eq!(decode_registry(&store.get(REGISTRY_KEY).0.unwrap()).map(|r| r.len()), Some(2));
    // The live thread's read unlists it and counts its four entries.
    assert_eq!(view(&store, &t, &live, 4_002).inflight_requests, 0);
    assert_eq!(t.get(Counter::ShardDropped), 4);
    assert_eq!(decode_registry(&store.get(REGISTRY_KEY).0.unwrap()), Some(vec![live.id()]));
}

#[test]
fn reports_trim_over_counts_in_proportion_and_once_per_report() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut a = Shard::register(&store, &t, LIMITS, 0, 6);
    let mut b = Shard::register(&store, &t, LIMITS, 0, 7);
    for _ in 0..6 {
        a.start(&t, W, 10, 1_000);
    }
    for _ in 0..2 {
        b.start(&t, W, 10, 1_000);
    }
    let recent = a.start(&t, W, 10, 9_800); // after the report's cutoff: not expected in it
    a.flush(&store, &t, 10_000);
    b.flush(&store, &t, 10_000);
    let report = SnapshotLoad { running: 3, waiting: 1, observed_at_ms: 10_000 };
    let v = LoadView::read(&store, &t, &a, 10_000);
    let before = v.started_before(W, report.observed_at_ms - LIMITS.reconcile_slack_ms);
    assert_eq!(before, 8);
    // Excess 4 of 8: a holds 6/8 → 3, b holds 2/8 → 1.
    assert_eq!(a.reconcile(&t, W, &report, before), 3);
    assert_eq!(b.reconcile(&t, W, &report, before), 1);
    assert_eq!(a.reconcile(&t, W, &report, before), 0, "once per report");
    a.flush(&store, &t, 10_000);
    b.flush(&store, &t, 10_000);
    let after = LoadView::read(&store, &t, &a, 10_000);
    assert_eq!(after.load(W).inflight_requests, 5, "4 reported + the recent one");
    assert!(a.entries().iter().any(|e| e.id == recent.0));
    assert_eq!(t.get(Counter::Reconciled), 4);
    // A report with more than we track changes nothing (other replicas' requests).
    let busy = SnapshotLoad { running: 50, waiting: 9, observed_at_ms: 20_000 };
    assert_eq!(a.reconcile(&t, W, &busy, 4), 0);
}

/// Threads that register at the same instant can race to create the registry (shared data has
/// no compare-and-swap on an absent key, in Envoy as in `MemStore`), so a registration may be
/// lost; the thread's next heartbeat lists it again. Every shard is listed after one.
#[test]
fn many_threads_register_at_once_and_all_are_listed_by_their_first_heartbeat() {
    let store = Arc::new(MemStore::new());
    let registered = Arc::new(std::sync::Barrier::new(16));
    let handles: Vec<_> = (0..16u64)
        .map(|k| {
            let store = Arc::clone(&store);
            let registered = Arc::clone(&registered);
            std::thread::spawn(move || {
                let t = Tally::default();
                let mut s = Shard::register(&*store, &t, LIMITS, 0, 1000 + k * 7919);
                registered.wait();
                for i in 0..50 {
                    let r = s.start(&t, W, 1, i);
                    if i % 2 == 0 {
                        s.end(r);
                    }
                    s.flush(&*store, &t, i);
                }
                s.tick(&*store, &t, 50);
                s.id()
            })
        })
        .collect();
    let mut ids: Vec<u32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 16, "ids are unique");
    let mut listed = decode_registry(&store.get(REGISTRY_KEY).0.unwrap()).unwrap();
    listed.sort_unstable();
    assert_eq!(listed, ids);
    let t = Tally::default();
    let me = Shard::register(&*store, &t, LIMITS, 0, 9);
    assert_eq!(view(&store, &t, &me, 100).inflight_requests, 16 * 25);
}

#[test]
fn corrupt_values_never_panic_and_are_counted() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut a = Shard::register(&store, &t, LIMITS, 0, 10);
    let b = Shard::register(&store, &t, LIMITS, 0, 11);
    a.start(&t, W, 1, 0);
    store.poke(&shard_key(b.id()), b"\x01short");
    assert_eq!(view(&store, &t, &a, 1).inflight_requests, 1);
    assert!(t.get(Counter::Corrupt) >= 1);
    store.poke(REGISTRY_KEY, b"\xff\xff\xff\xff");
    assert_eq!(view(&store, &t, &a, 1).inflight_requests, 1);
    // The next heartbeat rebuilds a registry that lists the thread again.
    a.tick(&store, &t, 2);
    assert_eq!(decode_registry(&store.get(REGISTRY_KEY).0.unwrap()), Some(vec![a.id()]));
}

#[test]
fn a_thread_past_its_cap_drops_its_oldest_entries() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut a = Shard::register(&store, &t, LIMITS, 0, 12);
    for i in 0..130 {
        a.start(&t, W, 1, i);
    }
    assert_eq!(a.entries().len(), 100);
    assert_eq!(a.entries()[0].started_ms, 30);
    assert_eq!(t.get(Counter::InflightCapped), 30);
}

#[test]
fn a_thread_knows_the_mean_context_of_its_own_requests_to_a_worker() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut a = Shard::register(&store, &t, LIMITS, 0, 13);
    let key = worker_key(W);
    assert_eq!(a.mean_context(key), None);
    let r1 = a.start(&t, W, 100, 1);
    let r2 = a.start(&t, W, 100, 1);
    let elsewhere = a.start(&t, "127.0.0.1:8002", 100, 1);
    a.start(&t, W, 100, 1); // never noted: not counted
    a.note_context(r1, 1000);
    a.note_context(r2, 3000);
    a.note_context(elsewhere, 9000);
    assert_eq!(a.mean_context(key), Some(2000.0));
    a.end(r2);
    assert_eq!(a.mean_context(key), Some(1000.0));
    // Not in the shard's encoding: another thread reads the entries alone.
    a.flush(&store, &t, 2);
    let bytes = store.get(&shard_key(a.id())).0.unwrap();
    assert_eq!(ShardData::decode(&bytes).unwrap().entries, a.entries());
    // A request that ended is not noted again, and expiry forgets the notes it leaves.
    a.note_context(r2, 5000);
    assert_eq!(a.mean_context(key), Some(1000.0));
    a.expire(&t, LIMITS.lease_ms + 1);
    assert_eq!((a.entries().len(), a.mean_context(key)), (0, None));
    assert!(a.contexts.is_empty());
}

proptest! {
    #[test]
    fn shard_codec_round_trips_and_never_panics(
        hb: u64,
        raw in proptest::collection::vec((any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<bool>(), prop_oneof![Just(0i32), any::<i32>()]), 0..20),
        junk in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let entries: Vec<InflightEntry> = raw.into_iter().map(|(id, worker, started_ms, prefill_tokens, prefilling, priority)| {
            InflightEntry { id, worker, started_ms, prefill_tokens, prefilling, priority }
        }).collect();
        let plain = entries.iter().all(|e| e.priority == 0);
        let d = ShardData { heartbeat_ms: hb, entries };
        prop_assert_eq!(ShardData::decode(&d.encode()), Some(d.clone()));
        // Without priorities the shard keeps the format a filter before them reads.
        prop_assert_eq!(d.encode()[0], if plain { 1 } else { 2 });
        let b = d.encode();
        for n in 0..b.len() {
            prop_assert_eq!(ShardData::decode(&b[..n]), None);
        }
        let _ = ShardData::decode(&junk);
        let _ = decode_registry(&junk);
    }
}

#[test]
fn the_view_counts_the_requests_sent_in_a_window() {
    use crate::decision::load::LoadSource;
    use crate::decision::worker::WorkerName;
    let (store, t) = (MemStore::new(), Tally::default());
    let mut a = Shard::register(&store, &t, LIMITS, 0, 1);
    let mut b = Shard::register(&store, &t, LIMITS, 0, 2);
    a.start(&t, W, 100, 1_000);
    a.start(&t, "127.0.0.1:9", 100, 1_000);
    a.flush(&store, &t, 1_000);
    b.start(&t, W, 100, 1_000);
    b.start(&t, W, 100, 1_003);
    let v = LoadView::read(&store, &t, &b, 1_010);
    let w = WorkerName::from(W);
    assert_eq!(v.started_within(&w, 999, 1_000), 2, "one per thread in that millisecond");
    assert_eq!(v.started_within(&w, 1_001, 1_010), 1);
    assert_eq!(v.started_within(&WorkerName::from("127.0.0.1:7"), 0, 2_000), 0);
}

/// A worker's queue: `(sent at, uncached tokens, engine priority)`, still in prefill, written
/// by two threads; returns the view of a third.
fn queue(q: &[(u64, u64, i32)]) -> LoadView {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut a = Shard::register(&store, &t, LIMITS, 0, 1);
    let mut b = Shard::register(&store, &t, LIMITS, 0, 2);
    for (i, (at, tokens, priority)) in q.iter().enumerate() {
        let s = if i % 2 == 0 { &mut a } else { &mut b };
        s.start_at(&t, W, (*tokens, *priority), *at);
    }
    // One that has answered is never queued work.
    let done = a.start_at(&t, W, (5_000, 10), 0);
    a.first_byte(done);
    a.flush(&store, &t, 100);
    b.flush(&store, &t, 100);
    let c = Shard::register(&store, &t, LIMITS, 0, 3);
    LoadView::read(&store, &t, &c, 100)
}

/// What is behind: `requests` of `tokens` (`sq` their squares); the youngest request still
/// counted was sent `age` ms before the view.
fn queued(requests: u32, tokens: u64, sq: u64, age: u64) -> WorkerLoad {
    WorkerLoad {
        inflight_requests: requests,
        prefilling_requests: requests,
        prefill_tokens: tokens,
        prefill_sq_tokens: sq,
        prefill_elapsed_ms: age,
        arriving_tokens_per_s: 0,
        behind_tokens: 0,
        passing_tokens_per_s: 0,
    }
}

#[test]
fn an_urgent_request_does_not_wait_for_less_urgent_work_not_started() {
    // Sent in this order (the shards' order is not the sending order).
    let v = queue(&[(4, 3_000, 10), (1, 3_000, 10), (3, 1_000, 0), (2, 3_000, 10)]);
    let key = worker_key(W);
    assert!(v.defers_to(0) && v.defers_to(-1) && !v.defers_to(10));
    // Budget 4 096: the first two may be in the engine's step (0 and 3 000 tokens before
    // them); the urgent one at 3 counts as ahead whatever; the last is behind a budget.
    assert_eq!(v.behind(key, 0, 4_096), queued(1, 3_000, 9_000_000, 97));
    // Nothing is less urgent than the least urgent.
    assert_eq!(v.behind(key, 10, 4_096), WorkerLoad::default());
    // A more urgent request also jumps the priority-0 one, once past the budget.
    assert_eq!(v.behind(key, -1, 4_096), queued(2, 4_000, 10_000_000, 98));
    // An engine that runs one prefill at a time (budget 0): all but the oldest.
    assert_eq!(v.behind(key, 0, 0), queued(2, 6_000, 18_000_000, 97));
    // A budget that holds them all: every one may have started.
    assert_eq!(v.behind(key, 0, 100_000), WorkerLoad::default());
    // Another worker: nothing.
    assert_eq!(v.behind(worker_key("127.0.0.1:9"), 0, 0), WorkerLoad::default());
    // What is left is what the urgent one waits for; the worker has done at most the 97 ms
    // since the youngest of it was sent (not the 99 ms since the oldest).
    let left = v.load(W).less(v.behind(key, 0, 4_096));
    assert_eq!((left.inflight_requests, left.prefilling_requests), (4, 3));
    assert_eq!((left.prefill_tokens, left.prefill_elapsed_ms), (7_000, 97));
    // Nothing behind: nothing changes.
    assert_eq!(v.load(W).less(v.behind(key, 10, 4_096)), v.load(W));
}

#[test]
fn without_priorities_nothing_is_behind() {
    let v = queue(&[(1, 3_000, 0), (2, 3_000, 0), (3, 3_000, 0)]);
    assert!(!v.defers_to(0));
    assert_eq!(v.behind(worker_key(W), 0, 0), WorkerLoad::default());
}

#[test]
fn the_work_done_on_a_queue_counts_from_the_last_prefill_that_ended_there() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut a = Shard::register(&store, &t, LIMITS, 0, 1);
    let mut b = Shard::register(&store, &t, LIMITS, 0, 2);
    let reader = Shard::register(&store, &t, LIMITS, 0, 3);
    // Thread a sent one at 0; thread b one at 100 and one (less urgent) at 200.
    let first = a.start(&t, W, 2_000, 0);
    b.start(&t, W, 2_000, 100);
    b.start_at(&t, W, (2_000, 10), 200);
    for s in [&a, &b] {
        s.flush(&store, &t, 300);
    }
    // Nothing ended yet: the work done is what the oldest's age allows.
    assert_eq!(view(&store, &t, &reader, 1_000).prefill_elapsed_ms, 1_000);
    // A first byte that is no first token (a non-streamed answer, after its decode) tells
    // nothing of when its prefill ended.
    let unstreamed = b.start(&t, W, 100, 50);
    b.first_byte(unstreamed);
    b.flush(&store, &t, 800);
    assert_eq!(view(&store, &t, &reader, 1_000).prefill_elapsed_ms, 1_000);
    // The first answered at 900 on thread a: the worker was busy with it until then, so
    // the two left have had 100 ms of its work at 1 000, not the 900 since the next was sent.
    a.prefill_ended(first, 900);
    a.flush(&store, &t, 900);
    let v = LoadView::read(&store, &t, &reader, 1_000);
    assert_eq!(v.last_prefill_done(worker_key(W)), Some(900));
    let load = v.load(W);
    assert_eq!((load.prefilling_requests, load.prefill_elapsed_ms), (2, 100));
    // The same at a priority that passes the batch request over: from the youngest counted
    // (100) or the last end (900), whichever is later.
    assert_eq!(v.behind(worker_key(W), 0, 0).prefill_elapsed_ms, 100);
    // The writer's own view has it without a write; another worker knows nothing of it.
    let own = LoadView::read(&store, &t, &a, 1_000);
    assert_eq!(own.load(W).prefill_elapsed_ms, 100);
    assert_eq!(own.last_prefill_done(worker_key("127.0.0.1:9")), None);
    // A worker that ended a prefill before the oldest now queued was sent: the age counts.
    let later = a.start(&t, "127.0.0.1:9", 500, 950);
    a.prefill_ended(later, 960);
    a.start(&t, "127.0.0.1:9", 500, 980);
    assert_eq!(LoadView::read(&store, &t, &a, 1_000).load("127.0.0.1:9").prefill_elapsed_ms, 20);
    // Records outlive no lease.
    a.tick(&store, &t, LIMITS.lease_ms + 1_000);
    assert!(PrefillsDone::decode(&store.get(&done_key(a.id())).0.unwrap()).unwrap().is_empty());
}

#[test]
fn a_damaged_done_table_is_counted_and_a_dead_threads_is_emptied() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut a = Shard::register(&store, &t, LIMITS, 0, 1);
    let reader = Shard::register(&store, &t, LIMITS, 0, 2);
    let r = a.start(&t, W, 100, 0);
    a.start(&t, W, 100, 10);
    a.prefill_ended(r, 50);
    a.flush(&store, &t, 50);
    store.poke(&done_key(a.id()), b"\x01\x05");
    let load = view(&store, &t, &reader, 100);
    assert_eq!((load.prefilling_requests, load.prefill_elapsed_ms), (1, 90), "the age alone");
    assert_eq!(t.get(Counter::Corrupt), 1);
    // Thread a stops; once its shard is swept, its table is gone too.
    view(&store, &t, &reader, 50 + LIMITS.shard_timeout_ms + 1);
    assert_eq!(store.get(&done_key(a.id())).0.as_deref(), Some(&[][..]));
}

#[test]
fn a_request_is_passed_over_by_a_more_urgent_one_sent_after_it_that_answered_first() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut urgent = Shard::register(&store, &t, LIMITS, 0, 1);
    let mut batch = Shard::register(&store, &t, LIMITS, 0, 2);
    urgent.record_passes(Some(10));
    batch.record_passes(Some(10));
    let (w, other) = (worker_key(W), worker_key("127.0.0.1:9"));
    // A batch request (priority 10) sent at 100 on one thread; on another, urgent ones
    // (priority -5) sent at 50 (before it) and at 150 (after it).
    batch.start_at(&t, W, (2_000, 10), 100);
    let before = urgent.start_at(&t, W, (500, -5), 50);
    let after = urgent.start_at(&t, W, (500, -5), 150);
    urgent.prefill_ended(before, 400);
    urgent.flush(&store, &t, 400);
    assert!(!batch.passed_over(&store, &t, w, &[-5], 100), "sent before it: in its decision");
    // Still in prefill: it has passed nothing yet.
    assert!(!batch.passed_over(&store, &t, w, &[-5], 100));
    urgent.prefill_ended(after, 600);
    assert!(!batch.passed_over(&store, &t, w, &[-5], 100), "not written yet");
    urgent.flush(&store, &t, 600);
    assert!(batch.passed_over(&store, &t, w, &[-5], 100));
    // Its own thread reads its table from memory, before any write.
    assert!(urgent.passed_over(&store, &t, w, &[-5], 100));
    // Sent after the urgent one, at another worker, or asked for other priorities: no.
    assert!(!batch.passed_over(&store, &t, w, &[-5], 150));
    assert!(!batch.passed_over(&store, &t, other, &[-5], 100));
    assert!(!batch.passed_over(&store, &t, w, &[0, 3], 100));
    assert!(!batch.passed_over(&store, &t, w, &[], 100));
    // The least urgent priority passes nobody: its first tokens are not recorded.
    let last = batch.start_at(&t, W, (2_000, 10), 300);
    batch.prefill_ended(last, 650);
    batch.flush(&store, &t, 650);
    assert!(!urgent.passed_over(&store, &t, w, &[10], 100));
    // A thread not told to record writes nothing.
    let mut quiet = Shard::register(&store, &t, LIMITS, 0, 3);
    let r = quiet.start_at(&t, "127.0.0.1:9", (500, -5), 700);
    quiet.prefill_ended(r, 800);
    quiet.flush(&store, &t, 800);
    assert!(!batch.passed_over(&store, &t, other, &[-5], 100));
    assert_eq!(store.get(&passed_key(quiet.id())).0, None);
    // A damaged table is no pass, and never panics.
    store.poke(&passed_key(urgent.id()), b"\x01\x05");
    assert!(!batch.passed_over(&store, &t, w, &[-5], 100));
    assert_eq!(t.get(Counter::Corrupt), 1);
    // Records outlive no lease; a dead thread's table is emptied with its shard.
    urgent.flush(&store, &t, 900);
    urgent.tick(&store, &t, LIMITS.lease_ms + 1_000);
    assert!(!batch.passed_over(&store, &t, w, &[-5], 100));
    let reader = Shard::register(&store, &t, LIMITS, 0, 4);
    let late = LIMITS.lease_ms + 1_000 + LIMITS.shard_timeout_ms + 1;
    view(&store, &t, &reader, late);
    assert_eq!(store.get(&passed_key(urgent.id())).0.as_deref(), Some(&[][..]));
}

#[test]
fn priorities_key_apart_and_zero_is_the_worker() {
    let w = worker_key(W);
    assert_eq!(pass_key(w, 0), w);
    let keys: Vec<u64> = [-5, -1, 0, 1, 10, i32::MIN, i32::MAX].map(|p| pass_key(w, p)).to_vec();
    for (i, a) in keys.iter().enumerate() {
        assert!(keys[i + 1..].iter().all(|b| b != a), "{keys:?}");
    }
}

#[test]
fn a_workers_arrival_rate_counts_the_prompt_tokens_sent_within_the_window() {
    let (store, t) = (MemStore::new(), Tally::default());
    let limits = LoadLimits { arrival_window_ms: 2_000, ..LIMITS };
    let mut a = Shard::register(&store, &t, limits, 0, 1);
    let b = Shard::register(&store, &t, limits, 0, 2);
    let old = a.start(&t, W, 4_000, 1_000);
    let answered = a.start(&t, W, 1_000, 3_500);
    a.start(&t, W, 3_000, 4_000);
    a.first_byte(answered);
    a.flush(&store, &t, 4_000);
    // At 5 000 ms the window holds the last two (answered or not): 4 000 tokens in 2 s.
    let seen = view(&store, &t, &b, 5_000);
    assert_eq!((seen.arriving_tokens_per_s, seen.prefill_tokens), (2_000, 7_000));
    // Ended requests drop out; off with a window of 0.
    a.end(old);
    a.end(answered);
    a.flush(&store, &t, 5_000);
    assert_eq!(view(&store, &t, &b, 5_000).arriving_tokens_per_s, 1_500);
    let off = Shard::register(&store, &t, LIMITS, 0, 3);
    assert_eq!(view(&store, &t, &off, 5_000).arriving_tokens_per_s, 0);
    assert_eq!(view(&store, &t, &b, 6_000).arriving_tokens_per_s, 0);
}
