//! Counters and histograms in Envoy's stats (`/stats/prometheus`). Names are dotted with the
//! label value in the middle; the bootstrap's `stats_tags` turn them into Prometheus labels:
//! `kvroute.worker.<w>.decisions` → `kvroute_decisions{kvroute_worker="<w>"}` and so on.

use std::cell::RefCell;
use std::collections::HashMap;

use kvroute_core::decision::admission::AdmissionVerdict;
use kvroute_core::decision::audit::AuditClass;
use kvroute_core::decision::load::WorkerLoad;
use kvroute_core::decision::misdeploy::{Symptom, Unrouted};
use kvroute_core::decision::router::FallbackReason;
use kvroute_core::shared::{Counter, Counters};
use proxy_wasm::types::MetricType;

use crate::host::{Host, Proxy};

/// Metric ids of one VM (thread); defining the same name again returns the same metric.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Per worker, defined when the filter starts for its configured pools and on first use
    /// for workers the updater's pool brings later (discovery).
    workers: RefCell<HashMap<String, WorkerIds>>,
    fallbacks: HashMap<&'static str, u32>,
    /// Gauges `kvroute.misdeployed.<symptom>.present` (1 while this thread sees it).
    misdeployed: HashMap<&'static str, u32>,
    updates: HashMap<&'static str, u32>,
    audit: HashMap<&'static str, u32>,
    predicted_blocks: Option<u32>,
    predicted_tokens: Option<u32>,
    actual_tokens: Option<u32>,
    decision_us: Option<u32>,
    tokenize_us: Option<u32>,
    errors: Option<u32>,
    /// Decisions that placed a hot prefix on one more worker on purpose (look-ahead).
    replications: Option<u32>,
    /// Decisions ranked again because another thread's decision came between their view and
    /// their claim, and of those the ones whose primary changed.
    reranked: Option<u32>,
    rerank_moved: Option<u32>,
    /// Decisions by topology: a pull chosen, a primary in another site, a primary the
    /// topology does not place, a P/D pool's decision.
    topology: [Option<u32>; 4],
    shared: HashMap<Counter, u32>,
    /// This thread's bundle builds.
    pub bundles: BundleMetrics,
    /// Gauges over this Envoy's worker threads: `kvroute.threads.bundled` (every model has its
    /// bundle) and `kvroute.threads.ready` (that, and knowledge from the updater has arrived).
    readiness: Readiness,
    /// Deadlines, shedding and priority classes.
    pub admission: AdmissionMetrics,
}

/// Admission outcomes: totals `kvroute.shed.deadline`, `kvroute.shed.saturated`,
/// `kvroute.best_effort.deadline`, and per priority class
/// `kvroute.class.<class>.{admitted,shed_deadline,shed_saturated,best_effort_deadline}`
/// (`kvroute_class_shed_deadline{kvroute_class="batch"}` in Prometheus).
#[derive(Debug, Default)]
pub struct AdmissionMetrics {
    totals: HashMap<&'static str, u32>,
    per_class: HashMap<(String, &'static str), u32>,
}

impl AdmissionMetrics {
    pub fn define<'a>(classes: impl Iterator<Item = &'a str>) -> Self {
        let c = MetricType::Counter;
        let mut m = AdmissionMetrics::default();
        for (outcome, total) in [
            ("shed_deadline", "kvroute.shed.deadline"),
            ("shed_saturated", "kvroute.shed.saturated"),
            ("best_effort_deadline", "kvroute.best_effort.deadline"),
        ] {
            if let Some(id) = define(c, total) {
                m.totals.insert(outcome, id);
            }
        }
        for class in classes {
            for outcome in AdmissionVerdict::OUTCOMES {
                if let Some(id) = define(c, &format!("kvroute.class.{class}.{outcome}")) {
                    m.per_class.insert((class.to_owned(), outcome), id);
                }
            }
        }
        m
    }

    /// One request's admission verdict in `class`.
    pub fn outcome(&self, class: &str, verdict: &AdmissionVerdict) {
        let o = verdict.outcome();
        count(self.totals.get(o).copied());
        count(self.per_class.get(&(class.to_owned(), o)).copied());
    }
}

pub(crate) fn define(kind: MetricType, name: &str) -> Option<u32> {
    Proxy.define_metric(kind, name)
}

pub(crate) fn add(id: Option<u32>, v: u64) {
    if let (Some(id), true) = (id, v > 0) {
        Proxy.increment_metric(id, v);
    }
}

/// Increments a counter by one.
pub fn count(id: Option<u32>) {
    add(id, 1);
}

/// Increments a counter by `n`.
pub fn count_n(id: Option<u32>, n: usize) {
    add(id, n as u64);
}

