//! NVIDIA Dynamo's KV router (ai-dynamo 1.6.1, `python -m dynamo.frontend --router-mode kv`) in
//! front of simulated workers, from the pinned wheels `./dev setup` installs into
//! `.cache/peers/dynamo-venv` (`integration/python/dynamo.txt`). No etcd, NATS or GPU: file-backed
//! discovery under the run's directory, Dynamo's TCP request plane, its ZMQ event plane.
//!
//! Dynamo's frontend routes only to workers registered through its runtime, so each simulated
//! worker gets a bridge process (`integration/python/dynamo_bridge.py worker`): it registers as a
//! Dynamo worker, forwards Dynamo's preprocessed token-id requests to the worker's
//! `/v1/completions` and relays the worker's vLLM-format ZMQ KV events into Dynamo's router (an
//! extra hop the other peers do not have). A ZMQ broker (`dynamo_bridge.py broker`) on 127.0.0.1
//! carries the event plane: without one, each Dynamo publisher binds its PUB socket on 0.0.0.0.
//! Every process runs in its own process group, killed when the [`DynamoRouter`] drops.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio::process::Command;

use crate::paths;
use crate::peers::PeerConfig;
use crate::process::Guard;

/// How long the frontend may take to list the model with every worker added to its router.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The router's configuration, one line for reports.
pub fn flags() -> &'static str {
    "dynamo 1.6.1 frontend --router-mode kv --kv-cache-block-size = the workers' block size \
     (its KV router with its defaults: KV events on, fed by the workers' own events through \
     one bridge per worker; overlap credit 1.0, temperature 0.0 (deterministic), active blocks \
     and prefill tokens tracked for load; discovery file, request plane tcp, event plane zmq \
     through a loopback broker)"
}

