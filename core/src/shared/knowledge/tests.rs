use serde_json::json;

use super::*;
use crate::decision::config::FilterConfig;
use crate::shared::fake::{MemStore, Tally};
use crate::wire::snapshot::SnapshotWorker;

const W: &str = "127.0.0.1:1";

fn router() -> Router {
    let cfg = json!({"models":[{"name":"m","workers":[W, "127.0.0.1:2"]}]});
    Router::new(&FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap()).unwrap()
}

fn request() -> crate::decision::request::ParsedRequest {
    let body = json!({"model":"m","prompt": (0..1024).collect::<Vec<u32>>()});
    let e = crate::decision::request::Endpoint::Completions;
    crate::decision::request::parse(e, body.to_string().as_bytes()).unwrap()
}

/// The request's first `k` block hashes, sorted as the updater sends them.
fn blocks(k: usize) -> Vec<u64> {
    static CHAIN: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    let chain = CHAIN.get_or_init(|| {
        let seed = router().domain(&request()).map(|d| d.seed()).unwrap_or_default();
        let tokens: Vec<u32> = (0..1024).collect();
        crate::decision::hash::block_hashes(seed, 16, &tokens)
    });
    let mut h = chain.clone();
    h.truncate(k);
    h.sort_unstable();
    h
}

fn snap(version: u64) -> Snapshot {
    let gpu = blocks((version as usize * 3) % 64);
    let worker = SnapshotWorker {
        worker: W.into(),
        observed_at_ms: version,
        compatible: true,
        gpu,
        offloaded: Vec::new(),
        load: None,
        ..Default::default()
    };
    Snapshot { version, generated_at_ms: version, workers: vec![worker], ..Default::default() }
}

fn publish_chain(store: &MemStore, p: &mut KnowledgePublisher, from: u64, to: u64) {
    for v in from..to {
        let d = Delta::between(&snap(v), &snap(v + 1));
        assert_eq!(p.take(store, d.encode()).unwrap(), Taken::Delta);
        p.confirmed(store, v + 1);
    }
}

/// The full snapshot in shared data and the sequence number it stands at.
fn full_in(store: &MemStore) -> (u64, Snapshot) {
    read_full(store, &DecodeLimits::default()).unwrap().unwrap()
}

/// A publisher that took `first` as its full snapshot, and a thread that follows it from there.
fn following(
    store: &MemStore,
    t: &Tally,
    first: Snapshot,
) -> (KnowledgePublisher, Follower, Router) {
    let mut p = KnowledgePublisher::new(DecodeLimits::default());
    let version = first.version;
    p.take(store, first.encode()).unwrap();
    p.confirmed(store, version);
    let (mut f, mut r) = (Follower::default(), router());
    f.catch_up(store, t, &mut r, true);
    (p, f, r)
}

#[test]
fn a_thread_that_keeps_up_applies_only_deltas() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut p = KnowledgePublisher::new(DecodeLimits::default());
    assert_eq!(p.take(&store, snap(1).encode()).unwrap(), Taken::Full);
    p.confirmed(&store, 1);
    let (mut f, mut r) = (Follower::default(), router());
    assert_eq!(f.catch_up(&store, &t, &mut r, true), Followed { deltas: 0, full: 1, deferred: 0 });
    for v in 1..=40 {
        publish_chain(&store, &mut p, v, v + 1);
        assert_eq!(
            f.catch_up(&store, &t, &mut r, false),
            Followed { deltas: 1, full: 0, deferred: 0 }
        );
        assert_eq!(f.version(), v + 1);
        assert_eq!(p.head().seq, v);
        // The full snapshot follows, within its rewrite rule, at the sequence number it says.
        let (seq, full) = full_in(&store);
        assert!(p.head().seq - seq <= FULL_EVERY as u64);
        assert_eq!((full.version, p.head().full_version), (seq + 1, seq + 1));
    }
}

/// A snapshot of version `v` whose second worker holds `blocks` other blocks: a full snapshot
/// much larger than the deltas, as a pool's is.
fn big(v: u64, blocks: u64) -> Snapshot {
    let mut s = snap(v);
    s.workers.push(SnapshotWorker {
        worker: "127.0.0.1:2".into(),
        compatible: true,
        gpu: (1..=blocks).map(|h| h * 0x9E37_79B9).collect(),
        ..Default::default()
    });
    s
}

