//! kvroute-sim: runs N simulated workers on one tokio runtime. See the crate docs (`lib.rs`).

use std::net::IpAddr;

use anyhow::Context as _;
use clap::Parser;
use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_sim::api::Adapter;
use kvroute_sim::engine::SchedulingPolicy;
use kvroute_sim::events::{EventConfig, EventEncoding, ReplyShape};
use kvroute_sim::profile::{self, HardwareProfile};
use kvroute_sim::topology::{parse_link, SimLink, SimRole, SimTopology};
use kvroute_sim::worker::{LoraSpec, Ports, Worker, WorkerSpec};

/// Simulated vLLM-like inference workers (OpenAI API, prefix cache, KV events, vLLM metrics).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Number of independent workers in this process.
    #[arg(long, default_value_t = 1)]
    workers: u16,
    /// HTTP port of worker 0; worker i uses base + i. 0 picks free ports (printed at start).
    #[arg(long, default_value_t = 8000)]
    base_port: u16,
    /// KV-event PUB port of worker 0 (0: free ports).
    #[arg(long, default_value_t = 0)]
    events_base_port: u16,
    /// Replay ROUTER port of worker 0 (0: free ports).
    #[arg(long, default_value_t = 0)]
    replay_base_port: u16,
    /// Fault-injection admin port of worker 0, always on 127.0.0.1 (0: free ports).
    #[arg(long, default_value_t = 0)]
    admin_base_port: u16,
    /// Address for HTTP and event sockets (loopback by default).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Served model id.
    #[arg(long, default_value = "kvroute-demo")]
    model: String,
    /// A Hugging Face style model directory (`tokenizer.json`, `tokenizer_config.json`) whose
    /// tokenizer and chat template the workers render and tokenize with; the built-in demo
    /// bundle without it.
    #[arg(long)]
    model_dir: Option<std::path::PathBuf>,
    /// A LoRA adapter loaded at start, `NAME=PATH` (as vLLM's `--lora-modules`). Repeatable.
    #[arg(long = "lora", value_parser = parse_lora)]
    loras: Vec<Adapter>,
    /// Most distinct LoRA adapters among running requests (vLLM's `--max-loras`).
    #[arg(long, default_value_t = 1)]
    max_loras: usize,
    /// Waiting-queue order (vLLM's `--scheduling-policy`): `fcfs`, or `priority` (each
    /// request's `priority` field, lower first, then arrival; KV pressure preempts the least
    /// urgent). In `fcfs` a request with a non-zero `priority` is refused (400), as in vLLM.
    #[arg(long, value_enum, default_value_t = SchedulingPolicy::Fcfs)]
    scheduling_policy: SchedulingPolicy,
    /// How long loading an adapter through `POST /v1/load_lora_adapter` takes (ms).
    #[arg(long, default_value_t = 0)]
    lora_load_ms: u64,
    /// Timing profile: a built-in name or a .toml path.
    #[arg(long, default_value = profile::DEFAULT)]
    profile: String,
    /// Divide every duration by this (long trace replays).
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Override the profile's KV block size.
    #[arg(long)]
    block_size: Option<usize>,
    /// Override the profile's KV capacity in blocks.
    #[arg(long)]
    num_gpu_blocks: Option<usize>,
    /// Override the profile's running-batch limit.
    #[arg(long)]
    max_num_seqs: Option<usize>,
    /// Override the profile's per-step token budget.
    #[arg(long)]
    max_num_batched_tokens: Option<usize>,
    /// Override the profile's step floor (ms).
    #[arg(long)]
    step_floor_ms: Option<f64>,
    /// Override the profile's prefill cost per token (ms).
    #[arg(long)]
    prefill_ms_per_token: Option<f64>,
    /// Override the profile's cost per decoding sequence (ms).
    #[arg(long)]
    decode_ms_per_seq: Option<f64>,
    /// KV-event topic.
    #[arg(long, default_value = "")]
    topic: String,
    /// Event encoding inside batches.
    #[arg(long, value_enum, default_value_t = EventEncoding::Array)]
    event_encoding: EventEncoding,
    /// Replay reply framing.
    #[arg(long, value_enum, default_value_t = ReplyShape::Triple)]
    replay_shape: ReplyShape,
    /// Batches kept for replay.
    #[arg(long, default_value_t = 10_000)]
    buffer_steps: usize,
    /// Site label of the workers (`GET /sim/topology`; a peer's site picks the `--link` of a
    /// pull from it).
    #[arg(long)]
    site: Option<String>,
    /// Node label of the workers (`GET /sim/topology`).
    #[arg(long)]
    node: Option<String>,
    /// P/D role: `decode` workers act on `x-prefiller-host-port`; `prefill` is a label.
    #[arg(long, value_enum, default_value_t = SimRole::Both)]
    role: SimRole,
    /// Round trip between the client and the workers (ms, wall clock), applied on their HTTP
    /// sockets: half before a request is read, every response byte half later.
    #[arg(long, default_value_t = 0.0)]
    client_rtt_ms: f64,
    /// One-way delay of the KV-event PUB path (ms, wall clock; a delay line).
    #[arg(long, default_value_t = 0.0)]
    event_delay_ms: f64,
    /// Link from the workers to workers in SITE, `SITE=RTT_MS:GBPS`; SITE may name a peer's
    /// node, which wins over its site (`*`: any peer without a link of its own; none: 0 ms,
    /// 100 Gbit/s). Repeatable.
    #[arg(long = "link", value_parser = parse_link)]
    links: Vec<(String, SimLink)>,
    /// KV size of one token in bytes (what a pull moves per token).
    #[arg(long, default_value_t = 131_072)]
    kv_bytes_per_token: u64,
    /// A pull sends 1/K of the KV's bytes over loopback, paced at 1/K of the link bandwidth
    /// (its duration is the full-size transfer's).
    #[arg(long, default_value_t = 1024)]
    kv_wire_scale: u64,
    /// Fixed cost of one pull (ms, wall clock): handshake, registration.
    #[arg(long, default_value_t = 0.0)]
    kv_setup_ms: f64,
}

