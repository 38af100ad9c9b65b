//! The singleton (Envoy bootstrap wasm service, same `vm_id` as the filter): keeps one long
//! poll to the updater outstanding (re-sent as soon as it answers; the `interval_ms` tick is
//! the fallback after a failure) and publishes what it gets in shared data, where every worker
//! thread's filter picks it up when the version moves; forwards this replica's routing
//! decisions and load to the updater every `peers.forward_ms` (`kvroute_core::shared::peers`
//! says why there and not per request); and fetches the model bundles the updater serves, one
//! part per call, into shared data, where every thread builds its tokenizers from them.
//!
//! When to do what is `kvroute_core::flow::sync`; the layout of what it publishes, and its
//! checks, are `kvroute_core::shared::knowledge` and `kvroute_core::shared::bundles`. This is
//! the host under it ([`Host`]: shared data, the HTTP calls, the clock) and its stats and logs.

use std::collections::HashMap;

use kvroute_core::decision::config::SnapshotSyncConfig;
use kvroute_core::flow::sync::{Call, ListFailure, SyncEvent, SyncFlow, SyncHost};
use kvroute_core::shared::knowledge::Taken;
use kvroute_core::shared::wake::{self, WakePace};
use kvroute_core::shared::{load, SharedStore};
use proxy_wasm::types::{Bytes, MetricType};

use crate::host::{Buffer, Host, Map, Proxy};

/// The singleton's stats.
#[derive(Debug)]
struct SyncMetrics {
    full: Option<u32>,
    delta: Option<u32>,
    failed: Option<u32>,
    version: Option<u32>,
    peer_reports: Option<u32>,
    peer_failures: Option<u32>,
    peer_dropped: Option<u32>,
    parts_fetched: Option<u32>,
    published: Option<u32>,
    fetch_failures: Option<u32>,
    list_failures: Option<u32>,
    removed: Option<u32>,
    capped: Option<u32>,
    available: Option<u32>,
    stored_bytes: Option<u32>,
    wakes: Option<u32>,
}

impl SyncMetrics {
    fn define<H: Host>(host: &H) -> Self {
        let c = |name| host.define_metric(MetricType::Counter, name);
        let g = |name| host.define_metric(MetricType::Gauge, name);
        SyncMetrics {
            full: c("kvroute.sync.full_snapshots"),
            delta: c("kvroute.sync.deltas"),
            failed: c("kvroute.sync.fetch_failures"),
            version: g("kvroute.sync.snapshot_version"),
            peer_reports: c("kvroute.sync.peer_reports"),
            peer_failures: c("kvroute.sync.peer_report_failures"),
            peer_dropped: c("kvroute.sync.peer_hashes_dropped"),
            parts_fetched: c("kvroute.bundles.parts_fetched"),
            published: c("kvroute.bundles.published"),
            fetch_failures: c("kvroute.bundles.fetch_failures"),
            list_failures: c("kvroute.bundles.list_failures"),
            removed: c("kvroute.bundles.removed"),
            capped: c("kvroute.bundles.capped"),
            available: g("kvroute.bundles.available"),
            stored_bytes: g("kvroute.bundles.stored_bytes"),
            wakes: c("kvroute.sync.thread_wakes"),
        }
    }
}

/// The scheduler's view of the host: `H` plus the stats and logs of what it reports.
struct Glue<'a, H: Host> {
    host: &'a H,
    metrics: &'a SyncMetrics,
    /// Whether this call published knowledge (a snapshot or a delta).
    published: bool,
}

impl<H: Host> Glue<'_, H> {
    fn add(&self, id: Option<u32>, n: u64) {
        if let (Some(id), true) = (id, n > 0) {
            self.host.increment_metric(id, n);
        }
    }

    fn set(&self, id: Option<u32>, v: u64) {
        if let Some(id) = id {
            self.host.record_metric(id, v);
        }
    }
}

