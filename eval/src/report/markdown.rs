//! The Markdown rendering of a [`Report`]: scope header, runs and host health, the main table,
//! ratios against least-request with the A/A row, the ablation ladder, per-cohort tables,
//! regret, estimate error, learned cost coefficients ([`super::learned`]), the load sweep with goodput at SLO, balance, prediction audit, plot
//! list and a short guide to reading it.

use std::fmt::Write as _;

use super::{
    plot_files, CohortStats, Metric, MetricRatio, NoiseRow, PolicyReport, Report, ALL, BASELINE,
};
use crate::repeat::{RepeatVerdict, Spread};
use crate::report::regret::{EstimateError, WaitSplit};
use crate::sweep::GOODPUT_SLO_SHARE;

/// Milliseconds: one decimal below 100 ms, none above.
pub(super) fn ms(v: Option<f64>) -> String {
    match v {
        Some(v) if v.abs() < 100.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.0}"),
        None => "n/a".into(),
    }
}

/// A fraction as a percentage.
pub(super) fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{:.1}%", 100.0 * v))
}

/// A ratio as a factor.
pub(super) fn times(v: Option<f64>) -> String {
    match v {
        None => "n/a".into(),
        Some(v) if v.is_infinite() => "∞×".into(),
        Some(v) => format!("{v:.2}×"),
    }
}

pub(super) fn two(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.2}"))
}

/// Text made safe for a table cell.
pub(super) fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A Markdown table from a header and rows.
pub(super) fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut out = format!("| {} |\n|{}\n", header.join(" | "), "---|".repeat(header.len()));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

/// `[min–max]` of a spread over more than one value, else nothing.
fn range(s: &Spread, f: impl Fn(Option<f64>) -> String) -> String {
    if s.n > 1 {
        format!(" [{}–{}]", f(s.min), f(s.max))
    } else {
        String::new()
    }
}

/// A ratio over repeats: `0.80× [0.75–0.85] better`, or `no difference <small>(…)</small>`
/// when its median is within the noise floor.
pub(super) fn ratio_cell(m: &MetricRatio) -> String {
    let r = &m.ratio;
    let value = format!("{}{}", times(r.median), range(r, times));
    match m.verdict {
        RepeatVerdict::Unknown => "n/a".into(),
        RepeatVerdict::NoDifference => format!("no difference <small>({value})</small>"),
        RepeatVerdict::Better => format!("{value} better"),
        RepeatVerdict::Worse => format!("{value} worse"),
    }
}

/// The A/A cell of a metric: the spread of A/A ratios and the floor, or why there is none.
pub(super) fn aa_cell(n: &NoiseRow, m: Metric) -> String {
    let Some(x) = n.metrics.iter().find(|x| x.metric == m) else { return "n/a".into() };
    match x.floor {
        None if n.runs < 2 => format!("no noise floor ({} run)", n.runs),
        None => "no noise floor (nothing to divide)".into(),
        Some(f) => {
            format!("{}{}, floor ±{}", times(x.aa.median), range(&x.aa, times), pct(Some(f)))
        }
    }
}

/// The label of a run: the policy, then `#repeat` and `×load` when there are several.
pub(super) fn run_label(report: &Report, p: &PolicyReport) -> String {
    let mut s = cell(&p.policy);
    if report.repeats > 1 {
        let _ = write!(s, " #{}", p.repeat + 1);
    }
    if report.sweep.rates.len() > 1 || p.rate_scale != report.reference_rate {
        let _ = write!(s, " ×{}", p.rate_scale);
    }
    s
}

/// The median of `f` over `runs`.
fn med(runs: &[&CohortStats], f: impl Fn(&CohortStats) -> Option<f64>) -> Option<f64> {
    Spread::of(runs.iter().filter_map(|c| f(c))).median
}

