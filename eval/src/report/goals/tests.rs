use super::*;
use crate::record::{Health, Slo};
use crate::repeat::verdict;
use crate::report::regret::{EstimateError, RegretStats, WaitSplit};
use crate::report::{
    Comparison, Metric, MetricNoise, MetricRatio, NoiseRow, PolicyReport, PrefillBalance,
    QueueStats, Scope, ALL,
};
use crate::sweep::{sweep, RunPoint};

/// A hand-made report of `workload`: `repeats` valid runs of every policy at load ×1, every
/// cohort's noise floor `floor` (none with one repeat), every comparison unknown until set.
fn report(workload: &str, cohorts: &[&str], policies: &[&str], repeats: usize) -> Report {
    let scope = Scope {
        title: format!("test — {workload}"),
        model_profile: "m".into(),
        workload: workload.into(),
        seed: 1,
        schedule_hash: 2,
        requests: 100,
        knowledge: "k".into(),
        topology: "t".into(),
        machine: "x".into(),
        faults: Vec::new(),
        block_size: 16,
        filter_profile: String::new(),
        sim_profile: String::new(),
    };
    let cohorts: Vec<String> =
        std::iter::once(ALL).chain(cohorts.iter().copied()).map(str::to_owned).collect();
    let mut policy_runs = Vec::new();
    for r in 0..repeats {
        for p in policies {
            policy_runs.push(PolicyReport {
                policy: (*p).into(),
                repeat: r,
                rate_scale: 1.0,
                health: Health::default(),
                duration_s: 10.0,
                span_s: Some(10.0),
                offered_per_s: Some(10.0),
                cohorts: Vec::new(),
                queue: QueueStats { imbalance: None, instants: 0, workers: Vec::new() },
                prefill: PrefillBalance::default(),
                replicated: 0,
                calibration: None,
            });
        }
    }
    let has_base = policies.contains(&BASELINE);
    let floor = (repeats > 1).then_some(0.1);
    let noise = if has_base {
        cohorts
            .iter()
            .map(|c| NoiseRow {
                cohort: c.clone(),
                runs: repeats,
                requests: 10 * repeats,
                failed: 0,
                metrics: Metric::ALL
                    .map(|m| MetricNoise { metric: m, aa: Spread::default(), floor })
                    .to_vec(),
            })
            .collect()
    } else {
        Vec::new()
    };
    let comparisons = cohorts
        .iter()
        .flat_map(|c| {
            policies.iter().filter(|p| **p != BASELINE).map(move |p| Comparison {
                policy: (*p).into(),
                cohort: c.clone(),
                runs: repeats,
                excluded: 0,
                requests: 10 * repeats,
                failed: 0,
                metrics: Metric::ALL
                    .map(|m| MetricRatio {
                        metric: m,
                        ratio: Spread::default(),
                        verdict: RepeatVerdict::Unknown,
                    })
                    .to_vec(),
            })
        })
        .collect();
    Report {
        scope,
        ceiling: None,
        slo: Slo { ttft_ms: 500.0, mean_gap_ms: 50.0, stall_ms: 200.0 },
        baseline: has_base.then(|| BASELINE.into()),
        cohorts,
        policies: policy_runs,
        ratios: Vec::new(),
        faults: Vec::new(),
        reuse: Vec::new(),
        reference_rate: 1.0,
        repeats,
        cohort_ceilings: Vec::new(),
        varying_cohorts: Vec::new(),
        comparisons,
        noise,
        ladder: Vec::new(),
        peers: Vec::new(),
        regret: Vec::new(),
        estimate: Vec::new(),
        sweep: Default::default(),
        excluded: Vec::new(),
    }
}

