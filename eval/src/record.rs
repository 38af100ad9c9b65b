//! What the harness measures: one record per request, and the per-worker queue over time.

use serde::{Deserialize, Serialize};

use crate::calibration::RunCalibration;

/// One request of one policy's run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// The filter's TTFT estimate for the worker it chose (engine time), kvroute policies only;
    /// against `ttft_ms` it gives the estimate error.
    #[serde(default)]
    pub predicted_ttft_ms: Option<f64>,
    /// Of that estimate, the wait behind the chosen worker's queue (`predicted_wait_ms`; 0:
    /// nothing queued there); none from filters before the field.
    #[serde(default)]
    pub predicted_wait_ms: Option<f64>,
    /// How late the client sent it against its schedule (host health: a busy client sends late).
    #[serde(default)]
    pub send_lag_ms: f64,
    /// For sampled requests: every worker's what-if TTFT at send time (engine time, topology
    /// order; `None` where a worker could not answer). Empty when not sampled.
    #[serde(default)]
    pub whatif_ms: Vec<Option<f64>>,
    /// The filter's look-ahead placed this request's hot prefix on one more worker on purpose
    /// (`replicated=1` in `x-kvroute-decision`); false without the header or the field.
    #[serde(default)]
    pub replicated: bool,
    /// The filter's own time for this request's decision (body parsing to the header being
    /// set, wall-clock µs, `decision_us` in `x-kvroute-decision`); none without the header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_us: Option<u64>,
    /// Which of the run's Envoy instances (or peer router instances) the client sent it to, by
    /// index; none in reports from before the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy: Option<usize>,
    /// Topology fields of `x-kvroute-decision` (kvroute policies with a network only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topo: Option<TopoDecision>,
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

/// What kvroute's decision header says about the network (issue 25's fields).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopoDecision {
    /// The worker the chosen one pulls the prefix from (`kv_source`), if any.
    pub kv_source: Option<String>,
    /// The prefill worker of a disaggregated request (`prefill`), if any.
    pub prefill: Option<String>,
    /// Predicted network time to the chosen worker and back (`network_ms`).
    pub network_ms: Option<f64>,
    /// Predicted pull time (`transfer_ms`, 0 without a pull).
    pub transfer_ms: Option<f64>,
    /// The chosen worker's site (`site`; `None`: unknown).
    pub site: Option<String>,
    /// The chosen worker is in another site than the Envoy (`cross_site=1`).
    pub cross_site: bool,
}

impl TopoDecision {
    /// The topology fields of a decision header; `None` when it has none of them (an older
    /// filter, or a config without a `topology` section that writes them as defaults is still
    /// read: `kv_source=none` is a field).
    pub fn parse(header: &str) -> Option<TopoDecision> {
        let field = |k: &str| kvroute_stack::client::decision_field(header, k);
        let named = |k: &str| {
            field(k).filter(|v| !v.is_empty() && *v != "none" && *v != "unknown").map(str::to_owned)
        };
        let number = |k: &str| field(k).and_then(|v| v.parse::<f64>().ok());
        let any = ["kv_source", "prefill", "network_ms", "transfer_ms", "site", "cross_site"]
            .iter()
            .any(|k| field(k).is_some());
        any.then(|| TopoDecision {
            kv_source: named("kv_source"),
            prefill: named("prefill"),
            network_ms: number("network_ms"),
            transfer_ms: number("transfer_ms"),
            site: named("site"),
            cross_site: field("cross_site") == Some("1"),
        })
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

/// How healthy the host was during a run: a run on a host that could not keep up measures the
/// host, not the policy, and is flagged invalid.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// p99 of how late the simulated workers' steps started against plan (wall ms), from
    /// their step-lag histograms; `None` for workers that do not export it.
    pub step_lag_p99_ms: Option<f64>,
    /// p99 of how late the client sent requests against their schedule (wall ms).
    pub send_lag_p99_ms: f64,
    /// Share of the host's CPU time busy during the run (0..1), from `/proc/stat`.
    pub cpu_busy: Option<f64>,
    /// Reasons the run is invalid; empty when valid.
    pub invalid: Vec<String>,
}

impl Health {
    pub fn valid(&self) -> bool {
        self.invalid.is_empty()
    }
}

/// Everything one policy's run produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub policy: String,
    /// Which repetition of the cell this is (0-based).
    #[serde(default)]
    pub repeat: usize,
    /// Offered load as a multiple of the workload's own rate (1.0 unless in a load sweep).
    #[serde(default = "one")]
    pub rate_scale: f64,
    /// Time compression of the simulated workers; every duration in the records is in engine
    /// time (wall time multiplied by this).
    #[serde(default = "one")]
    pub speedup: f64,
    #[serde(default)]
    pub health: Health,
    /// Worker addresses, in topology order.
    pub workers: Vec<String>,
    /// Wall time from the first scheduled arrival to the last response.
    pub duration_s: f64,
    pub records: Vec<RequestRecord>,
    pub queue: Vec<QueueSample>,
    /// What the filter's online calibration had learned at the end of the run (kvroute
    /// policies whose Envoy stats could be read; `None` otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<RunCalibration>,
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

fn one() -> f64 {
    1.0
}

impl Default for RunResult {
    fn default() -> Self {
        RunResult {
            policy: String::new(),
            repeat: 0,
            rate_scale: 1.0,
            speedup: 1.0,
            health: Health::default(),
            workers: Vec::new(),
            duration_s: 0.0,
            records: Vec::new(),
            queue: Vec::new(),
            calibration: None,
        }
    }
}
