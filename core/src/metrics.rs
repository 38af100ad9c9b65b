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
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let values = match rest.strip_prefix('{') {
                Some(labelled) => labelled.rsplit_once('}')?.1,
                None if rest.starts_with(' ') => rest,
                None => return None,
            };
            values.split_whitespace().next()?.parse::<f64>().ok()
        })
        .reduce(|a, b| a + b)
}

/// Reads vLLM's gauges, or SGLang's where vLLM's are absent.
pub fn parse_load(text: &str, observed_at_ms: u64) -> ReportedLoad {
    ReportedLoad {
        running: sample(text, "vllm:num_requests_running")
            .or_else(|| sample(text, "sglang:num_running_reqs")),
        waiting: sample(text, "vllm:num_requests_waiting")
            .or_else(|| sample(text, "sglang:num_queue_reqs")),
        kv_usage: sample(text, "vllm:kv_cache_usage_perc")
            .or_else(|| sample(text, "vllm:gpu_cache_usage_perc"))
            .or_else(|| sample(text, "sglang:token_usage")),
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
}
