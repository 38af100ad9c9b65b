//! Cohorts the report derives from the records, defined the same way for every policy:
//!
//! - `diverted`: a `hot-prefix` request served by a worker that did not yet hold the hot
//!   prefix, i.e. whose worker had not finished serving an earlier hot-prefix request before
//!   this one arrived: per worker, the earliest completion (`at_ms + e2e_ms`) of an ok
//!   hot-prefix request; a hot request is diverted when its worker's earliest completion is
//!   after its own arrival, or never comes. (The first hot request on each worker is
//!   diverted.) Requests that named no worker are in no `diverted` cohort.
//! - `during-burst`: `background` requests arriving within the hot burst's window, from the
//!   first to the last hot-prefix arrival (inclusive).
//! - Faults: for fault k (1-based, in the scenario's order) of kind K, `fK-K:before`,
//!   `fK-K:during` and `fK-K:after` by arrival time. "During" is `[at, at + duration)`; a
//!   one-off fault (worker loss, eviction) has no duration, and its "during" is the
//!   [`ONE_OFF_WINDOW_MS`] after it. Fault times are in schedule time, like arrivals: in a run
//!   at offered load ×k both fire k times sooner, so the windows are divided by k.
//!
//! The tag `routed-away` of older records (the worker serving most of the hot prefix) is
//! dropped: `diverted` replaces it.

use crate::cluster::{Fault, TimedFault};
use crate::record::RequestRecord;

pub const HOT: &str = "hot-prefix";
pub const BACKGROUND: &str = "background";
pub const DIVERTED: &str = "diverted";
pub const DURING_BURST: &str = "during-burst";
/// The "during" window of a fault without a duration.
pub const ONE_OFF_WINDOW_MS: u64 = 5000;
/// The older cohort `diverted` replaces.
const ROUTED_AWAY: &str = "routed-away";

fn kind(f: &Fault) -> &'static str {
    match f {
        Fault::WorkerLoss { .. } => "worker-loss",
        Fault::Evict { .. } => "evict",
        Fault::UpdaterOutage { .. } => "updater-outage",
        Fault::KnowledgeDelay { .. } => "knowledge-delay",
        Fault::EventOutage { .. } => "event-outage",
    }
}

/// The window `[start, end)` (ms from the start of the run) of a fault's "during" cohort.
pub fn fault_window(f: &TimedFault) -> (f64, f64) {
    let d = f.fault.duration().as_millis() as u64;
    let d = if d == 0 { ONE_OFF_WINDOW_MS } else { d };
    (f.at_ms as f64, (f.at_ms + d) as f64)
}

/// The cohort name of fault `i` (0-based) in `phase` (`before`, `during`, `after`).
pub fn fault_cohort(i: usize, f: &TimedFault, phase: &str) -> String {
    format!("f{}-{}:{phase}", i + 1, kind(&f.fault))
}

fn has(r: &RequestRecord, tag: &str) -> bool {
    r.cohorts.iter().any(|c| c == tag)
}

/// Which records are `diverted` (see the module doc).
pub fn diverted(records: &[RequestRecord]) -> Vec<bool> {
    let mut first_done: std::collections::HashMap<&str, f64> = Default::default();
    for r in records.iter().filter(|r| has(r, HOT) && r.ok()) {
        if let Some(w) = r.worker.as_deref() {
            let done = r.at_ms + r.e2e_ms;
            let e = first_done.entry(w).or_insert(done);
            *e = e.min(done);
        }
    }
    records
        .iter()
        .map(|r| {
            has(r, HOT)
                && r.worker
                    .as_deref()
                    .is_some_and(|w| first_done.get(w).is_none_or(|done| *done > r.at_ms))
        })
        .collect()
}

