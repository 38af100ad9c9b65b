//! The decode step, learned from the gaps between a stream's tokens: what one more sequence
//! and 1 000 more tokens of context add to each step a worker runs
//! ([`Profile::decode_ms_per_seq`], [`Profile::decode_ms_per_1k_context`]), the price of a new
//! stream's growth of the steps the worker's other streams run in
//! ([`crate::decision::cost::growth_ms`]).
//!
//! A streamed answer's tokens come one decode step apart. The median of its mean gap over four
//! consecutive steps (a step with some prefill chunk in it is the exception, which the median
//! leaves out; the mean evens out a timer's whole milliseconds) is one sample of
//!
//! ```text
//! step = base + per_seq · streams + per_1k_context · context / 1000
//! ```
//!
//! where `streams` are the requests in flight on the worker while it decodes, itself included
//! (what the growth price counts: the Envoys' requests there, seen at its first byte and again
//! after a few steps, see [`StreamSteps::batch`]), and `context` their prompts' tokens: the
//! deciding thread knows the prompts of the requests it sent there, and their mean stands for
//! every stream's. `base` (the weights read once per step) is learned with them
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

use super::estimator::{packed_index, Forgotten, INITIAL_SCALE};
use super::CalibrationConfig;
use crate::decision::cost::Profile;

/// Learned coefficients: the step's base, per sequence, per 1 000 tokens of context.
pub const STEP_DIM: usize = 3;
const PACKED: usize = STEP_DIM * (STEP_DIM + 1) / 2;
/// The unit the step's base is learned in (it has no prior: a unit, not a belief).
pub const STEP_UNIT_MS: f64 = 5.0;
/// Fewest gaps between a stream's tokens for its median to be a sample.
pub const MIN_GAPS: usize = 8;
/// The gaps after which a stream's batch is looked at again, beside its first byte (see
/// [`StreamSteps::batch`]).
pub const BATCH_AT_GAPS: [usize; 2] = [4, 16];
/// Consecutive gaps averaged before the median ([`median_gap`]).
pub const WINDOW: usize = 4;
/// Most gaps a stream records (its first steps' median is as good as all of them).
pub const MAX_GAPS: usize = 256;
/// A ridge towards the prior for directions the data never excite, in units of one sample
/// that is all one term: far below what a few dozen streams of unlike batch sizes say of how
/// a step's cost splits between the base and the streams (about 0.01), which a larger ridge
/// would tilt.
const RIDGE: f64 = 1e-4;

