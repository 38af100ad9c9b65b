//! Online calibration on one thread: samples from routed requests' first bytes, written to
//! shared data in batches (`kvroute_core::shared::calib`), the shared state read back into the
//! router's [`Calibrated`] view, and the live coefficients exported as gauges.

use std::collections::HashMap;
use std::sync::Arc;

use kvroute_core::decision::calib::{
    Calibrated, CalibrationConfig, ModelState, Sample, StepSample, StepState,
};
use kvroute_core::decision::config::FilterConfig;
use kvroute_core::decision::cost::{Profile, Score};
use kvroute_core::shared::calib::{init, publish, publish_steps, CalibReader};
use kvroute_core::shared::Counters;
use proxy_wasm::types::MetricType;

use crate::metrics::{add, define, gauge, record, worker_segment};
use crate::shared::HostStore;

/// Most samples a thread holds per model before it drops the oldest (writes keep failing).
const MAX_PENDING: usize = 1024;

/// An estimate within this fraction of the observed time counts as good.
const GOOD_ERROR: f64 = 0.15;

/// A thread's calibration: its pending samples and its copy of the shared state.
pub struct CalibThread {
    cfg: CalibrationConfig,
    /// Each model's name and configured profile (its prior).
    models: Vec<(String, Profile)>,
    pending: HashMap<String, Vec<Sample>>,
    /// Streams' decode steps not yet written, per model.
    pending_steps: HashMap<String, Vec<StepSample>>,
    reader: CalibReader,
    metrics: CalibMetrics,
    /// The engine priorities requests are sent at, most urgent first (none where no class
    /// sets one).
    priorities: Vec<i32>,
}

/// Why a first byte may hold work its decision could not count (see
/// `CalibrationConfig::skip_shared_instants` and `skip_passed`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Raced {
    /// Another request to the same worker was sent at the same instant.
    pub shared: bool,
    /// A more urgent request sent there after it had its first token first.
    pub passed: bool,
}

impl CalibThread {
    pub fn new(config: &FilterConfig) -> Self {
        let models: Vec<(String, Profile)> =
            config.models.iter().map(|m| (m.name.clone(), m.profile)).collect();
        if config.calibration.enabled {
            for (model, prior) in &models {
                init(&HostStore, model, prior);
            }
        }
        let workers: Vec<(&str, &str)> = config
            .models
            .iter()
            .flat_map(|m| m.workers.iter().map(|w| (m.name.as_str(), w.as_str())))
            .collect();
        // The engine priorities requests are sent at: one margin gauge each.
        let adm = &config.admission;
        let mut priorities: Vec<i32> = if adm.sets_engine_priority() {
            (0..adm.classes.len()).map(|i| adm.engine_priority(i)).collect()
        } else {
            Vec::new()
        };
        priorities.sort_unstable();
        priorities.dedup();
        CalibThread {
            cfg: config.calibration,
            metrics: CalibMetrics::define(&models, &workers, &priorities),
            models,
            pending: HashMap::new(),
            pending_steps: HashMap::new(),
            reader: CalibReader::default(),
            priorities,
        }
    }

    pub fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    /// Whether streamed answers are timed to learn the decode step.
    pub fn learns_steps(&self) -> bool {
        self.cfg.enabled && self.cfg.learn_decode_step
    }

    /// The engine priorities more urgent than `priority` whose passes matter here: none where
    /// calibration or `skip_passed` is off.
    pub fn more_urgent(&self, priority: i32) -> Vec<i32> {
        if !(self.cfg.enabled && self.cfg.skip_passed) {
            return Vec::new();
        }
        self.priorities.iter().copied().take_while(|&p| p < priority).collect()
    }