fn topology(a: &Args) -> anyhow::Result<SimTopology> {
    let finite = |v: f64| v.is_finite() && v >= 0.0;
    anyhow::ensure!(finite(a.client_rtt_ms), "--client-rtt-ms must be >= 0");
    anyhow::ensure!(finite(a.event_delay_ms), "--event-delay-ms must be >= 0");
    anyhow::ensure!(finite(a.kv_setup_ms), "--kv-setup-ms must be >= 0");
    anyhow::ensure!(a.kv_wire_scale > 0, "--kv-wire-scale must be > 0");
    anyhow::ensure!(a.kv_bytes_per_token > 0, "--kv-bytes-per-token must be > 0");
    Ok(SimTopology {
        site: a.site.clone(),
        node: a.node.clone(),
        role: a.role,
        client_rtt_ms: a.client_rtt_ms,
        event_delay_ms: a.event_delay_ms,
        links: a.links.clone(),
        kv_bytes_per_token: a.kv_bytes_per_token,
        kv_wire_scale: a.kv_wire_scale,
        kv_setup_ms: a.kv_setup_ms,
    })
}

fn profile(a: &Args) -> anyhow::Result<HardwareProfile> {
    let mut p = HardwareProfile::load(&a.profile)?;
    p.block_size = a.block_size.unwrap_or(p.block_size);
    p.num_gpu_blocks = a.num_gpu_blocks.unwrap_or(p.num_gpu_blocks);
    p.max_num_seqs = a.max_num_seqs.unwrap_or(p.max_num_seqs);
    p.max_num_batched_tokens = a.max_num_batched_tokens.unwrap_or(p.max_num_batched_tokens);
    p.step_floor_ms = a.step_floor_ms.unwrap_or(p.step_floor_ms);
    p.prefill_ms_per_token = a.prefill_ms_per_token.unwrap_or(p.prefill_ms_per_token);
    p.decode_ms_per_seq = a.decode_ms_per_seq.unwrap_or(p.decode_ms_per_seq);
    p.validate()?;
    Ok(p)
}

fn parse_lora(s: &str) -> Result<Adapter, String> {
    match s.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok(Adapter { name: name.into(), path: path.into() })
        }
        _ => Err(format!("'{s}' is not NAME=PATH")),
    }
}

fn port(base: u16, i: u16) -> u16 {
    if base == 0 {
        0
    } else {
        base + i
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.speedup > 0.0, "--speedup must be > 0");
    let profile = profile(&args)?;
    let topology = topology(&args)?;
    anyhow::ensure!(args.max_loras > 0, "--max-loras must be > 0");
    let bundle = match &args.model_dir {
        Some(dir) => ModelBundle::from_dir(dir)
            .with_context(|| format!("loading the model bundle in {}", dir.display()))?,
        None => ModelBundle::demo().context("loading the demo model bundle")?,
    };
    let lora = LoraSpec {
        adapters: args.loras.clone(),
        max_loras: args.max_loras,
        load_ms: args.lora_load_ms,
    };
    let events = EventConfig {
        topic: args.topic.clone(),
        encoding: args.event_encoding,
        reply_shape: args.replay_shape,
        buffer_steps: args.buffer_steps.max(1),
    };
    let mut admins = Vec::new();
    for i in 0..args.workers {
        let spec = WorkerSpec {
            index: i as usize,
            host: args.host,
            model: args.model.clone(),
            profile: profile.clone(),
            speedup: args.speedup,
            events: events.clone(),
            root: args.model_dir.as_ref().map(|d| d.display().to_string()),
            lora: lora.clone(),
            topology: topology.clone(),
            scheduling_policy: args.scheduling_policy,
        };
        let ports = Ports {
            http: port(args.base_port, i),
            events: port(args.events_base_port, i),
            replay: port(args.replay_base_port, i),
            admin: port(args.admin_base_port, i),
        };
        let worker = Worker::new(spec, bundle.clone(), ports);
        let admin = worker.bind_admin().await?;
        let p = worker.start().await.with_context(|| format!("starting worker {i}"))?;
        // Harnesses read this line to learn the ports.
        println!(
            "kvroute-sim worker {i} listening on {}:{} events {} replay {} admin {} profile {}",
            args.host,
            p.http,
            p.events,
            p.replay,
            admin.local_addr()?.port(),
            profile.name
        );
        let app = kvroute_sim::admin::router(worker);
        admins.push(tokio::spawn(async move { axum::serve(admin, app).await }));
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Ok(()),
        r = futures::future::select_all(admins) => {
            r.0.context("admin task")?.context("admin server")?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every argument of `kvroute-sim --help` says what it is for.
    #[test]
    fn help_is_complete() {
        let cmd = super::Args::command();
        cmd.clone().debug_assert();
        assert!(cmd.get_about().is_some(), "no about");
        let missing: Vec<&str> = cmd
            .get_arguments()
            .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
            .filter(|a| a.get_help().is_none() && a.get_long_help().is_none())
            .map(|a| a.get_id().as_str())
            .collect();
        assert!(missing.is_empty(), "arguments without help: {missing:?}");
    }
}