/// Sets kvroute's ratios (one per repeat) of `metric` in `cohort`, judged against the floor.
fn set(rep: &mut Report, cohort: &str, metric: Metric, ratios: &[f64]) {
    let floor = rep.noise_of(cohort).and_then(|n| n.floor(metric));
    let c = rep
        .comparisons
        .iter_mut()
        .find(|c| c.policy == KVROUTE && c.cohort == cohort)
        .expect("a kvroute comparison");
    let m = c.metrics.iter_mut().find(|m| m.metric == metric).expect("metric");
    m.ratio = Spread::of(ratios.iter().copied());
    m.verdict = verdict(m.ratio.median, floor, metric.lower_is_better());
}

/// Goodput per repeat of every policy (one rung, ×1; `None` = below the ladder), through the
/// sweep itself.
fn set_goodput(rep: &mut Report, per_policy: &[(&str, &[Option<f64>])]) {
    let mut points = Vec::new();
    for (policy, values) in per_policy {
        for (r, g) in values.iter().enumerate() {
            points.push(RunPoint {
                policy: (*policy).into(),
                repeat: r,
                rate_scale: 1.0,
                offered_per_s: Some(g.unwrap_or(10.0)),
                requests: 100,
                within_slo: if g.is_some() { 100 } else { 10 },
                ..Default::default()
            });
        }
    }
    rep.sweep = sweep(&points, BASELINE);
}

fn find<'a>(rows: &'a [GoalRow], goal: &str, workload: &str, cohort: &str) -> &'a GoalRow {
    rows.iter()
        .find(|r| r.goal == goal && r.workload == workload && r.cohort.contains(cohort))
        .unwrap_or_else(|| panic!("no row {goal} / {workload} / {cohort} in {rows:#?}"))
}

fn not_measured(o: &GoalOutcome, why: &str) -> bool {
    matches!(o, GoalOutcome::NotMeasured(w) if w.contains(why))
}

fn not_met(o: &GoalOutcome, why: &str) -> bool {
    matches!(o, GoalOutcome::NotMet(w) if w.contains(why))
}

#[test]
fn judge_applies_each_kind_of_target() {
    let s = |v: &[f64]| Spread::of(v.iter().copied());
    let floor = Some(0.1);
    let j = |t, v: &[f64], lower| {
        let sp = s(v);
        judge(t, &sp, floor, verdict(sp.median, floor, lower), 3)
    };
    // No loss: within the target, even inside the noise band; above it, not met.
    assert_eq!(j(Target::NoLoss(1.0), &[0.95, 0.97, 1.0], true), GoalOutcome::Met);
    assert_eq!(j(Target::NoLoss(1.0), &[0.5, 0.6, 0.7], true), GoalOutcome::Met);
    // Above the target but inside the noise floor: no loss this instrument can see.
    assert_eq!(j(Target::NoLoss(1.0), &[1.02, 1.03, 1.0], true), GoalOutcome::MetWithinNoise);
    assert!(not_met(&j(Target::NoLoss(1.0), &[1.9, 1.8, 2.0], true), "1.90× > 1.0×"));
    // Improvement: within the target and beyond the floor.
    assert_eq!(j(Target::AtMost(0.3), &[0.2, 0.25, 0.28], true), GoalOutcome::Met);
    assert!(not_met(&j(Target::AtMost(0.3), &[0.4, 0.35, 0.45], true), "0.40× > 0.3×"));
    let wide = Some(3.0); // A/A band 0.25×..4×: 0.28× is inside it.
    let sp = s(&[0.28]);
    let o = judge(Target::AtMost(0.3), &sp, wide, verdict(sp.median, wide, true), 3);
    assert!(not_met(&o, "not better beyond it"), "{o:?}");
    assert_eq!(j(Target::AtLeast(2.0), &[2.5, 2.0, 3.0], false), GoalOutcome::Met);
    assert!(not_met(&j(Target::AtLeast(2.0), &[1.5, 1.4, 1.6], false), "1.50× < 2.0×"));
    // Wins kept: anything but worse.
    assert_eq!(j(Target::NotWorse, &[1.05], true), GoalOutcome::Met);
    assert_eq!(j(Target::NotWorse, &[0.5], true), GoalOutcome::Met);
    assert!(not_met(&j(Target::NotWorse, &[1.3], true), "worse beyond"));
    // Within 10 % (of the oracle): the median alone.
    assert_eq!(
        judge(Target::Within(0.9), &s(&[0.92]), floor, RepeatVerdict::Unknown, 3),
        GoalOutcome::Met
    );
    assert!(not_met(
        &judge(Target::Within(0.9), &s(&[0.8]), floor, RepeatVerdict::Unknown, 3),
        "<"
    ));
    // Not measured: no ratio, or no floor (one run).
    let none = judge(Target::NoLoss(1.0), &Spread::default(), floor, RepeatVerdict::Unknown, 3);
    assert!(not_measured(&none, "no ratio"));
    let one = judge(Target::AtMost(0.3), &s(&[0.1]), None, RepeatVerdict::Better, 1);
    assert!(not_measured(&one, "too few runs (1 valid least-request run(s): no noise floor)"));
    // Least-request below the ladder in every repeat, the policy above it: met without a floor.
    let inf = s(&[f64::INFINITY, f64::INFINITY, f64::INFINITY]);
    assert_eq!(
        judge(Target::AtLeast(2.0), &inf, None, RepeatVerdict::Unknown, 3),
        GoalOutcome::Met
    );
    let once = s(&[f64::INFINITY]);
    assert!(not_measured(
        &judge(Target::AtLeast(2.0), &once, None, RepeatVerdict::Unknown, 1),
        "too few"
    ));
    let mixed = s(&[f64::INFINITY, 1.0, f64::INFINITY]);
    assert!(not_measured(
        &judge(Target::AtLeast(2.0), &mixed, None, RepeatVerdict::Unknown, 3),
        "too few"
    ));
}