    /// A routed request of `model`, sent at engine `priority`, got its first byte
    /// `observed_ms` after its decision, from the worker `score` estimated; `raced`: what else
    /// its first byte may hold (see [`Raced`]). Returns a new view when the shared state was
    /// written.
    pub fn record(
        &mut self,
        counters: &dyn Counters,
        model: &str,
        score: &Score,
        (observed_ms, priority): (f64, i32),
        raced: Raced,
    ) -> Option<Arc<Calibrated>> {
        if !self.cfg.enabled || !self.models.iter().any(|(m, _)| m == model) {
            return None;
        }
        if observed_ms > 0.0 && score.ttft_ms.is_finite() {
            let err = (score.ttft_ms - observed_ms).abs() / observed_ms;
            add(self.metrics.estimates, 1);
            add(self.metrics.good, u64::from(err <= GOOD_ERROR));
            record(self.metrics.error_pct, (err * 100.0).min(1e6) as u64);
        }
        if raced.shared && self.cfg.skip_shared_instants {
            add(self.metrics.shared, 1);
            return None;
        }
        let passed = raced.passed && self.cfg.skip_passed;
        add(self.metrics.passed, u64::from(passed));
        let pending = self.pending.entry(model.to_owned()).or_default();
        if pending.len() >= MAX_PENDING {
            pending.remove(0);
            add(self.metrics.dropped, 1);
        }
        pending.push(Sample {
            worker: score.worker.to_string(),
            uncached_tokens: score.uncached_tokens,
            cached_tokens: score.cached_tokens,
            load: score.load,
            fixed_ms: score.transfer_ms + score.adapter_ms,
            observed_ms,
            priority,
            passed,
            fill_ms: score.fill_forecast_ms,
            wait_factor: score.wait_factor,
        });
        if pending.len() >= self.cfg.flush_samples {
            return self.flush(counters);
        }
        None
    }

    /// A streamed answer of `model` timed its decode steps (see
    /// `kvroute_core::decision::calib::steps`). Returns a new view when the shared state was
    /// written.
    pub fn record_steps(
        &mut self,
        counters: &dyn Counters,
        model: &str,
        sample: StepSample,
    ) -> Option<Arc<Calibrated>> {
        if !self.learns_steps() || !self.models.iter().any(|(m, _)| m == model) {
            return None;
        }
        let pending = self.pending_steps.entry(model.to_owned()).or_default();
        if pending.len() >= MAX_PENDING {
            pending.remove(0);
            add(self.metrics.dropped, 1);
        }
        pending.push(sample);
        if pending.len() >= self.cfg.flush_samples {
            return self.flush(counters);
        }
        None
    }

    /// Writes every model's pending decode steps; the new view if any was written.
    fn flush_steps(&mut self, counters: &dyn Counters) -> Option<Arc<Calibrated>> {
        let mut view = None;
        for (model, prior) in &self.models {
            let Some(samples) = self.pending_steps.get_mut(model).filter(|s| !s.is_empty()) else {
                continue;
            };
            match publish_steps(&HostStore, counters, &self.cfg, model, prior, samples) {
                Some((state, used)) => {
                    samples.clear();
                    add(self.metrics.step_samples, used as u64);
                    self.metrics.publish_steps(model, &state);
                    view = Some(self.reader.set_steps(&self.cfg, model, state));
                }
                None => add(self.metrics.lost, 1),
            }
        }
        view
    }

    /// Writes every model's pending samples to shared data; returns the new view if any was
    /// written. Samples of a lost write are kept for the next flush.
    pub fn flush(&mut self, counters: &dyn Counters) -> Option<Arc<Calibrated>> {
        let mut view = self.flush_steps(counters);
        for (model, prior) in &self.models {
            let Some(samples) = self.pending.get_mut(model).filter(|s| !s.is_empty()) else {
                continue;
            };
            match publish(&HostStore, counters, &self.cfg, model, prior, samples) {
                Some(p) => {
                    samples.clear();
                    add(self.metrics.samples, p.used as u64);
                    add(self.metrics.clipped, p.clipped as u64);
                    add(self.metrics.rejected, p.rejected as u64);
                    self.metrics.publish(model, &p.state);
                    view = Some(self.reader.set_state(&self.cfg, model, prior, p.state));
                }
                None => add(self.metrics.lost, 1),
            }
        }
        view
    }

    /// Re-reads the shared state when due (`force`: regardless); the new view if it changed.
    pub fn refresh(
        &mut self,
        counters: &dyn Counters,
        now_ms: u64,
        force: bool,
    ) -> Option<Arc<Calibrated>> {
        if !self.cfg.enabled || !(force || self.reader.due(&self.cfg, now_ms)) {
            return None;
        }
        let view = self.reader.refresh(&HostStore, counters, &self.cfg, &self.models, now_ms)?;
        if force {
            for (model, state) in self.reader.states() {
                self.metrics.publish(model, state);
            }
            for (model, state) in self.reader.steps() {
                self.metrics.publish_steps(model, state);
            }
        }
        Some(view)
    }
}

