use super::*;

#[test]
fn reads_vllm_and_sglang_gauges() {
    let vllm = "# HELP x\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\nvllm:num_requests_waiting{model_name=\"m\"} 1\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n";
    assert_eq!(
        parse_load(vllm, 7),
        EngineLoad {
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

/// An exposition shaped as vLLM's Python `prometheus_client` writes it (v1 metrics/loggers.py
/// names; `_created` samples, histograms, the waiting-by-reason split, process metrics).
const VLLM_LIKE: &str = r#"# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 2.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 4.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 0.0
# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="Qwen/Qwen3-8B",reason="capacity"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 2048.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 9.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 9.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 0.75
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="27000",prefix_caching_hash_algo="sha256_cbor"} 1.0
"#;

#[test]
fn reads_a_vllm_shaped_exposition() {
    let m = EngineMetrics::parse(VLLM_LIKE);
    let l = m.load(5);
    assert_eq!((l.running, l.waiting), (Some(3.0), Some(4.0)));
    assert_eq!(l.kv_usage, Some(0.375));
    assert_eq!(m.block_size(), Some(16));
    assert_eq!(m.sum("vllm:prefix_cache_queries_total"), Some(2048.0));
    assert_eq!(m.sum("python_gc_objects_collected_total"), Some(12345.0));
    // A histogram's buckets are not a gauge.
    assert_eq!(m.sum("vllm:time_to_first_token_seconds_bucket"), None);
}

/// The simulator's `/metrics` (what the integration stacks scrape).
#[test]
fn reads_the_simulators_exposition() {
    let st = kvroute_sim::engine::EngineStats {
        running: 2,
        waiting: 3,
        kv_usage: 0.125,
        ..Default::default()
    };
    let text = kvroute_sim::metrics::render("org/model", 32, 1000, &st);
    let m = EngineMetrics::parse(&text);
    let l = m.load(0);
    assert_eq!((l.running, l.waiting, l.kv_usage), (Some(2.0), Some(3.0), Some(0.125)));
    assert_eq!(m.block_size(), Some(32));
}

#[test]
fn block_sizes_from_vllm_and_sglang() {
    let vllm = EngineMetrics::parse("vllm:cache_config_info{block_size=\"32\",engine=\"0\"} 1.0\n");
    assert_eq!(vllm.block_size(), Some(32));
    assert_eq!(EngineMetrics::parse("nothing").block_size(), None);
    assert_eq!(EngineMetrics::parse("sglang:page_size 1.0\n").sglang_page_size(), Some(1));
    let zero = EngineMetrics::parse("sglang:page_size_other 8\nsglang:page_size 0\n");
    assert_eq!(zero.sglang_page_size(), None);
}

#[test]
fn colons_are_spelled_only_in_names() {
    assert_eq!(colon_free("a:b{x=\"1:2\"} 3"), format!("a{COLON}b{{x=\"1:2\"}} 3"));
    assert_eq!(colon_free("# TYPE a:b gauge"), format!("# TYPE a{COLON}b gauge"));
    assert_eq!(colon_free("# HELP a:b at 10:00"), format!("# HELP a{COLON}b at 10:00"));
    assert_eq!(colon_free("plain{x=\"1:2\"} 3"), "plain{x=\"1:2\"} 3");
    assert_eq!(colon_free("# a comment: no name"), "# a comment: no name");
}

#[test]
fn histogram_buckets_summed_over_label_sets() {
    let typed = "# TYPE kvroute_sim:step_lag_seconds histogram\n\
        kvroute_sim:step_lag_seconds_bucket{model_name=\"m\",le=\"0.001\"} 90\n\
        kvroute_sim:step_lag_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 100\n\
        kvroute_sim:step_lag_seconds_bucket{model_name=\"n\",le=\"0.001\"} 1\n\
        kvroute_sim:step_lag_seconds_bucket{model_name=\"n\",le=\"+Inf\"} 2\n\
        kvroute_sim:step_lag_seconds_sum{model_name=\"m\"} 0.2\n";
    let want = vec![(0.001, 91), (f64::INFINITY, 102)];
    let m = EngineMetrics::parse(typed);
    assert_eq!(m.histogram("kvroute_sim:step_lag_seconds"), Some(want.clone()));
    // Without its TYPE line, from the `_bucket` samples' `le` labels.
    let untyped: String = typed.lines().skip(1).map(|l| format!("{l}\n")).collect();
    let m = EngineMetrics::parse(&untyped);
    assert_eq!(m.histogram("kvroute_sim:step_lag_seconds"), Some(want));
    assert_eq!(m.histogram("vllm:time_to_first_token_seconds"), None);
    let vllm = EngineMetrics::parse(VLLM_LIKE);
    let ttft = vllm.histogram("vllm:time_to_first_token_seconds");
    assert_eq!(ttft, Some(vec![(0.001, 0), (f64::INFINITY, 9)]));
}

/// The load read from only the load gauges' lines equals the load read from the whole
/// exposition: on the vLLM-shaped one, the simulator's, and seeded random mixes of wanted and
/// unwanted lines (other metrics, histograms, comments, labels with colons and braces).
#[test]
fn the_load_gauges_alone_read_as_the_whole_exposition() {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let st = kvroute_sim::engine::EngineStats {
        running: 4,
        waiting: 1,
        kv_usage: 0.5,
        ..Default::default()
    };
    let sim = kvroute_sim::metrics::render("org/model", 16, 1000, &st);
    let mut texts = vec![VLLM_LIKE.to_owned(), sim];
    let names = [
        "vllm:num_requests_running",
        "vllm:num_requests_running_total",
        "vllm:num_requests_waiting",
        "vllm:num_requests_waiting_by_reason",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "vllm:time_to_first_token_seconds",
        "python_gc_objects_collected_total",
    ];
    let kinds = ["gauge", "counter", "histogram", "untyped"];
    for seed in 0..200u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut t = String::new();
        for _ in 0..rng.random_range(0..30) {
            let n = names[rng.random_range(0..names.len())];
            match rng.random_range(0..8) {
                0 => t += &format!("# TYPE {n} {}\n", kinds[rng.random_range(0..kinds.len())]),
                1 => t += &format!("# HELP {n} at 10:00 {{x}}\n"),
                2 => t += "# a comment: no name\n",
                3 => t += &format!("{n}_bucket{{le=\"{}\"}} 3\n", rng.random_range(0..4)),
                4 => t += &format!("  {n} {}\n", rng.random_range(0..9)),
                _ => {
                    let (e, p, v) =
                        (rng.random_range(0..3), rng.random_range(0..3), rng.random_range(0..90));
                    t += &format!("{n}{{engine=\"{e}\",priority=\"{p}\",x=\"a:{{b}}\"}} {v}.5\n");
                }
            }
        }
        texts.push(t);
    }
    for t in &texts {
        let whole = EngineMetrics::parse(t).load(3);
        assert_eq!(parse_load(t, 3), whole, "{t}");
    }
}
