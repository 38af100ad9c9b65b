//! Reading what an inference engine reports about itself on `/metrics` (Prometheus text):
//! vLLM's gauges, or SGLang's where vLLM's are absent. The one reader shared by the updater
//! (which scrapes load for the filter) and the evaluation harness (which samples queues).

use serde::Serialize;

/// Load a worker reported about itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReportedLoad {
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    /// KV-cache usage, 0..1.
    pub kv_usage: Option<f64>,
    /// Unix ms of the scrape.
    pub observed_at_ms: u64,
}

/// The samples of `name` in a Prometheus text exposition, summed over label sets (one per
/// engine of a data-parallel worker); `name{labels} value [timestamp]`.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    samples(text, name).map(|(_, v)| v).reduce(|a, b| a + b)
}

/// Every sample of `name`: its label block (without braces; empty when unlabelled) and value.
fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines().filter(|l| !l.starts_with('#')).filter_map(move |l| {
        let rest = l.strip_prefix(name)?;
        let (labels, values) = match rest.strip_prefix('{') {
            Some(labelled) => labelled.rsplit_once('}')?,
            None if rest.starts_with(' ') => ("", rest),
            None => return None,
        };
        Some((labels, values.split_whitespace().next()?.parse::<f64>().ok()?))
    })
}

/// The value of label `key` in a label block (`a="x",b="y"`); values with escaped quotes are
/// not needed for the labels read here and read as cut at the escape.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while !rest.is_empty() {
        let (k, after) = rest.split_once("=\"")?;
        let (v, tail) = after.split_once('"')?;
        if k.trim().trim_start_matches(',').trim() == key {
            return Some(v);
        }
        rest = tail.trim_start_matches(',');
    }
    None
}

/// How a gauge's per-rank values make the worker's one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Combine {
    /// Counts (requests): each data-parallel rank has its own.
    Sum,
    /// Fractions (KV usage): the worker's is the ranks' mean.
    Mean,
}

