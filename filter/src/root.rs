//! The root context: one per Envoy worker thread. Turns the plugin configuration into a router;
//! a bad configuration makes Envoy reject the filter, with the reason in its log. Each thread
//! also ticks: it refreshes knowledge off the request path, heartbeats its load shard, expires
//! leases and reconciles its load with what workers report.

use std::cell::RefCell;
use std::rc::Rc;

use kvroute_core::decision::config::{FilterConfig, SnapshotSyncConfig};
use kvroute_core::decision::misdeploy::{Symptom, Watch};
use kvroute_core::decision::request::ParsedRequest;
use kvroute_core::decision::router::{Decision, Router};
use kvroute_core::flow::claim::{self, Claim};
use kvroute_core::shared::bundles::BundleFollower;
use kvroute_core::shared::epoch::Epoch;
use kvroute_core::shared::health::{self, Failure, HealthRecord};
use kvroute_core::shared::journal::{self, JournalCursor};
use kvroute_core::shared::knowledge::{Follower, Head};
use kvroute_core::shared::load::{AtPriority, LoadView, Shard};
use kvroute_core::shared::readiness;
use kvroute_core::shared::wake;
use kvroute_core::shared::{Counter, Counters};
use kvroute_core::wire::journal::JournalEntry;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

use crate::host;
use crate::http::KvHttp;
use crate::metrics::{count, Metrics};
use crate::shared::HostStore;
use crate::sync::SnapshotSync;
use crate::waiting::Waiting;

/// How many request-path polls' worth of journal a tick may apply.
const TICK_POLLS: usize = 8;

/// What every request context of a thread shares.
pub struct ThreadState {
    pub config: FilterConfig,
    pub router: RefCell<Router>,
    cursor: RefCell<JournalCursor>,
    follower: RefCell<Follower>,
    pub shard: RefCell<Shard>,
    pub metrics: Metrics,
    /// Bundles of the models fed by the updater, built from shared data on the tick.
    bundles: RefCell<BundleFollower>,
    /// Online calibration: pending samples and the shared state's view.
    pub calib: RefCell<crate::calib::CalibThread>,
    /// Whether this VM has made an HTTP context.
    pub serving: std::cell::Cell<bool>,
    /// Whether this root context runs on one of Envoy's worker threads (see
    /// [`crate::thread::Placement`]): those build their bundles on their first ticks, before
    /// they serve; Envoy's main thread, which never serves, builds none (for Qwen3 about
    /// 115 MiB of wasm memory, kept for good).
    placement: crate::thread::Placement,
    /// This Envoy's replica id (shared data), so that its own decisions relayed by the
    /// updater are not counted twice.
    replica: std::cell::Cell<u64>,
    /// Signs of a misdeployment seen by this thread (`kvroute_core::decision::misdeploy`).
    pub watch: RefCell<Watch>,
    /// Requests paused for their body; the tick passes on those that wait too long.
    pub waiting: Waiting,
    /// The symptoms this thread last reported in its gauges (bit per `Symptom::ALL` entry).
    reported: std::cell::Cell<u8>,
    /// This thread's shared queue, by which the singleton wakes it when it publishes knowledge:
    /// registered on a worker thread (never on Envoy's main thread, which does not serve).
    wake_queue: std::cell::Cell<Option<u32>>,
}

/// When a thread catches up on the knowledge published since its last catch-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Catch {
    /// Before a decision: bounded (deltas only, one poll of journal, the time budget).
    Request,
    /// After a decided stream's end, where no request waits: bounded as on a request, so
    /// that a burst of stream ends cannot hold the thread's next requests for long.
    StreamEnd,
    /// On the tick: no time limit, more journal polls, and a full snapshot when needed.
    Tick,
    /// The singleton woke the thread (it published knowledge; `kvroute_core::shared::wake`):
    /// bounded as on a request.
    Wake,
}

