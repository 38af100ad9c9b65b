//! The Markdown rendering of a [`Report`]: scope header, main table, ratios, per-cohort tables,
//! queue balance, prediction audit, plot list and a short guide to reading it.

use std::fmt::Write as _;

use super::{plot_files, CohortStats, PolicyReport, Report, ALL, BASELINE};

/// Milliseconds: one decimal below 100 ms, none above.
fn ms(v: Option<f64>) -> String {
    match v {
        Some(v) if v.abs() < 100.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.0}"),
        None => "n/a".into(),
    }
}

/// A fraction as a percentage.
fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{:.1}%", 100.0 * v))
}

/// A ratio as a factor.
fn times(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.2}×"))
}

fn two(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.2}"))
}

/// Text made safe for a table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A Markdown table from a header and rows.
fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut out = format!("| {} |\n|{}\n", header.join(" | "), "---|".repeat(header.len()));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

/// The per-policy table of one cohort; the imbalance column only for cohort `all`.
fn cohort_table(report: &Report, cohort: &str) -> String {
    let mut header = vec![
        "policy",
        "requests",
        "ok",
        "TTFT p50 (ms) ↓",
        "TTFT p90 (ms) ↓",
        "TTFT p99 (ms) ↓",
        "gap p99 (ms) ↓",
        "stalls ↓",
        "useful/s ↑",
        "within SLO ↑",
        "cache hit ↑",
    ];
    let with_imbalance = cohort == ALL;
    if with_imbalance {
        header.push("imbalance ↓");
    }
    let rows = report.policies.iter().filter_map(|p| {
        let c = p.cohort(cohort)?;
        let within = super::stats::rate(c.within_slo as f64, c.requests as f64);
        let mut row = vec![
            cell(&p.policy),
            c.requests.to_string(),
            c.ok.to_string(),
            ms(c.ttft_p50_ms),
            ms(c.ttft_p90_ms),
            ms(c.ttft_p99_ms),
            ms(c.gap_p99_ms),
            c.stalls.to_string(),
            two(c.useful_per_s),
            pct(within),
            pct(c.hit_rate),
        ];
        if with_imbalance {
            row.push(two(p.queue.imbalance));
        }
        Some(row)
    });
    table(&header, rows)
}

/// The main table (every policy, cohort `all`): what the console prints.
pub fn summary_table(report: &Report) -> String {
    cohort_table(report, ALL)
}

fn scope_header(report: &Report, out: &mut String) {
    let s = &report.scope;
    let faults = if s.faults.is_empty() { "none".to_owned() } else { s.faults.join("; ") };
    let baseline = match &report.baseline {
        Some(b) => b.clone(),
        None => format!("none ({BASELINE} was not run: every ratio is n/a)"),
    };
    let slo = &report.slo;
    let _ = writeln!(out, "# {}\n", s.title);
    for (k, v) in [
        ("Model profile", s.model_profile.clone()),
        ("Workload", s.workload.clone()),
        ("Seed", s.seed.to_string()),
        ("Schedule hash", format!("`{:016x}`", s.schedule_hash)),
        ("Requests", s.requests.to_string()),
        ("Knowledge (freshness)", s.knowledge.clone()),
        ("Topology", s.topology.clone()),
        ("Machine", s.machine.clone()),
        ("Faults", faults),
        ("KV block size", format!("{} tokens", s.block_size)),
        ("Hit-rate ceiling (unbounded single cache)", pct(report.ceiling)),
        (
            "SLO",
            format!(
                "TTFT ≤ {} ms and mean inter-token gap ≤ {} ms; a gap over {} ms is a stall",
                ms(Some(slo.ttft_ms)),
                ms(Some(slo.mean_gap_ms)),
                ms(Some(slo.stall_ms)),
            ),
        ),
        ("Baseline for ratios", baseline),
    ] {
        let _ = writeln!(out, "- {k}: {v}");
    }
    out.push('\n');
}

fn ratios(report: &Report, out: &mut String) {
    let _ = writeln!(
        out,
        "## Ratios vs {BASELINE}\n\nEach figure is the policy's value divided by {BASELINE}'s in \
         the same cohort (1.00× = the same). n/a: no baseline, or nothing to divide by.\n"
    );
    let rows = report.ratios.iter().map(|r| {
        vec![
            cell(&r.cohort),
            cell(&r.policy),
            times(r.ttft_p50),
            times(r.ttft_p99),
            times(r.gap_p99),
            times(r.useful_per_s),
        ]
    });
    let header = [
        "cohort",
        "policy",
        "TTFT p50 × (lower is better)",
        "TTFT p99 × (lower is better)",
        "gap p99 × (lower is better)",
        "useful/s × (higher is better)",
    ];
    out.push_str(&table(&header, rows));
    out.push('\n');
}