impl<H: Host> SyncHost for Glue<'_, H> {
    fn store(&self) -> &dyn SharedStore {
        self.host
    }

    fn now_ms(&self) -> u64 {
        self.host.now_ms()
    }

    fn dispatch(&mut self, call: Call<'_>) -> Option<u32> {
        self.host.dispatch(call.cluster, call.headers, call.body.as_deref(), call.timeout_ms)
    }

    fn answer_header(&self, name: &str) -> Option<Bytes> {
        self.host.header(Map::CallResponse, name)
    }

    fn answer_body(&self, size: usize) -> Option<Bytes> {
        self.host.body(Buffer::CallResponse, size)
    }

    fn event(&mut self, event: SyncEvent) {
        let m = self.metrics;
        match event {
            SyncEvent::Snapshot(kind) => {
                self.published |= kind.is_some();
                self.add(
                    match kind {
                        Some(Taken::Full) => m.full,
                        Some(Taken::Delta) => m.delta,
                        None => None,
                    },
                    1,
                )
            }
            SyncEvent::Version(v) => self.set(m.version, v),
            SyncEvent::SnapshotFailed(why) => {
                if let Some(e) = why {
                    log::debug!("kvroute: snapshot sync: {e}");
                }
                self.add(m.failed, 1);
            }
            SyncEvent::PeerReport => self.add(m.peer_reports, 1),
            SyncEvent::PeerFailed => self.add(m.peer_failures, 1),
            SyncEvent::PeerFormatDowngraded => {
                log::warn!(
                    "kvroute: the updater refused a peer report with arrivals: sending them \
                     without from now on (update the updater)"
                )
            }
            SyncEvent::PeerHashesDropped(n) => self.add(m.peer_dropped, n),
            SyncEvent::ListFailed(why) => {
                match why {
                    ListFailure::NotSent => {}
                    ListFailure::Status(s) => {
                        log::debug!("kvroute: bundle list: updater answered {s}")
                    }
                    ListFailure::Invalid(e) => log::warn!("kvroute: bundle list: {e}"),
                }
                self.add(m.list_failures, 1);
            }
            SyncEvent::ListMalformed(bad) => {
                log::warn!("kvroute: bundle list: {bad} malformed entries left out");
            }
            SyncEvent::PartStored => self.add(m.parts_fetched, 1),
            SyncEvent::PartFailed { fingerprint, part, error } => {
                if let Some(e) = error {
                    log::warn!(
                        "kvroute: bundle {fingerprint:016x} part {part}: {e}; retrying later"
                    );
                }
                self.add(m.fetch_failures, 1);
            }
            SyncEvent::Published { fingerprint, models, bytes } => {
                self.add(m.parts_fetched, 1);
                self.add(m.published, 1);
                log::info!(
                    "kvroute: bundle {fingerprint:016x} ({bytes} bytes) received, checksum \
                     verified, published for {}",
                    models.join(",")
                );
            }
            SyncEvent::Housekeeping(hk) => {
                self.add(m.removed, hk.removed as u64);
                self.add(m.capped, hk.capped as u64);
                if hk.capped > 0 {
                    log::warn!(
                        "kvroute: {} bundle(s) left out by snapshot_sync.bundles max_bundles / \
                         max_total_bytes",
                        hk.capped
                    );
                }
            }
            SyncEvent::Stored { models, bytes } => {
                self.set(m.available, models as u64);
                self.set(m.stored_bytes, bytes);
            }
        }
    }
}

/// The singleton's side of `kvroute_core::shared::wake`: after it publishes knowledge, a
/// one-byte message to the queue of every thread the load registry lists, paced by
/// [`WakePace`].
#[derive(Debug, Default)]
struct Waker {
    /// This VM's id (`plugin_vm_id`), in which the threads register their queues; `None`: the
    /// host does not say, and no thread is woken.
    vm_id: Option<String>,
    pace: WakePace,
    /// Queue ids by load shard, each resolved once.
    queues: HashMap<u32, u32>,
}

impl Waker {
    fn new<H: Host>(host: &H) -> Waker {
        let vm_id = host.property(&["plugin_vm_id"]).and_then(|b| String::from_utf8(b).ok());
        Waker { vm_id, ..Waker::default() }
    }

    /// After a call (`published`: it published knowledge) or a tick: wakes the threads when
    /// the pace allows; how many queues got a message.
    fn after<H: Host>(&mut self, host: &H, published: bool) -> u64 {
        let now = host.now_ms();
        let due = if published { self.pace.published(now) } else { self.pace.tick(now) };
        if !due {
            return 0;
        }
        let Some(vm_id) = self.vm_id.as_deref() else { return 0 };
        let shards = load::listed(host);
        self.queues.retain(|s, _| shards.contains(s));
        let mut woken = 0;
        for shard in shards {
            let queue = match self.queues.get(&shard) {
                Some(&q) => q,
                // A thread that registered no queue (yet) is left to its requests and ticks.
                None => match host.resolve_queue(vm_id, &wake::queue_name(shard)) {
                    Some(q) => *self.queues.entry(shard).or_insert(q),
                    None => continue,
                },
            };
            if host.enqueue(queue, wake::MESSAGE) {
                woken += 1;
            } else {
                self.queues.remove(&shard);
            }
        }
        woken
    }
}

/// The singleton over host `H` (Envoy's: [`Proxy`]).
pub struct SnapshotSync<H: Host = Proxy> {
    host: H,
    flow: SyncFlow,
    metrics: SyncMetrics,
    waker: Waker,
}

impl SnapshotSync<Proxy> {
    pub fn new(cfg: SnapshotSyncConfig) -> Self {
        Self::with_host(Proxy, cfg)
    }
}

impl<H: Host> SnapshotSync<H> {
    pub fn with_host(host: H, cfg: SnapshotSyncConfig) -> Self {
        let metrics = SyncMetrics::define(&host);
        let seed = xxhash_rust::xxh3::xxh3_64_with_seed(
            &host.now_nanos().to_le_bytes(),
            &cfg as *const SnapshotSyncConfig as usize as u64,
        );
        let flow =
            SyncFlow::new(cfg, &Glue { host: &host, metrics: &metrics, published: false }, seed);
        let waker = Waker::new(&host);
        SnapshotSync { host, flow, metrics, waker }
    }

    /// Marks that the singleton started (see [`crate::thread`]) and sets its tick.
    pub fn start(&self) {
        crate::thread::mark_started(&self.host);
        if !self.host.set_tick(self.flow.tick_ms()) {
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
        let mut glue = Glue { host: &self.host, metrics: &self.metrics, published: false };
        self.flow.on_answer(&mut glue, token, body_size);
        let published = glue.published;
        self.wake(published);
    }

    pub fn on_tick(&mut self) {
        let mut glue = Glue { host: &self.host, metrics: &self.metrics, published: false };
        self.flow.on_tick(&mut glue);
        let published = glue.published;
        self.wake(published);
    }

    fn wake(&mut self, published: bool) {
        let woken = self.waker.after(&self.host, published);
        if let (Some(id), true) = (self.metrics.wakes, woken > 0) {
            self.host.increment_metric(id, woken);
        }
    }

    pub fn host(&self) -> &H {
        &self.host
    }
}

#[cfg(test)]
mod tests;
