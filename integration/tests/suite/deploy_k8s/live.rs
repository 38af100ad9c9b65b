//! Real Envoy running what a control plane would give the gateway (xds.rs), made local: the
//! xDS resources become static resources (EDS endpoints -> the simulated workers, RDS -> the
//! route inline), the bootstrap addition is passed as `--config-yaml` as Istio's pilot-agent
//! does (Envoy Gateway merges the same way before it), the module is the locally built one (for
//! Envoy Gateway served over HTTP and fetched as its remote code, sha256 included), the
//! updater's cluster points at a local kvroute-updater, filters of istio-proxy's own build are
//! left out, and the filter configuration keeps everything but its `workers` (the simulated
//! ones) and gains `expose_decision_header`. Everything binds to 127.0.0.1; every process is
//! stopped when its guard drops, also on failure.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use kvroute_stack::client::{self, Reply};
use kvroute_stack::envoy::Envoy;
use kvroute_stack::process::Guard;
use kvroute_stack::sim::SimWorker;
use kvroute_stack::stack::{Updater, UPDATER_TOKEN};
use kvroute_stack::workload::Conversation;
use kvroute_stack::{eventually, paths};
use serde_json::{json, Value};

use crate::deploy_k8s::xds::{filter_config_json, hcm_mut, Xds};

/// Where the local stand-ins listen.
pub struct Local {
    pub admin: u16,
    pub listen: u16,
    pub updater: u16,
    pub wasm: PathBuf,
    pub workers: Vec<String>,
    /// Envoy Gateway: the module served over HTTP (port, file name, sha256).
    pub served: Option<(u16, String, String)>,
}

fn socket(addr: &str, port: u16) -> Value {
    json!({"socket_address": {"address": addr, "port_value": port}})
}

/// One locality with one endpoint, 127.0.0.1:`port`.
fn loopback(port: u16) -> Value {
    json!([{"lb_endpoints": [{"endpoint": {"address": socket("127.0.0.1", port)}}]}])
}

fn endpoints(addrs: &[String]) -> anyhow::Result<Value> {
    let mut eps = Vec::new();
    for a in addrs {
        let sa: std::net::SocketAddr = a.parse().with_context(|| format!("worker {a}"))?;
        eps.push(json!({"endpoint": {"address": socket(&sa.ip().to_string(), sa.port())}}));
    }
    Ok(json!([{"lb_endpoints": eps}]))
}

/// The control plane's configuration, made runnable here: (bootstrap, addition).
pub fn localize(x: &Xds, l: &Local) -> anyhow::Result<(Value, Value)> {
    let mut listener = x.listener.clone();
    listener["address"] = socket("127.0.0.1", l.listen);
    {
        let hcm = hcm_mut(&mut listener)?;
        let obj = hcm.as_object_mut().context("HCM")?;
        obj.remove("rds").context("the listener's HCM has no rds")?;
        obj.insert("route_config".into(), x.route.clone());
        let filters = hcm["http_filters"].as_array_mut().context("http_filters")?;
        filters.retain(|f| !f["name"].as_str().unwrap_or("").starts_with("istio."));
        let wasm_type = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
        let f = filters
            .iter_mut()
            .find(|f| f.pointer("/typed_config/@type") == Some(&wasm_type.into()))
            .context("no wasm filter")?;
        let mut cfg = filter_config_json(f)?;
        for m in cfg["models"].as_array_mut().context("models")? {
            m["workers"] = json!(l.workers);
        }
        cfg["expose_decision_header"] = json!(true);
        let c = &mut f["typed_config"]["config"];
        c["configuration"]["value"] = cfg.to_string().into();
        let code = &mut c["vm_config"]["code"];
        if code.get("local").is_some() {
            code["local"]["filename"] = l.wasm.display().to_string().into();
        } else {
            let (port, file, sha) =
                l.served.as_ref().context("remote code and no module server")?;
            let remote = code.get_mut("remote").context("code is neither local nor remote")?;
            remote["http_uri"]["uri"] = format!("http://127.0.0.1:{port}/{file}").into();
            remote["sha256"] = sha.clone().into();
        }
    }
    let mut cluster = x.cluster.clone();
    let obj = cluster.as_object_mut().context("cluster")?;
    obj.remove("eds_cluster_config");
    obj.insert("type".into(), "STATIC".into());
    obj.insert(
        "load_assignment".into(),
        json!({"cluster_name": x.cluster["name"], "endpoints": endpoints(&l.workers)?}),
    );

    let mut b = x.bootstrap.clone();
    b["admin"]["address"] = socket("127.0.0.1", l.admin);
    b.as_object_mut().context("bootstrap")?.remove("dynamic_resources");
    let statics = b
        .as_object_mut()
        .context("bootstrap")?
        .entry("static_resources")
        .or_insert_with(|| json!({}));
    let clusters = statics
        .as_object_mut()
        .context("static_resources")?
        .entry("clusters")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .context("clusters")?;
    // The control plane's own xDS source is not here: its resources are static instead.
    clusters.retain(|c| !matches!(c["name"].as_str(), Some("xds-grpc" | "xds_cluster")));
    clusters.push(cluster);
    if let Some((port, _, _)) = &l.served {
        // Envoy Gateway's wasm_cluster (mTLS to its controller's HTTP server): plain HTTP here.
        clusters.push(json!({"name": "wasm_cluster", "type": "STATIC", "connect_timeout": "2s",
            "load_assignment": {"cluster_name": "wasm_cluster",
                "endpoints": loopback(*port)}}));
    }
    statics["listeners"] = json!([listener]);

    let mut add = x.addition.clone();
    for ext in add["bootstrap_extensions"].as_array_mut().into_iter().flatten() {
        if let Some(f) = ext.pointer_mut("/typed_config/config/vm_config/code/local/filename") {
            *f = l.wasm.display().to_string().into();
        }
    }
    for c in add
        .pointer_mut("/static_resources/clusters")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if c["name"] == "kvroute_updater" {
            c["load_assignment"]["endpoints"] = loopback(l.updater);
        }
    }
    Ok((b, add))
}

