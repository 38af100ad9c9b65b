//! One simulated worker's lifecycle: its engine, HTTP server, KV-event publisher and replay
//! socket, all of which a fault can crash and restart (with an empty cache and sequence
//! numbers back to 0), plus the admin endpoint that stays up to inject those faults.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use kvroute_core::decision::tokenize::model::ModelBundle;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::Socket;

use crate::api::{self, Adapter, Serving};
use crate::engine::{Engine, EngineConfig, SchedulingPolicy, Timing};
use crate::events::{self, EventConfig, EventLog};
use crate::profile::HardwareProfile;
use crate::pull::KvNet;
use crate::topology::SimTopology;

/// Ports of one worker (0 = pick a free one at first start; restarts reuse the same ports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ports {
    pub http: u16,
    pub events: u16,
    pub replay: u16,
    pub admin: u16,
}

/// Everything needed to (re)start a worker.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub index: usize,
    pub host: IpAddr,
    pub model: String,
    pub profile: HardwareProfile,
    pub speedup: f64,
    pub events: EventConfig,
    /// `root` of the base model in `/v1/models` (vLLM: the model's path); the model id if
    /// `None`.
    pub root: Option<String>,
    pub lora: LoraSpec,
    /// Labels, role and network costs ([`SimTopology`]; the default changes nothing).
    pub topology: SimTopology,
    /// vLLM's `--scheduling-policy`: FCFS by default, or by each request's `priority`.
    pub scheduling_policy: SchedulingPolicy,
}

impl WorkerSpec {
    /// One worker on 127.0.0.1 serving `model` with `profile` and `events`, at 10× speed,
    /// without adapters: the starting point of in-process tests, which change what they need.
    pub fn loopback(model: &str, profile: HardwareProfile, events: EventConfig) -> WorkerSpec {
        WorkerSpec {
            index: 0,
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            model: model.into(),
            profile,
            speedup: 10.0,
            events,
            root: None,
            lora: LoraSpec::default(),
            topology: SimTopology::default(),
            scheduling_policy: SchedulingPolicy::Fcfs,
        }
    }
}

/// A worker's LoRA settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraSpec {
    /// Adapters loaded at every start (vLLM's `--lora-modules`); ones loaded through the API
    /// are gone after a restart, as in vLLM.
    pub adapters: Vec<Adapter>,
    /// Most distinct adapters among running requests (vLLM's `--max-loras`).
    pub max_loras: usize,
    /// How long `POST /v1/load_lora_adapter` takes before the adapter is usable (ms).
    pub load_ms: u64,
}

impl Default for LoraSpec {
    fn default() -> Self {
        // vLLM's default `--max-loras` is 1.
        LoraSpec { adapters: Vec::new(), max_loras: 1, load_ms: 0 }
    }
}

/// Deliberate misconfiguration: what the worker really does versus what it announces.
#[derive(Debug, Clone, Default)]
pub struct Misconfig {
    /// Serve this chat template instead of the bundle's.
    pub chat_template: Option<String>,
    /// Cache with this block size while announcing the profile's.
    pub block_size: Option<usize>,
}

struct Running {
    serving: Arc<Serving>,
    log: Arc<EventLog>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Aborts every task and waits until they are gone, so their ports are free again.
    async fn shutdown(mut self) {
        let tasks = std::mem::take(&mut self.tasks);
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Serves `app` on `listener`; every connection task lives in a set owned by this future, so
/// aborting it closes the listener and all open connections at once, like a crashed process.
/// With a client round trip (`one_way` > 0) each connection goes through a delay line of
/// `one_way` in each direction ([`crate::delay::delayed_connection`]).
async fn serve(listener: tokio::net::TcpListener, app: axum::Router, one_way: Duration) {
    use hyper::service::Service as _;
    let mut conns = tokio::task::JoinSet::new();
    while let Ok(stream) = accept(&listener).await {
        let inner = hyper_util::service::TowerToHyperService::new(app.clone());
        let svc = hyper::service::service_fn(move |mut req| {
            decode_path(&mut req);
            inner.call(req)
        });
        if one_way.is_zero() {
            conns.spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
            });
        } else {
            conns.spawn(crate::delay::delayed_connection(stream, one_way, |io| async move {
                let io = hyper_util::rt::TokioIo::new(io);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
            }));
        }
        while conns.try_join_next().is_some() {}
    }
}

