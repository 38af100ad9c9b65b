//! Worker-reported load from `/metrics` (vLLM and SGLang names), each value stamped with the
//! time it was observed; the LoRA adapters each worker has loaded (`/v1/models`); and Envoy's
//! view of which workers are in the pool (admin `/clusters`).

use std::collections::BTreeSet;

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
fn sample(text: &str, name: &str) -> Option<f64> {
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

/// Healthy hosts of `cluster` in Envoy's admin `/clusters` text output.
pub fn healthy_members(clusters: &str, cluster: &str) -> BTreeSet<String> {
    let prefix = format!("{cluster}::");
    clusters
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (host, tail) = rest.split_once("::")?;
            let flags = tail.strip_prefix("health_flags::")?;
            (flags == "healthy").then(|| host.to_owned())
        })
        .collect()
}

/// Scrapes every worker's `/metrics` and `/v1/models` every `interval`, storing the load and
/// the adapters each reports.
pub async fn run_scrape(
    state: std::sync::Arc<crate::state::State>,
    workers: Vec<String>,
    interval: std::time::Duration,
) {
    let http = reqwest::Client::new();
    loop {
        for w in &workers {
            let got = http
                .get(format!("http://{w}/metrics"))
                .timeout(std::time::Duration::from_secs(2))
                .send()
                .await;
            let text = match got {
                Ok(r) => crate::http_body::text(r, state.limits.max_http_body_bytes).await,
                Err(e) => Err(e.into()),
            };
            if let Err(crate::http_body::BodyError::TooLarge(_)) = &text {
                state.cap_hit(w, crate::limits::Cap::HttpBody);
            }
            if let Ok(text) = text {
                let load = parse_load(&text, crate::state::now_ms());
                state.update(w, |e| e.load = Some(load));
            }
            let served = crate::alignment::fetch_served(
                &http,
                w,
                state.models(),
                state.limits.max_http_body_bytes,
                &state.limits.adapters,
            )
            .await;
            match served {
                Ok(served) => {
                    crate::alignment::count_caps(&state, w, &served);
                    state.apply_served(w, served);
                }
                Err(crate::http_body::BodyError::TooLarge(_)) => {
                    state.cap_hit(w, crate::limits::Cap::HttpBody);
                }
                Err(_) => {}
            }
        }
        tokio::time::sleep(interval).await;
    }
}

/// Follows Envoy's admin `/clusters`: a worker Envoy's health checks drop leaves the pool, its
/// blocks are purged and its events ignored; when it returns, its stream is resynced from
/// replay. Without an answer from Envoy (or without the cluster in it) membership stays as is.
pub async fn run_membership(
    state: std::sync::Arc<crate::state::State>,
    admin: String,
    cluster: String,
    workers: Vec<String>,
) {
    let http = reqwest::Client::new();
    let listed = format!("{cluster}::");
    loop {
        let text = match http
            .get(format!("{admin}/clusters"))
            .timeout(std::time::Duration::from_secs(2))
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => r.text().await.ok(),
            _ => None,
        };
        if let Some(text) = text.filter(|t| t.contains(&listed)) {
            let healthy = healthy_members(&text, &cluster);
            for w in &workers {
                let member = healthy.contains(w);
                state.update(w, |e| {
                    if e.member != member {
                        e.knowledge.clear();
                        e.knowledge.next_seq = None;
                    }
                    e.member = member;
                });
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
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

    #[test]
    fn reads_healthy_hosts_from_envoy_clusters() {
        let text = "workers::127.0.0.1:8001::health_flags::healthy\n\
                    workers::127.0.0.1:8002::health_flags::/failed_active_hc\n\
                    workers::127.0.0.1:8001::cx_active::0\n\
                    other::127.0.0.1:9::health_flags::healthy\n";
        let m = healthy_members(text, "workers");
        assert_eq!(m.into_iter().collect::<Vec<_>>(), vec!["127.0.0.1:8001".to_string()]);
    }
}