/// A plan with every goal's workload but Mooncake, three repeats, floors of 10 %.
fn plan() -> Vec<Report> {
    let all = [KVROUTE, BASELINE, ORACLE];
    let mut flash = report("flash-crowd", &["background", "diverted", "hot-prefix"], &all, 3);
    set(&mut flash, ALL, Metric::TtftP99, &[0.9, 0.95, 0.97]); // met
    set(&mut flash, "background", Metric::TtftP99, &[1.02, 1.05, 0.99]); // in the band, > 1
    set(&mut flash, "diverted", Metric::TtftP99, &[0.5, 0.6, 0.4]); // met
    set(&mut flash, "hot-prefix", Metric::TtftP99, &[1.4, 1.5, 1.45]); // worse
    set(&mut flash, "hot-prefix", Metric::TtftP50, &[0.8, 0.85, 0.9]); // met
    for (i, p) in flash.policies.iter_mut().filter(|p| p.policy == KVROUTE).enumerate() {
        p.replicated = [3, 2, 4][i];
    }
    set_goodput(
        &mut flash,
        &[
            (BASELINE, &[Some(10.0), Some(10.0), Some(10.0)]),
            (KVROUTE, &[Some(10.0), Some(10.0), Some(10.0)]),
            (ORACLE, &[Some(10.0), Some(10.0), Some(10.0)]),
        ],
    );
    let mut fan = report("agentic-fan-out", &["fanout-sub"], &[KVROUTE, BASELINE], 3);
    set(&mut fan, ALL, Metric::TtftP99, &[0.8, 0.7, 0.9]);
    set(&mut fan, "fanout-sub", Metric::TtftP99, &[0.99, 1.0, 0.98]);
    let mut mt = report("multi-turn", &["turn-1"], &all, 3);
    set(&mut mt, ALL, Metric::TtftP50, &[0.2, 0.25, 0.1]); // met
    set(&mut mt, ALL, Metric::TtftP99, &[0.6, 0.55, 0.7]); // not met
    set_goodput(
        &mut mt,
        &[
            (BASELINE, &[Some(10.0), Some(10.0), Some(11.0)]),
            (KVROUTE, &[Some(40.0), Some(30.0), Some(44.0)]),
            (ORACLE, &[Some(40.0), None, Some(40.0)]),
        ],
    );
    mt.estimate.push(EstimateError {
        policy: KVROUTE.into(),
        median: Some(0.3),
        after_warmup: Some(0.12),
        after_warmup_count: 80,
        ..Default::default()
    });
    flash.estimate.push(EstimateError {
        policy: KVROUTE.into(),
        median: Some(0.3),
        after_warmup: Some(0.2),
        after_warmup_count: 80,
        after_warmup_idle: WaitSplit { median: Some(0.08), count: 50 },
        after_warmup_queued: WaitSplit { median: Some(0.4), count: 30 },
        after_warmup_raced: WaitSplit { median: Some(0.5), count: 20 },
        after_warmup_unraced: WaitSplit { median: Some(0.1), count: 60 },
        after_warmup_idle_shared: WaitSplit { median: Some(0.3), count: 10 },
        after_warmup_idle_alone: WaitSplit { median: Some(0.05), count: 40 },
        ..Default::default()
    });
    let regret = |policy: &str, p90: &[f64]| RegretStats {
        policy: policy.into(),
        p90_ms: Some(p90[0]),
        per_repeat_p90_ms: p90.iter().enumerate().map(|(r, v)| (r, Some(*v))).collect(),
        ..Default::default()
    };
    mt.regret =
        vec![regret(BASELINE, &[100.0, 110.0, 105.0]), regret(KVROUTE, &[20.0, 30.0, 25.0])];
    vec![mt, flash, fan]
}

