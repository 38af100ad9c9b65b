//! The peer routers a provider would otherwise deploy in front of the same workers, started from
//! their pinned PyPI wheels (installed by `./dev setup` into `.cache/peers/venv` from
//! `integration/python/peers.txt`): SGLang's model gateway `smg` and `vllm-router`, each in its
//! default or documented recommended configuration, given what it needs to work well (block
//! size, model, the workers' KV-event sockets) and never tuned down. Every socket binds
//! 127.0.0.1; each router runs in its own process group, killed when its [`PeerRouter`] drops.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio::process::Command;

use crate::paths;
use crate::process::Guard;

/// One peer router in one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerKind {
    /// `smg launch --policy cache_aware` (SGLang model gateway 1.13.0, its default policy).
    SmgCacheAware,
    /// `vllm-router --policy cache_aware` (vllm-router 0.1.17, its default policy).
    VllmRouterCacheAware,
    /// `vllm-router --policy kv_aware` fed by the workers' vLLM-format KV events over ZMQ.
    VllmRouterKvAware,
}

impl PeerKind {
    pub const ALL: [PeerKind; 3] =
        [PeerKind::SmgCacheAware, PeerKind::VllmRouterCacheAware, PeerKind::VllmRouterKvAware];

    /// The name in reports and on command lines.
    pub fn name(self) -> &'static str {
        match self {
            PeerKind::SmgCacheAware => "smg-cache-aware",
            PeerKind::VllmRouterCacheAware => "vllm-router-cache-aware",
            PeerKind::VllmRouterKvAware => "vllm-router-kv-aware",
        }
    }

    /// [`PeerKind::name`] back to the kind.
    pub fn parse(s: &str) -> Option<PeerKind> {
        PeerKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// One line for reports: the policy flags it runs with and why.
    pub fn flags(self) -> &'static str {
        match self {
            PeerKind::SmgCacheAware => {
                "smg 1.13.0 launch --policy cache_aware (its default policy and thresholds: \
                 per-worker text prefix trees of what it routed, load spill; it detects the \
                 workers as vLLM engines and polls their load)"
            }
            PeerKind::VllmRouterCacheAware => {
                "vllm-router 0.1.17 --policy cache_aware (its default policy and thresholds: \
                 per-worker text prefix trees of what it routed, load balance)"
            }
            PeerKind::VllmRouterKvAware => {
                "vllm-router 0.1.17 --policy kv_aware with each worker's --kv-event-source and \
                 --kv-event-replay-source, --kv-event-block-size = the workers' block size, \
                 --kv-event-model = the served model (its documented setup: matches the workers' \
                 KV events by token ids; the worker tokenizes each request for it)"
            }
        }
    }

    /// Extra `kvroute-sim` arguments the workers behind this peer need: vllm-router's KV-event
    /// decoder reads only the map-encoded events current vLLM publishes.
    pub fn sim_args(self) -> &'static [&'static str] {
        match self {
            PeerKind::VllmRouterKvAware => &["--event-encoding", "map"],
            _ => &[],
        }
    }

    /// Whether it reads the workers' KV events (then every [`PeerWorker`] needs `events`).
    pub fn uses_events(self) -> bool {
        self == PeerKind::VllmRouterKvAware
    }

    fn program(self) -> &'static str {
        match self {
            PeerKind::SmgCacheAware => "smg",
            PeerKind::VllmRouterCacheAware | PeerKind::VllmRouterKvAware => "vllm-router",
        }
    }
}

/// One worker behind a peer.
#[derive(Debug, Clone)]
pub struct PeerWorker {
    /// `http://127.0.0.1:P`.
    pub url: String,
    /// Its KV-event PUB socket, `tcp://127.0.0.1:E`.
    pub events: Option<String>,
    /// Its replay socket, `tcp://127.0.0.1:R`.
    pub replay: Option<String>,
}

impl PeerWorker {
    /// A simulated worker, with its event and replay sockets.
    pub fn of(w: &crate::sim::SimWorker) -> PeerWorker {
        PeerWorker {
            url: format!("http://{}", w.addr),
            events: Some(format!("tcp://127.0.0.1:{}", w.events_port)),
            replay: Some(format!("tcp://127.0.0.1:{}", w.replay_port)),
        }
    }
}

/// What a peer is started with.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    pub kind: PeerKind,
    pub workers: Vec<PeerWorker>,
    /// The served model name.
    pub model: String,
    /// The workers' KV block size (tokens).
    pub block_size: usize,
    /// A model directory with `tokenizer.json` and `tokenizer_config.json` (chat template),
    /// e.g. `.cache/models/qwen3`. Unused by the three configurations with HTTP workers:
    /// vllm-router's kv_aware has the worker tokenize (it counts exactly the worker's prompt
    /// tokens, any tokenizer), and both cache_aware policies match request text.
    pub tokenizer_dir: Option<PathBuf>,
}

