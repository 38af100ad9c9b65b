//! The updater's shared state: every worker's knowledge, and the snapshot version that moves
//! whenever any of it changes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use kvroute_core::snapshot::{Snapshot, WorkerKnowledge as Wire};

use crate::decode::Tier;
use crate::ingest::{DomainBase, WorkerKnowledge};
use crate::limits::Limits;
use crate::publish::{Answer, Publisher, RingLimits};

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Per-worker entry.
#[derive(Debug, Default)]
pub struct Entry {
    pub knowledge: WorkerKnowledge,
    pub connected: bool,
    /// False when the worker's announced config does not match kvroute's.
    pub compatible: bool,
    /// Why it is incompatible, or the last check's error.
    pub alignment: Option<String>,
    /// Block-size mismatches in events seen by the last alignment pass.
    pub mismatches_seen: u64,
    /// Whether Envoy's health checks keep this worker in the pool (true without an Envoy).
    pub member: bool,
    /// What the worker last reported about its load.
    pub load: Option<crate::scrape::ReportedLoad>,
}

#[derive(Debug)]
pub struct State {
    pub domain: DomainBase,
    pub limits: Limits,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    workers: BTreeMap<String, Entry>,
    /// Workers changed since the last publication.
    dirty: BTreeSet<String>,
    publisher: Publisher,
}

impl State {
    pub fn new(domain: DomainBase, workers: impl IntoIterator<Item = String>) -> State {
        State::with_limits(domain, workers, Limits::default())
    }

    /// A state whose workers' knowledge is bounded by `limits`.
    pub fn with_limits(
        domain: DomainBase,
        workers: impl IntoIterator<Item = String>,
        limits: Limits,
    ) -> State {
        let workers = workers
            .into_iter()
            .map(|w| {
                let knowledge = WorkerKnowledge::with_limits(limits.blocks);
                (w, Entry { compatible: true, member: true, knowledge, ..Default::default() })
            })
            .collect::<BTreeMap<String, Entry>>();
        let dirty = workers.keys().cloned().collect();
        let publisher = Publisher::new(now_ms(), RingLimits::default());
        State { domain, limits, inner: Mutex::new(Inner { workers, dirty, publisher }) }
    }

    /// Counts a cap hit for `worker` (not a knowledge change: no new version).
    pub fn cap_hit(&self, worker: &str, cap: crate::limits::Cap) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = inner.workers.get_mut(worker) {
            e.knowledge.stats.caps_hit.hit(cap);
        }
    }

    /// Runs `f` on `worker`'s entry and moves the version.
    pub fn update<T>(
        &self,
        worker: &str,
        f: impl FnOnce(&mut Entry, &DomainBase) -> T,
    ) -> Option<T> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let out = inner.workers.get_mut(worker).map(|e| f(e, &self.domain));
        if out.is_some() {
            inner.dirty.insert(worker.to_owned());
        }
        out
    }

    /// Publishes what changed since the last call as a new snapshot version (if anything did).
    fn publish(inner: &mut Inner) {
        if inner.dirty.is_empty() {
            return;
        }
        let dirty = std::mem::take(&mut inner.dirty);
        let changed =
            dirty.iter().filter_map(|w| inner.workers.get(w).map(|e| wire(w, e))).collect();
        inner.publisher.publish(changed, now_ms());
    }

    /// The published snapshot version (after publishing pending changes).
    pub fn version(&self) -> u64 {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Self::publish(&mut inner);
        inner.publisher.version()
    }

    /// A full snapshot of everything known now.
    pub fn snapshot(&self) -> Snapshot {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Self::publish(&mut inner);
        inner.publisher.full().clone()
    }

    /// What a caller holding version `since` should receive: nothing new, the composed delta,
    /// or a full snapshot.
    pub fn answer(&self, since: Option<u64>) -> Answer {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Self::publish(&mut inner);
        inner.publisher.answer(since)
    }

    /// `/status` JSON.
    pub fn status(&self) -> serde_json::Value {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Self::publish(&mut inner);
        let now = now_ms();
        let workers: serde_json::Map<String, serde_json::Value> = inner
            .workers
            .iter()
            .map(|(w, e)| {
                let k = &e.knowledge;
                let age =
                    (k.stats.last_event_ms > 0).then(|| now.saturating_sub(k.stats.last_event_ms));
                (
                    w.clone(),
                    serde_json::json!({
                        "connected": e.connected,
                        "compatible": e.compatible,
                    "alignment": e.alignment,
                    "member": e.member,
                    "reported_load": e.load,
                    "reported_load_age_ms": e.load.as_ref().map(|l| now.saturating_sub(l.observed_at_ms)),
                        "next_seq": k.next_seq,
                        "blocks": k.counts(),
                        "engine_keys": k.engine_keys(),
                        "last_event_age_ms": age,
                        "stats": k.stats,
                    }),
                )
            })
            .collect();
        serde_json::json!({"version": inner.publisher.version(), "workers": workers})
    }
}

/// One worker's entry as published (hash lists sorted).
fn wire(worker: &str, e: &Entry) -> Wire {
    let mut offloaded = e.knowledge.blocks(Tier::Cpu);
    offloaded.extend(e.knowledge.blocks(Tier::Storage));
    offloaded.sort_unstable();
    offloaded.dedup();
    Wire {
        worker: worker.to_owned(),
        observed_at_ms: e.knowledge.stats.last_event_ms,
        compatible: e.compatible,
        gpu: e.knowledge.blocks(Tier::Gpu),
        offloaded,
        load: e.load.as_ref().and_then(|l| {
            Some(kvroute_core::snapshot::ReportedLoad {
                running: l.running? as u32,
                waiting: l.waiting? as u32,
                observed_at_ms: l.observed_at_ms,
            })
        }),
        ..Default::default()
    }
}