/// Dynamo's virtual environment (`$KVROUTE_DYNAMO_VENV`, else `.cache/peers/dynamo-venv`), or
/// why it is missing.
pub fn dynamo_venv() -> Result<PathBuf, String> {
    let dir = std::env::var_os("KVROUTE_DYNAMO_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| paths::repo_root().join(".cache/peers/dynamo-venv"));
    let probe = dir.join("lib/python3.11/site-packages/dynamo/frontend");
    if !dir.join("bin/python").is_file() || !probe.is_dir() {
        return Err(format!(
            "{} has no Dynamo frontend (run ./dev setup: it installs integration/python/dynamo.txt \
             there; or set KVROUTE_DYNAMO_VENV)",
            dir.display()
        ));
    }
    dir.canonicalize().map_err(|e| format!("{}: {e}", dir.display()))
}

/// A running Dynamo frontend with its bridges and event-plane broker.
pub struct DynamoRouter {
    frontend: Guard,
    bridges: Vec<Guard>,
    broker: Guard,
    /// Process groups to kill on drop (every process started here leads its own).
    groups: Vec<u32>,
    port: u16,
    log: PathBuf,
    bridge_logs: Vec<PathBuf>,
    instances: Vec<u64>,
}

impl DynamoRouter {
    /// Starts the broker, one bridge per worker and the frontend (logs, discovery store, model
    /// directory and Dynamo's caches under `dir`); waits (bounded) until the frontend lists the
    /// model with every worker added to its KV router.
    pub async fn start(cfg: &PeerConfig, dir: &Path) -> anyhow::Result<DynamoRouter> {
        anyhow::ensure!(!cfg.workers.is_empty(), "dynamo: no workers");
        let venv = dynamo_venv().map_err(anyhow::Error::msg)?;
        let python = venv.join("bin/python");
        let bridge_py = paths::repo_root().join("integration/python/dynamo_bridge.py");
        let model_dir = model_dir(cfg, dir)?;
        let env = Env::new(dir)?;

        let (xsub, xpub) = (paths::free_port()?, paths::free_port()?);
        let mut cmd = Command::new(&python);
        cmd.arg(&bridge_py).args(["broker", "--xsub-port", &xsub.to_string()]);
        cmd.args(["--xpub-port", &xpub.to_string()]);
        let mut broker = env.spawn("dynamo-broker", cmd, &dir.join("dynamo-broker.log"))?;
        let mut groups: Vec<u32> = broker.pid().into_iter().collect();
        broker.wait_line("broker ready", Duration::from_secs(20)).await?;

        let mut bridges = Vec::new();
        let mut bridge_logs = Vec::new();
        for (i, w) in cfg.workers.iter().enumerate() {
            let events = w
                .events
                .as_ref()
                .with_context(|| format!("dynamo: worker {} has no KV-event endpoint", w.url))?;
            let mut cmd = Command::new(&python);
            cmd.arg(&bridge_py).arg("worker").args(["--index", &i.to_string()]);
            cmd.args(["--sim-url", &w.url, "--sim-events", events, "--sim-model", &cfg.model]);
            cmd.arg("--model-dir").arg(&model_dir).args(["--model-name", &cfg.model]);
            cmd.args(["--block-size", &cfg.block_size.to_string()]);
            cmd.args(["--broker", &format!("{xsub},{xpub}")]);
            // Our hop logs warnings only (Dynamo's runtime logs every request at info).
            cmd.env("DYN_LOG", "warn");
            let log = dir.join(format!("dynamo-bridge-{i}.log"));
            let g = env.spawn(&format!("dynamo-bridge-{i}"), cmd, &log)?;
            groups.extend(g.pid());
            bridges.push(g);
            bridge_logs.push(log);
        }

        let port = paths::free_port()?;
        // `python -m dynamo.frontend` run by the bridge script (same process, both outputs to the
        // log), which only adds: exit when this process dies.
        let mut cmd = Command::new(&python);
        cmd.arg(&bridge_py).args(["frontend", "--http-host", "127.0.0.1"]);
        cmd.args(["--http-port", &port.to_string(), "--router-mode", "kv"]);
        cmd.args(["--kv-cache-block-size", &cfg.block_size.to_string()]);
        cmd.args(["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]);
        cmd.env(
            "DYN_ZMQ_BROKER_URL",
            format!("xsub=tcp://127.0.0.1:{xsub} , xpub=tcp://127.0.0.1:{xpub}"),
        );
        let log = dir.join("dynamo-frontend.log");
        let frontend = env.spawn("dynamo-frontend", cmd, &log)?;
        groups.extend(frontend.pid());

        let mut router = DynamoRouter {
            frontend,
            bridges,
            broker,
            groups,
            port,
            log,
            bridge_logs,
            instances: Vec::new(),
        };
        if let Err(e) = router.wait_ready(&cfg.model).await {
            let bridges: String = (0..router.bridges.len())
                .map(|i| format!("--- bridge {i}\n{}\n", router.bridge_log_tail(i, 10)))
                .collect();
            anyhow::bail!("dynamo: {e:#}\n--- frontend\n{}\n{bridges}", router.log_tail(30));
        }
        Ok(router)
    }

    async fn wait_ready(&mut self, model: &str) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        for (i, b) in self.bridges.iter_mut().enumerate() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let line = b.wait_line("bridge ready", left).await?;
            let id = line.rsplit(' ').next().and_then(|s| s.parse::<u64>().ok());
            self.instances.push(id.with_context(|| format!("bridge {i}: no instance id"))?);
        }
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        loop {
            for g in std::iter::once(&mut self.frontend)
                .chain(self.bridges.iter_mut())
                .chain(std::iter::once(&mut self.broker))
            {
                if let Some(status) = g.try_exit() {
                    anyhow::bail!("{} exited at start ({status})", g.name);
                }
            }
            if self.workers_added() && lists_model(&http, &self.base_url(), model).await {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the frontend did not list '{model}' with {} workers within {START_TIMEOUT:?}",
                self.instances.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether the frontend's log shows every bridge's instance added to its KV router.
    fn workers_added(&self) -> bool {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let added: Vec<&str> = text.lines().filter(|l| l.contains("Adding worker")).collect();
        self.instances.iter().all(|id| {
            let needle = format!("worker_id: {id},");
            added.iter().any(|l| l.contains(&needle))
        })
    }

    /// `http://127.0.0.1:P`, the frontend's OpenAI API (and `/metrics`).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The frontend's pid.
    pub fn pid(&self) -> Option<u32> {
        self.frontend.pid()
    }

    /// The frontend's resident memory (kB).
    pub fn rss_kb(&self) -> Option<u64> {
        self.frontend.rss_kb()
    }

    /// The bridges' and the broker's resident memory together (kB): the extra hop's cost.
    pub fn bridge_rss_kb(&self) -> Option<u64> {
        let all = self.bridges.iter().chain(std::iter::once(&self.broker));
        all.filter_map(Guard::rss_kb).fold(None, |acc, kb| Some(acc.unwrap_or(0) + kb))
    }

    /// Dynamo's instance id (its router's `worker_id`, the frontend's `nvext.worker_id` when a
    /// request asks for `nvext.extra_fields: ["worker_id"]`) of each worker, by worker index.
    pub fn instances(&self) -> &[u64] {
        &self.instances
    }

    /// The worker index behind Dynamo instance `id`.
    pub fn worker_of(&self, id: u64) -> Option<usize> {
        self.instances.iter().position(|&i| i == id)
    }

    /// The last `n` lines of the frontend's log.
    pub fn log_tail(&self, n: usize) -> String {
        crate::process::log_tail(&self.log, n)
    }

    /// The last `n` lines of bridge `i`'s log.
    pub fn bridge_log_tail(&self, i: usize, n: usize) -> String {
        self.bridge_logs.get(i).map(|p| crate::process::log_tail(p, n)).unwrap_or_default()
    }
}

impl Drop for DynamoRouter {
    fn drop(&mut self) {
        // Each group (a process and anything it started); the guards then reap their children.
        for pgid in &self.groups {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// What every Dynamo process shares: Dynamo's file store and caches under the run's directory,
/// loopback addresses, no colour, no Hugging Face access.
struct Env {
    vars: Vec<(&'static str, String)>,
}

impl Env {
    fn new(dir: &Path) -> anyhow::Result<Env> {
        let home = dir.join("dynamo-home");
        std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let vars = vec![
            // Dynamo writes its model cards under ~/.cache/dynamo.
            ("HOME", s(&home)),
            ("XDG_CACHE_HOME", s(&home.join(".cache"))),
            ("TMPDIR", s(&home)),
            ("DYN_FILE_KV", s(&dir.join("dynamo-store"))),
            ("DYN_TCP_RPC_HOST", "127.0.0.1".into()),
            ("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1".into()),
            ("DYN_EVENT_PLANE_HOST", "127.0.0.1".into()),
            ("DYN_SELF_HOST_METADATA", "0".into()),
            ("HF_HUB_OFFLINE", "1".into()),
            ("NO_COLOR", "1".into()),
            ("PYTHONUNBUFFERED", "1".into()),
        ];
        Ok(Env { vars })
    }

    fn spawn(&self, name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Guard> {
        cmd.envs(self.vars.iter().map(|(k, v)| (k, v))).process_group(0);
        Guard::spawn(name, cmd, log)
    }
}

/// Whether `/v1/models` lists `model`.
async fn lists_model(http: &reqwest::Client, base: &str, model: &str) -> bool {
    let Ok(r) = http.get(format!("{base}/v1/models")).send().await else { return false };
    let Ok(v) = r.json::<serde_json::Value>().await else { return false };
    v["data"].as_array().is_some_and(|d| d.iter().any(|m| m["id"].as_str() == Some(model)))
}

/// The model directory Dynamo's workers register: the tokenizer bundle (`cfg.tokenizer_dir`, else
/// the sims' built-in demo bundle) and a minimal `config.json` (Dynamo refuses a directory
/// without one; it reads the context length and the special tokens from it, no weights).
fn model_dir(cfg: &PeerConfig, dir: &Path) -> anyhow::Result<PathBuf> {
    let src =
        cfg.tokenizer_dir.clone().unwrap_or_else(|| paths::repo_root().join("assets/demo-model"));
    let out = dir.join("dynamo-model");
    std::fs::create_dir_all(&out)?;
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), out.join(f))
            .with_context(|| format!("copying {}", src.join(f).display()))?;
    }
    let tokenizer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer.json"))?)?;
    let tcfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer_config.json"))?)?;
    let config = config_json(&tokenizer, &tcfg);
    std::fs::write(out.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    Ok(out)
}

/// A Llama-style `config.json` for a tokenizer: vocabulary size and special token ids from the
/// bundle, a 128 k-token context (the sims' prompts are never refused for length here).
pub fn config_json(tokenizer: &serde_json::Value, tcfg: &serde_json::Value) -> serde_json::Value {
    let added = tokenizer["added_tokens"].as_array().cloned().unwrap_or_default();
    let id_of = |key: &str| -> Option<u64> {
        // `eos_token` is a string or an AddedToken object with `content`.
        let tok = tcfg[key].as_str().or_else(|| tcfg[key]["content"].as_str())?;
        let added_id = added.iter().find(|t| t["content"].as_str() == Some(tok));
        added_id
            .and_then(|t| t["id"].as_u64())
            .or_else(|| tokenizer["model"]["vocab"][tok].as_u64())
    };
    let vocab = tokenizer["model"]["vocab"].as_object().map_or(0, |v| v.len() as u64);
    let max_added = added.iter().filter_map(|t| t["id"].as_u64()).max().map_or(0, |m| m + 1);
    let mut c = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "vocab_size": vocab.max(max_added),
        "torch_dtype": "bfloat16",
    });
    if let Some(id) = id_of("bos_token") {
        c["bos_token_id"] = id.into();
    }
    if let Some(id) = id_of("eos_token") {
        c["eos_token_id"] = id.into();
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_json_finds_special_tokens() {
        let tok = serde_json::json!({
            "model": {"vocab": {"a": 0, "b": 1, "c": 2}},
            "added_tokens": [{"id": 7, "content": "<eos>"}, {"id": 8, "content": "<bos>"}],
        });
        let tcfg = serde_json::json!({"eos_token": "<eos>", "bos_token": {"content": "<bos>"}});
        let c = config_json(&tok, &tcfg);
        assert_eq!(c["eos_token_id"], 7);
        assert_eq!(c["bos_token_id"], 8);
        assert_eq!(c["vocab_size"], 9);
        let c = config_json(&tok, &serde_json::json!({}));
        assert!(c.get("eos_token_id").is_none());
    }
}
