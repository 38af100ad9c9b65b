use super::*;
use crate::decision::config::sync::JournalLimits;
use crate::decision::load::worker_key;
use crate::shared::fake::{MemStore, Tally};
use crate::shared::journal;
use crate::shared::load::Shard;
use crate::wire::journal::JournalEntry;

const W: &str = "127.0.0.1:8001";

fn routed(store: &MemStore, t: &Tally, worker: &str, hashes: &[u64], source: Source) {
    let e = JournalEntry {
        seq: 0,
        at_ms: 10,
        source,
        worker: worker.into(),
        hashes: hashes.to_vec(),
        retract: false,
    };
    journal::append(store, t, &JournalLimits::default(), e);
}

fn cfg() -> PeerSyncConfig {
    PeerSyncConfig { max_hashes_per_report: 4, heartbeat_ms: 100, ..Default::default() }
}

#[test]
fn the_replica_id_is_created_once() {
    let store = MemStore::new();
    assert_eq!(read_replica(&store), None);
    let a = replica_id(&store, 42);
    assert_eq!(a, 42);
    assert_eq!(replica_id(&store, 43), 42, "the second comer reads the first one's id");
    let zero = MemStore::new();
    assert_eq!(replica_id(&zero, 0), 1, "never 0 (0 means: none known)");
}

#[test]
fn routing_credits_are_forwarded_batched_and_capped() {
    let (store, t) = (MemStore::new(), Tally::default());
    routed(&store, &t, W, &[99], Source::Routed);
    let mut f = Forwarder::new(&store, cfg());
    assert!(f.poll(&store, &t, 7, 0).report.is_none(), "history before the start is not sent");
    routed(&store, &t, W, &[1, 2, 3], Source::Routed);
    routed(&store, &t, W, &[4, 5], Source::Routed);
    routed(&store, &t, W, &[6], Source::Feedback);
    let r = f.poll(&store, &t, 7, 1).report.unwrap();
    assert_eq!((r.replica, r.seq), (7, 1));
    assert!(r.loads.is_empty());
    assert_eq!(r.credits.len(), 1);
    assert_eq!(r.credits[0].hashes, [1, 2, 3, 4], "capped at max_hashes_per_report");
    let r = f.poll(&store, &t, 7, 2).report.unwrap();
    assert_eq!((r.seq, r.credits[0].hashes.clone()), (2, vec![5]), "the rest follows");
    assert!(f.poll(&store, &t, 7, 3).report.is_none(), "nothing new: nothing sent");
    // Past four reports' worth pending, the largest lists are dropped.
    for i in 0..5 {
        routed(&store, &t, W, &[10 * i, 10 * i + 1, 10 * i + 2, 10 * i + 3], Source::Routed);
    }
    let out = f.poll(&store, &t, 7, 4);
    assert_eq!(out.dropped_hashes, 20);
    assert!(out.report.is_none());
}

#[test]
fn loads_are_sent_when_they_change_on_heartbeats_and_as_zero_when_gone() {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut f = Forwarder::new(&store, cfg());
    let mut shard = Shard::register(&store, &t, Default::default(), 0, 1);
    let ticket = shard.start(&t, W, 500, 0);
    shard.flush(&store, &t, 0);
    let r = f.poll(&store, &t, 7, 1).report.unwrap();
    assert_eq!(r.loads.len(), 1);
    let l = r.loads[0];
    assert_eq!(
        (l.worker_key, l.inflight, l.prefilling, l.prefill_tokens),
        (worker_key(W), 1, 1, 500)
    );
    // 500 tokens sent within the default 2 s window: 250 a second, for the other replicas'
    // forecast of the worker's step fill.
    assert_eq!(l.arriving_tokens_per_s, 250);
    assert!(f.poll(&store, &t, 7, 50).report.is_none(), "unchanged, no heartbeat due");
    let r = f.poll(&store, &t, 7, 101).report.unwrap();
    assert_eq!(r.loads.len(), 1, "heartbeat");
    shard.first_byte(ticket);
    shard.flush(&store, &t, 110);
    let r = f.poll(&store, &t, 7, 110).report.unwrap();
    assert_eq!((r.loads[0].prefilling, r.loads[0].prefill_tokens), (0, 0));
    shard.end(ticket);
    shard.flush(&store, &t, 120);
    let r = f.poll(&store, &t, 7, 120).report.unwrap();
    assert!(r.loads[0].is_zero(), "gone: sent once as zero");
    assert!(f.poll(&store, &t, 7, 500).report.is_none(), "no load, no heartbeat");
    // A failed report makes the next one carry every load again.
    shard.start(&t, W, 5, 600);
    shard.flush(&store, &t, 600);
    assert!(f.poll(&store, &t, 7, 600).report.is_some());
    f.failed();
    assert_eq!(f.poll(&store, &t, 7, 601).report.unwrap().loads.len(), 1);
}

