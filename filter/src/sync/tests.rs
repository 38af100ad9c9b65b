use kvroute_core::decision::config::sync::JournalLimits;
use kvroute_core::decision::config::SnapshotSyncConfig;
use kvroute_core::shared::fake::Tally;
use kvroute_core::shared::journal::append;
use kvroute_core::shared::SharedStore;
use kvroute_core::wire::journal::{JournalEntry, Source};
use kvroute_core::wire::snapshot::Snapshot;
use serde_json::json;

use super::SnapshotSync;
use crate::fake::FakeHost;
use crate::thread::Placement;

fn config(extra: serde_json::Value) -> SnapshotSyncConfig {
    let mut v = json!({
        "cluster": "kvroute_updater", "token": "0123456789abcdef", "interval_ms": 100,
        "long_poll_ms": 1000, "bundles": {"enabled": false}, "peers": {"enabled": false},
    });
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    let bytes = json!({ "snapshot_sync": v }).to_string();
    SnapshotSyncConfig::from_json(bytes.as_bytes(), &|_| None).unwrap().unwrap()
}

fn snapshot(version: u64) -> Vec<u8> {
    Snapshot { version, generated_at_ms: version, ..Default::default() }.encode()
}

#[test]
fn starting_sets_the_tick_and_marks_worker_threads() {
    let peers = json!({"peers": {"enabled": true, "forward_ms": 20}});
    let sync = SnapshotSync::with_host(FakeHost::at(1_000), config(peers));
    assert_eq!(Placement::from_store(sync.host()), Placement::Main);
    sync.start();
    assert_eq!(sync.host().tick_ms.get(), Some(20));
    assert_eq!(Placement::from_store(sync.host()), Placement::Worker);
    // The replica id the threads read is in shared data.
    assert!(sync.host().get(kvroute_core::shared::peers::REPLICA_KEY).0.is_some());
}

#[test]
fn calls_go_to_the_updater_cluster_with_its_token_and_answers_are_counted() {
    let mut sync = SnapshotSync::with_host(FakeHost::at(1_000), config(json!({})));
    sync.on_tick();
    let sent = sync.host().take_sent();
    assert_eq!(sent.len(), 1);
    let call = &sent[0];
    assert_eq!(call.cluster, "kvroute_updater");
    assert_eq!(call.header(":method"), Some("GET"));
    assert_eq!(call.header(":authority"), Some("kvroute-updater"));
    assert_eq!(call.header("x-kvroute-token"), Some("0123456789abcdef"));
    assert_eq!(call.path(), "/v1/snapshot?since=0&pool=1&health=1&placement=1&wait_ms=1000");
    assert_eq!(call.timeout_ms, 2_000);
    let body = snapshot(9);
    sync.host().answer(200, &body);
    sync.on_http_call_response(call.token, 0, body.len(), 0);
    let h = sync.host();
    assert_eq!(h.metric("kvroute.sync.full_snapshots"), Some(1));
    assert_eq!(h.metric("kvroute.sync.snapshot_version"), Some(9));
    assert_eq!(h.metric("kvroute.sync.fetch_failures"), Some(0));
    // The long poll went out again at once, for what follows version 9.
    let next = h.take_sent();
    assert_eq!(next[0].path(), "/v1/snapshot?since=9&pool=1&health=1&placement=1&wait_ms=1000");
    h.answer(502, b"");
    sync.on_http_call_response(next[0].token, 0, 0, 0);
    assert_eq!(sync.host().metric("kvroute.sync.fetch_failures"), Some(1));
    assert!(sync.host().take_sent().is_empty());
}

#[test]
fn calls_the_host_refuses_are_counted_as_failures() {
    let mut sync =
        SnapshotSync::with_host(FakeHost::at(1_000), config(json!({"bundles": {"enabled": true}})));
    sync.host().refuse_calls.set(true);
    sync.on_tick();
    let h = sync.host();
    assert_eq!(h.metric("kvroute.sync.fetch_failures"), Some(1));
    assert_eq!(h.metric("kvroute.bundles.list_failures"), Some(1));
    assert_eq!(h.metric("kvroute.bundles.available"), Some(0));
}

