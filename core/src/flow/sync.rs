//! The snapshot-sync singleton's scheduler, without I/O: when to send the updater's long poll
//! (at once after an answer; the `interval_ms` tick after a failure or an early 304), when to
//! forward this replica's decisions and load (one report in flight), when to ask for the bundle
//! list (every `list_interval_ms`, sooner when a snapshot names a bundle not known), and the
//! one bundle part in flight. Everything it touches goes through [`SyncHost`]: shared data,
//! the HTTP calls and their answers, the clock, and what it reports ([`SyncEvent`]).

use crate::shared::bundles::{
    self, stated_fingerprint, Fetcher, Housekeeping, PartRequest, Progress, LIST_PATH, PARTS_HEADER,
};
use crate::shared::knowledge::{KnowledgePublisher, Taken};
use crate::shared::peers::{read_replica, replica_id, Forwarder};
use crate::shared::{Counter, Counters, SharedStore};
use crate::wire::bundle::BundleBlob;

use crate::decision::config::SnapshotSyncConfig;

/// At most this often (ms) a snapshot naming an unknown bundle brings the list poll forward.
pub const LIST_SOONER_MS: u64 = 500;

/// An HTTP call to the updater.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call<'a> {
    pub cluster: &'a str,
    pub headers: Vec<(&'a str, &'a str)>,
    pub body: Option<Vec<u8>>,
    pub timeout_ms: u64,
}

/// Why the bundle list could not be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListFailure {
    NotSent,
    Status(u16),
    Invalid(String),
}

/// What the scheduler reports (the filter counts and logs these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncEvent {
    /// A snapshot answer was published (`None`: 304, nothing new).
    Snapshot(Option<Taken>),
    /// The knowledge version held now.
    Version(u64),
    /// A snapshot request failed (`None`: it could not be sent).
    SnapshotFailed(Option<String>),
    PeerReport,
    PeerFailed,
    /// The updater refused a report in format 2 (arrivals): reports go out in format 1 now.
    PeerFormatDowngraded,
    PeerHashesDropped(u64),
    ListFailed(ListFailure),
    /// Entries of the list left out as malformed.
    ListMalformed(usize),
    PartStored,
    /// A part failed (`error` `None`: the request could not be sent).
    PartFailed {
        fingerprint: u64,
        part: u32,
        error: Option<String>,
    },
    Published {
        fingerprint: u64,
        models: Vec<String>,
        bytes: u64,
    },
    Housekeeping(Housekeeping),
    /// What the manifest holds: models with a bundle, bytes.
    Stored {
        models: usize,
        bytes: u64,
    },
}

/// The singleton's host.
pub trait SyncHost {
    fn store(&self) -> &dyn SharedStore;
    fn now_ms(&self) -> u64;
    /// Sends `call`; its token, `None` if it could not be sent.
    fn dispatch(&mut self, call: Call<'_>) -> Option<u32>;
    /// A header of the call being answered.
    fn answer_header(&self, name: &str) -> Option<Vec<u8>>;
    /// The body of the call being answered.
    fn answer_body(&self, size: usize) -> Option<Vec<u8>>;
    fn event(&mut self, event: SyncEvent);
}

/// The singleton reads the journal and load shards the threads write and count: what it
/// would count there (skips, dead shards) the threads count already.
struct Uncounted;

impl Counters for Uncounted {
    fn count(&self, _what: Counter, _n: u64) {}
}

/// The bundle side.
#[derive(Debug)]
struct BundleSync {
    fetcher: Fetcher,
    list_call: Option<u32>,
    part_call: Option<(u32, PartRequest)>,
    next_list_ms: u64,
    last_list_ms: u64,
}

/// The scheduler's state.
#[derive(Debug)]
pub struct SyncFlow {
    cfg: SnapshotSyncConfig,
    publisher: KnowledgePublisher,
    snapshot_call: Option<u32>,
    bundles: Option<BundleSync>,
    forwarder: Option<Forwarder>,
    peer_call: Option<u32>,
    replica: u64,
    /// When the fallback tick may send the next snapshot request, and pump bundles.
    next_poll_ms: u64,
    next_bundles_ms: u64,
    /// When the outstanding snapshot request was sent.
    sent_ms: u64,
    /// The long polls' pace: when the next would be due had every one kept the gap.
    poll_pace_ms: u64,
}

/// Long polls that may go out back to back before `min_poll_gap_ms` paces them: a few
/// changes in quick succession (a request's load, then its blocks) each arrive at once.
const POLL_BURST: u64 = 8;

fn status_of(raw: Option<Vec<u8>>) -> u16 {
    raw.and_then(|s| std::str::from_utf8(&s).ok()?.parse().ok()).unwrap_or(0)
}

impl SyncFlow {
    /// `seed`: randomness for this replica's id, should shared data have none yet.
    pub fn new(cfg: SnapshotSyncConfig, host: &dyn SyncHost, seed: u64) -> Self {
        let store = host.store();
        let bundles = cfg.bundles.enabled.then(|| BundleSync {
            fetcher: Fetcher::new(cfg.bundles, store),
            list_call: None,
            part_call: None,
            next_list_ms: 0,
            last_list_ms: 0,
        });
        SyncFlow {
            forwarder: cfg.peers.enabled.then(|| Forwarder::new(store, cfg.peers)),
            replica: replica_id(store, seed),
            publisher: KnowledgePublisher::default(),
            cfg,
            snapshot_call: None,
            bundles,
            peer_call: None,
            next_poll_ms: 0,
            next_bundles_ms: 0,
            sent_ms: 0,
            poll_pace_ms: 0,
        }
    }

