//! `summary.md`: every workload's report in one page. A scope header, the goals
//! ([`super::goals`]), then the cells where kvroute does not beat least-request, the ratios
//! against least-request per workload and cohort (with the A/A rows), the ablation ladder,
//! regret, goodput at SLO, and the invalid runs.

use std::fmt::Write as _;

use super::markdown::{
    aa_cell, cell, goodput_cell, goodput_ratio_cell, pct, ratio_cell, table, times, NOISE_FLOOR,
};
use super::{Metric, Report, BASELINE};
use crate::repeat::{RepeatVerdict, Spread};

/// The policy whose shortfalls the summary lists.
pub const KVROUTE: &str = "kvroute";

/// Distinct non-empty values of `f` over the reports, joined.
fn distinct(reports: &[Report], f: impl Fn(&Report) -> String) -> String {
    let mut v: Vec<String> = Vec::new();
    for r in reports {
        let s = f(r);
        if !s.is_empty() && !v.contains(&s) {
            v.push(s);
        }
    }
    if v.is_empty() {
        "not recorded".into()
    } else {
        v.join("; ")
    }
}

/// Median hit rate of `policy`'s valid runs in `cohort`.
fn hit_rate(rep: &Report, policy: &str, cohort: &str) -> Option<f64> {
    Spread::of(rep.runs_of(policy).iter().filter_map(|p| p.cohort(cohort)?.hit_rate)).median
}

/// Where kvroute is not better than least-request beyond the noise floor: (workload, cohort,
/// requests / failed, what).
fn shortfalls(reports: &[Report]) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for rep in reports {
        for c in rep.comparisons.iter().filter(|c| c.policy == KVROUTE) {
            let not_better: Vec<String> = c
                .metrics
                .iter()
                .filter(|m| matches!(m.verdict, RepeatVerdict::NoDifference | RepeatVerdict::Worse))
                .map(|m| format!("{} {}", m.metric.label(), ratio_cell(m)))
                .collect();
            if !not_better.is_empty() {
                rows.push(vec![
                    cell(rep.workload_name()),
                    format!("`{}`", cell(&c.cohort)),
                    format!("{} / {}", c.requests, c.failed),
                    not_better.join("; "),
                ]);
            }
        }
        if let Some(g) = rep.sweep.goodput.iter().find(|g| g.policy == KVROUTE) {
            if g.verdict != RepeatVerdict::Better {
                rows.push(vec![
                    cell(rep.workload_name()),
                    "goodput at SLO".into(),
                    "—".into(),
                    format!("{} ({})", goodput_ratio_cell(g), goodput_cell(g)),
                ]);
            }
        }
    }
    rows
}

