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
pub enum RoutePolicy {
    /// The kvroute wasm filter with `override_host`.
    Kvroute,
    /// Envoy's LEAST_REQUEST, no filter.
    LeastRequest,
}

impl RoutePolicy {
    pub fn name(self) -> &'static str {
        match self {
            RoutePolicy::Kvroute => "kvroute",
            RoutePolicy::LeastRequest => "least-request",
        }
    }

    fn template(self) -> &'static str {
        match self {
            RoutePolicy::Kvroute => "kvroute.yaml",
            RoutePolicy::LeastRequest => "least-request.yaml",
        }
    }
}

/// How the filter gets a pool's model bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BundleFrom {
    /// From the updater, through the singleton and shared data (`"bundle": "updater"`).
    Updater,
    /// Inline in the plugin configuration (`tokenizer` + `tokenizer_config`; for the demo
    /// model, nothing: the built-in bundle).
    Inline,
    /// From the updater, but only the bundle with this fingerprint (`"bundle": "<16 hex>"`).
    Pinned(u64),
}

/// One model's pool in a stack: its workers serve that model only.
#[derive(Debug, Clone)]
pub struct Pool {
    /// The model id clients send and the workers serve.
    pub model: String,
    /// Its Hugging Face style bundle directory; `None`: the built-in demo bundle.
    pub dir: Option<PathBuf>,
    pub workers: usize,
    pub bundle: BundleFrom,
}

/// The model id of the Qwen3 pool in test stacks.
pub const QWEN3_MODEL: &str = "qwen3";

impl Pool {
    /// The demo model, its bundle from the updater.
    pub fn demo(workers: usize) -> Pool {
        Pool { model: MODEL.into(), dir: None, workers, bundle: BundleFrom::Updater }
    }

    /// Qwen3 (`./dev setup` fetches its bundle), its bundle from the updater.
    pub fn qwen3(workers: usize) -> Pool {
        Pool {
            model: QWEN3_MODEL.into(),
            dir: Some(kvroute_core::decision::tokenize::model::qwen3_dir()),
            workers,
            bundle: BundleFrom::Updater,
        }
    }

    /// The simulated workers' flags for this model.
    pub fn sim_args(&self) -> Vec<String> {
        let mut a = vec!["--model".to_string(), self.model.clone()];
        if let Some(d) = &self.dir {
            a.push("--model-dir".into());
            a.push(d.display().to_string());
        }
        a
    }

    /// The updater's `--model` value for this model (`NAME=DIR`, or `NAME` for the demo).
    pub fn updater_model(&self) -> String {
        match &self.dir {
            Some(d) => format!("{}={}", self.model, d.display()),
            None => self.model.clone(),
        }
    }

    /// This pool's entry of the filter configuration.
    pub fn filter_model(&self, addrs: &[String]) -> anyhow::Result<Value> {
        let mut m = json!({"name": self.model, "workers": addrs});
        match (self.bundle, &self.dir) {
            (BundleFrom::Updater, _) => m["bundle"] = json!("updater"),
            (BundleFrom::Pinned(fp), _) => m["bundle"] = json!(format!("{fp:016x}")),
            (BundleFrom::Inline, None) => {}
            (BundleFrom::Inline, Some(d)) => {
                let read = |f: &str| -> anyhow::Result<Value> {
                    let p = d.join(f);
                    let text = std::fs::read_to_string(&p)
                        .with_context(|| format!("reading {}", p.display()))?;
                    Ok(serde_json::from_str(&text)?)
                };
                m["tokenizer"] = read("tokenizer.json")?;
                m["tokenizer_config"] = read("tokenizer_config.json")?;
            }
        }
        Ok(m)
    }
}

/// The workers of one pool of a running stack.
#[derive(Debug, Clone)]
pub struct PoolAddrs {
    pub model: String,
    pub addrs: Vec<String>,
}

/// How to build a stack.
#[derive(Debug, Clone)]
pub struct StackOptions {
    pub policy: RoutePolicy,
    /// Workers of the single demo pool when `pools` is empty.
    pub workers: usize,
    /// Several models, each with its own workers (replaces `workers` and `model_overrides`).
    pub pools: Vec<Pool>,
    /// Extra flags for every simulated worker.
    pub sim_args: Vec<String>,
    /// Merged into the filter configuration (top-level keys; `model` keys go to the model).
    pub filter: Value,
    pub model_overrides: Value,
    pub envoy_concurrency: u32,
    /// Start kvroute-updater following every worker's KV events.
    pub updater: bool,
    /// Text replacements (`from`, `to`) applied to the Envoy template before rendering, to
    /// run the stack the way a deployment that lacks a piece would (each `from` must occur).
    pub envoy_edits: Vec<(String, String)>,
}

impl Default for StackOptions {
    fn default() -> Self {
        StackOptions {
            policy: RoutePolicy::Kvroute,
            workers: 3,
            pools: Vec::new(),
            sim_args: Vec::new(),
            filter: json!({}),
            model_overrides: json!({}),
            envoy_concurrency: 2,
            updater: false,
            envoy_edits: Vec::new(),
        }
    }
}