#[test]
fn config_is_validated() {
    assert!(PeerSyncConfig::default().validate().is_ok());
    let bad = |c: PeerSyncConfig| c.validate().unwrap_err();
    assert!(bad(PeerSyncConfig { forward_ms: 0, ..Default::default() }).contains("forward_ms"));
    assert!(bad(PeerSyncConfig { heartbeat_ms: 1, ..Default::default() }).contains("heartbeat"));
    assert!(bad(PeerSyncConfig { max_hashes_per_report: 0, ..Default::default() })
        .contains("max_hashes_per_report"));
    let sync = |v: serde_json::Value| {
        crate::decision::config::SnapshotSyncConfig::from_json(v.to_string().as_bytes(), &|_| None)
    };
    let tok = "0123456789abcdef";
    let c = sync(serde_json::json!({"snapshot_sync": {"cluster": "u", "token": tok}}))
        .unwrap()
        .unwrap();
    assert_eq!((c.long_poll_ms, c.peers.enabled, c.peers.forward_ms), (1000, true, 5));
    let long = sync(serde_json::json!({"snapshot_sync":
        {"cluster": "u", "token": tok, "long_poll_ms": 60000}}));
    assert!(long.unwrap_err().to_string().contains("long_poll_ms"));
    let unknown = sync(serde_json::json!({"snapshot_sync":
        {"cluster": "u", "token": tok, "peers": {"x": 1}}}));
    assert!(unknown.is_err());
}

#[test]
fn loads_are_read_with_the_limits_the_threads_published() {
    let (store, t) = (MemStore::new(), Tally::default());
    // The threads lease an entry 100 ms and count no arrival rate; the singleton's config
    // says nothing about either.
    let threads = LoadLimits { lease_ms: 100, arrival_window_ms: 0, ..LoadLimits::default() };
    let mut shard = Shard::register(&store, &t, threads, 0, 1);
    shard.start(&t, W, 500, 0);
    shard.flush(&store, &t, 0);
    let mut f = Forwarder::new(&store, cfg());
    let r = f.poll(&store, &t, 7, 50).report.unwrap();
    assert_eq!((r.loads[0].prefilling, r.loads[0].arriving_tokens_per_s), (1, 0));
    // Past the threads' lease the entry no longer counts (the default lease is 10 minutes).
    let r = f.poll(&store, &t, 7, 150).report.unwrap();
    assert!(r.loads[0].is_zero(), "{:?}", r.loads[0]);
    // A window set in `peers` overrides the threads' one: 500 tokens over 1 s.
    let (store, t) = (MemStore::new(), Tally::default());
    let mut shard =
        Shard::register(&store, &t, LoadLimits { arrival_window_ms: 0, ..threads }, 0, 1);
    shard.start(&t, W, 500, 0);
    shard.flush(&store, &t, 0);
    let mut f = Forwarder::new(&store, PeerSyncConfig { arrival_window_ms: Some(1_000), ..cfg() });
    assert_eq!(f.poll(&store, &t, 7, 50).report.unwrap().loads[0].arriving_tokens_per_s, 500);
}
