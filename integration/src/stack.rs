//! A whole stack on loopback: N simulated workers, one Envoy (kvroute filter or a baseline
//! policy) in front of them. Dropping the stack stops every process.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};

use crate::envoy::{self, Envoy};
use crate::paths;
use crate::process::Guard;
use crate::sim::SimWorker;

/// Which decision Envoy makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The kvroute wasm filter with `override_host`.
    Kvroute,
    /// Envoy's LEAST_REQUEST, no filter.
    LeastRequest,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Kvroute => "kvroute",
            Policy::LeastRequest => "least-request",
        }
    }

    fn template(self) -> &'static str {
        match self {
            Policy::Kvroute => "kvroute.yaml",
            Policy::LeastRequest => "least-request.yaml",
        }
    }
}

/// How to build a stack.
#[derive(Debug, Clone)]
pub struct StackOptions {
    pub policy: Policy,
    pub workers: usize,
    /// Extra flags for every simulated worker.
    pub sim_args: Vec<String>,
    /// Merged into the filter configuration (top-level keys; `model` keys go to the model).
    pub filter: Value,
    pub model_overrides: Value,
    pub envoy_concurrency: u32,
    /// Start kvroute-updater following every worker's KV events.
    pub updater: bool,
}

impl Default for StackOptions {
    fn default() -> Self {
        StackOptions {
            policy: Policy::Kvroute,
            workers: 3,
            sim_args: Vec::new(),
            filter: json!({}),
            model_overrides: json!({}),
            envoy_concurrency: 2,
            updater: false,
        }
    }
}

pub const MODEL: &str = "kvroute-demo";

pub struct Stack {
    pub envoy: Envoy,
    pub workers: Vec<SimWorker>,
    pub updater: Option<Updater>,
    pub dir: PathBuf,
}

/// Shared token between the updater and Envoy's snapshot singleton in test stacks.
pub const UPDATER_TOKEN: &str = "kvroute-test-token-0123456789";

/// A running kvroute-updater.
pub struct Updater {
    pub guard: Guard,
    pub port: u16,
    args: Vec<String>,
    log: PathBuf,
}

impl Updater {
    async fn start(
        port: u16,
        envoy_admin: u16,
        workers: &[SimWorker],
        dir: &std::path::Path,
    ) -> anyhow::Result<Updater> {
        let endpoints: Vec<String> = workers
            .iter()
            .map(|w| {
                format!(
                    "{},tcp://127.0.0.1:{},tcp://127.0.0.1:{}",
                    w.addr, w.events_port, w.replay_port
                )
            })
            .collect();
        Self::start_for(port, Some(envoy_admin), &endpoints, dir).await
    }

    /// Starts the updater on `port` following `endpoints` (`http,events,replay` as its
    /// `--worker` flag takes them), with Envoy's admin deciding membership if given.
    pub async fn start_for(
        port: u16,
        envoy_admin: Option<u16>,
        endpoints: &[String],
        dir: &std::path::Path,
    ) -> anyhow::Result<Updater> {
        let mut args = vec![
            "--listen".to_string(),
            format!("127.0.0.1:{port}"),
            "--token".into(),
            UPDATER_TOKEN.into(),
            "--align-interval-ms".into(),
            "300".into(),
        ];
        if let Some(admin) = envoy_admin {
            args.push("--envoy-admin".into());
            args.push(format!("http://127.0.0.1:{admin}"));
        }
        for e in endpoints {
            args.push("--worker".into());
            args.push(e.clone());
        }
        let log = dir.join("updater.log");
        let guard = Self::spawn(&args, &log).await?;
        Ok(Updater { guard, port, args, log })
    }

    async fn spawn(args: &[String], log: &std::path::Path) -> anyhow::Result<Guard> {
        let mut cmd = tokio::process::Command::new(paths::updater_bin()?);
        cmd.args(args);
        let mut guard = Guard::spawn("kvroute-updater", cmd, log)?;
        guard.wait_line("listening on", Duration::from_secs(30)).await?;
        Ok(guard)
    }

    /// Kills the updater (an outage).
    pub async fn stop(&mut self) {
        self.guard.kill().await;
    }