impl Catch {
    /// The kind under which the journal entries applied here are counted
    /// (`kvroute_knowledge_updates{kvroute_kind="journal_request"}` and so on).
    pub const JOURNAL_KINDS: [&'static str; 4] =
        ["journal_request", "journal_stream_end", "journal_tick", "journal_wake"];

    /// The kind under which the updater's deltas applied on a wake are counted (besides
    /// `delta`, which counts them all).
    pub const DELTA_WAKE: &'static str = "delta_wake";

    /// The kind under which requests are counted that left waiting deltas to their wake, about
    /// to be sent or already queued for their thread (see [`ThreadState::catch_up`]).
    pub const DELTA_DEFERRED: &'static str = "delta_deferred";

    fn journal_kind(self) -> &'static str {
        let [request, stream_end, tick, wake] = Catch::JOURNAL_KINDS;
        match self {
            Catch::Request => request,
            Catch::StreamEnd => stream_end,
            Catch::Tick => tick,
            Catch::Wake => wake,
        }
    }
}

impl ThreadState {
    /// Applies knowledge journaled by every thread since the last call, and the updater's
    /// snapshot when its version moved. Outside the tick the work is bounded: at most one
    /// poll of journal, deltas only (a thread with no knowledge yet may read the full snapshot),
    /// and `knowledge.catch_up_budget_us` of time, checked after each delta and entry.
    /// Returns the time spent on the journal (ns; the rest was the updater's knowledge).
    pub fn catch_up(&self, when: Catch) -> u64 {
        let bounded = when != Catch::Tick;
        let limit = self.config.journal.max_hashes_per_poll;
        let polls = if bounded { 1 } else { TICK_POLLS };
        let budget_ns = self.config.knowledge.catch_up_budget_us.saturating_mul(1000);
        let deadline =
            (bounded && budget_ns > 0).then(|| host::now_nanos().saturating_add(budget_ns));
        let mut go_on = || deadline.is_none_or(|d| host::now_nanos() < d);
        let mut router = self.router.borrow_mut();
        let mut follower = self.follower.borrow_mut();
        let allow_full = !bounded || follower.version() == 0;
        let done = if when == Catch::Request {
            // Deltas the singleton has just published are applied by their wake (about to be
            // sent, or still queued for this thread), right after this request, not before it.
            let due = &mut |h: &Head| {
                let woken = self.wake_queue.get().is_some();
                woken && (wake::just_published(h.checked_at_ms, host::now_ms()) || self.wake_due())
            };
            follower.catch_up_or_defer(&HostStore, &self.metrics, &mut router, &mut go_on, due)
        } else {
            follower.catch_up_within(&HostStore, &self.metrics, &mut router, allow_full, &mut go_on)
        };
        self.metrics.knowledge_updates(Catch::DELTA_DEFERRED, done.deferred);
        self.metrics.knowledge_updates("delta", done.deltas);
        if when == Catch::Wake {
            self.metrics.knowledge_updates(Catch::DELTA_WAKE, done.deltas);
        }
        self.metrics.knowledge_updates("full", done.full);
        let journal_from = host::now_nanos();
        let mut cursor = self.cursor.borrow_mut();
        let mut applied = 0;
        for _ in 0..polls {
            let more = cursor.each(&HostStore, &self.metrics, limit, |e| {
                router.apply_journal(&e);
                applied += 1;
                go_on()
            });
            if !more {
                break;
            }
        }
        self.metrics.knowledge_updates(when.journal_kind(), applied);
        host::now_nanos().saturating_sub(journal_from)
    }

    /// Whether a wake is queued for this thread: its catch-up then runs as soon as the current
    /// callback returns. The message is taken to find out, so it is put back for that
    /// catch-up (Envoy calls `on_queue_ready` once per message enqueued).
    fn wake_due(&self) -> bool {
        let Some(queue) = self.wake_queue.get() else { return false };
        if host::dequeue(queue).is_none() {
            return false;
        }
        host::enqueue(queue, wake::MESSAGE)
    }

    /// The router-tracked load of every worker, across all live threads.
    pub fn load_view(&self, now_ms: u64) -> LoadView {
        LoadView::read(&HostStore, &self.metrics, &self.shard.borrow(), now_ms)
    }

