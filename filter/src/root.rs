//! The root context: one per Envoy worker thread. Turns the plugin configuration into a router;
//! a bad configuration makes Envoy reject the filter, with the reason in its log.

use std::cell::RefCell;
use std::rc::Rc;

use kvroute_core::config::FilterConfig;
use kvroute_core::journal::JournalEntry;
use kvroute_core::load::LoadDelta;
use kvroute_core::router::Router;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

use crate::http::KvHttp;
use crate::metrics::Metrics;
use crate::shared::{journal_append, update_load, JournalCursor};

/// What every request context of a thread shares.
pub struct ThreadState {
    pub config: FilterConfig,
    pub router: RefCell<Router>,
    pub cursor: RefCell<JournalCursor>,
    pub metrics: Metrics,
}

impl ThreadState {
    /// Applies knowledge other threads (and this one) journaled since the last call.
    pub fn catch_up(&self) {
        let entries = self.cursor.borrow_mut().poll();
        let mut router = self.router.borrow_mut();
        for e in entries {
            router.observe(&e.worker, &e.hashes, e.source, e.at_ms);
        }
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

#[derive(Default)]
pub struct KvRoot {
    state: Option<Rc<ThreadState>>,
}

impl Context for KvRoot {}

impl RootContext for KvRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
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
        let state = self.state.clone()?;
        Some(Box::new(KvHttp::new(state)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