/// The per-policy table of one cohort at the reference rate, medians over valid runs; the
/// imbalance columns only for cohort `all`.
fn cohort_table(report: &Report, cohort: &str) -> String {
    let mut header = vec![
        "policy",
        "runs",
        "requests",
        "failed",
        "TTFT p50 (ms) ↓",
        "TTFT p90 (ms) ↓",
        "TTFT p99 (ms) ↓",
        "gap p99 (ms) ↓",
        "stalls ↓",
        "useful/s ↑",
        "within SLO ↑",
        "cache hit ↑ (ceiling)",
    ];
    let with_imbalance = cohort == ALL;
    if with_imbalance {
        header.extend(["queue imbalance ↓", "prefill max/mean ↓", "prefill min/mean ↑"]);
    }
    let ceiling = pct(report.ceiling_of(cohort));
    let rows = report.policy_names().into_iter().filter_map(|name| {
        let runs = report.runs_of(name);
        let stats: Vec<&CohortStats> = runs.iter().filter_map(|p| p.cohort(cohort)).collect();
        if stats.is_empty() {
            return None;
        }
        let n = |f: fn(&CohortStats) -> usize| med(&stats, |c| Some(f(c) as f64));
        let count = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.0}"));
        let mut row = vec![
            cell(name),
            stats.len().to_string(),
            count(n(|c| c.requests)),
            count(n(|c| c.requests - c.ok)),
            ms(med(&stats, |c| c.ttft_p50_ms)),
            ms(med(&stats, |c| c.ttft_p90_ms)),
            ms(med(&stats, |c| c.ttft_p99_ms)),
            ms(med(&stats, |c| c.gap_p99_ms)),
            count(med(&stats, |c| Some(c.stalls as f64))),
            two(med(&stats, |c| c.useful_per_s)),
            pct(med(&stats, CohortStats::slo_share)),
            format!("{} ({ceiling})", pct(med(&stats, |c| c.hit_rate))),
        ];
        if with_imbalance {
            let m = |f: fn(&PolicyReport) -> Option<f64>| {
                Spread::of(runs.iter().filter_map(|p| f(p))).median
            };
            row.push(two(m(|p| p.queue.imbalance)));
            row.push(two(m(|p| p.prefill.max_over_mean)));
            row.push(two(m(|p| p.prefill.min_over_mean)));
        }
        Some(row)
    });
    table(&header, rows)
}

/// The main table (every policy, cohort `all`, medians of valid runs): what the console prints.
pub fn summary_table(report: &Report) -> String {
    cohort_table(report, ALL)
}

/// The noise floor's definition, as the reports state it.
pub const NOISE_FLOOR: &str = "the noise floor of a metric is the largest |A/A ratio − 1|, \
where the A/A ratios are least-request's value in repeat a over its value in repeat b for every \
ordered pair of distinct valid repeats; the noise band is multiplicative, from 1/(1 + floor) to \
1 + floor (the range of the A/A ratios, since both a/b and b/a are among them), and a policy's \
ratio whose median over repeats lies within it is shown as \"no difference\" (value in small \
print); with one valid run there is no floor";

