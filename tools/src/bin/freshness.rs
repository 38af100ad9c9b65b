//! kvroute-freshness: how fresh kvroute's knowledge is in its decisions.
//!
//! - `--mode events` (default): from a block being stored on a worker until kvroute's decisions
//!   in Envoy credit it from events (worker → ZMQ → updater → long poll → singleton → shared
//!   data → filter thread). One worker, so a probe can only be credited from its events.
//! - `--mode peers`: two Envoy replicas sharing one updater that follows no KV events: from a
//!   request sent through replica A (its decision) until a decision on replica B credits A's
//!   blocks (A's singleton → `POST /v1/peers` → updater → B's long poll → B's threads). A probe
//!   through B is itself a decision that credits the prompt, so each trial sends one fresh
//!   prompt through A and one probe through B `d` ms later; the fraction credited per `d` is
//!   the latency's distribution function, and its quantiles are read off the grid.
//!
//! Run: `target/release/kvroute-freshness [--mode peers]` (after `./dev build`).

use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use kvroute_stack::client;
use kvroute_stack::replicas::{ReplicaOptions, Replicas};
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// From a block stored on a worker until decisions credit it from KV events.
    Events,
    /// From a decision on replica A until replica B's decisions credit A's blocks.
    Peers,
}

#[derive(Parser, Debug)]
#[command(about = "Knowledge freshness in kvroute's decisions, p50/p90/p99")]
struct Args {
    /// What to measure: knowledge from KV events, or from another Envoy replica's decisions.
    #[arg(long, value_enum, default_value_t = Mode::Events)]
    mode: Mode,
    /// Samples (events) or trials per delay (peers).
    #[arg(long, default_value_t = 100)]
    samples: u64,
    /// Probe delays after A's request in peers mode (ms).
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,3,4,6,8,10,13,17,25,40")]
    delays_ms: Vec<u64>,
}

fn prompt(seed: u64) -> serde_json::Value {
    json!({"model": MODEL, "max_tokens": 1,
        "messages": [{"role": "user", "content": kvroute_testkit::textgen::words(seed, 300)}]})
}

fn field(r: &client::Reply, key: &str) -> u64 {
    r.decision_field(key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

async fn events(samples: u64) -> anyhow::Result<()> {
    let opts = StackOptions { workers: 1, updater: true, ..Default::default() };
    let stack = Stack::start(opts).await?;
    let http = reqwest::Client::new();
    let worker = format!("http://{}", stack.workers[0].addr);
    let mut lags = Vec::new();
    for i in 0..samples {
        let body = prompt(0xF7E5 + i);
        // Stored directly on the worker, not through Envoy: only its events can tell kvroute.
        let r = client::chat(&http, &worker, &body).await?;
        anyhow::ensure!(r.status == 200, "direct request failed");
        let stored = Instant::now();
        let deadline = stored + Duration::from_secs(10);
        loop {
            let p = client::chat(&http, &stack.base_url(), &body).await?;
            if field(&p, "blocks_from_events") > 0 {
                lags.push(stored.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "sample {i}: never visible");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    lags.sort_by(f64::total_cmp);
    let q = |p: f64| kvroute_stack::nearest_rank(&lags, p).unwrap_or(f64::NAN);
    println!(
        "event -> credited over {} samples (stored on a worker -> credited from events in a decision, probe resolution ~5 ms, singleton long poll): p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms",
        lags.len(),
        q(0.5),
        q(0.9),
        q(0.99)
    );
    Ok(())
}

async fn peers(samples: u64, delays: &[u64]) -> anyhow::Result<()> {
    let r = Replicas::start(ReplicaOptions { workers: 1, ..Default::default() }).await?;
    r.wait_aligned().await?;
    let http = reqwest::Client::new();
    let mut seed = 0x000A_11CE_0000_u64;
    let mut rows = Vec::new();
    for &d in delays {
        let mut credited = 0u64;
        for _ in 0..samples {
            seed += 1;
            let body = prompt(seed);
            let start = Instant::now();
            let on_a = {
                let (http, url, body) = (http.clone(), r.a().base_url(), body.clone());
                tokio::spawn(async move { client::chat(&http, &url, &body).await })
            };
            tokio::time::sleep_until((start + Duration::from_millis(d)).into()).await;
            let probe = client::chat(&http, &r.b.base_url(), &body).await?;
            anyhow::ensure!(probe.status == 200, "probe failed: {}", probe.body);
            credited += u64::from(field(&probe, "blocks_from_peers") > 0);
            anyhow::ensure!(on_a.await??.status == 200, "request through A failed");
        }
        let frac = credited as f64 / samples as f64;
        println!(
            "  probe {d:>3} ms after A's request: credited from A in {:5.1} % of {samples}",
            frac * 100.0
        );
        rows.push((d, frac));
    }
    let q = |p: f64| {
        rows.iter()
            .find(|(_, f)| *f >= p)
            .map_or("> the largest delay".to_string(), |(d, _)| format!("<= {d} ms"))
    };
    println!(
        "decision on replica A -> credited in a decision on replica B ({} trials per delay, two Envoys, one updater without events): p50 {}, p90 {}, p99 {}",
        samples,
        q(0.5),
        q(0.9),
        q(0.99)
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    match a.mode {
        Mode::Events => events(a.samples).await,
        Mode::Peers => peers(a.samples, &a.delays_ms).await,
    }
}

kvroute_stack::help_test!(Args);
