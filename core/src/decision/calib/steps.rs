//! The decode step, learned from the gaps between a stream's tokens: what one more sequence
//! and 1 000 more tokens of context add to each step a worker runs
//! ([`Profile::decode_ms_per_seq`], [`Profile::decode_ms_per_1k_context`]), the price of a new
//! stream's growth of the steps the worker's other streams run in
//! ([`crate::decision::cost::growth_ms`]).
//!
//! A streamed answer's tokens come one decode step apart. Its median gap (a step with some
//! prefill chunk in it is the exception, which the median leaves out) is one sample of
//!
//! ```text
//! step = base + per_seq · streams + per_1k_context · context / 1000
//! ```
//!
//! where `streams` are the requests in flight on the worker when it was sent, itself
//! included (those the growth price counts), and `context` their prompts' tokens: the
//! decision's own thread knows the prompts of the requests it sent there, and their mean
//! stands for every stream's. `base` (the weights read once per step) is learned with them
//! but not used: a new stream does not change it.
//!
//! Fitted like the TTFT model ([`super::estimator`]): weighted least squares with exponential
//! forgetting on relative errors, in units of the prior (the configured profile's two
//! coefficients, and [`STEP_UNIT_MS`] for the base, which has no prior), the two priors held as
//! `prior_weight` pseudo-observations, Huber down-weighting and the same box
//! `[prior / coefficient_bound, prior · coefficient_bound]`. Where the samples' contexts per
//! stream hardly differ, the two coefficients are nearly collinear: the data then fix what a
//! stream of that context adds to a step, not how it splits between the two (which matters
//! only for a prompt of another length). A coefficient the prior sets to 0 stays 0.
//!
//! The state lives in shared data next to the TTFT model's, under its own key
//! ([`crate::shared::calib::steps_key`]); its encoding is [`StepState::encode`].

use super::CalibrationConfig;
use crate::decision::cost::Profile;

/// Learned coefficients: the step's base, per sequence, per 1 000 tokens of context.
pub const STEP_DIM: usize = 3;
const PACKED: usize = STEP_DIM * (STEP_DIM + 1) / 2;
/// The unit the step's base is learned in (it has no prior: a unit, not a belief).
pub const STEP_UNIT_MS: f64 = 5.0;
/// Fewest gaps between a stream's tokens for its median to be a sample.
pub const MIN_GAPS: usize = 8;
/// Most gaps a stream records (its first steps' median is as good as all of them).
pub const MAX_GAPS: usize = 256;
/// Small ridge for directions the data never excite.
const RIDGE: f64 = 0.01;
const MIN_SCALE: f64 = 0.02;
const INITIAL_SCALE: f64 = 0.5;
const SCALE_RATE: f64 = 0.05;

/// One stream's observation. Holds no prompt text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSample {
    /// Requests in flight on the worker when the stream was sent, itself included.
    pub streams: f64,
    /// Their prompts' tokens, summed (estimated: see the module doc).
    pub context_tokens: f64,
    /// The median gap between the stream's tokens (ms).
    pub step_ms: f64,
}

/// Everything learned about one model's decode step; what shared data holds.
#[derive(Debug, Clone, PartialEq)]
pub struct StepState {
    /// The units the coefficients are relative to: [`STEP_UNIT_MS`], then the prior's
    /// `decode_ms_per_seq` and `decode_ms_per_1k_context` (a changed prior starts afresh).
    pub prior: [f64; STEP_DIM],
    pub samples: u64,
    /// Forgotten sum of sample weights.
    pub weight: f64,
    /// Forgotten information matrix (packed upper triangle) and right-hand side.
    pub a: [f64; PACKED],
    pub b: [f64; STEP_DIM],
    /// Coefficients relative to `prior`.
    pub theta: [f64; STEP_DIM],
    /// Robust scale of the relative residuals.
    pub scale: f64,
}

fn idx(i: usize, j: usize) -> usize {
    let (i, j) = if i <= j { (i, j) } else { (j, i) };
    i * STEP_DIM - i * (i + 1) / 2 + j
}