#[test]
fn bundle_answers_reach_the_fetcher_and_its_counters() {
    let mut sync =
        SnapshotSync::with_host(FakeHost::at(1_000), config(json!({"bundles": {"enabled": true}})));
    sync.on_tick();
    let sent = sync.host().take_sent();
    let list = sent.iter().find(|s| s.path() == "/v1/bundles").unwrap();
    let body = json!({"bundles": [
        {"model": "m", "fingerprint": "00000000000000ab", "parts": 1, "bytes": 10},
        {"model": "x", "fingerprint": "zz", "parts": 1, "bytes": 10},
    ]})
    .to_string();
    sync.host().answer(200, body.as_bytes());
    sync.on_http_call_response(list.token, 0, body.len(), 0);
    let part = sync.host().take_sent();
    assert_eq!(part.len(), 1);
    assert_eq!(part[0].path(), kvroute_core::shared::bundles::part_path(0xab, 0));
    // A part that does not decode as a bundle: counted, retried later.
    sync.host().answer(200, b"0123456789");
    sync.host().headers.borrow_mut().insert(
        (crate::host::Map::CallResponse, kvroute_core::shared::bundles::PARTS_HEADER.into()),
        b"1".to_vec(),
    );
    sync.on_http_call_response(part[0].token, 0, 10, 0);
    assert_eq!(sync.host().metric("kvroute.bundles.fetch_failures"), Some(1));
    assert_eq!(sync.host().metric("kvroute.bundles.published"), Some(0));
}

#[test]
fn peer_reports_are_posted_and_counted() {
    let peers = json!({"peers": {"enabled": true}});
    let mut sync = SnapshotSync::with_host(FakeHost::at(60_000), config(peers));
    // A filter thread routed a request.
    let entry = JournalEntry {
        seq: 0,
        at_ms: 59_000,
        source: Source::Routed,
        worker: "10.0.0.1:8000".into(),
        hashes: vec![7, 8],
        retract: false,
    };
    assert!(append(sync.host(), &Tally::default(), &JournalLimits::default(), entry));
    sync.on_tick();
    let sent = sync.host().take_sent();
    let report = sent.iter().find(|s| s.path() == "/v1/peers").unwrap();
    assert_eq!(report.header(":method"), Some("POST"));
    assert_eq!(report.header("content-type"), Some("application/octet-stream"));
    assert!(report.body.is_some());
    sync.host().answer(204, b"");
    sync.on_http_call_response(report.token, 0, 0, 0);
    assert_eq!(sync.host().metric("kvroute.sync.peer_reports"), Some(1));
}

#[test]
fn publishing_knowledge_wakes_every_listed_thread_at_the_pace() {
    use crate::host::Host;
    use kvroute_core::decision::config::sync::LoadLimits;
    use kvroute_core::shared::load::Shard;
    use kvroute_core::shared::wake::{queue_name, WAKE_GAP_MS};

    let mut sync = SnapshotSync::with_host(FakeHost::at(1_000), config(json!({})));
    let h = sync.host();
    // Two threads with a queue each, and one (an older filter) without.
    let shards: Vec<u32> = (0..3)
        .map(|i| Shard::register(h, &Tally::default(), LoadLimits::default(), 1_000, i).id())
        .collect();
    let queues: Vec<u32> =
        shards[..2].iter().map(|&s| h.register_queue(&queue_name(s)).unwrap()).collect();
    let pending = |sync: &SnapshotSync<FakeHost>| -> Vec<usize> {
        queues.iter().map(|&q| sync.host().queues.borrow()[q as usize - 1].1.len()).collect()
    };
    let mut version = 1;
    let mut answer = |sync: &mut SnapshotSync<FakeHost>| {
        sync.on_tick();
        let sent = sync.host().take_sent();
        let Some(call) = sent.last() else { return };
        version += 1;
        let body = snapshot(version);
        sync.host().answer(200, &body);
        sync.on_http_call_response(call.token, 0, body.len(), 0);
    };
    answer(&mut sync);
    assert_eq!(pending(&sync), [1, 1], "a publish wakes every thread with a queue");
    // A second publish inside the gap is held back, then goes out on a tick past it.
    answer(&mut sync);
    assert_eq!(pending(&sync), [1, 1]);
    sync.host().now_ms.set(1_000 + WAKE_GAP_MS);
    sync.on_tick();
    assert_eq!(pending(&sync), [2, 2], "the held-back wake, on the tick");
    sync.host().now_ms.set(1_000 + 10 * WAKE_GAP_MS);
    sync.on_tick();
    assert_eq!(pending(&sync), [2, 2], "nothing published: no wake");
    assert_eq!(sync.host().metric("kvroute.sync.thread_wakes"), Some(4));
    // Every message reads back as one.
    let h = sync.host();
    assert!(h.dequeue(queues[0]).is_some_and(|m| !m.is_empty()));
}