    /// The decision epoch, read before a decision's load view when decisions are ordered
    /// (`load.order_decisions`).
    pub fn decision_epoch(&self) -> Option<Epoch> {
        self.config.load.order_decisions.then(|| Epoch::read(&HostStore))
    }

    /// Writes `decision`'s request into this thread's load shard, ordered against the other
    /// threads' decisions since `epoch` (ranked again on a fresh view when one came between;
    /// see `kvroute_core::flow::claim`), at the engine priority it is sent with. `pick` is the
    /// decision's random draw.
    pub fn claim(
        &self,
        epoch: Option<Epoch>,
        (decision, priority): (&mut Decision, i32),
        req: &ParsedRequest,
        now_ms: u64,
        pick: u64,
    ) -> Option<Claim> {
        let router = self.router.borrow();
        let rerank = |d: &Decision, view: &LoadView| {
            router.rerank(req, d, &AtPriority { view, priority }, now_ms, pick)
        };
        let mut shard = self.shard.borrow_mut();
        let (c, ordered) = claim::claim(
            &HostStore,
            &self.metrics,
            &mut shard,
            epoch,
            decision,
            priority,
            now_ms,
            rerank,
        );
        self.metrics.ordered(ordered);
        c
    }

    /// Takes back the claim of a request not sent after all, and writes the shard.
    pub fn release(&self, c: Option<Claim>, now_ms: u64) {
        if let Some(c) = c {
            claim::end(&mut self.shard.borrow_mut(), c);
            self.flush_load(now_ms);
        }
    }

    /// Writes this thread's shard after a change.
    pub fn flush_load(&self, now_ms: u64) {
        self.shard.borrow().flush(&HostStore, &self.metrics, now_ms);
    }

    /// Leaves the workers that are down now (shared passive health) out of this thread's
    /// decisions; returns the record read, for the probe claim after the decision.
    pub fn refresh_health(&self, now_ms: u64) -> HealthRecord {
        if !self.config.health.enabled {
            return HealthRecord::default();
        }
        let h = HealthRecord::read(&HostStore);
        let mut router = self.router.borrow_mut();
        // A sign of life: the updater scraped the worker's load since it went down (without
        // load reports for it, the backoff alone decides).
        let seen: Vec<(String, Option<u64>)> =
            h.tracked().map(|w| (w.to_owned(), router.knowledge().load_seen_at(w))).collect();
        let alive_since = |w: &str, since: u64| {
            seen.iter().find(|(x, _)| x == w).is_none_or(|(_, at)| at.is_none_or(|t| t > since))
        };
        let out: Vec<&str> = h.out(now_ms, alive_since).collect();
        router.set_down(out.iter().copied());
        drop(router);
        h
    }

    /// `worker` failed a request: down for a backoff on every thread (counted once per
    /// ejection, not per request in flight).
    pub fn worker_failed(&self, worker: &str, now_ms: u64, why: &str) {
        if !self.config.health.enabled {
            return;
        }
        match health::report_failure(&HostStore, &self.config.health, worker, now_ms) {
            Ok(Failure::Ejected { failures, backoff_ms }) => {
                self.metrics.ejected(worker);
                log::warn!(
                    "kvroute: worker {worker} down for {backoff_ms} ms ({why}; failure {failures} in a row)"
                );
            }
            Ok(_) => {}
            Err(_) => Counters::count(&self.metrics, Counter::LostUpdate, 1),
        }
    }

    /// `worker` answered a request: a half-open or probed worker is up again.
    pub fn worker_answered(&self, worker: &str, now_ms: u64) {
        if !self.config.health.enabled {
            return;
        }
        if let Ok(true) = health::report_answer(&HostStore, worker, now_ms) {
            self.metrics.recovered(worker);
            log::info!("kvroute: worker {worker} answered again: up");
        }
    }

    /// The decision picked `worker`: if its backoff ran out (`h`, read before deciding), this
    /// request is its probe.
    pub fn maybe_probe(&self, h: &HealthRecord, worker: &str, now_ms: u64) {
        if h.half_open(worker, now_ms) {
            let _ = health::claim_probe(&HostStore, &self.config.health, worker, now_ms);
        }
    }