fn publish_big(store: &MemStore, p: &mut KnowledgePublisher, from: u64, to: u64) {
    for v in from..to {
        let d = Delta::between(&big(v, 4096), &big(v + 1, 4096));
        assert_eq!(p.take(store, d.encode()).unwrap(), Taken::Delta);
        p.confirmed(store, v + 1);
    }
}

#[test]
fn a_thread_idle_for_hundreds_of_deltas_catches_up_on_deltas_alone() {
    let (store, t) = (MemStore::new(), Tally::default());
    let (mut p, mut f, mut r) = following(&store, &t, big(1, 4096));
    let behind = FULL_EVERY as u64 + 100;
    publish_big(&store, &mut p, 1, 1 + behind);
    assert!(p.head().full_version > 1, "the full snapshot was rewritten meanwhile");
    // The request path applies a bounded share; the tick the rest, without the full snapshot.
    let first = f.catch_up(&store, &t, &mut r, false);
    assert_eq!(first, Followed { deltas: REQUEST_DELTAS as u64, full: 0, deferred: 0 });
    let rest = f.catch_up(&store, &t, &mut r, true);
    assert_eq!(rest, Followed { deltas: behind - REQUEST_DELTAS as u64, full: 0, deferred: 0 });
    assert_eq!(f.version(), p.head().version);
}

#[test]
fn the_ring_keeps_the_deltas_since_the_full_snapshot_before_the_last() {
    let store = MemStore::new();
    let mut p = KnowledgePublisher::new(DecodeLimits::default());
    p.take(&store, big(1, 4096).encode()).unwrap();
    let n = 3 * FULL_EVERY as u64 + 5;
    publish_big(&store, &mut p, 1, 1 + n);
    let kept: Vec<u64> = (0..RING as u64)
        .filter(|&slot| store.get(&delta_key(slot as usize)).0.is_some_and(|v| !v.is_empty()))
        .collect();
    // Fulls at FULL_EVERY, 2 FULL_EVERY, 3 FULL_EVERY: the deltas after the second are kept.
    assert_eq!(kept.len(), FULL_EVERY + 5, "{} slots", kept.len());
    assert_eq!(full_in(&store).0, 3 * FULL_EVERY as u64);
    // Small snapshots: the full snapshot is rewritten once the deltas add up to its size, and
    // the ring never holds much more than two of them and the last KEEP_DELTAS deltas.
    let store = MemStore::new();
    let mut p = KnowledgePublisher::new(DecodeLimits::default());
    p.take(&store, snap(1).encode()).unwrap();
    let (mut full, mut delta) = (p.full_bytes, 0);
    for v in 1..200 {
        publish_chain(&store, &mut p, v, v + 1);
        let ring: usize =
            (0..RING).filter_map(|s| store.get(&delta_key(s)).0).map(|v| v.len()).sum();
        full = full.max(p.full_bytes);
        delta = delta.max(Delta::between(&snap(v), &snap(v + 1)).encode().len());
        // The deltas before the last full snapshot (less than the one before it, and one more)
        // and those since (less than it), and at most the last KEEP_DELTAS besides.
        let most = 2 * full + delta + KEEP_DELTAS as usize * delta;
        assert!(ring <= most, "version {v}: {ring} bytes of deltas, full {full}");
    }
}

#[test]
fn an_idle_thread_past_the_ring_catches_up_from_the_full_snapshot_off_the_request_path() {
    let (store, t) = (MemStore::new(), Tally::default());
    let (mut p, mut f, mut r) = following(&store, &t, snap(1));
    publish_chain(&store, &mut p, 1, 1 + 3 * RING as u64);
    // The request path only follows deltas: the chain from v1 is gone, so it waits.
    assert_eq!(f.catch_up(&store, &t, &mut r, false), Followed::default());
    assert_eq!(f.version(), 1);
    // The tick reads the full snapshot, then the deltas after it.
    let done = f.catch_up(&store, &t, &mut r, true);
    assert_eq!(done.full, 1);
    assert_eq!(f.version(), p.head().version);
    let now = p.head().checked_at_ms;
    let mut fresh = router();
    fresh.apply_snapshot(&snap(p.head().version));
    fresh.events_checked(now);
    let probe = |r: &Router| {
        let d = r.decide(&request(), 100, &|_: &str| Default::default(), now, 0).unwrap();
        let mut c: Vec<_> = d.ranked.iter().map(|s| (s.worker.clone(), s.cached_tokens)).collect();
        c.sort();
        c
    };
    assert_eq!(probe(&r), probe(&fresh));
    assert!(probe(&r).iter().any(|(w, c)| w == W && *c > 0), "{:?}", probe(&r));
}

