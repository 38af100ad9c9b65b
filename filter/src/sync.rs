//! The singleton (Envoy bootstrap wasm service, same `vm_id` as the filter): keeps one long
//! poll to the updater outstanding (re-sent as soon as it answers; the `interval_ms` tick is
//! the fallback after a failure) and publishes what it gets in shared data, where every worker
//! thread's filter picks it up when the version moves; forwards this replica's routing
//! decisions and load to the updater every `peers.forward_ms` (`kvroute_core::shared::peers`
//! says why there and not per request); and fetches the model bundles the updater serves, one
//! part per call, into shared data, where every thread builds its tokenizers from them. The
//! layout of what it publishes, and its checks, are `kvroute_core::shared::knowledge` and
//! `kvroute_core::shared::bundles`; this is the HTTP calls and the tick.

use std::time::Duration;

use kvroute_core::config::SnapshotSyncConfig;
use kvroute_core::shared::bundles::{
    self, Fetcher, Housekeeping, PartRequest, Progress, LIST_PATH, PARTS_HEADER,
};
use kvroute_core::shared::knowledge::{Publisher, Taken};
use kvroute_core::shared::peers::{read_replica, replica_id, Forwarder};
use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

use crate::host;
use crate::metrics::{count, count_n, BundleMetrics};
use crate::shared::HostStore;

/// The singleton reads the journal and load shards the threads write and count: what it
/// would count there (skips, dead shards) the threads count already.
struct Uncounted;

impl kvroute_core::shared::Counters for Uncounted {
    fn count(&self, _what: kvroute_core::shared::Counter, _n: u64) {}
}

/// Peer forwarding counters.
struct PeerMetrics {
    reports: Option<u32>,
    failures: Option<u32>,
    dropped: Option<u32>,
}

/// The bundle side of the singleton.
struct BundleSync {
    fetcher: Fetcher,
    list_call: Option<u32>,
    part_call: Option<(u32, PartRequest)>,
    next_list_ms: u64,
    last_list_ms: u64,
    metrics: BundleMetrics,
}

pub struct SnapshotSync {
    cfg: SnapshotSyncConfig,
    publisher: Publisher,
    snapshot_call: Option<u32>,
    bundles: Option<BundleSync>,
    fetched_full: Option<u32>,
    fetched_delta: Option<u32>,
    failed: Option<u32>,
    version_gauge: Option<u32>,
    /// This replica's decisions to the updater (`None`: peers disabled).
    forwarder: Option<Forwarder>,
    peer_call: Option<u32>,
    replica: u64,
    peer_metrics: PeerMetrics,
    /// When the fallback tick may send the next snapshot request, and pump bundles.
    next_poll_ms: u64,
    next_bundles_ms: u64,
    /// When the outstanding snapshot request was sent.
    sent_ms: u64,
}

impl SnapshotSync {
    pub fn new(cfg: SnapshotSyncConfig) -> Self {
        let c = MetricType::Counter;
        let bundles = cfg.bundles.enabled.then(|| BundleSync {
            fetcher: Fetcher::new(cfg.bundles, &HostStore),
            list_call: None,
            part_call: None,
            next_list_ms: 0,
            last_list_ms: 0,
            metrics: BundleMetrics::define_sync(),
        });
        let seed = xxhash_rust::xxh3::xxh3_64_with_seed(
            &host::now_nanos().to_le_bytes(),
            &cfg as *const SnapshotSyncConfig as usize as u64,
        );
        let replica = replica_id(&HostStore, seed);
        let forwarder = cfg.peers.enabled.then(|| Forwarder::new(&HostStore, cfg.peers));
        SnapshotSync {
            forwarder,
            peer_call: None,
            replica,
            peer_metrics: PeerMetrics {
                reports: hostcalls::define_metric(c, "kvroute.sync.peer_reports").ok(),
                failures: hostcalls::define_metric(c, "kvroute.sync.peer_report_failures").ok(),
                dropped: hostcalls::define_metric(c, "kvroute.sync.peer_hashes_dropped").ok(),
            },
            next_poll_ms: 0,
            next_bundles_ms: 0,
            sent_ms: 0,
            publisher: Publisher::default(),
            cfg,
            snapshot_call: None,
            bundles,
            fetched_full: hostcalls::define_metric(c, "kvroute.sync.full_snapshots").ok(),
            fetched_delta: hostcalls::define_metric(c, "kvroute.sync.deltas").ok(),
            failed: hostcalls::define_metric(c, "kvroute.sync.fetch_failures").ok(),
            version_gauge: hostcalls::define_metric(
                MetricType::Gauge,
                "kvroute.sync.snapshot_version",
            )
            .ok(),
        }
    }

    pub fn start(&self) {
        crate::thread::mark_sync_started();
        let tick = match &self.forwarder {
            Some(f) => self.cfg.interval_ms.min(f.config().forward_ms),
            None => self.cfg.interval_ms,
        };
        if !host::set_tick(tick) {
            log::error!("kvroute: snapshot sync cannot set its tick");
        }
    }

