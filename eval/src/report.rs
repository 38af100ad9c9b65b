//! The report of a policy comparison: every policy's run of one schedule summarised per cohort,
//! compared with the `least-request` baseline, and written as Markdown, JSON and SVG plots.
//!
//! Where to start: [`summarize`] turns the runs into a [`Report`]; [`write`] puts `report.md`,
//! `report.json` (the summary plus every per-request record) and the plots into a directory;
//! [`summary_table`] is the Markdown table printed to the console.
//!
//! Definitions (also stated in the Markdown):
//! - TTFT quantiles are exact nearest-rank quantiles (rank `ceil(p * n)`) of the TTFTs of the
//!   cohort's ok requests; the gap p99 is over every inter-token gap of the cohort's requests.
//! - Useful completions per second: requests `within_slo` divided by the run's `duration_s`.
//! - Cache-hit rate: sum of `cached_tokens` over sum of `prompt_tokens`, over ok requests that
//!   report `prompt_tokens` (a missing `cached_tokens` counts as 0).
//! - Prediction audit: [`kvroute_core::audit::classify`] of every ok request that carries a
//!   prediction and reports `prompt_tokens`; other predicted requests are counted `unaudited`.
//! - Queue imbalance: see [`QueueStats::imbalance`].
//!
//! Undefined numbers (a quantile of nothing, a rate over zero, a ratio without a baseline) are
//! `None` in the JSON and `n/a` in the Markdown.

mod markdown;
mod plots;
mod stats;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Context;
use kvroute_core::audit::AuditClass;
use serde::{Deserialize, Serialize};

pub use self::markdown::{markdown, summary_table};
pub use self::stats::nearest_rank;
use crate::record::{RequestRecord, RunResult, Slo};

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
    /// [`ALL`] first, then every cohort tag of any record, sorted.
    pub cohorts: Vec<String>,
    /// One per run, in the order of the runs.
    pub policies: Vec<PolicyReport>,
    /// One per policy and cohort (cohort-major, policies in run order).
    pub ratios: Vec<Ratios>,
}

/// One policy's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyReport {
    pub policy: String,
    pub duration_s: f64,
    /// One per entry of [`Report::cohorts`], in that order (a cohort may have 0 requests).
    pub cohorts: Vec<CohortStats>,
    pub queue: QueueStats,
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
    /// Useful completions (within the SLO) per second of the run.
    pub useful_per_s: Option<f64>,
    /// Cached over prompt tokens, ok requests.
    pub hit_rate: Option<f64>,
    pub audit: AuditCounts,
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
}

/// A policy's figures divided by the baseline's, in one cohort.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ratios {
    pub policy: String,
    pub cohort: String,
    /// Lower is better.
    pub ttft_p50: Option<f64>,
    /// Lower is better.
    pub ttft_p99: Option<f64>,
    /// Lower is better.
    pub gap_p99: Option<f64>,
    /// Higher is better.
    pub useful_per_s: Option<f64>,
}

impl Report {
    /// The summary of `policy`, if it was run.
    pub fn policy(&self, policy: &str) -> Option<&PolicyReport> {
        self.policies.iter().find(|p| p.policy == policy)
    }

