//! kvroute-up (`./dev up`): a local kvroute stack without Docker, on 127.0.0.1 — simulated
//! workers (or the workers given with `--worker`), kvroute-updater following their KV events,
//! and Envoy with the kvroute filter in front of them. Prints the listener, admin and updater
//! addresses and a ready-to-paste `curl`, then runs until Ctrl-C (SIGINT) or SIGTERM, and
//! stops every process it started, also when a start fails or is interrupted.
//!
//! Output protocol (read by its test): one `started NAME pid PID` line per child as it starts,
//! the addresses, a `curl ...` line, then a line holding `ready`; `stopped` when all children
//! are gone.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kvroute_stack::envoy::Envoy;
use kvroute_stack::paths;
use kvroute_stack::process::Guard;
use kvroute_stack::sim::SimWorker;
use kvroute_stack::stack::{self, BundleFrom, Pool, StackOptions, StackPorts, Updater};
use tokio::signal::unix::{signal, SignalKind};

#[derive(Parser, Debug)]
#[command(
    name = "kvroute-up",
    about = "A local kvroute stack (workers, updater, Envoy with the filter) until Ctrl-C"
)]
struct Args {
    /// Simulated workers to start (ignored when --worker is given).
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// An existing worker instead of simulated ones: `HTTP_ADDR[,EVENTS_ENDPOINT[,REPLAY_ENDPOINT]]`
    /// (as kvroute-updater's --worker), e.g. `127.0.0.1:8000,tcp://127.0.0.1:5557`. Repeatable.
    #[arg(long = "worker")]
    external: Vec<String>,
    /// The served model: `NAME` (the built-in demo bundle) or `NAME=DIR` (a Hugging Face style
    /// directory with tokenizer.json and tokenizer_config.json).
    #[arg(long, default_value = stack::MODEL)]
    model: String,
    /// Envoy's listener port (0: a free one).
    #[arg(long, default_value_t = 10000)]
    listen_port: u16,
    /// Envoy's admin port (0: a free one).
    #[arg(long, default_value_t = 9901)]
    admin_port: u16,
    /// kvroute-updater's port (0: a free one).
    #[arg(long, default_value_t = 9100)]
    updater_port: u16,
    /// Envoy worker threads.
    #[arg(long, default_value_t = 2)]
    envoy_concurrency: u32,
    /// Extra flags for every simulated worker (e.g. `--sim-arg=--speedup --sim-arg=10`).
    #[arg(long = "sim-arg", allow_hyphen_values = true)]
    sim_args: Vec<String>,
}

/// Every process started so far; [`Children::stop`] kills and reaps them all.
#[derive(Default)]
struct Children {
    sims: Vec<SimWorker>,
    updater: Option<Updater>,
    envoy: Option<Envoy>,
}

impl Children {
    fn announce(guard: &Guard) {
        println!("started {} pid {}", guard.name, guard.pid().unwrap_or(0));
    }

    async fn stop(&mut self) {
        if let Some(e) = self.envoy.as_mut() {
            e.guard.kill().await;
        }
        if let Some(u) = self.updater.as_mut() {
            u.stop().await;
        }
        for w in &mut self.sims {
            w.guard.kill().await;
        }
    }
}

/// What was started, for the banner.
struct Up {
    ports: StackPorts,
    model: String,
    dir: std::path::PathBuf,
}

fn pool(args: &Args, workers: usize) -> Pool {
    let (model, dir) = match args.model.split_once('=') {
        Some((name, dir)) => (name.to_owned(), Some(dir.into())),
        None => (args.model.clone(), None),
    };
    Pool { model, dir, workers, bundle: BundleFrom::Updater }
}

fn port(p: u16) -> anyhow::Result<u16> {
    if p == 0 {
        paths::free_port()
    } else {
        Ok(p)
    }
}

async fn start(args: &Args, c: &mut Children) -> anyhow::Result<Up> {
    let dir = paths::scratch_dir("up")?;
    let dir = dir.canonicalize().unwrap_or(dir);
    let ports = StackPorts {
        admin: port(args.admin_port)?,
        listen: port(args.listen_port)?,
        updater: port(args.updater_port)?,
    };
    let n = if args.external.is_empty() { args.workers } else { args.external.len() };
    anyhow::ensure!(n > 0, "--workers must be at least 1");
    let pool = pool(args, n);
    let endpoints = if args.external.is_empty() {
        let mut sim_args = pool.sim_args();
        sim_args.extend(args.sim_args.iter().cloned());
        for i in 0..n {
            let w = SimWorker::start(i, &sim_args, &dir).await?;
            Children::announce(&w.guard);
            c.sims.push(w);
        }
        let ep = |w: &SimWorker| {
            format!(
                "{},tcp://127.0.0.1:{},tcp://127.0.0.1:{}",
                w.addr, w.events_port, w.replay_port
            )
        };
        c.sims.iter().map(ep).collect()
    } else {
        args.external.clone()
    };
    let addrs: Vec<String> =
        endpoints.iter().map(|e| e.split(',').next().unwrap_or_default().to_owned()).collect();
    let models = [pool.updater_model()];
    let updater =
        Updater::start_with(ports.updater, Some(ports.admin), &endpoints, &models, &dir).await?;
    Children::announce(&updater.guard);
    c.updater = Some(updater);
    let filter = stack::pools_filter_config(
        std::slice::from_ref(&pool),
        std::slice::from_ref(&addrs),
        &StackOptions::default(),
    )?;
    let config = stack::write_config("kvroute.yaml", &dir, ports, &addrs, &filter)?;
    let envoy =
        Envoy::start(&config, ports.admin, ports.listen, &dir, args.envoy_concurrency).await?;
    Children::announce(&envoy.guard);
    let healthy = envoy.wait_healthy(n).await;
    c.envoy = Some(envoy);
    match healthy {
        Ok(()) => {}
        Err(e) if !args.external.is_empty() => {
            eprintln!("warning: not every given worker is healthy in Envoy yet ({e})");
        }
        Err(e) => return Err(e),
    }
    // "ready" means every worker thread routes with its bundle and the updater's knowledge.
    if let Some(envoy) = &c.envoy {
        envoy.wait_threads_ready(true, Duration::from_secs(180)).await?;
    }
    Ok(Up { ports, model: pool.model, dir })
}

fn banner(up: &Up) {
    let StackPorts { admin, listen, updater } = up.ports;
    println!("listener  http://127.0.0.1:{listen}");
    println!("admin     http://127.0.0.1:{admin}   (/stats/prometheus, /clusters)");
    println!("updater   http://127.0.0.1:{updater}   (/status, /metrics)");
    println!("logs      {}", up.dir.display());
    let body = serde_json::json!({
        "model": up.model,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello to kvroute."}],
    });
    println!(
        "curl -sS -i http://127.0.0.1:{listen}/v1/chat/completions \
         -H 'content-type: application/json' -d '{body}'"
    );
    println!("kvroute-up ready: the response's x-kvroute-decision header shows the decision; Ctrl-C stops everything");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut children = Children::default();
    let started = tokio::select! {
        r = start(&args, &mut children) => r.map(Some),
        _ = int.recv() => Ok(None),
        _ = term.recv() => Ok(None),
    };
    let result = match started {
        Ok(Some(up)) => {
            banner(&up);
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            println!("stopping");
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(e.context("starting the stack")),
    };
    tokio::time::timeout(Duration::from_secs(30), children.stop()).await.ok();
    println!("stopped");
    result
}

kvroute_stack::help_test!(Args);