pub const MODEL: &str = "kvroute-demo";

pub struct Stack {
    pub envoy: Envoy,
    pub workers: Vec<SimWorker>,
    /// Which workers serve which model (one pool of every worker when no pools were given).
    pub pools: Vec<PoolAddrs>,
    pub updater: Option<Updater>,
    pub dir: PathBuf,
    /// The port Envoy's singleton polls for the updater (whether or not one was started).
    pub updater_port: u16,
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
        models: &[String],
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
        Self::start_with(port, Some(envoy_admin), &endpoints, models, dir).await
    }

    /// Starts the updater on `port` following `endpoints` (`http,events,replay` as its
    /// `--worker` flag takes them), with Envoy's admin deciding membership if given.
    pub async fn start_for(
        port: u16,
        envoy_admin: Option<u16>,
        endpoints: &[String],
        dir: &std::path::Path,
    ) -> anyhow::Result<Updater> {
        Self::start_with(port, envoy_admin, endpoints, &[], dir).await
    }

    /// [`Updater::start_for`] serving `models` (its `--model` values, `NAME=DIR` or `NAME`;
    /// none: the updater's default, the demo model).
    pub async fn start_with(
        port: u16,
        envoy_admin: Option<u16>,
        endpoints: &[String],
        models: &[String],
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
        for m in models {
            args.push("--model".into());
            args.push(m.clone());
        }
        let log = dir.join("updater.log");
        let guard = Self::spawn(&args, &log).await?;
        Ok(Updater { guard, port, args, log })
    }

    /// [`Updater::start_for`] with `extra` flags appended (e.g. `--scrape-interval-ms`).
    pub async fn start_with_args(
        port: u16,
        envoy_admin: Option<u16>,
        endpoints: &[String],
        extra: &[String],
        dir: &std::path::Path,
    ) -> anyhow::Result<Updater> {
        let mut u = Self::start_with(port, envoy_admin, endpoints, &[], dir).await?;
        if !extra.is_empty() {
            u.args.extend(extra.iter().cloned());
            u.restart().await?;
        }
        Ok(u)
    }

    async fn spawn(args: &[String], log: &std::path::Path) -> anyhow::Result<Guard> {
        let mut cmd = tokio::process::Command::new(paths::updater_bin()?);
        cmd.args(args);
        let mut guard = Guard::spawn("kvroute-updater", cmd, log)?;
        guard.wait_line("listening on", Duration::from_secs(30)).await?;
        Ok(guard)
    }

    /// Starts it again following the Envoy whose admin is on `admin` (the `--envoy-admin` that
    /// decides membership).
    pub async fn follow_admin(&mut self, admin: u16) -> anyhow::Result<()> {
        let at = self.args.iter().position(|a| a == "--envoy-admin");
        let Some(value) = at.and_then(|i| self.args.get_mut(i + 1)) else {
            anyhow::bail!("this updater follows no Envoy admin");
        };
        *value = format!("http://127.0.0.1:{admin}");
        self.restart().await
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

    /// Starts it again on the same port serving `models` instead (`--model` values): a new
    /// bundle for a model is a new fingerprint.
    pub async fn restart_with_models(&mut self, models: &[String]) -> anyhow::Result<()> {
        let mut args = Vec::new();
        let mut it = self.args.iter();
        while let Some(a) = it.next() {
            if a == "--model" {
                it.next();
            } else {
                args.push(a.clone());
            }
        }
        for m in models {
            args.push("--model".into());
            args.push(m.clone());
        }
        self.args = args;
        self.restart().await
    }

    /// The updater's `/status`.
    pub async fn status(&self) -> anyhow::Result<Value> {
        Ok(reqwest::get(format!("http://127.0.0.1:{}/status", self.port)).await?.json().await?)
    }
}

/// Inserts `from`'s top-level keys into `into` (replacing those it has).
pub fn merge(into: &mut Value, from: &Value) {
    if let (Some(a), Some(b)) = (into.as_object_mut(), from.as_object()) {
        for (k, v) in b {
            a.insert(k.clone(), v.clone());
        }
    }
}

/// The filter configuration for `addrs` (one demo pool; `opts.pools` are ignored here, see
/// [`pools_filter_config`]). In `opts.filter` and `opts.model_overrides`, a string or object
/// key `$worker<i>` stands for `addrs[i]` (the workers' ports are known only once they run).
pub fn filter_config(addrs: &[String], opts: &StackOptions) -> Value {
    let mut model = json!({"name": MODEL, "workers": addrs});
    merge(&mut model, &place_workers(&opts.model_overrides, addrs));
    let mut cfg = json!({"models": [model], "expose_decision_header": true});
    merge(&mut cfg, &place_workers(&opts.filter, addrs));
    cfg
}

