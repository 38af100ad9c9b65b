//! The estimator of one model: weighted least squares with exponential forgetting over the
//! cost model's eight coefficients (relative to the prior; each pair of per-token and
//! per-token² terms as one speed, see [`ModelState::observe`]), a ridge towards the prior, a
//! coupling of the queue's coefficients to the request's own, Huber down-weighting of
//! outliers, a box constraint, and per-worker deviations.

use std::collections::HashMap;
use std::f64::consts::LN_2;

use super::{CalibrationConfig, ModelView, Sample};
use crate::decision::cost::{Profile, QueueTerms, BATCH_FILL_MAX};

/// Learned coefficients: the request's own prefill (base, per token, per token²), decode
/// interference, then the queued prefill ahead of it (per request, per token, per token²) and
/// the batch fill of a busy worker.
pub const DIM: usize = 8;
/// The queue's base, coupled to the request's own (see [`ModelState::coupled`]); the queue's
/// coefficients run from it to [`BATCH_FILL`] (excluded).
const QUEUE_BASE: usize = 4;
/// The batch fill of a busy worker: learned on its own, not coupled.
const BATCH_FILL: usize = 7;
/// Entries of the packed upper triangle of a `DIM`×`DIM` matrix.
pub const PACKED: usize = DIM * (DIM + 1) / 2;
/// Floor of the robust residual scale (relative): noiseless data must not lock it at 0.
const MIN_SCALE: f64 = 0.02;
/// Starting robust scale: residuals of a prior several times off are not outliers.
pub const INITIAL_SCALE: f64 = 0.5;
/// Ridge towards the prior for directions the data do not excite (in units of one sample
/// that is all one term).
const RIDGE: f64 = 0.01;
/// Pseudo-observations (in units of one sample that is all one term) of "the queue's
/// coefficient equals its own counterpart": enough that a pool seldom queued learns its queue
/// from its own prefill, little enough that a few dozen queued samples tell them apart.
const COUPLING: f64 = 0.3;
/// The ridge of the queue's coefficients: much weaker than their coupling to the own ones
/// (`RIDGE`), so that without queued samples they follow those, not the prior.
const QUEUE_RIDGE: f64 = RIDGE / 100.0;
/// The quantile of observed over estimated TTFT behind a queue that admission promises with:
/// the share of promises made behind a queue it means to keep.
pub const PROMISE_QUANTILE: f64 = 0.95;
/// The step of the quantile tracker (log units): a sample above the quantile raises it by
/// `PROMISE_STEP · q`, one below lowers it by `PROMISE_STEP · (1 − q)`, so it settles where a
/// share `q` of samples lie below, rising within a few dozen samples of an overload.
pub(crate) const PROMISE_STEP: f64 = 0.04;
/// The largest promise margin.
pub const PROMISE_MARGIN_MAX: f64 = 4.0;
/// Most engine priorities whose promise quantile a model's state tracks apart.
pub const MAX_PRIORITIES: usize = 16;
/// A priority's own samples behind a queue before its own margin replaces the pool-wide one.
pub const PRIORITY_MIN_SAMPLES: u32 = 20;
/// Samples behind a queue before the pool-wide margin is taken as known: the samples its
/// tracker needs to climb from 1 to [`PROMISE_MARGIN_MAX`] (`ln 4 / (PROMISE_STEP · q)`,
/// rounded up), so that before them the margin may still be short of any overload's. Until
/// then a busy worker's promise also counts the rest of a whole step, a share that shrinks
/// with each sample ([`crate::decision::cost::QueueTerms::promise_fill_ms`]).
pub const PROMISE_FILL_SAMPLES: u32 = 37;
/// Rate of the robust scale's moving average.
const SCALE_RATE: f64 = 0.05;
/// A worker's samples before it counts in the pool's median deviation.
const MEDIAN_MIN_SAMPLES: u32 = 3;
/// The median is moved into the model once it is this far from 1 (log units).
const RECENTRE_LOG: f64 = 0.02;