    /// Journals an observation for every thread (including this one) to apply.
    pub fn publish(&self, entry: JournalEntry) {
        journal::append(&HostStore, &self.metrics, &self.config.journal, entry);
    }

    /// Builds a bundle the manifest names that this thread does not have yet (at most one per
    /// tick: building a 151 k-token tokenizer takes a while), and swaps the router's bundles
    /// of the models whose bundle changed. Never on the request path; decisions already made
    /// keep the hashes they were made with.
    fn refresh_bundles(&self, now_ms: u64) {
        let mut follower = self.bundles.borrow_mut();
        if follower.is_empty() {
            return;
        }
        let started = host::now_nanos();
        let memory_before = host::wasm_memory_bytes();
        let t = follower.tick(&HostStore, now_ms);
        if let Some((fp, bytes)) = t.built {
            let ms = host::now_nanos().saturating_sub(started) / 1_000_000;
            self.metrics.bundles.built(ms);
            log::info!(
                "kvroute: built bundle {fp:016x} ({bytes} bytes) in {ms} ms; VM memory {} -> {} MiB",
                memory_before >> 20,
                host::wasm_memory_bytes() >> 20
            );
        }
        if let Some((fp, why)) = &t.failed {
            count(self.metrics.bundles.build_failures);
            log::warn!("kvroute: bundle {fp:016x} does not build here ({why}); retrying later");
        }
        if t.changed.is_empty() {
            return;
        }
        let mut router = self.router.borrow_mut();
        for (model, bundle) in t.changed {
            match &bundle {
                Some(b) => {
                    log::info!("kvroute: model {model} uses bundle {:016x}", b.fingerprint())
                }
                None => log::warn!("kvroute: model {model} has no bundle; routed load-only"),
            }
            router.set_bundle(&model, bundle);
        }
    }

    /// Takes the replica id from shared data (created once per Envoy process; a racing first
    /// write may replace another thread's).
    fn refresh_replica(&self) {
        let id = kvroute_core::shared::peers::read_replica(&HostStore)
            .unwrap_or_else(|| kvroute_core::shared::peers::replica_id(&HostStore, self.seed()));
        if id != self.replica.get() {
            self.replica.set(id);
            self.router.borrow_mut().knowledge_mut().set_replica(id);
        }
    }

    fn seed(&self) -> u64 {
        let at = self as *const Self as usize as u64;
        xxhash_rust::xxh3::xxh3_64_with_seed(&host::now_nanos().to_le_bytes(), at)
    }

    /// Passes on requests that waited too long for their body, and makes misdeployment loud:
    /// a gauge per symptom (written when this thread's view changes), a warning at most once
    /// per `misdeployment.warn_interval_ms`.
    fn misdeploy_tick(&self, root_id: u32, now_ms: u64) {
        let mut watch = self.watch.borrow_mut();
        for why in self.waiting.resume_expired(&HostStore, &mut watch, root_id, now_ms) {
            self.metrics.unrouted(why);
        }
        watch.knowledge(self.follower.borrow().version() > 0);
        let mut bits = 0u8;
        for (i, s) in Symptom::ALL.into_iter().enumerate() {
            if watch.has(s, now_ms) {
                bits |= 1 << i;
            }
        }
        if bits != self.reported.get() {
            for (i, s) in Symptom::ALL.into_iter().enumerate() {
                self.metrics.misdeployed(s, bits & (1 << i) != 0);
            }
            self.reported.set(bits);
        }
        let interval = watch.config().warn_interval_ms;
        for s in watch.warnings_due(now_ms) {
            if kvroute_core::shared::misdeploy::claim_warning(&HostStore, s, now_ms, interval) {
                log::warn!("kvroute: misdeployed ({}): {}", s.name(), s.advice());
            }
        }
    }

    /// Whether this root context is on a worker thread: it has served, or Envoy placed it
    /// there.
    fn on_worker_thread(&self) -> bool {
        self.serving.get() || self.placement.worker()
    }