/// The peers' virtual environment (`$KVROUTE_PEERS_VENV`, else `.cache/peers/venv`), or why it
/// is missing.
pub fn venv() -> Result<PathBuf, String> {
    let dir = std::env::var_os("KVROUTE_PEERS_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| paths::repo_root().join(".cache/peers/venv"));
    for bin in ["smg", "vllm-router"] {
        let p = dir.join("bin").join(bin);
        if !p.is_file() {
            return Err(format!(
                "{} not found (run ./dev setup: it installs integration/python/peers.txt there; \
                 or set KVROUTE_PEERS_VENV)",
                p.display()
            ));
        }
    }
    dir.canonicalize().map_err(|e| format!("{}: {e}", dir.display()))
}

/// A running peer router; dropping it kills its process group.
pub struct PeerRouter {
    guard: Guard,
    kind: PeerKind,
    port: u16,
    metrics_port: u16,
    pid: Option<u32>,
    log: PathBuf,
}

/// How long a peer may take to see every worker healthy and answer.
const START_TIMEOUT: Duration = Duration::from_secs(60);

impl PeerRouter {
    /// Starts it (logs under `dir`), waits (bounded) until it reports every worker healthy/ready
    /// and routes.
    pub async fn start(cfg: &PeerConfig, dir: &Path) -> anyhow::Result<PeerRouter> {
        anyhow::ensure!(!cfg.workers.is_empty(), "{}: no workers", cfg.kind.name());
        let venv = venv().map_err(anyhow::Error::msg)?;
        let port = paths::free_port()?;
        let metrics_port = paths::free_port()?;
        let args = command_args(cfg, port, metrics_port)?;
        // The launchers log to stdout: `exec` keeps the pid and sends it to the log with stderr.
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("exec \"$0\" \"$@\" 1>&2").arg(venv.join("bin").join(cfg.kind.program()));
        cmd.args(&args).process_group(0).env("PYTHONUNBUFFERED", "1");
        let log = dir.join(format!("{}.log", cfg.kind.name()));
        let guard = Guard::spawn(cfg.kind.name(), cmd, &log)?;
        let pid = guard.pid();
        let mut router = PeerRouter { guard, kind: cfg.kind, port, metrics_port, pid, log };
        if let Err(e) = router.wait_ready(cfg).await {
            anyhow::bail!("{}: {e:#}\n{}", cfg.kind.name(), router.log_tail(30));
        }
        Ok(router)
    }

    async fn wait_ready(&mut self, cfg: &PeerConfig) -> anyhow::Result<()> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        let base = self.base_url();
        let workers = cfg.workers.len();
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.guard.try_exit() {
                anyhow::bail!("exited at start ({status})");
            }
            if ready(&http, &base, workers).await {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "not ready with {workers} healthy workers within {START_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn kind(&self) -> PeerKind {
        self.kind
    }

    /// `http://127.0.0.1:P`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its Prometheus endpoint, `http://127.0.0.1:Q/metrics`.
    pub fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.metrics_port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.guard.pid()
    }

    /// Resident memory (kB) of its whole process group.
    pub fn rss_kb(&self) -> Option<u64> {
        let pgid = self.pid()?;
        let mut total = None;
        for pid in group_members(pgid) {
            if let Some(kb) = crate::process::rss_kb(pid) {
                *total.get_or_insert(0) += kb;
            }
        }
        total
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        crate::process::log_tail(&self.log, n)
    }

    /// How many KV-event batches it could not decode so far (vllm-router's
    /// `kv_index decode batch: ...` warnings, e.g. array-encoded events or missing fields):
    /// anything above 0 means kv_aware is routing without (some of) the workers' events.
    pub fn undecoded_event_batches(&self) -> usize {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines().filter(|l| l.contains("kv_index decode batch")).count()
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for PeerRouter {
    fn drop(&mut self) {
        // The whole group (the launcher and anything it started); the guard then reaps the child.
        if let Some(pgid) = self.pid {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// Whether `/readiness` counts `workers` healthy workers and `/v1/models` answers.
async fn ready(http: &reqwest::Client, base: &str, workers: usize) -> bool {
    let Ok(r) = http.get(format!("{base}/readiness")).send().await else { return false };
    let Ok(v) = r.json::<serde_json::Value>().await else { return false };
    if v["healthy_workers"].as_u64() != Some(workers as u64) {
        return false;
    }
    let Ok(r) = http.get(format!("{base}/v1/models")).send().await else { return false };
    r.status().is_success()
}

/// The processes whose process group is `pgid` (from /proc).
fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // After the parenthesised command: state, ppid, pgrp.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        if rest.split_whitespace().nth(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid) {
            out.push(pid);
        }
    }
    out
}

/// The launcher's arguments for `cfg`.
pub fn command_args(cfg: &PeerConfig, port: u16, metrics_port: u16) -> anyhow::Result<Vec<String>> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    if cfg.kind == PeerKind::SmgCacheAware {
        push(&["launch"]);
    }
    let (port, metrics_port) = (port.to_string(), metrics_port.to_string());
    push(&["--host", "127.0.0.1", "--port", &port]);
    push(&["--prometheus-host", "127.0.0.1", "--prometheus-port", &metrics_port]);
    a.push("--worker-urls".into());
    a.extend(cfg.workers.iter().map(|w| w.url.clone()));
    match cfg.kind {
        PeerKind::SmgCacheAware | PeerKind::VllmRouterCacheAware => {
            a.extend(["--policy".into(), "cache_aware".into()]);
        }
        PeerKind::VllmRouterKvAware => {
            a.extend(["--policy".into(), "kv_aware".into()]);
            for w in &cfg.workers {
                let ev = w.events.as_ref().with_context(|| {
                    format!("{}: worker {} has no KV-event endpoint", cfg.kind.name(), w.url)
                })?;
                a.extend(["--kv-event-source".into(), format!("{}={ev}", w.url)]);
                if let Some(r) = &w.replay {
                    a.extend(["--kv-event-replay-source".into(), format!("{}={r}", w.url)]);
                }
            }
            a.extend(["--kv-event-block-size".into(), cfg.block_size.to_string()]);
            a.extend(["--kv-event-model".into(), cfg.model.clone()]);
        }
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(kind: PeerKind) -> PeerConfig {
        let workers = (0..2)
            .map(|i| PeerWorker {
                url: format!("http://127.0.0.1:800{i}"),
                events: Some(format!("tcp://127.0.0.1:555{i}")),
                replay: (i == 0).then(|| "tcp://127.0.0.1:5560".to_owned()),
            })
            .collect();
        PeerConfig { kind, workers, model: "qwen3".into(), block_size: 32, tokenizer_dir: None }
    }

    fn after<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2).filter(|w| w[0] == flag).map(|w| w[1].as_str()).collect()
    }

    #[test]
    fn every_peer_binds_loopback_and_runs_its_policy() {
        for kind in PeerKind::ALL {
            let a = command_args(&cfg(kind), 9000, 9001).unwrap();
            assert_eq!(after(&a, "--host"), ["127.0.0.1"], "{kind:?}");
            assert_eq!(after(&a, "--prometheus-host"), ["127.0.0.1"], "{kind:?}");
            assert_eq!(after(&a, "--prometheus-port"), ["9001"], "{kind:?}");
            let policy = if kind.uses_events() { "kv_aware" } else { "cache_aware" };
            assert_eq!(after(&a, "--policy"), [policy], "{kind:?}");
            assert_eq!(PeerKind::parse(kind.name()), Some(kind));
        }
        let smg = command_args(&cfg(PeerKind::SmgCacheAware), 1, 2).unwrap();
        assert_eq!(smg[0], "launch");
        for kind in PeerKind::ALL {
            let a = command_args(&cfg(kind), 1, 2).unwrap();
            assert_eq!(after(&a, "--worker-urls"), ["http://127.0.0.1:8000"]);
            assert!(a.contains(&"http://127.0.0.1:8001".to_owned()));
        }
    }

    #[test]
    fn kv_aware_gets_each_workers_events_block_size_and_model() {
        let a = command_args(&cfg(PeerKind::VllmRouterKvAware), 1, 2).unwrap();
        assert_eq!(
            after(&a, "--kv-event-source"),
            [
                "http://127.0.0.1:8000=tcp://127.0.0.1:5550",
                "http://127.0.0.1:8001=tcp://127.0.0.1:5551"
            ]
        );
        assert_eq!(
            after(&a, "--kv-event-replay-source"),
            ["http://127.0.0.1:8000=tcp://127.0.0.1:5560"]
        );
        assert_eq!(after(&a, "--kv-event-block-size"), ["32"]);
        assert_eq!(after(&a, "--kv-event-model"), ["qwen3"]);
        let mut no_events = cfg(PeerKind::VllmRouterKvAware);
        no_events.workers[1].events = None;
        assert!(command_args(&no_events, 1, 2).is_err());
    }
}
