//! Calibration state in shared data: one value per model (`kvroute.calib.<model>`, the
//! [`ModelState`] encoding), updated by every thread with the samples it collected
//! (compare-and-swap, bounded attempts; a lost write is counted and its samples dropped), and
//! read by every thread into the [`Calibrated`] view it decides with. A reader re-reads at
//! most every `refresh_ms` and decodes a model's value only when its CAS token moved.
//!
//! A value that does not decode, or that was learned against another prior (the configured
//! profile changed), is replaced by a fresh state from the current prior.
//!
//! Beside it, `kvroute.calib_busy.<model>` counts the samples from busy workers the state took
//! in ([`ModelState::busy_samples`], a little-endian u64, up to [`PROMISE_FILL_SAMPLES`]): until
//! it reaches that, a busy worker's promise also holds a share of a whole step
//! ([`crate::decision::cost::QueueTerms::promise_fill_ms`]). It has its own key so that the
//! state's encoding stays what filters from before it read: during an upgrade they keep
//! learning into the same state (their busy samples are not counted, so the count only lags).
//! Written after the state, restarted with it, and no longer written once it reached the
//! threshold.
//!
//! `kvroute.calib_steps.<model>` holds the decode step learned from streams' gaps
//! ([`StepState`], its own encoding): its own key, so that filters from before it read the
//! TTFT state as they did. Written by [`publish_steps`], read with the TTFT state.

use std::collections::HashMap;
use std::sync::Arc;

use super::{read_u64, update, Counter, Counters, SharedStore};
use crate::decision::calib::{
    CalibOutcome, Calibrated, CalibrationConfig, ModelState, Sample, StepSample, StepState,
    PROMISE_FILL_SAMPLES,
};
use crate::decision::cost::Profile;

/// The shared-data key of `model`'s state.
pub fn key(model: &str) -> String {
    format!("kvroute.calib.{model}")
}

/// The shared-data key of the count of `model`'s samples from busy workers. Not
/// `kvroute.calib.<model>.busy`: that is the state key of a model named `<model>.busy`.
pub fn busy_key(model: &str) -> String {
    format!("kvroute.calib_busy.{model}")
}

/// The shared-data key of `model`'s decode step ([`StepState`]).
pub fn steps_key(model: &str) -> String {
    format!("kvroute.calib_steps.{model}")
}

/// A count as read from [`busy_key`] (absent or malformed: 0), at most the threshold.
fn busy_count(bytes: Option<&[u8]>) -> u32 {
    read_u64(bytes).min(u64::from(PROMISE_FILL_SAMPLES)) as u32
}

/// Creates `model`'s state if it is absent. Shared data has no create-if-absent: the first
/// write of a key is unconditional, so two threads' first writes may race and one thread's
/// first batch of samples be lost. Each thread calls this when it is configured, so that
/// later writes carry a compare-and-swap token (losing an empty state to another is harmless).
pub fn init<S: SharedStore + ?Sized>(store: &S, model: &str, prior: &Profile) {
    if store.get(&key(model)).0.is_none() {
        let _ = store.set(&key(model), &ModelState::new(prior).encode(), None);
    }
    if store.get(&steps_key(model)).0.is_none() {
        let _ = store.set(&steps_key(model), &StepState::new(prior).encode(), None);
    }
}

/// Adds `samples` of streams' gaps to `model`'s decode step; returns the state as written and
/// how many samples it used. `None`: the write was lost (counted as [`Counter::LostUpdate`]).
pub fn publish_steps<S: SharedStore + ?Sized>(
    store: &S,
    counters: &dyn Counters,
    cfg: &CalibrationConfig,
    model: &str,
    prior: &Profile,
    samples: &[StepSample],
) -> Option<(StepState, usize)> {
    let written = update(store, &steps_key(model), |current| {
        let (mut state, corrupt) = match current.map(StepState::decode) {
            Some(Ok(s)) if s.matches(prior) => (s, false),
            Some(Ok(_)) | None => (StepState::new(prior), false),
            Some(Err(_)) => (StepState::new(prior), true),
        };
        let used = samples.iter().filter(|s| state.observe(cfg, s)).count();
        (state.encode(), (state, used, corrupt))
    });
    match written {
        Ok((state, used, corrupt)) => {
            if corrupt {
                counters.count(Counter::Corrupt, 1);
            }
            Some((state, used))
        }
        Err(_) => {
            counters.count(Counter::LostUpdate, 1);
            None
        }
    }
}

