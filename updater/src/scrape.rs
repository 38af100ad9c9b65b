//! Worker-reported load from `/metrics` (vLLM and SGLang names, read by [`crate::engine_metrics`]),
//! each value stamped with the time it was observed; the LoRA adapters each worker has loaded
//! (`/v1/models`); and Envoy's view of which workers are in the pool (admin `/clusters`).

use std::collections::BTreeSet;

use crate::engine_metrics::parse_load;

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
/// the adapters each reports; one [`run_scrape_worker`] each.
pub async fn run_scrape(
    state: std::sync::Arc<crate::state::State>,
    workers: Vec<String>,
    interval: std::time::Duration,
) {
    let each =
        workers.into_iter().map(|w| run_scrape_worker(std::sync::Arc::clone(&state), w, interval));
    futures::future::join_all(each).await;
}

/// Scrapes one worker's `/metrics` and `/v1/models` every `interval`; ends when the worker is
/// no longer known.
pub async fn run_scrape_worker(
    state: std::sync::Arc<crate::state::State>,
    w: String,
    interval: std::time::Duration,
) {
    let http = reqwest::Client::new();
    while state.knows(&w) {
        scrape_once(&state, &http, &w).await;
        tokio::time::sleep(interval).await;
    }
}

async fn scrape_once(state: &crate::state::State, http: &reqwest::Client, w: &str) {
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
        state.set_load(w, load);
    }
    let served = crate::alignment::fetch_served(
        http,
        w,
        state.models(),
        state.limits.max_http_body_bytes,
        &state.limits.adapters,
    )
    .await;
    match served {
        Ok(served) => {
            crate::alignment::count_caps(state, w, &served);
            state.apply_served(w, served);
        }
        Err(crate::http_body::BodyError::TooLarge(_)) => {
            state.cap_hit(w, crate::limits::Cap::HttpBody);
        }
        Err(_) => {}
    }
}

/// Follows Envoy's admin `/clusters`: a worker Envoy's health checks drop leaves the pool, its
/// blocks are purged and its events ignored; when it returns, its stream is resynced from
/// replay. Without an answer from Envoy (or without the cluster in it) membership stays as is.
/// Every worker known at each pass is checked (discovered ones too).
pub async fn run_membership(
    state: std::sync::Arc<crate::state::State>,
    admin: String,
    cluster: String,
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
            for w in &state.workers() {
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
    fn reads_healthy_hosts_from_envoy_clusters() {
        let text = "workers::127.0.0.1:8001::health_flags::healthy\n\
                    workers::127.0.0.1:8002::health_flags::/failed_active_hc\n\
                    workers::127.0.0.1:8001::cx_active::0\n\
                    other::127.0.0.1:9::health_flags::healthy\n";
        let m = healthy_members(text, "workers");
        assert_eq!(m.into_iter().collect::<Vec<_>>(), vec!["127.0.0.1:8001".to_string()]);
    }
}