    /// A worker thread marks what it can do; Envoy's main thread (never counted) sets the
    /// readiness gauges from the fresh marks, so a VM that died leaves them within a few ticks.
    fn readiness_tick(&self, now_ms: u64) {
        if self.on_worker_thread() {
            let bundled = self.bundles.borrow().complete();
            let ready = bundled && self.follower.borrow().version() > 0;
            let id = self.shard.borrow().id();
            readiness::mark(&HostStore, id, readiness::Mark { bundled, ready, at_ms: now_ms });
        } else {
            let fresh_ms = self.config.tick_ms.saturating_mul(8).max(2_000);
            let (bundled, ready) = readiness::count(&HostStore, now_ms, fresh_ms);
            self.metrics.threads(bundled, ready);
        }
    }

    /// Takes this thread out of the readiness count (its VM goes away).
    pub fn retire(&self) {
        if self.on_worker_thread() {
            readiness::clear(&HostStore, self.shard.borrow().id());
        }
    }

    /// Housekeeping, every `tick_ms`.
    pub fn tick(&self, root_id: u32, now_ms: u64) {
        self.misdeploy_tick(root_id, now_ms);
        if self.on_worker_thread() {
            self.refresh_bundles(now_ms);
        }
        self.catch_up(Catch::Tick);
        // Tables grow here, so that a request's catch-up does not pay for a whole copy.
        self.router.borrow_mut().make_room();
        self.refresh_replica();
        self.calibration_tick(now_ms);
        let view = self.load_view(now_ms);
        let mut shard = self.shard.borrow_mut();
        let router = self.router.borrow();
        let slack = self.config.load.reconcile_slack_ms;
        for w in router.routable_workers() {
            if let Some(report) = router.reported_load(w, now_ms) {
                let before = view.started_before(w, report.observed_at_ms.saturating_sub(slack));
                shard.reconcile(&self.metrics, w, &report, before);
            }
            self.metrics.load(w, &view.load(w));
        }
        shard.tick(&HostStore, &self.metrics, now_ms);
        drop((shard, router));
        self.readiness_tick(now_ms);
    }
}

/// The root context: a filter thread's (routing) or the singleton's (snapshot sync), chosen by
/// the configuration it receives.
pub struct KvRoot {
    /// This root context's id: the tick makes it effective again after resuming a request.
    id: u32,
    state: Option<Rc<ThreadState>>,
    sync: Option<SnapshotSync>,
    /// Whether the wake queue's registration was tried (it is tried once).
    wake_tried: std::cell::Cell<bool>,
}

/// Most wake messages taken in one `on_queue_ready` (each enqueue calls it once more).
const WAKE_DRAIN: usize = 1024;

impl KvRoot {
    pub fn new(id: u32) -> KvRoot {
        KvRoot { id, state: None, sync: None, wake_tried: Default::default() }
    }

    /// Registers this thread's wake queue (see `kvroute_core::shared::wake`), once.
    fn register_wake_queue(&self, state: &ThreadState) {
        if self.wake_tried.replace(true) {
            return;
        }
        let queue = host::register_queue(&wake::queue_name(state.shard.borrow().id()));
        if queue.is_none() {
            log::warn!("kvroute: no wake queue; knowledge applies on requests and ticks only");
        }
        state.wake_queue.set(queue);
    }
}

impl Context for KvRoot {
    fn on_done(&mut self) -> bool {
        if let Some(state) = &self.state {
            state.retire();
        }
        true
    }

    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, trailers: usize) {
        if let Some(s) = self.sync.as_mut() {
            s.on_http_call_response(token, headers, body, trailers);
        }
    }
}

impl RootContext for KvRoot {
    /// The singleton published knowledge: every message waiting is taken, and one catch-up
    /// answers them all. A call that finds the queue empty (an earlier one took its message)
    /// does nothing.
    fn on_queue_ready(&mut self, queue_id: u32) {
        let Some(state) = self.state.as_ref().filter(|s| s.wake_queue.get() == Some(queue_id))
        else {
            return;
        };
        let taken = (0..WAKE_DRAIN).take_while(|_| host::dequeue(queue_id).is_some()).count();
        if taken > 0 {
            state.catch_up(Catch::Wake);
        }
    }

