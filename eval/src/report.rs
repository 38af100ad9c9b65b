//! The report of a policy comparison on one workload: every run (policy × repeat × offered
//! load) summarised per cohort, compared with the `least-request` baseline repeat by repeat,
//! against the A/A noise floor, and written as Markdown, JSON and SVG plots.
//!
//! Where to start: [`summarize`] turns a [`Setup`] and the runs into a [`Report`]; [`write`]
//! puts `report.md`, `report.json` (the summary plus every per-request record) and the plots
//! into a directory; [`summary::overview`] renders `summary.md` across workloads;
//! [`summary_table`] is the Markdown table printed to the console.
//!
//! Definitions (also stated in the Markdown):
//! - TTFT quantiles are exact nearest-rank quantiles (rank `ceil(p * n)`) of the TTFTs of the
//!   cohort's ok requests; the gap p99 is over every inter-token gap of the cohort's requests.
//! - The span of a run: its first to its last scheduled arrival. Offered rate = requests over
//!   the span; useful completions per second = requests `within_slo` over the span (the same
//!   span for every cohort of the run).
//! - Cache-hit rate: sum of `cached_tokens` over sum of `prompt_tokens`, over ok requests that
//!   report `prompt_tokens` (a missing `cached_tokens` counts as 0).
//! - Prediction audit: [`kvroute_core::audit::classify`] of every ok request that carries a
//!   prediction and reports `prompt_tokens`; other predicted requests are counted `unaudited`.
//! - Queue imbalance: see [`QueueStats::imbalance`]; prefill imbalance: see [`PrefillBalance`].
//! - Ratios, noise floor and verdicts: see [`crate::repeat`]; regret and estimate error: see
//!   [`regret`]; derived cohorts: see [`cohorts`]; the load sweep: see [`crate::sweep`].
//! - Runs whose [`Health`] is invalid are shown but left out of every median, ratio, regret,
//!   estimate and sweep figure.
//!
//! Undefined numbers (a quantile of nothing, a rate over zero, a ratio without a baseline) are
//! `None` in the JSON and `n/a` in the Markdown.

pub mod ceiling;
pub mod cohorts;
pub mod goals;
mod learned;
mod markdown;
pub(crate) mod plots;
pub mod regret;
mod stats;
pub mod summary;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Context;
use kvroute_core::audit::AuditClass;
use serde::{Deserialize, Serialize};

pub use self::markdown::{markdown, summary_table};
pub use self::regret::{EstimateError, RegretStats};
pub use self::stats::nearest_rank;
use crate::calibration::RunCalibration;
use crate::cluster::{Policy, TimedFault};
use crate::record::{Health, RequestRecord, RunResult, Slo};
use crate::repeat::{aa_ratios, noise_floor, paired, verdict, Spread, Verdict};
use crate::sweep::{RunPoint, Sweep};

