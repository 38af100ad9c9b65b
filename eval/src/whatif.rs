//! What-if questions to simulated workers: `POST /sim/what_if` answers the TTFT a worker would
//! give a request if it arrived now (engine time, a forward simulation on a copy of its state),
//! without changing anything. The oracle policy routes on the answers; every other policy's
//! regret is measured against them.
//!
//! Any failure (a worker that is not a simulator, a refused request, a timeout) is `None`: the
//! harness records what it could learn and never fails a request for want of an answer.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// How long one worker may take to answer.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// A worker's answer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WhatIfReply {
    /// The TTFT it would give the request now (engine time, not divided by the speedup).
    pub ttft_ms: f64,
    /// Prompt tokens it would reuse from its cache.
    pub cached_tokens: u64,
    pub prompt_tokens: u64,
    /// Its queue now.
    pub running: u32,
    pub waiting: u32,
}

/// Asks `worker` (`ip:port`) what TTFT it would give `request` (the OpenAI body exactly as it
/// is sent to `endpoint`); `None` on any failure.
pub async fn ask(
    http: &reqwest::Client,
    worker: &str,
    endpoint: &str,
    request: &Value,
) -> Option<WhatIfReply> {
    let resp = http
        .post(format!("http://{worker}/sim/what_if"))
        .timeout(TIMEOUT)
        .json(&json!({"endpoint": endpoint, "request": request}))
        .send()
        .await
        .ok()?;
    if resp.status() != 200 {
        return None;
    }
    let w: WhatIfReply = resp.json().await.ok()?;
    (w.ttft_ms.is_finite() && w.ttft_ms >= 0.0).then_some(w)
}

/// Asks every worker at once; the answers in `workers`' order.
pub async fn ask_all(
    http: &reqwest::Client,
    workers: &[String],
    endpoint: &str,
    request: &Value,
) -> Vec<Option<WhatIfReply>> {
    futures::future::join_all(workers.iter().map(|w| ask(http, w, endpoint, request))).await
}

/// [`ask_all`] with how long each worker took to answer (a simulated worker answers at its
/// next step boundary, its TTFT counting from the question).
pub async fn ask_all_timed(
    http: &reqwest::Client,
    workers: &[String],
    endpoint: &str,
    request: &Value,
) -> Vec<(Option<WhatIfReply>, Duration)> {
    futures::future::join_all(workers.iter().map(|w| async move {
        let t = std::time::Instant::now();
        let a = ask(http, w, endpoint, request).await;
        (a, t.elapsed())
    }))
    .await
}

/// Every worker's what-if TTFT (ms, engine time), in `workers`' order.
pub async fn ttfts(
    http: &reqwest::Client,
    workers: &[String],
    endpoint: &str,
    request: &Value,
) -> Vec<Option<f64>> {
    ask_all(http, workers, endpoint, request)
        .await
        .into_iter()
        .map(|w| w.map(|w| w.ttft_ms))
        .collect()
}

/// The worker with the lowest known what-if TTFT (ties: the lowest index); `None` when no
/// worker answered.
pub fn best(whatif: &[Option<f64>]) -> Option<usize> {
    whatif
        .iter()
        .enumerate()
        .filter_map(|(i, t)| Some((i, (*t)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(i, _)| i)
}

/// How much worse `chosen` was than the best known worker (ms, >= 0); `None` when `chosen` has
/// no answer.
pub fn regret(whatif: &[Option<f64>], chosen: usize) -> Option<f64> {
    let mine = (*whatif.get(chosen)?)?;
    let best = whatif[best(whatif)?]?;
    Some((mine - best).max(0.0))
}

/// The index of the worker named `addr` (an `x-worker-id` value) in `workers`.
pub fn index_of(workers: &[String], addr: &str) -> Option<usize> {
    workers.iter().position(|w| w == addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_is_the_lowest_known_with_ties_to_the_lowest_index() {
        assert_eq!(best(&[Some(3.0), Some(1.0), Some(2.0)]), Some(1));
        assert_eq!(best(&[None, Some(5.0), Some(5.0)]), Some(1));
        assert_eq!(best(&[Some(5.0), None, Some(5.0)]), Some(0));
        assert_eq!(best(&[None, None]), None);
        assert_eq!(best(&[]), None);
        assert_eq!(best(&[Some(0.0)]), Some(0));
    }

    #[test]
    fn regret_against_the_best_known() {
        let w = [Some(10.0), Some(4.0), None];
        assert_eq!(regret(&w, 0), Some(6.0));
        assert_eq!(regret(&w, 1), Some(0.0));
        assert_eq!(regret(&w, 2), None, "the chosen worker did not answer");
        assert_eq!(regret(&w, 7), None, "no such worker");
        assert_eq!(regret(&[None, None], 0), None);
    }

    #[test]
    fn workers_by_address() {
        let w = vec!["127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()];
        assert_eq!(index_of(&w, "127.0.0.1:2"), Some(1));
        assert_eq!(index_of(&w, "127.0.0.1:3"), None);
    }

    #[test]
    fn answers_parse_from_the_contract() {
        let v = r#"{"ttft_ms": 12.5, "cached_tokens": 64, "prompt_tokens": 100, "running": 2, "waiting": 0}"#;
        let w: WhatIfReply = serde_json::from_str(v).unwrap();
        assert_eq!((w.ttft_ms, w.cached_tokens, w.running), (12.5, 64, 2));
    }

    #[tokio::test]
    async fn a_worker_that_cannot_answer_is_none() {
        // A port nothing listens on (bound, then released).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let http = reqwest::Client::new();
        let w = vec![format!("127.0.0.1:{port}")];
        assert_eq!(ttfts(&http, &w, "/v1/completions", &json!({})).await, vec![None]);
    }
}