/// The units of a state learned against `prior`.
pub fn step_units(prior: &Profile) -> [f64; STEP_DIM] {
    [STEP_UNIT_MS, prior.decode_ms_per_seq, prior.decode_ms_per_1k_context]
}

impl StepState {
    pub fn new(prior: &Profile) -> Self {
        StepState {
            prior: step_units(prior),
            samples: 0,
            weight: 0.0,
            a: [0.0; PACKED],
            b: [0.0; STEP_DIM],
            theta: [1.0; STEP_DIM],
            scale: INITIAL_SCALE,
        }
    }

    /// Whether this state was learned against `prior`.
    pub fn matches(&self, prior: &Profile) -> bool {
        self.prior == step_units(prior)
    }

    /// The learned `(base, per sequence, per 1 000 tokens of context)`, in ms.
    pub fn coefficients(&self) -> [f64; STEP_DIM] {
        std::array::from_fn(|i| self.prior[i] * self.theta[i])
    }

    /// The learned `(decode_ms_per_seq, decode_ms_per_1k_context)` once there are
    /// `min_samples`.
    pub fn learned(&self, cfg: &CalibrationConfig) -> Option<(f64, f64)> {
        if !cfg.enabled || self.samples < cfg.min_samples {
            return None;
        }
        let [_, per_seq, per_1k] = self.coefficients();
        Some((per_seq, per_1k))
    }

    /// The model's step (ms) for a sample's streams and context.
    pub fn model_ms(&self, s: &StepSample) -> f64 {
        let x = features(s);
        (0..STEP_DIM).map(|i| x[i] * self.prior[i] * self.theta[i]).sum()
    }

    /// Takes in one sample; false when it is not usable (no positive step, no stream).
    pub fn observe(&mut self, cfg: &CalibrationConfig, s: &StepSample) -> bool {
        let usable = s.step_ms.is_finite()
            && s.step_ms > 0.0
            && s.streams.is_finite()
            && s.streams >= 1.0
            && s.context_tokens.is_finite()
            && s.context_tokens >= 0.0;
        if !usable {
            return false;
        }
        let x = features(s);
        let scaled: [f64; STEP_DIM] = std::array::from_fn(|i| x[i] * self.prior[i]);
        let prior_ms: f64 = scaled.iter().sum();
        let u = scaled.map(|v| v / prior_ms);
        let t = s.step_ms / prior_ms;
        let fitted: f64 = (0..STEP_DIM).map(|i| u[i] * self.theta[i]).sum();
        let r = t / fitted.max(f64::MIN_POSITIVE) - 1.0;
        let clip = cfg.outlier_clip * self.scale;
        let weight = if r.abs() <= clip { 1.0 } else { clip / r.abs() };
        self.scale = (self.scale + SCALE_RATE * (r.abs().min(clip) - self.scale)).max(MIN_SCALE);
        let lambda = cfg.forgetting();
        for i in 0..STEP_DIM {
            for j in i..STEP_DIM {
                let k = idx(i, j);
                self.a[k] = lambda * self.a[k] + weight * u[i] * u[j];
            }
            self.b[i] = lambda * self.b[i] + weight * u[i] * t;
        }
        self.weight = lambda * self.weight + weight;
        self.samples = self.samples.saturating_add(1);
        self.solve(cfg);
        true
    }