    /// Starts it again on the same port.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.guard.kill().await;
        self.guard = Self::spawn(&self.args, &self.log).await?;
        Ok(())
    }

    /// The updater's `/status`.
    pub async fn status(&self) -> anyhow::Result<Value> {
        Ok(reqwest::get(format!("http://127.0.0.1:{}/status", self.port)).await?.json().await?)
    }
}

fn merge(into: &mut Value, from: &Value) {
    if let (Some(a), Some(b)) = (into.as_object_mut(), from.as_object()) {
        for (k, v) in b {
            a.insert(k.clone(), v.clone());
        }
    }
}

/// The filter configuration for `addrs`.
pub fn filter_config(addrs: &[String], opts: &StackOptions) -> Value {
    let mut model = json!({"name": MODEL, "workers": addrs});
    merge(&mut model, &opts.model_overrides);
    let mut cfg = json!({"models": [model], "expose_decision_header": true});
    merge(&mut cfg, &opts.filter);
    cfg
}

/// Loopback ports of one stack.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub admin: u16,
    pub listen: u16,
    pub updater: u16,
}

/// Renders `template` for the given ports and workers into `dir`.
pub fn write_config(
    template: &str,
    dir: &std::path::Path,
    ports: Ports,
    addrs: &[String],
    filter: &Value,
) -> anyhow::Result<PathBuf> {
    let path = paths::repo_root().join("envoy").join(template);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    write_config_text(template, &text, dir, ports, addrs, filter)
}

/// Renders template `text` (named `name`) for the given ports and workers into `dir`.
pub fn write_config_text(
    name: &str,
    text: &str,
    dir: &std::path::Path,
    ports: Ports,
    addrs: &[String],
    filter: &Value,
) -> anyhow::Result<PathBuf> {
    let wasm = paths::wasm_path()?;
    let vars = [
        ("ADMIN_PORT", ports.admin.to_string()),
        ("LISTEN_PORT", ports.listen.to_string()),
        ("UPDATER_PORT", ports.updater.to_string()),
        ("WASM_PATH", wasm.display().to_string()),
        ("ENDPOINTS", envoy::endpoints(addrs)?),
        ("KVROUTE_CONFIG", filter.to_string()),
    ];
    let out = dir.join(name);
    std::fs::write(&out, envoy::render(text, &vars)?)?;
    Ok(out)
}

impl Stack {
    pub async fn start(opts: StackOptions) -> anyhow::Result<Stack> {
        let dir = paths::scratch_dir(opts.policy.name())?;
        let mut workers = Vec::new();
        for i in 0..opts.workers {
            workers.push(SimWorker::start(i, &opts.sim_args, &dir).await?);
        }
        let addrs: Vec<String> = workers.iter().map(|w| w.addr.clone()).collect();
        let ports = Ports {
            admin: paths::free_port()?,
            listen: paths::free_port()?,
            updater: paths::free_port()?,
        };
        let updater = match opts.updater {
            true => Some(Updater::start(ports.updater, ports.admin, &workers, &dir).await?),
            false => None,
        };
        let filter = filter_config(&addrs, &opts);
        let config = write_config(opts.policy.template(), &dir, ports, &addrs, &filter)?;
        let envoy =
            Envoy::start(&config, ports.admin, ports.listen, &dir, opts.envoy_concurrency).await?;
        let stack = Stack { envoy, workers, updater, dir };
        stack.wait_healthy(opts.workers).await?;
        Ok(stack)
    }

    pub fn base_url(&self) -> String {
        self.envoy.base_url()
    }

    pub fn addrs(&self) -> Vec<String> {
        self.workers.iter().map(|w| w.addr.clone()).collect()
    }

    /// Waits until Envoy's active health checks report `n` healthy workers.
    pub async fn wait_healthy(&self, n: usize) -> anyhow::Result<()> {
        self.envoy.wait_healthy(n).await
    }

    /// Kills worker `i`'s process (its port goes away).
    pub async fn kill_worker(&mut self, i: usize) {
        self.workers[i].guard.kill().await;
    }
}