#[test]
fn corrupt_values_stop_the_chain_without_panicking() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut p = KnowledgePublisher::new(DecodeLimits::default());
    p.take(&store, big(1, 4096).encode()).unwrap();
    p.confirmed(&store, 1);
    p.confirmed(&store, 1);
    let (mut f, mut r) = (Follower::default(), router());
    f.catch_up(&store, &t, &mut r, true);
    publish_big(&store, &mut p, 1, 3);
    assert_eq!(p.head().full_version, 1);
    store.poke(&delta_key(slot_of(1)), b"KVRD\x01garbage");
    assert_eq!(f.catch_up(&store, &t, &mut r, false).deltas, 0);
    // The thread stands on the full snapshot already: it does not re-read it, even on a tick.
    store.poke(DATA_KEY, b"not a snapshot");
    assert_eq!(f.catch_up(&store, &t, &mut r, true), Followed::default());
    assert_eq!(t.get(Counter::Corrupt), 0);
    // A new thread must read it: it is refused and counted.
    let mut newcomer = Follower::default();
    assert_eq!(newcomer.catch_up(&store, &t, &mut r, true).full, 0);
    assert_eq!(t.get(Counter::Corrupt), 1);
    store.poke(HEAD_KEY, &[1, 2, 3]);
    assert_eq!(f.catch_up(&store, &t, &mut r, true), Followed::default());
    // The publisher refuses garbage and asks for a full snapshot next.
    assert!(p.take(&store, b"KVRD\x01junk".to_vec()).is_err());
    assert_eq!(p.version(), 0);
    assert!(matches!(
        p.take(&store, Delta::between(&snap(3), &snap(4)).encode()),
        Err(PublishError::NoBase)
    ));
}

#[test]
fn decode_limits_bound_what_is_accepted() {
    let store = MemStore::new();
    let tight = DecodeLimits { max_workers: 4, max_hashes_per_worker: 5, ..Default::default() };
    let mut p = KnowledgePublisher::new(tight);
    assert!(p.take(&store, snap(1).encode()).is_ok(), "3 hashes");
    assert!(p.take(&store, snap(2).encode()).is_err(), "6 hashes");
    let mut many = snap(1);
    many.workers = (0..5)
        .map(|i| SnapshotWorker { worker: format!("w{i}"), ..snap(1).workers[0].clone() })
        .collect();
    assert!(p.take(&store, many.encode()).is_err(), "5 workers");
}

#[test]
fn head_round_trips_and_rejects_truncation() {
    crate::conformance::shared_data::head_round_trips_and_rejects_truncation();
}

/// Small snapshots are rewritten every few deltas; a thread up to [`KEEP_DELTAS`] behind still
/// catches up from deltas, on a request (16 at a time) and on its tick.
#[test]
fn with_small_snapshots_a_thread_behind_by_the_kept_deltas_catches_up_on_requests() {
    for behind in [2u64, 8, 16, 32, KEEP_DELTAS] {
        let (store, t) = (MemStore::new(), Tally::default());
        let mut p = KnowledgePublisher::new(DecodeLimits::default());
        p.take(&store, snap(1).encode()).unwrap();
        p.confirmed(&store, 1);
        publish_chain(&store, &mut p, 1, 41);
        let (mut f, mut r) = (Follower::default(), router());
        f.catch_up(&store, &t, &mut r, true);
        let v = f.version();
        publish_chain(&store, &mut p, v, v + behind);
        assert!(p.head().full_version > v, "the full snapshot was rewritten meanwhile");
        let mut applied = 0;
        for _ in 0..behind.div_ceil(REQUEST_DELTAS as u64) {
            let got = f.catch_up(&store, &t, &mut r, false);
            assert_eq!(got.full, 0);
            applied += got.deltas;
        }
        assert_eq!((applied, f.version()), (behind, v + behind), "{behind} behind");
    }
}