    fn on_tick(&mut self) {
        if let Some(s) = self.sync.as_mut() {
            s.on_tick();
        }
        if let Some(state) = &self.state {
            state.tick(self.id, host::now_ms());
        }
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = host::plugin_configuration().unwrap_or_default();
        match SnapshotSyncConfig::from_json(&bytes, &|k| std::env::var(k).ok()) {
            Ok(Some(cfg)) => {
                log::info!(
                    "kvroute: snapshot sync from cluster {} every {} ms",
                    cfg.cluster,
                    cfg.interval_ms
                );
                let sync = SnapshotSync::new(cfg);
                sync.start();
                self.sync = Some(sync);
                return true;
            }
            Ok(None) => {}
            Err(e) => {
                log::error!("kvroute: rejecting plugin configuration: {e}");
                return false;
            }
        }
        let built = FilterConfig::from_json(&bytes).and_then(|cfg| {
            let mut router = Router::new(&cfg)?;
            router.set_clock(host::now_nanos);
            // Off the request path: whether each template may be rendered incrementally.
            router.check_templates();
            Ok((cfg, router))
        });
        match built {
            Ok((config, router)) => {
                let mut metrics = Metrics::define(router.all_workers());
                metrics.admission = crate::metrics::AdmissionMetrics::define(
                    config.admission.classes.iter().map(|c| c.name.as_str()),
                );
                let pools: Vec<String> = config
                    .models
                    .iter()
                    .map(|m| format!("{}={}", m.name, m.workers.len()))
                    .collect();
                let now = host::now_ms();
                // A random draw of this thread: the clock's nanoseconds hashed with this
                // root context's address.
                let nonce = xxhash_rust::xxh3::xxh3_64_with_seed(
                    &host::now_nanos().to_le_bytes(),
                    self as *const Self as usize as u64,
                );
                let mut shard = Shard::register(&HostStore, &metrics, config.load, now, nonce);
                let c = &config.calibration;
                let adm = &config.admission;
                let least_urgent = (0..adm.classes.len()).map(|i| adm.engine_priority(i)).max();
                let passes = c.enabled && c.skip_passed && adm.sets_engine_priority();
                shard.record_passes(least_urgent.filter(|_| passes));
                log::info!(
                    "kvroute: configured, pools {}, load shard {}",
                    pools.join(" "),
                    shard.id()
                );
                if !host::set_tick(config.tick_ms) {
                    log::warn!("kvroute: no tick; knowledge refreshes on requests only");
                }
                let bundles = BundleFollower::new(&config.models);
                self.state = Some(Rc::new(ThreadState {
                    calib: RefCell::new(crate::calib::CalibThread::new(&config)),
                    bundles: RefCell::new(bundles),
                    serving: std::cell::Cell::new(false),
                    placement: crate::thread::Placement::detect(),
                    replica: std::cell::Cell::new(0),
                    watch: RefCell::new(Watch::new(config.misdeployment, now)),
                    waiting: Waiting::default(),
                    reported: std::cell::Cell::new(0),
                    wake_queue: std::cell::Cell::new(None),
                    follower: RefCell::new(Follower::new(config.knowledge.decode_limits)),
                    config,
                    router: RefCell::new(router),
                    cursor: RefCell::new(JournalCursor::default()),
                    shard: RefCell::new(shard),
                    metrics,
                }));
                if let Some(state) = &self.state {
                    state.refresh_replica();
                    if state.placement.worker() {
                        self.register_wake_queue(state);
                    }
                }
                true
            }
            Err(e) => {
                log::error!("kvroute: rejecting plugin configuration: {e}");
                false
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // The singleton (sync mode) has no state and makes no HTTP contexts.
        let state = self.state.clone()?;
        state.serving.set(true);
        // A worker thread that start-up order took for the main one.
        self.register_wake_queue(&state);
        Some(Box::new(KvHttp::new(state, context_id)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
