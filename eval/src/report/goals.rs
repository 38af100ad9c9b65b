//! The project's goals side by side: one row per goal and workload (and cohort) where it
//! applies, with the target, what was measured, the noise floor and a verdict, at the top of
//! `summary.md`.
//!
//! Rules:
//! - Every ratio is kvroute's figure over least-request's in the same repeat (the oracle's for
//!   the stretch goal), at the reference load; "measured" is the median [min–max] over repeats.
//! - A ratio goal needs a noise floor (at least two valid least-request runs): without one it is
//!   "not measured (too few runs)". A goal whose policy or workload did not run is "not
//!   measured" too, saying which.
//! - No-loss goals (`≤ 1.0×`): met when the median is within the target and the verdict against
//!   the noise floor is not "worse"; "met within the noise floor" (shown apart) when the median
//!   is above the target but no different from least-request's within the floor.
//! - Improvement goals (`≤ 0.3×`, `≤ 0.5×`, `≥ 2×`, `≤ half`): met when the median is within
//!   the target and beyond the noise floor (verdict "better").
//! - "Wins kept": met when the verdict is not "worse".
//! - The estimate error (an absolute figure, no floor): kvroute's median |predicted − observed|
//!   / observed after warm-up ([`super::regret::WARMUP_WINDOWS`]) within 15 %.
//! - Regret: kvroute's regret p90 over least-request's, paired by repeat, the floor from
//!   least-request's per-repeat p90s against each other.
//! - Stretch: kvroute's goodput at SLO over the oracle's, paired by repeat (below the ladder
//!   counts as 0; both below is 1), at least 0.9; the floor shown is least-request's goodput
//!   floor.

use std::fmt::Write as _;

use super::markdown::{cell, pct, table, times};
use super::summary::KVROUTE;
use super::{Report, BASELINE};
use crate::repeat::{RepeatVerdict, Spread};

mod rows;
pub use self::rows::rows;

/// The what-if oracle's policy name.
const ORACLE: &str = "oracle";
/// The estimate-error goal: kvroute's median relative error after warm-up at most this.
pub const ESTIMATE_ERROR_GOAL: f64 = 0.15;
/// Workloads with reuse (the goodput goal), by a part of their name.
const REUSE: [&str; 4] = ["multi-turn", "mooncake", "flash-crowd", "fan-out"];
/// Workloads of the no-loss goal, by a part of their name.
const NO_LOSS: [&str; 2] = ["fan-out", "flash-crowd"];

/// What a goal row concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoalOutcome {
    Met,
    /// A no-loss goal whose median is above the target but no different from least-request's
    /// within the noise floor: no loss that this instrument can see, shown apart.
    MetWithinNoise,
    /// Not met, and why.
    NotMet(String),
    /// Not measured, and why.
    NotMeasured(String),
}

/// One goal on one workload (and cohort).
#[derive(Debug, Clone, PartialEq)]
pub struct GoalRow {
    pub goal: &'static str,
    pub workload: String,
    pub cohort: String,
    pub target: String,
    pub measured: String,
    pub floor: String,
    pub outcome: GoalOutcome,
}

/// How a ratio is judged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// No loss: median ≤ the bound and the verdict not "worse" (a lower-is-better ratio).
    NoLoss(f64),
    /// Improvement, lower is better: median ≤ the bound and the verdict "better".
    AtMost(f64),
    /// Improvement, higher is better: median ≥ the bound and the verdict "better".
    AtLeast(f64),
    /// The verdict not "worse".
    NotWorse,
    /// Median ≥ the bound, whatever the verdict (against a policy other than the baseline).
    Within(f64),
}

impl Target {
    fn label(self) -> String {
        match self {
            Target::NoLoss(b) | Target::AtMost(b) => format!("≤ {b:.1}×"),
            Target::AtLeast(b) => format!("≥ {b:.1}×"),
            Target::NotWorse => "not worse".into(),
            Target::Within(b) => format!("≥ {b:.1}× (within {:.0} %)", 100.0 * (1.0 - b)),
        }
    }
}

/// `0.80× [0.75×–0.85×]`: the median and, over more than one value, the range.
fn spread_cell(s: &Spread) -> String {
    let mut out = times(s.median);
    if s.n > 1 {
        let _ = write!(out, " [{}–{}]", times(s.min), times(s.max));
    }
    out
}

/// The noise-floor cell.
fn floor_cell(floor: Option<f64>, baseline_runs: usize) -> String {
    match floor {
        Some(f) => format!("±{}", pct(Some(f))),
        None => format!("none ({baseline_runs} valid {BASELINE} run(s))"),
    }
}