/// One worker's value of gauge `name`, read the way the engines export it:
/// - SGLang with priority scheduling exports the total under `priority=""` plus one sample per
///   priority: only the total (a sample without the label, or with it empty) counts;
/// - SGLang with `--enable-metrics-for-all-schedulers` exports every TP (and PP) rank of one
///   data-parallel rank, each the same batch: one sample per data-parallel rank counts (the
///   lowest `pp_rank`, then `tp_rank`);
/// - data-parallel ranks (`dp_rank`, SGLang) and engines (`engine`, vLLM) are separate
///   schedulers: counts are summed over them, fractions averaged.
fn gauge(text: &str, name: &str, how: Combine) -> Option<f64> {
    let rank = |labels: &str, key: &str| -> u64 {
        label(labels, key).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    // (dp_rank, engine) -> ((pp_rank, tp_rank), value) of the lowest ranks seen.
    let mut groups: std::collections::BTreeMap<(String, String), ((u64, u64), f64)> =
        std::collections::BTreeMap::new();
    for (labels, value) in samples(text, name) {
        if label(labels, "priority").is_some_and(|p| !p.is_empty()) {
            continue;
        }
        let key = (
            label(labels, "dp_rank").unwrap_or_default().to_owned(),
            label(labels, "engine").unwrap_or_default().to_owned(),
        );
        let order = (rank(labels, "pp_rank"), rank(labels, "tp_rank"));
        let slot = groups.entry(key).or_insert((order, value));
        if order < slot.0 {
            *slot = (order, value);
        }
    }
    if groups.is_empty() {
        return None;
    }
    let total: f64 = groups.values().map(|(_, v)| v).sum();
    Some(match how {
        Combine::Sum => total,
        Combine::Mean => total / groups.len() as f64,
    })
}

/// Reads vLLM's gauges, or SGLang's where vLLM's are absent.
pub fn parse_load(text: &str, observed_at_ms: u64) -> ReportedLoad {
    use Combine::{Mean, Sum};
    ReportedLoad {
        running: gauge(text, "vllm:num_requests_running", Sum)
            .or_else(|| gauge(text, "sglang:num_running_reqs", Sum)),
        waiting: gauge(text, "vllm:num_requests_waiting", Sum)
            .or_else(|| gauge(text, "sglang:num_queue_reqs", Sum)),
        kv_usage: gauge(text, "vllm:kv_cache_usage_perc", Mean)
            .or_else(|| gauge(text, "vllm:gpu_cache_usage_perc", Mean))
            .or_else(|| gauge(text, "sglang:token_usage", Mean)),
        observed_at_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_and_sglang_gauges() {
        let vllm = "# HELP x\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\nvllm:num_requests_waiting{model_name=\"m\"} 1\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n";
        assert_eq!(
            parse_load(vllm, 7),
            ReportedLoad {
                running: Some(3.0),
                waiting: Some(1.0),
                kv_usage: Some(0.25),
                observed_at_ms: 7
            }
        );
        let sglang = "sglang:num_running_reqs{model_name=\"m\"} 5.0\nsglang:num_queue_reqs{model_name=\"m\"} 2.0\nsglang:token_usage{model_name=\"m\"} 0.5\n";
        let l = parse_load(sglang, 1);
        assert_eq!((l.running, l.waiting, l.kv_usage), (Some(5.0), Some(2.0), Some(0.5)));
        assert_eq!(parse_load("vllm:num_requests_running_total 9\n", 0).running, None);
        let two_engines = "vllm:num_requests_running{engine=\"0\"} 1 1700000000\nvllm:num_requests_running{engine=\"1\"} 2\n";
        assert_eq!(parse_load(two_engines, 0).running, Some(3.0));
    }

    /// SGLang 0.5.23 with priority scheduling: the total under `priority=""`, then one sample
    /// per priority (observability/metrics_collector.py `_log_gauge_queue_count`).
    #[test]
    fn sglang_priority_breakdown_is_not_added_to_the_total() {
        let m = "sglang:num_running_reqs{engine_type=\"unified\",model_name=\"m\",moe_ep_rank=\"0\",pp_rank=\"0\",priority=\"\",tp_rank=\"0\"} 5.0\n\
                 sglang:num_running_reqs{engine_type=\"unified\",model_name=\"m\",moe_ep_rank=\"0\",pp_rank=\"0\",priority=\"0\",tp_rank=\"0\"} 3.0\n\
                 sglang:num_running_reqs{engine_type=\"unified\",model_name=\"m\",moe_ep_rank=\"0\",pp_rank=\"0\",priority=\"10\",tp_rank=\"0\"} 2.0\n\
                 sglang:num_queue_reqs{model_name=\"m\",priority=\"\",tp_rank=\"0\"} 4.0\n\
                 sglang:num_queue_reqs{model_name=\"m\",priority=\"1\",tp_rank=\"0\"} 4.0\n";
        let l = parse_load(m, 0);
        assert_eq!((l.running, l.waiting), (Some(5.0), Some(4.0)));
    }

    /// `--enable-metrics-for-all-schedulers`: every TP rank exports the same batch.
    #[test]
    fn sglang_every_tp_rank_counts_once() {
        let m = "sglang:num_running_reqs{model_name=\"m\",pp_rank=\"0\",tp_rank=\"1\"} 7.0\n\
                 sglang:num_running_reqs{model_name=\"m\",pp_rank=\"0\",tp_rank=\"0\"} 6.0\n\
                 sglang:num_running_reqs{model_name=\"m\",pp_rank=\"0\",tp_rank=\"2\"} 7.0\n\
                 sglang:token_usage{model_name=\"m\",tp_rank=\"0\"} 0.4\n\
                 sglang:token_usage{model_name=\"m\",tp_rank=\"1\"} 0.4\n";
        let l = parse_load(m, 0);
        assert_eq!((l.running, l.kv_usage), (Some(6.0), Some(0.4)));
    }

    /// `--dp-size 2`: requests add up over the ranks, token usage is their mean (never > 1).
    #[test]
    fn sglang_data_parallel_ranks() {
        let m = "sglang:num_running_reqs{dp_rank=\"0\",tp_rank=\"0\"} 3.0\n\
                 sglang:num_running_reqs{dp_rank=\"1\",tp_rank=\"1\"} 4.0\n\
                 sglang:token_usage{dp_rank=\"0\",tp_rank=\"0\"} 0.8\n\
                 sglang:token_usage{dp_rank=\"1\",tp_rank=\"1\"} 0.6\n";
        let l = parse_load(m, 0);
        assert_eq!(l.running, Some(7.0));
        assert!((l.kv_usage.unwrap() - 0.7).abs() < 1e-9, "{l:?}");
    }
}
