//! The peer routers in the bench, started by `kvroute_stack::peers` as the evaluation starts
//! them, in front of the instant upstreams. `vllm-router-kv-aware` gets a KV-event endpoint per
//! worker that nothing publishes on (nothing is cached anywhere, so every decision is cold, as
//! for the others): it connects and waits, and routes on load and its own tokenization.

use anyhow::Context;
use kvroute_stack::paths;
use kvroute_stack::peers::{PeerConfig, PeerKind, PeerRouter, PeerWorker};
use kvroute_stack::stack::Pool;

/// The workers' KV block size the peers are told (vLLM's default, the simulated workers').
const BLOCK_SIZE: usize = 16;

/// The peers to run: `only` (names, checked), or all of them.
pub fn names(only: &[String]) -> anyhow::Result<Vec<String>> {
    if only.is_empty() {
        return Ok(PeerKind::ALL.iter().map(|k| k.name().to_owned()).collect());
    }
    only.iter()
        .map(|n| {
            PeerKind::parse(n).map(|k| k.name().to_owned()).with_context(|| {
                let all: Vec<&str> = PeerKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown peer {n} (one of {})", all.join(", "))
            })
        })
        .collect()
}

/// A started peer router.
pub struct StartedPeer(PeerRouter);

impl StartedPeer {
    pub fn base_url(&self) -> String {
        self.0.base_url()
    }

    pub fn pid(&self) -> anyhow::Result<u32> {
        self.0.pid().with_context(|| format!("{} exited", self.0.kind().name()))
    }

    /// Stops it (its whole process group).
    pub async fn stop(self) {
        drop(self.0);
    }
}

/// Starts peer `name` in front of `addrs` (`ip:port`), for `pool`'s model.
pub async fn start(name: &str, addrs: &[String], pool: &Pool) -> anyhow::Result<StartedPeer> {
    let kind = PeerKind::parse(name).with_context(|| format!("unknown peer {name}"))?;
    let mut workers = Vec::new();
    for a in addrs {
        let (events, replay) = if kind.uses_events() {
            // Free now and never bound: a publisher that publishes nothing.
            let e = format!("tcp://127.0.0.1:{}", paths::free_port()?);
            (Some(e), Some(format!("tcp://127.0.0.1:{}", paths::free_port()?)))
        } else {
            (None, None)
        };
        workers.push(PeerWorker { url: format!("http://{a}"), events, replay });
    }
    let cfg = PeerConfig {
        kind,
        workers,
        model: pool.model.clone(),
        block_size: BLOCK_SIZE,
        tokenizer_dir: pool.dir.clone(),
    };
    let dir = paths::scratch_dir(&format!("proxybench-{name}"))?;
    let router = PeerRouter::start(&cfg, &dir).await.with_context(|| format!("starting {name}"))?;
    Ok(StartedPeer(router))
}