/// The prior's learned coefficients, in the order of [`DIM`].
pub fn prior_coefficients(p: &Profile) -> [f64; DIM] {
    let q = p.queue_terms();
    [
        p.prefill_base_ms,
        p.prefill_ms_per_token,
        p.prefill_ms_per_token_sq,
        p.decode_interference_ms,
        q.step_ms,
        q.ms_per_token,
        q.ms_per_token_sq,
        q.batch_fill_ms,
    ]
}

/// One worker's deviation from the model.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerDev {
    pub worker: String,
    /// Natural log of the factor.
    pub log_dev: f64,
    pub samples: u32,
}

/// The promise quantile of the requests sent at one engine priority: on an engine that
/// schedules by priority, a class's requests wait behind different work (the urgent ones only
/// for what runs before them, the others for whatever comes after them too), so the estimate
/// misses them differently.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PriorityPromise {
    pub priority: i32,
    /// As [`ModelState::promise_log`], over this priority's samples only (it starts from the
    /// pool-wide value).
    pub log: f64,
    /// Its samples from busy workers.
    pub samples: u32,
}

/// Everything learned about one model; what shared data holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelState {
    /// The prior's coefficients this state is relative to (a changed prior starts afresh).
    pub prior: [f64; DIM],
    /// Samples taken in.
    pub samples: u64,
    /// Forgotten sum of sample weights (the data's effective count).
    pub weight: f64,
    /// Forgotten information matrix (packed upper triangle) and right-hand side.
    pub a: [f64; PACKED],
    pub b: [f64; DIM],
    /// Coefficients relative to the prior (1.0 = the prior's value).
    pub theta: [f64; DIM],
    /// Robust scale of the relative residuals.
    pub scale: f64,
    /// The tracked [`PROMISE_QUANTILE`] of `ln(observed / estimated)` over samples from busy
    /// workers (a prefill queued or running), within `[0, ln PROMISE_MARGIN_MAX]`: the log of
    /// [`crate::decision::cost::QueueTerms::promise_margin`].
    pub promise_log: f64,
    /// The same quantile per engine priority (sorted by priority, unique, at most
    /// [`MAX_PRIORITIES`]; empty until a sample at a priority other than 0): a request at a
    /// priority with [`PRIORITY_MIN_SAMPLES`] of its own is promised by them
    /// ([`ModelState::promise_margin_at`]).
    pub priorities: Vec<PriorityPromise>,
    /// Samples from busy workers taken into the promise quantile (saturating). Not in the
    /// encoding ([`ModelState::encode`] leaves it out, a decoded state counts none): shared
    /// data counts it under its own key up to [`PROMISE_FILL_SAMPLES`]
    /// ([`crate::shared::calib::busy_key`]), and a reader sets it from there.
    pub busy_samples: u32,
    /// Sorted by worker, unique.
    pub workers: Vec<WorkerDev>,
}

/// What became of one sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CalibOutcome {
    /// Taken in; `weight` < 1 when it was down-weighted as an outlier.
    Used { weight: f64 },
    /// Not usable: no positive time left after the fixed terms, or no features.
    Rejected,
    /// Passed over ([`Sample::passed`]): taken into its priority's promise margin only.
    MarginOnly,
}

fn idx(i: usize, j: usize) -> usize {
    packed_index(DIM, i, j)
}

/// Index of `(i, j)` in the packed upper triangle of a `dim`×`dim` matrix.
pub(super) fn packed_index(dim: usize, i: usize, j: usize) -> usize {
    let (i, j) = if i <= j { (i, j) } else { (j, i) };
    i * dim - i * (i + 1) / 2 + j
}

/// A least-squares system with exponential forgetting, as a state holds it: the packed
/// information matrix, the right-hand side, the forgotten sum of weights and the robust scale
/// of the residuals.
pub(super) struct Forgotten<'a> {
    pub a: &'a mut [f64],
    pub b: &'a mut [f64],
    pub weight: &'a mut f64,
    pub scale: &'a mut f64,
}

