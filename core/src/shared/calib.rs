//! Calibration state in shared data: one value per model (`kvroute.calib.<model>`, the
//! [`ModelState`] encoding), updated by every thread with the samples it collected
//! (compare-and-swap, bounded attempts; a lost write is counted and its samples dropped), and
//! read by every thread into the [`Calibrated`] view it decides with. A reader re-reads at
//! most every `refresh_ms` and decodes a model's value only when its CAS token moved.
//!
//! A value that does not decode, or that was learned against another prior (the configured
//! profile changed), is replaced by a fresh state from the current prior.

use std::collections::HashMap;
use std::sync::Arc;

use super::{update, Counter, Counters, SharedStore};
use crate::decision::calib::{CalibOutcome, Calibrated, CalibrationConfig, ModelState, Sample};
use crate::decision::cost::Profile;

/// The shared-data key of `model`'s state.
pub fn key(model: &str) -> String {
    format!("kvroute.calib.{model}")
}

/// Creates `model`'s state if it is absent. Shared data has no create-if-absent: the first
/// write of a key is unconditional, so two threads' first writes may race and one thread's
/// first batch of samples be lost. Each thread calls this when it is configured, so that
/// later writes carry a compare-and-swap token (losing an empty state to another is harmless).
pub fn init<S: SharedStore + ?Sized>(store: &S, model: &str, prior: &Profile) {
    if store.get(&key(model)).0.is_none() {
        let _ = store.set(&key(model), &ModelState::new(prior).encode(), None);
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
        let (mut state, corrupt) = match current.map(ModelState::decode) {
            Some(Ok(s)) if s.matches(prior) => (s, false),
            Some(Ok(_)) | None => (ModelState::new(prior), false),
            Some(Err(_)) => (ModelState::new(prior), true),
        };
        let (mut used, mut clipped, mut rejected) = (0, 0, 0);
        for s in samples {
            match state.observe(cfg, s) {
                CalibOutcome::Used { weight } => {
                    used += 1;
                    clipped += usize::from(weight < 1.0);
                }
                CalibOutcome::Rejected => rejected += 1,
            }
        }
        (state.encode(), (CalibWrite { state, used, clipped, rejected }, corrupt))
    });
    match written {
        Ok((p, corrupt)) => {
            if corrupt {
                counters.count(Counter::Corrupt, 1);
            }
            Some(p)
        }
        Err(_) => {
            counters.count(Counter::LostUpdate, 1);
            None
        }
    }
}

/// A thread's cached copy of the shared calibration.
#[derive(Debug, Default)]
pub struct CalibReader {
    /// CAS token of each model's value when last decoded.
    seen: HashMap<String, u32>,
    states: HashMap<String, ModelState>,
    last_ms: Option<u64>,
    view: Arc<Calibrated>,
}

impl CalibReader {
    /// Whether `refresh_ms` passed since the last read.
    pub fn due(&self, cfg: &CalibrationConfig, now_ms: u64) -> bool {
        self.last_ms.is_none_or(|t| now_ms.saturating_sub(t) >= cfg.refresh_ms)
    }

    /// Reads every model's value whose CAS token moved; returns the new view if anything
    /// changed. `models`: each model's name and configured profile (its prior).
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
            let (bytes, cas) = store.get(&key(model));
            let (Some(bytes), Some(cas)) = (bytes, cas) else { continue };
            if self.seen.get(model) == Some(&cas) {
                continue;
            }
            self.seen.insert(model.clone(), cas);
            let state = match ModelState::decode(&bytes) {
                Ok(s) if s.matches(prior) => s,
                Ok(_) => continue,
                Err(_) => {
                    counters.count(Counter::Corrupt, 1);
                    continue;
                }
            };
            next.get_or_insert_with(|| (*self.view).clone()).set(model, &state, prior, cfg);
            self.states.insert(model.clone(), state);
        }
        let next = next?;
        self.view = Arc::new(next);
        Some(Arc::clone(&self.view))
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