#[test]
fn a_request_out_of_time_leaves_the_next_deltas_for_later() {
    let (store, t) = (MemStore::new(), Tally::default());
    let (mut p, mut f, mut r) = following(&store, &t, snap(1));
    publish_chain(&store, &mut p, 1, 11);
    // The budget allows two more after the first delta (at least one is always applied).
    let mut asked = 0;
    let mut go_on = || {
        asked += 1;
        asked <= 2
    };
    let first = f.catch_up_within(&store, &t, &mut r, false, &mut go_on);
    assert_eq!(first, Followed { deltas: 3, full: 0, deferred: 0 });
    assert_eq!(f.version(), 4);
    // Out of time from the start: still one delta, in order.
    let one = f.catch_up_within(&store, &t, &mut r, false, &mut || false);
    assert_eq!((one, f.version()), (Followed { deltas: 1, full: 0, deferred: 0 }, 5));
    // The next catch-up with time goes on from there, without the full snapshot.
    let rest = f.catch_up(&store, &t, &mut r, false);
    assert_eq!(rest, Followed { deltas: 6, full: 0, deferred: 0 });
    assert_eq!(f.version(), p.head().version);
}

#[test]
fn a_thread_far_behind_applies_its_deltas_out_of_time() {
    let (store, t) = (MemStore::new(), Tally::default());
    let (mut p, mut f, mut r) = following(&store, &t, big(1, 4096));
    publish_big(&store, &mut p, 1, 1 + FAR_BEHIND + 5);
    // Out of time from the start, but more than FAR_BEHIND behind: it applies until it is not.
    let done = f.catch_up_within(&store, &t, &mut r, false, &mut || false);
    assert_eq!(done, Followed { deltas: 5, full: 0, deferred: 0 });
    assert_eq!(p.head().seq - f.seq, FAR_BEHIND);
}

#[test]
fn a_request_leaves_waiting_deltas_to_a_catch_up_already_due() {
    let (store, t) = (MemStore::new(), Tally::default());
    let (mut p, mut f, mut r) = following(&store, &t, snap(1));
    // Nothing waits: `due` is not asked.
    let none = f.catch_up_or_defer(&store, &t, &mut r, &mut || true, &mut |_| panic!("asked"));
    assert_eq!(none, Followed::default());
    publish_chain(&store, &mut p, 1, 4);
    let mut asked = 0;
    let left = f.catch_up_or_defer(&store, &t, &mut r, &mut || true, &mut |h| {
        asked += 1;
        h.version == 4
    });
    assert_eq!((left, asked), (Followed { deltas: 0, full: 0, deferred: 1 }, 1));
    assert_eq!(f.version(), 1, "nothing applied");
    // No catch-up due: the request applies them, as `catch_up_within` does.
    let applied = f.catch_up_or_defer(&store, &t, &mut r, &mut || true, &mut |_| false);
    assert_eq!(applied, Followed { deltas: 3, full: 0, deferred: 0 });
    assert_eq!(f.version(), p.head().version);
}

#[test]
fn a_thread_without_knowledge_or_far_behind_does_not_defer() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut p = KnowledgePublisher::new(DecodeLimits::default());
    p.take(&store, snap(1).encode()).unwrap();
    p.confirmed(&store, 1);
    let (mut f, mut r) = (Follower::default(), router());
    let first = f.catch_up_or_defer(&store, &t, &mut r, &mut || true, &mut |_| true);
    assert_eq!(first, Followed { deltas: 0, full: 1, deferred: 0 }, "no knowledge yet");
    let (store, t) = (MemStore::new(), Tally::default());
    let (mut p, mut f, mut r) = following(&store, &t, big(1, 4096));
    publish_big(&store, &mut p, 1, 1 + FAR_BEHIND + 5);
    let done = f.catch_up_or_defer(&store, &t, &mut r, &mut || false, &mut |_| true);
    assert_eq!(done, Followed { deltas: 5, full: 0, deferred: 0 }, "far behind");
}