#[test]
fn rows_cover_every_goal_with_met_not_met_and_not_measured() {
    let rows = rows(&plan());
    let p99 = "no loss: TTFT p99";
    assert_eq!(find(&rows, p99, "flash-crowd", "`all`").outcome, GoalOutcome::Met);
    assert_eq!(find(&rows, p99, "flash-crowd", "`all`").measured, "0.95× [0.90×–0.97×]");
    assert_eq!(find(&rows, p99, "flash-crowd", "`all`").floor, "±10.0%");
    let background = find(&rows, p99, "flash-crowd", "`background`");
    assert_eq!(background.outcome, GoalOutcome::MetWithinNoise);
    assert_eq!(find(&rows, p99, "flash-crowd", "`diverted`").outcome, GoalOutcome::Met);
    assert!(not_met(&find(&rows, p99, "flash-crowd", "`hot-prefix`").outcome, "1.45×"));
    // One row per cohort of each no-loss workload.
    assert_eq!(rows.iter().filter(|r| r.goal == p99).count(), 4 + 2);
    assert_eq!(find(&rows, p99, "agentic-fan-out", "fanout-sub").outcome, GoalOutcome::Met);
    let hot = find(&rows, "hot cohort: TTFT p50", "flash-crowd", "hot-prefix");
    assert_eq!(hot.outcome, GoalOutcome::Met);

    assert_eq!(find(&rows, "multi-turn: TTFT p50", "multi-turn", ALL).outcome, GoalOutcome::Met);
    let p99 = find(&rows, "multi-turn: TTFT p99", "multi-turn", ALL);
    assert!(not_met(&p99.outcome, "0.60× > 0.5×"), "{p99:?}");
    let moon = find(&rows, "wins kept: TTFT p50", "none matching \"mooncake\"", ALL);
    assert!(not_measured(&moon.outcome, "workload not run"));

    // Goodput: 4× on multi-turn (met); 1× on the flash crowd's one rung, met by both, says
    // nothing; the fan-out without a sweep.
    let g = find(&rows, "goodput at SLO", "multi-turn", "ladder ×1");
    assert_eq!((g.measured.as_str(), &g.outcome), ("4.00× [3.00×–4.00×]", &GoalOutcome::Met));
    let g = find(&rows, "goodput at SLO", "flash-crowd", ALL);
    assert!(not_measured(&g.outcome, "one rung, met by both"), "{g:?}");
    let g = find(&rows, "goodput at SLO", "agentic-fan-out", ALL);
    assert!(not_measured(&g.outcome, "no goodput rows"), "{g:?}");
    let g = find(&rows, "goodput at SLO", "none matching \"mooncake\"", ALL);
    assert!(not_measured(&g.outcome, "workload not run"));

    let e = "estimate error after warm-up";
    assert_eq!(find(&rows, e, "multi-turn", ALL).outcome, GoalOutcome::Met);
    assert_eq!(find(&rows, e, "multi-turn", ALL).measured, "12.0% (n=80; whole run 30.0%)");
    assert!(not_met(&find(&rows, e, "flash-crowd", ALL).outcome, "20.0% > 15.0%"));
    // A miss says where its error comes from, when the requests said what they waited behind.
    let why = "nothing queued 8.0% (n=50), behind a queue 40.0% (n=30)";
    assert!(not_met(&find(&rows, e, "flash-crowd", ALL).outcome, why));
    // And how much of it the races between Envoys explain, when there were several.
    let why = "raced by another Envoy 50.0% (n=20), not raced 10.0% (n=60)";
    assert!(not_met(&find(&rows, e, "flash-crowd", ALL).outcome, why));
    // And the requests with nothing queued that shared their instant and worker.
    let why = "nothing queued but another request of the same instant on its worker 30.0% \
               (n=10), alone at its instant 5.0% (n=40)";
    assert!(not_met(&find(&rows, e, "flash-crowd", ALL).outcome, why));
    let fan = find(&rows, e, "agentic-fan-out", ALL);
    assert!(not_measured(&fan.outcome, "no request carried"), "{fan:?}");

    // Regret: 0.20, 0.27, 0.24 of least-request's p90, beyond a 10 % floor.
    let r = find(&rows, "regret p90 vs least-request", "multi-turn", "sampled");
    assert_eq!(r.outcome, GoalOutcome::Met, "{r:?}");
    assert!(r.measured.starts_with("0.24× [0.20×–0.27×]"), "{}", r.measured);
    assert_eq!(r.floor, "±10.0%");
    assert_eq!(rows.iter().filter(|r| r.goal == "regret p90 vs least-request").count(), 1);

    // Stretch: against the oracle, its missing repeat counts as ∞.
    let s = find(&rows, "stretch: goodput vs oracle", "multi-turn", ALL);
    assert_eq!(s.outcome, GoalOutcome::Met, "{s:?}");
    assert!(s.measured.starts_with("1.10× [1.00×–∞×]"), "{}", s.measured);
    let s = find(&rows, "stretch: goodput vs oracle", "flash-crowd", ALL);
    assert!(not_measured(&s.outcome, "one rung, met by both"), "{s:?}");
}

