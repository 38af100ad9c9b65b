use std::collections::HashMap;

use serde_json::json;

use crate::decision::config::sync::JournalLimits;
use crate::decision::config::SnapshotSyncConfig;
use crate::flow::sync::{Call, ListFailure, SyncEvent, SyncFlow, SyncHost};
use crate::shared::fake::{MemStore, Tally};
use crate::shared::journal::append;
use crate::shared::knowledge::{read_head, Taken};
use crate::shared::SharedStore;
use crate::wire::bundle::PART_BYTES;
use crate::wire::delta::Delta;
use crate::wire::journal::JournalEntry;
use crate::wire::journal::Source;
use crate::wire::snapshot::Snapshot;

/// A call the flow sent.
#[derive(Debug, Clone)]
struct Sent {
    token: u32,
    method: String,
    path: String,
    body: Option<Vec<u8>>,
    timeout_ms: u64,
}

/// The singleton's host in memory: shared data, a clock, the calls sent, the answer being
/// delivered and the events reported.
#[derive(Default)]
struct FakeHost {
    store: MemStore,
    now: u64,
    next_token: u32,
    refuse: bool,
    sent: Vec<Sent>,
    answer: HashMap<String, Vec<u8>>,
    body: Vec<u8>,
    events: Vec<SyncEvent>,
}

impl SyncHost for FakeHost {
    fn store(&self) -> &dyn SharedStore {
        &self.store
    }
    fn now_ms(&self) -> u64 {
        self.now
    }
    fn dispatch(&mut self, call: Call<'_>) -> Option<u32> {
        if self.refuse {
            return None;
        }
        assert_eq!(call.cluster, "updater");
        let h: HashMap<&str, &str> = call.headers.iter().copied().collect();
        assert_eq!(h["x-kvroute-token"], "0123456789abcdef");
        assert_eq!(h[":authority"], "kvroute-updater");
        self.next_token += 1;
        self.sent.push(Sent {
            token: self.next_token,
            method: h[":method"].into(),
            path: h[":path"].into(),
            body: call.body,
            timeout_ms: call.timeout_ms,
        });
        Some(self.next_token)
    }
    fn answer_header(&self, name: &str) -> Option<Vec<u8>> {
        self.answer.get(name).cloned()
    }
    fn answer_body(&self, size: usize) -> Option<Vec<u8>> {
        Some(self.body[..size.min(self.body.len())].to_vec())
    }
    fn event(&mut self, event: SyncEvent) {
        self.events.push(event);
    }
}

impl FakeHost {
    fn at(now: u64) -> Self {
        FakeHost { now, ..Default::default() }
    }

    /// Takes the calls sent so far.
    fn take(&mut self) -> Vec<Sent> {
        std::mem::take(&mut self.sent)
    }

    fn events(&mut self) -> Vec<SyncEvent> {
        std::mem::take(&mut self.events)
    }

    fn answers(&mut self, status: u16, body: Vec<u8>) {
        self.answer = HashMap::from([(":status".to_owned(), status.to_string().into_bytes())]);
        self.body = body;
    }
}

fn answer(flow: &mut SyncFlow, host: &mut FakeHost, to: &Sent, status: u16, body: Vec<u8>) {
    host.answers(status, body);
    let size = host.body.len();
    flow.on_answer(host, to.token, size);
}

