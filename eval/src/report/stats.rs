//! The arithmetic behind the report: exact nearest-rank quantiles, per-cohort statistics, the
//! queue-imbalance measure and the ratios against the baseline policy.
//!
//! Everything here is pure; undefined values (a quantile of nothing, a rate over zero) are
//! `None`, never NaN, so the JSON report stays valid and round-trips.

use std::collections::BTreeSet;

use kvroute_core::decision::audit::classify;

use super::{AuditCounts, CohortStats, PrefillBalance, QueueStats, WorkerStats};
use crate::record::{RequestRecord, RunResult};

/// The finite values of `values`, sorted ascending.
pub(super) fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v
}

pub use kvroute_stack::nearest_rank;

/// `num / den` when `den` is positive and the result finite.
pub(super) fn rate(num: f64, den: f64) -> Option<f64> {
    let r = num / den;
    (den > 0.0 && r.is_finite()).then_some(r)
}

/// `value / base` when both are known and the base is positive.
pub(super) fn ratio(value: Option<f64>, base: Option<f64>) -> Option<f64> {
    rate(value?, base?)
}

/// Statistics of one cohort of one run (`records` are the cohort's members).
pub(super) fn cohort_stats(
    cohort: &str,
    records: &[&RequestRecord],
    span_s: Option<f64>,
    block_size: u32,
) -> CohortStats {
    let ok: Vec<&RequestRecord> = records.iter().copied().filter(|r| r.ok()).collect();
    let ttft = sorted(ok.iter().filter_map(|r| r.ttft_ms));
    let gaps = sorted(records.iter().flat_map(|r| r.gaps_ms.iter().copied()));
    let within_slo = records.iter().filter(|r| r.within_slo).count();

    let (mut prompt, mut cached) = (0u64, 0u64);
    for r in &ok {
        if let Some(p) = r.prompt_tokens {
            prompt += p;
            cached += r.cached_tokens.unwrap_or(0);
        }
    }

    let mut audit = AuditCounts::default();
    for r in records {
        let Some(predicted) = r.predicted_cached_tokens else { continue };
        match (r.ok(), r.prompt_tokens) {
            (true, Some(prompt)) => {
                let actual = r.cached_tokens.unwrap_or(0);
                audit.add(classify(predicted, actual, prompt, block_size));
            }
            _ => audit.unaudited += 1,
        }
    }

    CohortStats {
        cohort: cohort.to_owned(),
        requests: records.len(),
        ok: ok.len(),
        within_slo,
        ttft_p50_ms: nearest_rank(&ttft, 0.50),
        ttft_p90_ms: nearest_rank(&ttft, 0.90),
        ttft_p99_ms: nearest_rank(&ttft, 0.99),
        gap_p99_ms: nearest_rank(&gaps, 0.99),
        stalls: records.iter().map(|r| u64::from(r.stalls)).sum(),
        useful_per_s: span_s.and_then(|s| rate(within_slo as f64, s)),
        hit_rate: rate(cached as f64, prompt as f64),
        audit,
    }
}

/// Number of workers a run's queue samples describe: the topology, or more if a sample names a
/// worker index beyond it.
fn worker_count(run: &RunResult) -> usize {
    let sampled = run.queue.iter().map(|s| s.worker + 1).max().unwrap_or(0);
    run.workers.len().max(sampled)
}

