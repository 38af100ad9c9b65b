//! The rows of the goals table: one builder per goal (see the parent module for
//! the rules each applies).

use super::{
    floor_cell, judge, spread_cell, GoalOutcome, GoalRow, Target, ESTIMATE_ERROR_GOAL, NO_LOSS,
    ORACLE, REUSE,
};
use crate::repeat::{aa_ratios, noise_floor, paired, verdict, RepeatVerdict, Spread};
use crate::report::markdown::{cell, pct};
use crate::report::summary::KVROUTE;
use crate::report::{cohorts, Metric, Report, ALL, BASELINE};

/// Reports whose workload name contains `part`.
fn matching<'a>(reports: &'a [Report], part: &str) -> Vec<&'a Report> {
    reports.iter().filter(|r| r.workload_name().contains(part)).collect()
}

/// Why kvroute has no comparison with least-request in `rep`, if it has none.
fn missing_policy(rep: &Report, policy: &str) -> Option<String> {
    let names = rep.policy_names();
    if !names.contains(&BASELINE) {
        Some(format!("{BASELINE} not run"))
    } else if !names.contains(&policy) {
        Some(format!("{policy} not run"))
    } else {
        None
    }
}

/// A cohort's name as code; `every` and other words as they are.
fn code(cohort: &str) -> String {
    if cohort == "every" {
        cohort.into()
    } else {
        format!("`{}`", cell(cohort))
    }
}

/// A row with nothing measured, and why.
fn unmeasured(
    goal: &'static str,
    workload: String,
    cohort: &str,
    target: String,
    why: String,
) -> GoalRow {
    GoalRow {
        goal,
        workload,
        cohort: code(cohort),
        target,
        measured: "—".into(),
        floor: "—".into(),
        outcome: GoalOutcome::NotMeasured(why),
    }
}

/// A row for a workload that is not in the plan.
fn not_run(goal: &'static str, part: &str, cohort: &str, target: String) -> GoalRow {
    let why = "workload not run in this plan".to_owned();
    unmeasured(goal, format!("none matching \"{part}\""), cohort, target, why)
}

/// kvroute against least-request on `metric` in `cohort` of `rep`.
fn ratio_row(
    goal: &'static str,
    rep: &Report,
    cohort: &str,
    metric: Metric,
    target: Target,
) -> GoalRow {
    let noise = rep.noise_of(cohort);
    let floor = noise.and_then(|n| n.floor(metric));
    let runs = noise.map_or(0, |n| n.runs);
    let mut row = GoalRow {
        goal,
        workload: cell(rep.workload_name()),
        cohort: code(cohort),
        target: target.label(),
        measured: "—".into(),
        floor: floor_cell(floor, runs),
        outcome: GoalOutcome::NotMeasured(String::new()),
    };
    if let Some(why) = missing_policy(rep, KVROUTE) {
        row.outcome = GoalOutcome::NotMeasured(why);
        return row;
    }
    if !rep.cohorts.iter().any(|c| c == cohort) {
        row.outcome = GoalOutcome::NotMeasured(format!("no `{}` cohort", cell(cohort)));
        return row;
    }
    let Some(m) = rep.comparison(KVROUTE, cohort).and_then(|c| c.metric(metric)) else {
        row.outcome = GoalOutcome::NotMeasured(format!("no {KVROUTE} comparison"));
        return row;
    };
    row.measured = spread_cell(&m.ratio);
    row.outcome = judge(target, &m.ratio, floor, m.verdict, runs);
    row
}

