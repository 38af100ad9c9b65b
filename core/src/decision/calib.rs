//! Online calibration of the cost model: what Envoy observes (time from the decision to the
//! first response byte) teaches each model's prefill and waiting coefficients, and a
//! multiplicative deviation per worker on top (a slower GPU, a noisy neighbour).
//!
//! The cost model is linear in its coefficients once the decision's features are fixed:
//!
//! ```text
//! ttft - transfer - adapter = base + per_token · uncached
//!                           + per_token_sq · uncached · (2 · cached + uncached)
//!                           + interference · decoding
//!                           + queue_base · steps + queue_per_token · queued
//!                           + queue_per_token_sq · queued²
//! ```
//!
//! where `steps` are the step floors waited for ([`crate::decision::cost::queued_steps`]: one per
//! prefilling request), `queued²` is the sum of the
//! queued prompts' squares (see [`crate::decision::cost::Profile::wait_ms`] and
//! [`crate::decision::cost::Profile::prefill_with_context_ms`]). The queue has coefficients of
//! its own ([`crate::decision::cost::QueueTerms`]): behind a queue an engine's batching adds
//! what the prompts arriving after a request cost it, which is traffic, not the worker's
//! speed; learned apart, it cannot drag the request's own prefill coefficients along, so a
//! request on an idle worker is estimated right as soon as an overload ends. The queue's
//! coefficients are held to the own ones by a fraction of one pseudo-observation of their
//! difference, which queued samples soon overcome. The [`estimator`] fits the coefficients
//! (each pair of per-token ones as one prefill speed) by weighted least squares with exponential
//! forgetting, in units relative to the configured profile (the prior, kept as a ridge of
//! `prior_weight` pseudo-observations) and on relative errors (each sample is divided by the
//! prior's estimate, so a 20 ms and a 2 s request weigh alike). Coefficients stay within
//! `[prior / coefficient_bound, prior · coefficient_bound]` (a coefficient the prior sets to 0
//! stays 0); residuals beyond `outlier_clip` robust scales are down-weighted (Huber). A
//! worker's deviation is an exponentially weighted geometric mean of observed / model over its
//! own samples, clamped to `[deviation_min, deviation_max]`; the deviations are kept centred
//! on the pool's (lower) median worker, the model describing that worker.
//!
//! The state lives in shared data (see [`crate::shared::calib`]) so every Envoy thread learns
//! from every other's samples; [`Calibrated`] is the read-only view a router decides with.

pub mod codec;
pub mod estimator;
pub mod steps;
#[cfg(test)]
mod steps_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::decision::cost::Profile;
use crate::decision::load::WorkerLoad;

pub use estimator::{CalibOutcome, ModelState, WorkerDev, PROMISE_FILL_SAMPLES};
pub use steps::{StepSample, StepState};

/// The `calibration` section of the filter configuration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct CalibrationConfig {
    /// Learn and use calibrated coefficients (samples are not even recorded when false).
    pub enabled: bool,
    /// Samples after which an old sample weighs half as much as a new one.
    #[cfg_attr(feature = "schema", schemars(extend("exclusiveMinimum" = 0)))]
    pub half_life_samples: f64,
    /// Weight of the configured profile, in pseudo-observations (a ridge towards it).
    #[cfg_attr(feature = "schema", schemars(extend("exclusiveMinimum" = 0)))]
    pub prior_weight: f64,
    /// Samples of a model before its calibrated profile replaces the configured one.
    pub min_samples: u64,
    /// Residuals beyond this many robust scales are down-weighted (Huber).
    #[cfg_attr(feature = "schema", schemars(extend("exclusiveMinimum" = 0)))]
    pub outlier_clip: f64,
    /// Coefficients stay within `[prior / bound, prior · bound]`.
    #[cfg_attr(feature = "schema", schemars(range(min = 1.0)))]
    pub coefficient_bound: f64,
    /// Lower bound of a worker's deviation factor (0 < min <= 1).
    #[cfg_attr(feature = "schema", schemars(range(max = 1.0), extend("exclusiveMinimum" = 0)))]
    pub deviation_min: f64,
    /// Upper bound of a worker's deviation factor (>= 1).
    #[cfg_attr(feature = "schema", schemars(range(min = 1.0)))]
    pub deviation_max: f64,
    /// A worker's own samples after which an old one weighs half as much in its deviation.
    #[cfg_attr(feature = "schema", schemars(extend("exclusiveMinimum" = 0)))]
    pub deviation_half_life_samples: f64,
    /// A worker's samples before its deviation is applied.
    pub min_worker_samples: u32,
    /// Most workers per model that get a deviation (more are served by the model alone).
    #[cfg_attr(feature = "schema", schemars(range(max = codec::MAX_WORKERS)))]
    pub max_workers: usize,
    /// A thread re-reads the shared state at most this often on the request path.
    pub refresh_ms: u64,
    /// A thread writes its samples to shared data once it holds this many (and on its tick).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 4096)))]
    pub flush_samples: usize,
    /// Requests that another request to the same worker may have raced are not learned from:
    /// one sent by another thread of this Envoy in the same millisecond, or one another replica
    /// routed there whose credit the updater stamped within [`SHARED_INSTANT_MS`] of this
    /// decision. Neither decision could count the other's, and the first byte of the one queued
    /// second holds the other's prefill, which its features do not: learned from, it makes the
    /// workers look slower than they are (their estimates still count in the error metrics).
    pub skip_shared_instants: bool,
    /// Requests passed over teach only their own priority's promise margin: on an engine that
    /// schedules by priority (some admission class sets an `engine_priority`), a request whose
    /// first byte came after the first token of a more urgent one sent to the same worker
    /// after it (as this Envoy's threads saw them). Its decision could not count that one,
    /// which the engine ran first: learned from, such first bytes make the workers look slower
    /// than they are, and the most urgent class, which nothing passes, is then estimated too
    /// long. Being passed over is a risk of its class's promises, so its margin and the count
    /// of samples from busy workers still take it in; the coefficients, the workers'
    /// deviations and the pool-wide margin do not (their estimates still count in the error
    /// metrics).
    pub skip_passed: bool,
    /// Learn the decode step from streamed answers' gaps (see [`steps`]): what one more
    /// sequence and 1 000 more tokens of context add to a worker's steps, the price of a new
    /// stream's growth of the others'. Off: the profile's `decode_ms_per_seq` and
    /// `decode_ms_per_1k_context` stay as configured, and no answer is timed.
    pub learn_decode_step: bool,
}

