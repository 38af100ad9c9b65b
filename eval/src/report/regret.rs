//! Regret against the what-if oracle, and kvroute's TTFT estimate error.
//!
//! - Regret of a sampled request (one with `whatif_ms`): the what-if TTFT of the worker that
//!   served it (its `x-worker-id` matched against the run's worker list, whose order the
//!   what-ifs follow) minus the smallest what-if of any worker, engine ms. Requests whose
//!   worker is unknown or did not answer its what-if are counted as unmatched. Zero regret:
//!   within [`ZERO_REGRET_MS`].
//! - Estimate error of a request with `predicted_ttft_ms` and an observed `ttft_ms` > 0:
//!   |predicted − observed| / observed. Per run, arrivals are cut into [`WINDOWS`] equal time
//!   windows from the first to the last arrival; windows pool over the runs summarised.
//!   After warm-up: the requests of windows [`WARMUP_WINDOWS`] + 1 onwards, i.e. those arriving
//!   after the first 20 % of their run's arrival span (the calibration's learning phase).

use serde::{Deserialize, Serialize};

use super::stats::{nearest_rank, rate, sorted};
use crate::record::{RequestRecord, RunResult};

/// Regret up to this (ms) counts as zero.
pub const ZERO_REGRET_MS: f64 = 1.0;
/// Time windows of the estimate error.
pub const WINDOWS: usize = 10;
/// Leading windows of each run the after-warm-up estimate error leaves out (2 of 10: the
/// first 20 % of the arrival span).
pub const WARMUP_WINDOWS: usize = 2;

/// Another Envoy's request sent to the same worker this long before (wall ms), or less, may
/// not have reached a filter's knowledge yet: the replicas relay their load to each other
/// through the updater within about this (its freshness goal).
pub const RACE_WALL_MS: f64 = 25.0;

/// The regret distribution of one policy (over the runs summarised).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RegretStats {
    pub policy: String,
    /// Runs pooled.
    pub runs: usize,
    /// Requests with what-ifs.
    pub sampled: usize,
    /// Of those, with a regret (served worker known and answered).
    pub count: usize,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Share of `count` within [`ZERO_REGRET_MS`].
    pub zero_share: Option<f64>,
    /// Per repeat (runs of the same repeat pooled): the regret p90, for ratios paired by
    /// repeat and the A/A noise floor. Empty in reports from before it existed.
    #[serde(default)]
    pub per_repeat_p90_ms: Vec<(usize, Option<f64>)>,
}

/// The regrets of a run's sampled requests, and how many requests were sampled.
pub fn regrets(run: &RunResult) -> (usize, Vec<f64>) {
    let mut sampled = 0;
    let mut out = Vec::new();
    for r in run.records.iter().filter(|r| !r.whatif_ms.is_empty()) {
        sampled += 1;
        let best = r.whatif_ms.iter().flatten().copied().filter(|v| v.is_finite()).reduce(f64::min);
        let served = r
            .worker
            .as_deref()
            .and_then(|w| run.workers.iter().position(|x| x == w))
            .and_then(|i| r.whatif_ms.get(i).copied().flatten())
            .filter(|v| v.is_finite());
        if let (Some(s), Some(b)) = (served, best) {
            out.push((s - b).max(0.0));
        }
    }
    (sampled, out)
}

/// The regret of `policy` over `runs`.
pub fn regret_stats(policy: &str, runs: &[&RunResult]) -> RegretStats {
    let (mut sampled, mut all) = (0, Vec::new());
    for run in runs {
        let (s, r) = regrets(run);
        sampled += s;
        all.extend(r);
    }
    let v = sorted(all.into_iter());
    let zero = v.iter().filter(|x| **x <= ZERO_REGRET_MS).count();
    let mut repeats: Vec<usize> = runs.iter().map(|r| r.repeat).collect();
    repeats.sort_unstable();
    repeats.dedup();
    let per_repeat_p90_ms = repeats
        .into_iter()
        .map(|k| {
            let v = sorted(runs.iter().filter(|r| r.repeat == k).flat_map(|r| regrets(r).1));
            (k, nearest_rank(&v, 0.9))
        })
        .collect();
    RegretStats {
        policy: policy.to_owned(),
        runs: runs.len(),
        sampled,
        count: v.len(),
        p50_ms: nearest_rank(&v, 0.5),
        p90_ms: nearest_rank(&v, 0.9),
        p99_ms: nearest_rank(&v, 0.99),
        zero_share: rate(zero as f64, v.len() as f64),
        per_repeat_p90_ms,
    }
}

