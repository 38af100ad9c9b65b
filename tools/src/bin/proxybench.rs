//! kvroute-proxybench: what a router's own decision costs. Requests per second through one
//! Envoy (2 worker threads by default) running the shipped `envoy/kvroute.yaml`, against the
//! same bootstrap with the wasm filter taken out (`envoy/buffer-only.yaml`: the same listener,
//! native header_mutation and buffer filters, and worker cluster), for short and ~8 k-token chat
//! prompts; with `--peers`, also through the peer routers the evaluation runs (SMG and the vLLM
//! router, each as the harness configures it, from `kvroute_stack::peers`). Per router: requests
//! per second, CPU seconds per 1000 requests of its process tree, its peak and end resident
//! memory, and what it asked of the upstreams per request.
//!
//! The upstream is a fixture in this process (`proxybench/upstream.rs`): two loopback servers
//! answering every chat request at once with a fixed small OpenAI response, so the router is
//! the bottleneck, not a simulated engine's prefill. It stands in for nothing in the product.
//!
//! Each prompt is new to the router (a per-request number leads the user message), so every
//! request is decided cold. Order per prompt size: baseline, kvroute, the peers, baseline
//! again; the two baseline runs give the noise floor. Every router is started fresh per run.
//!
//! Run: `target/release/kvroute-proxybench [--model qwen3] [--seconds 10] [--peers]
//! [--json out.json]` (after `./dev build`; `--peers` after `./dev setup` installed them).