/// What one write did.
#[derive(Debug, Clone, PartialEq)]
pub struct CalibWrite {
    /// The state as written.
    pub state: ModelState,
    pub used: usize,
    /// Samples taken in at a reduced weight (outliers).
    pub clipped: usize,
    pub rejected: usize,
}

/// Adds `samples` to `model`'s shared state. `None`: the write was lost (counted as
/// [`Counter::LostUpdate`]).
pub fn publish<S: SharedStore + ?Sized>(
    store: &S,
    counters: &dyn Counters,
    cfg: &CalibrationConfig,
    model: &str,
    prior: &Profile,
    samples: &[Sample],
) -> Option<CalibWrite> {
    let written = update(store, &key(model), |current| {
        // (state, corrupt, fresh): a state not learned on is started afresh.
        let (mut state, corrupt, fresh) = match current.map(ModelState::decode) {
            Some(Ok(s)) if s.matches(prior) => (s, false, false),
            Some(Ok(_)) | None => (ModelState::new(prior), false, true),
            Some(Err(_)) => (ModelState::new(prior), true, true),
        };
        let (mut used, mut clipped, mut rejected) = (0, 0, 0);
        for s in samples {
            match state.observe(cfg, s) {
                CalibOutcome::Used { weight } => {
                    used += 1;
                    clipped += usize::from(weight < 1.0);
                }
                CalibOutcome::Rejected => rejected += 1,
                CalibOutcome::MarginOnly => {}
            }
        }
        (state.encode(), (CalibWrite { state, used, clipped, rejected }, corrupt, fresh))
    });
    match written {
        Ok((mut p, corrupt, fresh)) => {
            if corrupt {
                counters.count(Counter::Corrupt, 1);
            }
            // The decoded state counted none: what it counts now is this batch's.
            p.state.busy_samples = count_busy(store, model, p.state.busy_samples, fresh);
            Some(p)
        }
        Err(_) => {
            counters.count(Counter::LostUpdate, 1);
            None
        }
    }
}

/// Adds `added` busy samples to `model`'s count ([`busy_key`]), or restarts it at `added` when
/// the state was `fresh`; returns the count as it stands. Nothing is written when that leaves
/// the count as it was (the threshold reached, or nothing to add); a lost write leaves it short (the
/// promise stays held to a whole step a little longer).
fn count_busy<S: SharedStore + ?Sized>(store: &S, model: &str, added: u32, fresh: bool) -> u32 {
    let key = busy_key(model);
    let seen = busy_count(store.get(&key).0.as_deref());
    let next = |base: u32| base.saturating_add(added).min(PROMISE_FILL_SAMPLES);
    if next(if fresh { 0 } else { seen }) == seen {
        return seen;
    }
    let written = update(store, &key, |current| {
        let n = next(if fresh { 0 } else { busy_count(current) });
        (u64::from(n).to_le_bytes().to_vec(), n)
    });
    written.unwrap_or(seen)
}

/// A thread's cached copy of the shared calibration.
#[derive(Debug, Default)]
pub struct CalibReader {
    /// CAS token of each model's value when last decoded.
    seen: HashMap<String, u32>,
    states: HashMap<String, ModelState>,
    /// CAS token of each model's decode step when last decoded, and the step.
    steps_seen: HashMap<String, u32>,
    steps: HashMap<String, StepState>,
    last_ms: Option<u64>,
    view: Arc<Calibrated>,
}

impl CalibReader {
    /// Whether `refresh_ms` passed since the last read.
    pub fn due(&self, cfg: &CalibrationConfig, now_ms: u64) -> bool {
        self.last_ms.is_none_or(|t| now_ms.saturating_sub(t) >= cfg.refresh_ms)
    }