/// Queue imbalance of a run and the number of sample instants it averages over.
///
/// Each worker's queue (`running + waiting`) is held from one sample to its next. At every
/// distinct sample time, once every worker that is ever sampled has been sampled at least once
/// (a worker never sampled counts as 0), the instant's imbalance is the busiest worker's queue
/// over the smallest busiest queue its total allows, `max_w q_w / ceil(sum_w q_w / N)`, over
/// all N workers; instants whose total is 0 are skipped. The result is the plain mean over
/// those instants: 1.0 when the queue is spread as evenly as whole requests allow (so a lone
/// request does not count as imbalance), up to N when one worker holds everything. Sampling is
/// periodic, so this is a time average.
pub(super) fn imbalance(run: &RunResult) -> (Option<f64>, usize) {
    let n = worker_count(run);
    let mut samples: Vec<_> = run.queue.iter().filter(|s| s.t_ms.is_finite()).collect();
    if n == 0 || samples.is_empty() {
        return (None, 0);
    }
    samples.sort_by(|a, b| a.t_ms.total_cmp(&b.t_ms));
    let needed = samples.iter().map(|s| s.worker).collect::<BTreeSet<_>>().len();

    let mut current = vec![0u64; n];
    let mut seen = vec![false; n];
    let mut seen_count = 0;
    let (mut sum, mut instants) = (0.0, 0usize);
    let mut i = 0;
    while i < samples.len() {
        let t = samples[i].t_ms;
        while i < samples.len() && samples[i].t_ms == t {
            let s = samples[i];
            current[s.worker] = u64::from(s.running) + u64::from(s.waiting);
            if !seen[s.worker] {
                seen[s.worker] = true;
                seen_count += 1;
            }
            i += 1;
        }
        if seen_count < needed {
            continue;
        }
        let total: u64 = current.iter().sum();
        let max = current.iter().copied().max().unwrap_or(0);
        if total > 0 {
            // The smallest possible busiest queue for this total is ceil(total / n).
            sum += max as f64 / total.div_ceil(n as u64) as f64;
            instants += 1;
        }
    }
    (rate(sum, instants as f64), instants)
}

/// Queue statistics of a run: imbalance, and per worker its mean and peak queue and its share
/// of the requests served (among requests that name a worker). Workers that served requests
/// but are not in the topology get rows of their own, without queue figures.
pub(super) fn queue_stats(run: &RunResult) -> QueueStats {
    let (imbalance, instants) = imbalance(run);
    let n = worker_count(run);
    let mut workers: Vec<WorkerStats> = (0..n)
        .map(|w| {
            let q: Vec<u64> = run
                .queue
                .iter()
                .filter(|s| s.worker == w)
                .map(|s| u64::from(s.running) + u64::from(s.waiting))
                .collect();
            WorkerStats {
                worker: run.workers.get(w).cloned().unwrap_or_else(|| format!("worker-{w}")),
                mean_queue: rate(q.iter().sum::<u64>() as f64, q.len() as f64),
                max_queue: q.iter().copied().max(),
                served: 0,
                share: None,
                prefill_tokens: 0,
            }
        })
        .collect();
    for r in &run.records {
        let Some(name) = r.worker.as_deref() else { continue };
        let i = match workers.iter().position(|w| w.worker == name) {
            Some(i) => i,
            None => {
                workers.push(WorkerStats {
                    worker: name.to_owned(),
                    mean_queue: None,
                    max_queue: None,
                    served: 0,
                    share: None,
                    prefill_tokens: 0,
                });
                workers.len() - 1
            }
        };
        workers[i].served += 1;
        workers[i].prefill_tokens += prefill_tokens(r);
    }
    let served: usize = workers.iter().map(|w| w.served).sum();
    for w in &mut workers {
        w.share = rate(w.served as f64, served as f64);
    }
    QueueStats { imbalance, instants, workers }
}

/// Prefill work of one request: `prompt_tokens − cached_tokens` when it succeeded and reported
/// its prompt, else 0.
fn prefill_tokens(r: &RequestRecord) -> u64 {
    match (r.ok(), r.prompt_tokens) {
        (true, Some(p)) => p.saturating_sub(r.cached_tokens.unwrap_or(0)),
        _ => 0,
    }
}