/// Every record's cohort tags: its own (without `routed-away`), then the derived ones;
/// `rate_scale` is the run's offered-load scale (fault windows are divided by it).
pub fn tags(records: &[RequestRecord], faults: &[TimedFault], rate_scale: f64) -> Vec<Vec<String>> {
    let div = diverted(records);
    let hot: Vec<f64> = records.iter().filter(|r| has(r, HOT)).map(|r| r.at_ms).collect();
    let burst = hot.iter().copied().reduce(f64::min).zip(hot.iter().copied().reduce(f64::max));
    records
        .iter()
        .zip(div)
        .map(|(r, diverted)| {
            let mut t: Vec<String> =
                r.cohorts.iter().filter(|c| *c != ROUTED_AWAY).cloned().collect();
            if diverted {
                t.push(DIVERTED.into());
            }
            if let Some((lo, hi)) = burst {
                if has(r, BACKGROUND) && r.at_ms >= lo && r.at_ms <= hi {
                    t.push(DURING_BURST.into());
                }
            }
            for (i, f) in faults.iter().enumerate() {
                let (lo, hi) = fault_window(f);
                let (lo, hi) = (lo / rate_scale, hi / rate_scale);
                let phase = if r.at_ms < lo {
                    "before"
                } else if r.at_ms < hi {
                    "during"
                } else {
                    "after"
                };
                t.push(fault_cohort(i, f, phase));
            }
            t
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(at_ms: f64, e2e_ms: f64, worker: &str, cohorts: &[&str]) -> RequestRecord {
        RequestRecord {
            at_ms,
            e2e_ms,
            status: 200,
            worker: Some(worker.into()),
            cohorts: cohorts.iter().map(|c| c.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn diverted_means_the_worker_had_not_yet_finished_a_hot_request() {
        let records = vec![
            rec(0.0, 100.0, "a", &[HOT]),           // first on a: diverted
            rec(50.0, 100.0, "a", &[HOT]),          // a finishes at 100: still diverted
            rec(150.0, 100.0, "a", &[HOT]),         // a holds it: not diverted
            rec(200.0, 100.0, "b", &[HOT]),         // first on b: diverted
            rec(210.0, 10.0, "c", &[HOT]),          // c never finishes one ok: diverted
            rec(220.0, 10.0, "a", &["background"]), // not hot
            RequestRecord { worker: None, ..rec(230.0, 1.0, "", &[HOT]) }, // no worker
        ];
        let mut c_failed = rec(205.0, 1.0, "c", &[HOT]);
        c_failed.status = 503;
        let mut all = records.clone();
        all.push(c_failed);
        assert_eq!(diverted(&all), vec![true, true, false, true, true, false, false, true]);
    }

    #[test]
    fn burst_and_fault_windows() {
        let faults = vec![
            TimedFault { at_ms: 100, fault: Fault::Evict { worker: 0, percent: 100 } },
            TimedFault { at_ms: 1000, fault: Fault::UpdaterOutage { duration_ms: 500 } },
        ];
        assert_eq!(fault_window(&faults[0]), (100.0, 5100.0));
        assert_eq!(fault_window(&faults[1]), (1000.0, 1500.0));
        let records = vec![
            rec(0.0, 1.0, "a", &[BACKGROUND, ROUTED_AWAY]),
            rec(1000.0, 1.0, "a", &[HOT]),
            rec(1200.0, 1.0, "b", &[BACKGROUND]),
            rec(1500.0, 1.0, "a", &[HOT]),
            rec(1600.0, 1.0, "a", &[BACKGROUND]),
        ];
        let t = tags(&records, &faults, 1.0);
        assert_eq!(t[0], ["background", "f1-evict:before", "f2-updater-outage:before"]);
        assert_eq!(t[1], ["hot-prefix", "diverted", "f1-evict:during", "f2-updater-outage:during"]);
        assert_eq!(
            t[2],
            ["background", "during-burst", "f1-evict:during", "f2-updater-outage:during"]
        );
        assert!(!t[3].contains(&DIVERTED.to_string()));
        assert_eq!(t[4], ["background", "f1-evict:during", "f2-updater-outage:after"]);
        // At load x2 the outage covers 500..750 ms of the run.
        let t = tags(&records[..1], &faults[1..], 2.0);
        assert_eq!(t[0], ["background", "f1-updater-outage:before"]);
        let late = [rec(600.0, 1.0, "a", &[])];
        assert_eq!(tags(&late, &faults[1..], 2.0)[0], ["f1-updater-outage:during"]);
    }
}
