//! The report's types: what was compared ([`Scope`], [`Setup`]), the [`Report`] itself and
//! its parts (per run, per cohort, ratios, comparisons, the ladder).

use kvroute_core::decision::audit::AuditClass;
use serde::{Deserialize, Serialize};

use super::regret::{EstimateError, RegretStats};
use super::{stats, ALL};
use crate::calibration::RunCalibration;
use crate::cluster::TimedFault;
use crate::record::{Health, Slo};
use crate::repeat::{RepeatVerdict, Spread};
use crate::sweep::Sweep;

/// What was compared, on what: printed at the top of the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scope {
    pub title: String,
    pub model_profile: String,
    pub workload: String,
    pub seed: u64,
    pub schedule_hash: u64,
    pub requests: usize,
    /// Freshness settings of kvroute's knowledge (events, snapshots, TTLs).
    pub knowledge: String,
    pub topology: String,
    pub machine: String,
    pub faults: Vec<String>,
    /// KV block size in tokens, for the prediction audit.
    pub block_size: u32,
    /// The filter's cost coefficients (what it believes a worker costs).
    #[serde(default)]
    pub filter_profile: String,
    /// The simulator's cost coefficients (what a worker really costs).
    #[serde(default)]
    pub sim_profile: String,
}

/// What a report is made from besides the runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    pub scope: Scope,
    /// Cache-hit rate of an unbounded single cache on the whole workload.
    pub ceiling: Option<f64>,
    pub slo: Slo,
    /// The scenario's faults (their windows make the fault cohorts).
    pub faults: Vec<TimedFault>,
    /// `[reused, prompt]` tokens of each scheduled request under the unbounded single cache
    /// ([`ceiling::per_request`](super::ceiling::per_request)); empty when unknown (no per-cohort ceilings).
    pub reuse: Vec<[u64; 2]>,
}

impl Setup {
    /// A setup without faults or per-request ceilings.
    pub fn new(scope: Scope, ceiling: Option<f64>, slo: Slo) -> Setup {
        Setup { scope, ceiling, slo, faults: Vec::new(), reuse: Vec::new() }
    }
}

/// The summary of a comparison (everything but the per-request records).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub scope: Scope,
    /// Cache-hit rate of an unbounded single cache on this workload (the best any policy can do).
    pub ceiling: Option<f64>,
    pub slo: Slo,
    /// [`BASELINE`](super::BASELINE) when it was run, else `None` (and every ratio is `None`).
    pub baseline: Option<String>,
    /// [`ALL`] first, then every cohort tag of any record (own and derived), sorted.
    pub cohorts: Vec<String>,
    /// One per run, in the order of the runs.
    pub policies: Vec<PolicyReport>,
    /// Per run at the reference rate: its figures over the baseline's run of the same repeat.
    pub ratios: Vec<Ratios>,
    #[serde(default)]
    pub faults: Vec<TimedFault>,
    #[serde(default)]
    pub reuse: Vec<[u64; 2]>,
    /// The offered-load rung the cohort tables and ratios are at: 1 when run, else the rung
    /// closest to it.
    #[serde(default = "one")]
    pub reference_rate: f64,
    /// Distinct repeats run.
    #[serde(default)]
    pub repeats: usize,
    /// Hit-rate ceiling per cohort, where its members are the same in every run.
    #[serde(default)]
    pub cohort_ceilings: Vec<(String, Option<f64>)>,
    /// Cohorts whose members differ between the runs at the reference rate (they depend on
    /// routing, like `diverted`): their useful/s ratio is not computed (compare within SLO).
    #[serde(default)]
    pub varying_cohorts: Vec<String>,
    /// Per policy (not the baseline) and cohort, at the reference rate: ratios over repeats.
    #[serde(default)]
    pub comparisons: Vec<Comparison>,
    /// Per cohort: the baseline's A/A ratios and noise floor.
    #[serde(default)]
    pub noise: Vec<NoiseRow>,
    /// The ablation ladder ([`Policy::LADDER`](crate::cluster::Policy::LADDER), the rungs that ran), cohort `all`.
    #[serde(default)]
    pub ladder: Vec<LadderStep>,
    /// kvroute against each peer router that ran, cohort `all`.
    #[serde(default)]
    pub peers: Vec<super::peers::PeerComparison>,
    #[serde(default)]
    pub regret: Vec<RegretStats>,
    #[serde(default)]
    pub estimate: Vec<EstimateError>,
    #[serde(default)]
    pub sweep: Sweep,
    /// Runs left out of the figures for host health.
    #[serde(default)]
    pub excluded: Vec<ExcludedRun>,
}

