//! The binary form of a [`ModelState`] in shared data, little-endian:
//!
//! ```text
//! "KVC" version(u8 = 2 or 3)
//! prior[8] f64 · samples u64 · weight f64 · a[36] f64 · b[8] f64 · theta[8] f64 · scale f64
//! promise_log f64 (within [0, ln 4])
//! version 3 only: priorities u8 (at most 16), then per priority (sorted, unique):
//!     priority i32 · log f64 (within [0, ln 4]) · samples u32
//! workers u16, then per worker (sorted by name, unique):
//!     name_len u8 · name (UTF-8) · log_dev f64 · samples u32
//! ```
//!
//! Version 2 is written while no priority is tracked apart (no request at a priority other
//! than 0 yet), so that a filter from before priorities reads it. The count of samples from
//! busy workers ([`ModelState::busy_samples`]) is not in it: shared data keeps it under its
//! own key ([`crate::shared::calib::busy_key`]), so that adding it changed nothing a filter
//! from before reads; a decoded state counts none.
//!
//! The decoder checks every length before reading, accepts only finite numbers, a positive
//! scale, canonical worker and priority order, and a version 3 only with a priority in it, so
//! whatever it accepts encodes back to the same bytes. It never panics. A state of another
//! version (1 held four coefficients, without the queue's own and the batch fill) is not
//! decoded, and the model starts afresh from its prior.

use thiserror::Error;

use super::estimator::{
    ModelState, PriorityPromise, WorkerDev, DIM, MAX_PRIORITIES, PACKED, PROMISE_MARGIN_MAX,
};
use super::steps::{StepState, STEP_DIM};

pub const MAGIC: &[u8; 3] = b"KVC";
/// The version without per-priority quantiles.
pub const VERSION_POOL: u8 = 2;
pub const VERSION: u8 = 3;
/// Most workers one model's state may carry.
pub const MAX_WORKERS: usize = 4096;

#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum CodecError {
    #[error("not a calibration state")]
    Magic,
    #[error("calibration state version {0} is not supported")]
    Version(u8),
    #[error("calibration state is truncated")]
    Truncated,
    #[error("calibration state holds a non-finite or out-of-range number")]
    Number,
    #[error("calibration state names too many workers")]
    TooManyWorkers,
    #[error("calibration state has a bad worker name or order")]
    Worker,
    #[error("calibration state has too many priorities, or out of order")]
    Priority,
    #[error("calibration state has trailing bytes")]
    Trailing,
}