/// One stream's observation. Holds no prompt text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSample {
    /// Requests in flight on the worker while the stream decoded, itself included.
    pub streams: f64,
    /// Their prompts' tokens, summed (estimated: see the module doc).
    pub context_tokens: f64,
    /// The stream's step: the median of its four-step mean gaps (ms, see [`median_gap`]).
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
    packed_index(STEP_DIM, i, j)
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
        if !(cfg.enabled && cfg.learn_decode_step) || self.samples < cfg.min_samples {
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
        let sys = Forgotten {
            a: &mut self.a,
            b: &mut self.b,
            weight: &mut self.weight,
            scale: &mut self.scale,
        };
        sys.add(cfg, &u, t, t / fitted.max(f64::MIN_POSITIVE) - 1.0);
        self.samples = self.samples.saturating_add(1);
        self.solve(cfg);
        true
    }

    /// The box-constrained solution with the two priors as `prior_weight` pseudo-observations
    /// spread like the data's information on them and a small ridge; the base has no prior,
    /// only the ridge. Exact: the two per-stream coefficients are nearly
    /// collinear wherever streams' prompts are alike, where an iterative solver creeps, so
    /// every way of holding each coefficient free or at one of its bounds is solved and the
    /// feasible one of least cost kept (27 systems of at most 3 unknowns).
    #[allow(clippy::needless_range_loop)] // matrix code reads best with indices
    fn solve(&mut self, cfg: &CalibrationConfig) {
        let k = if self.weight > 0.0 { cfg.prior_weight / self.weight } else { 0.0 };
        // The prior's pull on the two per-stream coefficients: `k` times what the data say
        // of them once the base is fitted (the Schur complement of the base), not the raw
        // information, most of which a base that moves with them explains too: spread like
        // that, the pull would tilt the line, the base trading off against the slope.
        let a = |i: usize, j: usize| self.a[idx(i, j)];
        let pull = |i: usize, j: usize| {
            if i == 0 || j == 0 {
                0.0
            } else if a(0, 0) > 0.0 {
                k * (a(i, j) - a(i, 0) * a(0, j) / a(0, 0))
            } else {
                k * a(i, j)
            }
        };
        let mut mat = [[0.0; STEP_DIM]; STEP_DIM];
        let mut c = [0.0; STEP_DIM];
        for i in 0..STEP_DIM {
            for j in 0..STEP_DIM {
                mat[i][j] = a(i, j) + pull(i, j) + if i == j { RIDGE } else { 0.0 };
            }
            c[i] = self.b[i] + (0..STEP_DIM).map(|j| pull(i, j)).sum::<f64>() + RIDGE;
        }
        let (lo, hi) = (1.0 / cfg.coefficient_bound, cfg.coefficient_bound);
        // A coefficient the prior sets to 0 stays at 1 (times 0).
        let fixed = |i: usize| self.prior[i] <= 0.0;
        let cost = |t: &[f64; STEP_DIM]| {
            let mut q = 0.0;
            for i in 0..STEP_DIM {
                q -= c[i] * t[i];
                for j in 0..STEP_DIM {
                    q += 0.5 * t[i] * mat[i][j] * t[j];
                }
            }
            q
        };
        let mut best: Option<([f64; STEP_DIM], f64)> = None;
        for code in 0..27usize {
            // Per coefficient: 0 free, 1 at its lower bound, 2 at its upper bound.
            let how: [usize; STEP_DIM] = std::array::from_fn(|i| code / 3usize.pow(i as u32) % 3);
            if (0..STEP_DIM).any(|i| fixed(i) && how[i] != 0) {
                continue;
            }
            let mut t = [1.0; STEP_DIM];
            for i in 0..STEP_DIM {
                t[i] = match how[i] {
                    1 => lo,
                    2 => hi,
                    _ => 1.0,
                };
            }
            let free: Vec<usize> = (0..STEP_DIM).filter(|&i| how[i] == 0 && !fixed(i)).collect();
            let Some(x) = solve_free(&mat, &c, &t, &free) else { continue };
            for (&i, v) in free.iter().zip(x) {
                t[i] = v;
            }
            let feasible = free.iter().all(|&i| t[i].is_finite() && (lo..=hi).contains(&t[i]));
            let q = cost(&t);
            if feasible && best.is_none_or(|(_, b)| q < b) {
                best = Some((t, q));
            }
        }
        if let Some((t, _)) = best {
            self.theta = t;
        }
    }
}

/// The free coefficients' values minimising the quadratic with the others held at `t`: the
/// system `mat[free][free] · x = c[free] − mat[free][held] · t[held]`, by Gaussian elimination
/// with partial pivoting; `None` where it is singular.
#[allow(clippy::needless_range_loop)]
fn solve_free(
    mat: &[[f64; STEP_DIM]; STEP_DIM],
    c: &[f64; STEP_DIM],
    t: &[f64; STEP_DIM],
    free: &[usize],
) -> Option<Vec<f64>> {
    let n = free.len();
    let mut m: Vec<Vec<f64>> = free
        .iter()
        .map(|&i| {
            let held: f64 =
                (0..STEP_DIM).filter(|j| !free.contains(j)).map(|j| mat[i][j] * t[j]).sum();
            let mut row: Vec<f64> = free.iter().map(|&j| mat[i][j]).collect();
            row.push(c[i] - held);
            row
        })
        .collect();
    for col in 0..n {
        let pivot = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[pivot][col].abs() < 1e-300 {
            return None;
        }
        m.swap(col, pivot);
        for r in 0..n {
            if r != col {
                let f = m[r][col] / m[col][col];
                for k in col..=n {
                    m[r][k] -= f * m[col][k];
                }
            }
        }
    }
    Some((0..n).map(|i| m[i][n] / m[i][i]).collect())
}

/// The sample's features, in the order of [`step_units`].
pub fn features(s: &StepSample) -> [f64; STEP_DIM] {
    [1.0, s.streams, s.context_tokens / 1000.0]
}

