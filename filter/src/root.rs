//! The root context: one per Envoy worker thread. Turns the plugin configuration into a router;
//! a bad configuration makes Envoy reject the filter, with the reason in its log.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use kvroute_core::config::{FilterConfig, SnapshotSyncConfig};
use kvroute_core::journal::JournalEntry;
use kvroute_core::load::LoadDelta;
use kvroute_core::router::Router;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

use crate::http::KvHttp;
use crate::metrics::Metrics;
use crate::shared::{journal_append, update_load, JournalCursor};
use crate::sync::{read_delta, read_full, read_head, Head, SnapshotSync, RING};

/// What every request context of a thread shares.
pub struct ThreadState {
    pub config: FilterConfig,
    pub router: RefCell<Router>,
    pub cursor: RefCell<JournalCursor>,
    /// Version of the updater snapshot this thread has applied.
    pub snapshot_version: Cell<u64>,
    pub metrics: Metrics,
}

impl ThreadState {
    /// Applies knowledge other threads (and this one) journaled since the last call, and the
    /// updater's snapshot when its version moved.
    pub fn catch_up(&self) {
        let entries = self.cursor.borrow_mut().poll();
        let mut router = self.router.borrow_mut();
        if let Some(head) = read_head() {
            router.events_checked(head.checked_at_ms);
            if head.version != self.snapshot_version.get() {
                let v = self.follow(&mut router, &head);
                self.snapshot_version.set(v);
            }
        }
        for e in entries {
            router.observe(&e.worker, &e.hashes, e.source, e.at_ms);
        }
    }

    /// Brings the router to `head.version`: along the ring's deltas from this thread's version,
    /// or from the full snapshot when the chain has a gap. Returns the version reached.
    fn follow(&self, router: &mut Router, head: &Head) -> u64 {
        let mut v = self.chain(router, head, self.snapshot_version.get());
        // The full snapshot helps only if it is not the one this thread already stands on;
        // otherwise wait for the singleton instead of decoding megabytes on every request.
        if v != head.version && v != head.full_version {
            if let Some(full) = read_full() {
                router.apply_snapshot(&full);
                self.metrics.knowledge_update("full");
                v = self.chain(router, head, full.version);
            }
        }
        v
    }

    fn chain(&self, router: &mut Router, head: &Head, mut v: u64) -> u64 {
        for _ in 0..RING {
            let Some(d) = head.next_after(v).and_then(read_delta) else { break };
            router.apply_delta(&d);
            self.metrics.knowledge_update("delta");
            v = d.to_version;
        }
        v
    }

    /// Changes a worker's shared load and publishes it.
    pub fn apply_load(&self, worker: &str, delta: LoadDelta) {
        match update_load(worker, delta) {
            Some(load) => self.metrics.load(worker, &load),
            None => self.metrics.lost_update(),
        }
    }

    /// Journals an observation for every thread (including this one) to apply.
    pub fn publish(&self, entry: JournalEntry) {
        if !journal_append(entry) {
            self.metrics.lost_update();
        }
    }
}

/// The root context: a filter thread's (routing) or the singleton's (snapshot sync), chosen by
/// the configuration it receives.
#[derive(Default)]
pub struct KvRoot {
    state: Option<Rc<ThreadState>>,
    sync: Option<SnapshotSync>,
}

impl Context for KvRoot {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, trailers: usize) {
        if let Some(s) = self.sync.as_mut() {
            s.on_http_call_response(token, headers, body, trailers);
        }
    }
}

impl RootContext for KvRoot {
    fn on_tick(&mut self) {
        if let Some(s) = self.sync.as_mut() {
            s.on_tick();
        }
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        match SnapshotSyncConfig::from_json(&bytes) {
            Ok(Some(cfg)) => {
                log::info!(
                    "kvroute: snapshot sync from cluster {} every {} ms",
                    cfg.cluster,
                    cfg.interval_ms
                );
                let mut sync = SnapshotSync::new(cfg);
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
            let router = Router::new(&cfg)?;
            Ok((cfg, router))
        });
        match built {
            Ok((config, router)) => {
                let metrics = Metrics::define(router.all_workers());
                let pools: Vec<String> = config
                    .models
                    .iter()
                    .map(|m| format!("{}={}", m.name, m.workers.len()))
                    .collect();
                log::info!("kvroute: configured, pools {}", pools.join(" "));
                self.state = Some(Rc::new(ThreadState {
                    config,
                    router: RefCell::new(router),
                    cursor: RefCell::new(JournalCursor::default()),
                    snapshot_version: Cell::new(0),
                    metrics,
                }));
                true
            }
            Err(e) => {
                log::error!("kvroute: rejecting plugin configuration: {e}");
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // The singleton (sync mode) has no state and makes no HTTP contexts.
        let state = self.state.clone()?;
        Some(Box::new(KvHttp::new(state)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
