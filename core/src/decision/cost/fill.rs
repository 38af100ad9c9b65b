//! The fill of a busy worker's next step, foreseen for a request's promise (see
//! [`Score::fill_forecast_ms`](super::Score::fill_forecast_ms)).

use super::{Profile, QueueTerms};
use crate::decision::load::WorkerLoad;

/// The prefill time (at `profile`'s speed, without a worker's deviation) of the prompt tokens
/// foreseen to join the step carrying the last chunk of a request of `own_tokens` uncached
/// tokens on a worker with `load`, which waits `ahead_ms` for the queue ahead of it (see
/// [`Score::fill_forecast_ms`](super::Score::fill_forecast_ms)): the queued tokens waiting behind it
/// ([`WorkerLoad::behind_tokens`], on an engine that schedules by priority) and those arriving
/// meanwhile at the worker's recent rate ([`WorkerLoad::arriving_tokens_per_s`]), at most the
/// room that chunk leaves in a step of [`Profile::step_token_budget`] tokens.
pub fn fill_forecast_ms(
    profile: &Profile,
    load: &WorkerLoad,
    ahead_ms: f64,
    own_tokens: u64,
) -> f64 {
    let budget = profile.step_token_budget;
    if budget == 0 || (load.arriving_tokens_per_s == 0 && load.behind_tokens == 0) {
        return 0.0;
    }
    // A last chunk that fills its step whole leaves no room.
    let room = match own_tokens % budget {
        0 if own_tokens > 0 => 0,
        part => budget - part,
    };
    let arriving = load.arriving_tokens_per_s as f64 * ahead_ms.max(0.0) / 1000.0;
    (load.behind_tokens as f64 + arriving).min(room as f64) * profile.prefill_ms_per_token
}

/// [`Score::fill_forecast_ms`](super::Score::fill_forecast_ms) of a request of `own_tokens`
/// uncached tokens estimated to wait `wait_ms` on a busy worker with `load` and `deviation`:
/// its [`fill_forecast_ms`] over the wait for the queue ahead (the wait without the learned
/// batch fill `q.batch_fill_ms` it holds), less that learned fill, at least 0.
pub(super) fn beyond_learned(
    profile: &Profile,
    q: &QueueTerms,
    load: &WorkerLoad,
    (wait_ms, own_tokens): (f64, u64),
    deviation: f64,
) -> f64 {
    let ahead_ms = wait_ms - q.batch_fill_ms * deviation;
    ((fill_forecast_ms(profile, load, ahead_ms, own_tokens) - q.batch_fill_ms) * deviation).max(0.0)
}