fn config(extra: serde_json::Value) -> SnapshotSyncConfig {
    let mut v = json!({
        "cluster": "updater", "token": "0123456789abcdef", "interval_ms": 100,
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

fn paths(sent: &[Sent]) -> Vec<&str> {
    sent.iter().map(|s| s.path.as_str()).collect()
}

#[test]
fn the_long_poll_goes_out_again_as_soon_as_it_is_answered() {
    let mut host = FakeHost::at(10_000);
    let mut flow = SyncFlow::new(config(json!({})), &host, 1);
    assert_eq!(flow.tick_ms(), 100);
    flow.on_tick(&mut host);
    let sent = host.take();
    assert_eq!(paths(&sent), ["/v1/snapshot?since=0&pool=1&health=1&placement=1&wait_ms=1000"]);
    assert_eq!(
        (sent[0].method.as_str(), sent[0].timeout_ms, sent[0].body.is_none()),
        ("GET", 2000, true)
    );
    // While it is out, ticks send nothing more.
    host.now += 500;
    flow.on_tick(&mut host);
    assert!(host.take().is_empty());
    // A full snapshot: published, the head written, and the next poll asks for what follows.
    answer(&mut flow, &mut host, &sent[0], 200, snapshot(7));
    assert_eq!(host.events(), [SyncEvent::Snapshot(Some(Taken::Full)), SyncEvent::Version(7)]);
    let head = read_head(&host.store).unwrap();
    assert_eq!((head.version, head.checked_at_ms), (7, 10_500));
    let again = host.take();
    assert_eq!(paths(&again), ["/v1/snapshot?since=7&pool=1&health=1&placement=1&wait_ms=1000"]);
    // A 304 after the whole wait confirms the version (a new head write) and polls again.
    host.now += 1000;
    answer(&mut flow, &mut host, &again[0], 304, Vec::new());
    assert_eq!(host.events(), [SyncEvent::Snapshot(None), SyncEvent::Version(7)]);
    assert_eq!(read_head(&host.store).unwrap().checked_at_ms, 11_500);
    assert_eq!(host.take().len(), 1);
}

#[test]
fn answers_faster_than_the_gap_pace_the_long_polls_past_a_burst() {
    let mut host = FakeHost::at(10_000);
    let mut flow = SyncFlow::new(config(json!({"min_poll_gap_ms": 50})), &host, 1);
    assert_eq!(flow.tick_ms(), 50);
    flow.on_tick(&mut host);
    let mut sent = host.take();
    // Each answered 1 ms after it went out: the first eight polls go out at once.
    for v in 1..=8u64 {
        assert_eq!(sent.len(), 1, "poll {v}");
        host.now += 1;
        let d = Delta::between(
            &Snapshot { version: v - 1, ..Default::default() },
            &Snapshot { version: v, generated_at_ms: v, ..Default::default() },
        );
        let body = if v == 1 { snapshot(1) } else { d.encode() };
        answer(&mut flow, &mut host, &sent[0], 200, body);
        assert_eq!(flow.version(), v, "published at once");
        sent = host.take();
    }
    // Then one per 50 ms: the ninth waits until 400 ms of pace are spent (10 050).
    assert!(sent.is_empty());
    host.now = 10_049;
    flow.on_tick(&mut host);
    assert!(host.take().is_empty());
    host.now = 10_050;
    flow.on_tick(&mut host);
    let sent = host.take();
    assert_eq!(paths(&sent), ["/v1/snapshot?since=8&pool=1&health=1&placement=1&wait_ms=1000"]);
    // An answer after the pace (a 304 after the whole wait): the next one goes out at once.
    host.now += 1000;
    answer(&mut flow, &mut host, &sent[0], 304, Vec::new());
    assert_eq!(
        paths(&host.take()),
        ["/v1/snapshot?since=8&pool=1&health=1&placement=1&wait_ms=1000"]
    );
}

#[test]
fn without_a_gap_the_long_poll_goes_out_again_at_once() {
    let mut host = FakeHost::at(10_000);
    let mut flow = SyncFlow::new(config(json!({"min_poll_gap_ms": 0})), &host, 1);
    assert_eq!(flow.tick_ms(), 100);
    flow.on_tick(&mut host);
    let sent = host.take();
    host.now += 1;
    answer(&mut flow, &mut host, &sent[0], 200, snapshot(7));
    assert_eq!(host.take().len(), 1);
}

#[test]
fn a_gap_over_a_second_is_refused() {
    let bytes = json!({"snapshot_sync": {"cluster": "u", "token": "0123456789abcdef",
        "min_poll_gap_ms": 1001}})
    .to_string();
    let e = SnapshotSyncConfig::from_json(bytes.as_bytes(), &|_| None).unwrap_err();
    assert!(e.to_string().contains("min_poll_gap_ms"), "{e}");
}

#[test]
fn an_early_304_or_a_failure_waits_for_the_tick_interval() {
    let mut host = FakeHost::at(1_000);
    let mut flow = SyncFlow::new(config(json!({})), &host, 1);
    flow.on_tick(&mut host);
    let sent = host.take();
    // An updater without long polls answers at once: no busy loop.
    host.now += 10;
    answer(&mut flow, &mut host, &sent[0], 304, Vec::new());
    assert_eq!(host.events(), [SyncEvent::Snapshot(None), SyncEvent::Version(0)]);
    assert!(host.take().is_empty());
    host.now = 1_099;
    flow.on_tick(&mut host);
    assert!(host.take().is_empty());
    host.now = 1_100;
    flow.on_tick(&mut host);
    let sent = host.take();
    assert_eq!(sent.len(), 1);
    // An error status: counted, retried by the tick only.
    answer(&mut flow, &mut host, &sent[0], 503, Vec::new());
    assert_eq!(host.events(), [SyncEvent::SnapshotFailed(Some("updater answered 503".into()))]);
    assert!(host.take().is_empty());
    host.now = 1_200;
    flow.on_tick(&mut host);
    let sent = host.take();
    // A body that does not decode: the publisher forgets its base; nothing is published.
    answer(&mut flow, &mut host, &sent[0], 200, b"garbage".to_vec());
    assert!(matches!(host.events().as_slice(), [SyncEvent::SnapshotFailed(Some(_))]));
    assert_eq!(flow.version(), 0);
    assert_eq!(read_head(&host.store).map(|h| h.version), Some(0));
}

#[test]
fn a_call_that_cannot_be_sent_is_counted_and_retried_after_the_interval() {
    let mut host = FakeHost::at(1_000);
    host.refuse = true;
    let mut flow = SyncFlow::new(config(json!({})), &host, 1);
    flow.on_tick(&mut host);
    assert_eq!(host.events(), [SyncEvent::SnapshotFailed(None)]);
    host.refuse = false;
    host.now = 1_050;
    flow.on_tick(&mut host);
    assert!(host.take().is_empty());
    host.now = 1_100;
    flow.on_tick(&mut host);
    assert_eq!(host.take().len(), 1);
}

#[test]
fn unknown_tokens_are_ignored() {
    let mut host = FakeHost::at(1_000);
    let mut flow = SyncFlow::new(config(json!({"bundles": {"enabled": true}})), &host, 1);
    flow.on_tick(&mut host);
    assert_eq!(host.take().len(), 2);
    host.events();
    host.answers(200, snapshot(3));
    flow.on_answer(&mut host, 999, 10);
    assert!(host.events().is_empty() && host.take().is_empty());
    assert_eq!(flow.version(), 0);
}

#[test]
fn peer_reports_go_one_at_a_time_with_this_replicas_id() {
    let mut host = FakeHost::at(50_000);
    let peers = json!({"peers": {"enabled": true, "forward_ms": 5}});
    let mut flow = SyncFlow::new(config(peers), &host, 42);
    assert_eq!(flow.tick_ms(), 5);
    let replica = crate::shared::peers::read_replica(&host.store).unwrap();
    assert_eq!(replica, 42);
    credit(&host.store, 100);
    flow.on_tick(&mut host);
    let sent = host.take();
    let report = sent.iter().find(|s| s.path == "/v1/peers").unwrap();
    assert_eq!(report.method, "POST");
    assert!(report.body.is_some());
    let poll = sent.iter().find(|s| s.path.starts_with("/v1/snapshot")).unwrap();
    assert!(
        poll.path.ends_with(&format!("&peers=1&arrivals=1&replica={replica}")),
        "{}",
        poll.path
    );
    // The report is out: the next ticks send no other.
    host.now += 2_000;
    flow.on_tick(&mut host);
    assert!(!host.take().iter().any(|s| s.path == "/v1/peers"));
    let report = report.clone();
    answer(&mut flow, &mut host, &report, 204, Vec::new());
    assert_eq!(host.events(), [SyncEvent::PeerReport]);
    credit(&host.store, 200);
    host.now += 2_000;
    flow.on_tick(&mut host);
    let next = host.take();
    let report = next.iter().find(|s| s.path == "/v1/peers").unwrap().clone();
    answer(&mut flow, &mut host, &report, 500, Vec::new());
    assert_eq!(host.events(), [SyncEvent::PeerFailed]);
}

#[test]
fn a_report_refused_as_malformed_goes_out_in_the_format_before_arrivals_from_then_on() {
    use crate::wire::peers::{PeerReport, REPORT_FORMAT, REPORT_FORMAT_PLAIN};
    let mut host = FakeHost::at(50_000);
    let peers = json!({"peers": {"enabled": true, "forward_ms": 5}});
    let mut flow = SyncFlow::new(config(peers), &host, 42);
    let format = |s: &Sent| s.body.as_ref().map(|b| b[4]);
    let next_report = |flow: &mut SyncFlow, host: &mut FakeHost, hash: u64| {
        credit(&host.store, hash);
        host.now += 2_000;
        flow.on_tick(host);
        host.take().into_iter().find(|s| s.path == "/v1/peers").unwrap()
    };
    let first = next_report(&mut flow, &mut host, 100);
    assert_eq!(format(&first), Some(REPORT_FORMAT));
    // An updater that reads format 1 only refuses format 2 as malformed.
    answer(&mut flow, &mut host, &first, 400, Vec::new());
    assert_eq!(host.events(), [SyncEvent::PeerFailed, SyncEvent::PeerFormatDowngraded]);
    let second = next_report(&mut flow, &mut host, 200);
    assert_eq!(format(&second), Some(REPORT_FORMAT_PLAIN));
    let body = second.body.clone().unwrap();
    let decoded = PeerReport::decode_with(&body, &Default::default()).unwrap();
    assert_eq!(decoded.credits[0].hashes, [200], "the report's content is kept");
    // Refused again: no second downgrade, the format stays.
    answer(&mut flow, &mut host, &second, 400, Vec::new());
    assert_eq!(host.events(), [SyncEvent::PeerFailed]);
    let third = next_report(&mut flow, &mut host, 300);
    assert_eq!(format(&third), Some(REPORT_FORMAT_PLAIN));
}

/// A routing decision journaled by a filter thread.
fn credit(store: &MemStore, hash: u64) {
    let entry = JournalEntry {
        seq: 0,
        at_ms: 1,
        source: Source::Routed,
        worker: "10.0.0.1:8000".into(),
        hashes: vec![hash],
        retract: false,
    };
    assert!(append(store, &Tally::default(), &JournalLimits::default(), entry));
}

fn list(fingerprint: u64, parts: u32, bytes: u64) -> Vec<u8> {
    json!({"bundles": [{"model": "m", "fingerprint": format!("{fingerprint:016x}"),
        "parts": parts, "bytes": bytes}]})
    .to_string()
    .into_bytes()
}

fn bundles() -> SnapshotSyncConfig {
    config(json!({"bundles": {"enabled": true, "list_interval_ms": 2000, "retry_min_ms": 500,
        "retry_max_ms": 4000}}))
}

#[test]
fn the_bundle_list_is_polled_every_list_interval() {
    let mut host = FakeHost::at(1_000);
    let mut flow = SyncFlow::new(bundles(), &host, 1);
    flow.on_tick(&mut host);
    let sent = host.take();
    let list_call = sent.iter().find(|s| s.path == "/v1/bundles").unwrap().clone();
    answer(&mut flow, &mut host, &list_call, 500, Vec::new());
    assert!(host.events().contains(&SyncEvent::ListFailed(ListFailure::Status(500))));
    for now in [1_100, 2_900] {
        host.now = now;
        flow.on_tick(&mut host);
        assert!(!host.take().iter().any(|s| s.path == "/v1/bundles"), "at {now}");
    }
    host.now = 3_000;
    flow.on_tick(&mut host);
    let list_call = host.take().into_iter().find(|s| s.path == "/v1/bundles").unwrap();
    host.events();
    answer(&mut flow, &mut host, &list_call, 200, b"{".to_vec());
    assert!(matches!(host.events().first(), Some(SyncEvent::ListFailed(ListFailure::Invalid(_)))));
}

#[test]
fn a_snapshot_naming_an_unknown_bundle_brings_the_list_forward() {
    let mut host = FakeHost::at(1_000);
    let mut flow = SyncFlow::new(bundles(), &host, 1);
    flow.on_tick(&mut host);
    let sent = host.take();
    let list_call = sent.iter().find(|s| s.path == "/v1/bundles").unwrap().clone();
    answer(&mut flow, &mut host, &list_call, 200, json!({"bundles": []}).to_string().into_bytes());
    let poll = sent.iter().find(|s| s.path.starts_with("/v1/snapshot")).unwrap().clone();
    let mut snap = Snapshot { version: 4, generated_at_ms: 4, ..Default::default() };
    snap.models.push(crate::wire::snapshot::ModelInfo {
        name: "m".into(),
        fingerprint: 0xab,
        ..Default::default()
    });
    host.now = 1_200;
    answer(&mut flow, &mut host, &poll, 200, snap.encode());
    host.take();
    // Due at 1 000 + 500 instead of 1 000 + 2 000 (bundles are pumped every 100 ms).
    host.now = 1_450;
    flow.on_tick(&mut host);
    assert!(!host.take().iter().any(|s| s.path == "/v1/bundles"));
    host.now = 1_550;
    flow.on_tick(&mut host);
    assert!(host.take().iter().any(|s| s.path == "/v1/bundles"));
}

#[test]
fn bundle_parts_are_asked_for_in_order_one_at_a_time_and_failures_back_off() {
    let mut host = FakeHost::at(1_000);
    let mut flow = SyncFlow::new(bundles(), &host, 1);
    flow.on_tick(&mut host);
    let list_call = host.take().into_iter().find(|s| s.path == "/v1/bundles").unwrap();
    let fp = 0xabu64;
    let bytes = PART_BYTES as u64 + 10;
    answer(&mut flow, &mut host, &list_call, 200, list(fp, 2, bytes));
    // The answer pumps at once: part 0 goes out.
    let sent = host.take();
    assert_eq!(paths(&sent), [crate::shared::bundles::part_path(fp, 0)]);
    // Nothing else while it is in flight.
    host.now = 1_100;
    flow.on_tick(&mut host);
    assert!(!host.take().iter().any(|s| s.path.contains("/v1/bundles/")));
    // Part 0 arrives: stored, and part 1 is asked for in the same callback.
    host.answer.insert(crate::shared::bundles::PARTS_HEADER.into(), b"2".to_vec());
    host.body = vec![0; PART_BYTES];
    flow.on_answer(&mut host, sent[0].token, PART_BYTES);
    assert!(host.events().contains(&SyncEvent::PartStored));
    let part1 = host.take();
    assert_eq!(paths(&part1), [crate::shared::bundles::part_path(fp, 1)]);
    // Part 1 is missing at the updater: the download is abandoned and retried after a backoff.
    answer(&mut flow, &mut host, &part1[0], 404, Vec::new());
    assert!(host.events().iter().any(|e| matches!(
        e,
        SyncEvent::PartFailed { fingerprint: 0xab, part: 1, error: Some(_) }
    )));
    assert!(!host.take().iter().any(|s| s.path.contains("/v1/bundles/")));
    host.now = 1_200;
    flow.on_tick(&mut host);
    assert!(!host.take().iter().any(|s| s.path.contains("/v1/bundles/")));
    host.now = 1_100 + 4_000;
    flow.on_tick(&mut host);
    let retry = host.take();
    assert!(
        paths(&retry).contains(&crate::shared::bundles::part_path(fp, 0).as_str()),
        "{:?}",
        paths(&retry)
    );
}