/// kvroute's TTFT estimate error of one policy (over the runs summarised).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EstimateError {
    pub policy: String,
    pub runs: usize,
    /// Requests with an estimate and an observed TTFT.
    pub count: usize,
    /// Median |predicted − observed| / observed.
    pub median: Option<f64>,
    /// Median signed (predicted − observed) / observed: below 0 = the filter is optimistic.
    pub median_signed: Option<f64>,
    /// Per time window: (requests, median relative error).
    pub windows: Vec<(usize, Option<f64>)>,
    /// Median |predicted − observed| / observed after warm-up: over the requests past the first
    /// [`WARMUP_WINDOWS`] windows of their run (the first 20 % of its arrival span). `None` in
    /// reports from before it existed or without such a request.
    #[serde(default)]
    pub after_warmup: Option<f64>,
    /// Requests the after-warm-up median is over.
    #[serde(default)]
    pub after_warmup_count: usize,
    /// The after-warm-up median over the requests whose worker had nothing queued by the
    /// estimate (`predicted_wait_ms` 0), and over those it put behind a queue: where the
    /// error comes from. Requests from filters without the field are in neither.
    #[serde(default)]
    pub after_warmup_idle: WaitSplit,
    #[serde(default)]
    pub after_warmup_queued: WaitSplit,
    /// The after-warm-up median over the requests raced by another Envoy (another Envoy sent a
    /// request to the same worker at most [`RACE_WALL_MS`] before this one, and it had no first
    /// byte yet when this one was sent: neither filter could count the other's), and over the
    /// others. Both empty with one Envoy, or records without their Envoy.
    #[serde(default)]
    pub after_warmup_raced: WaitSplit,
    #[serde(default)]
    pub after_warmup_unraced: WaitSplit,
    /// The after-warm-up median over the requests whose worker had nothing queued by the
    /// estimate yet another request arrived at the same instant for the same worker (through
    /// any Envoy or thread: each was decided without the other, and one of them waited for the
    /// other's prefill), and over those alone at their instant on their worker. The two split
    /// [`EstimateError::after_warmup_idle`].
    #[serde(default)]
    pub after_warmup_idle_shared: WaitSplit,
    #[serde(default)]
    pub after_warmup_idle_alone: WaitSplit,
    /// The filter's own time for its decision (`decision_us`, before the estimate starts) over
    /// the observed TTFT, median after warm-up: a share of the client's TTFT the estimate does
    /// not cover (nor does it cover the proxy's legs). `None` without the field.
    #[serde(default)]
    pub after_warmup_filter_share: Option<f64>,
}

/// A median relative error over part of the requests, and how many it is over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitSplit {
    pub median: Option<f64>,
    pub count: usize,
}

impl WaitSplit {
    fn of(errors: impl Iterator<Item = f64>) -> WaitSplit {
        let v = sorted(errors.map(f64::abs));
        WaitSplit { median: nearest_rank(&v, 0.5), count: v.len() }
    }
}

/// Where an estimated request's wait was: nothing queued, behind a queue, or not said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Idle,
    Queued,
    Unknown,
}

/// One estimated request: its time window, signed relative error, queue, whether another
/// Envoy raced it (`None`: not known), and the filter's own time over its observed TTFT.
struct Estimated {
    window: usize,
    error: f64,
    queue: Queue,
    raced: Option<bool>,
    /// Another request arrived at the same instant for the same worker.
    shared: bool,
    filter_share: Option<f64>,
}