fn scope_header(report: &Report, out: &mut String) {
    let s = &report.scope;
    let faults = if report.faults.is_empty() {
        if s.faults.is_empty() {
            "none".to_owned()
        } else {
            s.faults.join("; ")
        }
    } else {
        report
            .faults
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let (lo, hi) = super::cohorts::fault_window(f);
                format!(
                    "{} (cohorts `{}`; during = {:.1}–{:.1} s of the schedule, divided by k at load ×k{})",
                    f.describe(),
                    super::cohorts::fault_cohort(i, f, "*"),
                    lo / 1000.0,
                    hi / 1000.0,
                    if f.fault.duration().is_zero() {
                        format!(
                            ", a one-off fault's {} s after it",
                            super::cohorts::ONE_OFF_WINDOW_MS / 1000
                        )
                    } else {
                        String::new()
                    }
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let baseline = match &report.baseline {
        Some(b) => b.clone(),
        None => format!("none ({BASELINE} was not run: every ratio is n/a)"),
    };
    let slo = &report.slo;
    let or_unknown = |v: &str| if v.is_empty() { "not recorded".to_owned() } else { v.to_owned() };
    let rates: Vec<String> = report.sweep.rates.iter().map(|r| format!("×{r}")).collect();
    let _ = writeln!(out, "# {}\n", s.title);
    for (k, v) in [
        ("Model profile", s.model_profile.clone()),
        ("Filter cost coefficients", or_unknown(&s.filter_profile)),
        ("Simulator cost coefficients", or_unknown(&s.sim_profile)),
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
        (
            "Repeats",
            format!(
                "{} per (policy, load) cell, the policies' order rotated by one each repeat",
                report.repeats
            ),
        ),
        (
            "Offered load ladder",
            format!(
                "{} of the workload's own rate; the tables are at ×{} unless they say otherwise",
                if rates.is_empty() { "none".into() } else { rates.join(", ") },
                report.reference_rate
            ),
        ),
        ("Noise floor", NOISE_FLOOR.to_owned()),
        (
            "Valid runs",
            format!(
                "{} run(s) left out of every median for host health (see below)",
                report.excluded.len()
            ),
        ),
    ] {
        let _ = writeln!(out, "- {k}: {v}");
    }
    out.push('\n');
}

fn health(report: &Report, out: &mut String) {
    out.push_str(
        "## Runs and host health\n\nEvery run, in the order it ran within its repeat. A run is \
         invalid when the host could not keep up (the runner's reasons below); invalid runs are \
         shown here but left out of every median, ratio, regret, estimate and sweep figure. Step \
         lag: how late the simulated workers' steps started against plan; send lag: how late the \
         client sent requests against their schedule. Replicated: requests whose decision header \
         said kvroute's look-ahead placed their hot prefix on one more worker on purpose \
         (`replicated=1`; 0 for policies without the header).\n\n",
    );
    let rows = report.policies.iter().map(|p| {
        let a = p.all();
        let lag = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.1}"));
        vec![
            cell(&p.policy),
            (p.repeat + 1).to_string(),
            format!("×{}", p.rate_scale),
            a.map_or(0, |c| c.requests).to_string(),
            a.map_or(0, |c| c.requests - c.ok).to_string(),
            two(p.offered_per_s),
            format!("{:.1}", p.duration_s),
            lag(p.health.step_lag_p99_ms),
            lag(Some(p.health.send_lag_p99_ms)),
            pct(p.health.cpu_busy),
            p.replicated.to_string(),
            if p.health.valid() {
                "valid".into()
            } else {
                format!("**invalid**: {}", cell(&p.health.invalid.join("; ")))
            },
        ]
    });
    let header = [
        "policy",
        "repeat",
        "load",
        "requests",
        "failed",
        "offered/s",
        "duration (s)",
        "step lag p99 (ms)",
        "send lag p99 (ms)",
        "CPU busy",
        "replicated",
        "validity",
    ];
    out.push_str(&table(&header, rows));
    let _ = writeln!(
        out,
        "\n{} of {} runs excluded for host health.\n",
        report.excluded.len(),
        report.policies.len()
    );
}

/// The ratio table of one cohort: the A/A row, then every other policy.
pub(super) fn ratio_table(report: &Report, cohort: &str) -> String {
    let mut header = vec!["policy", "runs used (excluded)", "requests / failed"];
    header.extend(Metric::ALL.map(|m| m.label()));
    let mut rows = Vec::new();
    if let Some(n) = report.noise_of(cohort) {
        let mut row = vec![
            format!("A/A {BASELINE} vs {BASELINE}"),
            n.runs.to_string(),
            format!("{} / {}", n.requests, n.failed),
        ];
        row.extend(Metric::ALL.map(|m| aa_cell(n, m)));
        rows.push(row);
    }
    for c in report.comparisons.iter().filter(|c| c.cohort == cohort) {
        let mut label = cell(&c.policy);
        if c.policy == "oracle" {
            label.push_str(" (the limit)");
        }
        let mut row = vec![
            label,
            format!("{} ({})", c.runs, c.excluded),
            format!("{} / {}", c.requests, c.failed),
        ];
        row.extend(c.metrics.iter().map(ratio_cell));
        rows.push(row);
    }
    table(&header, rows)
}

fn ratios(report: &Report, out: &mut String) {
    let _ = writeln!(
        out,
        "## Ratios vs {BASELINE}\n\nEach figure is the policy's value over {BASELINE}'s in the \
         same cohort and the same repeat, at load ×{}; shown as the median [min–max] over \
         repeats, then whether that is better or worse. TTFT and gap: lower is better; useful/s \
         and within SLO: higher is better. The A/A row is {BASELINE} against itself; {NOISE_FLOOR}. \
         Requests / failed are summed over the runs used. n/a: no baseline, nothing to divide \
         by, or useful/s in a cohort whose members differ by policy ({}): compare within SLO \
         there.\n",
        report.reference_rate,
        if report.varying_cohorts.is_empty() {
            "none here".to_owned()
        } else {
            report.varying_cohorts.iter().map(|c| format!("`{}`", cell(c))).collect::<Vec<_>>().join(", ")
        }
    );
    for c in &report.cohorts {
        let _ = writeln!(out, "### Cohort `{}`\n", cell(c));
        out.push_str(&ratio_table(report, c));
        out.push('\n');
    }
}

pub(super) fn ladder_table(report: &Report) -> String {
    let metrics = [Metric::TtftP50, Metric::TtftP99, Metric::UsefulPerS];
    let mut header = vec!["rung".to_owned(), "policy".to_owned()];
    for m in metrics {
        header.push(format!("{} vs {BASELINE}", m.label()));
        header.push(format!("{} vs previous rung", m.label()));
    }
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let rows = report.ladder.iter().enumerate().map(|(i, s)| {
        let mut row = vec![(i + 1).to_string(), cell(&s.policy)];
        for m in metrics {
            let get =
                |v: &[MetricRatio]| v.iter().find(|x| x.metric == m).map_or("—".into(), ratio_cell);
            row.push(if s.policy == BASELINE {
                "1 (baseline)".into()
            } else {
                get(&s.vs_baseline)
            });
            row.push(match &s.previous {
                Some(p) => format!("{} (vs {})", get(&s.vs_previous), cell(p)),
                None => "—".into(),
            });
        }
        row
    });
    table(&header, rows)
}

fn ladder(report: &Report, out: &mut String) {
    out.push_str(
        "## Ablation ladder\n\nOne ingredient per rung: least-request → kvroute-load-only (the \
         cost model on load alone) → kvroute-history (+ its own routing history and response \
         feedback) → kvroute (+ KV events) → oracle (the what-if limit). Cohort `all`; each \
         step against least-request and against the rung before it (paired by repeat, judged \
         against least-request's noise floor). Rungs that did not run are left out.\n\n",
    );
    if report.ladder.is_empty() {
        out.push_str("No rung of the ladder ran.\n\n");
        return;
    }
    out.push_str(&ladder_table(report));
    out.push('\n');
}

fn cohort_sections(report: &Report, out: &mut String) {
    for c in report.cohorts.iter().filter(|c| *c != ALL) {
        let _ = writeln!(out, "## Cohort `{}`\n", cell(c));
        out.push_str(&cohort_table(report, c));
        out.push('\n');
    }
}

pub(super) fn regret_table(report: &Report) -> String {
    let rows = report.regret.iter().map(|r| {
        let mut name = cell(&r.policy);
        if r.policy == "oracle" {
            name.push_str(" (the limit)");
        }
        vec![
            name,
            r.runs.to_string(),
            r.sampled.to_string(),
            r.count.to_string(),
            ms(r.p50_ms),
            ms(r.p90_ms),
            ms(r.p99_ms),
            pct(r.zero_share),
        ]
    });
    let header = [
        "policy",
        "runs",
        "sampled",
        "with regret",
        "regret p50 (ms) ↓",
        "p90 ↓",
        "p99 ↓",
        "zero regret (≤ 1 ms) ↑",
    ];
    table(&header, rows)
}

fn regret(report: &Report, out: &mut String) {
    out.push_str(
        "## Regret against the oracle\n\nFor the sampled requests, every simulated worker was \
         asked what TTFT it would give the request at send time (`/sim/what_if`, engine ms). \
         Regret = the what-if of the worker that served it (its `x-worker-id` matched to the \
         worker list) minus the smallest what-if. \"With regret\" counts the sampled requests \
         whose serving worker is known and answered. Valid runs at the reference load pooled.\n\n",
    );
    if report.regret.is_empty() {
        out.push_str("No request was sampled.\n\n");
        return;
    }
    out.push_str(&regret_table(report));
    out.push('\n');
}

fn estimate(report: &Report, out: &mut String) {
    out.push_str(
        "## TTFT estimate error\n\nkvroute's predicted TTFT for the worker it chose \
         (`predicted_ttft_ms`) against the observed TTFT: |predicted − observed| / observed, \
         median over the requests; signed: (predicted − observed) / observed, below 0 = the \
         filter expected it sooner. Windows: tenths of each run's arrival span (valid runs at \
         the reference load pooled). After warm-up: the median error of windows 3–10 (the \
         requests after the first 20 % of each run's arrival span), also split by what the \
         estimate saw on the chosen worker (`predicted_wait_ms`): nothing queued, or a queue to \
         wait behind (where the error comes from). See `estimate_error.svg`.\n\n",
    );
    if report.estimate.is_empty() {
        out.push_str("No request carried a TTFT estimate.\n\n");
        return;
    }
    let n = report.estimate.iter().map(|e| e.windows.len()).max().unwrap_or(0);
    let mut header = vec![
        "policy".to_owned(),
        "runs".into(),
        "requests".into(),
        "median error".into(),
        "median signed".into(),
        "after warm-up".into(),
        "nothing queued".into(),
        "behind a queue".into(),
    ];
    header.extend((1..=n).map(|w| format!("w{w}")));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let rows = report.estimate.iter().map(|e| {
        let mut row = vec![
            cell(&e.policy),
            e.runs.to_string(),
            e.count.to_string(),
            pct(e.median),
            pct(e.median_signed),
            format!("{} <small>(n={})</small>", pct(e.after_warmup), e.after_warmup_count),
            split_cell(&e.after_warmup_idle),
            split_cell(&e.after_warmup_queued),
        ];
        row.extend(e.windows.iter().map(|(k, m)| format!("{} <small>(n={k})</small>", pct(*m))));
        row
    });
    out.push_str(&table(&header, rows));
    races(report, out);
    instants(report, out);
    filter_share(report, out);
    let _ = writeln!(
        out,
        "\nFilter coefficients: {}. Simulator coefficients: {}.\n",
        recorded(&report.scope.filter_profile),
        recorded(&report.scope.sim_profile)
    );
}

/// Each policy's pair of after-warm-up splits `pick` reads, as `policy: a X, b Y` with the
/// `names`, for the policies whose first split counts any request.
fn split_pairs(
    report: &Report,
    pick: fn(&EstimateError) -> (&WaitSplit, &WaitSplit),
    (a, b): (&str, &str),
) -> Vec<String> {
    report
        .estimate
        .iter()
        .filter(|e| pick(e).0.count > 0)
        .map(|e| {
            let (x, y) = pick(e);
            format!("{}: {a} {}, {b} {}", cell(&e.policy), split_cell(x), split_cell(y))
        })
        .collect()
}

/// The after-warm-up estimate error split by races between Envoys, when a run had several.
fn races(report: &Report, out: &mut String) {
    fn pick(e: &EstimateError) -> (&WaitSplit, &WaitSplit) {
        (&e.after_warmup_raced, &e.after_warmup_unraced)
    }
    let raced = split_pairs(report, pick, ("raced", "not raced"));
    if raced.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nRaced by another Envoy (after warm-up): another Envoy had sent a request to the same \
         worker at most {} ms (wall clock) before, or at the same instant, and it had no first \
         byte yet; neither filter could count the other's. {}.",
        crate::report::regret::RACE_WALL_MS,
        raced.join("; ")
    );
}