pub(crate) fn gauge(id: Option<u32>, v: u64) {
    if let Some(id) = id {
        Proxy.record_metric(id, v);
    }
}

/// Records a histogram value.
pub(crate) fn record(id: Option<u32>, v: u64) {
    gauge(id, v);
}

/// The two readiness gauges, set by Envoy's main thread from every thread's mark
/// (`kvroute_core::shared::readiness`).
#[derive(Debug, Default)]
struct Readiness {
    bundled: Option<u32>,
    ready: Option<u32>,
}

/// Model bundles from the updater, a thread's builds (`kvroute_bundles_builds`,
/// `kvroute_bundles_build_failures`, histogram `kvroute_bundle_build_ms`); the singleton's
/// fetches (`kvroute_bundles_*`) are counted in [`crate::sync`].
#[derive(Debug, Default)]
pub struct BundleMetrics {
    pub builds: Option<u32>,
    pub build_failures: Option<u32>,
    build_ms: Option<u32>,
}

impl BundleMetrics {
    /// A worker thread's.
    pub fn define_thread() -> Self {
        let c = MetricType::Counter;
        BundleMetrics {
            builds: define(c, "kvroute.bundles.builds"),
            build_failures: define(c, "kvroute.bundles.build_failures"),
            build_ms: define(MetricType::Histogram, "kvroute.bundle_build_ms"),
        }
    }

    /// A thread built a bundle in `ms`.
    pub fn built(&self, ms: u64) {
        count(self.builds);
        record(self.build_ms, ms);
    }
}

impl Metrics {
    /// Sets the readiness gauges: worker threads with every bundle, and of those, with
    /// knowledge too.
    pub fn threads(&self, bundled: u32, ready: u32) {
        gauge(self.readiness.bundled, u64::from(bundled));
        gauge(self.readiness.ready, u64::from(ready));
    }
}

/// Most workers given their own stats per thread.
pub const MAX_WORKER_METRICS: usize = 4096;

/// One worker's metric ids: `kvroute.worker.<w>.decisions`, the in-flight gauges, and of its
/// audited requests the false hits (`kvroute_worker_audited_requests`,
/// `kvroute_worker_false_hits`).
#[derive(Debug, Default, Clone, Copy)]
struct WorkerIds {
    decisions: Option<u32>,
    inflight: Option<(u32, u32)>,
    audited: Option<(u32, u32)>,
    /// `kvroute.worker.<w>.down` (1 from an ejection until it answers again) and
    /// `kvroute.worker.<w>.ejections`.
    health: Option<(u32, u32)>,
}

