//! [`summarize`]: every run of one schedule summarised per run and cohort, then across repeats
//! (ratios, the A/A noise floor, the ladder, regret, the load sweep).

use std::collections::BTreeSet;

use super::types::{
    CohortStats, Comparison, ExcludedRun, LadderStep, Metric, MetricNoise, MetricRatio, NoiseRow,
    PolicyReport, Ratios, Report, Setup,
};
use super::{ceiling, cohorts, regret, stats, ALL, BASELINE};
use crate::cluster::Policy;
use crate::record::{RequestRecord, RunResult};
use crate::repeat::{aa_ratios, noise_floor, paired, verdict, RepeatVerdict, Spread};
use crate::sweep::{RunPoint, Sweep};

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
pub(super) fn reference_rate(runs: &[RunResult]) -> f64 {
    runs.iter()
        .map(rate_of)
        .min_by(|a, b| (a - 1.0).abs().total_cmp(&(b - 1.0).abs()).then(a.total_cmp(b)))
        .unwrap_or(1.0)
}

/// First to last scheduled arrival of a run, seconds; `None` under two distinct arrivals.
pub(super) fn span_s(run: &RunResult) -> Option<f64> {
    let at = || run.records.iter().map(|r| r.at_ms).filter(|a| a.is_finite());
    let (lo, hi) = (at().reduce(f64::min)?, at().reduce(f64::max)?);
    (hi > lo).then(|| (hi - lo) / 1000.0)
}

/// One metric's ratios of `mine` over `base`, paired by repeat, with the verdict.
pub(super) fn metric_ratio(
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
        peers: Vec::new(),
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
                                verdict: RepeatVerdict::Unknown,
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
    report.peers = super::peers::compare(&report);

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
