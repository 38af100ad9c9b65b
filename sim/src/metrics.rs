//! `/metrics` in Prometheus text format with vLLM's metric names and labels, plus the
//! simulator's own scheduling-lag histogram (`kvroute_sim:step_lag_seconds`).

use std::fmt::Write;

use crate::engine::{EngineStats, Histogram, BUCKETS};

fn histogram(o: &mut String, name: &str, help: &str, labels: &str, h: &Histogram) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cum = 0;
    for (b, n) in BUCKETS.iter().zip(&h.counts) {
        cum += n;
        let _ = writeln!(o, "{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
    }
    let _ = writeln!(o, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(o, "{name}_sum{{{labels}}} {}", h.sum);
    let _ = writeln!(o, "{name}_count{{{labels}}} {}", h.count);
}

pub fn render(model: &str, block_size: usize, num_gpu_blocks: usize, st: &EngineStats) -> String {
    let l = format!("engine=\"0\",model_name=\"{model}\"");
    let mut o = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{l}}} {value}");
    };
    metric(
        "vllm:num_requests_running",
        "gauge",
        "Requests in the running batch.",
        st.running.to_string(),
    );
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Requests waiting to be scheduled.",
        st.waiting.to_string(),
    );
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage, 1 means 100 percent.",
        format!("{:.6}", st.kv_usage),
    );
    metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix-cache queries, in tokens.",
        st.prefix_queries_tokens.to_string(),
    );
    metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix-cache hits, in tokens.",
        st.prefix_hits_tokens.to_string(),
    );
    metric(
        "vllm:prompt_tokens_total",
        "counter",
        "Prefill tokens processed.",
        st.prompt_tokens_total.to_string(),
    );
    metric(
        "vllm:generation_tokens_total",
        "counter",
        "Generation tokens processed.",
        st.generation_tokens_total.to_string(),
    );
    metric(
        "vllm:request_success_total",
        "counter",
        "Finished requests.",
        st.requests_finished.to_string(),
    );
    metric(
        "kvroute_sim:cached_blocks",
        "gauge",
        "Blocks in the prefix cache (in use or free).",
        st.cached_blocks.to_string(),
    );
    let _ = writeln!(
        o,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{block_size}\",enable_prefix_caching=\"True\",\
         engine=\"0\",num_gpu_blocks=\"{num_gpu_blocks}\"}} 1.0"
    );
    histogram(
        &mut o,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &l,
        &st.ttft,
    );
    histogram(
        &mut o,
        "kvroute_sim:step_lag_seconds",
        "Actual minus intended start of scheduler steps.",
        &l,
        &st.step_lag,
    );
    o
}
