//! The report's "Learned cost coefficients at the end of the run" section: per kvroute run,
//! Envoy and model, what the filter's online calibration had learned (wall-clock ms), next to
//! the filter's prior and the simulator's own coefficients divided by its time speedup.

use std::fmt::Write as _;

use super::markdown::{cell, pct, run_label, table};
use super::Report;
use crate::calibration::{Coefficients, LearnedModel};

/// A coefficient with three significant digits (`4.20e-7` below 0.001); `n/a` when unknown.
pub(super) fn coef(v: Option<f64>) -> String {
    match v {
        None => "n/a".into(),
        Some(v) if !v.is_finite() => "n/a".into(),
        Some(0.0) => "0".into(),
        Some(v) if v.abs() < 1e-3 => format!("{v:.2e}"),
        Some(v) => {
            let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
            format!("{v:.decimals$}")
        }
    }
}

const HEADER: [&str; 10] = [
    "run",
    "Envoy",
    "model",
    "samples",
    "in use",
    "base (ms)",
    "prefill (ms/token)",
    "prefill (ms/token²)",
    "decode interference (ms)",
    "worker deviation (observed / model)",
];

fn reference_row(label: &str, c: &Coefficients) -> Vec<String> {
    let mut row = vec![label.to_owned()];
    row.extend(["", "", "", ""].map(String::from));
    row.extend(
        [c.base_ms, c.prefill_ms_per_token, c.prefill_ms_per_token_sq, c.decode_interference_ms]
            .map(|v| coef(Some(v))),
    );
    row.push(String::new());
    row
}

fn deviations(m: &LearnedModel) -> String {
    if m.deviations.is_empty() {
        return "none yet".into();
    }
    m.deviations
        .iter()
        .map(|(w, d)| format!("`{}` {d:.2}×", cell(w)))
        .collect::<Vec<_>>()
        .join(", ")
}

const STEP_HEADER: [&str; 7] = [
    "run",
    "Envoy",
    "model",
    "stream samples",
    "step base (ms)",
    "per sequence (ms)",
    "per 1 000 context tokens (ms)",
];

/// The decode step learned from streams' gaps, next to the prior (which has no base) and the
/// simulator's (its step floor, per sequence and KV read per 1 000 tokens).
fn steps_table(
    report: &Report,
    runs: &[(&super::PolicyReport, &crate::calibration::RunCalibration)],
    out: &mut String,
) {
    let Some((_, first)) = runs.first() else { return };
    let reference = |label: String, c: &Coefficients, base: Option<f64>| {
        let mut row = vec![label, String::new(), String::new(), String::new()];
        row.extend([base, Some(c.decode_ms_per_seq), Some(c.decode_ms_per_1k_context)].map(coef));
        row
    };
    let mut rows = vec![reference("filter prior".into(), &first.prior, None)];
    if let Some(s) = &first.simulator {
        let label = format!("simulator ÷ {} (wall clock)", first.speedup);
        rows.push(reference(label, s, Some(s.step_base_ms)));
    }
    for (p, cal) in runs {
        for e in &cal.envoys {
            for (model, m) in &e.models {
                // A state without samples holds its units, not a learned step.
                let learned = |v: Option<f64>| coef(v.filter(|_| m.step_samples != Some(0)));
                rows.push(vec![
                    run_label(report, p),
                    e.envoy.to_string(),
                    format!("`{}`", cell(model)),
                    m.step_samples.map_or_else(|| "n/a".into(), |s| s.to_string()),
                    learned(m.step_base_ms),
                    learned(m.decode_ms_per_seq),
                    learned(m.decode_ms_per_1k_context),
                ]);
            }
        }
    }
    out.push_str(
        "\nThe decode step learned from streams' gaps (each streamed answer's median \
         four-step mean gap against the requests in flight on its worker and their prompts; the \
         router prices a new stream's growth of the others' steps with the last two once the \
         model has `min_samples` of them):\n\n",
    );
    out.push_str(&table(&STEP_HEADER, rows));
}