/// The no-loss TTFT p99 on every cohort of the fan-out and flash-crowd workloads, and the flash
/// crowd's hot cohort's p50.
fn no_loss(reports: &[Report], out: &mut Vec<GoalRow>) {
    const GOAL: &str = "no loss: TTFT p99";
    for part in NO_LOSS {
        let reps = matching(reports, part);
        if reps.is_empty() {
            out.push(not_run(GOAL, part, "every", Target::NoLoss(1.0).label()));
        }
        for rep in reps {
            for c in &rep.cohorts {
                out.push(ratio_row(GOAL, rep, c, Metric::TtftP99, Target::NoLoss(1.0)));
            }
        }
    }
    const HOT: &str = "hot cohort: TTFT p50";
    let reps = matching(reports, "flash-crowd");
    if reps.is_empty() {
        out.push(not_run(HOT, "flash-crowd", cohorts::HOT, Target::NoLoss(1.0).label()));
    }
    for rep in reps {
        out.push(ratio_row(HOT, rep, cohorts::HOT, Metric::TtftP50, Target::NoLoss(1.0)));
    }
}

/// The multi-turn TTFT goals and Mooncake's wins kept.
fn multi_turn(reports: &[Report], out: &mut Vec<GoalRow>) {
    for (goal, part, metric, target) in [
        ("multi-turn: TTFT p50", "multi-turn", Metric::TtftP50, Target::AtMost(0.3)),
        ("multi-turn: TTFT p99", "multi-turn", Metric::TtftP99, Target::AtMost(0.5)),
        ("wins kept: TTFT p50", "mooncake", Metric::TtftP50, Target::NotWorse),
    ] {
        let reps = matching(reports, part);
        if reps.is_empty() {
            out.push(not_run(goal, part, ALL, target.label()));
        }
        for rep in reps {
            out.push(ratio_row(goal, rep, ALL, metric, target));
        }
    }
}

/// The ladder of a report, for the goodput rows' cohort cell.
fn ladder(rep: &Report) -> String {
    let rates: Vec<String> = rep.sweep.rates.iter().map(|r| format!("×{r}")).collect();
    format!("`{ALL}` (ladder {})", if rates.is_empty() { "none".into() } else { rates.join(", ") })
}

/// On a ladder of one rung where both policies meet the SLO in every repeat, goodput is that
/// rung's rate for both: the ratio 1 says nothing about how far either could go.
fn one_rung_tie(rep: &Report, ratio: &Spread) -> Option<GoalOutcome> {
    let tied = ratio.min == Some(1.0) && ratio.max == Some(1.0);
    (rep.sweep.rates.len() < 2 && tied).then(|| {
        GoalOutcome::NotMeasured(
            "one rung, met by both: goodput is its rate for both (a ladder, --rates, tells them \
             apart)"
                .into(),
        )
    })
}

/// Goodput at SLO ≥ 2× least-request on the workloads with reuse.
fn goodput(reports: &[Report], out: &mut Vec<GoalRow>) {
    const GOAL: &str = "goodput at SLO";
    let target = Target::AtLeast(2.0);
    for part in REUSE {
        let reps = matching(reports, part);
        if reps.is_empty() {
            out.push(not_run(GOAL, part, ALL, target.label()));
        }
        for rep in reps {
            let sw = &rep.sweep;
            let base_runs = sw.goodput.iter().find(|g| g.policy == BASELINE);
            let runs = base_runs.map_or(0, |g| g.per_repeat.len());
            let mut row = GoalRow {
                goal: GOAL,
                workload: cell(rep.workload_name()),
                cohort: ladder(rep),
                target: target.label(),
                measured: "—".into(),
                floor: floor_cell(sw.goodput_floor, runs),
                outcome: GoalOutcome::NotMeasured(String::new()),
            };
            let kv = sw.goodput.iter().find(|g| g.policy == KVROUTE);
            row.outcome = match (missing_policy(rep, KVROUTE), kv) {
                (Some(why), _) => {
                    row.floor = "—".into();
                    GoalOutcome::NotMeasured(why)
                }
                (None, None) => {
                    row.floor = "—".into();
                    GoalOutcome::NotMeasured("no goodput rows (no valid run)".into())
                }
                (None, Some(g)) => {
                    row.measured = spread_cell(&g.ratio);
                    one_rung_tie(rep, &g.ratio).unwrap_or_else(|| {
                        judge(target, &g.ratio, sw.goodput_floor, g.verdict, runs)
                    })
                }
            };
            out.push(row);
        }
    }
}