fn queues(report: &Report, out: &mut String) {
    out.push_str(
        "## Queue balance\n\nA worker's queue is `running + waiting` from its `/metrics`, held \
         from one sample to the next. At each sample instant (once every sampled worker has \
         reported), imbalance = busiest worker's queue / the smallest busiest queue the total \
         allows (ceil(total / N)); instants where every queue is empty are skipped, and the \
         table shows the mean over the rest. 1.00 = as even as whole requests allow; up to N = \
         everything on one worker of N. Share = the worker's part of \
         the requests that named a worker (`x-worker-id`).\n\n",
    );
    let summary = report.policies.iter().map(|p| {
        let busiest = p.queue.workers.iter().filter_map(|w| w.share).max_by(f64::total_cmp);
        vec![cell(&p.policy), two(p.queue.imbalance), p.queue.instants.to_string(), pct(busiest)]
    });
    let header = ["policy", "imbalance ↓", "instants", "busiest worker's share"];
    out.push_str(&table(&header, summary));
    out.push('\n');
    let workers = report.policies.iter().flat_map(|p| {
        p.queue.workers.iter().map(|w| {
            vec![
                cell(&p.policy),
                cell(&w.worker),
                two(w.mean_queue),
                w.max_queue.map_or_else(|| "n/a".into(), |m| m.to_string()),
                w.served.to_string(),
                pct(w.share),
            ]
        })
    });
    let header = ["policy", "worker", "mean queue", "max queue", "served", "share"];
    out.push_str(&table(&header, workers));
    out.push('\n');
}

fn audit(report: &Report, out: &mut String) {
    out.push_str(
        "## Prediction audit\n\nRequests that carried kvroute's prediction \
         (`x-kvroute-decision`), classified against the worker's reported `cached_tokens`. \
         Unaudited: predicted but failed, or no `prompt_tokens` reported.\n\n",
    );
    let predicted = |c: &CohortStats| c.audit.audited() + c.audit.unaudited > 0;
    let rows: Vec<Vec<String>> = report
        .policies
        .iter()
        .flat_map(|p: &PolicyReport| p.cohorts.iter().filter(|c| predicted(c)).map(move |c| (p, c)))
        .map(|(p, c)| {
            let a = c.audit;
            vec![
                cell(&p.policy),
                cell(&c.cohort),
                a.audited().to_string(),
                a.hit_as_predicted.to_string(),
                a.false_hit.to_string(),
                a.false_miss.to_string(),
                a.ordinary_miss.to_string(),
                a.unaudited.to_string(),
            ]
        })
        .collect();
    if rows.is_empty() {
        out.push_str("No request carried a prediction.\n\n");
        return;
    }
    let header = [
        "policy",
        "cohort",
        "audited",
        "hit as predicted",
        "false hit",
        "false miss",
        "ordinary miss",
        "unaudited",
    ];
    out.push_str(&table(&header, rows));
    out.push('\n');
}

const HOW_TO_READ: &str = "## How to read this\n\n\
Every policy replayed the same open-loop schedule (same arrivals, bodies and cohort tags; see \
the schedule hash), so rows are directly comparable. ↓ marks columns where lower is better, ↑ \
where higher is better. TTFT quantiles are exact nearest-rank quantiles over the ok requests of \
the cohort; gap p99 is over every inter-token gap of the cohort. Useful/s counts completions \
within the SLO per second of the run: it is the throughput that matters. Cache hit is cached \
over prompt tokens of ok requests; compare it with the ceiling, the best an unbounded single \
cache could do on this workload. Ratios divide each policy's figure by least-request's: below \
1.00× is better for TTFT and gaps, above 1.00× is better for useful/s. Cohort tables show \
where a policy wins or loses (for example hot-prefix requests versus requests routed away from \
their prefix). A policy that piles requests onto one worker shows an imbalance near N and \
worse cohort tails. A false hit means \
kvroute expected reuse that did not happen (stale or evicted knowledge); a false miss means \
the worker reused more than predicted (knowledge lag).\n";

/// The whole report as Markdown.
pub fn markdown(report: &Report) -> String {
    let mut out = String::new();
    scope_header(report, &mut out);
    out.push_str("## All requests\n\n");
    out.push_str(&summary_table(report));
    out.push('\n');
    ratios(report, &mut out);
    for c in report.cohorts.iter().filter(|c| *c != ALL) {
        let _ = writeln!(out, "## Cohort `{c}`\n");
        out.push_str(&cohort_table(report, c));
        out.push('\n');
    }
    queues(report, &mut out);
    audit(report, &mut out);
    out.push_str("## Plots\n\n");
    for (name, caption) in plot_files(report) {
        let _ = writeln!(out, "- [{name}]({name}): {caption}");
    }
    out.push('\n');
    out.push_str(HOW_TO_READ);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_formatted_for_reading() {
        assert_eq!(ms(Some(2.345)), "2.3");
        assert_eq!(ms(Some(99.94)), "99.9");
        assert_eq!(ms(Some(1234.6)), "1235");
        assert_eq!(ms(None), "n/a");
        assert_eq!(pct(Some(0.7123)), "71.2%");
        assert_eq!(times(Some(0.5)), "0.50×");
        assert_eq!(cell("a|b"), "a\\|b");
        assert_eq!(
            table(&["a", "b"], [vec!["1".into(), "2".into()]]),
            "| a | b |\n|---|---|\n| 1 | 2 |\n"
        );
    }
}
