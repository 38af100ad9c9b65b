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
//! - Prediction audit: [`kvroute_core::decision::audit::classify`] of every ok request that carries a
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
mod output;
pub mod peers;
pub(crate) mod plots;
pub mod regret;
mod stats;
mod summarize;
pub mod summary;
#[cfg(test)]
mod tests;
mod types;

pub use self::markdown::{markdown, summary_table};
pub use self::output::{plot_files, read_json, write};
pub use self::regret::{EstimateError, RegretStats};
pub use self::stats::nearest_rank;
pub use self::summarize::{rate_of, summarize};
pub use self::types::{
    AuditCounts, CohortStats, Comparison, ExcludedRun, LadderStep, Metric, MetricNoise,
    MetricRatio, NoiseRow, PolicyReport, PrefillBalance, QueueStats, Ratios, Report, Scope, Setup,
    WorkerStats,
};

/// The policy every ratio is relative to, when it was run.
pub const BASELINE: &str = "least-request";
/// The cohort of every request.
pub const ALL: &str = "all";

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