impl WorkerIds {
    fn define(worker: &str) -> WorkerIds {
        let seg = worker_segment(worker);
        let (c, g) = (MetricType::Counter, MetricType::Gauge);
        let pair = |kind, a: &str, b: &str| {
            let a = define(kind, &format!("kvroute.worker.{seg}.{a}"));
            let b = define(kind, &format!("kvroute.worker.{seg}.{b}"));
            a.zip(b)
        };
        WorkerIds {
            decisions: define(c, &format!("kvroute.worker.{seg}.decisions")),
            inflight: pair(g, "inflight_requests", "inflight_prefill_tokens"),
            audited: pair(c, "audited_requests", "false_hits"),
            health: define(g, &format!("kvroute.worker.{seg}.down"))
                .zip(define(c, &format!("kvroute.worker.{seg}.ejections"))),
        }
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
            tokenize_us: define(MetricType::Histogram, "kvroute.tokenize_time_us"),
            errors: define(c, "kvroute.rejected_requests"),
            replications: define(c, "kvroute.lookahead.replications"),
            reranked: define(c, "kvroute.order.reranked"),
            rerank_moved: define(c, "kvroute.order.moved"),
            topology: [
                define(c, "kvroute.topology.pulls"),
                define(c, "kvroute.topology.cross_site"),
                define(c, "kvroute.topology.unknown_site"),
                define(c, "kvroute.topology.pd"),
            ],
            bundles: BundleMetrics::define_thread(),
            readiness: Readiness {
                bundled: define(MetricType::Gauge, "kvroute.threads.bundled"),
                ready: define(MetricType::Gauge, "kvroute.threads.ready"),
            },
            ..Default::default()
        };
        for what in Counter::ALL {
            if let Some(id) = define(c, &format!("kvroute.shared.{}.events", what.name())) {
                m.shared.insert(what, id);
            }
        }
        for w in workers {
            m.worker(w);
        }
        let reasons = FallbackReason::ALL.iter().map(|r| r.name());
        for r in reasons.chain(Unrouted::ALL.iter().map(|u| u.name())) {
            if let Some(id) = define(c, &format!("kvroute.fallback.{r}.requests")) {
                m.fallbacks.insert(r, id);
            }
        }
        for s in Symptom::ALL {
            let name = format!("kvroute.misdeployed.{}.present", s.name());
            if let Some(id) = define(MetricType::Gauge, &name) {
                m.misdeployed.insert(s.name(), id);
            }
        }
        let journal = crate::root::Catch::JOURNAL_KINDS;
        let kinds =
            ["full", "delta", crate::root::Catch::DELTA_WAKE, crate::root::Catch::DELTA_DEFERRED];
        for kind in kinds.into_iter().chain(journal) {
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

    /// `worker`'s metric ids, defined on first use. Past [`MAX_WORKER_METRICS`] workers (a
    /// pool that churned through that many addresses) new ones get none.
    fn worker(&self, worker: &str) -> WorkerIds {
        if let Some(ids) = self.workers.borrow().get(worker) {
            return *ids;
        }
        let mut workers = self.workers.borrow_mut();
        if workers.len() >= MAX_WORKER_METRICS {
            return WorkerIds::default();
        }
        let ids = WorkerIds::define(worker);
        workers.insert(worker.to_owned(), ids);
        ids
    }

    /// One decision: its worker, prediction, and time (µs) in all and in render + tokenize.
    pub fn decision(&self, worker: &str, predicted: (u64, u64), us: u64, tokenize_us: u64) {
        add(self.worker(worker).decisions, 1);
        add(self.predicted_blocks, predicted.0);
        add(self.predicted_tokens, predicted.1);
        record(self.decision_us, us);
        record(self.tokenize_us, tokenize_us);
    }

    /// Publishes a worker's router-tracked load (shared by all threads) as gauges.
    pub fn load(&self, worker: &str, load: &WorkerLoad) {
        if let Some((r, t)) = self.worker(worker).inflight {
            gauge(Some(r), u64::from(load.inflight_requests));
            gauge(Some(t), load.prefill_tokens);
        }
    }

    /// `worker` went down after a failed request (passive health).
    pub fn ejected(&self, worker: &str) {
        if let Some((down, ejections)) = self.worker(worker).health {
            gauge(Some(down), 1);
            add(Some(ejections), 1);
        }
    }

    /// `worker` answered again after it was down.
    pub fn recovered(&self, worker: &str) {
        if let Some((down, _)) = self.worker(worker).health {
            gauge(Some(down), 0);
        }
    }

    pub fn fallback(&self, reason: FallbackReason) {
        add(self.fallbacks.get(reason.name()).copied(), 1);
    }

    /// A request passed on without a decision (its body never came in time).
    pub fn unrouted(&self, why: Unrouted) {
        add(self.fallbacks.get(why.name()).copied(), 1);
    }

    /// Whether this thread sees `symptom` now.
    pub fn misdeployed(&self, symptom: Symptom, present: bool) {
        gauge(self.misdeployed.get(symptom.name()).copied(), u64::from(present));
    }

    /// One audited request served by `worker`: its class, and the tokens the engine reported
    /// cached.
    pub fn audit(&self, worker: &str, class: AuditClass, actual_tokens: u64) {
        add(self.audit.get(class.name()).copied(), 1);
        add(self.actual_tokens, actual_tokens);
        if let Some((audited, false_hits)) = self.worker(worker).audited {
            add(Some(audited), 1);
            if class == AuditClass::FalseHit {
                add(Some(false_hits), 1);
            }
        }
    }

    /// A thread applied `n` full snapshots or deltas of the updater's knowledge, or `n` journal
    /// entries (kinds [`crate::root::Catch::JOURNAL_KINDS`]).
    pub fn knowledge_updates(&self, kind: &'static str, n: u64) {
        add(self.updates.get(kind).copied(), n);
    }

    pub fn rejected(&self) {
        add(self.errors, 1);
    }

    /// The look-ahead placed a hot prefix on one more worker.
    pub fn replicated(&self) {
        add(self.replications, 1);
    }

    /// How a decision was ordered against the other threads' (see `kvroute_core::flow::claim`).
    pub fn ordered(&self, o: kvroute_core::flow::claim::Ordered) {
        add(self.reranked, u64::from(o.reranked));
        add(self.rerank_moved, u64::from(o.moved));
    }

    /// A decision made with a topology: whether it pulls, goes to another site, goes to a
    /// worker of unknown site, or is a P/D pool's.
    pub fn topology(&self, pull: bool, cross_site: bool, unknown_site: bool, pd: bool) {
        for (id, yes) in self.topology.iter().zip([pull, cross_site, unknown_site, pd]) {
            if yes {
                add(*id, 1);
            }
        }
    }
}

impl Counters for Metrics {
    fn count(&self, what: Counter, n: u64) {
        add(self.shared.get(&what).copied(), n);
    }
}