#[test]
fn missing_policies_and_single_runs_are_not_measured() {
    // One repeat: no floor, so nothing can be judged against least-request.
    let mut one = report("multi-turn", &[], &[KVROUTE, BASELINE], 1);
    set(&mut one, ALL, Metric::TtftP50, &[0.1]);
    let rows = rows(&[one]);
    let p50 = find(&rows, "multi-turn: TTFT p50", "multi-turn", ALL);
    assert!(not_measured(&p50.outcome, "too few runs"), "{p50:?}");
    assert_eq!(p50.floor, "none (1 valid least-request run(s))");
    assert!(not_measured(
        &find(&rows, "regret p90 vs least-request", "every", ALL).outcome,
        "no request was sampled"
    ));
    assert!(not_measured(
        &find(&rows, "stretch: goodput vs oracle", "every", ALL).outcome,
        "did not both have goodput rows"
    ));
    let fan = find(&rows, "no loss: TTFT p99", "none matching \"fan-out\"", "every");
    assert!(not_measured(&fan.outcome, "workload not run"));

    // kvroute or least-request not run.
    let rows = super::rows(&[report("flash-crowd", &["hot-prefix"], &[BASELINE], 3)]);
    let hot = find(&rows, "hot cohort: TTFT p50", "flash-crowd", "hot-prefix");
    assert!(not_measured(&hot.outcome, "kvroute not run"), "{hot:?}");
    let e = find(&rows, "estimate error after warm-up", "flash-crowd", ALL);
    assert!(not_measured(&e.outcome, "kvroute not run"));
    let rows = super::rows(&[report("flash-crowd", &[], &[KVROUTE], 3)]);
    let p99 = find(&rows, "no loss: TTFT p99", "flash-crowd", ALL);
    assert!(not_measured(&p99.outcome, "least-request not run"));
    let rows = super::rows(&[report("flash-crowd", &[], &[KVROUTE, BASELINE], 3)]);
    let hot = find(&rows, "hot cohort: TTFT p50", "flash-crowd", "hot-prefix");
    assert!(not_measured(&hot.outcome, "no `hot-prefix` cohort"));

    // Least-request's regret p90 of 0 ms: nothing to halve.
    let mut zero = report("multi-turn", &[], &[KVROUTE, BASELINE], 2);
    zero.regret = vec![
        RegretStats {
            policy: BASELINE.into(),
            per_repeat_p90_ms: vec![(0, Some(0.0)), (1, Some(0.0))],
            ..Default::default()
        },
        RegretStats {
            policy: KVROUTE.into(),
            per_repeat_p90_ms: vec![(0, Some(3.0)), (1, Some(0.0))],
            ..Default::default()
        },
    ];
    let rows = super::rows(&[zero]);
    let r = find(&rows, "regret p90 vs least-request", "multi-turn", "sampled");
    assert!(not_measured(&r.outcome, "regret p90 is 0"), "{r:?}");
    assert!(!rows.is_empty() && super::rows(&[]).iter().all(|r| r.outcome != GoalOutcome::Met));
}