/// Whether each record of `run` shares its arrival instant and worker with another successful
/// record (see [`EstimateError::after_warmup_idle_shared`]).
fn shared_instants(run: &RunResult) -> Vec<bool> {
    fn key(r: &RequestRecord) -> Option<(u64, &str)> {
        r.ok().then_some((r.at_ms.to_bits(), r.worker.as_deref()?))
    }
    let mut seen: std::collections::HashMap<(u64, &str), usize> = Default::default();
    for r in &run.records {
        if let Some(k) = key(r) {
            *seen.entry(k).or_default() += 1;
        }
    }
    let shared = |k| seen.get(&k).is_some_and(|&n| n > 1);
    run.records.iter().map(|r| key(r).is_some_and(shared)).collect()
}

/// Whether another Envoy raced each record of `run` (see
/// [`EstimateError::after_warmup_raced`]); `None` for records without their Envoy, and for
/// all of a run with one Envoy.
fn races(run: &RunResult) -> Vec<Option<bool>> {
    let recs = &run.records;
    let envoys: std::collections::BTreeSet<usize> = recs.iter().filter_map(|r| r.envoy).collect();
    if envoys.len() < 2 {
        return vec![None; recs.len()];
    }
    // Records' times are engine time: the wall-clock window scaled by the workers' speedup.
    let window = RACE_WALL_MS * run.speedup.max(0.0);
    let mut by_arrival: Vec<usize> =
        (0..recs.len()).filter(|&i| recs[i].at_ms.is_finite()).collect();
    by_arrival.sort_by(|&a, &b| recs[a].at_ms.total_cmp(&recs[b].at_ms));
    let mut out = vec![None; recs.len()];
    for (k, &i) in by_arrival.iter().enumerate() {
        let r = &recs[i];
        let (Some(envoy), Some(worker)) = (r.envoy, r.worker.as_deref()) else { continue };
        // Earlier arrivals within the window, and those at the same instant after it in order.
        let same_or_before =
            by_arrival[k + 1..].iter().take_while(|&&j| recs[j].at_ms <= r.at_ms).chain(
                by_arrival[..k].iter().rev().take_while(|&&j| r.at_ms - recs[j].at_ms <= window),
            );
        let raced = same_or_before.map(|&j| &recs[j]).any(|o| {
            o.envoy.is_some_and(|e| e != envoy)
                && o.worker.as_deref() == Some(worker)
                && o.ttft_ms.is_some_and(|t| r.at_ms < o.at_ms + t)
        });
        out[i] = Some(raced);
    }
    out
}

/// Every estimated request of a run.
fn errors(run: &RunResult) -> Vec<Estimated> {
    let ats: Vec<f64> = run.records.iter().map(|r| r.at_ms).filter(|a| a.is_finite()).collect();
    let lo = ats.iter().copied().reduce(f64::min).unwrap_or(0.0);
    let hi = ats.iter().copied().reduce(f64::max).unwrap_or(0.0);
    let raced = races(run);
    let shared = shared_instants(run);
    run.records
        .iter()
        .zip(raced.into_iter().zip(shared))
        .filter(|(r, _)| r.ok())
        .filter_map(|(r, (raced, shared))| {
            let (p, o) = (r.predicted_ttft_ms?, r.ttft_ms?);
            let e = (p - o) / o;
            if !(o > 0.0 && e.is_finite()) {
                return None;
            }
            let w =
                if hi > lo { ((r.at_ms - lo) / (hi - lo) * WINDOWS as f64) as usize } else { 0 };
            let queue = match r.predicted_wait_ms {
                Some(w) if w > 0.0 => Queue::Queued,
                Some(_) => Queue::Idle,
                None => Queue::Unknown,
            };
            // `decision_us` is wall-clock time; the records' times are engine time.
            let filter_share = r.decision_us.map(|us| us as f64 / 1000.0 * run.speedup / o);
            let window = w.min(WINDOWS - 1);
            Some(Estimated { window, error: e, queue, raced, shared, filter_share })
        })
        .collect()
}

