//! The files a report writes and reads back.

use super::*;

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
    let again = crate::report::summarize(&setup, &back_runs);
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
    let report = crate::report::summarize(&setup, &runs);
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