    /// Reads every model's value whose CAS token moved, and its busy count ([`busy_key`]);
    /// returns the new view if anything changed. `models`: each model's name and configured
    /// profile (its prior).
    pub fn refresh<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        counters: &dyn Counters,
        cfg: &CalibrationConfig,
        models: &[(String, Profile)],
        now_ms: u64,
    ) -> Option<Arc<Calibrated>> {
        self.last_ms = Some(now_ms);
        let mut next: Option<Calibrated> = None;
        for (model, prior) in models {
            if let Some(state) = self.read_steps(store, counters, model, prior) {
                next.get_or_insert_with(|| (*self.view).clone()).set_steps(model, &state, cfg);
                self.steps.insert(model.clone(), state);
            }
        }
        for (model, prior) in models {
            let (bytes, cas) = store.get(&key(model));
            let (Some(bytes), Some(cas)) = (bytes, cas) else { continue };
            let moved = self.seen.get(model) != Some(&cas);
            // The busy count is written after the state, so it may move alone: read with a
            // moved state, and on every refresh until it reached the threshold.
            let counting =
                self.states.get(model).is_some_and(|s| s.busy_samples < PROMISE_FILL_SAMPLES);
            let busy =
                (moved || counting).then(|| busy_count(store.get(&busy_key(model)).0.as_deref()));
            let state = if moved {
                self.seen.insert(model.clone(), cas);
                match ModelState::decode(&bytes) {
                    Ok(s) if s.matches(prior) => {
                        ModelState { busy_samples: busy.unwrap_or(0), ..s }
                    }
                    Ok(_) => continue,
                    Err(_) => {
                        counters.count(Counter::Corrupt, 1);
                        continue;
                    }
                }
            } else {
                match (self.states.get(model), busy) {
                    (Some(s), Some(n)) if n != s.busy_samples => {
                        ModelState { busy_samples: n, ..s.clone() }
                    }
                    _ => continue,
                }
            };
            next.get_or_insert_with(|| (*self.view).clone()).set(model, &state, prior, cfg);
            self.states.insert(model.clone(), state);
        }
        let next = next?;
        self.view = Arc::new(next);
        Some(Arc::clone(&self.view))
    }

    /// `model`'s decode step if its CAS token moved since the last read and it decodes as
    /// learned against `prior`.
    fn read_steps<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        counters: &dyn Counters,
        model: &str,
        prior: &Profile,
    ) -> Option<StepState> {
        let (Some(bytes), Some(cas)) = store.get(&steps_key(model)) else { return None };
        if self.steps_seen.get(model) == Some(&cas) {
            return None;
        }
        self.steps_seen.insert(model.to_owned(), cas);
        match StepState::decode(&bytes) {
            Ok(s) if s.matches(prior) => Some(s),
            Ok(_) => None,
            Err(_) => {
                counters.count(Counter::Corrupt, 1);
                None
            }
        }
    }

    /// Takes in a decode step this thread just wrote; returns the new view.
    pub fn set_steps(
        &mut self,
        cfg: &CalibrationConfig,
        model: &str,
        state: StepState,
    ) -> Arc<Calibrated> {
        let mut next = (*self.view).clone();
        next.set_steps(model, &state, cfg);
        self.steps.insert(model.to_owned(), state);
        self.view = Arc::new(next);
        Arc::clone(&self.view)
    }

    /// The last decode step seen of each model (for metrics).
    pub fn steps(&self) -> &HashMap<String, StepState> {
        &self.steps
    }

    /// Takes in a state this thread just wrote; returns the new view.
    pub fn set_state(
        &mut self,
        cfg: &CalibrationConfig,
        model: &str,
        prior: &Profile,
        state: ModelState,
    ) -> Arc<Calibrated> {
        let mut next = (*self.view).clone();
        next.set(model, &state, prior, cfg);
        self.states.insert(model.to_owned(), state);
        self.view = Arc::new(next);
        Arc::clone(&self.view)
    }

    /// The last state seen of each model (for metrics).
    pub fn states(&self) -> &HashMap<String, ModelState> {
        &self.states
    }

    pub fn view(&self) -> &Arc<Calibrated> {
        &self.view
    }
}

#[cfg(test)]
mod tests;