/// Prefill balance of a run: every worker of the topology (idle ones at 0) and any other that
/// served, the busiest and the idlest worker's prefill tokens over the mean.
pub(super) fn prefill_balance(run: &RunResult) -> PrefillBalance {
    let mut per: Vec<(String, u64)> = run.workers.iter().map(|w| (w.clone(), 0)).collect();
    for r in &run.records {
        let Some(name) = r.worker.as_deref() else { continue };
        let t = prefill_tokens(r);
        match per.iter_mut().find(|(w, _)| w == name) {
            Some((_, n)) => *n += t,
            None => per.push((name.to_owned(), t)),
        }
    }
    let mean = rate(per.iter().map(|(_, n)| *n as f64).sum(), per.len() as f64);
    let over = |v: Option<u64>| ratio(v.map(|v| v as f64), mean);
    PrefillBalance {
        max_over_mean: over(per.iter().map(|(_, n)| *n).max()),
        min_over_mean: over(per.iter().map(|(_, n)| *n).min()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::QueueSample;

    fn run_with(workers: usize, queue: Vec<QueueSample>) -> RunResult {
        RunResult {
            policy: "p".into(),
            workers: (0..workers).map(|w| format!("w{w}")).collect(),
            duration_s: 1.0,
            records: vec![],
            queue,
            ..Default::default()
        }
    }

    fn sample(t_ms: f64, worker: usize, running: u32, waiting: u32) -> QueueSample {
        QueueSample { t_ms, worker, running, waiting }
    }

    #[test]
    fn prefill_balance_counts_idle_workers() {
        let rec = |w: &str, prompt: u64, cached: u64| RequestRecord {
            status: 200,
            worker: Some(w.into()),
            prompt_tokens: Some(prompt),
            cached_tokens: Some(cached),
            ..Default::default()
        };
        let mut failed = rec("w1", 5000, 0);
        failed.status = 500;
        let mut run = run_with(3, vec![]);
        // w0: 100 + 200, w1: 300 (the failed request does not count), w2: idle.
        run.records = vec![rec("w0", 150, 50), rec("w0", 200, 0), rec("w1", 300, 0), failed];
        let b = prefill_balance(&run);
        assert_eq!(b.max_over_mean, Some(1.5));
        assert_eq!(b.min_over_mean, Some(0.0));
        let q = queue_stats(&run);
        let tokens: Vec<u64> = q.workers.iter().map(|w| w.prefill_tokens).collect();
        assert_eq!(tokens, vec![300, 300, 0]);
        assert_eq!(prefill_balance(&run_with(0, vec![])), PrefillBalance::default());
    }

    #[test]
    fn nearest_rank_edges() {
        assert_eq!(nearest_rank(&[], 0.5), None);
        assert_eq!(nearest_rank(&[7.0], 0.0), Some(7.0));
        assert_eq!(nearest_rank(&[7.0], 0.99), Some(7.0));
        assert_eq!(nearest_rank(&[1.0, 2.0], 0.5), Some(1.0));
        assert_eq!(nearest_rank(&[1.0, 2.0], 0.51), Some(2.0));
        assert_eq!(nearest_rank(&[1.0, 2.0], 1.0), Some(2.0));
        assert_eq!(sorted([3.0, f64::NAN, 1.0, f64::INFINITY].into_iter()), vec![1.0, 3.0]);
    }

    #[test]
    fn rates_and_ratios_are_none_when_undefined() {
        assert_eq!(rate(1.0, 0.0), None);
        assert_eq!(rate(0.0, 0.0), None);
        assert_eq!(rate(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(Some(2.0), None), None);
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(ratio(Some(2.0), Some(0.0)), None);
        assert_eq!(ratio(Some(3.0), Some(1.5)), Some(2.0));
    }

    #[test]
    fn imbalance_waits_for_every_sampled_worker_and_skips_idle_instants() {
        // Worker 1 is first sampled at t=10; the lone t=0 sample of worker 0 does not count.
        let run = run_with(
            2,
            vec![
                sample(0.0, 0, 5, 0),
                sample(10.0, 1, 1, 0),
                sample(10.0, 0, 1, 0),
                sample(20.0, 0, 0, 0),
                sample(20.0, 1, 0, 0),
                sample(30.0, 0, 3, 0),
                sample(30.0, 1, 0, 1),
            ],
        );
        let (imb, instants) = imbalance(&run);
        assert_eq!(instants, 2);
        // t=10: even (1.0); t=20: idle, skipped; t=30: 3 vs 1 -> 3 / 2 = 1.5.
        assert_eq!(imb, Some(1.25));
    }

    #[test]
    fn imbalance_handles_staggered_scrapes_and_unknown_indices() {
        // Scrapes of the two workers at different moments, worker index 2 beyond the topology.
        let run =
            run_with(2, vec![sample(0.0, 0, 2, 0), sample(1.0, 1, 2, 0), sample(2.0, 2, 2, 0)]);
        let (imb, instants) = imbalance(&run);
        assert_eq!(instants, 1);
        assert_eq!(imb, Some(1.0));
        assert_eq!(queue_stats(&run).workers.len(), 3);
        assert_eq!(imbalance(&run_with(3, vec![])), (None, 0));
        assert_eq!(imbalance(&run_with(0, vec![])), (None, 0));
    }
}
