//! kvroute-updater binary: see the crate docs (`lib.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use kvroute_updater::limits::{AdapterLimits, BlockLimits, Limits, ReplayLimits, WireLimits};
use kvroute_updater::models::{parse_block_size, ModelSpec, Models};
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
    /// A served model: `NAME=DIR` (a Hugging Face style directory with `tokenizer.json` and
    /// `tokenizer_config.json`) or a bare `NAME` (the built-in demo bundle). Repeat per model.
    /// A worker's model is its `/v1/models` base model; one not given here is incompatible.
    #[arg(long = "model", default_value = "kvroute-demo")]
    models: Vec<ModelSpec>,
    /// The KV block size every model's workers must announce (else learned per model from the
    /// first compatible worker).
    #[arg(long)]
    block_size: Option<u32>,
    /// `NAME=BLOCK_SIZE`: the block size of one model's workers (overrides --block-size).
    #[arg(long = "model-block-size", value_parser = parse_block_size)]
    model_block_sizes: Vec<(String, u32)>,
    /// Most LoRA adapters published per worker (the first by name).
    #[arg(long, default_value_t = 256)]
    max_adapters_per_worker: usize,
    /// Longest model or adapter name taken from a worker's `/v1/models`, in bytes.
    #[arg(long, default_value_t = 256)]
    max_adapter_name_bytes: usize,
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
    /// How long another Envoy replica's routing credit is kept and published (ms).
    #[arg(long, default_value_t = 10_000)]
    peer_ttl_ms: u64,
    /// How long a replica's reported in-flight load counts without a refresh (ms); replicas
    /// re-send held loads every `snapshot_sync.peers.heartbeat_ms` (1 s by default).
    #[arg(long, default_value_t = 3_000)]
    peer_load_ttl_ms: u64,
    /// Most Envoy replicas reporting at once; reports of more are refused (429).
    #[arg(long, default_value_t = 256)]
    max_peer_replicas: usize,
    /// Most credited hashes kept from all replicas; past it the oldest credits are dropped.
    #[arg(long, default_value_t = 1 << 20)]
    max_peer_hashes: usize,
    /// Largest peer report body accepted (bytes); larger ones get 413.
    #[arg(long, default_value_t = 1 << 20)]
    max_peer_report_bytes: usize,
    /// A worker: `HTTP_ADDR[,EVENTS_ENDPOINT[,REPLAY_ENDPOINT]]`, e.g.
    /// `127.0.0.1:8000,tcp://127.0.0.1:5557,tcp://127.0.0.1:5558`. Repeat per worker. A worker
    /// given without an events endpoint is followed for load, adapters and alignment only (an
    /// engine without KV events, or an evaluation that withholds them).
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
        adapters: AdapterLimits {
            max_adapters: a.max_adapters_per_worker,
            max_name_bytes: a.max_adapter_name_bytes.max(1),
        },
        peers: kvroute_updater::peers::PeerLimits {
            ttl_ms: a.peer_ttl_ms.max(1),
            load_ttl_ms: a.peer_load_ttl_ms.max(1),
            max_replicas: a.max_peer_replicas,
            max_hashes: a.max_peer_hashes,
            max_report_bytes: a.max_peer_report_bytes.max(1024),
        },
    }
}

/// A worker's address and, when it publishes KV events, where to follow them.
fn endpoints(spec: &str) -> anyhow::Result<(String, Option<Endpoints>)> {
    let mut parts = spec.split(',');
    let worker = parts.next().filter(|s| !s.is_empty()).context("worker address missing")?;
    worker.parse::<SocketAddr>().with_context(|| format!("'{worker}' is not ip:port"))?;
    let events = parts.next().filter(|s| !s.is_empty()).map(str::to_owned);
    let replay = parts.next().filter(|s| !s.is_empty()).map(str::to_owned);
    anyhow::ensure!(
        events.is_some() || replay.is_none(),
        "'{spec}': a replay endpoint needs events"
    );
    Ok((
        worker.to_owned(),
        events.map(|events| Endpoints { worker: worker.to_owned(), events, replay }),
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.token.len() >= 16, "--token must be at least 16 characters");
    let eps: Vec<(String, Option<Endpoints>)> =
        args.workers.iter().map(|w| endpoints(w)).collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(args.block_size != Some(0), "--block-size must be > 0");
    let mut block_sizes: Vec<(String, u32)> = match args.block_size {
        Some(b) => args.models.iter().map(|m| (m.name.clone(), b)).collect(),
        None => Vec::new(),
    };
    block_sizes.extend(args.model_block_sizes.iter().cloned());
    let models = Models::load(&args.models, &block_sizes).context("loading the models")?;
    let names: Vec<String> = eps.iter().map(|(w, _)| w.clone()).collect();
    let state = Arc::new(State::for_models(Arc::new(models), names.iter().cloned(), limits(&args)));
    for ep in eps.into_iter().filter_map(|(_, ep)| ep) {
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
    tokio::spawn(kvroute_updater::alignment::run(Arc::clone(&state), names, interval));
    let listener = tokio::net::TcpListener::bind(args.listen).await.context("binding --listen")?;
    println!("kvroute-updater listening on {}", listener.local_addr()?);
    axum::serve(listener, kvroute_updater::server::router(state, &args.token)).await?;
    Ok(())
}
