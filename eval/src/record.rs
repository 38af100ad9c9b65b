//! What the harness measures: one record per request, and the per-worker queue over time.

use serde::{Deserialize, Serialize};

/// One request of one policy's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Index in the schedule (the same request across policies).
    pub id: usize,
    /// Scheduled arrival, ms from the start of the run.
    pub at_ms: f64,
    /// HTTP status (0 when no response arrived).
    pub status: u16,
    /// Transport or protocol error, if any (never prompt text).
    pub error: Option<String>,
    /// The worker that served it (`x-worker-id`).
    pub worker: Option<String>,
    /// Time to the first generated token.
    pub ttft_ms: Option<f64>,
    /// Every gap between consecutive generated tokens.
    pub gaps_ms: Vec<f64>,
    pub max_gap_ms: f64,
    /// Gaps longer than the workload's stall threshold.
    pub stalls: u32,
    /// Request start to end of stream.
    pub e2e_ms: f64,
    pub output_tokens: u64,
    pub prompt_tokens: Option<u64>,
    /// What the worker reported reusing (`cached_tokens`).
    pub cached_tokens: Option<u64>,
    /// What the filter predicted (`x-kvroute-decision`), kvroute policies only.
    pub predicted_cached_tokens: Option<u64>,
    /// Finished, with TTFT and mean gap within the workload's SLO.
    pub within_slo: bool,
    /// Cohort tags: `all` is implied; e.g. `hot-prefix`, `routed-away`, `tenant:b`, `turn-1`.
    pub cohorts: Vec<String>,
}

impl RequestRecord {
    pub fn ok(&self) -> bool {
        self.status == 200 && self.error.is_none()
    }

    pub fn mean_gap_ms(&self) -> f64 {
        if self.gaps_ms.is_empty() {
            0.0
        } else {
            self.gaps_ms.iter().sum::<f64>() / self.gaps_ms.len() as f64
        }
    }
}

/// A worker's queue as scraped from its `/metrics` at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QueueSample {
    /// ms from the start of the run.
    pub t_ms: f64,
    /// Index of the worker in [`RunResult::workers`].
    pub worker: usize,
    pub running: u32,
    pub waiting: u32,
}

/// Everything one policy's run produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub policy: String,
    /// Worker addresses, in topology order.
    pub workers: Vec<String>,
    /// Wall time from the first scheduled arrival to the last response.
    pub duration_s: f64,
    pub records: Vec<RequestRecord>,
    pub queue: Vec<QueueSample>,
}

/// Service-level objective of a workload: a completion is useful when it finished, its TTFT
/// and its mean inter-token gap are within these.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    pub ttft_ms: f64,
    pub mean_gap_ms: f64,
    /// A gap longer than this is a stall.
    pub stall_ms: f64,
}