/// kvroute's estimate error after warm-up on every workload.
fn estimate(reports: &[Report], out: &mut Vec<GoalRow>) {
    const GOAL: &str = "estimate error after warm-up";
    let target = format!("≤ {}", pct(Some(ESTIMATE_ERROR_GOAL)));
    if reports.is_empty() {
        out.push(unmeasured(GOAL, "every".into(), ALL, target.clone(), "no workload ran".into()));
    }
    for rep in reports {
        let e = rep.estimate.iter().find(|e| e.policy == KVROUTE);
        let (measured, outcome) = match (rep.policy_names().contains(&KVROUTE), e) {
            (false, _) => ("—".into(), GoalOutcome::NotMeasured(format!("{KVROUTE} not run"))),
            (true, None) => {
                ("—".into(), GoalOutcome::NotMeasured("no request carried a TTFT estimate".into()))
            }
            (true, Some(e)) => {
                let measured = format!(
                    "{} (n={}; whole run {})",
                    pct(e.after_warmup),
                    e.after_warmup_count,
                    pct(e.median)
                );
                let outcome = match e.after_warmup {
                    None => GoalOutcome::NotMeasured("no estimated request after warm-up".into()),
                    Some(v) if v <= ESTIMATE_ERROR_GOAL => GoalOutcome::Met,
                    Some(v) => GoalOutcome::NotMet(format!(
                        "median {} > {}{}",
                        pct(Some(v)),
                        pct(Some(ESTIMATE_ERROR_GOAL)),
                        where_from(e)
                    )),
                };
                (measured, outcome)
            }
        };
        out.push(GoalRow {
            goal: GOAL,
            workload: cell(rep.workload_name()),
            cohort: code(ALL),
            target: target.clone(),
            measured,
            floor: "— (absolute)".into(),
            outcome,
        });
    }
}

/// kvroute's regret p90 at most half of least-request's, where regret was sampled.
fn regret(reports: &[Report], out: &mut Vec<GoalRow>) {
    const GOAL: &str = "regret p90 vs least-request";
    let target = Target::AtMost(0.5);
    let sampled: Vec<&Report> = reports.iter().filter(|r| !r.regret.is_empty()).collect();
    if sampled.is_empty() {
        let why = "no request was sampled for regret".to_owned();
        out.push(unmeasured(GOAL, "every".into(), ALL, "≤ half (≤ 0.5×)".into(), why));
    }
    for rep in sampled {
        let of = |p: &str| rep.regret.iter().find(|r| r.policy == p);
        let base: Vec<(usize, Option<f64>)> =
            of(BASELINE).map(|r| r.per_repeat_p90_ms.clone()).unwrap_or_default();
        let aa = aa_ratios(&base.iter().map(|(_, v)| *v).collect::<Vec<_>>());
        let floor = noise_floor(&aa);
        let runs = base.iter().filter(|(_, v)| v.is_some()).count();
        let mut row = GoalRow {
            goal: GOAL,
            workload: cell(rep.workload_name()),
            cohort: "sampled requests".into(),
            target: "≤ half (≤ 0.5×)".into(),
            measured: "—".into(),
            floor: floor_cell(floor, runs),
            outcome: GoalOutcome::NotMeasured(String::new()),
        };
        row.outcome = match (of(KVROUTE), of(BASELINE)) {
            (None, _) => GoalOutcome::NotMeasured(format!("{KVROUTE} not sampled")),
            (_, None) => GoalOutcome::NotMeasured(format!("{BASELINE} not sampled")),
            (Some(kv), Some(lr)) => {
                let s = Spread::of(paired(&kv.per_repeat_p90_ms, &base));
                let ms = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.1} ms"));
                row.measured = format!(
                    "{} (pooled p90 {} vs {})",
                    spread_cell(&s),
                    ms(kv.p90_ms),
                    ms(lr.p90_ms)
                );
                if s.n == 0 && !base.is_empty() && base.iter().all(|(_, v)| *v == Some(0.0)) {
                    GoalOutcome::NotMeasured(format!("{BASELINE}'s regret p90 is 0: no ratio"))
                } else {
                    judge(target, &s, floor, verdict(s.median, floor, true), runs)
                }
            }
        };
        out.push(row);
    }
}