/// The whole `summary.md` of plan `plan` from its workloads' reports.
pub fn overview(plan: &str, reports: &[Report]) -> String {
    let mut md = format!("# kvroute-bench — plan {plan}\n\n");
    let repeats = reports.iter().map(|r| r.repeats).max().unwrap_or(0);
    let rates = distinct(reports, |r| {
        r.sweep.rates.iter().map(|x| format!("×{x}")).collect::<Vec<_>>().join(", ")
    });
    let excluded: usize = reports.iter().map(|r| r.excluded.len()).sum();
    let runs: usize = reports.iter().map(|r| r.policies.len()).sum();
    for (k, v) in [
        ("Topology", distinct(reports, |r| r.scope.topology.clone())),
        ("Machine", distinct(reports, |r| r.scope.machine.clone())),
        ("Model / profile", distinct(reports, |r| r.scope.model_profile.clone())),
        ("Filter cost coefficients", distinct(reports, |r| r.scope.filter_profile.clone())),
        ("Simulator cost coefficients", distinct(reports, |r| r.scope.sim_profile.clone())),
        (
            "Repeats",
            format!("{repeats} per (workload, load, policy), the order rotated per repeat"),
        ),
        ("Offered load ladder", rates),
        ("Noise floor", NOISE_FLOOR.to_owned()),
        (
            "Valid runs",
            format!("{} of {runs}; invalid runs are left out of every median", runs - excluded),
        ),
    ] {
        let _ = writeln!(md, "- {k}: {v}");
    }
    md.push_str(&super::goals::section(reports));

    let _ = writeln!(md, "\n## Where {KVROUTE} does not beat {BASELINE}\n");
    let ran = reports.iter().any(|r| r.comparisons.iter().any(|c| c.policy == KVROUTE));
    let rows = shortfalls(reports);
    if !ran {
        let _ = writeln!(md, "{KVROUTE} was not compared with {BASELINE} in this plan.\n");
    } else if rows.is_empty() {
        let _ = writeln!(
            md,
            "Nowhere: {KVROUTE} beats {BASELINE} beyond the noise floor on every metric of every \
             cohort, and on goodput at SLO.\n"
        );
    } else {
        let _ = writeln!(
            md,
            "Every cell where {KVROUTE}'s median ratio is not better than {BASELINE}'s beyond \
             the noise floor (\"no difference\" or worse), with the metrics concerned:\n"
        );
        md.push_str(&table(&["workload", "cohort", "requests / failed", "not better on"], rows));
        md.push('\n');
    }

    let _ = writeln!(
        md,
        "## Ratios against {BASELINE}\n\nPer workload and cohort at the reference load: median \
         [min–max] over repeats of the policy's figure over {BASELINE}'s in the same repeat. \
         TTFT and gap: lower is better; useful/s and within SLO: higher is better. The A/A row \
         is {BASELINE} against itself. Hit rate: median of the valid runs (the cohort's ceiling \
         in parentheses, n/a where its members differ by policy). Useful/s is n/a in cohorts whose \
         members differ by policy (`diverted`): compare within SLO there.\n"
    );
    let mut header = vec!["workload", "cohort", "policy", "runs", "requests / failed"];
    header.extend(Metric::ALL.map(|m| m.label()));
    header.push("hit rate (ceiling)");
    let mut rows = Vec::new();
    for rep in reports {
        let w = cell(rep.workload_name());
        for c in &rep.cohorts {
            let ceiling = pct(rep.ceiling_of(c));
            let co = format!("`{}`", cell(c));
            if let Some(n) = rep.noise_of(c) {
                let mut row = vec![
                    w.clone(),
                    co.clone(),
                    format!("A/A {BASELINE}"),
                    n.runs.to_string(),
                    format!("{} / {}", n.requests, n.failed),
                ];
                row.extend(Metric::ALL.map(|m| aa_cell(n, m)));
                row.push(format!("{} ({ceiling})", pct(hit_rate(rep, BASELINE, c))));
                rows.push(row);
            }
            for cmp in rep.comparisons.iter().filter(|x| &x.cohort == c) {
                let mut name = cell(&cmp.policy);
                if cmp.policy == "oracle" {
                    name.push_str(" (the limit)");
                }
                let mut row = vec![
                    w.clone(),
                    co.clone(),
                    name,
                    format!("{} ({} excluded)", cmp.runs, cmp.excluded),
                    format!("{} / {}", cmp.requests, cmp.failed),
                ];
                row.extend(cmp.metrics.iter().map(ratio_cell));
                row.push(format!("{} ({ceiling})", pct(hit_rate(rep, &cmp.policy, c))));
                rows.push(row);
            }
        }
    }
    if rows.is_empty() {
        let _ = writeln!(md, "No ratios: {BASELINE} was not run.\n");
    } else {
        md.push_str(&table(&header, rows));
        md.push('\n');
    }

    md.push_str(
        "## Ablation ladder\n\nCohort `all`, in the ladder's order (least-request → \
         kvroute-load-only → kvroute-history → kvroute → oracle, the rungs that ran); each rung \
         against least-request and against the rung before it, paired by repeat.\n\n",
    );
    for rep in reports.iter().filter(|r| !r.ladder.is_empty()) {
        let _ = writeln!(md, "### {}\n", cell(rep.workload_name()));
        md.push_str(&super::markdown::ladder_table(rep));
        md.push('\n');
    }
    if reports.iter().all(|r| r.ladder.is_empty()) {
        md.push_str("No rung of the ladder ran.\n\n");
    }

    md.push_str(
        "## Regret against the oracle\n\nServed worker's what-if TTFT minus the best worker's, \
         for the sampled requests (engine ms).\n\n",
    );
    let mut any = false;
    for rep in reports.iter().filter(|r| !r.regret.is_empty()) {
        any = true;
        let _ = writeln!(md, "### {}\n", cell(rep.workload_name()));
        md.push_str(&super::markdown::regret_table(rep));
        md.push('\n');
    }
    if !any {
        md.push_str("No request was sampled.\n\n");
    }

    let _ = writeln!(
        md,
        "## Goodput at SLO\n\nThe highest offered rate on the load ladder at which ≥ {:.0}% of \
         requests met the SLO, median [range] over repeats; ratio to {BASELINE} paired by \
         repeat.\n",
        100.0 * crate::sweep::GOODPUT_SLO_SHARE
    );
    let mut rows = Vec::new();
    for rep in reports {
        let sw = &rep.sweep;
        if sw.goodput.iter().any(|g| g.policy == BASELINE) {
            let aa = match sw.goodput_floor {
                None => "no noise floor (1 run)".to_owned(),
                Some(f) => format!("{}, floor ±{}", times(sw.goodput_aa.median), pct(Some(f))),
            };
            rows.push(vec![cell(rep.workload_name()), format!("A/A {BASELINE}"), "—".into(), aa]);
        }
        for g in &sw.goodput {
            rows.push(vec![
                cell(rep.workload_name()),
                cell(&g.policy),
                goodput_cell(g),
                if g.policy == BASELINE { "1 (baseline)".into() } else { goodput_ratio_cell(g) },
            ]);
        }
    }
    md.push_str(&table(&["workload", "policy", "goodput at SLO", "vs least-request"], rows));
    md.push('\n');

    let _ =
        writeln!(md, "## Invalid runs\n\n{excluded} of {runs} runs excluded for host health.\n");
    let rows: Vec<Vec<String>> = reports
        .iter()
        .flat_map(|rep| {
            rep.excluded.iter().map(move |e| {
                vec![
                    cell(rep.workload_name()),
                    cell(&e.policy),
                    (e.repeat + 1).to_string(),
                    format!("×{}", e.rate_scale),
                    cell(&e.reasons.join("; ")),
                ]
            })
        })
        .collect();
    if !rows.is_empty() {
        md.push_str(&table(&["workload", "policy", "repeat", "load", "reasons"], rows));
        md.push('\n');
    }
    md
}