/// `v` with every string and object key `$worker<i>` replaced by `addrs[i]` (others kept).
pub fn place_workers(v: &Value, addrs: &[String]) -> Value {
    let place = |s: &str| {
        s.strip_prefix("$worker")
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| addrs.get(i))
            .cloned()
            .unwrap_or_else(|| s.to_owned())
    };
    match v {
        Value::String(s) => Value::String(place(s)),
        Value::Array(a) => Value::Array(a.iter().map(|x| place_workers(x, addrs)).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, x)| (place(k), place_workers(x, addrs))).collect())
        }
        other => other.clone(),
    }
}

/// The filter configuration of a stack with several pools, `addrs[i]` the workers of
/// `pools[i]`.
pub fn pools_filter_config(
    pools: &[Pool],
    addrs: &[Vec<String>],
    opts: &StackOptions,
) -> anyhow::Result<Value> {
    let models: Vec<Value> =
        pools.iter().zip(addrs).map(|(p, a)| p.filter_model(a)).collect::<anyhow::Result<_>>()?;
    let mut cfg = json!({"models": models, "expose_decision_header": true});
    merge(&mut cfg, &opts.filter);
    Ok(cfg)
}

/// Loopback ports of one stack.
#[derive(Debug, Clone, Copy)]
pub struct StackPorts {
    pub admin: u16,
    pub listen: u16,
    pub updater: u16,
}

/// Renders `template` for the given ports and workers into `dir`.
pub fn write_config(
    template: &str,
    dir: &std::path::Path,
    ports: StackPorts,
    addrs: &[String],
    filter: &Value,
) -> anyhow::Result<PathBuf> {
    let text = edited_template(template, &[])?;
    write_config_text(template, &text, dir, ports, addrs, filter)
}

/// Envoy template `name`'s text with each of `edits` (from, to) made; an edit whose `from` is
/// not there is an error.
pub fn edited_template(name: &str, edits: &[(String, String)]) -> anyhow::Result<String> {
    let path = paths::repo_root().join("envoy").join(name);
    let mut t =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    for (from, to) in edits {
        anyhow::ensure!(t.contains(from.as_str()), "{name} has no {from:?} to edit");
        t = t.replace(from.as_str(), to);
    }
    Ok(t)
}

/// Renders template `text` (named `name`) for the given ports and workers into `dir`.
pub fn write_config_text(
    name: &str,
    text: &str,
    dir: &std::path::Path,
    ports: StackPorts,
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
        let mut pools = Vec::new();
        if opts.pools.is_empty() {
            for i in 0..opts.workers {
                workers.push(SimWorker::start(i, &opts.sim_args, &dir).await?);
            }
            let addrs = workers.iter().map(|w| w.addr.clone()).collect();
            pools.push(PoolAddrs { model: MODEL.into(), addrs });
        }
        for p in &opts.pools {
            let mut args = p.sim_args();
            args.extend(opts.sim_args.iter().cloned());
            let mut addrs = Vec::new();
            for _ in 0..p.workers {
                let w = SimWorker::start(workers.len(), &args, &dir).await?;
                addrs.push(w.addr.clone());
                workers.push(w);
            }
            pools.push(PoolAddrs { model: p.model.clone(), addrs });
        }
        let addrs: Vec<String> = workers.iter().map(|w| w.addr.clone()).collect();
        let ports = StackPorts {
            admin: paths::free_port()?,
            listen: paths::free_port()?,
            updater: paths::free_port()?,
        };
        let models: Vec<String> = opts.pools.iter().map(Pool::updater_model).collect();
        let mut updater = match opts.updater {
            true => {
                Some(Updater::start(ports.updater, ports.admin, &workers, &models, &dir).await?)
            }
            false => None,
        };
        let filter = if opts.pools.is_empty() {
            filter_config(&addrs, &opts)
        } else {
            let per_pool: Vec<Vec<String>> = pools.iter().map(|p| p.addrs.clone()).collect();
            pools_filter_config(&opts.pools, &per_pool, &opts)?
        };
        let name = opts.policy.template();
        let text = edited_template(name, &opts.envoy_edits)?;
        let config = |admin, listen| {
            let ports = StackPorts { admin, listen, ..ports };
            write_config_text(name, &text, &dir, ports, &addrs, &filter)
        };
        let first = (ports.admin, ports.listen);
        let envoy =
            Envoy::start_retrying_ports(first, &dir, opts.envoy_concurrency, config).await?;
        if let Some(u) = updater.as_mut().filter(|_| envoy.admin_port != ports.admin) {
            u.follow_admin(envoy.admin_port).await?;
        }
        let n = workers.len();
        let stack = Stack { envoy, workers, pools, updater, dir, updater_port: ports.updater };
        stack.wait_healthy(n).await?;
        Ok(stack)
    }

    pub fn base_url(&self) -> String {
        self.envoy.base_url()
    }

    pub fn addrs(&self) -> Vec<String> {
        self.workers.iter().map(|w| w.addr.clone()).collect()
    }

    /// The workers of `model`'s pool.
    pub fn pool(&self, model: &str) -> &[String] {
        self.pools.iter().find(|p| p.model == model).map_or(&[], |p| p.addrs.as_slice())
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
