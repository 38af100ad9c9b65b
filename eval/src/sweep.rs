//! The load sweep: every policy at every rung of the offered-load ladder (the schedule's
//! arrival times divided by the rung's scale), and goodput at the SLO.
//!
//! Definitions (also stated in the reports):
//! - Offered rate of a run: its requests over its arrival span (first to last scheduled
//!   arrival), requests/s.
//! - Useful/s: requests within the SLO over the same span.
//! - Goodput at SLO of a policy in one repeat: the highest offered rate among the ladder's
//!   rungs at which at least [`GOODPUT_SLO_SHARE`] of the requests met the SLO; nothing is
//!   interpolated. "Below the ladder" when no rung passes (stored as 0).
//! - Its ratio to least-request is paired by repeat; the median and range are over repeats.

use serde::{Deserialize, Serialize};

use crate::repeat::{aa_ratios, noise_floor, paired, verdict, RepeatVerdict, Spread};

/// The share of requests within the SLO a rung needs to count for goodput.
pub const GOODPUT_SLO_SHARE: f64 = 0.95;

/// What the sweep needs of one valid run (cohort `all`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunPoint {
    pub policy: String,
    pub repeat: usize,
    pub rate_scale: f64,
    pub offered_per_s: Option<f64>,
    pub requests: usize,
    pub within_slo: usize,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p90_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub useful_per_s: Option<f64>,
}

impl RunPoint {
    /// Share of the run's requests within the SLO.
    pub fn slo_share(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.within_slo as f64 / self.requests as f64)
    }
}

/// One policy at one rung: medians and ranges over its valid repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    pub policy: String,
    pub rate_scale: f64,
    pub offered_per_s: Spread,
    pub ttft_p50_ms: Spread,
    pub ttft_p90_ms: Spread,
    pub ttft_p99_ms: Spread,
    pub useful_per_s: Spread,
    pub slo_share: Spread,
}

/// Goodput at the SLO of one policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    pub policy: String,
    /// Per repeat: the goodput (requests/s offered), `None` when below the ladder.
    pub per_repeat: Vec<(usize, Option<f64>)>,
    /// Over repeats, below the ladder counted as 0.
    pub goodput: Spread,
    /// Repeats where no rung passed.
    pub below_ladder: usize,
    /// Against least-request, paired by repeat (0 where this policy is below the ladder; ∞
    /// where only least-request is, 1 where both are).
    pub ratio: Spread,
    pub verdict: RepeatVerdict,
}

/// The whole sweep of one workload.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    /// The ladder, ascending.
    pub rates: Vec<f64>,
    /// Policy-major (in first-seen order), rungs ascending.
    pub points: Vec<SweepPoint>,
    pub goodput: Vec<Goodput>,
    /// least-request's goodput in repeat a over repeat b, every ordered pair.
    pub goodput_aa: Spread,
    /// Largest |A/A − 1| of the goodput; `None` with fewer than two repeats of the baseline.
    pub goodput_floor: Option<f64>,
}

/// The goodput of one ladder: the highest offered rate whose share within the SLO is at least
/// [`GOODPUT_SLO_SHARE`]; `None` when no rung passes.
pub fn goodput_of(ladder: &[(Option<f64>, Option<f64>)]) -> Option<f64> {
    ladder
        .iter()
        .filter(|(_, share)| share.is_some_and(|s| s >= GOODPUT_SLO_SHARE))
        .filter_map(|(offered, _)| *offered)
        .filter(|o| o.is_finite())
        .reduce(f64::max)
}

fn policies_in_order(points: &[RunPoint]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in points {
        if !out.contains(&p.policy) {
            out.push(p.policy.clone());
        }
    }
    out
}