/// The after-warm-up error of the requests with nothing queued by the estimate, split by
/// whether another request arrived at the same instant for the same worker.
fn instants(report: &Report, out: &mut String) {
    fn pick(e: &EstimateError) -> (&WaitSplit, &WaitSplit) {
        (&e.after_warmup_idle_shared, &e.after_warmup_idle_alone)
    }
    let split = split_pairs(report, pick, ("shared", "alone"));
    if split.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nNothing queued by the estimate, yet another request arrived at the same instant for \
         the same worker (after warm-up; through any Envoy or thread, each decided without the \
         other, and one waited for the other's prefill), against alone at its instant. {}.",
        split.join("; ")
    );
}

/// The filter's own share of the observed TTFT, which no estimate covers.
fn filter_share(report: &Report, out: &mut String) {
    let shares: Vec<String> = report
        .estimate
        .iter()
        .filter_map(|e| {
            Some(format!("{} {}", cell(&e.policy), pct(Some(e.after_warmup_filter_share?))))
        })
        .collect();
    if shares.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nThe estimate starts when the filter has decided: the observed TTFT (the client's) also \
         holds the filter's own time (`decision_us`) and the proxy's legs. The filter's time, \
         median share of the observed TTFT after warm-up: {}.",
        shares.join("; ")
    );
}