/// Serves `wasm` at `/<sha256>.wasm` on a loopback port (Envoy Gateway's wasm HTTP service).
async fn serve_module(
    wasm: &Path,
) -> anyhow::Result<((u16, String, String), tokio::task::JoinHandle<()>)> {
    let out =
        tokio::process::Command::new("sha256sum").arg(wasm).output().await.context("sha256sum")?;
    ensure!(out.status.success(), "sha256sum failed");
    let sha = String::from_utf8(out.stdout)?
        .split_whitespace()
        .next()
        .context("sha256sum output")?
        .to_owned();
    let bytes = std::fs::read(wasm)?;
    let file = format!("{sha}.wasm");
    let route = format!("/{file}");
    let app = axum::Router::new().route(
        &route,
        axum::routing::get(move || {
            let b = bytes.clone();
            async move { b }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(((port, file, sha), task))
}

/// Starts Envoy on `bootstrap` with `addition` merged in, as pilot-agent runs it, and waits
/// until its admin reports ready.
async fn start_envoy(
    dir: &Path,
    name: &str,
    bootstrap: &Value,
    addition: &Value,
    l: &Local,
) -> anyhow::Result<Envoy> {
    let path = dir.join(format!("{name}-bootstrap.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(bootstrap)?)?;
    std::fs::write(
        dir.join(format!("{name}-addition.json")),
        serde_json::to_vec_pretty(addition)?,
    )?;
    let log = dir.join("envoy.log");
    let mut cmd = tokio::process::Command::new(paths::envoy_bin()?);
    cmd.arg("-c")
        .arg(&path)
        .args(["--config-yaml", &addition.to_string()])
        .args(["--disable-hot-restart", "--allow-unknown-static-fields"])
        .args(["--concurrency", "2", "--log-level", "info"])
        .env("KVROUTE_UPDATER_TOKEN", UPDATER_TOKEN);
    let started = Instant::now();
    let mut guard = Guard::spawn("envoy", cmd, &log)?;
    let http = reqwest::Client::new();
    let ready = format!("http://127.0.0.1:{}/ready", l.admin);
    let res = eventually("envoy ready", Duration::from_secs(120), || {
        let (http, ready, exited) = (http.clone(), ready.clone(), guard.try_exit());
        async move {
            if exited.is_some() {
                return Some(false);
            }
            http.get(&ready).send().await.ok()?.status().is_success().then_some(true)
        }
    })
    .await;
    if !matches!(res, Ok(true)) {
        let tail = kvroute_stack::process::log_tail(&log, 30);
        bail!("{name}: envoy did not become ready ({res:?}):\n{tail}");
    }
    Ok(Envoy { guard, admin_port: l.admin, listen_port: l.listen, log, startup: started.elapsed() })
}

fn field(r: &Reply, k: &str) -> u64 {
    r.decision_field(k).and_then(|v| v.parse().ok()).unwrap_or(0)
}

async fn post(envoy: &Envoy, body: &Value) -> anyhow::Result<Reply> {
    let http = reqwest::Client::new();
    let r =
        tokio::time::timeout(Duration::from_secs(30), client::chat(&http, &envoy.base_url(), body))
            .await
            .context("the request through Envoy did not finish within 30 s (a stalled POST)")??;
    ensure!(r.status == 200, "status {}: {}", r.status, r.body);
    Ok(r)
}

/// Runs `x` against simulated workers and a local updater; checks that kvroute routes, that
/// knowledge from the updater reaches the filter, and that the stats carry their tags.
pub async fn run(x: &Xds) -> anyhow::Result<()> {
    run_with(x, false).await
}

/// Runs `x` with `allow_on_headers_stop_iteration` taken off the wasm filter: what Istio's
/// `WasmPlugin` and Envoy Gateway's `EnvoyExtensionPolicy` give on their own. Every POST must
/// still complete (passed on unrouted, counted and named), and `kvroute-doctor` must name the
/// missing setting.
pub async fn run_without_stop_iteration(x: &Xds) -> anyhow::Result<()> {
    let mut x = x.clone();
    let filters = hcm_mut(&mut x.listener)?["http_filters"].as_array_mut().context("filters")?;
    let mut off = 0;
    for f in filters {
        if let Some(c) = f.pointer_mut("/typed_config/config").and_then(Value::as_object_mut) {
            off += usize::from(c.remove("allow_on_headers_stop_iteration").is_some());
        }
    }
    ensure!(off == 1, "{}: the wasm filter had no allow_on_headers_stop_iteration", x.name);
    run_with(&x, true).await
}

async fn run_with(x: &Xds, unrouted: bool) -> anyhow::Result<()> {
    let dir = paths::scratch_dir(&format!("deploy-k8s-{}", x.name))?;
    let f = crate::deploy_k8s::xds::wasm_filter(&x.listener)?;
    let cfg = filter_config_json(f)?;
    let model = cfg.pointer("/models/0/name").and_then(Value::as_str).context("model")?.to_owned();
    let mut sims = Vec::new();
    for i in 0..3 {
        sims.push(SimWorker::start(i, &["--model".into(), model.clone()], &dir).await?);
    }
    let workers: Vec<String> = sims.iter().map(|s| s.addr.clone()).collect();
    let specs: Vec<String> = sims
        .iter()
        .map(|s| {
            format!(
                "{},tcp://127.0.0.1:{},tcp://127.0.0.1:{}",
                s.addr, s.events_port, s.replay_port
            )
        })
        .collect();
    let updater_port = paths::free_port()?;
    let updater =
        Updater::start_with(updater_port, None, &specs, std::slice::from_ref(&model), &dir).await?;
    let wasm = paths::wasm_path()?;
    let remote = f.pointer("/typed_config/config/vm_config/code/remote").is_some();
    let (served, server) = match remote {
        true => {
            let (s, task) = serve_module(&wasm).await?;
            (Some(s), Some(task))
        }
        false => (None, None),
    };
    let l = Local {
        admin: paths::free_port()?,
        listen: paths::free_port()?,
        updater: updater_port,
        wasm,
        workers,
        served,
    };
    let (bootstrap, addition) = localize(x, &l)?;
    let envoy = start_envoy(&dir, x.name, &bootstrap, &addition, &l).await?;
    let result = match unrouted {
        false => checks(x.name, &envoy, &updater, &sims, &model).await,
        true => unrouted_checks(x.name, &envoy, updater_port, &model).await,
    };
    if let Some(t) = server {
        t.abort();
    }
    result.with_context(|| format!("{}: logs in {}", x.name, dir.display()))
}

async fn checks(
    name: &str,
    envoy: &Envoy,
    updater: &Updater,
    sims: &[SimWorker],
    model: &str,
) -> anyhow::Result<()> {
    // 1. kvroute decides: the model's bundle arrives from the updater (through the singleton),
    // then a POST is routed with no fallback.
    let mut seed = 0;
    let last = std::sync::Mutex::new(String::from("no answer yet"));
    let first = eventually("a decision without fallback", Duration::from_secs(90), || {
        seed += 1;
        let body = Conversation::new(500, seed, 40, 10, 1).body(model, 0, 4, false);
        let last = &last;
        async move {
            let r = post(envoy, &body).await;
            *last.lock().unwrap() = match &r {
                Ok(r) => format!("decision {:?}", r.decision),
                Err(e) => format!("{e:#}"),
            };
            let r = r.ok()?;
            (r.decision_field("fallback").as_deref() == Some("none")).then_some(r)
        }
    })
    .await
    .with_context(|| format!("{name}: kvroute never decided; last: {}", last.lock().unwrap()))?;
    ensure!(first.decision.is_some(), "{name}: no x-kvroute-decision header");
    // 2. Envoy sends each request where kvroute decided (override_host over the control
    // plane's own balancing).
    for i in 0..6 {
        let body = Conversation::new(501, i, 40, 10, 1).body(model, 0, 4, false);
        let r = post(envoy, &body).await?;
        ensure!(
            r.decision_field("fallback").as_deref() == Some("none"),
            "{name}: fallback in {:?}",
            r.decision
        );
        ensure!(
            r.worker.is_some() && r.worker == r.decision_field("worker"),
            "{name}: served by {:?}, kvroute chose {:?}",
            r.worker,
            r.decision_field("worker")
        );
    }
    // 3. Knowledge from the updater: a conversation sent straight to one worker (only its KV
    // events can tell kvroute) is routed to that worker once Envoy holds the updater's snapshot.
    let target = &sims[1];
    let blocks = |s: &Value| s["workers"][&target.addr]["blocks"]["GPU"].as_u64().unwrap_or(0);
    let before = blocks(&updater.status().await?);
    let c = Conversation::new(502, 0, 300, 15, 3);
    let http = reqwest::Client::new();
    let direct =
        client::chat(&http, &format!("http://{}", target.addr), &c.body(model, 0, 4, false))
            .await?;
    ensure!(direct.status == 200, "direct request: {}", direct.body);
    let version = eventually("the updater sees the blocks", Duration::from_secs(30), || async {
        let s = updater.status().await.ok()?;
        (blocks(&s) > before).then(|| s["version"].as_u64().unwrap_or(0))
    })
    .await?;
    eventually("Envoy at the updater's version", Duration::from_secs(30), || async {
        let m = envoy.prometheus().await.ok()?;
        (m.get("kvroute_sync_snapshot_version").copied().unwrap_or(0.0) >= version as f64)
            .then_some(())
    })
    .await
    .with_context(|| format!("{name}: the singleton did not bring the updater's snapshot"))?;
    let r = post(envoy, &c.body(model, 1, 4, false)).await?;
    ensure!(
        r.worker.as_deref() == Some(target.addr.as_str()) && field(&r, "blocks_from_events") > 0,
        "{name}: the conversation known only from events went to {:?} ({:?})",
        r.worker,
        r.decision
    );
    // 4. The stats carry their tags (the bootstrap addition's stats_tags) and pass the control
    // plane's stats matcher.
    let m = envoy.prometheus().await?;
    // The worker's stat segment: its address with '.' and ':' as '_'.
    let seg = target.addr.replace(['.', ':'], "_");
    let decisions = format!("kvroute_worker_decisions{{kvroute_worker=\"{seg}\"}}");
    ensure!(
        m.get(&decisions).copied().unwrap_or(0.0) >= 1.0,
        "{name}: no {decisions}: {:?}",
        m.keys().filter(|k| k.starts_with("kvroute_worker")).collect::<Vec<_>>()
    );
    ensure!(
        m.get("kvroute_knowledge_updates{kvroute_kind=\"full\"}").copied().unwrap_or(0.0) >= 1.0,
        "{name}: no kvroute_knowledge_updates{{kvroute_kind=\"full\"}}"
    );
    ensure!(
        m.get("kvroute_sync_full_snapshots").copied().unwrap_or(0.0) >= 1.0,
        "{name}: the singleton fetched no snapshot"
    );
    Ok(())
}

/// Without the stop-iteration setting: every POST completes, passed on unrouted
/// (`fallback=body_not_delivered`), counted, and `kvroute-doctor` names the setting.
async fn unrouted_checks(
    name: &str,
    envoy: &Envoy,
    updater_port: u16,
    model: &str,
) -> anyhow::Result<()> {
    for i in 0..6 {
        let body = Conversation::new(503, i, 40, 10, 1).body(model, 0, 4, false);
        let r = post(envoy, &body).await?;
        ensure!(
            r.decision_field("fallback").as_deref() == Some("body_not_delivered"),
            "{name}: request {i}: {:?}",
            r.decision
        );
        ensure!(r.worker.is_some(), "{name}: request {i} served by no worker");
    }
    let m = envoy.prometheus().await?;
    let counted = "kvroute_fallback_requests{kvroute_fallback=\"body_not_delivered\"}";
    ensure!(m.get(counted).copied().unwrap_or(0.0) == 6.0, "{name}: {counted} is not 6");
    let out = tokio::process::Command::new(paths::doctor_bin()?)
        .args(["--envoy-admin", &envoy.admin_url()])
        .args(["--updater", &format!("http://127.0.0.1:{updater_port}")])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out).await.context("doctor hung")??;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(!out.status.success(), "{name}: the doctor found nothing wrong:\n{text}");
    ensure!(
        text.lines().any(|l| l.starts_with("PROBLEM")
            && l.contains("lacks allow_on_headers_stop_iteration: true")),
        "{name}: the doctor did not name the setting:\n{text}"
    );
    Ok(())
}