fn one() -> f64 {
    1.0
}

/// One run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyReport {
    pub policy: String,
    #[serde(default)]
    pub repeat: usize,
    #[serde(default = "one")]
    pub rate_scale: f64,
    #[serde(default)]
    pub health: Health,
    pub duration_s: f64,
    /// First to last scheduled arrival.
    #[serde(default)]
    pub span_s: Option<f64>,
    /// Requests over the span.
    #[serde(default)]
    pub offered_per_s: Option<f64>,
    /// One per entry of [`Report::cohorts`], in that order (a cohort may have 0 requests).
    pub cohorts: Vec<CohortStats>,
    pub queue: QueueStats,
    #[serde(default)]
    pub prefill: PrefillBalance,
    /// Requests whose decision header said the look-ahead replicated their hot prefix on
    /// purpose (`replicated=1`); 0 for policies without the header.
    #[serde(default)]
    pub replicated: usize,
    /// The filter's learned cost coefficients at the end of the run (kvroute policies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<RunCalibration>,
}

/// The statistics of one cohort of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CohortStats {
    pub cohort: String,
    pub requests: usize,
    /// HTTP 200 without a transport or protocol error.
    pub ok: usize,
    pub within_slo: usize,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p90_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    /// p99 of every inter-token gap of the cohort.
    pub gap_p99_ms: Option<f64>,
    /// Sum of the requests' stalls.
    pub stalls: u64,
    /// Useful completions (within the SLO) per second of the run's arrival span.
    pub useful_per_s: Option<f64>,
    /// Cached over prompt tokens, ok requests.
    pub hit_rate: Option<f64>,
    pub audit: AuditCounts,
}

impl CohortStats {
    /// Share of the cohort's requests within the SLO.
    pub fn slo_share(&self) -> Option<f64> {
        stats::rate(self.within_slo as f64, self.requests as f64)
    }
}

/// Prediction audit of the requests that carried a prediction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditCounts {
    pub hit_as_predicted: usize,
    pub false_hit: usize,
    pub false_miss: usize,
    pub ordinary_miss: usize,
    /// Predicted, but failed or reported no `prompt_tokens`: not classified.
    pub unaudited: usize,
}

impl AuditCounts {
    /// Classified predictions.
    pub fn audited(&self) -> usize {
        self.hit_as_predicted + self.false_hit + self.false_miss + self.ordinary_miss
    }

    pub(super) fn add(&mut self, class: AuditClass) {
        match class {
            AuditClass::HitAsPredicted => self.hit_as_predicted += 1,
            AuditClass::FalseHit => self.false_hit += 1,
            AuditClass::FalseMiss => self.false_miss += 1,
            AuditClass::OrdinaryMiss => self.ordinary_miss += 1,
        }
    }
}

/// How evenly a run spread its queue over the workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueStats {
    /// Mean over sample instants of `max_w q_w / ceil(sum_w q_w / N)`, where `q_w` is worker
    /// `w`'s `running + waiting` (held from one sample to its next; counted once every sampled
    /// worker has reported) over all N workers of the topology. Instants where every queue is
    /// empty are skipped. 1.0 = as even as whole requests allow; up to N = everything on one
    /// worker of N.
    /// `None` without such an instant.
    pub imbalance: Option<f64>,
    /// Sample instants the imbalance averages over.
    pub instants: usize,
    /// The topology's workers in order, then any other worker that served requests.
    pub workers: Vec<WorkerStats>,
}

