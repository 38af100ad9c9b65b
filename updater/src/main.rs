//! kvroute-updater binary: see the crate docs (`lib.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use kvroute_core::model::ModelBundle;
use kvroute_updater::ingest::DomainBase;
use kvroute_updater::state::State;
use kvroute_updater::subscriber::{follow, Endpoints};

/// Follows workers' KV events and serves canonical knowledge snapshots to kvroute.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address of the HTTP surface (status, metrics, snapshots). Loopback by default.
    #[arg(long, default_value = "127.0.0.1:9100")]
    listen: SocketAddr,
    /// Shared token the Envoy side must send for snapshots (or env KVROUTE_UPDATER_TOKEN).
    #[arg(long, env = "KVROUTE_UPDATER_TOKEN")]
    token: String,
    /// Model id (part of the cache domain).
    #[arg(long, default_value = "kvroute-demo")]
    model: String,
    /// The engines' KV block size.
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    /// How often each worker's config alignment is checked (ms).
    #[arg(long, default_value_t = 10_000)]
    align_interval_ms: u64,
    /// How often each worker's `/metrics` is scraped (ms).
    #[arg(long, default_value_t = 500)]
    scrape_interval_ms: u64,
    /// Envoy's admin address (e.g. `http://127.0.0.1:9901`): its health checks decide which
    /// workers are in the pool. Without it, every configured worker is.
    #[arg(long)]
    envoy_admin: Option<String>,
    /// The Envoy cluster holding the workers.
    #[arg(long, default_value = "workers")]
    envoy_cluster: String,
    /// A worker: `HTTP_ADDR,EVENTS_ENDPOINT[,REPLAY_ENDPOINT]`, e.g.
    /// `127.0.0.1:8000,tcp://127.0.0.1:5557,tcp://127.0.0.1:5558`. Repeat per worker.
    #[arg(long = "worker", required = true)]
    workers: Vec<String>,
}

fn endpoints(spec: &str) -> anyhow::Result<Endpoints> {
    let mut parts = spec.split(',');
    let worker = parts.next().filter(|s| !s.is_empty()).context("worker address missing")?;
    worker.parse::<SocketAddr>().with_context(|| format!("'{worker}' is not ip:port"))?;
    let events = parts.next().context("events endpoint missing")?.to_owned();
    Ok(Endpoints { worker: worker.to_owned(), events, replay: parts.next().map(str::to_owned) })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.token.len() >= 16, "--token must be at least 16 characters");
    let eps: Vec<Endpoints> =
        args.workers.iter().map(|w| endpoints(w)).collect::<anyhow::Result<_>>()?;
    let bundle = ModelBundle::demo().context("loading the tokenizer for the cache domain")?;
    let domain = DomainBase {
        model: args.model.clone(),
        tokenizer_fingerprint: bundle.fingerprint(),
        block_size: args.block_size,
        lora_name: None,
    };
    let state = Arc::new(State::new(domain, eps.iter().map(|e| e.worker.clone())));
    let names: Vec<String> = eps.iter().map(|e| e.worker.clone()).collect();
    for ep in eps {
        tokio::spawn(follow(Arc::clone(&state), ep));
    }
    let interval = std::time::Duration::from_millis(args.align_interval_ms.max(100));
    let scrape = std::time::Duration::from_millis(args.scrape_interval_ms.max(50));
    tokio::spawn(kvroute_updater::scrape::run_scrape(Arc::clone(&state), names.clone(), scrape));
    if let Some(admin) = args.envoy_admin.clone() {
        let cluster = args.envoy_cluster.clone();
        tokio::spawn(kvroute_updater::scrape::run_membership(
            Arc::clone(&state),
            admin,
            cluster,
            names.clone(),
        ));
    }
    tokio::spawn(kvroute_updater::alignment::run(Arc::clone(&state), names, bundle, interval));
    let listener = tokio::net::TcpListener::bind(args.listen).await.context("binding --listen")?;
    println!("kvroute-updater listening on {}", listener.local_addr()?);
    axum::serve(listener, kvroute_updater::server::router(state, &args.token)).await?;
    Ok(())
}