/// A part of the after-warm-up estimate error: `12.0% (n=80)`.
pub(super) fn split_cell(s: &WaitSplit) -> String {
    format!("{} <small>(n={})</small>", pct(s.median), s.count)
}

/// The goodput at SLO of one policy: `12.0 req/s [10.0–12.0]`, or "below the ladder".
pub(super) fn goodput_cell(g: &crate::sweep::Goodput) -> String {
    let s = &g.goodput;
    let f = |v: Option<f64>| match v {
        Some(v) if v > 0.0 => format!("{v:.2}"),
        Some(_) => "below".into(),
        None => "n/a".into(),
    };
    match s.median {
        None => "n/a".into(),
        Some(m) if m <= 0.0 => format!("below the ladder ({} of {} repeats)", g.below_ladder, s.n),
        Some(m) => format!("{m:.2} req/s{}", range(s, f)),
    }
}

/// The goodput ratio of one policy, with its verdict against the goodput noise floor.
pub(super) fn goodput_ratio_cell(g: &crate::sweep::Goodput) -> String {
    ratio_cell(&MetricRatio { metric: Metric::UsefulPerS, ratio: g.ratio, verdict: g.verdict })
}

pub(super) fn goodput_table(report: &Report) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let sw = &report.sweep;
    if sw.goodput.iter().any(|g| g.policy == BASELINE) {
        let aa = match sw.goodput_floor {
            None => "no noise floor (1 run)".to_owned(),
            Some(f) => format!(
                "{}{}, floor ±{}",
                times(sw.goodput_aa.median),
                range(&sw.goodput_aa, times),
                pct(Some(f))
            ),
        };
        rows.push(vec![format!("A/A {BASELINE}"), "—".into(), aa]);
    }
    for g in &sw.goodput {
        rows.push(vec![
            cell(&g.policy),
            goodput_cell(g),
            if g.policy == BASELINE { "1 (baseline)".into() } else { goodput_ratio_cell(g) },
        ]);
    }
    table(&["policy", "goodput at SLO (median [range])", "vs least-request"], rows)
}