/// How close to a decision another replica's credit for the same worker must be stamped for
/// the two to have raced: that replica's report tick (5 ms by default) and the relay (about
/// 8 ms at p99) either way.
pub const SHARED_INSTANT_MS: u64 = 10;

impl Default for CalibrationConfig {
    fn default() -> Self {
        CalibrationConfig {
            enabled: true,
            half_life_samples: 500.0,
            prior_weight: 4.0,
            min_samples: 12,
            outlier_clip: 3.0,
            coefficient_bound: 20.0,
            deviation_min: 0.25,
            deviation_max: 4.0,
            deviation_half_life_samples: 15.0,
            min_worker_samples: 5,
            max_workers: 256,
            refresh_ms: 20,
            flush_samples: 8,
            skip_shared_instants: true,
            skip_passed: true,
            learn_decode_step: true,
        }
    }
}

impl CalibrationConfig {
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("half_life_samples", self.half_life_samples),
            ("prior_weight", self.prior_weight),
            ("outlier_clip", self.outlier_clip),
            ("deviation_half_life_samples", self.deviation_half_life_samples),
        ];
        for (name, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("calibration.{name} must be a finite number > 0, got {v}"));
            }
        }
        if !(self.coefficient_bound.is_finite() && self.coefficient_bound >= 1.0) {
            return Err("calibration.coefficient_bound must be a finite number >= 1".into());
        }
        let (lo, hi) = (self.deviation_min, self.deviation_max);
        if !(lo.is_finite() && hi.is_finite() && lo > 0.0 && lo <= 1.0 && hi >= 1.0) {
            return Err("calibration: need 0 < deviation_min <= 1 <= deviation_max".into());
        }
        if self.max_workers > codec::MAX_WORKERS {
            return Err(format!("calibration.max_workers must be <= {}", codec::MAX_WORKERS));
        }
        if self.flush_samples == 0 || self.flush_samples > 4096 {
            return Err("calibration.flush_samples must be 1..=4096".into());
        }
        Ok(())
    }

    /// Per-sample forgetting factor of the model.
    pub fn forgetting(&self) -> f64 {
        0.5f64.powf(1.0 / self.half_life_samples)
    }

    /// Per-sample weight of a new observation in a worker's deviation.
    pub fn deviation_rate(&self) -> f64 {
        1.0 - 0.5f64.powf(1.0 / self.deviation_half_life_samples)
    }
}