/// kvroute's goodput at SLO within 10 % of the oracle's, where both ran.
fn stretch(reports: &[Report], out: &mut Vec<GoalRow>) {
    const GOAL: &str = "stretch: goodput vs oracle";
    let target = Target::Within(0.9);
    let mut any = false;
    for rep in reports {
        let sw = &rep.sweep;
        let of = |p: &str| sw.goodput.iter().find(|g| g.policy == p);
        let (Some(kv), Some(or)) = (of(KVROUTE), of(ORACLE)) else { continue };
        any = true;
        // Below the ladder counts as 0; both below are the same (1); only the oracle below is ∞.
        let zeroed: Vec<_> =
            kv.per_repeat.iter().map(|(r, g)| (*r, Some(g.unwrap_or(0.0)))).collect();
        let mut ratios = paired(&zeroed, &or.per_repeat);
        for (r, g) in &kv.per_repeat {
            if or.per_repeat.iter().any(|(ro, o)| ro == r && o.is_none()) {
                ratios.push(if g.is_some_and(|g| g > 0.0) { f64::INFINITY } else { 1.0 });
            }
        }
        let s = Spread::of(ratios);
        let runs = of(BASELINE).map_or(0, |g| g.per_repeat.len());
        out.push(GoalRow {
            goal: GOAL,
            workload: cell(rep.workload_name()),
            cohort: ladder(rep),
            target: target.label(),
            measured: format!("{} of the oracle's", spread_cell(&s)),
            floor: floor_cell(sw.goodput_floor, runs),
            outcome: one_rung_tie(rep, &s).unwrap_or_else(|| {
                judge(target, &s, sw.goodput_floor, RepeatVerdict::Unknown, runs)
            }),
        });
    }
    if !any {
        let why = format!("{KVROUTE} and the {ORACLE} did not both have goodput rows anywhere");
        out.push(unmeasured(GOAL, "every".into(), ALL, target.label(), why));
    }
}

/// Every goal row, in the order the goals are stated.
pub fn rows(reports: &[Report]) -> Vec<GoalRow> {
    let mut out = Vec::new();
    no_loss(reports, &mut out);
    multi_turn(reports, &mut out);
    goodput(reports, &mut out);
    estimate(reports, &mut out);
    regret(reports, &mut out);
    stretch(reports, &mut out);
    out
}

/// Where a missed estimate-error goal's error comes from: the error over the requests whose
/// worker had nothing queued by the estimate, and over those behind a queue (empty when no
/// request said, e.g. an older filter).
fn where_from(e: &crate::report::regret::EstimateError) -> String {
    let (idle, queued) = (&e.after_warmup_idle, &e.after_warmup_queued);
    if idle.count + queued.count == 0 {
        return String::new();
    }
    let part = |s: &crate::report::regret::WaitSplit| format!("{} (n={})", pct(s.median), s.count);
    let mut out = format!("; nothing queued {}, behind a queue {}", part(idle), part(queued));
    let (raced, unraced) = (&e.after_warmup_raced, &e.after_warmup_unraced);
    if raced.count > 0 {
        out += &format!("; raced by another Envoy {}, not raced {}", part(raced), part(unraced));
    }
    let (shared, alone) = (&e.after_warmup_idle_shared, &e.after_warmup_idle_alone);
    if shared.count > 0 {
        out += &format!(
            "; nothing queued but another request of the same instant on its worker {}, \
             alone at its instant {}",
            part(shared),
            part(alone)
        );
    }
    out
}