    pub fn config(&self) -> &SnapshotSyncConfig {
        &self.cfg
    }

    /// The tick period (ms): the poll fallback, or the forwarding period if shorter.
    pub fn tick_ms(&self) -> u64 {
        let mut ms = self.cfg.interval_ms;
        if let Some(f) = &self.forwarder {
            ms = ms.min(f.config().forward_ms);
        }
        // A long poll held back by the gap goes out on the tick.
        if self.cfg.long_poll_ms > 0 && self.cfg.min_poll_gap_ms > 0 {
            ms = ms.min(self.cfg.min_poll_gap_ms);
        }
        ms
    }

    /// The knowledge version published (0: none yet).
    pub fn version(&self) -> u64 {
        self.publisher.version()
    }

    fn call<'a>(&'a self, method: &'static str, path: &'a str, timeout_ms: u64) -> Call<'a> {
        let mut headers = vec![
            (":method", method),
            (":path", path),
            (":authority", self.cfg.authority.as_str()),
            ("x-kvroute-token", self.cfg.token.as_str()),
        ];
        if method == "POST" {
            headers.push(("content-type", "application/octet-stream"));
        }
        Call { cluster: &self.cfg.cluster, headers, body: None, timeout_ms }
    }

    /// The fallback tick.
    pub fn on_tick(&mut self, host: &mut dyn SyncHost) {
        let now = host.now_ms();
        self.forward(host, now);
        if self.snapshot_call.is_none() && now >= self.next_poll_ms {
            self.poll_snapshot(host, now);
        }
        if now >= self.next_bundles_ms {
            self.next_bundles_ms = now.saturating_add(self.cfg.interval_ms);
            self.pump(host, now);
        }
    }

    /// The answer to call `token` (`body_size` bytes of body).
    pub fn on_answer(&mut self, host: &mut dyn SyncHost, token: u32, body_size: usize) {
        if self.snapshot_call == Some(token) {
            self.snapshot_call = None;
            self.snapshot_answer(host, body_size);
            return;
        }
        if self.peer_call == Some(token) {
            self.peer_call = None;
            let status = status_of(host.answer_header(":status"));
            if status == 204 {
                host.event(SyncEvent::PeerReport);
            } else {
                host.event(SyncEvent::PeerFailed);
                if let Some(f) = self.forwarder.as_mut() {
                    if status == 400 && f.refused() {
                        host.event(SyncEvent::PeerFormatDowngraded);
                    } else {
                        f.failed();
                    }
                }
            }
            return;
        }
        let now = host.now_ms();
        let Some(b) = self.bundles.as_mut() else { return };
        if b.list_call == Some(token) {
            b.list_call = None;
            b.list_answer(host, body_size);
        } else if let Some((_, req)) = b.part_call.filter(|(t, _)| *t == token) {
            b.part_call = None;
            b.part_answer(host, req, body_size, now);
        } else {
            return;
        }
        // Callback-driven: the next part is asked for as soon as one arrives.
        self.pump(host, now);
    }

    fn snapshot_answer(&mut self, host: &mut dyn SyncHost, body_size: usize) {
        let status = host.answer_header(":status").unwrap_or_default();
        let taken = match status.as_slice() {
            b"304" => Ok(None),
            b"200" => {
                let body = host.answer_body(body_size).unwrap_or_default();
                self.publisher.take(host.store(), body).map(Some).map_err(|e| e.to_string())
            }
            other => Err(format!("updater answered {}", String::from_utf8_lossy(other))),
        };
        let answered = taken.is_ok();
        let early_304 = status.as_slice() == b"304"
            && host.now_ms().saturating_sub(self.sent_ms) < self.cfg.long_poll_ms / 2;
        match taken {
            Ok(kind) => {
                host.event(SyncEvent::Snapshot(kind));
                let now = host.now_ms();
                self.publisher.confirmed(host.store(), now);
                host.event(SyncEvent::Version(self.publisher.head().version));
                // A snapshot naming a bundle the singleton does not know asks for the list now.
                if let Some(b) = self.bundles.as_mut() {
                    if self.publisher.models().iter().any(|m| !b.fetcher.knows(m.fingerprint)) {
                        // At most twice a second, should the list never name it.
                        let sooner = b.last_list_ms.saturating_add(LIST_SOONER_MS);
                        b.next_list_ms = b.next_list_ms.min(sooner);
                    }
                }
            }
            Err(e) => host.event(SyncEvent::SnapshotFailed(Some(e))),
        }
        // The long poll goes out again at once, or, while answers come faster than one per
        // `min_poll_gap_ms` (past a burst), when its pace allows (the tick sends it); after a
        // failure (or a 304 long before the wait: an updater without long polls) the tick
        // sends the next one.
        if answered && self.cfg.long_poll_ms > 0 && !early_304 {
            let now = host.now_ms();
            let due = self.poll_due_ms();
            if now >= due {
                self.poll_snapshot(host, now);
            } else {
                self.next_poll_ms = due;
            }
        }
    }

    /// The next snapshot request's path: a long poll (`wait_ms`) when configured, asking for
    /// other replicas' decisions (but this replica's own) when peers are enabled. `pool=1`: the
    /// updater's worker list is the whole pool (it follows discovery), and deltas name the
    /// workers that left; `health=1`: the workers Envoy's health checks dropped; `placement=1`:
    /// the workers' placements the updater discovered (site, zone, rack, node, with their age),
    /// in [`crate::wire::snapshot::Snapshot::placements`] and `Delta::placements`; with peers,
    /// `arrivals=1`: other replicas' loads with their arrival rates.
    /// `Router::apply_snapshot` / `apply_delta` take them in (`Some` in a delta: the new whole
    /// list).
    pub fn snapshot_path(&self) -> String {
        let mut path =
            format!("/v1/snapshot?since={}&pool=1&health=1&placement=1", self.publisher.version());
        if self.cfg.long_poll_ms > 0 {
            path.push_str(&format!("&wait_ms={}", self.cfg.long_poll_ms));
        }
        if self.forwarder.is_some() {
            path.push_str(&format!("&peers=1&arrivals=1&replica={}", self.replica));
        }
        path
    }

    /// When the next snapshot request may go out: at most one per `min_poll_gap_ms` on
    /// average, [`POLL_BURST`] at once (a pace kept as its theoretical arrival time).
    fn poll_due_ms(&self) -> u64 {
        let tolerance = (POLL_BURST - 1).saturating_mul(self.cfg.min_poll_gap_ms);
        self.poll_pace_ms.saturating_sub(tolerance)
    }

    fn poll_snapshot(&mut self, host: &mut dyn SyncHost, now: u64) {
        self.poll_pace_ms = self.poll_pace_ms.max(now).saturating_add(self.cfg.min_poll_gap_ms);
        if let Some(id) = read_replica(host.store()) {
            self.replica = id;
        }
        let path = self.snapshot_path();
        self.next_poll_ms = now.saturating_add(self.cfg.interval_ms);
        self.sent_ms = now;
        let timeout = self.cfg.timeout_ms.saturating_add(self.cfg.long_poll_ms);
        match host.dispatch(self.call("GET", &path, timeout)) {
            Some(t) => self.snapshot_call = Some(t),
            None => host.event(SyncEvent::SnapshotFailed(None)),
        }
    }

    /// Sends this replica's new decisions and changed loads, one report at a time.
    fn forward(&mut self, host: &mut dyn SyncHost, now: u64) {
        if self.peer_call.is_some() {
            return;
        }
        let Some(f) = self.forwarder.as_mut() else { return };
        let out = f.poll(host.store(), &Uncounted, self.replica, now);
        if out.dropped_hashes > 0 {
            host.event(SyncEvent::PeerHashesDropped(out.dropped_hashes));
        }
        let Some(report) = out.report else { return };
        let (timeout, body) = (f.config().timeout_ms, f.encode(&report));
        let mut call = self.call("POST", "/v1/peers", timeout);
        call.body = Some(body);
        let sent = host.dispatch(call);
        match sent {
            Some(t) => self.peer_call = Some(t),
            None => {
                host.event(SyncEvent::PeerFailed);
                if let Some(f) = self.forwarder.as_mut() {
                    f.failed();
                }
            }
        }
    }

    /// Polls the list when due, and asks for the next part when none is in flight.
    fn pump(&mut self, host: &mut dyn SyncHost, now: u64) {
        let Some(b) = self.bundles.as_mut() else { return };
        let limits = *b.fetcher.limits();
        if b.list_call.is_none() && now >= b.next_list_ms {
            b.next_list_ms = now.saturating_add(limits.list_interval_ms);
            b.last_list_ms = now;
            let call = Self::bare_call(&self.cfg, LIST_PATH, limits.timeout_ms);
            match host.dispatch(call) {
                Some(t) => b.list_call = Some(t),
                None => host.event(SyncEvent::ListFailed(ListFailure::NotSent)),
            }
        }
        if b.part_call.is_some() {
            return;
        }
        let (req, hk) = b.fetcher.next(host.store(), now);
        host.event(SyncEvent::Housekeeping(hk));
        let m = b.fetcher.manifest();
        host.event(SyncEvent::Stored { models: m.models.len(), bytes: m.stored_bytes() });
        let Some(req) = req else { return };
        let path = req.path();
        match host.dispatch(Self::bare_call(&self.cfg, &path, limits.timeout_ms)) {
            Some(t) => b.part_call = Some((t, req)),
            None => {
                let (fingerprint, part) = (req.fingerprint, req.part);
                host.event(SyncEvent::PartFailed { fingerprint, part, error: None });
                b.fetcher.failed(host.store(), req, now);
            }
        }
    }

    fn bare_call<'a>(cfg: &'a SnapshotSyncConfig, path: &'a str, timeout_ms: u64) -> Call<'a> {
        let headers = vec![
            (":method", "GET"),
            (":path", path),
            (":authority", cfg.authority.as_str()),
            ("x-kvroute-token", cfg.token.as_str()),
        ];
        Call { cluster: &cfg.cluster, headers, body: None, timeout_ms }
    }
}

