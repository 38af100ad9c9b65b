//! Counters and histograms in Envoy's stats (`/stats/prometheus`). Names are dotted with the
//! label value in the middle; the bootstrap's `stats_tags` turn them into Prometheus labels:
//! `kvroute.worker.<w>.decisions` → `kvroute_decisions{kvroute_worker="<w>"}` and so on.

use std::collections::HashMap;

use kvroute_core::audit::AuditClass;
use kvroute_core::load::WorkerLoad;
use kvroute_core::router::FallbackReason;
use kvroute_core::shared::{Counter, Counters};
use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

/// Metric ids of one VM (thread); defining the same name again returns the same metric.
#[derive(Debug, Default)]
pub struct Metrics {
    decisions: HashMap<String, u32>,
    inflight: HashMap<String, (u32, u32)>,
    fallbacks: HashMap<&'static str, u32>,
    updates: HashMap<&'static str, u32>,
    audit: HashMap<&'static str, u32>,
    predicted_blocks: Option<u32>,
    predicted_tokens: Option<u32>,
    actual_tokens: Option<u32>,
    decision_us: Option<u32>,
    errors: Option<u32>,
    shared: HashMap<Counter, u32>,
}

fn define(kind: MetricType, name: &str) -> Option<u32> {
    match hostcalls::define_metric(kind, name) {
        Ok(id) => Some(id),
        Err(e) => {
            log::warn!("kvroute: cannot define metric {name}: {e:?}");
            None
        }
    }
}

fn add(id: Option<u32>, v: u64) {
    if let (Some(id), true) = (id, v > 0) {
        let _ = hostcalls::increment_metric(id, v as i64);
    }
}

/// A worker address as a stats name segment: `127.0.0.1:8001` → `127_0_0_1_8001`.
pub fn worker_segment(worker: &str) -> String {
    worker.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

impl Metrics {
    pub fn define<'a>(workers: impl Iterator<Item = &'a str>) -> Self {
        let c = MetricType::Counter;
        let mut m = Metrics {
            predicted_blocks: define(c, "kvroute.predicted_blocks"),
            predicted_tokens: define(c, "kvroute.predicted_cached_tokens"),
            actual_tokens: define(c, "kvroute.actual_cached_tokens"),
            decision_us: define(MetricType::Histogram, "kvroute.decision_time_us"),
            errors: define(c, "kvroute.rejected_requests"),
            ..Default::default()
        };
        for what in Counter::ALL {
            if let Some(id) = define(c, &format!("kvroute.shared.{}.events", what.name())) {
                m.shared.insert(what, id);
            }
        }
        for w in workers {
            let seg = worker_segment(w);
            if let Some(id) = define(c, &format!("kvroute.worker.{seg}.decisions")) {
                m.decisions.insert(w.to_owned(), id);
            }
            let g = MetricType::Gauge;
            let reqs = define(g, &format!("kvroute.worker.{seg}.inflight_requests"));
            let toks = define(g, &format!("kvroute.worker.{seg}.inflight_prefill_tokens"));
            if let (Some(r), Some(t)) = (reqs, toks) {
                m.inflight.insert(w.to_owned(), (r, t));
            }
        }
        for r in FallbackReason::ALL {
            if let Some(id) = define(c, &format!("kvroute.fallback.{}.requests", r.name())) {
                m.fallbacks.insert(r.name(), id);
            }
        }
        for kind in ["full", "delta"] {
            if let Some(id) = define(c, &format!("kvroute.knowledge.{kind}.updates")) {
                m.updates.insert(kind, id);
            }
        }
        for a in [
            AuditClass::HitAsPredicted,
            AuditClass::FalseHit,
            AuditClass::FalseMiss,
            AuditClass::OrdinaryMiss,
        ] {
            if let Some(id) = define(c, &format!("kvroute.audit.{}.requests", a.name())) {
                m.audit.insert(a.name(), id);
            }
        }
        m
    }

    pub fn decision(&self, worker: &str, predicted_blocks: u64, predicted_tokens: u64, us: u64) {
        add(self.decisions.get(worker).copied(), 1);
        add(self.predicted_blocks, predicted_blocks);
        add(self.predicted_tokens, predicted_tokens);
        if let Some(id) = self.decision_us {
            let _ = hostcalls::record_metric(id, us);
        }
    }

    /// Publishes a worker's router-tracked load (shared by all threads) as gauges.
    pub fn load(&self, worker: &str, load: &WorkerLoad) {
        if let Some((r, t)) = self.inflight.get(worker) {
            let _ = hostcalls::record_metric(*r, u64::from(load.inflight_requests));
            let _ = hostcalls::record_metric(*t, load.prefill_tokens);
        }
    }

    pub fn fallback(&self, reason: FallbackReason) {
        add(self.fallbacks.get(reason.name()).copied(), 1);
    }

    pub fn audit(&self, class: AuditClass, actual_tokens: u64) {
        add(self.audit.get(class.name()).copied(), 1);
        add(self.actual_tokens, actual_tokens);
    }

    /// A thread applied `n` full snapshots or deltas of the updater's knowledge.
    pub fn knowledge_updates(&self, kind: &'static str, n: u64) {
        add(self.updates.get(kind).copied(), n);
    }

    pub fn rejected(&self) {
        add(self.errors, 1);
    }
}

impl Counters for Metrics {
    fn count(&self, what: Counter, n: u64) {
        add(self.shared.get(&what).copied(), n);
    }
}
