//! Router-tracked load per worker and its compact encoding in Envoy shared data.

/// What kvroute itself has sent to a worker and not yet seen finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerLoad {
    /// Requests sent and not yet ended (finished, failed or reset).
    pub inflight_requests: u32,
    /// Requests still in prefill (no response byte yet).
    pub prefilling_requests: u32,
    /// Uncached prompt tokens of requests still in prefill.
    pub prefill_tokens: u64,
}

/// A change to apply to a [`WorkerLoad`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadDelta {
    /// A request was sent with this many uncached prompt tokens.
    Start { prefill_tokens: u64 },
    /// The first response byte arrived: the prefill is done.
    FirstByte { prefill_tokens: u64 },
    /// The request ended; `prefilling` when it ended before its first byte.
    End { prefill_tokens: u64, prefilling: bool },
}

impl WorkerLoad {
    pub const ENCODED_LEN: usize = 16;

    pub fn apply(mut self, d: LoadDelta) -> Self {
        match d {
            LoadDelta::Start { prefill_tokens } => {
                self.inflight_requests = self.inflight_requests.saturating_add(1);
                self.prefilling_requests = self.prefilling_requests.saturating_add(1);
                self.prefill_tokens = self.prefill_tokens.saturating_add(prefill_tokens);
            }
            LoadDelta::FirstByte { prefill_tokens } => self.end_prefill(prefill_tokens),
            LoadDelta::End { prefill_tokens, prefilling } => {
                if prefilling {
                    self.end_prefill(prefill_tokens);
                }
                self.inflight_requests = self.inflight_requests.saturating_sub(1);
            }
        }
        self
    }

    fn end_prefill(&mut self, tokens: u64) {
        self.prefilling_requests = self.prefilling_requests.saturating_sub(1);
        self.prefill_tokens = self.prefill_tokens.saturating_sub(tokens);
    }

    /// Requests past prefill, now decoding.
    pub fn decoding_requests(&self) -> u32 {
        self.inflight_requests.saturating_sub(self.prefilling_requests)
    }

    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        out[0..4].copy_from_slice(&self.inflight_requests.to_le_bytes());
        out[4..8].copy_from_slice(&self.prefilling_requests.to_le_bytes());
        out[8..16].copy_from_slice(&self.prefill_tokens.to_le_bytes());
        out
    }

    /// Decodes a value written by [`encode`](Self::encode); anything else reads as idle.
    pub fn decode(bytes: &[u8]) -> Self {
        let (Some(a), Some(b), Some(c)) = (bytes.get(0..4), bytes.get(4..8), bytes.get(8..16))
        else {
            return WorkerLoad::default();
        };
        let u32_at = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap_or([0; 4]));
        WorkerLoad {
            inflight_requests: u32_at(a),
            prefilling_requests: u32_at(b),
            prefill_tokens: u64::from_le_bytes(c.try_into().unwrap_or([0; 8])),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_then_end_returns_to_idle_whatever_the_path() {
        let s = LoadDelta::Start { prefill_tokens: 100 };
        let idle = WorkerLoad::default();
        let streamed = idle
            .apply(s)
            .apply(LoadDelta::FirstByte { prefill_tokens: 100 })
            .apply(LoadDelta::End { prefill_tokens: 100, prefilling: false });
        let reset = idle.apply(s).apply(LoadDelta::End { prefill_tokens: 100, prefilling: true });
        assert_eq!(streamed, idle);
        assert_eq!(reset, idle);
        let mid = idle.apply(s).apply(LoadDelta::FirstByte { prefill_tokens: 100 });
        assert_eq!(mid.decoding_requests(), 1);
    }

    #[test]
    fn encoding_round_trips_and_garbage_reads_idle() {
        let l =
            WorkerLoad { inflight_requests: 3, prefilling_requests: 1, prefill_tokens: 1 << 40 };
        assert_eq!(WorkerLoad::decode(&l.encode()), l);
        assert_eq!(WorkerLoad::decode(&[1, 2, 3]), WorkerLoad::default());
    }
}