#[test]
fn section_renders_the_table_counts_and_replications() {
    let md = section(&plan());
    assert!(md.starts_with("\n## Goals\n\n"), "{md}");
    assert!(md.contains("| goal | workload | cohort | target | measured | noise floor | verdict |"));
    let rows = rows(&plan());
    let count = |f: fn(&GoalOutcome) -> bool| rows.iter().filter(|r| f(&r.outcome)).count();
    let met = count(|o| *o == GoalOutcome::Met);
    let in_noise = count(|o| *o == GoalOutcome::MetWithinNoise);
    assert_eq!(in_noise, 1);
    let head = format!("{} met ({in_noise} of them only within the noise floor), ", met + in_noise);
    assert!(md.contains(&head), "{md}");
    assert_eq!(md.matches("| met |").count(), met);
    assert!(md.contains(
        "| met: no loss beyond the noise floor (median above the target, inside the floor) |"
    ));
    assert!(md.contains("**not met**: median 1.45× > 1.0× (worse beyond the noise floor)"));
    assert!(md.contains("not measured: workload not run in this plan"));
    // Replications: kvroute's runs of the flash crowd replicated 2, 3 and 4 requests.
    assert!(md.contains("- flash-crowd: kvroute 3 [2–4] (3 run(s))"), "{md}");
    assert!(md.contains("- agentic-fan-out: kvroute 0 [0–0] (3 run(s))"), "{md}");
    assert!(!md.contains("- multi-turn:"));

    // In summary.md, between the scope header and the shortfalls.
    let summary = crate::report::summary::overview("p", &plan());
    let goals = summary.find("## Goals\n").expect("goals");
    assert!(summary[..goals].contains("- Noise floor:"));
    assert!(goals < summary.find("## Where kvroute does not beat").expect("shortfalls"));
}