/// The calibration's Envoy stats (see docs/operations.md, "Metrics").
#[derive(Debug, Default)]
struct CalibMetrics {
    /// Per model: base µs, ns per token, ps per token², interference µs, samples, in use.
    coefficients: HashMap<String, [Option<u32>; 11]>,
    /// Per model: the decode step's base µs, ns per sequence, ns per 1 000 tokens of context,
    /// samples.
    steps: HashMap<String, [Option<u32>; 4]>,
    /// Streams' decode steps taken in.
    step_samples: Option<u32>,
    /// (model, worker) → deviation in permille.
    deviations: HashMap<(String, String), Option<u32>>,
    /// (model, engine priority) → the promise margin a request at it gets, in permille.
    margins: HashMap<(String, i32), Option<u32>>,
    samples: Option<u32>,
    clipped: Option<u32>,
    rejected: Option<u32>,
    lost: Option<u32>,
    dropped: Option<u32>,
    /// Samples not learned from: another request may have raced them.
    shared: Option<u32>,
    /// Samples learned for their priority's promise margin only: a more urgent request passed
    /// them over.
    passed: Option<u32>,
    estimates: Option<u32>,
    good: Option<u32>,
    error_pct: Option<u32>,
}

impl CalibMetrics {
    fn define(models: &[(String, Profile)], workers: &[(&str, &str)], priorities: &[i32]) -> Self {
        let (c, g) = (MetricType::Counter, MetricType::Gauge);
        let mut m = CalibMetrics {
            samples: define(c, "kvroute.calibration.samples"),
            clipped: define(c, "kvroute.calibration.clipped_samples"),
            rejected: define(c, "kvroute.calibration.rejected_samples"),
            lost: define(c, "kvroute.calibration.lost_updates"),
            dropped: define(c, "kvroute.calibration.dropped_samples"),
            shared: define(c, "kvroute.calibration.shared_samples"),
            passed: define(c, "kvroute.calibration.passed_samples"),
            step_samples: define(c, "kvroute.calibration.step_samples"),
            estimates: define(c, "kvroute.calibration.estimates"),
            good: define(c, "kvroute.calibration.estimates_within_15pct"),
            error_pct: define(MetricType::Histogram, "kvroute.calibration.estimate_error_pct"),
            ..Default::default()
        };
        for (model, _) in models {
            let seg = worker_segment(model);
            let names = [
                "base_us",
                "prefill_ns_per_token",
                "prefill_sq_ps_per_token2",
                "interference_us",
                "queue_base_us",
                "queue_prefill_ns_per_token",
                "batch_fill_us",
                "promise_margin_permille",
                "busy_samples",
            ];
            let mut ids = [None; 11];
            for (i, n) in names.iter().chain(&["samples", "active"]).enumerate() {
                ids[i] = define(g, &format!("kvroute.calibration.{seg}.{n}"));
            }
            m.coefficients.insert(model.clone(), ids);
            let steps =
                ["step_base_us", "step_ns_per_seq", "step_ns_per_1k_context", "step_samples"]
                    .map(|n| define(g, &format!("kvroute.calibration.{seg}.{n}")));
            m.steps.insert(model.clone(), steps);
            for p in priorities {
                let level =
                    if *p < 0 { format!("minus_{}", p.unsigned_abs()) } else { p.to_string() };
                let name =
                    format!("kvroute.calibration.{seg}.priority.{level}.promise_margin_permille");
                m.margins.insert((model.clone(), *p), define(g, &name));
            }
        }
        for (model, worker) in workers {
            let name = format!(
                "kvroute.calibration.{}.worker.{}.deviation_permille",
                worker_segment(model),
                worker_segment(worker)
            );
            m.deviations.insert((model.to_string(), worker.to_string()), define(g, &name));
        }
        m
    }

    /// Sets the gauges of `model` from its state.
    fn publish(&self, model: &str, st: &ModelState) {
        let Some(ids) = self.coefficients.get(model) else { return };
        let [base, per_token, sq, interference, queue_base, queue_per_token, _, fill] =
            st.coefficients();
        let values = [
            base * 1e3,
            per_token * 1e6,
            sq * 1e9,
            interference * 1e3,
            queue_base * 1e3,
            queue_per_token * 1e6,
            fill * 1e3,
            st.promise_log.exp() * 1e3,
            f64::from(st.busy_samples),
            st.samples as f64,
        ];
        for (id, v) in ids.iter().zip(values) {
            gauge(*id, v.round() as u64);
        }
        for ((m, p), id) in &self.margins {
            if m == model {
                gauge(*id, (st.promise_margin_at(*p) * 1000.0).round() as u64);
            }
        }
        for w in &st.workers {
            if let Some(id) = self.deviations.get(&(model.to_owned(), w.worker.clone())) {
                gauge(*id, (w.log_dev.exp() * 1000.0).round() as u64);
            }
        }
    }

