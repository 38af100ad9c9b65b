//! How long a scheduler step takes: the profile's cost model.

use std::time::Duration;

use crate::profile::HardwareProfile;

/// The prefill work of one sequence in a step: `new` tokens computed on top of `cached` tokens
/// already in that sequence's KV (a reused prefix or its earlier chunks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub cached: usize,
    pub new: usize,
}

/// How long a scheduler step takes, from the profile. `step_ms` is engine time; `step` divides
/// it by `speedup`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub step_floor_ms: f64,
    pub prefill_ms_per_token: f64,
    pub prefill_ms_per_token_sq: f64,
    pub decode_ms_per_seq: f64,
    pub kv_ms_per_1k_tokens: f64,
    pub speedup: f64,
}

impl Timing {
    pub fn from_profile(p: &HardwareProfile, speedup: f64) -> Timing {
        Timing {
            step_floor_ms: p.step_floor_ms,
            prefill_ms_per_token: p.prefill_ms_per_token,
            prefill_ms_per_token_sq: p.prefill_ms_per_token_sq,
            decode_ms_per_seq: p.decode_ms_per_seq,
            kv_ms_per_1k_tokens: p.kv_ms_per_1k_tokens,
            speedup,
        }
    }

    /// Engine time (ms, speedup 1) of a step with these prefill chunks, `decoding` sequences and
    /// `context` tokens of KV cache read by the decoding sequences.
    ///
    /// The quadratic coefficient is defined for a whole prompt of N new tokens (`sq * N^2`); it
    /// applies per sequence, and a chunk of n new tokens over c tokens already in that
    /// sequence's KV costs `sq * ((c + n)^2 - c^2)`: the chunks of one prompt sum to `sq * N^2`
    /// however it is chunked, and a cached prefix still costs the new tokens' attention over it.
    pub fn step_ms(&self, prefill: &[Chunk], decoding: usize, context: usize) -> f64 {
        let new: usize = prefill.iter().map(|c| c.new).sum();
        // (c + n)^2 - c^2 = n (2c + n), without the cancellation of two large squares.
        let attention: f64 =
            prefill.iter().map(|c| c.new as f64 * (2.0 * c.cached as f64 + c.new as f64)).sum();
        self.step_floor_ms
            + self.prefill_ms_per_token * new as f64
            + self.prefill_ms_per_token_sq * attention
            + self.decode_ms_per_seq * decoding as f64
            + self.kv_ms_per_1k_tokens * context as f64 / 1000.0
    }

    /// Wall-clock duration of `ms` of engine time: divided by `speedup`.
    pub fn wall(&self, ms: f64) -> Duration {
        Duration::from_secs_f64((ms / self.speedup.max(1e-9)).max(0.0) / 1000.0)
    }

    /// Wall-clock duration of a step (`step_ms` divided by `speedup`).
    pub fn step(&self, prefill: &[Chunk], decoding: usize, context: usize) -> Duration {
        self.wall(self.step_ms(prefill, decoding, context))
    }
}
