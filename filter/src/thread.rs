//! Which of Envoy's threads a filter root context runs on.
//!
//! Envoy makes the filter's root context on every worker thread and also on its main thread,
//! which never serves a request (and, for a moment, in a throwaway "canary" VM that checks the
//! configuration). A worker thread must have its model bundles before its first request, so it
//! builds them on its first ticks; the main thread must not build them at all (a Qwen3
//! tokenizer is about 115 MiB of wasm memory, kept for good).
//!
//! Nothing Envoy hands a wasm module names its thread, so the order of start-up tells: Envoy
//! configures the listeners' filters on the main thread (canary first), then starts the
//! bootstrap extensions (the snapshot-sync singleton, which marks shared data when it starts),
//! then the workers. A root context configured before that mark is on the main thread; one
//! configured after it is on a worker. A filter that arrives later (LDS, ECDS: Istio, Envoy
//! Gateway) is configured after the mark on every thread, the main one included: that main
//! thread builds the bundles too (one more copy), and a worker thread serves with them from
//! its first request either way. A root context that makes an HTTP context is on a worker,
//! whatever the order said.

use kvroute_core::shared::SharedStore;

use crate::shared::HostStore;

/// The shared-data key the snapshot-sync singleton writes when it starts.
const SYNC_STARTED: &str = "kvroute.sync.started";

/// Where a filter root context runs, as far as start-up order tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Configured before the singleton started: Envoy's main thread (or the canary VM).
    Main,
    /// Configured after it: a worker thread (or, for a filter loaded later, any thread).
    Worker,
}

impl Placement {
    /// Where the root context being configured now runs.
    pub fn detect() -> Placement {
        Self::from_store(&HostStore)
    }

    pub(crate) fn from_store<S: SharedStore + ?Sized>(store: &S) -> Placement {
        match store.get(SYNC_STARTED).0 {
            Some(_) => Placement::Worker,
            None => Placement::Main,
        }
    }

    /// Whether this root context builds bundles before it serves.
    pub fn worker(self) -> bool {
        self == Placement::Worker
    }
}

/// Marks that the singleton started: filter root contexts configured from now on are on
/// worker threads.
pub fn mark_started<S: SharedStore + ?Sized>(store: &S) {
    if store.get(SYNC_STARTED).0.is_none() {
        if let Err(e) = store.set(SYNC_STARTED, b"1", None) {
            log::warn!("kvroute: cannot mark the snapshot sync as started: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_core::shared::fake::MemStore;

    #[test]
    fn root_contexts_configured_after_the_singleton_started_are_workers() {
        let store = MemStore::new();
        assert_eq!(Placement::from_store(&store), Placement::Main);
        mark_started(&store);
        assert_eq!(Placement::from_store(&store), Placement::Worker);
        mark_started(&store);
        assert_eq!(Placement::from_store(&store), Placement::Worker);
        assert!(Placement::Worker.worker() && !Placement::Main.worker());
    }
}