/// The outcome of a ratio `s` with verdict `v` (against `floor`) for `target`.
pub fn judge(
    target: Target,
    s: &Spread,
    floor: Option<f64>,
    v: RepeatVerdict,
    runs: usize,
) -> GoalOutcome {
    let Some(m) = s.median else {
        return GoalOutcome::NotMeasured(
            "no ratio (no valid paired run, or nothing to divide)".into(),
        );
    };
    // Least-request below the ladder in every repeat while the policy passed a rung: no noise
    // can turn that around, and least-request's goodput has no A/A floor to give.
    let always_infinite = s.min.is_some_and(|x| x == f64::INFINITY);
    if always_infinite && s.n >= 2 && matches!(target, Target::AtLeast(_) | Target::Within(_)) {
        return GoalOutcome::Met;
    }
    if floor.is_none() {
        return GoalOutcome::NotMeasured(format!(
            "too few runs ({runs} valid {BASELINE} run(s): no noise floor)"
        ));
    }
    let band = match v {
        RepeatVerdict::NoDifference => " (within the noise floor)",
        RepeatVerdict::Worse => " (worse beyond the noise floor)",
        RepeatVerdict::Better | RepeatVerdict::Unknown => "",
    };
    match target {
        Target::NoLoss(b) if m > b && v == RepeatVerdict::NoDifference => {
            GoalOutcome::MetWithinNoise
        }
        Target::NoLoss(b) if m > b => {
            GoalOutcome::NotMet(format!("median {} > {b:.1}×{}", times(Some(m)), band))
        }
        Target::NoLoss(_) | Target::NotWorse if v == RepeatVerdict::Worse => {
            GoalOutcome::NotMet("worse beyond the noise floor".into())
        }
        Target::AtMost(b) if m > b => {
            GoalOutcome::NotMet(format!("median {} > {b:.1}×", times(Some(m))))
        }
        Target::AtLeast(b) if m < b => {
            GoalOutcome::NotMet(format!("median {} < {b:.1}×", times(Some(m))))
        }
        Target::AtMost(_) | Target::AtLeast(_) if v != RepeatVerdict::Better => {
            GoalOutcome::NotMet("within the noise floor: not better beyond it".into())
        }
        Target::Within(b) if m < b => {
            GoalOutcome::NotMet(format!("median {} < {b:.1}×", times(Some(m))))
        }
        _ => GoalOutcome::Met,
    }
}

fn outcome_cell(o: &GoalOutcome) -> String {
    match o {
        GoalOutcome::Met => "met".into(),
        GoalOutcome::MetWithinNoise => "met: no loss beyond the noise floor (median above the \
                                    target, inside the floor)"
            .into(),
        GoalOutcome::NotMet(why) => format!("**not met**: {}", cell(why)),
        GoalOutcome::NotMeasured(why) => format!("not measured: {}", cell(why)),
    }
}

/// Look-ahead replications per run of each kvroute policy on the fan-out and flash-crowd
/// workloads: `- workload: policy median [min–max] (n runs); …`.
fn replications(reports: &[Report]) -> String {
    let mut md = String::new();
    for rep in reports.iter().filter(|r| NO_LOSS.iter().any(|p| r.workload_name().contains(p))) {
        let parts: Vec<String> = rep
            .policy_names()
            .into_iter()
            .filter(|p| p.starts_with(KVROUTE))
            .map(|p| {
                let runs = rep.runs_of(p);
                let s = Spread::of(runs.iter().map(|r| r.replicated as f64));
                let n = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.0}"));
                let range =
                    if s.n > 1 { format!(" [{}–{}]", n(s.min), n(s.max)) } else { String::new() };
                format!("{} {}{range} ({} run(s))", cell(p), n(s.median), runs.len())
            })
            .collect();
        let parts =
            if parts.is_empty() { format!("no {KVROUTE} policy ran") } else { parts.join("; ") };
        let _ = writeln!(md, "- {}: {parts}", cell(rep.workload_name()));
    }
    md
}

/// The `## Goals` section of `summary.md`.
pub fn section(reports: &[Report]) -> String {
    let rows = rows(reports);
    let count = |f: fn(&GoalOutcome) -> bool| rows.iter().filter(|r| f(&r.outcome)).count();
    let met = count(|o| matches!(o, GoalOutcome::Met | GoalOutcome::MetWithinNoise));
    let in_noise = count(|o| matches!(o, GoalOutcome::MetWithinNoise));
    let not_met = count(|o| matches!(o, GoalOutcome::NotMet(_)));
    let unmeasured = count(|o| matches!(o, GoalOutcome::NotMeasured(_)));
    let mut md = format!(
        "\n## Goals\n\n{met} met ({in_noise} of them only within the noise floor), \
         {not_met} not met, {unmeasured} not measured. \
         Ratios: {KVROUTE} over {BASELINE} in the same repeat at the reference load (the \
         oracle's for the stretch goal), median [min–max] over repeats. A ratio goal needs a \
         noise floor (two valid {BASELINE} runs or more). No-loss goals (≤ 1.0×) are met when \
         the median is within the target and not worse beyond the floor, and met within the \
         noise floor when the median is above the target but inside the floor; improvement goals \
         (≤ 0.3×, ≤ 0.5×, ≥ 2×, ≤ half) when the median is within the target and better beyond \
         the floor; \"wins kept\" when not worse. The estimate error is over the requests after \
         the first 20 % of each run's arrival span. Regret: p90 per repeat, paired; its floor is \
         {BASELINE}'s per-repeat p90s against each other.\n\n"
    );
    let header = ["goal", "workload", "cohort", "target", "measured", "noise floor", "verdict"];
    md.push_str(&table(
        &header,
        rows.iter().map(|r| {
            vec![
                r.goal.to_owned(),
                r.workload.clone(),
                r.cohort.clone(),
                r.target.clone(),
                r.measured.clone(),
                r.floor.clone(),
                outcome_cell(&r.outcome),
            ]
        }),
    ));
    let reps = replications(reports);
    if !reps.is_empty() {
        md.push_str(
            "\nLook-ahead replications (requests whose hot prefix kvroute placed on one more \
             worker on purpose, `replicated=1`), per valid run at the reference load, median \
             [min–max]; context for the fan-out and flash-crowd rows:\n\n",
        );
        md.push_str(&reps);
    }
    md
}

#[cfg(test)]
mod tests;