fn sweep(report: &Report, out: &mut String) {
    let _ = writeln!(
        out,
        "## Load sweep and goodput at SLO\n\nEvery rung replays the same schedule with arrival \
         times divided by the rung's scale. Offered/s = requests over the arrival span; useful/s \
         = requests within the SLO over the same span. Medians over valid repeats [range]. \
         Goodput at SLO = the highest offered rate among the rungs at which at least {:.0}% of \
         the requests met the SLO (nothing interpolated; \"below the ladder\" when no rung \
         passes), per repeat; its ratio to {BASELINE} is paired by repeat. See `sweep.svg`.\n",
        100.0 * GOODPUT_SLO_SHARE
    );
    let rows = report.sweep.points.iter().map(|p| {
        let s =
            |x: &Spread, f: fn(Option<f64>) -> String| format!("{}{}", f(x.median), range(x, f));
        vec![
            cell(&p.policy),
            format!("×{}", p.rate_scale),
            p.ttft_p50_ms.n.to_string(),
            two(p.offered_per_s.median),
            s(&p.ttft_p50_ms, ms),
            s(&p.ttft_p90_ms, ms),
            s(&p.ttft_p99_ms, ms),
            s(&p.useful_per_s, two),
            s(&p.slo_share, pct),
        ]
    });
    let header = [
        "policy",
        "load",
        "runs",
        "offered/s",
        "TTFT p50 (ms)",
        "TTFT p90 (ms)",
        "TTFT p99 (ms)",
        "useful/s",
        "within SLO",
    ];
    out.push_str(&table(&header, rows));
    out.push('\n');
    out.push_str(&goodput_table(report));
    out.push('\n');
}