/// The estimate error of `policy` over `runs`; `None` when no request carried an estimate.
pub fn estimate_error(policy: &str, runs: &[&RunResult]) -> Option<EstimateError> {
    let e: Vec<Estimated> = runs.iter().flat_map(|r| errors(r)).collect();
    if e.is_empty() {
        return None;
    }
    let abs = sorted(e.iter().map(|x| x.error.abs()));
    let signed = sorted(e.iter().map(|x| x.error));
    let windows = (0..WINDOWS)
        .map(|w| {
            let v = sorted(e.iter().filter(|x| x.window == w).map(|x| x.error.abs()));
            (v.len(), nearest_rank(&v, 0.5))
        })
        .collect();
    let warmed = || e.iter().filter(|x| x.window >= WARMUP_WINDOWS);
    let warm = sorted(warmed().map(|x| x.error.abs()));
    let split = |q| WaitSplit::of(warmed().filter(|x| x.queue == q).map(|x| x.error));
    let race = |r| WaitSplit::of(warmed().filter(|x| x.raced == Some(r)).map(|x| x.error));
    let idle = |shared| {
        let of = warmed().filter(|x| x.queue == Queue::Idle && x.shared == shared);
        WaitSplit::of(of.map(|x| x.error))
    };
    Some(EstimateError {
        policy: policy.to_owned(),
        runs: runs.len(),
        count: e.len(),
        median: nearest_rank(&abs, 0.5),
        median_signed: nearest_rank(&signed, 0.5),
        windows,
        after_warmup: nearest_rank(&warm, 0.5),
        after_warmup_count: warm.len(),
        after_warmup_idle: split(Queue::Idle),
        after_warmup_queued: split(Queue::Queued),
        after_warmup_raced: race(true),
        after_warmup_unraced: race(false),
        after_warmup_idle_shared: idle(true),
        after_warmup_idle_alone: idle(false),
        after_warmup_filter_share: nearest_rank(
            &sorted(warmed().filter_map(|x| x.filter_share)),
            0.5,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RequestRecord;

    fn run(records: Vec<RequestRecord>) -> RunResult {
        RunResult {
            policy: "kvroute".into(),
            workers: vec!["w0".into(), "w1".into(), "w2".into()],
            records,
            ..Default::default()
        }
    }

    fn sampled(worker: &str, whatif: &[Option<f64>]) -> RequestRecord {
        RequestRecord {
            status: 200,
            worker: Some(worker.into()),
            whatif_ms: whatif.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn regret_is_served_minus_best_what_if() {
        let r = run(vec![
            sampled("w1", &[Some(100.0), Some(150.0), Some(120.0)]), // 50
            sampled("w0", &[Some(100.0), Some(150.0), None]),        // 0
            sampled("w2", &[Some(100.0), Some(150.0), Some(100.5)]), // 0.5: zero
            sampled("w2", &[Some(100.0), Some(150.0), None]),        // served did not answer
            sampled("elsewhere", &[Some(1.0)]),                      // unknown worker
            RequestRecord { status: 200, worker: Some("w0".into()), ..Default::default() },
        ]);
        let (n, v) = regrets(&r);
        assert_eq!(n, 5);
        assert_eq!(v, vec![50.0, 0.0, 0.5]);
        let s = regret_stats("kvroute", &[&r, &r]);
        assert_eq!((s.runs, s.sampled, s.count), (2, 10, 6));
        assert_eq!((s.p50_ms, s.p90_ms, s.p99_ms), (Some(0.5), Some(50.0), Some(50.0)));
        assert!(s.zero_share.is_some_and(|z| (z - 4.0 / 6.0).abs() < 1e-12));
        assert_eq!(regret_stats("x", &[]).p50_ms, None);
        // Per repeat: both runs are repeat 0 here; a second repeat without regret has none.
        assert_eq!(s.per_repeat_p90_ms, vec![(0, Some(50.0))]);
        let other = RunResult { repeat: 1, records: vec![], ..r.clone() };
        let s = regret_stats("kvroute", &[&r, &other]);
        assert_eq!(s.per_repeat_p90_ms, vec![(0, Some(50.0)), (1, None)]);
    }

    #[test]
    fn older_regret_and_estimate_json_still_read() {
        let r: RegretStats = serde_json::from_str(
            r#"{"policy": "kvroute", "runs": 1, "sampled": 2, "count": 2, "p50_ms": 1.0,
                "p90_ms": 2.0, "p99_ms": 2.0, "zero_share": 0.5}"#,
        )
        .expect("older regret");
        assert!(r.per_repeat_p90_ms.is_empty());
        let e: EstimateError = serde_json::from_str(
            r#"{"policy": "kvroute", "runs": 1, "count": 2, "median": 0.1,
                "median_signed": -0.1, "windows": [[2, 0.1]]}"#,
        )
        .expect("older estimate");
        assert_eq!((e.after_warmup, e.after_warmup_count), (None, 0));
    }

    #[test]
    fn estimate_error_overall_and_per_window() {
        // 10 requests at 0, 100, .., 900 ms: one per window; observed 100 ms; predicted
        // 100 + 10 * i ms: error i / 10.
        let records: Vec<_> = (0..10)
            .map(|i| RequestRecord {
                at_ms: 100.0 * i as f64,
                status: 200,
                ttft_ms: Some(100.0),
                predicted_ttft_ms: Some(100.0 + 10.0 * i as f64),
                ..Default::default()
            })
            .collect();
        let r = run(records);
        let e = estimate_error("kvroute", &[&r]).expect("estimates");
        assert_eq!(e.count, 10);
        assert_eq!(e.median, Some(0.4));
        assert_eq!(e.median_signed, Some(0.4));
        assert_eq!(e.windows.len(), WINDOWS);
        assert_eq!(e.windows[0], (1, Some(0.0)));
        assert_eq!(e.windows[9], (1, Some(0.9)));
        // After warm-up: windows 3..=10, errors 0.2..=0.9; nearest-rank median is the 4th.
        assert_eq!((e.after_warmup, e.after_warmup_count), (Some(0.5), 8));
        // Without `decision_us`, no share of the filter's own time.
        assert_eq!(e.after_warmup_filter_share, None);
        // Without `predicted_wait_ms` (an older filter) neither split counts a request.
        assert_eq!(e.after_warmup_idle, WaitSplit::default());
        assert_eq!(e.after_warmup_queued, WaitSplit::default());
        assert!(estimate_error("least-request", &[&run(vec![])]).is_none());
    }

    #[test]
    fn the_error_after_warm_up_is_split_by_the_queue_the_estimate_saw() {
        // 20 requests at 0..1900 ms (two per window), observed 100 ms. Even ones had nothing
        // queued and were estimated 110 ms (10 %); odd ones were put behind a queue and
        // estimated 100 - 5 * i ms (too soon, more so as the run goes on).
        let records: Vec<_> = (0..20)
            .map(|i| RequestRecord {
                at_ms: 100.0 * i as f64,
                status: 200,
                ttft_ms: Some(100.0),
                predicted_ttft_ms: Some(if i % 2 == 0 { 110.0 } else { 100.0 - 5.0 * i as f64 }),
                predicted_wait_ms: Some(if i % 2 == 0 { 0.0 } else { 30.0 }),
                ..Default::default()
            })
            .collect();
        // The filter's own time: 1 ms of wall clock for the first 12 requests, 3 ms for the last
        // 8, of a 100 ms TTFT at twice the speed: 2 % and 6 % of engine time.
        let records: Vec<_> = records
            .into_iter()
            .enumerate()
            .map(|(i, r)| RequestRecord {
                decision_us: Some(if i < 12 { 1000 } else { 3000 }),
                ..r
            })
            .collect();
        let fast = RunResult { speedup: 2.0, ..run(records) };
        let e = estimate_error("kvroute", &[&fast]).expect("estimates");
        // After warm-up: requests 4..=19 (windows 3..=10 of a 1 900 ms span): 8 at 2 %, 8 at
        // 6 %; the nearest-rank median is the 8th.
        let share = e.after_warmup_filter_share.expect("a share");
        assert!((share - 0.02).abs() < 1e-9, "{share}");
        assert_eq!(e.after_warmup_count, 16);
        let idle = e.after_warmup_idle;
        assert_eq!(idle.count, 8);
        assert!(idle.median.is_some_and(|m| (m - 0.1).abs() < 1e-9), "{idle:?}");
        // Odd 5..=19: errors 0.25, 0.35, .., 0.95; the 4th of 8 is 0.55.
        let queued = e.after_warmup_queued;
        assert_eq!(queued.count, 8);
        assert!(queued.median.is_some_and(|m| (m - 0.55).abs() < 1e-9), "{queued:?}");
        // A report written before the split reads back with empty splits.
        let old = r#"{"policy": "kvroute", "runs": 1, "count": 2, "median": 0.1,
            "median_signed": 0.1, "windows": [], "after_warmup": 0.1, "after_warmup_count": 2}"#;
        let back: EstimateError = serde_json::from_str(old).expect("an older report");
        assert_eq!(back.after_warmup_queued, WaitSplit::default());
    }

    /// A request at `at_ms` sent through `envoy` to `worker`, observed 100 ms, estimated
    /// `predicted` ms.
    fn through(envoy: usize, worker: &str, at_ms: f64, predicted: f64) -> RequestRecord {
        RequestRecord {
            at_ms,
            envoy: Some(envoy),
            worker: Some(worker.into()),
            status: 200,
            ttft_ms: Some(100.0),
            predicted_ttft_ms: Some(predicted),
            ..Default::default()
        }
    }

    #[test]
    fn the_error_after_warm_up_is_split_by_races_between_envoys() {
        // Warm-up: two requests early on (the span is 0..1000 ms; windows 3..=10 from 200 ms).
        let mut records = vec![through(0, "w9", 0.0, 100.0), through(1, "w9", 1000.0, 100.0)];
        // Raced (estimated 150 ms, 50 %): envoy 1 at the same instant as envoy 0's request to
        // w0 (both raced), and 20 ms after envoy 0's request to w1.
        records.push(through(0, "w0", 300.0, 150.0));
        records.push(through(1, "w0", 300.0, 150.0));
        records.push(through(0, "w1", 400.0, 100.0));
        records.push(through(1, "w1", 420.0, 150.0));
        // Not raced (estimated 110 ms, 10 %): the other Envoy's request 30 ms before (outside
        // the window), the same Envoy's at the same instant, another worker, and one whose
        // first byte had come (its TTFT 4 ms).
        records.push(through(0, "w2", 500.0, 110.0));
        records.push(through(1, "w2", 530.0, 110.0));
        records.push(through(0, "w3", 600.0, 110.0));
        records.push(through(0, "w3", 600.0, 110.0));
        records.push(through(1, "w4", 700.0, 110.0));
        records.push(RequestRecord {
            ttft_ms: Some(4.0),
            predicted_ttft_ms: Some(4.4),
            ..through(0, "w5", 800.0, 0.0)
        });
        records.push(through(1, "w5", 805.0, 110.0));
        let r = run(records.clone());
        let e = estimate_error("kvroute", &[&r]).expect("estimates");
        // w1's first request (envoy 0 at 400 ms) was not raced: envoy 1's came after it.
        let raced = e.after_warmup_raced;
        assert_eq!(raced.count, 3, "{raced:?}");
        assert!(raced.median.is_some_and(|m| (m - 0.5).abs() < 1e-9), "{raced:?}");
        let unraced = e.after_warmup_unraced;
        assert_eq!(unraced.count, 9, "{unraced:?}");
        assert!(unraced.median.is_some_and(|m| (m - 0.1).abs() < 1e-9), "{unraced:?}");
        // At twice the speed, records' 30 ms is 15 ms of wall time: inside the window.
        let fast = RunResult { speedup: 2.0, ..run(records.clone()) };
        let e = estimate_error("kvroute", &[&fast]).expect("estimates");
        assert_eq!((e.after_warmup_raced.count, e.after_warmup_unraced.count), (4, 8));
        // With one Envoy (or records without theirs) neither split counts a request.
        let one: Vec<_> =
            records.iter().map(|r| RequestRecord { envoy: Some(0), ..r.clone() }).collect();
        let e = estimate_error("kvroute", &[&run(one)]).expect("estimates");
        assert_eq!((e.after_warmup_raced, e.after_warmup_unraced), Default::default());
        let none: Vec<_> =
            records.iter().map(|r| RequestRecord { envoy: None, ..r.clone() }).collect();
        let e = estimate_error("kvroute", &[&run(none)]).expect("estimates");
        assert_eq!(e.after_warmup_raced, WaitSplit::default());
    }

    #[test]
    fn requests_with_nothing_queued_are_split_by_company_at_their_instant() {
        let idle = |envoy, worker: &str, at_ms, predicted| RequestRecord {
            predicted_wait_ms: Some(0.0),
            ..through(envoy, worker, at_ms, predicted)
        };
        // Warm-up, then (after 200 ms of the 0..1000 span): two of the same instant on w0, one
        // through each Envoy and one through the same Envoy on w1 (estimated 140 ms: 40 %); w2
        // alone at 500 ms although w2 has another at 501 ms, and w3 alone (110 ms: 10 %).
        let mut records = vec![idle(0, "w9", 0.0, 100.0), idle(1, "w9", 1000.0, 110.0)];
        records.push(idle(0, "w0", 300.0, 140.0));
        records.push(idle(1, "w0", 300.0, 140.0));
        records.push(idle(0, "w1", 400.0, 140.0));
        records.push(idle(0, "w1", 400.0, 140.0));
        records.push(idle(0, "w2", 500.0, 110.0));
        records.push(idle(1, "w2", 501.0, 110.0));
        records.push(idle(1, "w3", 600.0, 110.0));
        // Behind a queue at the same instant: in neither split; a failed request at w3's
        // instant is no company.
        records.push(RequestRecord {
            predicted_wait_ms: Some(20.0),
            ..through(0, "w4", 700.0, 140.0)
        });
        records.push(RequestRecord {
            predicted_wait_ms: Some(20.0),
            ..through(1, "w4", 700.0, 140.0)
        });
        records.push(RequestRecord { status: 503, ..idle(0, "w3", 600.0, 110.0) });
        let e = estimate_error("kvroute", &[&run(records.clone())]).expect("estimates");
        let (shared, alone) = (e.after_warmup_idle_shared, e.after_warmup_idle_alone);
        assert_eq!((shared.count, alone.count), (4, 4), "{shared:?} {alone:?}");
        assert!(shared.median.is_some_and(|m| (m - 0.4).abs() < 1e-9), "{shared:?}");
        assert!(alone.median.is_some_and(|m| (m - 0.1).abs() < 1e-9), "{alone:?}");
        assert_eq!(shared.count + alone.count, e.after_warmup_idle.count);
        // Without the wait field, neither.
        let old: Vec<_> = records
            .iter()
            .map(|r| RequestRecord { predicted_wait_ms: None, ..r.clone() })
            .collect();
        let e = estimate_error("kvroute", &[&run(old)]).expect("estimates");
        assert_eq!((e.after_warmup_idle_shared.count, e.after_warmup_idle_alone.count), (0, 0));
    }
}