/// One worker of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerStats {
    pub worker: String,
    /// Mean of `running + waiting` over this worker's samples.
    pub mean_queue: Option<f64>,
    pub max_queue: Option<u64>,
    /// Requests that named this worker (`x-worker-id`).
    pub served: usize,
    /// `served` over all requests that named a worker.
    pub share: Option<f64>,
    /// Prefill work done: sum of `prompt_tokens − cached_tokens` of its ok requests.
    #[serde(default)]
    pub prefill_tokens: u64,
}

/// How evenly a run spread the prefill work: per worker the sum of `prompt_tokens −
/// cached_tokens` of the ok requests it served (every worker of the topology, idle ones at 0),
/// the busiest and the idlest over the mean. 1.00 / 1.00 = perfectly even; max/mean up to N
/// and min/mean 0 show a starved or idle worker.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PrefillBalance {
    pub max_over_mean: Option<f64>,
    pub min_over_mean: Option<f64>,
}

/// A policy's figures divided by the baseline's (same repeat), in one cohort.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ratios {
    pub policy: String,
    pub cohort: String,
    #[serde(default)]
    pub repeat: usize,
    /// Lower is better.
    pub ttft_p50: Option<f64>,
    /// Lower is better.
    #[serde(default)]
    pub ttft_p90: Option<f64>,
    /// Lower is better.
    pub ttft_p99: Option<f64>,
    /// Lower is better.
    pub gap_p99: Option<f64>,
    /// Higher is better.
    pub useful_per_s: Option<f64>,
}

/// A figure compared across runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    TtftP50,
    TtftP90,
    TtftP99,
    GapP99,
    UsefulPerS,
    /// Share of requests within the SLO.
    SloShare,
}

impl Metric {
    pub const ALL: [Metric; 6] = [
        Metric::TtftP50,
        Metric::TtftP90,
        Metric::TtftP99,
        Metric::GapP99,
        Metric::UsefulPerS,
        Metric::SloShare,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Metric::TtftP50 => "TTFT p50",
            Metric::TtftP90 => "TTFT p90",
            Metric::TtftP99 => "TTFT p99",
            Metric::GapP99 => "gap p99",
            Metric::UsefulPerS => "useful/s",
            Metric::SloShare => "within SLO",
        }
    }

    pub fn lower_is_better(self) -> bool {
        matches!(self, Metric::TtftP50 | Metric::TtftP90 | Metric::TtftP99 | Metric::GapP99)
    }

    pub fn of(self, c: &CohortStats) -> Option<f64> {
        match self {
            Metric::TtftP50 => c.ttft_p50_ms,
            Metric::TtftP90 => c.ttft_p90_ms,
            Metric::TtftP99 => c.ttft_p99_ms,
            Metric::GapP99 => c.gap_p99_ms,
            Metric::UsefulPerS => c.useful_per_s,
            Metric::SloShare => c.slo_share(),
        }
    }
}

/// One metric's ratio over repeats and its verdict against the noise floor.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MetricRatio {
    pub metric: Metric,
    pub ratio: Spread,
    pub verdict: RepeatVerdict,
}

/// A policy against the baseline in one cohort, at the reference rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub policy: String,
    pub cohort: String,
    /// Valid runs of the policy at the reference rate.
    pub runs: usize,
    /// Runs of the policy at the reference rate left out for host health.
    pub excluded: usize,
    /// Requests and failed requests of the cohort, summed over the valid runs.
    pub requests: usize,
    pub failed: usize,
    /// One per [`Metric::ALL`].
    pub metrics: Vec<MetricRatio>,
}

impl Comparison {
    pub fn metric(&self, m: Metric) -> Option<&MetricRatio> {
        self.metrics.iter().find(|x| x.metric == m)
    }
}