impl Forgotten<'_> {
    /// Takes in one sample `u · θ ≈ t` whose residual at the current fit is `r` (relative):
    /// down-weighted beyond `outlier_clip` robust scales (Huber), the scale moved towards
    /// `|r|`, and everything held before forgotten by one sample's factor. Returns its weight.
    pub fn add(self, cfg: &CalibrationConfig, u: &[f64], t: f64, r: f64) -> f64 {
        let clip = cfg.outlier_clip * *self.scale;
        let weight = if r.abs() <= clip { 1.0 } else { clip / r.abs() };
        *self.scale = (*self.scale + SCALE_RATE * (r.abs().min(clip) - *self.scale)).max(MIN_SCALE);
        let lambda = cfg.forgetting();
        let dim = u.len();
        for i in 0..dim {
            for j in i..dim {
                let k = packed_index(dim, i, j);
                self.a[k] = lambda * self.a[k] + weight * u[i] * u[j];
            }
            self.b[i] = lambda * self.b[i] + weight * u[i] * t;
        }
        *self.weight = lambda * *self.weight + weight;
        weight
    }
}

impl ModelState {
    pub fn new(prior: &Profile) -> Self {
        ModelState {
            prior: prior_coefficients(prior),
            samples: 0,
            weight: 0.0,
            a: [0.0; PACKED],
            b: [0.0; DIM],
            theta: [1.0; DIM],
            scale: INITIAL_SCALE,
            promise_log: 0.0,
            priorities: Vec::new(),
            busy_samples: 0,
            workers: Vec::new(),
        }
    }

    /// The promise margin of a request sent at engine `priority`: its priority's own quantile
    /// once it has [`PRIORITY_MIN_SAMPLES`], else the pool-wide one.
    pub fn promise_margin_at(&self, priority: i32) -> f64 {
        self.priorities
            .binary_search_by_key(&priority, |p| p.priority)
            .ok()
            .map(|i| self.priorities[i])
            .filter(|p| p.samples >= PRIORITY_MIN_SAMPLES)
            .map_or(self.promise_log, |p| p.log)
            .exp()
    }

    /// Whether this state was learned against `prior`.
    pub fn matches(&self, prior: &Profile) -> bool {
        self.prior == prior_coefficients(prior)
    }

    /// The learned coefficients in ms units.
    pub fn coefficients(&self) -> [f64; DIM] {
        let mut c = self.prior;
        for (c, t) in c.iter_mut().zip(&self.theta) {
            *c *= t;
        }
        c
    }

    /// `prior` with the learned coefficients in place of its own.
    pub fn profile(&self, prior: &Profile) -> Profile {
        let [base, per_token, sq, interference, step_ms, ms_per_token, ms_per_token_sq, fill] =
            self.coefficients();
        Profile {
            prefill_base_ms: base,
            prefill_ms_per_token: per_token,
            prefill_ms_per_token_sq: sq,
            decode_interference_ms: interference,
            queue: Some(QueueTerms {
                step_ms,
                ms_per_token,
                ms_per_token_sq,
                batch_fill_ms: fill,
                promise_margin: self.promise_log.exp(),
                promise_fill_ms: self.promise_fill_ms(prior, ms_per_token, fill),
            }),
            ..*prior
        }
    }

    /// [`crate::decision::cost::QueueTerms::promise_fill_ms`]: the rest of a whole step
    /// beyond the learned batch `fill` (`step_token_budget` tokens at the queue's learned
    /// `ms_per_token`), times the share of [`PROMISE_FILL_SAMPLES`] not yet seen from busy
    /// workers.
    fn promise_fill_ms(&self, prior: &Profile, ms_per_token: f64, fill: f64) -> f64 {
        let left = PROMISE_FILL_SAMPLES.saturating_sub(self.busy_samples);
        let step = prior.step_token_budget as f64 * ms_per_token * BATCH_FILL_MAX;
        (step - fill).max(0.0) * f64::from(left) / f64::from(PROMISE_FILL_SAMPLES)
    }