    /// The ratios of `policy` in `cohort`.
    pub fn ratios_of(&self, policy: &str, cohort: &str) -> Option<&Ratios> {
        self.ratios.iter().find(|r| r.policy == policy && r.cohort == cohort)
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

/// Summarises one run per policy of the same schedule.
pub fn summarize(scope: &Scope, ceiling: Option<f64>, slo: Slo, runs: &[RunResult]) -> Report {
    let tags: BTreeSet<&str> = runs
        .iter()
        .flat_map(|r| &r.records)
        .flat_map(|r| &r.cohorts)
        .map(String::as_str)
        .filter(|c| *c != ALL)
        .collect();
    let cohorts: Vec<String> = std::iter::once(ALL).chain(tags).map(str::to_owned).collect();

    let policies: Vec<PolicyReport> = runs
        .iter()
        .map(|run| PolicyReport {
            policy: run.policy.clone(),
            duration_s: run.duration_s,
            cohorts: cohorts
                .iter()
                .map(|c| {
                    let members: Vec<&RequestRecord> =
                        run.records.iter().filter(|r| in_cohort(r, c)).collect();
                    stats::cohort_stats(c, &members, run.duration_s, scope.block_size)
                })
                .collect(),
            queue: stats::queue_stats(run),
        })
        .collect();

    let base = policies.iter().find(|p| p.policy == BASELINE);
    let ratios = cohorts
        .iter()
        .flat_map(|c| {
            let b = base.and_then(|b| b.cohort(c));
            policies.iter().filter_map(move |p| {
                let s = p.cohort(c)?;
                let r = |f: fn(&CohortStats) -> Option<f64>| stats::ratio(f(s), b.and_then(f));
                Some(Ratios {
                    policy: p.policy.clone(),
                    cohort: c.clone(),
                    ttft_p50: r(|s| s.ttft_p50_ms),
                    ttft_p99: r(|s| s.ttft_p99_ms),
                    gap_p99: r(|s| s.gap_p99_ms),
                    useful_per_s: r(|s| s.useful_per_s),
                })
            })
        })
        .collect();

    Report {
        scope: scope.clone(),
        ceiling,
        slo,
        baseline: base.map(|b| b.policy.clone()),
        cohorts,
        policies,
        ratios,
    }
}

fn in_cohort(r: &RequestRecord, cohort: &str) -> bool {
    cohort == ALL || r.cohorts.iter().any(|c| c == cohort)
}

/// What one plot file shows.
enum Plot {
    TtftCdf,
    /// Index into [`Report::policies`].
    Queue(usize),
    CohortTails,
}

/// The plots of a report with their file names (file-safe and unique) and captions.
fn plots_of(report: &Report) -> Vec<(String, String, Plot)> {
    let mut files = vec![(
        "ttft_cdf.svg".to_owned(),
        "TTFT CDF, one line per policy (log x)".to_owned(),
        Plot::TtftCdf,
    )];
    let mut used = BTreeSet::new();
    for (i, p) in report.policies.iter().enumerate() {
        let safe: String = p
            .policy
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
            .collect();
        let mut name = format!("queue_{safe}.svg");
        let mut n = 2;
        while !used.insert(name.clone()) {
            name = format!("queue_{safe}_{n}.svg");
            n += 1;
        }
        let caption = format!("{}: queue (running + waiting) per worker over time", p.policy);
        files.push((name, caption, Plot::Queue(i)));
    }
    files.push((
        "cohort_tails.svg".to_owned(),
        "TTFT p99 per cohort, one bar per policy".to_owned(),
        Plot::CohortTails,
    ));
    files
}

/// The plot files of a report, with what each shows: `ttft_cdf.svg`, one `queue_<policy>.svg`
/// per policy (names made file-safe and unique), `cohort_tails.svg`.
pub fn plot_files(report: &Report) -> Vec<(String, String)> {
    plots_of(report).into_iter().map(|(name, caption, _)| (name, caption)).collect()
}

/// Writes `report.md`, `report.json` (the [`Report`]'s fields plus `runs`, every per-request
/// record and queue sample) and the plots of [`plot_files`] into `dir` (created if needed).
/// Returns the paths written. `runs` should be the runs the report was made from; a policy
/// without its run gets an empty queue plot.
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

    for (name, _, plot) in plots_of(report) {
        let svg = match plot {
            Plot::TtftCdf => plots::ttft_cdf(runs),
            Plot::CohortTails => plots::cohort_tails(report),
            Plot::Queue(i) => {
                let policy = report.policies.get(i).map(|p| p.policy.as_str()).unwrap_or_default();
                plots::queue(policy, runs.iter().find(|r| r.policy == policy))
            }
        };
        put(&name, &svg.with_context(|| format!("drawing {name}"))?)?;
    }
    Ok(written)
}

/// Reads back a `report.json` written by [`write`]: the summary and the runs.
pub fn read_json(path: &Path) -> anyhow::Result<(Report, Vec<RunResult>)> {
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        runs: Vec<RunResult>,
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let report: Report = serde_json::from_str(&text).context("report.json: summary")?;
    let file: File = serde_json::from_str(&text).context("report.json: runs")?;
    Ok((report, file.runs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::QueueSample;

    const SLO: Slo = Slo { ttft_ms: 500.0, mean_gap_ms: 50.0, stall_ms: 200.0 };

    fn scope() -> Scope {
        Scope {
            title: "test comparison".into(),
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
        }
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
    fn useful_per_second_is_within_slo_over_duration() {
        let mut records: Vec<_> = (0..30).map(|i| rec(i, "w", 100.0, &[])).collect();
        records.extend((30..40).map(|i| rec(i, "w", 900.0, &[]))); // outside the SLO
        records.push(failed(40));
        let mut r = run("p", 1, records, vec![]);
        r.duration_s = 4.0;
        let report = summarize(&scope(), None, SLO, std::slice::from_ref(&r));
        let all = report.policies[0].all().expect("cohort all");
        assert_eq!(all.within_slo, 30);
        assert_eq!(all.useful_per_s, Some(7.5));

        r.duration_s = 0.0;
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
        assert!(markdown(&report).contains("| all | round-robin | n/a | n/a | n/a | n/a |"));

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
            "## Queue balance",
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
                "cohort_tails.svg"
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
        let (again, back_runs) = read_json(&path).expect("read_json");
        assert!(same_json(&as_json(&again), &as_json(&report)));
        assert_eq!(back_runs.len(), 2);
        assert_eq!(back_runs[1].records.len(), 40);
        assert_eq!(back_runs[1].queue.len(), 40);
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
            assert_eq!(written.len(), 4 + runs.len());
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