    pub fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if self.snapshot_call == Some(token) {
            self.snapshot_call = None;
            self.snapshot_answer(body_size);
            return;
        }
        if self.peer_call == Some(token) {
            self.peer_call = None;
            if status() == 204 {
                count(self.peer_metrics.reports);
            } else {
                count(self.peer_metrics.failures);
                if let Some(f) = self.forwarder.as_mut() {
                    f.failed();
                }
            }
            return;
        }
        let now = host::now_ms();
        let Some(b) = self.bundles.as_mut() else { return };
        if b.list_call == Some(token) {
            b.list_call = None;
            b.list_answer(body_size);
        } else if let Some((_, req)) = b.part_call.filter(|(t, _)| *t == token) {
            b.part_call = None;
            b.part_answer(req, body_size, now);
        } else {
            return;
        }
        // Callback-driven: the next part is asked for as soon as one arrives.
        b.pump(&self.cfg, now);
    }

    fn snapshot_answer(&mut self, body_size: usize) {
        let status = host::call_response_header(":status").unwrap_or_default();
        let taken = match status.as_slice() {
            b"304" => Ok(None),
            b"200" => {
                let body = host::call_response_body(body_size).unwrap_or_default();
                self.publisher.take(&HostStore, body).map(Some).map_err(|e| e.to_string())
            }
            other => Err(format!("updater answered {}", String::from_utf8_lossy(other))),
        };
        let answered = taken.is_ok();
        let early_304 = status.as_slice() == b"304"
            && host::now_ms().saturating_sub(self.sent_ms) < self.cfg.long_poll_ms / 2;
        match taken {
            Ok(kind) => {
                count(match kind {
                    Some(Taken::Full) => self.fetched_full,
                    Some(Taken::Delta) => self.fetched_delta,
                    None => None,
                });
                self.publisher.confirmed(&HostStore, host::now_ms());
                if let Some(id) = self.version_gauge {
                    let _ = hostcalls::record_metric(id, self.publisher.head().version);
                }
                // A snapshot naming a bundle the singleton does not know asks for the list now.
                if let Some(b) = self.bundles.as_mut() {
                    if self.publisher.models().iter().any(|m| !b.fetcher.knows(m.fingerprint)) {
                        // At most twice a second, should the list never name it.
                        b.next_list_ms = b.next_list_ms.min(b.last_list_ms.saturating_add(500));
                    }
                }
            }
            Err(e) => {
                log::debug!("kvroute: snapshot sync: {e}");
                count(self.failed);
            }
        }
        // The long poll goes out again at once; after a failure (or a 304 long before the
        // wait: an updater without long polls) the tick sends the next one.
        if answered && self.cfg.long_poll_ms > 0 && !early_304 {
            self.poll_snapshot(host::now_ms());
        }
    }

    /// Sends the next snapshot request: a long poll (`wait_ms`) when configured, asking for
    /// other replicas' decisions (but this replica's own) when peers are enabled.
    fn poll_snapshot(&mut self, now: u64) {
        if let Some(id) = read_replica(&HostStore) {
            self.replica = id;
        }
        // `pool=1`: the updater's worker list is the whole pool (it follows discovery), and
        // deltas name the workers that left; `health=1`: the workers Envoy's health checks
        // dropped (decisions leave them out).
        let mut path = format!("/v1/snapshot?since={}&pool=1&health=1", self.publisher.version());
        if self.cfg.long_poll_ms > 0 {
            path.push_str(&format!("&wait_ms={}", self.cfg.long_poll_ms));
        }
        if self.forwarder.is_some() {
            path.push_str(&format!("&peers=1&replica={}", self.replica));
        }
        self.next_poll_ms = now.saturating_add(self.cfg.interval_ms);
        self.sent_ms = now;
        let timeout = self.cfg.timeout_ms.saturating_add(self.cfg.long_poll_ms);
        match dispatch(&self.cfg, &path, timeout) {
            Some(t) => self.snapshot_call = Some(t),
            None => count(self.failed),
        }
    }

    /// Sends this replica's new decisions and changed loads, one report at a time.
    fn forward(&mut self, now: u64) {
        let Some(f) = self.forwarder.as_mut() else { return };
        if self.peer_call.is_some() {
            return;
        }
        let out = f.poll(&HostStore, &Uncounted, self.replica, now);
        count_n(self.peer_metrics.dropped, out.dropped_hashes as usize);
        let Some(report) = out.report else { return };
        let headers = vec![
            (":method", "POST"),
            (":path", "/v1/peers"),
            (":authority", self.cfg.authority.as_str()),
            ("x-kvroute-token", self.cfg.token.as_str()),
            ("content-type", "application/octet-stream"),
        ];
        let body = report.encode();
        let timeout = Duration::from_millis(f.config().timeout_ms);
        match hostcalls::dispatch_http_call(
            &self.cfg.cluster,
            headers,
            Some(&body),
            vec![],
            timeout,
        ) {
            Ok(t) => self.peer_call = Some(t),
            Err(_) => {
                count(self.peer_metrics.failures);
                f.failed();
            }
        }
    }

    pub fn on_tick(&mut self) {
        let now = host::now_ms();
        self.forward(now);
        if self.snapshot_call.is_none() && now >= self.next_poll_ms {
            self.poll_snapshot(now);
        }
        if now >= self.next_bundles_ms {
            self.next_bundles_ms = now.saturating_add(self.cfg.interval_ms);
            if let Some(b) = self.bundles.as_mut() {
                b.pump(&self.cfg, now);
            }
        }
    }
}