/// One observation: a routed, successful request's time to first byte on the worker its
/// decision scored, with the features that decision saw. Holds no prompt text.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub worker: String,
    /// Uncached tokens the decision charged the worker with.
    pub uncached_tokens: u64,
    /// Prompt tokens the decision took as cached there (their attention still costs).
    pub cached_tokens: u64,
    /// The worker's load the decision saw.
    pub load: WorkerLoad,
    /// Estimated time outside the learned terms (KV transfer, adapter load), subtracted.
    pub fixed_ms: f64,
    /// Decision to first response byte.
    pub observed_ms: f64,
    /// The engine priority the request was sent with (0: none).
    pub priority: i32,
    /// A more urgent request sent to the worker after this one had its first token first
    /// (see [`CalibrationConfig::skip_passed`]): the engine ran work the features do not hold.
    pub passed: bool,
    /// What the decision's promise foresaw beyond the estimate for the prompts joining the
    /// request's step ([`crate::decision::cost::Score::fill_forecast_ms`], with the worker's
    /// deviation): the promise margin is learned against the estimate with it.
    pub fill_ms: f64,
    /// The factor the estimate's wait held for the more urgent prompts foreseen to pass the
    /// request ([`crate::decision::cost::Score::wait_factor`]; 1 where none did): the queued
    /// prefill's features are taken times it, so the queue's coefficients describe the work
    /// ahead.
    pub wait_factor: f64,
}

/// Calibrated profiles and deviations of every model with enough samples: what a router
/// decides with. Cheap to clone behind an `Arc`; empty (the configured profiles) by default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Calibrated {
    models: HashMap<String, ModelView, foldhash::fast::RandomState>,
    /// Each model's decode step learned from its streams' gaps ([`steps`]), where it has
    /// enough samples: `(decode_ms_per_seq, decode_ms_per_1k_context)`.
    steps: HashMap<String, (f64, f64), foldhash::fast::RandomState>,
}

/// One model's calibrated view.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelView {
    pub profile: Profile,
    /// Deviation factor per worker with enough samples, by
    /// [`worker_key`](crate::decision::load::worker_key): a decision reads it without the name.
    pub deviations: HashMap<u64, f64, crate::decision::worker::ByKey>,
    pub samples: u64,
    /// The promise margin of each engine priority with enough samples of its own (see
    /// [`ModelState::promise_margin_at`]), in place of the profile's pool-wide one.
    pub margins: Vec<(i32, f64)>,
}

impl ModelView {
    /// The deviation factor of `worker` (1 without enough samples), read without its name.
    pub fn deviation_of(&self, worker: &crate::decision::worker::WorkerName) -> f64 {
        self.deviations.get(&worker.key()).copied().unwrap_or(1.0)
    }
}

impl Calibrated {
    /// Sets `model`'s view from its state (removed while it has too few samples).
    pub fn set(
        &mut self,
        model: &str,
        state: &ModelState,
        prior: &Profile,
        cfg: &CalibrationConfig,
    ) {
        match state.view(prior, cfg) {
            Some(v) => self.models.insert(model.to_owned(), v),
            None => self.models.remove(model),
        };
    }

    /// The calibrated profile of `model`, if it has one yet.
    pub fn profile_for(&self, model: &str) -> Option<Profile> {
        self.models.get(model).map(|v| v.profile)
    }

    /// The calibrated profile of `model` for a request sent at engine `priority`: its promise
    /// margin that priority's own, where it has one.
    pub fn profile_at(&self, model: &str, priority: i32) -> Option<Profile> {
        let v = self.models.get(model)?;
        let mut profile = v.profile;
        let own = v.margins.iter().find(|(p, _)| *p == priority).map(|(_, m)| *m);
        if let (Some(q), Some(m)) = (profile.queue.as_mut(), own) {
            q.promise_margin = m;
        }
        Some(profile)
    }

    /// Sets `model`'s learned decode step from its state (removed while it has too few
    /// samples).
    pub fn set_steps(&mut self, model: &str, state: &StepState, cfg: &CalibrationConfig) {
        match state.learned(cfg) {
            Some(v) => self.steps.insert(model.to_owned(), v),
            None => self.steps.remove(model),
        };
    }

    /// The profile `model` decides with at engine `priority`: its calibrated one
    /// ([`Calibrated::profile_at`]) or else `configured`, with the decode step learned from its
    /// streams in place of the profile's where there is one.
    pub fn profile_or(&self, model: &str, priority: i32, configured: &Profile) -> Profile {
        let mut p = self.profile_at(model, priority).unwrap_or(*configured);
        if let Some(&(per_seq, per_1k)) = self.steps.get(model) {
            p.decode_ms_per_seq = per_seq;
            p.decode_ms_per_1k_context = per_1k;
        }
        p
    }

    /// `model`'s learned `(decode_ms_per_seq, decode_ms_per_1k_context)`, if it has one yet.
    pub fn steps(&self, model: &str) -> Option<(f64, f64)> {
        self.steps.get(model).copied()
    }

    /// `worker`'s deviation factor within `model` (1.0 when none is known).
    pub fn deviation(&self, model: &str, worker: &str) -> f64 {
        let key = crate::decision::load::worker_key(worker);
        self.models.get(model).and_then(|v| v.deviations.get(&key)).copied().unwrap_or(1.0)
    }

    pub fn model(&self, model: &str) -> Option<&ModelView> {
        self.models.get(model)
    }
}
