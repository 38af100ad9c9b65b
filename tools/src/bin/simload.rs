//! kvroute-simload: N simulated workers in one `kvroute-sim` process under an open-loop
//! request rate; reports the process's CPU use (cores) and the engines' scheduling lag
//! (actual minus intended step start) from their `kvroute_sim:step_lag_seconds` histograms.
//! Run: `target/release/kvroute-simload` (after `./dev build`).

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use kvroute_stack::{client, paths, process::Guard};
use serde_json::json;
use tokio::process::Command;

#[derive(Parser, Debug)]
#[command(about = "CPU use and scheduling lag of many simulated workers in one process")]
struct Args {
    /// Simulated workers, all in one `kvroute-sim` process.
    #[arg(long, default_value_t = 16)]
    workers: u16,
    /// Requests per second, all workers together (open loop).
    #[arg(long, default_value_t = 50.0)]
    rate: f64,
    /// How long the load runs (s).
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Words per prompt (the demo tokenizer gives ~1.3 tokens a word).
    #[arg(long, default_value_t = 400)]
    prompt_words: usize,
    /// Output tokens per request (`max_tokens`).
    #[arg(long, default_value_t = 64)]
    max_tokens: u64,
}

/// utime + stime of `pid` in seconds.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit(')').next().context("bad /proc stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 =
        f.get(11).context("utime")?.parse::<f64>()? + f.get(12).context("stime")?.parse::<f64>()?;
    Ok(ticks / 100.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let dir = paths::scratch_dir("simload")?;
    let mut cmd = Command::new(paths::sim_bin()?);
    cmd.args(["--workers", &a.workers.to_string(), "--base-port", "0"]);
    let mut sim = Guard::spawn("kvroute-sim", cmd, &dir.join("sim.log"))?;
    let pid = sim.pid().context("sim pid")?;
    let mut addrs = Vec::new();
    for line in sim.wait_lines("listening on", a.workers.into(), Duration::from_secs(60)).await? {
        let addr = line
            .split_whitespace()
            .skip_while(|w| *w != "on")
            .nth(1)
            .context("address")?
            .to_owned();
        addrs.push(addr);
    }
    let http = reqwest::Client::new();
    let cpu0 = cpu_seconds(pid)?;
    let t0 = Instant::now();
    let total = (a.rate * a.seconds as f64) as usize;
    let gap = Duration::from_secs_f64(1.0 / a.rate);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        let url = format!("http://{}", addrs[i % addrs.len()]);
        // Eight shared system prompts, so caches see reuse as well as misses.
        let body = json!({"model": "kvroute-demo", "max_tokens": a.max_tokens, "stream": true,
            "messages": [{"role": "system", "content": kvroute_testkit::textgen::words((i % 8) as u64, a.prompt_words)},
                         {"role": "user", "content": kvroute_testkit::textgen::words(10_000 + i as u64, 30)}]});
        let http = http.clone();
        tokio::time::sleep_until(start + gap * i as u32).await;
        tasks.push(tokio::spawn(async move {
            client::chat(&http, &url, &body).await.map(|r| r.status)
        }));
    }
    let mut ok = 0;
    for t in tasks {
        if matches!(t.await, Ok(Ok(200))) {
            ok += 1;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let cores = (cpu_seconds(pid)? - cpu0) / wall;
    // Merge the per-worker lag histograms.
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for addr in &addrs {
        let text = http.get(format!("http://{addr}/metrics")).send().await?.text().await?;
        let metrics = kvroute_updater::engine_metrics::EngineMetrics::parse(&text);
        for (le, count) in metrics.histogram("kvroute_sim:step_lag_seconds").unwrap_or_default() {
            match buckets.iter_mut().find(|b| b.0 == le) {
                Some(b) => b.1 += count as f64,
                None => buckets.push((le, count as f64)),
            }
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let steps = buckets.last().map_or(0.0, |b| b.1);
    let p99 = buckets.iter().find(|b| b.1 >= 0.99 * steps).map_or(f64::NAN, |b| b.0);
    let p50 = buckets.iter().find(|b| b.1 >= 0.5 * steps).map_or(f64::NAN, |b| b.0);
    println!(
        "{} workers, {:.0} req/s for {} s: {ok}/{total} ok; kvroute-sim CPU {:.2} cores; {:.0} steps; \
         scheduling lag p50 <= {:.1} ms, p99 <= {:.1} ms (bucket bounds)",
        a.workers, a.rate, a.seconds, cores, steps, p50 * 1000.0, p99 * 1000.0
    );
    sim.kill().await;
    Ok(())
}

kvroute_stack::help_test!(Args);