    /// The deviation factor of `worker` (1.0 if unknown).
    pub fn deviation(&self, worker: &str) -> f64 {
        self.find(worker).map_or(1.0, |i| self.workers[i].log_dev.exp())
    }

    fn find(&self, worker: &str) -> Option<usize> {
        self.workers.binary_search_by(|w| w.worker.as_str().cmp(worker)).ok()
    }

    /// The model's estimate (ms, without the deviation and the fixed terms) for a sample's
    /// features.
    pub fn model_ms(&self, s: &Sample) -> f64 {
        let x = features(s);
        (0..DIM).map(|i| x[i] * self.prior[i] * self.theta[i]).sum()
    }

    /// The router's view, once there are `min_samples`.
    pub fn view(&self, prior: &Profile, cfg: &CalibrationConfig) -> Option<ModelView> {
        if !cfg.enabled || self.samples < cfg.min_samples || !self.matches(prior) {
            return None;
        }
        let deviations: HashMap<u64, f64, crate::decision::worker::ByKey> = self
            .workers
            .iter()
            .filter(|w| w.samples >= cfg.min_worker_samples)
            .map(|w| (crate::decision::load::worker_key(&w.worker), w.log_dev.exp()))
            .collect();
        let margins = self
            .priorities
            .iter()
            .filter(|p| p.samples >= PRIORITY_MIN_SAMPLES)
            .map(|p| (p.priority, p.log.exp()))
            .collect();
        Some(ModelView { profile: self.profile(prior), deviations, samples: self.samples, margins })
    }

    /// Takes in one sample.
    pub fn observe(&mut self, cfg: &CalibrationConfig, s: &Sample) -> CalibOutcome {
        let y = s.observed_ms - s.fixed_ms.max(0.0);
        if !(s.observed_ms.is_finite() && s.fixed_ms.is_finite() && y > 0.0) {
            return CalibOutcome::Rejected;
        }
        // Where the filter tells the passed requests apart (`skip_passed`), one that no more
        // urgent request passed waited for the work ahead alone: learned from, its queue is
        // not stretched by the factor its estimate foresaw. Elsewhere that factor is the
        // best guess of what passed it.
        let known_unpassed = cfg.skip_passed && !s.passed;
        let x = if known_unpassed { features_at(s, 1.0) } else { features(s) };
        let mut scaled: [f64; DIM] = std::array::from_fn(|i| x[i] * self.prior[i]);
        let prior_ms: f64 = scaled.iter().sum();
        // Each attention term is learned with its per-token term, as one prefill speed.
        for (keep, fold) in self.tied() {
            scaled[keep] += scaled[fold];
            scaled[fold] = 0.0;
        }
        if !(prior_ms.is_finite() && prior_ms > 0.0) {
            return CalibOutcome::Rejected;
        }
        let u = scaled.map(|v| v / prior_ms);
        let dev = self.deviation(&s.worker);
        let t = y / dev / prior_ms;
        let fitted: f64 = (0..DIM).map(|i| u[i] * self.theta[i]).sum();
        let queued = crate::decision::cost::busy(&s.load) > 0.0;
        // The promise's own estimate: the model's as the decision took it (the urgent work
        // foreseen to pass it included), with the fill it foresaw.
        let estimated = if known_unpassed && s.wait_factor > 1.0 {
            self.model_ms(s) / prior_ms
        } else {
            fitted
        };
        let fill = if s.fill_ms.is_finite() { s.fill_ms.max(0.0) / dev / prior_ms } else { 0.0 };
        let promised = estimated + fill;
        if s.passed {
            if queued {
                self.track_promise(t / promised, s.priority, false);
            }
            return CalibOutcome::MarginOnly;
        }
        if queued {
            self.track_promise(t / promised, s.priority, true);
        }
        let sys = Forgotten {
            a: &mut self.a,
            b: &mut self.b,
            weight: &mut self.weight,
            scale: &mut self.scale,
        };
        let weight = sys.add(cfg, &u, t, t - fitted);
        self.samples = self.samples.saturating_add(1);
        self.solve(cfg);
        self.update_deviation(cfg, &s.worker, y / (prior_ms * fitted.max(f64::MIN_POSITIVE)));
        // A pool-wide change of speed is read where nothing is queued ahead: behind a queue,
        // what the model misses at first is the traffic's (how batches fill, learned as the
        // batch fill), alike on every worker, and recentring it would move it into every
        // coefficient, the request's own prefill included, and into all past samples.
        if !queued {
            self.recentre(cfg);
        }
        CalibOutcome::Used { weight }
    }

