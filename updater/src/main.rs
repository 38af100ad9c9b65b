//! kvroute-updater binary: see the crate docs (`lib.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use kvroute_core::model::ModelBundle;
use kvroute_updater::ingest::DomainBase;
use kvroute_updater::limits::{BlockLimits, Limits, ReplayLimits, WireLimits};
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
    /// Most blocks kept per worker and tier; past it the oldest-known blocks are forgotten.
    #[arg(long, default_value_t = 1 << 20)]
    max_blocks_per_tier: usize,
    /// Most engine-hash -> canonical-hash entries kept per worker (all tiers).
    #[arg(long, default_value_t = 3 << 20)]
    max_engine_keys: usize,
    /// Most batches taken from one replay; a longer replay is cut.
    #[arg(long, default_value_t = 20_000)]
    max_replay_batches: usize,
    /// Most payload bytes taken from one replay.
    #[arg(long, default_value_t = 256 << 20)]
    max_replay_bytes: usize,
    /// Most time spent on one replay (ms).
    #[arg(long, default_value_t = 10_000)]
    max_replay_ms: u64,
    /// After a replay was cut, the worker's next replay waits this long (ms).
    #[arg(long, default_value_t = 5_000)]
    replay_retry_ms: u64,
    /// Longest ZMQ frame (and batch payload) accepted from a worker; longer ones are refused
    /// before the ZMQ codec allocates them.
    #[arg(long, default_value_t = 64 << 20)]
    max_frame_bytes: usize,
    /// Most frames in one ZMQ message from a worker.
    #[arg(long, default_value_t = 16)]
    max_message_frames: usize,
    /// Largest HTTP answer read from a worker (`/metrics`, `/tokenize`, `/v1/models`).
    #[arg(long, default_value_t = 4 << 20)]
    max_http_body_bytes: usize,
    /// A worker: `HTTP_ADDR,EVENTS_ENDPOINT[,REPLAY_ENDPOINT]`, e.g.
    /// `127.0.0.1:8000,tcp://127.0.0.1:5557,tcp://127.0.0.1:5558`. Repeat per worker.
    #[arg(long = "worker", required = true)]
    workers: Vec<String>,
}

fn limits(a: &Args) -> Limits {
    use std::time::Duration;
    Limits {
        blocks: BlockLimits {
            max_blocks_per_tier: a.max_blocks_per_tier.max(1),
            max_engine_keys: a.max_engine_keys.max(1),
        },
        replay: ReplayLimits {
            max_batches: a.max_replay_batches.max(1),
            max_bytes: a.max_replay_bytes.max(1),
            max_time: Duration::from_millis(a.max_replay_ms.max(100)),
            retry_after: Duration::from_millis(a.replay_retry_ms),
        },
        wire: WireLimits {
            max_frame_bytes: a.max_frame_bytes.max(1024),
            max_message_frames: a.max_message_frames.max(4),
        },
        max_http_body_bytes: a.max_http_body_bytes.max(64 << 10),
    }
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
    let workers = eps.iter().map(|e| e.worker.clone());
    let state = Arc::new(State::with_limits(domain, workers, limits(&args)));
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
