//! The report's tests: summaries of synthetic runs; the files it writes in `tests/output.rs`.

use std::path::PathBuf;

use super::summarize::reference_rate;
use super::*;
use crate::cluster::TimedFault;
use crate::record::QueueSample;
use crate::record::{RequestRecord, RunResult, Slo};
use crate::repeat::RepeatVerdict;

mod output;

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

fn run(policy: &str, n: usize, records: Vec<RequestRecord>, queue: Vec<QueueSample>) -> RunResult {
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
    let even: Vec<_> = (0..40).map(|i| rec(i, &w[i % 4], 100.0 + i as f64, &cohorts(i))).collect();
    let skewed: Vec<_> =
        (0..40).map(|i| rec(i, &w[0], 100.0 + 20.0 * i as f64, &cohorts(i))).collect();
    vec![
        run("least-request", 4, even, queue(4, |t, _| 1 + (t % 3) as u32)),
        run("all-on-one", 4, skewed, queue(4, |t, w| if w == 0 { 4 * (1 + t as u32) } else { 0 })),
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
        (Array(x), Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y)),
        (Object(x), Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
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
    assert_eq!(p50.verdict, RepeatVerdict::NoDifference);
    assert!(close(p50.ratio.median.unwrap_or(0.0), 123.0 / 122.0));
    assert_eq!(kv.metric(Metric::UsefulPerS).map(|m| m.verdict), Some(RepeatVerdict::NoDifference));

    let fast = report.comparison("fast", ALL).expect("fast");
    assert_eq!((fast.runs, fast.excluded), (3, 1));
    let p50 = fast.metric(Metric::TtftP50).expect("p50");
    assert_eq!(p50.verdict, RepeatVerdict::Better);
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
    assert_eq!(prev.verdict, RepeatVerdict::Better);
    let md = markdown(&report);
    assert!(md.contains("oracle (the limit)"), "{md}");
    assert!(md.contains("no noise floor (1 run)"));
}

#[test]
fn kvroute_is_compared_with_every_peer_that_ran() {
    let runs = vec![
        rep_run("kvroute", 0, 50.0),
        rep_run("least-request", 0, 100.0),
        rep_run("smg-cache-aware", 0, 100.0),
        rep_run("vllm-router-kv-aware", 0, 40.0),
    ];
    let report = summarize(&scope(), None, SLO, &runs);
    let peers: Vec<&str> = report.peers.iter().map(|p| p.peer.as_str()).collect();
    assert_eq!(peers, ["smg-cache-aware", "vllm-router-kv-aware"]);
    let p50 =
        |i: usize| *report.peers[i].metrics.iter().find(|m| m.metric == Metric::TtftP50).unwrap();
    assert!(p50(0).ratio.median.is_some_and(|x| x < 1.0));
    assert_eq!(p50(0).verdict, RepeatVerdict::Better);
    assert_eq!(p50(1).verdict, RepeatVerdict::Worse);
    let md = markdown(&report);
    assert!(md.contains("## kvroute against the peer routers"), "{md}");
    assert!(md.contains("| smg-cache-aware | 1 / 1 |"), "{md}");
    // Without a peer, no section.
    let alone = summarize(&scope(), None, SLO, &runs[..2]);
    assert!(alone.peers.is_empty() && !markdown(&alone).contains("peer routers"));
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
    assert_eq!(d.metric(Metric::UsefulPerS).map(|m| m.verdict), Some(RepeatVerdict::Unknown));
    assert_eq!(d.metric(Metric::SloShare).map(|m| m.verdict), Some(RepeatVerdict::NoDifference));
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
fn the_report_says_how_much_of_the_estimate_error_races_between_envoys_explain() {
    let w = workers(2);
    // Pairs sent at the same instant through both Envoys to one worker, estimated 30 % off;
    // single requests estimated 10 % off.
    let mut records = Vec::new();
    for i in 0..10usize {
        let at = 100.0 * i as f64;
        let mut r = rec(records.len(), &w[0], 100.0, &[]);
        (r.at_ms, r.envoy, r.predicted_ttft_ms) = (at, Some(0), Some(110.0));
        // The filter's own time: 0.5 ms of the 100 ms TTFT.
        r.decision_us = Some(500);
        // The estimate saw nothing queued.
        r.predicted_wait_ms = Some(0.0);
        if i % 2 == 1 {
            r.predicted_ttft_ms = Some(130.0);
            let mut other = r.clone();
            (other.id, other.envoy) = (records.len() + 1, Some(1));
            records.push(other);
        }
        records.push(r);
    }
    let report = summarize(&scope(), None, SLO, &[run("kvroute", 2, records, vec![])]);
    let md = markdown(&report);
    // After warm-up (from 180 ms): pairs at 300, 500, 700, 900; singles at 200, 400, 600, 800.
    let line = "kvroute: raced 30.0% <small>(n=8)</small>, not raced 10.0% <small>(n=4)</small>";
    assert!(md.contains("Raced by another Envoy") && md.contains(line), "{md}");
    assert!(md.contains("median share of the observed TTFT after warm-up: kvroute 0.5%"), "{md}");
    // The same pairs share their instant and worker whichever Envoy they came through.
    let line = "kvroute: shared 30.0% <small>(n=8)</small>, alone 10.0% <small>(n=4)</small>";
    assert!(
        md.contains("yet another request arrived at the same instant") && md.contains(line),
        "{md}"
    );
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

    let one = summarize(&scope(), None, SLO, &[run("p", 1, vec![rec(0, "w", 42.0, &[])], vec![])]);
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
        assert_eq!((r.ttft_p50, r.ttft_p99, r.gap_p99, r.useful_per_s), (None, None, None, None));
    }
    assert!(report.noise.is_empty());
    assert!(report
        .comparisons
        .iter()
        .flat_map(|c| &c.metrics)
        .all(|m| m.verdict == RepeatVerdict::Unknown && m.ratio.median.is_none()));
    assert!(markdown(&report).contains("none (least-request was not run: every ratio is n/a)"));

    // A baseline with nothing to divide by gives n/a too.
    let mut runs = even_and_skewed();
    runs[0].records.clear();
    let report = summarize(&scope(), None, SLO, &runs);
    let r = report.ratios_of("all-on-one", "all").expect("ratios");
    assert_eq!((r.ttft_p99, r.useful_per_s), (None, None));
}