/// Appends the section to `out`.
pub(super) fn section(report: &Report, out: &mut String) {
    out.push_str("## Learned cost coefficients at the end of the run\n\n");
    let runs: Vec<_> =
        report.policies.iter().filter_map(|p| Some((p, p.calibration.as_ref()?))).collect();
    let Some((_, first)) = runs.first() else {
        out.push_str(
            "Not recorded: no kvroute run here, or its Envoys' calibration stats could not be \
             read.\n\n",
        );
        return;
    };
    let speedup = first.speedup;
    let _ = writeln!(
        out,
        "The filter's online calibration (admin `/stats`, `kvroute.calibration.*`) of each \
         Envoy, read when the run ended; \"in use\": the router ranked with the calibrated \
         profile. The filter measures wall-clock time, so its coefficients compare with the \
         simulator's divided by the workers' speedup (×{speedup}): that is the simulator row \
         (its nearest counterparts: step floor, prefill per token and per token², decode per \
         sequence; the simulator also charges attention over cached context and KV reads, \
         which the filter's four coefficients absorb). Every figure in the other tables is \
         in engine time. Filter prior: {}. Simulator: {}.\n",
        super::markdown::recorded(&report.scope.filter_profile),
        super::markdown::recorded(&report.scope.sim_profile),
    );
    let mut rows = vec![reference_row("filter prior", &first.prior)];
    if let Some(s) = &first.simulator {
        rows.push(reference_row(&format!("simulator ÷ {speedup} (wall clock)"), s));
    }
    for (p, cal) in &runs {
        for e in &cal.envoys {
            for (model, m) in &e.models {
                rows.push(vec![
                    run_label(report, p),
                    e.envoy.to_string(),
                    format!("`{}`", cell(model)),
                    m.samples.map_or_else(|| "n/a".into(), |s| s.to_string()),
                    match m.active {
                        Some(true) => "yes".into(),
                        Some(false) => "no".into(),
                        None => "n/a".into(),
                    },
                    coef(m.base_ms),
                    coef(m.prefill_ms_per_token),
                    coef(m.prefill_ms_per_token_sq),
                    coef(m.decode_interference_ms),
                    deviations(m),
                ]);
            }
        }
    }
    out.push_str(&table(&HEADER, rows));
    steps_table(report, &runs, out);
    let within: Vec<String> = runs
        .iter()
        .flat_map(|(p, cal)| cal.envoys.iter().map(move |e| (p, e)))
        .filter_map(|(p, e)| {
            let n = e.estimates.filter(|n| *n > 0)?;
            let good = e.estimates_within_15pct?;
            Some(format!(
                "{} Envoy {}: {} of {n}",
                run_label(report, p),
                e.envoy,
                pct(Some(good as f64 / n as f64))
            ))
        })
        .collect();
    if !within.is_empty() {
        let _ = writeln!(
            out,
            "\nTTFT estimates within 15 % of the observed first byte (the filter's own count, \
             whole run): {}.",
            within.join("; ")
        );
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::calibration::{EnvoyCalibration, RunCalibration};
    use crate::record::{Health, Slo};
    use crate::report::{tests_scope, PolicyReport, PrefillBalance, QueueStats};

    fn policy(name: &str, calibration: Option<RunCalibration>) -> PolicyReport {
        PolicyReport {
            policy: name.into(),
            repeat: 0,
            rate_scale: 1.0,
            health: Health::default(),
            duration_s: 10.0,
            span_s: Some(10.0),
            offered_per_s: Some(10.0),
            cohorts: Vec::new(),
            queue: QueueStats { imbalance: None, instants: 0, workers: Vec::new() },
            prefill: PrefillBalance::default(),
            replicated: 0,
            calibration,
        }
    }

    fn report(policies: Vec<PolicyReport>) -> Report {
        let slo = Slo { ttft_ms: 1000.0, mean_gap_ms: 100.0, stall_ms: 500.0 };
        let mut r =
            crate::report::summarize(&crate::report::Setup::new(tests_scope(), None, slo), &[]);
        r.policies = policies;
        r
    }

    fn calibration() -> RunCalibration {
        let model = LearnedModel {
            base_ms: Some(4.5),
            prefill_ms_per_token: Some(0.109),
            prefill_ms_per_token_sq: Some(4.2e-7),
            decode_interference_ms: None,
            samples: Some(60),
            active: Some(true),
            step_base_ms: Some(5.1),
            decode_ms_per_seq: Some(0.031),
            decode_ms_per_1k_context: Some(0.052),
            step_samples: Some(40),
            deviations: BTreeMap::from([("127.0.0.1:8001".to_string(), 2.6)]),
        };
        RunCalibration {
            speedup: 5.0,
            prior: Coefficients {
                base_ms: 15.0,
                prefill_ms_per_token: 0.099,
                prefill_ms_per_token_sq: 1.26e-6,
                decode_interference_ms: 1.5,
                step_base_ms: 0.0,
                decode_ms_per_seq: 0.09,
                decode_ms_per_1k_context: 0.12,
            },
            simulator: Some(Coefficients {
                base_ms: 1.0,
                prefill_ms_per_token: 0.02,
                prefill_ms_per_token_sq: 0.0,
                decode_interference_ms: 0.1,
                step_base_ms: 4.8,
                decode_ms_per_seq: 0.03,
                decode_ms_per_1k_context: 0.04,
            }),
            envoys: vec![
                EnvoyCalibration {
                    envoy: 0,
                    models: BTreeMap::from([("kvroute_demo".to_string(), model)]),
                    estimates: Some(200),
                    estimates_within_15pct: Some(150),
                },
                EnvoyCalibration { envoy: 1, ..Default::default() },
            ],
        }
    }

    #[test]
    fn coefficients_read_with_three_digits() {
        assert_eq!(coef(Some(4.5)), "4.50");
        assert_eq!(coef(Some(0.109)), "0.109");
        assert_eq!(coef(Some(0.033)), "0.0330");
        assert_eq!(coef(Some(123.4)), "123");
        assert_eq!(coef(Some(4.2e-7)), "4.20e-7");
        assert_eq!(coef(Some(0.0)), "0");
        assert_eq!((coef(None), coef(Some(f64::NAN))), ("n/a".into(), "n/a".into()));
    }

    #[test]
    fn the_table_puts_learned_next_to_prior_and_simulator() {
        let rep =
            report(vec![policy("least-request", None), policy("kvroute", Some(calibration()))]);
        let mut out = String::new();
        section(&rep, &mut out);
        assert!(out.starts_with("## Learned cost coefficients at the end of the run\n"));
        assert!(out.contains("divided by the workers' speedup (×5)"), "{out}");
        assert!(
            out.contains("| filter prior |  |  |  |  | 15.0 | 0.0990 | 1.26e-6 | 1.50 |  |"),
            "{out}"
        );
        assert!(
            out.contains(
                "| simulator ÷ 5 (wall clock) |  |  |  |  | 1.00 | 0.0200 | 0 | 0.100 |  |"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "| kvroute | 0 | `kvroute_demo` | 60 | yes | 4.50 | 0.109 | 4.20e-7 | n/a | `127.0.0.1:8001` 2.60× |"
            ),
            "{out}"
        );
        // The decode step: learned next to the prior (no base) and the simulator.
        assert!(out.contains("| filter prior |  |  |  | n/a | 0.0900 | 0.120 |"), "{out}");
        assert!(out.contains("| simulator ÷ 5 (wall clock) |  |  |  | 4.80 | 0.0300 | 0.0400 |"));
        assert!(out.contains("| kvroute | 0 | `kvroute_demo` | 40 | 5.10 | 0.0310 | 0.0520 |"));
        // Envoy 1 read but without models: no row; no row for least-request.
        assert!(!out.contains("| kvroute | 1 |") && !out.contains("| least-request"), "{out}");
        assert!(out.contains("kvroute Envoy 0: 75.0% of 200"), "{out}");
        // The whole report carries the section.
        assert!(crate::report::markdown(&rep).contains("## Learned cost coefficients"));
    }

    #[test]
    fn reports_without_calibration_say_so() {
        let rep = report(vec![policy("least-request", None)]);
        let mut out = String::new();
        section(&rep, &mut out);
        assert!(out.contains("Not recorded"), "{out}");
        assert!(!out.contains("| run |"));
    }

    #[test]
    fn calibration_survives_report_json_and_rerender() {
        let run = crate::record::RunResult {
            policy: "kvroute".into(),
            workers: vec!["127.0.0.1:8001".into()],
            duration_s: 1.0,
            calibration: Some(calibration()),
            ..Default::default()
        };
        let slo = Slo { ttft_ms: 1000.0, mean_gap_ms: 100.0, stall_ms: 500.0 };
        let setup = crate::report::Setup::new(tests_scope(), None, slo);
        let runs =
            vec![run, crate::record::RunResult { policy: "random".into(), ..Default::default() }];
        let rep = crate::report::summarize(&setup, &runs);
        assert_eq!(rep.policies[0].calibration, Some(calibration()));
        assert_eq!(rep.policies[1].calibration, None);
        let dir = std::env::temp_dir().join(format!("kvroute-eval-learned-{}", std::process::id()));
        crate::report::write(&rep, &runs, &dir).expect("write");
        let (setup, back) = crate::report::read_json(&dir.join("report.json")).expect("read");
        std::fs::remove_dir_all(&dir).expect("clean up");
        assert_eq!(back, runs);
        let again = crate::report::summarize(&setup, &back);
        assert_eq!(again.policies, rep.policies);
        assert!(crate::report::markdown(&again).contains("| kvroute | 0 | `kvroute_demo` | 60 |"));
    }
}