fn balance(report: &Report, out: &mut String) {
    out.push_str(
        "## Balance\n\nQueue: a worker's queue is `running + waiting` from its `/metrics`, held \
         from one sample to the next. At each sample instant (once every sampled worker has \
         reported), imbalance = busiest worker's queue / the smallest busiest queue the total \
         allows (ceil(total / N)); instants where every queue is empty are skipped, and the \
         table shows the mean over the rest. 1.00 = as even as whole requests allow; up to N = \
         everything on one worker of N. Prefill: per worker the sum of `prompt_tokens − \
         cached_tokens` of the ok requests it served (idle workers count as 0); max/mean near N \
         and min/mean near 0 show a hot and a starved or idle worker. Share = the worker's part \
         of the requests that named a worker (`x-worker-id`).\n\n",
    );
    let summary = report.policies.iter().map(|p| {
        let busiest = p.queue.workers.iter().filter_map(|w| w.share).max_by(f64::total_cmp);
        vec![
            run_label(report, p),
            two(p.queue.imbalance),
            p.queue.instants.to_string(),
            pct(busiest),
            two(p.prefill.max_over_mean),
            two(p.prefill.min_over_mean),
        ]
    });
    let header = [
        "run",
        "queue imbalance ↓",
        "instants",
        "busiest worker's share",
        "prefill max/mean ↓",
        "prefill min/mean ↑",
    ];
    out.push_str(&table(&header, summary));
    out.push('\n');
    let workers = report.policies.iter().flat_map(|p| {
        p.queue.workers.iter().map(move |w| {
            vec![
                run_label(report, p),
                cell(&w.worker),
                two(w.mean_queue),
                w.max_queue.map_or_else(|| "n/a".into(), |m| m.to_string()),
                w.served.to_string(),
                pct(w.share),
                w.prefill_tokens.to_string(),
            ]
        })
    });
    let header = ["run", "worker", "mean queue", "max queue", "served", "share", "prefill tokens"];
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
                run_label(report, p),
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
        "run",
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
the schedule hash), several times with the policies' order rotated, so rows are directly \
comparable and a policy is not favoured by running first or last. ↓ marks columns where lower \
is better, ↑ where higher is better. TTFT quantiles are exact nearest-rank quantiles over the ok \
requests of the cohort; gap p99 is over every inter-token gap of the cohort. Useful/s counts \
completions within the SLO per second of the arrival span: it is the throughput that matters. \
Cache hit is cached over prompt tokens of ok requests; compare it with the ceiling, the best an \
unbounded single cache could do on those requests. Ratios divide each policy's figure by \
least-request's in the same repeat: below 1.00× is better for TTFT and gaps, above 1.00× is \
better for useful/s. A ratio inside least-request's own run-to-run spread (the A/A row) is \
\"no difference\": do not read anything into it. Cohorts show where a policy wins or loses: \
`diverted` are hot-prefix requests served by a worker that did not yet hold the prefix, \
`during-burst` are background requests arriving during the hot burst, `fK-…:before/during/after` \
split the requests around fault K. A policy that piles requests onto one worker shows a queue \
imbalance near N, a prefill max/mean near N with a min/mean near 0, and worse cohort tails. A \
false hit means kvroute expected reuse that did not happen (stale or evicted knowledge); a false \
miss means the worker reused more than predicted (knowledge lag). The oracle row is the limit \
any router could reach with perfect knowledge of every worker's TTFT.\n";

/// The whole report as Markdown.
pub fn markdown(report: &Report) -> String {
    let mut out = String::new();
    scope_header(report, &mut out);
    health(report, &mut out);
    let _ = writeln!(
        out,
        "## All requests\n\nLoad ×{}, medians over the valid runs of each policy.\n",
        report.reference_rate
    );
    out.push_str(&summary_table(report));
    out.push('\n');
    ratios(report, &mut out);
    ladder(report, &mut out);
    super::peers::section(report, &mut out);
    cohort_sections(report, &mut out);
    regret(report, &mut out);
    estimate(report, &mut out);
    super::learned::section(report, &mut out);
    sweep(report, &mut out);
    balance(report, &mut out);
    audit(report, &mut out);
    out.push_str("## Plots\n\n");
    for (name, caption) in plot_files(report) {
        let _ = writeln!(out, "- [{name}]({name}): {caption}");
    }
    out.push('\n');
    out.push_str(HOW_TO_READ);
    out
}

/// `s`, or "not recorded" when empty.
pub(crate) fn recorded(s: &str) -> &str {
    if s.is_empty() {
        "not recorded"
    } else {
        s
    }
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

    #[test]
    fn ratio_cells_say_no_difference_within_the_floor() {
        let m = |median: f64, lo: f64, hi: f64, n: usize, verdict| MetricRatio {
            metric: Metric::TtftP99,
            ratio: Spread { median: Some(median), min: Some(lo), max: Some(hi), n },
            verdict,
        };
        assert_eq!(
            ratio_cell(&m(0.98, 0.95, 1.01, 3, RepeatVerdict::NoDifference)),
            "no difference <small>(0.98× [0.95×–1.01×])</small>"
        );
        assert_eq!(
            ratio_cell(&m(0.5, 0.4, 0.6, 3, RepeatVerdict::Better)),
            "0.50× [0.40×–0.60×] better"
        );
        assert_eq!(ratio_cell(&m(1.5, 1.5, 1.5, 1, RepeatVerdict::Worse)), "1.50× worse");
        assert_eq!(ratio_cell(&m(1.5, 1.5, 1.5, 1, RepeatVerdict::Unknown)), "n/a");
    }
}