/// A streamed answer's decode steps as a proxy sees them: the gaps between its server-sent
/// events, each event a step's token (the engines send one event per token and step), and the
/// batch it decoded in. Holds times and counts only.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSteps {
    /// The decision's count of requests in flight on the worker, itself included, and the
    /// mean prompt of those whose prompts were known: what stands for the batch when it was
    /// not seen again.
    decided: (f64, f64),
    /// The batch seen since (at the first byte, and after [`BATCH_AT_GAPS`] gaps): requests
    /// in flight there, the mean prompt of those known.
    seen: Vec<(f64, Option<f64>)>,
    /// How many of [`BATCH_AT_GAPS`] have been looked at.
    looked: usize,
    /// When the last chunk with an event arrived (ns; 0: none yet).
    last_ns: u64,
    gaps: Vec<f32>,
}

impl StreamSteps {
    /// A stream sent to a worker with `streams` requests in flight there, itself included,
    /// whose prompts hold `mean_context` tokens on average.
    pub fn new(streams: u32, mean_context: f64) -> Self {
        let decided = (f64::from(streams.max(1)), mean_context.max(0.0));
        StreamSteps { decided, seen: Vec::new(), looked: 0, last_ns: 0, gaps: Vec::new() }
    }

    /// The worker's batch seen while the stream runs (at its first byte, and when
    /// [`StreamSteps::wants_batch`] says): the requests in flight there, itself included, and
    /// the mean prompt of those whose prompts are known. Requests sent after the stream that
    /// decode beside it, and those that end before it, are in some counts and not others; the
    /// stream's batch is taken as the mean of the counts seen. Not at its end: streams sent
    /// together end together, and whichever is seen ending last would count none of the others.
    pub fn batch(&mut self, streams: u32, mean_context: Option<f64>) {
        if self.seen.len() <= BATCH_AT_GAPS.len() {
            self.seen.push((f64::from(streams.max(1)), mean_context.map(|m| m.max(0.0))));
        }
    }

    /// Whether the stream has just reached one of [`BATCH_AT_GAPS`], where its batch is looked
    /// at again (once each).
    pub fn wants_batch(&mut self) -> bool {
        match BATCH_AT_GAPS.get(self.looked) {
            Some(at) if self.gaps.len() >= *at => {
                self.looked += 1;
                true
            }
            _ => false,
        }
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

    /// The stream's sample, once it has [`MIN_GAPS`] gaps: its median gap, the mean batch
    /// seen (the decision's where none was), and that batch times the mean prompt known.
    pub fn sample(&self) -> Option<StepSample> {
        let step_ms = median_gap(&self.gaps)?;
        let (streams, mean) = if self.seen.is_empty() {
            self.decided
        } else {
            let n = self.seen.len() as f64;
            let streams = self.seen.iter().map(|(s, _)| s).sum::<f64>() / n;
            let known: Vec<f64> = self.seen.iter().filter_map(|(_, m)| *m).collect();
            let mean = if known.is_empty() {
                self.decided.1
            } else {
                known.iter().sum::<f64>() / known.len() as f64
            };
            (streams, mean)
        };
        Some(StepSample { streams, context_tokens: streams * mean, step_ms })
    }
}

/// The token events in a chunk of an event stream: its `data:` fields, less the `[DONE]` that
/// ends an OpenAI stream.
pub fn token_events(chunk: &[u8]) -> usize {
    let data = memchr::memmem::find_iter(chunk, b"data:").count();
    data.saturating_sub(memchr::memmem::find_iter(chunk, b"[DONE]").count())
}

/// The median over a stream of its mean gap in [`WINDOW`] consecutive steps (ms), once it has
/// [`MIN_GAPS`] gaps. The median leaves out the windows where a prefill chunk ran in a step;
/// the mean within a window evens out when each step's end is seen: a timer that wakes on
/// whole milliseconds (a simulated engine's, an event loop's) makes steps of 5.5 ms come 5 and
/// 6 ms apart, whose median would be either.
pub fn median_gap(gaps: &[f32]) -> Option<f64> {
    if gaps.len() < MIN_GAPS {
        return None;
    }
    let mut means: Vec<f64> = gaps
        .windows(WINDOW)
        .map(|w| w.iter().map(|g| f64::from(*g)).sum::<f64>() / WINDOW as f64)
        .collect();
    let mid = means.len() / 2;
    let (_, m, _) = means.select_nth_unstable_by(mid, f64::total_cmp);
    Some(*m)
}