impl BundleSync {
    fn list_answer(&mut self, host: &mut dyn SyncHost, body_size: usize) {
        let status = status_of(host.answer_header(":status"));
        if status != 200 {
            host.event(SyncEvent::ListFailed(ListFailure::Status(status)));
            return;
        }
        let body = host.answer_body(body_size).unwrap_or_default();
        match bundles::parse_list(&body) {
            Ok((list, bad)) => {
                if bad > 0 {
                    host.event(SyncEvent::ListMalformed(bad));
                }
                self.fetcher.set_wanted(host.store(), list);
            }
            Err(e) => host.event(SyncEvent::ListFailed(ListFailure::Invalid(e.to_string()))),
        }
    }

    fn part_answer(
        &mut self,
        host: &mut dyn SyncHost,
        req: PartRequest,
        body_size: usize,
        now: u64,
    ) {
        let status = status_of(host.answer_header(":status"));
        let parts = host.answer_header(PARTS_HEADER);
        let body = if status == 200 {
            host.answer_body(body_size).unwrap_or_default()
        } else {
            Vec::new()
        };
        // The singleton checks the transfer (each part's size, the whole bundle's checksum in
        // `BundleBlob::decode`, a compiled bundle's fingerprint) but does not build the
        // tokenizer: a build here would keep one more copy of it in this VM's memory for good.
        // Every thread checks the fingerprint when it builds the bundle; one that does not
        // match is refused there and retried with backoff.
        let named = req.fingerprint;
        let mut verify = |b: &BundleBlob| Ok(stated_fingerprint(b, named));
        let r = self.fetcher.received(
            host.store(),
            req,
            status,
            parts.as_deref(),
            &body,
            now,
            &mut verify,
        );
        match r {
            Ok(Progress::Stored) => host.event(SyncEvent::PartStored),
            Ok(Progress::Ignored) => {}
            Ok(Progress::Published { fingerprint, models, bytes }) => {
                host.event(SyncEvent::Published { fingerprint, models, bytes });
                let m = self.fetcher.manifest();
                host.event(SyncEvent::Stored { models: m.models.len(), bytes: m.stored_bytes() });
            }
            Err(e) => {
                let (fingerprint, part) = (req.fingerprint, req.part);
                host.event(SyncEvent::PartFailed { fingerprint, part, error: Some(e.to_string()) });
            }
        }
    }
}