/// The baseline against itself in one cohort.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoiseRow {
    pub cohort: String,
    /// Valid baseline runs at the reference rate.
    pub runs: usize,
    pub requests: usize,
    pub failed: usize,
    /// One per [`Metric::ALL`].
    pub metrics: Vec<MetricNoise>,
}

/// A/A ratios of one metric and the noise floor they give.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MetricNoise {
    pub metric: Metric,
    pub aa: Spread,
    /// Largest |A/A − 1|; `None` with fewer than two valid runs.
    pub floor: Option<f64>,
}

impl NoiseRow {
    pub fn floor(&self, m: Metric) -> Option<f64> {
        self.metrics.iter().find(|x| x.metric == m).and_then(|x| x.floor)
    }
}

/// One rung of the ablation ladder (cohort `all`, reference rate).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LadderStep {
    pub policy: String,
    /// The rung below that ran (`None` for the first).
    pub previous: Option<String>,
    /// Against the baseline, per [`Metric::ALL`].
    pub vs_baseline: Vec<MetricRatio>,
    /// Against the previous rung, paired by repeat, per [`Metric::ALL`] (judged against the
    /// baseline's noise floor).
    pub vs_previous: Vec<MetricRatio>,
}

/// A run left out of the figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExcludedRun {
    pub policy: String,
    pub repeat: usize,
    pub rate_scale: f64,
    pub reasons: Vec<String>,
}

impl Report {
    /// The first valid run of `policy` at the reference rate (else its first run), if run.
    pub fn policy(&self, policy: &str) -> Option<&PolicyReport> {
        let mine = || self.policies.iter().filter(move |p| p.policy == policy);
        mine()
            .find(|p| p.rate_scale == self.reference_rate && p.health.valid())
            .or_else(|| mine().next())
    }

    /// Valid runs of `policy` at the reference rate.
    pub fn runs_of(&self, policy: &str) -> Vec<&PolicyReport> {
        self.policies
            .iter()
            .filter(|p| p.policy == policy && p.rate_scale == self.reference_rate)
            .filter(|p| p.health.valid())
            .collect()
    }

    /// Policies in the order they first ran.
    pub fn policy_names(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for p in &self.policies {
            if !out.contains(&p.policy.as_str()) {
                out.push(&p.policy);
            }
        }
        out
    }

    /// The ratios of `policy` in `cohort` (its first repeat).
    pub fn ratios_of(&self, policy: &str, cohort: &str) -> Option<&Ratios> {
        self.ratios.iter().find(|r| r.policy == policy && r.cohort == cohort)
    }

    /// The comparison of `policy` with the baseline in `cohort`.
    pub fn comparison(&self, policy: &str, cohort: &str) -> Option<&Comparison> {
        self.comparisons.iter().find(|c| c.policy == policy && c.cohort == cohort)
    }

    /// The baseline's A/A row of `cohort`.
    pub fn noise_of(&self, cohort: &str) -> Option<&NoiseRow> {
        self.noise.iter().find(|n| n.cohort == cohort)
    }

    /// The hit-rate ceiling of `cohort` (the workload's for `all`).
    pub fn ceiling_of(&self, cohort: &str) -> Option<f64> {
        if cohort == ALL {
            return self.ceiling;
        }
        self.cohort_ceilings.iter().find(|(c, _)| c == cohort).and_then(|(_, v)| *v)
    }

    /// The workload's name (the title after " — ").
    pub fn workload_name(&self) -> &str {
        self.scope.title.split(" — ").nth(1).unwrap_or(&self.scope.title)
    }
}

impl PolicyReport {
    /// The statistics of `cohort`.
    pub fn cohort(&self, cohort: &str) -> Option<&CohortStats> {
        self.cohorts.iter().find(|c| c.cohort == cohort)
    }

    /// The statistics of every request.
    pub fn all(&self) -> Option<&CohortStats> {
        self.cohort(ALL)
    }
}