/// `GET path` to the updater with the token; the call's token, `None` if it could not be sent.
fn dispatch(cfg: &SnapshotSyncConfig, path: &str, timeout_ms: u64) -> Option<u32> {
    let headers = vec![
        (":method", "GET"),
        (":path", path),
        (":authority", cfg.authority.as_str()),
        ("x-kvroute-token", cfg.token.as_str()),
    ];
    let timeout = Duration::from_millis(timeout_ms);
    hostcalls::dispatch_http_call(&cfg.cluster, headers, None, vec![], timeout).ok()
}

fn status() -> u16 {
    host::call_response_header(":status")
        .and_then(|s| std::str::from_utf8(&s).ok()?.parse().ok())
        .unwrap_or(0)
}

impl BundleSync {
    /// Polls the list when due, and asks for the next part when none is in flight.
    fn pump(&mut self, cfg: &SnapshotSyncConfig, now: u64) {
        let limits = *self.fetcher.limits();
        if self.list_call.is_none() && now >= self.next_list_ms {
            self.next_list_ms = now.saturating_add(limits.list_interval_ms);
            self.last_list_ms = now;
            match dispatch(cfg, LIST_PATH, limits.timeout_ms) {
                Some(t) => self.list_call = Some(t),
                None => count(self.metrics.list_failures),
            }
        }
        if self.part_call.is_some() {
            return;
        }
        let (req, hk) = self.fetcher.next(&HostStore, now);
        self.housekeeping(hk);
        let Some(req) = req else { return };
        match dispatch(cfg, &req.path(), limits.timeout_ms) {
            Some(t) => self.part_call = Some((t, req)),
            None => {
                count(self.metrics.fetch_failures);
                self.fetcher.failed(&HostStore, req, now);
            }
        }
    }

    fn housekeeping(&self, hk: Housekeeping) {
        count_n(self.metrics.removed, hk.removed);
        count_n(self.metrics.capped, hk.capped);
        if hk.capped > 0 {
            log::warn!(
                "kvroute: {} bundle(s) left out by snapshot_sync.bundles max_bundles / \
                 max_total_bytes",
                hk.capped
            );
        }
        self.metrics.stored(self.fetcher.manifest());
    }

    fn list_answer(&mut self, body_size: usize) {
        let status = status();
        if status != 200 {
            log::debug!("kvroute: bundle list: updater answered {status}");
            count(self.metrics.list_failures);
            return;
        }
        let body = host::call_response_body(body_size).unwrap_or_default();
        match bundles::parse_list(&body) {
            Ok((list, bad)) => {
                if bad > 0 {
                    log::warn!("kvroute: bundle list: {bad} malformed entries left out");
                }
                self.fetcher.set_wanted(&HostStore, list);
            }
            Err(e) => {
                log::warn!("kvroute: bundle list: {e}");
                count(self.metrics.list_failures);
            }
        }
    }

    fn part_answer(&mut self, req: PartRequest, body_size: usize, now: u64) {
        let status = status();
        let parts = host::call_response_header(PARTS_HEADER);
        let body = if status == 200 {
            host::call_response_body(body_size).unwrap_or_default()
        } else {
            Vec::new()
        };
        // The singleton checks the transfer (each part's size, the whole bundle's checksum in
        // `BundleFiles::decode`) but does not build the tokenizer: a build here would keep one
        // more copy of it (about 115 MiB for Qwen3) in this VM's memory for good. Every thread
        // checks the fingerprint when it builds the bundle; one that does not match is refused
        // there (`kvroute_bundles_build_failures`) and retried with backoff.
        let named = req.fingerprint;
        let mut verify = |_: &kvroute_core::bundle::BundleFiles| Ok(named);
        let r = self.fetcher.received(
            &HostStore,
            req,
            status,
            parts.as_deref(),
            &body,
            now,
            &mut verify,
        );
        match r {
            Ok(Progress::Stored) => count(self.metrics.parts_fetched),
            Ok(Progress::Ignored) => {}
            Ok(Progress::Published { fingerprint, models, bytes }) => {
                count(self.metrics.parts_fetched);
                count(self.metrics.published);
                self.metrics.stored(self.fetcher.manifest());
                log::info!(
                    "kvroute: bundle {fingerprint:016x} ({bytes} bytes) received, checksum \
                     verified, published for {}",
                    models.join(",")
                );
            }
            Err(e) => {
                count(self.metrics.fetch_failures);
                log::warn!(
                    "kvroute: bundle {:016x} part {}: {e}; retrying later",
                    req.fingerprint,
                    req.part
                );
            }
        }
    }
}
