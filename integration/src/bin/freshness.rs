//! kvroute-freshness: how long from a block being stored on a worker until kvroute's decisions
//! in Envoy credit it from events (worker → ZMQ → updater → snapshot → singleton → shared data
//! → filter thread). One worker, so a probe can only be credited from that worker's events.
//! Run: `target/release/kvroute-freshness` (after `./dev build`).

use std::time::{Duration, Instant};

use clap::Parser;
use kvroute_integration::client;
use kvroute_integration::stack::{Stack, StackOptions, MODEL};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "Block stored on a worker -> visible in kvroute's decisions, p50/p99")]
struct Args {
    #[arg(long, default_value_t = 40)]
    samples: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let opts = StackOptions { workers: 1, updater: true, ..Default::default() };
    let stack = Stack::start(opts).await?;
    let http = reqwest::Client::new();
    let worker = format!("http://{}", stack.workers[0].addr);
    let mut lags = Vec::new();
    for i in 0..a.samples {
        let body = json!({"model": MODEL, "max_tokens": 1,
            "messages": [{"role": "user", "content": kvroute_core::textgen::words(0xF7E5 + i, 300)}]});
        // Stored directly on the worker, not through Envoy: only its events can tell kvroute.
        let r = client::chat(&http, &worker, &body).await?;
        anyhow::ensure!(r.status == 200, "direct request failed");
        let stored = Instant::now();
        let deadline = stored + Duration::from_secs(10);
        loop {
            let p = client::chat(&http, &stack.base_url(), &body).await?;
            let from_events: u64 =
                p.decision_field("blocks_from_events").and_then(|v| v.parse().ok()).unwrap_or(0);
            if from_events > 0 {
                lags.push(stored.elapsed());
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "sample {i}: never visible");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    lags.sort();
    let q = |p: f64| lags[((lags.len() - 1) as f64 * p) as usize].as_secs_f64() * 1000.0;
    println!(
        "freshness over {} samples (stored on a worker -> credited from events in a decision, probe resolution ~5 ms): p50 {:.0} ms, p99 {:.0} ms (singleton tick 100 ms)",
        lags.len(),
        q(0.5),
        q(0.99)
    );
    Ok(())
}