/// The policy every ratio is relative to, when it was run.
pub const BASELINE: &str = "least-request";
/// The cohort of every request.
pub const ALL: &str = "all";

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
    /// ([`ceiling::per_request`]); empty when unknown (no per-cohort ceilings).
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
    /// [`BASELINE`] when it was run, else `None` (and every ratio is `None`).
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
    /// The ablation ladder ([`Policy::LADDER`], the rungs that ran), cohort `all`.
    #[serde(default)]
    pub ladder: Vec<LadderStep>,
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

    fn add(&mut self, class: AuditClass) {
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
    pub verdict: Verdict,
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

/// A run's offered-load scale; a missing or meaningless one (0 from `RunResult::default()`,
/// not finite) counts as 1.
pub fn rate_of(run: &RunResult) -> f64 {
    if run.rate_scale.is_finite() && run.rate_scale > 0.0 {
        run.rate_scale
    } else {
        1.0
    }
}

/// The offered-load rung the main tables are at: 1 when present, else the rung closest to 1
/// (the lower one on a tie); 1 without runs.
fn reference_rate(runs: &[RunResult]) -> f64 {
    runs.iter()
        .map(rate_of)
        .min_by(|a, b| (a - 1.0).abs().total_cmp(&(b - 1.0).abs()).then(a.total_cmp(b)))
        .unwrap_or(1.0)
}

/// First to last scheduled arrival of a run, seconds; `None` under two distinct arrivals.
fn span_s(run: &RunResult) -> Option<f64> {
    let at = || run.records.iter().map(|r| r.at_ms).filter(|a| a.is_finite());
    let (lo, hi) = (at().reduce(f64::min)?, at().reduce(f64::max)?);
    (hi > lo).then(|| (hi - lo) / 1000.0)
}

/// One metric's ratios of `mine` over `base`, paired by repeat, with the verdict.
fn metric_ratio(
    m: Metric,
    mine: &[(usize, &CohortStats)],
    base: &[(usize, &CohortStats)],
    floor: Option<f64>,
) -> MetricRatio {
    let v = |runs: &[(usize, &CohortStats)]| -> Vec<(usize, Option<f64>)> {
        runs.iter().map(|(r, c)| (*r, m.of(c))).collect()
    };
    let ratio = Spread::of(paired(&v(mine), &v(base)));
    MetricRatio { metric: m, ratio, verdict: verdict(ratio.median, floor, m.lower_is_better()) }
}

/// Summarises every run of one schedule: per run and cohort, then across repeats.
pub fn summarize(setup: &Setup, runs: &[RunResult]) -> Report {
    let scope = &setup.scope;
    let tagged: Vec<Vec<Vec<String>>> =
        runs.iter().map(|r| cohorts::tags(&r.records, &setup.faults, rate_of(r))).collect();
    let tags: BTreeSet<&str> =
        tagged.iter().flatten().flatten().map(String::as_str).filter(|c| *c != ALL).collect();
    let cohort_names: Vec<String> = std::iter::once(ALL).chain(tags).map(str::to_owned).collect();
    let members = |run: usize, cohort: &str| -> Vec<&RequestRecord> {
        runs[run]
            .records
            .iter()
            .zip(&tagged[run])
            .filter(|(_, t)| cohort == ALL || t.iter().any(|c| c == cohort))
            .map(|(r, _)| r)
            .collect()
    };

    let policies: Vec<PolicyReport> = runs
        .iter()
        .enumerate()
        .map(|(i, run)| {
            let span = span_s(run);
            PolicyReport {
                policy: run.policy.clone(),
                repeat: run.repeat,
                rate_scale: rate_of(run),
                health: run.health.clone(),
                duration_s: run.duration_s,
                span_s: span,
                offered_per_s: span.and_then(|s| stats::rate(run.records.len() as f64, s)),
                cohorts: cohort_names
                    .iter()
                    .map(|c| stats::cohort_stats(c, &members(i, c), span, scope.block_size))
                    .collect(),
                queue: stats::queue_stats(run),
                prefill: stats::prefill_balance(run),
                replicated: run.records.iter().filter(|r| r.replicated).count(),
                calibration: run.calibration.clone(),
            }
        })
        .collect();

    let reference = reference_rate(runs);
    let mut report = Report {
        scope: scope.clone(),
        ceiling: setup.ceiling,
        slo: setup.slo,
        baseline: None,
        cohorts: cohort_names.clone(),
        policies,
        ratios: Vec::new(),
        faults: setup.faults.clone(),
        reuse: setup.reuse.clone(),
        reference_rate: reference,
        repeats: runs.iter().map(|r| r.repeat).collect::<BTreeSet<_>>().len(),
        cohort_ceilings: Vec::new(),
        varying_cohorts: Vec::new(),
        comparisons: Vec::new(),
        noise: Vec::new(),
        ladder: Vec::new(),
        regret: Vec::new(),
        estimate: Vec::new(),
        sweep: Sweep::default(),
        excluded: Vec::new(),
    };
    report.baseline = report.policies.iter().any(|p| p.policy == BASELINE).then(|| BASELINE.into());

    // Cohorts whose members differ between the runs at the reference rate (`diverted`), and
    // per-cohort ceilings where they do not.
    let at_ref: Vec<usize> = (0..runs.len()).filter(|&i| rate_of(&runs[i]) == reference).collect();
    for c in cohort_names.iter().filter(|c| *c != ALL) {
        let ids = |i: usize| -> BTreeSet<usize> { members(i, c).iter().map(|r| r.id).collect() };
        let first = at_ref.first().map(|&i| ids(i));
        let same = at_ref.iter().all(|&i| Some(ids(i)) == first);
        if !same {
            report.varying_cohorts.push(c.clone());
        }
        if !setup.reuse.is_empty() {
            let v = if same { first.and_then(|f| ceiling::of(&setup.reuse, f)) } else { None };
            report.cohort_ceilings.push((c.clone(), v));
        }
    }

    report.excluded = report
        .policies
        .iter()
        .filter(|p| !p.health.valid())
        .map(|p| ExcludedRun {
            policy: p.policy.clone(),
            repeat: p.repeat,
            rate_scale: p.rate_scale,
            reasons: p.health.invalid.clone(),
        })
        .collect();

    // Per-run ratios at the reference rate (the same repeat of the baseline).
    for c in &cohort_names {
        for p in report.policies.iter().filter(|p| p.rate_scale == reference) {
            let Some(s) = p.cohort(c) else { continue };
            let b = report
                .policies
                .iter()
                .find(|b| b.policy == BASELINE && b.repeat == p.repeat && b.rate_scale == reference)
                .and_then(|b| b.cohort(c));
            let r = |f: fn(&CohortStats) -> Option<f64>| stats::ratio(f(s), b.and_then(f));
            report.ratios.push(Ratios {
                policy: p.policy.clone(),
                cohort: c.clone(),
                repeat: p.repeat,
                ttft_p50: r(|s| s.ttft_p50_ms),
                ttft_p90: r(|s| s.ttft_p90_ms),
                ttft_p99: r(|s| s.ttft_p99_ms),
                gap_p99: r(|s| s.gap_p99_ms),
                useful_per_s: r(|s| s.useful_per_s),
            });
        }
    }

    // Repeats: A/A rows, comparisons, the ladder.
    let names: Vec<String> = report.policy_names().into_iter().map(str::to_owned).collect();
    let cohort_runs = |policy: &str, c: &str| -> Vec<(usize, &CohortStats)> {
        report.runs_of(policy).into_iter().filter_map(|p| Some((p.repeat, p.cohort(c)?))).collect()
    };
    let count = |runs: &[(usize, &CohortStats)]| -> (usize, usize) {
        let n: usize = runs.iter().map(|(_, c)| c.requests).sum();
        (n, n - runs.iter().map(|(_, c)| c.ok).sum::<usize>())
    };
    let mut noise = Vec::new();
    let mut comparisons = Vec::new();
    if report.baseline.is_some() {
        for c in &cohort_names {
            let base = cohort_runs(BASELINE, c);
            let (requests, failed) = count(&base);
            let metrics = Metric::ALL
                .iter()
                .map(|&m| {
                    let aa = aa_ratios(&base.iter().map(|(_, s)| m.of(s)).collect::<Vec<_>>());
                    MetricNoise {
                        metric: m,
                        aa: Spread::of(aa.iter().copied()),
                        floor: noise_floor(&aa),
                    }
                })
                .collect();
            noise.push(NoiseRow { cohort: c.clone(), runs: base.len(), requests, failed, metrics });
        }
    }
    for c in &cohort_names {
        let base = cohort_runs(BASELINE, c);
        let floors = noise.iter().find(|n: &&NoiseRow| &n.cohort == c);
        for name in names.iter().filter(|n| *n != BASELINE) {
            let mine = cohort_runs(name, c);
            let (requests, failed) = count(&mine);
            let all_runs = report
                .policies
                .iter()
                .filter(|p| &p.policy == name && p.rate_scale == reference)
                .count();
            comparisons.push(Comparison {
                policy: name.clone(),
                cohort: c.clone(),
                runs: mine.len(),
                excluded: all_runs - mine.len(),
                requests,
                failed,
                metrics: Metric::ALL
                    .iter()
                    .map(|&m| {
                        if m == Metric::UsefulPerS && report.varying_cohorts.contains(c) {
                            // A count over the same span: meaningless when the members differ.
                            return MetricRatio {
                                metric: m,
                                ratio: Spread::default(),
                                verdict: Verdict::Unknown,
                            };
                        }
                        metric_ratio(m, &mine, &base, floors.and_then(|f| f.floor(m)))
                    })
                    .collect(),
            });
        }
    }
    let mut ladder = Vec::new();
    let mut previous: Option<String> = None;
    let all_floor = noise.iter().find(|n| n.cohort == ALL);
    for rung in
        Policy::LADDER.map(Policy::name).into_iter().filter(|n| names.iter().any(|x| x == n))
    {
        let mine = cohort_runs(rung, ALL);
        let base = cohort_runs(BASELINE, ALL);
        let prev = previous.as_deref().map(|p| cohort_runs(p, ALL)).unwrap_or_default();
        let floor = |m: Metric| all_floor.and_then(|f| f.floor(m));
        ladder.push(LadderStep {
            policy: rung.to_owned(),
            previous: previous.clone(),
            vs_baseline: Metric::ALL
                .iter()
                .map(|&m| metric_ratio(m, &mine, &base, floor(m)))
                .collect(),
            vs_previous: if previous.is_some() {
                Metric::ALL.iter().map(|&m| metric_ratio(m, &mine, &prev, floor(m))).collect()
            } else {
                Vec::new()
            },
        });
        previous = Some(rung.to_owned());
    }
    report.noise = noise;
    report.comparisons = comparisons;
    report.ladder = ladder;

    // Regret and estimate error over the valid runs at the reference rate.
    let valid_at_ref = |name: &str| -> Vec<&RunResult> {
        runs.iter()
            .filter(|r| r.policy == name && rate_of(r) == reference && r.health.valid())
            .collect()
    };
    for name in &names {
        let v = valid_at_ref(name);
        let s = regret::regret_stats(name, &v);
        if s.sampled > 0 {
            report.regret.push(s);
        }
        if let Some(e) = regret::estimate_error(name, &v) {
            report.estimate.push(e);
        }
    }

    // The load sweep over every valid run.
    let points: Vec<RunPoint> = report
        .policies
        .iter()
        .filter(|p| p.health.valid())
        .filter_map(|p| {
            let a = p.all()?;
            Some(RunPoint {
                policy: p.policy.clone(),
                repeat: p.repeat,
                rate_scale: p.rate_scale,
                offered_per_s: p.offered_per_s,
                requests: a.requests,
                within_slo: a.within_slo,
                ttft_p50_ms: a.ttft_p50_ms,
                ttft_p90_ms: a.ttft_p90_ms,
                ttft_p99_ms: a.ttft_p99_ms,
                useful_per_s: a.useful_per_s,
            })
        })
        .collect();
    report.sweep = crate::sweep::sweep(&points, BASELINE);
    report
}

/// What one plot file shows.
enum Plot {
    TtftCdf,
    /// Index into [`Report::policies`].
    Queue(usize),
    CohortTails,
    Sweep,
    Estimate,
}

/// The plots of a report with their file names (file-safe and unique) and captions.
fn plots_of(report: &Report) -> Vec<(String, String, Plot)> {
    let mut files = vec![(
        "ttft_cdf.svg".to_owned(),
        "TTFT CDF at the reference load, one line per policy (valid runs pooled; log x)".to_owned(),
        Plot::TtftCdf,
    )];
    let mut used = BTreeSet::new();
    for name in report.policy_names() {
        let Some(i) = report
            .policy(name)
            .and_then(|p| report.policies.iter().position(|q| std::ptr::eq(p, q)))
        else {
            continue;
        };
        let safe: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
            .collect();
        let mut file = format!("queue_{safe}.svg");
        let mut n = 2;
        while !used.insert(file.clone()) {
            file = format!("queue_{safe}_{n}.svg");
            n += 1;
        }
        let p = &report.policies[i];
        let caption = format!(
            "{name}: queue (running + waiting) per worker over time (repeat {}, load ×{})",
            p.repeat + 1,
            p.rate_scale
        );
        files.push((file, caption, Plot::Queue(i)));
    }
    files.push((
        "cohort_tails.svg".to_owned(),
        "TTFT p99 per cohort, one bar per policy (median of valid runs)".to_owned(),
        Plot::CohortTails,
    ));
    files.push((
        "sweep.svg".to_owned(),
        "Load sweep: TTFT p90 and useful/s against offered load, one line per policy (medians)"
            .to_owned(),
        Plot::Sweep,
    ));
    files.push((
        "estimate_error.svg".to_owned(),
        "kvroute's TTFT estimate error (median |predicted − observed| / observed) per time window"
            .to_owned(),
        Plot::Estimate,
    ));
    files
}

/// The plot files of a report, with what each shows: `ttft_cdf.svg`, one `queue_<policy>.svg`
/// per policy (names made file-safe and unique), `cohort_tails.svg`, `sweep.svg`,
/// `estimate_error.svg`.
pub fn plot_files(report: &Report) -> Vec<(String, String)> {
    plots_of(report).into_iter().map(|(name, caption, _)| (name, caption)).collect()
}

/// Writes `report.md`, `report.json` (the [`Report`]'s fields plus `runs`, every per-request
/// record and queue sample) and the plots of [`plot_files`] into `dir` (created if needed).
/// Returns the paths written. `runs` should be the runs the report was made from.
pub fn write(report: &Report, runs: &[RunResult], dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let mut put = |name: &str, content: &str| -> anyhow::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
        Ok(())
    };

    put("report.md", &markdown(report))?;

    let mut json = serde_json::to_value(report)?;
    if let serde_json::Value::Object(map) = &mut json {
        map.insert("runs".to_owned(), serde_json::to_value(runs)?);
    }
    put("report.json", &serde_json::to_string_pretty(&json)?)?;

    let at_ref = |r: &&RunResult| rate_of(r) == report.reference_rate && r.health.valid();
    let cdf_runs: Vec<RunResult> = runs.iter().filter(at_ref).cloned().collect();
    for (name, _, plot) in plots_of(report) {
        let svg = match plot {
            Plot::TtftCdf => plots::ttft_cdf(&cdf_runs),
            Plot::CohortTails => plots::cohort_tails(report),
            Plot::Sweep => plots::sweep(report),
            Plot::Estimate => plots::estimate(report),
            Plot::Queue(i) => {
                let p = &report.policies[i];
                plots::queue(
                    &p.policy,
                    runs.iter().find(|r| {
                        r.policy == p.policy && r.repeat == p.repeat && rate_of(r) == p.rate_scale
                    }),
                )
            }
        };
        put(&name, &svg.with_context(|| format!("drawing {name}"))?)?;
    }
    Ok(written)
}

