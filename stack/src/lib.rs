//! kvroute-stack: starts real Envoy (with the kvroute wasm filter or a baseline policy)
//! in front of simulated workers on loopback, drives OpenAI traffic through it, and measures.
//!
//! Where to start: [`stack::Stack::start`] brings a whole stack up and tears it down on drop;
//! [`client`] sends chat requests and records per-request timings; [`workload`] makes seeded
//! multi-turn conversations. Built on it: the integration tests (`kvroute-integration`), the
//! command-line tools such as `kvroute-up` (`kvroute-tools`) and the evaluation harness behind
//! `kvroute-bench` (`kvroute-eval`).
//! Every process started here is killed when its guard drops, also when a test fails.

pub mod client;
pub mod dashboard;
pub mod dynamo;
pub mod engines;
pub mod envoy;
pub mod help;
pub mod paths;
pub mod peers;
pub mod process;
pub mod rawhttp;
pub mod replicas;
pub mod sglang_face;
pub mod siege;
pub mod sim;
pub mod stack;
pub mod workload;

use std::time::{Duration, Instant};

/// Polls `check` every 50 ms until it returns `Some`, or fails after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_every(what, timeout, Duration::from_millis(50), check).await
}

/// [`eventually`], polling every `every`.
pub async fn eventually_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Exact nearest-rank quantile of ascending `sorted` values: the smallest value with at least a
/// fraction `p` of the values at or below it (rank `ceil(p * n)`, at least 1). `None` when empty.
pub fn nearest_rank(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (p.clamp(0.0, 1.0) * n as f64).ceil() as usize;
    sorted.get(rank.clamp(1, n) - 1).copied()
}

/// [`nearest_rank`] of `values` in any order (a sorted copy is read; NaNs sort last).
pub fn quantile(values: &[f64], p: f64) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    nearest_rank(&sorted, p)
}
