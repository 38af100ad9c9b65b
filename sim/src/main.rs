//! kvroute-sim: simulated inference workers with vLLM's observable behaviour.
//!
//! Where to start: `main` parses flags and starts `--workers N` independent workers on ports
//! `--base-port`.. on one tokio runtime; each is an [`engine::Engine`] (continuous batching,
//! chunked prefill, paged prefix cache in [`cache`]) behind the HTTP surface in [`api`].

mod api;
mod cache;
mod engine;
mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use kvroute_core::model::ModelBundle;

use crate::engine::{Engine, EngineConfig, Timing};

/// Simulated vLLM-like inference workers (OpenAI API, prefix cache, vLLM metrics).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Number of independent workers in this process.
    #[arg(long, default_value_t = 1)]
    workers: u16,
    /// HTTP port of worker 0; worker i listens on base-port + i (0: pick free ports).
    #[arg(long, default_value_t = 8000)]
    base_port: u16,
    /// Address to bind (loopback by default).
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Served model id.
    #[arg(long, default_value = "kvroute-demo")]
    model: String,
    /// KV block size in tokens.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// KV-cache capacity in blocks.
    #[arg(long, default_value_t = 8192)]
    num_gpu_blocks: usize,
    /// Most sequences in the running batch.
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// Token budget of one scheduler step (decode tokens + prefill chunks).
    #[arg(long, default_value_t = 2048)]
    max_num_batched_tokens: usize,
    /// Longest prompt + output accepted.
    #[arg(long, default_value_t = 32768)]
    max_model_len: usize,
    /// Fixed cost of a scheduler step, ms (8B on one H100: ~5 ms decode floor).
    #[arg(long, default_value_t = 5.0)]
    step_floor_ms: f64,
    /// Prefill cost per token, ms (8B on one H100: ~30 k tokens/s).
    #[arg(long, default_value_t = 0.033)]
    prefill_ms_per_token: f64,
    /// Extra step cost per decoding sequence, ms.
    #[arg(long, default_value_t = 0.05)]
    decode_ms_per_seq: f64,
    /// Divide every duration by this.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.speedup > 0.0, "--speedup must be > 0");
    anyhow::ensure!(
        args.block_size > 0 && args.num_gpu_blocks > 0,
        "block size and blocks must be > 0"
    );
    let bundle = ModelBundle::demo().context("loading the demo model bundle")?;
    let cfg = EngineConfig {
        block_size: args.block_size,
        num_gpu_blocks: args.num_gpu_blocks,
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        timing: Timing {
            step_floor_ms: args.step_floor_ms,
            prefill_ms_per_token: args.prefill_ms_per_token,
            decode_ms_per_seq: args.decode_ms_per_seq,
            speedup: args.speedup,
        },
    };
    let mut servers = Vec::new();
    for i in 0..args.workers {
        let port = if args.base_port == 0 {
            0
        } else {
            args.base_port + i
        };
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(args.host, port))
            .await
            .with_context(|| format!("binding worker {i} to port {port}"))?;
        let addr = listener.local_addr()?;
        let worker = Arc::new(api::Worker {
            id: addr.to_string(),
            model: args.model.clone(),
            bundle: bundle.clone(),
            engine: Engine::start(cfg),
            block_size: args.block_size,
            num_gpu_blocks: args.num_gpu_blocks,
            max_model_len: args.max_model_len,
        });
        // Harnesses wait for this line to learn the port.
        println!("kvroute-sim worker {i} listening on {addr}");
        servers.push(tokio::spawn(async move {
            axum::serve(listener, api::router(worker)).await
        }));
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Ok(()),
        r = futures::future::select_all(servers) => {
            r.0.context("worker task")?.context("worker server")?;
            Ok(())
        }
    }
}