/// Reads back a `report.json` written by [`write`] (this version or an older one): what the
/// report was made from, and the runs.
pub fn read_json(path: &Path) -> anyhow::Result<(Setup, Vec<RunResult>)> {
    #[derive(Deserialize)]
    struct File {
        scope: Scope,
        ceiling: Option<f64>,
        slo: Slo,
        #[serde(default)]
        faults: Vec<TimedFault>,
        #[serde(default)]
        reuse: Vec<[u64; 2]>,
        #[serde(default)]
        runs: Vec<RunResult>,
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let f: File = serde_json::from_str(&text).context("report.json")?;
    let setup =
        Setup { scope: f.scope, ceiling: f.ceiling, slo: f.slo, faults: f.faults, reuse: f.reuse };
    Ok((setup, f.runs))
}

/// A scope for tests.
#[cfg(test)]
pub(crate) fn tests_scope() -> Scope {
    Scope {
        title: "test comparison — synthetic".into(),
        model_profile: "tiny".into(),
        workload: "synthetic".into(),
        seed: 7,
        schedule_hash: 0xabcdef,
        requests: 0,
        knowledge: "events on, snapshots 1 s".into(),
        topology: "4 workers".into(),
        machine: "test".into(),
        faults: vec![],
        block_size: 16,
        filter_profile: "prefill 0.2 ms/token".into(),
        sim_profile: "llama3-8b-h100, prefill 0.2 ms/token".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::QueueSample;
    use crate::repeat::Verdict;

    const SLO: Slo = Slo { ttft_ms: 500.0, mean_gap_ms: 50.0, stall_ms: 200.0 };

    fn scope() -> Scope {
        tests_scope()
    }

    /// Summarises `runs` without faults or per-request ceilings.
    fn summarize(scope: &Scope, ceiling: Option<f64>, slo: Slo, runs: &[RunResult]) -> Report {
        super::summarize(&Setup::new(scope.clone(), ceiling, slo), runs)
    }

    fn rec(id: usize, worker: &str, ttft_ms: f64, cohorts: &[&str]) -> RequestRecord {
        RequestRecord {
            id,
            at_ms: id as f64 * 10.0,
            status: 200,
            error: None,
            worker: Some(worker.into()),
            ttft_ms: Some(ttft_ms),
            gaps_ms: vec![10.0, 20.0],
            max_gap_ms: 20.0,
            stalls: 0,
            e2e_ms: ttft_ms + 30.0,
            output_tokens: 3,
            prompt_tokens: Some(100),
            cached_tokens: Some(0),
            predicted_cached_tokens: None,
            within_slo: ttft_ms <= SLO.ttft_ms,
            cohorts: cohorts.iter().map(|c| c.to_string()).collect(),
            ..Default::default()
        }
    }

    fn failed(id: usize) -> RequestRecord {
        RequestRecord {
            status: 0,
            error: Some("connection reset".into()),
            worker: None,
            ttft_ms: None,
            gaps_ms: vec![],
            within_slo: false,
            ..rec(id, "", 0.0, &[])
        }
    }

    fn workers(n: usize) -> Vec<String> {
        (0..n).map(|w| format!("127.0.0.1:{}", 9000 + w)).collect()
    }

    fn run(
        policy: &str,
        n: usize,
        records: Vec<RequestRecord>,
        queue: Vec<QueueSample>,
    ) -> RunResult {
        RunResult {
            policy: policy.into(),
            workers: workers(n),
            duration_s: 10.0,
            records,
            queue,
            ..Default::default()
        }
    }

    /// Queue samples every 100 ms for 1 s; `q(t, w)` is worker w's queue.
    fn queue(n: usize, q: impl Fn(usize, usize) -> u32) -> Vec<QueueSample> {
        (0..10)
            .flat_map(|t| {
                let q = &q;
                (0..n).map(move |w| QueueSample {
                    t_ms: t as f64 * 100.0,
                    worker: w,
                    running: q(t, w),
                    waiting: 0,
                })
            })
            .collect()
    }

    /// A policy spreading 40 requests evenly over 4 workers, and one sending all to worker 0
    /// with a longer TTFT; cohorts `hot` (even ids) and `tenant:b` (multiples of 4).
    fn even_and_skewed() -> Vec<RunResult> {
        let cohorts = |i: usize| match (i % 2 == 0, i % 4 == 0) {
            (true, true) => vec!["hot", "tenant:b"],
            (true, false) => vec!["hot"],
            _ => vec![],
        };
        let w = workers(4);
        let even: Vec<_> =
            (0..40).map(|i| rec(i, &w[i % 4], 100.0 + i as f64, &cohorts(i))).collect();
        let skewed: Vec<_> =
            (0..40).map(|i| rec(i, &w[0], 100.0 + 20.0 * i as f64, &cohorts(i))).collect();
        vec![
            run("least-request", 4, even, queue(4, |t, _| 1 + (t % 3) as u32)),
            run(
                "all-on-one",
                4,
                skewed,
                queue(4, |t, w| if w == 0 { 4 * (1 + t as u32) } else { 0 }),
            ),
        ]
    }

    fn temp_dir(name: &str) -> PathBuf {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        std::env::temp_dir().join(format!("kvroute-report-{name}-{}-{nanos}", std::process::id()))
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    /// Equal JSON values, floats within a relative 1e-9 (serde_json's float parsing may be off
    /// by an ulp).
    fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
        use serde_json::Value::*;
        match (a, b) {
            (Number(x), Number(y)) => match (x.as_f64(), y.as_f64()) {
                (Some(x), Some(y)) if x.fract() != 0.0 || y.fract() != 0.0 => close(x, y),
                _ => x == y,
            },
            (Array(x), Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
            }
            (Object(x), Object(y)) => {
                x.len() == y.len()
                    && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
            }
            _ => a == b,
        }
    }

    /// 40 requests over 4 workers, 10 ms apart, TTFT `base + i` ms; of `policy`, `repeat`.
    fn rep_run(policy: &str, repeat: usize, base: f64) -> RunResult {
        let w = workers(4);
        let records = (0..40).map(|i| rec(i, &w[i % 4], base + i as f64, &[])).collect();
        let mut r = run(policy, 4, records, vec![]);
        r.repeat = repeat;
        r
    }

    fn invalid(mut r: RunResult, why: &str) -> RunResult {
        r.health.invalid.push(why.into());
        r
    }

    #[test]
    fn repeats_give_paired_medians_ranges_and_the_aa_floor() {
        let runs = vec![
            rep_run("least-request", 0, 100.0),
            rep_run("kvroute", 0, 101.0),
            rep_run("fast", 0, 40.0),
            rep_run("kvroute", 1, 104.0),
            rep_run("fast", 1, 41.0),
            rep_run("least-request", 1, 103.0),
            rep_run("fast", 2, 42.0),
            invalid(rep_run("fast", 2, 5000.0), "send lag p99 80 ms > 20 ms"),
            rep_run("least-request", 2, 106.0),
            rep_run("kvroute", 2, 107.0),
        ];
        // The invalid duplicate of fast #3 is a separate run: give it its own repeat.
        let mut runs = runs;
        runs[7].repeat = 3;
        let report = summarize(&scope(), None, SLO, &runs);
        assert_eq!(report.repeats, 4);
        let noise = report.noise_of(ALL).expect("A/A row");
        assert_eq!(noise.runs, 3);
        // p50: rank 20 of 40 -> base + 19; widest pair 125 / 119.
        let floor = noise.floor(Metric::TtftP50).expect("floor");
        assert!(close(floor, 125.0 / 119.0 - 1.0), "{floor}");
        let aa = noise.metrics[0].aa;
        assert_eq!(aa.n, 6);
        assert!(close(aa.max.unwrap_or(0.0), 125.0 / 119.0));
        // Every request is within the SLO: useful/s is identical, its floor 0.
        assert_eq!(noise.floor(Metric::UsefulPerS), Some(0.0));

        let kv = report.comparison("kvroute", ALL).expect("kvroute");
        assert_eq!((kv.runs, kv.excluded, kv.requests, kv.failed), (3, 0, 120, 0));
        let p50 = kv.metric(Metric::TtftP50).expect("p50");
        assert_eq!(p50.verdict, Verdict::NoDifference);
        assert!(close(p50.ratio.median.unwrap_or(0.0), 123.0 / 122.0));
        assert_eq!(kv.metric(Metric::UsefulPerS).map(|m| m.verdict), Some(Verdict::NoDifference));

        let fast = report.comparison("fast", ALL).expect("fast");
        assert_eq!((fast.runs, fast.excluded), (3, 1));
        let p50 = fast.metric(Metric::TtftP50).expect("p50");
        assert_eq!(p50.verdict, Verdict::Better);
        // Paired: 59/119, 60/122, 61/125 (the invalid 5000 ms run is not among them).
        assert!(close(p50.ratio.min.unwrap_or(0.0), 61.0 / 125.0));
        assert!(close(p50.ratio.max.unwrap_or(0.0), 59.0 / 119.0));
        assert_eq!(report.excluded.len(), 1);
        assert_eq!(report.excluded[0].reasons, ["send lag p99 80 ms > 20 ms"]);
        // The per-run ratios pair repeats too.
        let r = report.ratios.iter().find(|r| r.policy == "fast" && r.repeat == 1).expect("r");
        assert!(r.ttft_p50.is_some_and(|x| close(x, 60.0 / 122.0)));

        let md = markdown(&report);
        for needle in [
            "no difference <small>(1.01×",
            "A/A least-request vs least-request",
            "floor ±5.0%",
            "**invalid**: send lag p99 80 ms > 20 ms",
            "1 of 10 runs excluded for host health",
            "| fast | 3 (1) | 120 / 0 |",
        ] {
            assert!(md.contains(needle), "missing {needle:?} in\n{md}");
        }
        // Medians of the valid runs only in the main table: fast's TTFT p50 is 60 ms.
        assert!(summary_table(&report).contains("| fast | 3 | 40 | 0 | 60.0 |"));
    }

    #[test]
    fn the_ladder_follows_policy_ladder_order() {
        let runs = vec![
            rep_run("kvroute", 0, 50.0),
            rep_run("least-request", 0, 100.0),
            rep_run("oracle", 0, 40.0),
            rep_run("kvroute-load-only", 0, 80.0),
        ];
        let report = summarize(&scope(), None, SLO, &runs);
        let steps: Vec<(&str, Option<&str>)> =
            report.ladder.iter().map(|s| (s.policy.as_str(), s.previous.as_deref())).collect();
        assert_eq!(
            steps,
            vec![
                ("least-request", None),
                ("kvroute-load-only", Some("least-request")),
                ("kvroute", Some("kvroute-load-only")),
                ("oracle", Some("kvroute")),
            ]
        );
        let kv = &report.ladder[2];
        let prev = kv.vs_previous.iter().find(|m| m.metric == Metric::TtftP50).expect("p50");
        assert!(prev.ratio.median.is_some_and(|x| close(x, 69.0 / 99.0)));
        // One run: no floor, so any difference counts.
        assert_eq!(prev.verdict, Verdict::Better);
        let md = markdown(&report);
        assert!(md.contains("oracle (the limit)"), "{md}");
        assert!(md.contains("no noise floor (1 run)"));
    }

    #[test]
    fn derived_cohorts_ceilings_regret_and_estimates_reach_the_report() {
        let w = workers(2);
        let hot = |id: usize, worker: &str| {
            let mut r = rec(id, worker, 100.0, &["hot-prefix"]);
            r.at_ms = 1000.0 + id as f64 * 100.0;
            r.e2e_ms = 150.0;
            r
        };
        let mut bg = rec(0, &w[0], 100.0, &["background"]);
        bg.at_ms = 1150.0;
        bg.whatif_ms = vec![Some(100.0), Some(160.0)];
        bg.predicted_ttft_ms = Some(120.0);
        let mut records = vec![bg, hot(1, &w[0]), hot(2, &w[0]), hot(3, &w[1]), hot(4, &w[0])];
        records[4].whatif_ms = vec![Some(100.0), Some(60.0)];
        let mut kv = run("kvroute", 2, records.clone(), vec![]);
        kv.records.iter_mut().for_each(|r| r.worker = Some(w[0].clone()));
        let runs = vec![run("least-request", 2, records, vec![]), kv];
        let setup = Setup {
            faults: vec![TimedFault {
                at_ms: 1200,
                fault: crate::cluster::Fault::Evict { worker: 0, percent: 100 },
            }],
            reuse: vec![[0, 100], [0, 100], [100, 100], [100, 100], [100, 100]],
            ..Setup::new(scope(), Some(0.6), SLO)
        };
        let report = super::summarize(&setup, &runs);
        assert!(report.cohorts.iter().all(|c| c != "routed-away"));
        for c in ["diverted", "during-burst", "f1-evict:before", "f1-evict:during"] {
            assert!(report.cohorts.iter().any(|x| x == c), "{c} in {:?}", report.cohorts);
        }
        let lr = report.policy("least-request").expect("lr");
        // Hot ids 1 (first on w0), 2 (w0 finishes id 1 at 1250 > 1200) and 3 (first on w1).
        assert_eq!(lr.cohort("diverted").map(|c| c.requests), Some(3));
        // All on w0: ids 1 and 2 (w0 first finishes at 1250); id 3 arrives at 1300: held.
        let kvr = report.policy("kvroute").expect("kvroute");
        assert_eq!(kvr.cohort("diverted").map(|c| c.requests), Some(2));
        assert_eq!(lr.cohort("during-burst").map(|c| c.requests), Some(1));
        // Cohort ceilings where the members are the same in every run: hot-prefix = ids 1..=4;
        // `diverted` differs by policy.
        assert_eq!(report.ceiling_of("hot-prefix"), Some(0.75));
        assert_eq!(report.ceiling_of("diverted"), None);
        assert_eq!(report.varying_cohorts, ["diverted"]);
        let d = report.comparison("kvroute", "diverted").expect("diverted");
        assert_eq!(d.metric(Metric::UsefulPerS).map(|m| m.verdict), Some(Verdict::Unknown));
        assert_eq!(d.metric(Metric::SloShare).map(|m| m.verdict), Some(Verdict::NoDifference));
        assert_eq!(report.ceiling_of(ALL), Some(0.6));
        // Regret: the background request (w0, best) 0; hot 4 on w0 with w1 at 60: 40.
        let regret = report.regret.iter().find(|r| r.policy == "least-request").expect("r");
        assert_eq!((regret.sampled, regret.count, regret.p99_ms), (2, 2, Some(40.0)));
        let est = report.estimate.iter().find(|e| e.policy == "kvroute").expect("estimate");
        assert_eq!((est.count, est.median), (1, Some(0.2)));
        let md = markdown(&report);
        assert!(md.contains("a one-off fault's 5 s after it"), "{md}");
    }

    #[test]
    fn the_load_sweep_and_goodput_use_valid_runs_at_every_rung() {
        let mut runs = Vec::new();
        for (rate, base) in [(0.5, 100.0), (1.0, 200.0), (2.0, 900.0)] {
            for (policy, b) in [("least-request", base), ("kvroute", base / 2.0)] {
                let mut r = rep_run(policy, 0, b);
                r.rate_scale = rate;
                r.records.iter_mut().for_each(|x| x.at_ms /= rate);
                runs.push(r);
            }
        }
        let report = summarize(&scope(), None, SLO, &runs);
        assert_eq!(report.reference_rate, 1.0);
        assert_eq!(report.sweep.rates, vec![0.5, 1.0, 2.0]);
        // Within the SLO (TTFT <= 500): least-request all at x0.5 and x1, none at x2;
        // kvroute at every rung (450..489 at x2). Offered: 40 requests over 0.39 s / rate.
        let g = |p: &str| report.sweep.goodput.iter().find(|g| g.policy == p).expect("g");
        assert!(close(g("least-request").goodput.median.unwrap_or(0.0), 40.0 / 0.39));
        assert!(close(g("kvroute").goodput.median.unwrap_or(0.0), 2.0 * 40.0 / 0.39));
        assert!(close(g("kvroute").ratio.median.unwrap_or(0.0), 2.0));
        // The cohort tables are at x1 only.
        assert_eq!(report.runs_of("kvroute").len(), 1);
        assert_eq!(reference_rate(&runs[..2]), 0.5);
        let mut far = runs[4].clone();
        far.rate_scale = 4.0;
        assert_eq!(reference_rate(&[runs[4].clone(), far]), 2.0);
        let md = markdown(&report);
        assert!(md.contains("| kvroute | ×2 | 1 | 205.13 |"), "{md}");
    }

    #[test]
    fn the_summary_lists_where_kvroute_does_not_win() {
        let runs = vec![
            rep_run("least-request", 0, 100.0),
            rep_run("kvroute", 0, 100.0),
            rep_run("least-request", 1, 104.0),
            invalid(rep_run("kvroute", 1, 50.0), "CPU busy 99%"),
        ];
        let report = summarize(&scope(), Some(0.5), SLO, &runs);
        let md = summary::overview("test", std::slice::from_ref(&report));
        for needle in [
            "# kvroute-bench — plan test",
            "Filter cost coefficients: prefill 0.2 ms/token",
            "Simulator cost coefficients: llama3-8b-h100",
            "## Where kvroute does not beat least-request",
            "| synthetic | `all` | 40 / 0 | TTFT p50 no difference",
            "## Ratios against least-request",
            "| synthetic | `all` | A/A least-request | 2 |",
            "## Ablation ladder",
            "## Goodput at SLO",
            "## Invalid runs",
            "1 of 4 runs excluded for host health",
            "| synthetic | kvroute | 2 | ×1 | CPU busy 99% |",
            "largest |A/A ratio − 1|",
        ] {
            assert!(md.contains(needle), "missing {needle:?} in\n{md}");
        }
        let none = summary::overview("test", &[]);
        assert!(none.contains("kvroute was not compared with least-request"));
    }

    #[test]
    fn quantiles_are_exact_nearest_rank() {
        // TTFTs 1..=100 ms in shuffled order, plus a failed request that must not count.
        let mut records: Vec<_> =
            (1..=100).map(|i| rec(i, "w", ((i * 37) % 100 + 1) as f64, &[])).collect();
        records.push(failed(101));
        let report = summarize(&scope(), None, SLO, &[run("p", 1, records, vec![])]);
        let all = report.policies[0].all().expect("cohort all");
        assert_eq!((all.requests, all.ok), (101, 100));
        assert_eq!(all.ttft_p50_ms, Some(50.0));
        assert_eq!(all.ttft_p90_ms, Some(90.0));
        assert_eq!(all.ttft_p99_ms, Some(99.0));
        // 100 gaps of 10 ms and 100 of 20 ms: rank 198 of 200 is 20.
        assert_eq!(all.gap_p99_ms, Some(20.0));

        let one =
            summarize(&scope(), None, SLO, &[run("p", 1, vec![rec(0, "w", 42.0, &[])], vec![])]);
        let all = one.policies[0].all().expect("cohort all");
        assert_eq!((all.ttft_p50_ms, all.ttft_p99_ms), (Some(42.0), Some(42.0)));
    }

    #[test]
    fn hit_rate_is_cached_over_prompt_tokens_of_ok_requests() {
        let mut a = rec(0, "w", 10.0, &[]);
        a.cached_tokens = Some(80);
        let mut b = rec(1, "w", 10.0, &[]);
        b.prompt_tokens = Some(300);
        b.cached_tokens = None; // counts as 0
        let mut c = failed(2);
        c.prompt_tokens = Some(1000);
        c.cached_tokens = Some(1000); // failed: excluded
        let mut d = rec(3, "w", 10.0, &[]);
        d.prompt_tokens = None; // nothing to divide by: excluded
        d.cached_tokens = Some(50);
        let report = summarize(&scope(), Some(0.6), SLO, &[run("p", 1, vec![a, b, c, d], vec![])]);
        assert_eq!(report.policies[0].all().and_then(|c| c.hit_rate), Some(0.2));
        assert_eq!(report.ceiling, Some(0.6));

        let none = summarize(&scope(), None, SLO, &[run("p", 1, vec![failed(0)], vec![])]);
        assert_eq!(none.policies[0].all().and_then(|c| c.hit_rate), None);
    }

    #[test]
    fn useful_per_second_is_within_slo_over_the_arrival_span() {
        // Arrivals every 100 ms from 0 to 4 s (41 requests): the span is 4 s, whatever the
        // run's duration.
        let mut records: Vec<_> = (0..30).map(|i| rec(i, "w", 100.0, &[])).collect();
        records.extend((30..40).map(|i| rec(i, "w", 900.0, &[]))); // outside the SLO
        records.push(failed(40));
        for r in &mut records {
            r.at_ms = r.id as f64 * 100.0;
        }
        let mut r = run("p", 1, records, vec![]);
        r.duration_s = 9.0;
        let report = summarize(&scope(), None, SLO, std::slice::from_ref(&r));
        let p = &report.policies[0];
        let all = p.all().expect("cohort all");
        assert_eq!(all.within_slo, 30);
        assert_eq!(all.useful_per_s, Some(7.5));
        assert_eq!((p.span_s, p.offered_per_s), (Some(4.0), Some(41.0 / 4.0)));

        // Every arrival at once: no span, no rate.
        r.records.iter_mut().for_each(|x| x.at_ms = 0.0);
        let report = summarize(&scope(), None, SLO, &[r]);
        assert_eq!(report.policies[0].all().and_then(|c| c.useful_per_s), None);
    }

    #[test]
    fn audit_counts_every_class() {
        let predicted = |id: usize, predicted: u64, cached: u64, prompt: u64| {
            let mut r = rec(id, "w", 10.0, &[]);
            r.predicted_cached_tokens = Some(predicted);
            r.cached_tokens = Some(cached);
            r.prompt_tokens = Some(prompt);
            r
        };
        let mut lost = failed(9);
        lost.predicted_cached_tokens = Some(64);
        let records = vec![
            predicted(0, 64, 64, 100),
            predicted(1, 96, 80, 96), // whole prompt: one block less is as predicted
            predicted(2, 64, 32, 100),
            predicted(3, 64, 80, 100),
            predicted(4, 0, 16, 100),
            predicted(5, 0, 0, 100),
            predicted(6, 0, 0, 100),
            rec(7, "w", 10.0, &[]), // no prediction: not audited at all
            lost,
        ];
        let report = summarize(&scope(), None, SLO, &[run("kvroute", 1, records, vec![])]);
        let audit = report.policies[0].all().expect("cohort all").audit;
        assert_eq!(
            audit,
            AuditCounts {
                hit_as_predicted: 2,
                false_hit: 1,
                false_miss: 2,
                ordinary_miss: 2,
                unaudited: 1
            }
        );
        assert_eq!(audit.audited(), 7);
        assert!(markdown(&report).contains("| kvroute | all | 7 | 2 | 1 | 2 | 2 | 1 |"));
    }

    #[test]
    fn imbalance_is_one_for_even_queues() {
        let report = summarize(&scope(), None, SLO, &even_and_skewed());
        let q = &report.policy("least-request").expect("baseline").queue;
        assert_eq!(q.imbalance, Some(1.0));
        assert_eq!(q.instants, 10);
        assert_eq!(q.workers.len(), 4);
        for w in &q.workers {
            assert_eq!(w.served, 10);
            assert_eq!(w.share, Some(0.25));
            assert!(w.mean_queue.is_some_and(|m| m > 1.0));
        }
    }

    #[test]
    fn bad_policy_shows_imbalance_n_and_worse_tails() {
        let report = summarize(&scope(), None, SLO, &even_and_skewed());
        let bad = report.policy("all-on-one").expect("bad policy");
        assert!(bad.queue.imbalance.is_some_and(|i| close(i, 4.0)));
        assert_eq!(bad.queue.workers[0].share, Some(1.0));
        assert_eq!(bad.queue.workers[1].share, Some(0.0));
        assert_eq!(bad.queue.workers[1].mean_queue, Some(0.0));
        for c in &report.cohorts {
            let r = report.ratios_of("all-on-one", c).expect("ratios");
            assert!(r.ttft_p99.is_some_and(|x| x > 1.5), "{c}: {r:?}");
            assert!(r.useful_per_s.is_some_and(|x| x < 1.0), "{c}: {r:?}");
        }
    }

    #[test]
    fn cohorts_are_all_then_every_tag() {
        let report = summarize(&scope(), None, SLO, &even_and_skewed());
        assert_eq!(report.cohorts, vec!["all", "hot", "tenant:b"]);
        let base = report.policy("least-request").expect("baseline");
        let counts: Vec<_> = base.cohorts.iter().map(|c| (c.cohort.as_str(), c.requests)).collect();
        assert_eq!(counts, vec![("all", 40), ("hot", 20), ("tenant:b", 10)]);
        // `tenant:b` ids are 0, 4, .., 36: TTFTs 100, 104, .., 136; nearest-rank p50 is the 5th.
        assert_eq!(base.cohort("tenant:b").and_then(|c| c.ttft_p50_ms), Some(116.0));
    }

    #[test]
    fn ratios_against_least_request() {
        let report = summarize(&scope(), None, SLO, &even_and_skewed());
        assert_eq!(report.baseline.as_deref(), Some(BASELINE));
        assert_eq!(report.ratios.len(), 2 * 3);
        let base = report.ratios_of("least-request", "all").expect("ratios");
        assert_eq!(
            (base.ttft_p50, base.ttft_p99, base.gap_p99, base.useful_per_s),
            (Some(1.0), Some(1.0), Some(1.0), Some(1.0))
        );
        let bad = report.ratios_of("all-on-one", "all").expect("ratios");
        // p50: rank 20 of 40 -> ids 19: 100 + 20 * 19 = 480 vs 100 + 19 = 119.
        assert!(bad.ttft_p50.is_some_and(|x| close(x, 480.0 / 119.0)));
        // p99: rank 40 -> id 39: 880 vs 139.
        assert!(bad.ttft_p99.is_some_and(|x| close(x, 880.0 / 139.0)));
        assert_eq!(bad.gap_p99, Some(1.0));
        // Within the SLO (TTFT <= 500 ms): ids 0..=20 -> 21 of 40.
        assert!(bad.useful_per_s.is_some_and(|x| close(x, 21.0 / 40.0)));
        let md = markdown(&report);
        assert!(md.contains("4.03×"), "{md}");
    }

    #[test]
    fn ratios_are_na_without_the_baseline() {
        let mut runs = even_and_skewed();
        runs[0].policy = "round-robin".into();
        let report = summarize(&scope(), None, SLO, &runs);
        assert_eq!(report.baseline, None);
        assert_eq!(report.ratios.len(), 6);
        for r in &report.ratios {
            assert_eq!(
                (r.ttft_p50, r.ttft_p99, r.gap_p99, r.useful_per_s),
                (None, None, None, None)
            );
        }
        assert!(report.noise.is_empty());
        assert!(report
            .comparisons
            .iter()
            .flat_map(|c| &c.metrics)
            .all(|m| m.verdict == Verdict::Unknown && m.ratio.median.is_none()));
        assert!(markdown(&report).contains("none (least-request was not run: every ratio is n/a)"));

        // A baseline with nothing to divide by gives n/a too.
        let mut runs = even_and_skewed();
        runs[0].records.clear();
        let report = summarize(&scope(), None, SLO, &runs);
        let r = report.ratios_of("all-on-one", "all").expect("ratios");
        assert_eq!((r.ttft_p99, r.useful_per_s), (None, None));
    }

    #[test]
    fn markdown_has_every_section() {
        let mut s = scope();
        s.faults = vec!["kill worker 2 at 30 s".into()];
        let report = summarize(&s, Some(0.71), SLO, &even_and_skewed());
        let md = markdown(&report);
        for needle in [
            "# test comparison",
            "synthetic",
            "0000000000abcdef",
            "kill worker 2 at 30 s",
            "71.0%",
            "500 ms",
            "## All requests",
            "## Ratios vs least-request",
            "## Cohort `hot`",
            "## Cohort `tenant:b`",
            "## Balance",
            "## Runs and host health",
            "## Ablation ladder",
            "## Regret against the oracle",
            "## TTFT estimate error",
            "## Load sweep and goodput at SLO",
            "A/A least-request vs least-request",
            "no noise floor (1 run)",
            "## Prediction audit",
            "## Plots",
            "queue_all-on-one.svg",
            "## How to read this",
            "| all-on-one | 4.00 |",
        ] {
            assert!(md.contains(needle), "missing {needle:?} in\n{md}");
        }
        let table = summary_table(&report);
        assert!(table.starts_with("| policy |"));
        assert_eq!(table.lines().count(), 4);
    }

    #[test]
    fn write_produces_every_file() {
        let runs = even_and_skewed();
        let report = summarize(&scope(), Some(0.5), SLO, &runs);
        let dir = temp_dir("write");
        let written = write(&report, &runs, &dir).expect("write");
        let names: Vec<_> = written
            .iter()
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
            .collect();
        assert_eq!(
            names,
            vec![
                "report.md",
                "report.json",
                "ttft_cdf.svg",
                "queue_least-request.svg",
                "queue_all-on-one.svg",
                "cohort_tails.svg",
                "sweep.svg",
                "estimate_error.svg"
            ]
        );
        for p in &written {
            let text = std::fs::read_to_string(p).expect("read back");
            if p.extension().is_some_and(|e| e == "svg") {
                assert!(text.contains("<svg"), "{}", p.display());
                assert!(text.contains("<text"), "{} has no text", p.display());
            }
        }
        let text = |n: &str| std::fs::read_to_string(dir.join(n)).expect("read back");
        assert!(text("ttft_cdf.svg").contains("TTFT (ms, log scale)"));
        assert!(text("ttft_cdf.svg").contains("all-on-one"));
        assert!(text("queue_all-on-one.svg").contains("time (s)"));
        assert!(text("queue_all-on-one.svg").contains("127.0.0.1:9003"));
        assert!(text("cohort_tails.svg").contains("tenant:b"));
        assert!(text("cohort_tails.svg").contains("TTFT p99 (ms)"));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn json_round_trips_into_report() {
        let runs = even_and_skewed();
        let report = summarize(&scope(), None, SLO, &runs);
        let dir = temp_dir("json");
        write(&report, &runs, &dir).expect("write");
        let path = dir.join("report.json");
        let text = std::fs::read_to_string(&path).expect("read back");
        let back: Report = serde_json::from_str(&text).expect("a Report");
        let as_json = |r: &Report| serde_json::to_value(r).expect("json");
        assert!(same_json(&as_json(&back), &as_json(&report)));
        let (setup, back_runs) = read_json(&path).expect("read_json");
        let again = super::summarize(&setup, &back_runs);
        assert!(same_json(&as_json(&again), &as_json(&report)));
        assert_eq!(back_runs.len(), 2);
        assert_eq!(back_runs[1].records.len(), 40);
        assert_eq!(back_runs[1].queue.len(), 40);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn older_report_json_still_reads() {
        // A report.json from before repeats: no faults, reuse, profiles, repeat or health.
        let dir = temp_dir("old");
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("report.json");
        let old = r#"{"scope": {"title": "old — w", "model_profile": "m", "workload": "w",
            "seed": 1, "schedule_hash": 2, "requests": 1, "knowledge": "k", "topology": "t",
            "machine": "x", "faults": [], "block_size": 16},
            "ceiling": 0.5, "slo": {"ttft_ms": 500.0, "mean_gap_ms": 50.0, "stall_ms": 200.0},
            "baseline": null, "cohorts": ["all"], "policies": [], "ratios": [],
            "runs": [{"policy": "least-request", "workers": ["w0"], "duration_s": 1.0,
              "records": [{"id": 0, "at_ms": 0.0, "status": 200, "error": null, "worker": "w0",
                "ttft_ms": 10.0, "gaps_ms": [], "max_gap_ms": 0.0, "stalls": 0, "e2e_ms": 20.0,
                "output_tokens": 1, "prompt_tokens": 10, "cached_tokens": 0,
                "predicted_cached_tokens": null, "within_slo": true,
                "cohorts": ["hot-prefix", "routed-away"]}],
              "queue": []}]}"#;
        std::fs::write(&path, old).expect("write");
        let (setup, runs) = read_json(&path).expect("old json");
        assert_eq!((setup.ceiling, setup.faults.len(), setup.reuse.len()), (Some(0.5), 0, 0));
        assert_eq!(setup.scope.filter_profile, "");
        assert_eq!((runs[0].repeat, runs[0].rate_scale), (0, 1.0));
        let report = super::summarize(&setup, &runs);
        assert_eq!(report.cohorts, ["all", "diverted", "hot-prefix"]);
        assert!(markdown(&report).contains("Filter cost coefficients: not recorded"));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn empty_and_degenerate_runs_do_not_panic() {
        let one_sample = vec![QueueSample { t_ms: 0.0, worker: 0, running: 0, waiting: 0 }];
        let mut zero_ttft = rec(0, "127.0.0.1:9000", 0.0, &["x|y"]);
        zero_ttft.gaps_ms.clear();
        let cases: Vec<Vec<RunResult>> = vec![
            vec![],
            vec![run("least-request", 0, vec![], vec![])],
            vec![run("least-request", 2, vec![], one_sample.clone())],
            vec![
                run("least-request", 2, vec![zero_ttft], one_sample),
                run("random", 1, (0..5).map(|i| rec(i, "elsewhere", 30.0, &[])).collect(), vec![]),
                run("a/b", 1, vec![failed(0)], queue(1, |_, _| 2)),
                run("a_b", 1, vec![], vec![]),
            ],
        ];
        for (i, runs) in cases.iter().enumerate() {
            let report = summarize(&scope(), None, SLO, runs);
            let dir = temp_dir(&format!("empty-{i}"));
            let written = write(&report, runs, &dir).expect("write");
            assert_eq!(written.len(), 6 + report.policy_names().len());
            assert!(!summary_table(&report).is_empty());
            std::fs::remove_dir_all(&dir).expect("clean up");
        }
        let report = summarize(&scope(), None, SLO, &cases[3]);
        let names: Vec<_> = plot_files(&report).into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"queue_a_b.svg".to_owned()));
        assert!(names.contains(&"queue_a_b_2.svg".to_owned()));
        assert!(markdown(&report).contains("x\\|y"));
        let random = report.policy("random").expect("random");
        assert_eq!(random.queue.imbalance, None);
        assert_eq!(
            random.queue.workers.last().map(|w| (w.worker.as_str(), w.served)),
            Some(("elsewhere", 5))
        );
    }
}