    /// The box-constrained solution with:
    /// - the prior as `prior_weight` pseudo-observations spread like the data (`A · w0 / n`,
    ///   so it pulls hardest where the data say most), for all but the batch fill;
    /// - a small ridge for directions the data never excite;
    /// - each queue coefficient held to its own counterpart by [`COUPLING`] pseudo-observations
    ///   of their difference (so without queued samples the queue costs what the request's own
    ///   prefill does, and samples behind a queue move it apart).
    ///
    /// Solved by projected Gauss–Seidel (the matrix is symmetric positive definite, so it
    /// converges; warm-started).
    #[allow(clippy::needless_range_loop)] // matrix code reads best with indices
    fn solve(&mut self, cfg: &CalibrationConfig) {
        let k = if self.weight > 0.0 { cfg.prior_weight / self.weight } else { 0.0 };
        // The coupling, in the relative units of theta: `mu · (r_q θ_q − r_o θ_o)²` with `r`
        // the prior ratio, which is 1 for a configured profile.
        let coupling = self.coupling();
        let ridge =
            |i: usize| if (QUEUE_BASE..BATCH_FILL).contains(&i) { QUEUE_RIDGE } else { RIDGE };
        // The batch fill's prior is a small start, not a belief: the prior's pull leaves it out.
        let pull = |i: usize, j: usize| if i == BATCH_FILL || j == BATCH_FILL { 0.0 } else { k };
        let m = |i: usize, j: usize| {
            self.a[idx(i, j)] * (1.0 + pull(i, j))
                + coupling[i][j]
                + if i == j { ridge(i) } else { 0.0 }
        };
        // The system's matrix, built once: the iterations below only read it.
        let mut mat = [[0.0; DIM]; DIM];
        for (i, row) in mat.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = m(i, j);
            }
        }
        let mut c = [0.0; DIM];
        for (i, ci) in c.iter_mut().enumerate() {
            let prior_pull: f64 = (0..DIM).map(|j| self.a[idx(i, j)] * pull(i, j)).sum();
            *ci = self.b[i] + prior_pull + ridge(i);
        }
        for _ in 0..64 {
            let mut moved = 0.0f64;
            for i in 0..DIM {
                if self.prior[i] <= 0.0 {
                    self.theta[i] = 1.0;
                    continue;
                }
                let diag = mat[i][i];
                let mut rhs = c[i];
                for j in (0..DIM).filter(|&j| j != i) {
                    rhs -= mat[i][j] * self.theta[j];
                }
                let (lo, hi) = theta_bounds(cfg, i);
                let next = (rhs / diag).clamp(lo, hi);
                if next.is_finite() {
                    moved = moved.max((next - self.theta[i]).abs());
                    self.theta[i] = next;
                }
            }
            if moved < 1e-9 {
                break;
            }
        }
        for (keep, fold) in self.tied() {
            if self.prior[fold] > 0.0 {
                self.theta[fold] = self.theta[keep];
            }
        }
    }

    /// The coupling's terms of the system's matrix: for each coupled pair `(q, o)` whose
    /// priors are both set, `mu · r_q²` and `mu · r_o²` on the diagonal and `−mu · r_q · r_o`
    /// off it, summed over the pairs in order.
    fn coupling(&self) -> [[f64; DIM]; DIM] {
        let mut c = [[0.0; DIM]; DIM];
        for (q, o) in self.coupled() {
            if !(self.prior[q] > 0.0 && self.prior[o] > 0.0) {
                continue;
            }
            let r = |x: usize| self.prior[x] / self.prior[q].max(self.prior[o]);
            for (i, j) in [(q, q), (o, o), (q, o), (o, q)] {
                c[i][j] += if i == j { COUPLING * r(i) * r(i) } else { -COUPLING * r(q) * r(o) };
            }
        }
        c
    }

    /// Moves the promise quantile towards `ratio` (observed over what the decision estimated),
    /// that of the request's engine `priority` and, with `pool_wide`, the pool-wide one (a
    /// request passed over teaches only its own priority's).
    fn track_promise(&mut self, ratio: f64, priority: i32, pool_wide: bool) {
        if !(ratio.is_finite() && ratio > 0.0) {
            return;
        }
        // Nothing apart until a request at a priority other than 0 is seen (or one passed
        // over, which a more urgent priority passed): before that, the pool-wide quantile is
        // priority 0's, sample for sample.
        let apart = !pool_wide || priority != 0 || !self.priorities.is_empty();
        let at = match self.priorities.binary_search_by_key(&priority, |p| p.priority) {
            Ok(i) => Some(i),
            Err(i) if apart && self.priorities.len() < MAX_PRIORITIES => {
                let fresh = PriorityPromise { priority, log: self.promise_log, samples: 0 };
                self.priorities.insert(i, fresh);
                Some(i)
            }
            Err(_) => None,
        };
        let x = ratio.ln();
        self.busy_samples = self.busy_samples.saturating_add(1);
        if pool_wide {
            self.promise_log = quantile_step(self.promise_log, x);
        }
        if let Some(p) = at.map(|i| &mut self.priorities[i]) {
            p.log = quantile_step(p.log, x);
            p.samples = p.samples.saturating_add(1);
        }
    }

    /// Each queue coefficient and the own one it is held to, `(queue, own)`: the bases and the
    /// kept per-token terms (the folded ones follow those).
    fn coupled(&self) -> [(usize, usize); 2] {
        let [own, queue] = self.tied();
        [(QUEUE_BASE, 0), (queue.0, own.0)]
    }

    /// A prefill's two per-token coefficients move together (the request's own and the
    /// queue's): `(kept, folded)` indices, the folded one following the kept one. The ratio of
    /// attention to linear work is a property of the model's shape (layers, heads, hidden
    /// size), which the configured profile states; the GPU, its clocks and its neighbours
    /// change the speed of both alike. Learned apart, the two are nearly collinear over the few
    /// prompt lengths a pool sees in a while, and the square term (the least excited) wanders
    /// several times off while their sum fits.
    fn tied(&self) -> [(usize, usize); 2] {
        [(1, 2), (5, 6)].map(|(a, b)| if self.prior[a] > 0.0 { (a, b) } else { (b, a) })
    }

    fn update_deviation(&mut self, cfg: &CalibrationConfig, worker: &str, ratio: f64) {
        if !(ratio.is_finite() && ratio > 0.0) {
            return;
        }
        let (lo, hi) = (cfg.deviation_min.ln(), cfg.deviation_max.ln());
        let i = match self.find(worker) {
            Some(i) => i,
            None if self.workers.len() < cfg.max_workers && worker.len() <= 255 => {
                let w = WorkerDev { worker: worker.to_owned(), log_dev: 0.0, samples: 0 };
                let at = self.workers.partition_point(|w| w.worker.as_str() < worker);
                self.workers.insert(at, w);
                at
            }
            None => return,
        };
        let w = &mut self.workers[i];
        let rate = cfg.deviation_rate().max(1.0 / f64::from(w.samples.saturating_add(1)));
        // One sample moves the factor by at most a doubling or halving from where it is (a
        // stalled request 20x late is one sample among many, not a new speed); a worker that
        // really changed keeps moving it, sample after sample.
        let step = (ratio.ln().clamp(lo, hi) - w.log_dev).clamp(-LN_2, LN_2);
        w.log_dev = (w.log_dev + rate * step).clamp(lo, hi);
        w.samples = w.samples.saturating_add(1);
    }

    /// Moves the pool's median deviation into the model, so that deviations say how a worker
    /// differs from the typical one and a pool-wide change moves the coefficients.
    fn recentre(&mut self, cfg: &CalibrationConfig) {
        let mut logs: Vec<f64> = self
            .workers
            .iter()
            .filter(|w| w.samples >= MEDIAN_MIN_SAMPLES)
            .map(|w| w.log_dev)
            .collect();
        if logs.is_empty() {
            return;
        }
        logs.sort_by(f64::total_cmp);
        let m = logs[(logs.len() - 1) / 2];
        if m.abs() < RECENTRE_LOG {
            return;
        }
        let factor = m.exp();
        let (lo, hi) = (cfg.deviation_min.ln(), cfg.deviation_max.ln());
        for w in &mut self.workers {
            w.log_dev = (w.log_dev - m).clamp(lo, hi);
        }
        for v in &mut self.b {
            *v *= factor;
        }
        for (i, t) in self.theta.iter_mut().enumerate() {
            let (lo, hi) = theta_bounds(cfg, i);
            *t = (*t * factor).clamp(lo, hi);
        }
    }
}