/// The sweep over `points` (valid runs only), ratios against `baseline`.
pub fn sweep(points: &[RunPoint], baseline: &str) -> Sweep {
    let mut rates: Vec<f64> = Vec::new();
    for p in points {
        if p.rate_scale.is_finite() && !rates.contains(&p.rate_scale) {
            rates.push(p.rate_scale);
        }
    }
    rates.sort_by(f64::total_cmp);
    let policies = policies_in_order(points);

    let mut out_points = Vec::new();
    for policy in &policies {
        for &rate in &rates {
            let runs: Vec<&RunPoint> =
                points.iter().filter(|p| &p.policy == policy && p.rate_scale == rate).collect();
            if runs.is_empty() {
                continue;
            }
            let s = |f: fn(&RunPoint) -> Option<f64>| Spread::of(runs.iter().filter_map(|r| f(r)));
            out_points.push(SweepPoint {
                policy: policy.clone(),
                rate_scale: rate,
                offered_per_s: s(|r| r.offered_per_s),
                ttft_p50_ms: s(|r| r.ttft_p50_ms),
                ttft_p90_ms: s(|r| r.ttft_p90_ms),
                ttft_p99_ms: s(|r| r.ttft_p99_ms),
                useful_per_s: s(|r| r.useful_per_s),
                slo_share: s(RunPoint::slo_share),
            });
        }
    }

    let per_repeat = |policy: &str| -> Vec<(usize, Option<f64>)> {
        let mut repeats: Vec<usize> =
            points.iter().filter(|p| p.policy == policy).map(|p| p.repeat).collect();
        repeats.sort_unstable();
        repeats.dedup();
        repeats
            .into_iter()
            .map(|r| {
                let ladder: Vec<_> = points
                    .iter()
                    .filter(|p| p.policy == policy && p.repeat == r)
                    .map(|p| (p.offered_per_s, p.slo_share()))
                    .collect();
                (r, goodput_of(&ladder))
            })
            .collect()
    };
    let base = per_repeat(baseline);
    let base_values: Vec<Option<f64>> = base.iter().map(|(_, g)| *g).collect();
    let aa = aa_ratios(&base_values);
    let floor = noise_floor(&aa);
    let goodput = policies
        .iter()
        .map(|policy| {
            let mine = per_repeat(policy);
            // Below the ladder counts as 0 against a baseline that has a goodput; against a
            // baseline below the ladder, a goodput is infinitely better (∞) and none is the same
            // (1): a repeat where only the policy passed must not drop out of the median.
            let zeroed: Vec<_> = mine.iter().map(|(r, g)| (*r, Some(g.unwrap_or(0.0)))).collect();
            let mut ratios = paired(&zeroed, &base);
            for (r, g) in &mine {
                if base.iter().any(|(rb, b)| rb == r && b.is_none()) {
                    ratios.push(if g.is_some_and(|g| g > 0.0) { f64::INFINITY } else { 1.0 });
                }
            }
            let ratio = Spread::of(ratios);
            Goodput {
                policy: policy.clone(),
                goodput: Spread::of(mine.iter().map(|(_, g)| g.unwrap_or(0.0))),
                below_ladder: mine.iter().filter(|(_, g)| g.is_none()).count(),
                verdict: verdict(ratio.median, floor, false),
                ratio,
                per_repeat: mine,
            }
        })
        .collect();
    Sweep { rates, points: out_points, goodput, goodput_aa: Spread::of(aa), goodput_floor: floor }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(policy: &str, repeat: usize, rate: f64, within: usize, p90: f64) -> RunPoint {
        RunPoint {
            policy: policy.into(),
            repeat,
            rate_scale: rate,
            offered_per_s: Some(10.0 * rate),
            requests: 100,
            within_slo: within,
            ttft_p50_ms: Some(p90 / 2.0),
            ttft_p90_ms: Some(p90),
            ttft_p99_ms: Some(p90 * 2.0),
            useful_per_s: Some(within as f64 / 10.0 * rate),
        }
    }

    #[test]
    fn goodput_is_the_highest_passing_rung_without_interpolation() {
        let l =
            |v: &[(f64, f64)]| -> Vec<_> { v.iter().map(|(o, s)| (Some(*o), Some(*s))).collect() };
        assert_eq!(goodput_of(&l(&[(5.0, 1.0), (10.0, 0.96), (20.0, 0.5)])), Some(10.0));
        assert_eq!(goodput_of(&l(&[(5.0, 0.95), (10.0, 0.949)])), Some(5.0));
        // A noisy ladder: the highest rung that passes counts, even above a failing one.
        assert_eq!(goodput_of(&l(&[(5.0, 0.99), (10.0, 0.9), (20.0, 0.97)])), Some(20.0));
        assert_eq!(goodput_of(&l(&[(5.0, 0.5)])), None);
        assert_eq!(goodput_of(&[(None, Some(1.0))]), None);
        assert_eq!(goodput_of(&[]), None);
    }

    #[test]
    fn sweep_medians_goodput_and_ratios_per_repeat() {
        let mut pts = Vec::new();
        for r in 0..3 {
            // least-request passes 0.5 and 1 (offered 5 and 10 req/s), not 2.
            pts.push(point("least-request", r, 0.5, 100, 100.0));
            pts.push(point("least-request", r, 1.0, 96, 200.0 + r as f64));
            pts.push(point("least-request", r, 2.0, 60, 900.0));
            // kvroute passes everything in repeats 0 and 1, only 0.5 in repeat 2.
            pts.push(point("kvroute", r, 0.5, 100, 80.0));
            pts.push(point("kvroute", r, 1.0, if r == 2 { 90 } else { 99 }, 150.0));
            pts.push(point("kvroute", r, 2.0, if r == 2 { 50 } else { 97 }, 300.0));
        }
        // A policy below the ladder in every repeat.
        pts.extend((0..3).map(|r| point("pinned", r, 0.5, 10, 5000.0)));
        let s = sweep(&pts, "least-request");
        assert_eq!(s.rates, vec![0.5, 1.0, 2.0]);
        assert_eq!(s.points.len(), 3 + 3 + 1);
        let lr1 = &s.points[1];
        assert_eq!((lr1.policy.as_str(), lr1.rate_scale), ("least-request", 1.0));
        assert_eq!(lr1.ttft_p90_ms.median, Some(201.0));
        assert_eq!((lr1.ttft_p90_ms.min, lr1.ttft_p90_ms.max), (Some(200.0), Some(202.0)));
        assert_eq!(lr1.slo_share.median, Some(0.96));

        let g = |p: &str| s.goodput.iter().find(|g| g.policy == p).expect("goodput");
        assert_eq!(g("least-request").goodput.median, Some(10.0));
        assert_eq!(s.goodput_floor, Some(0.0));
        let kv = g("kvroute");
        assert_eq!(kv.per_repeat, vec![(0, Some(20.0)), (1, Some(20.0)), (2, Some(5.0))]);
        assert_eq!(kv.goodput.median, Some(20.0));
        assert_eq!(
            (kv.ratio.median, kv.ratio.min, kv.ratio.max),
            (Some(2.0), Some(0.5), Some(2.0))
        );
        assert_eq!(kv.verdict, RepeatVerdict::Better);
        let pinned = g("pinned");
        assert_eq!((pinned.below_ladder, pinned.goodput.median), (3, Some(0.0)));
        assert_eq!(pinned.ratio.median, Some(0.0));
        assert_eq!(pinned.verdict, RepeatVerdict::Worse);
    }

    #[test]
    fn a_baseline_below_the_ladder_does_not_hide_a_passing_policy() {
        // least-request passes nothing in repeats 1 and 2; kvroute passes x1 in all three.
        let mut pts = Vec::new();
        for r in 0..3 {
            pts.push(point("least-request", r, 1.0, if r == 0 { 100 } else { 80 }, 1.0));
            pts.push(point("kvroute", r, 1.0, 100, 1.0));
        }
        let s = sweep(&pts, "least-request");
        let kv = s.goodput.iter().find(|g| g.policy == "kvroute").expect("kvroute");
        assert_eq!(kv.ratio.n, 3);
        assert_eq!(kv.ratio.median, Some(f64::INFINITY));
        assert_eq!(kv.verdict, RepeatVerdict::Better);
        let lr = s.goodput.iter().find(|g| g.policy == "least-request").expect("baseline");
        assert_eq!(lr.below_ladder, 2);
    }

    #[test]
    fn one_repeat_has_no_floor_and_a_missing_baseline_no_ratio() {
        let s = sweep(&[point("least-request", 0, 1.0, 100, 1.0)], "least-request");
        assert_eq!(s.goodput_floor, None);
        let s = sweep(&[point("kvroute", 0, 1.0, 100, 1.0)], "least-request");
        assert_eq!(s.goodput[0].ratio.median, None);
        assert_eq!(s.goodput[0].verdict, RepeatVerdict::Unknown);
        assert_eq!(sweep(&[], "least-request"), Sweep::default());
    }
}