#[path = "proxybench/load.rs"]
mod load;
#[path = "proxybench/peer.rs"]
mod peer;
#[path = "proxybench/procstat.rs"]
mod procstat;
#[path = "proxybench/table.rs"]
mod table;
#[path = "proxybench/upstream.rs"]
mod upstream;

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use kvroute_stack::envoy::Envoy;
use kvroute_stack::paths;
use kvroute_stack::stack::{write_config, BundleFrom, Pool, StackPorts};
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(
    about = "Requests per second, CPU and memory of kvroute in Envoy, and of the peer routers"
)]
struct Args {
    /// `demo` (built-in bundle) or `qwen3` (from `./dev setup`, given inline to the filter).
    #[arg(long, default_value = "qwen3")]
    model: String,
    /// Seconds of load per measurement (after 2 s of warm-up).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrent client connections.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Envoy worker threads.
    #[arg(long, default_value_t = 2)]
    envoy_threads: u32,
    /// Request path. Another path than `/v1/chat/completions` (served by the fixture too) prices
    /// the filter on requests it passes through without a decision.
    #[arg(long, default_value = "/v1/chat/completions")]
    path: String,
    /// Which prompt sizes to run: `short`, `8k` (repeatable; default both).
    #[arg(long = "prompt")]
    prompts: Vec<String>,
    /// Also run every peer router (`smg-cache-aware`, `vllm-router-cache-aware`,
    /// `vllm-router-kv-aware`) in the configuration the evaluation harness uses.
    #[arg(long)]
    peers: bool,
    /// Run only these peer routers (repeatable; implies `--peers`).
    #[arg(long = "peer")]
    peer: Vec<String>,
    /// Also write the tables as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// A router under load: its URL and the process whose tree is measured.
struct Running {
    url: String,
    pid: u32,
    stop: Stop,
}

enum Stop {
    Envoy(Envoy),
    Peer(peer::StartedPeer),
}

impl Running {
    async fn stop(self) {
        match self.stop {
            Stop::Envoy(mut e) => e.guard.kill().await,
            Stop::Peer(p) => p.stop().await,
        }
    }
}

async fn envoy(template: &str, addrs: &[String], cfg: &Value, a: &Args) -> anyhow::Result<Running> {
    let dir = paths::scratch_dir(&format!("proxybench-{}", template.trim_end_matches(".yaml")))?;
    let ports = StackPorts {
        admin: paths::free_port()?,
        listen: paths::free_port()?,
        updater: paths::free_port()?,
    };
    let path = write_config(template, &dir, ports, addrs, cfg)?;
    let envoy = Envoy::start(&path, ports.admin, ports.listen, &dir, a.envoy_threads).await?;
    envoy.wait_healthy(addrs.len()).await?;
    let pid = envoy.guard.pid().context("Envoy exited")?;
    Ok(Running { url: format!("{}{}", envoy.base_url(), a.path), pid, stop: Stop::Envoy(envoy) })
}

/// One row: start the router, load it, measure, stop it.
async fn run_one(
    router: &str,
    prompt: (&str, &str),
    setup: &Setup,
    a: &Args,
) -> anyhow::Result<table::RouterSample> {
    let running = match router {
        "buffer-only" => envoy("buffer-only.yaml", &setup.addrs, &setup.filter, a).await?,
        "kvroute" => envoy("kvroute.yaml", &setup.addrs, &setup.filter, a).await?,
        peer => {
            let p = peer::start(peer, &setup.addrs, &setup.pool).await?;
            Running {
                url: format!("{}{}", p.base_url(), a.path),
                pid: p.pid()?,
                stop: Stop::Peer(p),
            }
        }
    };
    let load = load::LoadSpec {
        url: &running.url,
        model: &setup.pool.model,
        words: prompt.1,
        concurrency: a.concurrency,
        seconds: a.seconds,
    };
    let (pid, tck, calls) = (running.pid, setup.ticks_per_s, &setup.calls);
    // The router's CPU seconds and the upstream calls so far, at both edges of the window.
    let probe = || (procstat::cpu_seconds(pid, tck).unwrap_or(f64::NAN), calls.snapshot());
    let window = load::measure(&load, probe).await;
    let mem = procstat::mem(pid);
    running.stop().await;
    let w = window.with_context(|| format!("{router}, {} prompts", prompt.0))?;
    let mem = mem.with_context(|| format!("{router} exited during the run"))?;
    Ok(table::RouterSample {
        requests: w.requests,
        secs: w.secs,
        cpu_s: w.after.0 - w.before.0,
        hwm_kb: mem.hwm_kb,
        rss_kb: mem.rss_kb,
        upstream_calls: upstream::per_request(w.before.1, w.after.1, w.requests),
    })
}

struct Setup {
    addrs: Vec<String>,
    calls: std::sync::Arc<upstream::UpstreamCalls>,
    pool: Pool,
    filter: Value,
    ticks_per_s: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let pool = match a.model.as_str() {
        "qwen3" => Pool::qwen3(2),
        "demo" => Pool::demo(2),
        other => anyhow::bail!("unknown --model {other} (demo or qwen3)"),
    };
    let pool = Pool { bundle: BundleFrom::Inline, ..pool };
    let (addrs, calls) = upstream::start(2, &pool.model).await?;
    // The filter's configuration: one pool of the two upstreams, its bundle inline (no updater).
    let filter = json!({"models": [pool.filter_model(&addrs)?]});
    let setup = Setup { addrs, calls, pool, filter, ticks_per_s: procstat::clock_ticks() };
    let mut routers = vec!["kvroute".to_string()];
    if a.peers || !a.peer.is_empty() {
        routers.extend(peer::names(&a.peer)?);
    }
    let short = "Summarize the plot of a short story about a lighthouse keeper.".to_string();
    let long = kvroute_testkit::textgen::words(0x8_0000, 6_400);
    println!(
        "kvroute-proxybench: model {}, {} Envoy threads, {} connections, {} s per run",
        a.model, a.envoy_threads, a.concurrency, a.seconds
    );
    let mut tables = Vec::new();
    for (name, words) in [("short", &short), ("8k", &long)] {
        if !a.prompts.is_empty() && !a.prompts.iter().any(|p| p == name) {
            continue;
        }
        let first = run_one("buffer-only", (name, words), &setup, &a).await?;
        let mut rows = Vec::new();
        for r in &routers {
            rows.push((r.clone(), run_one(r, (name, words), &setup, &a).await?));
        }
        let last = run_one("buffer-only", (name, words), &setup, &a).await?;
        let t = table::summarize(name, first, rows, last);
        println!("\n{}", table::render(&t));
        tables.push(t);
    }
    if let Some(path) = &a.json {
        let out = json!({"model": a.model, "seconds": a.seconds, "concurrency": a.concurrency,
            "envoy_threads": a.envoy_threads, "path": a.path,
            "tables": tables.iter().map(table::to_json).collect::<Vec<_>>()});
        std::fs::write(path, serde_json::to_string_pretty(&out)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

kvroute_stack::help_test!(Args);