    /// Sets the decode step's gauges of `model` from its state.
    fn publish_steps(&self, model: &str, st: &StepState) {
        let Some(ids) = self.steps.get(model) else { return };
        let [base, per_seq, per_1k] = st.coefficients();
        let values = [base * 1e3, per_seq * 1e6, per_1k * 1e6, st.samples as f64];
        for (id, v) in ids.iter().zip(values) {
            gauge(*id, v.round() as u64);
        }
    }

    /// Whether `model` decides with its calibrated profile.
    fn active(&self, model: &str, on: bool) {
        if let Some(ids) = self.coefficients.get(model) {
            gauge(ids[10], u64::from(on));
        }
    }
}

impl CalibThread {
    /// Marks in the `active` gauges which models decide with calibrated profiles.
    pub fn publish_active(&self, view: &Calibrated) {
        for (model, _) in &self.models {
            self.metrics.active(model, view.profile_for(model).is_some());
        }
    }
}

impl crate::root::ThreadState {
    /// Hands a new calibrated view to the router.
    fn use_calibration(&self, view: Option<Arc<Calibrated>>) {
        if let Some(v) = view {
            self.calib.borrow().publish_active(&v);
            if let Ok(mut router) = self.router.try_borrow_mut() {
                router.set_calibration(v);
            }
        }
    }

    /// Request path: re-reads the shared calibration when `refresh_ms` passed.
    pub fn refresh_calibration(&self, now_ms: u64) {
        let view = self.calib.borrow_mut().refresh(&self.metrics, now_ms, false);
        self.use_calibration(view);
    }

    /// A routed, successful request's first byte `observed_ms` after its decision, from the
    /// worker its decision scored, sent at engine `priority`. Returns the requests the Envoys
    /// have in flight on that worker now (read with calibration on): the batch its first
    /// decode steps run in.
    pub fn calibration_sample(
        &self,
        model: &str,
        score: &Score,
        (observed_ms, priority): (f64, i32),
    ) -> Option<u32> {
        let now = crate::host::now_ms();
        let decided_ms = now.saturating_sub(observed_ms as u64);
        let enabled = self.calib.try_borrow().is_ok_and(|c| c.enabled());
        let view = enabled.then(|| self.load_view(now));
        let shared = view.as_ref().is_some_and(|view| {
            self.router
                .try_borrow()
                .is_ok_and(|r| r.knowledge().instant_shared(&score.worker, decided_ms, view))
        });
        let more_urgent =
            self.calib.try_borrow().map(|c| c.more_urgent(priority)).unwrap_or_default();
        let passed = !more_urgent.is_empty()
            && self.shard.try_borrow().is_ok_and(|s| {
                s.passed_over(
                    &HostStore,
                    &self.metrics,
                    score.worker.key(),
                    &more_urgent,
                    decided_ms,
                )
            });
        let sample = (observed_ms, priority);
        let raced = Raced { shared, passed };
        let calibrated = self.calib.borrow_mut().record(&self.metrics, model, score, sample, raced);
        self.use_calibration(calibrated);
        let router = self.router.try_borrow().ok()?;
        let own = view?.load_key(score.worker.key());
        Some(router.routed_load(&score.worker, own, now).inflight_requests)
    }

    /// The requests the Envoys have in flight on `worker` now (a stream's own among them), and
    /// the mean prompt of this thread's there: the batch a stream decodes in.
    pub fn batch_now(
        &self,
        worker: &kvroute_core::decision::worker::WorkerName,
    ) -> Option<(u32, Option<f64>)> {
        let now = crate::host::now_ms();
        let own = self.load_view(now).load_key(worker.key());
        let seen = self.router.try_borrow().ok()?.routed_load(worker, own, now);
        let mean = self.shard.try_borrow().ok()?.mean_context(worker.key());
        Some((seen.inflight_requests, mean))
    }

    /// A streamed answer of `model` timed its decode steps.
    pub fn step_sample(&self, model: &str, sample: StepSample) {
        let view = self
            .calib
            .try_borrow_mut()
            .ok()
            .and_then(|mut c| c.record_steps(&self.metrics, model, sample));
        self.use_calibration(view);
    }

    /// Tick: writes pending samples, re-reads every model's state and refreshes the gauges.
    pub fn calibration_tick(&self, now_ms: u64) {
        let mut calib = self.calib.borrow_mut();
        if !calib.enabled() {
            return;
        }
        let written = calib.flush(&self.metrics);
        let read = calib.refresh(&self.metrics, now_ms, true);
        drop(calib);
        self.use_calibration(read.or(written));
    }
}