    /// The box-constrained solution with the two priors as `prior_weight` pseudo-observations
    /// spread like the data (`A · w0 / n`, the TTFT model's rule) and a small ridge; the base
    /// has no prior, only the ridge. Projected Gauss–Seidel, warm-started.
    #[allow(clippy::needless_range_loop)] // matrix code reads best with indices
    fn solve(&mut self, cfg: &CalibrationConfig) {
        let k = if self.weight > 0.0 { cfg.prior_weight / self.weight } else { 0.0 };
        let pull = |i: usize, j: usize| if i == 0 || j == 0 { 0.0 } else { k };
        let mut mat = [[0.0; STEP_DIM]; STEP_DIM];
        let mut c = [0.0; STEP_DIM];
        for i in 0..STEP_DIM {
            for j in 0..STEP_DIM {
                mat[i][j] = self.a[idx(i, j)] * (1.0 + pull(i, j)) + if i == j { RIDGE } else { 0.0 };
            }
            let prior_pull: f64 = (0..STEP_DIM).map(|j| self.a[idx(i, j)] * pull(i, j)).sum();
            c[i] = self.b[i] + prior_pull + RIDGE;
        }
        let (lo, hi) = (1.0 / cfg.coefficient_bound, cfg.coefficient_bound);
        for _ in 0..64 {
            let mut moved = 0.0f64;
            for i in 0..STEP_DIM {
                if self.prior[i] <= 0.0 {
                    self.theta[i] = 1.0;
                    continue;
                }
                let mut rhs = c[i];
                for j in (0..STEP_DIM).filter(|&j| j != i) {
                    rhs -= mat[i][j] * self.theta[j];
                }
                let next = (rhs / mat[i][i]).clamp(lo, hi);
                if next.is_finite() {
                    moved = moved.max((next - self.theta[i]).abs());
                    self.theta[i] = next;
                }
            }
            if moved < 1e-9 {
                break;
            }
        }
    }
}

/// The sample's features, in the order of [`step_units`].
pub fn features(s: &StepSample) -> [f64; STEP_DIM] {
    [1.0, s.streams, s.context_tokens / 1000.0]
}

/// A streamed answer's decode steps as a proxy sees them: the gaps between its server-sent
/// events, each event a step's token (the engines send one event per token and step). Holds
/// times and counts only.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSteps {
    streams: f64,
    context_tokens: f64,
    /// When the last chunk with an event arrived (ns; 0: none yet).
    last_ns: u64,
    gaps: Vec<f32>,
}

impl StreamSteps {
    /// A stream sent to a worker with `streams` requests in flight there, itself included,
    /// whose prompts hold `mean_context` tokens on average.
    pub fn new(streams: u32, mean_context: f64) -> Self {
        let streams = f64::from(streams.max(1));
        let context_tokens = streams * mean_context.max(0.0);
        StreamSteps { streams, context_tokens, last_ns: 0, gaps: Vec::new() }
    }

    /// A chunk of the response body arrived at `now_ns`. A chunk holding `k` events (several
    /// coalesced on the way) ends `k` steps since the last one; a chunk without one (the rest
    /// of an event split on the way, a body that is not an event stream) ends none.
    pub fn chunk(&mut self, now_ns: u64, chunk: &[u8]) {
        let k = token_events(chunk);
        if k == 0 {
            return;
        }
        if self.last_ns > 0 {
            let gap = now_ns.saturating_sub(self.last_ns) as f64 / 1e6 / k as f64;
            let room = MAX_GAPS.saturating_sub(self.gaps.len());
            self.gaps.extend(std::iter::repeat_n(gap as f32, k.min(room)));
        }
        self.last_ns = now_ns;
    }

    /// The gaps recorded so far.
    pub fn gaps(&self) -> usize {
        self.gaps.len()
    }

    /// The stream's sample, once it has [`MIN_GAPS`] gaps.
    pub fn sample(&self) -> Option<StepSample> {
        let step_ms = median_gap(&mut self.gaps.clone())?;
        Some(StepSample { streams: self.streams, context_tokens: self.context_tokens, step_ms })
    }
}

/// The token events in a chunk of an event stream: its `data:` fields, less the `[DONE]` that
/// ends an OpenAI stream.
pub fn token_events(chunk: &[u8]) -> usize {
    let data = memchr::memmem::find_iter(chunk, b"data:").count();
    data.saturating_sub(memchr::memmem::find_iter(chunk, b"[DONE]").count())
}

/// The median of a stream's gaps between tokens (ms), once it has [`MIN_GAPS`].
pub fn median_gap(gaps: &mut [f32]) -> Option<f64> {
    if gaps.len() < MIN_GAPS {
        return None;
    }
    let mid = gaps.len() / 2;
    let (_, m, _) = gaps.select_nth_unstable_by(mid, f32::total_cmp);
    Some(f64::from(*m))
}