/// Routes a request on its percent-decoded path, as vLLM's server does (uvicorn decodes the
/// path before Starlette matches it, so `/v1/chat/%63ompletions` is a chat completion; see
/// `kvroute_core::decision::request::path`). A decoded path that is not a plain URI path (it would hold
/// `?`, `#`, `%`, a space, a control or a non-ASCII byte) matches none of the routes anyway
/// and is left as sent.
fn decode_path<B>(req: &mut hyper::Request<B>) {
    let uri = req.uri();
    if !uri.path().contains('%') {
        return;
    }
    let decoded = kvroute_core::decision::request::path::server_path(uri.path().as_bytes());
    if !decoded.iter().all(|b| b.is_ascii_graphic() && !matches!(b, b'?' | b'#' | b'%')) {
        return;
    }
    let mut target = String::from_utf8_lossy(&decoded).into_owned();
    if let Some(q) = uri.query() {
        target.push('?');
        target.push_str(q);
    }
    let mut parts = uri.clone().into_parts();
    if let Ok(pq) = target.parse() {
        parts.path_and_query = Some(pq);
        if let Ok(new) = hyper::Uri::from_parts(parts) {
            *req.uri_mut() = new;
        }
    }
}

/// The next connection, with TCP_NODELAY set like vLLM's server (asyncio sets it on every
/// connection): with Nagle on, a streamed first token written after the headers waits for the
/// peer's delayed ACK (~40 ms on Linux), which clients and Envoy would see as time to first
/// token, and the router's online calibration would learn as prefill cost.
async fn accept(listener: &tokio::net::TcpListener) -> std::io::Result<tokio::net::TcpStream> {
    let (stream, _) = listener.accept().await?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A worker that can be crashed and restarted.
pub struct Worker {
    pub spec: WorkerSpec,
    pub bundle: ModelBundle,
    pub ports: Mutex<Ports>,
    pub misconfig: Mutex<Misconfig>,
    running: tokio::sync::Mutex<Option<Running>>,
    output_vocab: Arc<Vec<u32>>,
}

/// Token ids of the bundle that decode to a space and a lowercase word: what the simulated
/// model "generates", so that its output reads as words and re-tokenizes cleanly.
pub fn word_tokens(bundle: &ModelBundle, vocab_size: u32) -> Vec<u32> {
    let ids: Vec<u32> = (0..vocab_size)
        .filter(|&id| {
            bundle.decode(&[id]).is_ok_and(|t| {
                t.len() > 2 && t.starts_with(' ') && t[1..].chars().all(|c| c.is_ascii_lowercase())
            })
        })
        .collect();
    if ids.is_empty() {
        vec![0]
    } else {
        ids
    }
}

impl Worker {
    pub fn new(spec: WorkerSpec, bundle: ModelBundle, ports: Ports) -> Arc<Worker> {
        let output_vocab = Arc::new(word_tokens(&bundle, 4096));
        Arc::new(Worker {
            spec,
            bundle,
            ports: Mutex::new(ports),
            misconfig: Mutex::new(Misconfig::default()),
            running: tokio::sync::Mutex::new(None),
            output_vocab,
        })
    }

    fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.spec.host, port)
    }

    /// Starts (or restarts) the engine and its sockets with an empty cache.
    pub async fn start(self: &Arc<Self>) -> anyhow::Result<Ports> {
        let mut guard = self.running.lock().await;
        if let Some(r) = guard.take() {
            r.shutdown().await; // crash whatever ran before: ports are released
        }
        let ports = *self.ports.lock().unwrap_or_else(|e| e.into_inner());
        let mis = self.misconfig.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let p = &self.spec.profile;
        let bundle = match &mis.chat_template {
            Some(t) => self.bundle.with_chat_template(t).context("misconfigured template")?,
            None => self.bundle.clone(),
        };
        let listener = tokio::net::TcpListener::bind(self.addr(ports.http))
            .await
            .with_context(|| format!("binding HTTP port {}", ports.http))?;
        let mut publisher = zeromq::PubSocket::new();
        let pub_ep = bind_retrying(&mut publisher, self.spec.host, ports.events)
            .await
            .context("binding the KV-event PUB socket")?;
        let mut replay = zeromq::RouterSocket::new();
        let replay_ep = bind_retrying(&mut replay, self.spec.host, ports.replay)
            .await
            .context("binding the replay ROUTER socket")?;
        let bound = Ports {
            http: listener.local_addr()?.port(),
            events: endpoint_port(&pub_ep.to_string()).unwrap_or(ports.events),
            replay: endpoint_port(&replay_ep.to_string()).unwrap_or(ports.replay),
            admin: ports.admin,
        };
        *self.ports.lock().unwrap_or_else(|e| e.into_inner()) = bound;
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let cfg = EngineConfig {
            block_size: mis.block_size.unwrap_or(p.block_size),
            num_gpu_blocks: p.num_gpu_blocks,
            max_num_seqs: p.max_num_seqs,
            max_num_batched_tokens: p.max_num_batched_tokens,
            max_loras: self.spec.lora.max_loras.max(1),
            policy: self.spec.scheduling_policy,
            timing: Timing::from_profile(p, self.spec.speedup),
            output_vocab: Arc::clone(&self.output_vocab),
        };
        let (engine, engine_task) = Engine::start(cfg, Some(ev_tx));
        let log = Arc::new(EventLog::default());
        let serving = Arc::new(Serving {
            id: self.addr(bound.http).to_string(),
            model: self.spec.model.clone(),
            bundle,
            engine,
            announced_block_size: p.block_size,
            num_gpu_blocks: p.num_gpu_blocks,
            max_model_len: p.max_model_len,
            root: self.spec.root.clone().unwrap_or_else(|| self.spec.model.clone()),
            adapters: Mutex::new(self.spec.lora.adapters.clone()),
            lora_load_ms: self.spec.lora.load_ms,
            scheduling_policy: self.spec.scheduling_policy,
            net: KvNet::new(self.spec.topology.clone()),
        });
        let app = api::router(Arc::clone(&serving));
        let topo = &self.spec.topology;
        let http_task = tokio::spawn(serve(listener, app, topo.client_one_way()));
        let mut tasks = vec![engine_task, http_task];
        // The KV-event path: through a delay line when it has a delay.
        let ev_rx = if topo.event_delay().is_zero() {
            ev_rx
        } else {
            let (tx, rx) = mpsc::unbounded_channel();
            tasks.push(tokio::spawn(crate::delay::delay_channel(ev_rx, tx, topo.event_delay())));
            rx
        };
        tasks.push(tokio::spawn(events::run_publisher(
            publisher,
            self.spec.events.clone(),
            Arc::clone(&log),
            ev_rx,
        )));
        tasks.push(tokio::spawn(events::run_replay(
            replay,
            self.spec.events.clone(),
            Arc::clone(&log),
        )));
        *guard = Some(Running { serving, log, tasks });
        Ok(bound)
    }

    /// Stops the engine and closes its ports (a crash).
    pub async fn crash(&self) {
        if let Some(r) = self.running.lock().await.take() {
            r.shutdown().await;
        }
    }

    /// The running engine and event log, if up.
    pub async fn current(&self) -> Option<(Arc<Serving>, Arc<EventLog>)> {
        self.running.lock().await.as_ref().map(|r| (Arc::clone(&r.serving), Arc::clone(&r.log)))
    }

    /// Binds the admin port (loopback only) and returns its listener.
    pub async fn bind_admin(&self) -> anyhow::Result<tokio::net::TcpListener> {
        let port = self.ports.lock().unwrap_or_else(|e| e.into_inner()).admin;
        let l =
            tokio::net::TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
                .await
                .context("binding the admin port")?;
        self.ports.lock().unwrap_or_else(|e| e.into_inner()).admin = l.local_addr()?.port();
        Ok(l)
    }
}

/// Binds a ZMQ socket; after a crash the old sockets' accept loops close asynchronously, so a
/// restart retries for a short while when the port is still taken.
async fn bind_retrying<S: Socket>(
    socket: &mut S,
    host: IpAddr,
    port: u16,
) -> anyhow::Result<zeromq::Endpoint> {
    let endpoint = format!("tcp://{host}:{port}");
    let mut last = None;
    for _ in 0..60 {
        match socket.bind(&endpoint).await {
            Ok(ep) => return Ok(ep),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Err(last.map_or_else(|| anyhow::anyhow!("bind failed"), anyhow::Error::from))
}

fn endpoint_port(ep: &str) -> Option<u16> {
    ep.rsplit(':').next()?.trim_end_matches('/').parse().ok()
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn accepted_connections_write_small_chunks_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(tokio::net::TcpStream::connect(addr));
        let stream = super::accept(&listener).await.unwrap();
        assert!(stream.nodelay().unwrap(), "Nagle's algorithm would hold a streamed first token");
        drop(client.await.unwrap().unwrap());
    }
}