/// A quantile tracker's next value (log units) after a sample `x`: up by `PROMISE_STEP · q`
/// when above, down by `PROMISE_STEP · (1 − q)` when not, within `[0, ln PROMISE_MARGIN_MAX]`.
fn quantile_step(log: f64, x: f64) -> f64 {
    let step = if x > log {
        PROMISE_STEP * PROMISE_QUANTILE
    } else {
        -PROMISE_STEP * (1.0 - PROMISE_QUANTILE)
    };
    (log + step).clamp(0.0, PROMISE_MARGIN_MAX.ln())
}

/// The bounds of coefficient `i` relative to its prior: `[1 / bound, bound]`, except that the
/// batch fill may grow from its small prior to a whole step
/// ([`crate::decision::cost::BATCH_FILL_MAX`]) at up to `bound` times the prior's speed.
pub fn theta_bounds(cfg: &CalibrationConfig, i: usize) -> (f64, f64) {
    use crate::decision::cost::{BATCH_FILL_MAX, BATCH_FILL_PRIOR};
    let (lo, hi) = (1.0 / cfg.coefficient_bound, cfg.coefficient_bound);
    if i == BATCH_FILL {
        (lo, hi * (BATCH_FILL_MAX / BATCH_FILL_PRIOR).max(1.0))
    } else {
        (lo, hi)
    }
}

/// The sample's features, in the order of [`prior_coefficients`].
/// The queued prefill's features are taken times the sample's [`Sample::wait_factor`], as the
/// estimate took them.
pub fn features(s: &Sample) -> [f64; DIM] {
    let f = if s.wait_factor.is_finite() && s.wait_factor > 1.0 { s.wait_factor } else { 1.0 };
    features_at(s, f)
}

/// The sample's features with the queued prefill's taken times `f`.
fn features_at(s: &Sample, f: f64) -> [f64; DIM] {
    [
        1.0,
        s.uncached_tokens as f64,
        crate::decision::cost::attention_tokens(s.uncached_tokens, s.cached_tokens),
        f64::from(s.load.decoding_requests()),
        crate::decision::cost::queued_steps(&s.load) * f,
        s.load.prefill_tokens as f64 * f,
        s.load.prefill_sq_tokens as f64 * f,
        crate::decision::cost::busy(&s.load),
    ]
}