impl ModelState {
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(4 + (3 * DIM + PACKED + 3) * 8 + 2 + self.workers.len() * 40);
        out.extend_from_slice(MAGIC);
        let by_priority = !self.priorities.is_empty();
        out.push(if by_priority { VERSION } else { VERSION_POOL });
        let floats = self.prior.iter();
        for v in floats {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.samples.to_le_bytes());
        for v in [&self.weight]
            .into_iter()
            .chain(&self.a)
            .chain(&self.b)
            .chain(&self.theta)
            .chain([&self.scale, &self.promise_log])
        {
            out.extend_from_slice(&v.to_le_bytes());
        }
        if by_priority {
            let priorities = &self.priorities[..self.priorities.len().min(MAX_PRIORITIES)];
            out.push(priorities.len() as u8);
            for p in priorities {
                out.extend_from_slice(&p.priority.to_le_bytes());
                out.extend_from_slice(&p.log.to_le_bytes());
                out.extend_from_slice(&p.samples.to_le_bytes());
            }
        }
        let workers = &self.workers[..self.workers.len().min(MAX_WORKERS)];
        out.extend_from_slice(&(workers.len() as u16).to_le_bytes());
        for w in workers {
            let name = &w.worker.as_bytes()[..w.worker.len().min(255)];
            out.push(name.len() as u8);
            out.extend_from_slice(name);
            out.extend_from_slice(&w.log_dev.to_le_bytes());
            out.extend_from_slice(&w.samples.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ModelState, CodecError> {
        let mut r = Reader(bytes);
        if r.take(3)? != MAGIC {
            return Err(CodecError::Magic);
        }
        let version = r.take(1)?[0];
        if version != VERSION && version != VERSION_POOL {
            return Err(CodecError::Version(version));
        }
        let prior: [f64; DIM] = r.floats()?;
        if prior.iter().any(|p| *p < 0.0) {
            return Err(CodecError::Number);
        }
        let samples = r.u64()?;
        let weight = r.f64()?;
        if weight < 0.0 {
            return Err(CodecError::Number);
        }
        let a: [f64; PACKED] = r.floats()?;
        let b: [f64; DIM] = r.floats()?;
        let theta: [f64; DIM] = r.floats()?;
        let scale = r.f64()?;
        if scale <= 0.0 {
            return Err(CodecError::Number);
        }
        let margin_log = |v: f64| {
            if (0.0..=PROMISE_MARGIN_MAX.ln()).contains(&v) {
                Ok(v)
            } else {
                Err(CodecError::Number)
            }
        };
        let promise_log = margin_log(r.f64()?)?;
        let mut priorities: Vec<PriorityPromise> = Vec::new();
        if version == VERSION {
            let n = usize::from(r.take(1)?[0]);
            if n > MAX_PRIORITIES {
                return Err(CodecError::Priority);
            }
            for _ in 0..n {
                let priority = i32::from_le_bytes(r.array()?);
                let log = margin_log(r.f64()?)?;
                let samples = u32::from_le_bytes(r.array()?);
                if priorities.last().is_some_and(|p| p.priority >= priority) {
                    return Err(CodecError::Priority);
                }
                priorities.push(PriorityPromise { priority, log, samples });
            }
            // None is written as version 2.
            if priorities.is_empty() {
                return Err(CodecError::Priority);
            }
        }
        let n = usize::from(u16::from_le_bytes(r.array()?));
        if n > MAX_WORKERS {
            return Err(CodecError::TooManyWorkers);
        }
        let mut workers: Vec<WorkerDev> = Vec::with_capacity(n.min(r.0.len() / 13));
        for _ in 0..n {
            let len = usize::from(r.take(1)?[0]);
            let name = std::str::from_utf8(r.take(len)?).map_err(|_| CodecError::Worker)?;
            if workers.last().is_some_and(|w| w.worker.as_str() >= name) {
                return Err(CodecError::Worker);
            }
            let log_dev = r.f64()?;
            let samples = u32::from_le_bytes(r.array()?);
            workers.push(WorkerDev { worker: name.to_owned(), log_dev, samples });
        }
        if !r.0.is_empty() {
            return Err(CodecError::Trailing);
        }
        Ok(ModelState {
            prior,
            samples,
            weight,
            a,
            b,
            theta,
            scale,
            promise_log,
            priorities,
            busy_samples: 0,
            workers,
        })
    }
}

/// The magic of a [`StepState`]'s encoding (see [`StepState::encode`]).
pub const STEP_MAGIC: &[u8; 3] = b"KVS";
pub const STEP_VERSION: u8 = 1;

impl StepState {
    /// Little-endian, fixed length:
    ///
    /// ```text
    /// "KVS" version(u8 = 1)
    /// prior[3] f64 · samples u64 · weight f64 · a[6] f64 · b[3] f64 · theta[3] f64 · scale f64
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 18 * 8);
        out.extend_from_slice(STEP_MAGIC);
        out.push(STEP_VERSION);
        for v in &self.prior {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.samples.to_le_bytes());
        let floats = [&self.weight].into_iter().chain(&self.a).chain(&self.b).chain(&self.theta);
        for v in floats.chain([&self.scale]) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Accepts only finite numbers, non-negative units and weight, positive coefficients and
    /// scale, and no trailing bytes, so whatever it accepts encodes back to the same bytes.
    /// Never panics.
    pub fn decode(bytes: &[u8]) -> Result<StepState, CodecError> {
        let mut r = Reader(bytes);
        if r.take(3)? != STEP_MAGIC {
            return Err(CodecError::Magic);
        }
        let version = r.take(1)?[0];
        if version != STEP_VERSION {
            return Err(CodecError::Version(version));
        }
        let prior: [f64; STEP_DIM] = r.floats()?;
        let samples = r.u64()?;
        let weight = r.f64()?;
        let a = r.floats()?;
        let b = r.floats()?;
        let theta: [f64; STEP_DIM] = r.floats()?;
        let scale = r.f64()?;
        let positive = theta.iter().chain([&scale]).all(|v| *v > 0.0);
        if prior.iter().any(|p| *p < 0.0) || weight < 0.0 || !positive {
            return Err(CodecError::Number);
        }
        if !r.0.is_empty() {
            return Err(CodecError::Trailing);
        }
        Ok(StepState { prior, samples, weight, a, b, theta, scale })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.0.len() < n {
            return Err(CodecError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        self.take(N)?.try_into().map_err(|_| CodecError::Truncated)
    }

    fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn f64(&mut self) -> Result<f64, CodecError> {
        let v = f64::from_le_bytes(self.array()?);
        if v.is_finite() {
            Ok(v)
        } else {
            Err(CodecError::Number)
        }
    }

    fn floats<const N: usize>(&mut self) -> Result<[f64; N], CodecError> {
        let mut out = [0.0; N];
        for v in &mut out {
            *v = self.f64()?;
        }
        Ok(out)
    }
}
