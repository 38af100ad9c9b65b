//! Test helpers: a publisher driven by the test (a real ZMQ PUB socket and a replay ROUTER on
//! 127.0.0.1), tasks stopped when dropped, and bounded polling.

#![allow(dead_code)]

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_sim::events::{encode_batch, EventConfig, EventEncoding, KvEvent, ReplyShape};
use kvroute_sim::profile::HardwareProfile;
use kvroute_sim::worker::{LoraSpec, Ports, Worker, WorkerSpec};
use kvroute_updater::ingest::DomainBase;
use kvroute_updater::limits::Limits;
use kvroute_updater::state::State;
use kvroute_updater::subscriber::{follow, Endpoints};
use serde_json::Value;
use tokio::task::JoinHandle;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// A spawned task, aborted when dropped (also when a test fails).
pub struct Task(pub JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub fn spawn(f: impl Future<Output = ()> + Send + 'static) -> Task {
    Task(tokio::spawn(f))
}

/// Polls `cond` every 20 ms until it holds or `secs` pass; returns whether it held.
pub async fn until(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

pub const BLOCK: u32 = 4;

pub fn domain() -> DomainBase {
    DomainBase { model: "m".into(), tokenizer_fingerprint: 1, block_size: BLOCK, lora_name: None }
}

/// One stored chain of `blocks` blocks starting at block 0, engine hashes `first..`.
pub fn stored(first: u64, blocks: u64, medium: &'static str) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: (first..first + blocks).collect(),
        parent_block_hash: None,
        token_ids: (0..blocks as u32 * BLOCK).map(|t| t + first as u32 * 1000).collect(),
        block_size: BLOCK as usize,
        medium,
        lora_name: None,
        salt: None,
    }
}

pub fn batch(events: &[KvEvent]) -> Bytes {
    Bytes::from(encode_batch(1.0, events, Some(0), EventEncoding::Array))
}

/// How the fake replay socket answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayMode {
    /// Every buffered batch from the asked sequence number, then the end marker.
    Normal,
    /// The batches, but never the end marker (a replay that does not end).
    NoEnd,
}

/// A publisher the test drives: every batch published is also kept for replay.
pub struct Fake {
    pub_socket: zeromq::PubSocket,
    pub buffer: Arc<Mutex<Vec<(u64, Bytes)>>>,
    pub events: String,
    pub replay: String,
    _replay_task: Task,
}

fn port_of(ep: &zeromq::Endpoint) -> u16 {
    ep.to_string().rsplit(':').next().and_then(|p| p.parse().ok()).unwrap()
}

impl Fake {
    pub async fn start(mode: ReplayMode) -> Fake {
        let mut pub_socket = zeromq::PubSocket::new();
        let ep = pub_socket.bind("tcp://127.0.0.1:0").await.unwrap();
        let events = format!("tcp://127.0.0.1:{}", port_of(&ep));
        let mut router = zeromq::RouterSocket::new();
        let ep = router.bind("tcp://127.0.0.1:0").await.unwrap();
        let replay = format!("tcp://127.0.0.1:{}", port_of(&ep));
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let task = spawn(serve_replay(router, Arc::clone(&buffer), mode));
        Fake { pub_socket, buffer, events, replay, _replay_task: task }
    }

    /// Keeps `payload` as batch `seq` for replay and publishes `[topic, seq, payload, extra..]`.
    pub async fn publish(&mut self, seq: u64, payload: Bytes, extra: &[Bytes]) {
        self.buffer.lock().unwrap().push((seq, payload.clone()));
        let mut frames = vec![Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
        frames.extend_from_slice(extra);
        self.pub_socket.send(ZmqMessage::try_from(frames).unwrap()).await.unwrap();
    }

    /// Publishes `frames` as one message as they are: not kept for replay.
    pub async fn publish_raw(&mut self, frames: Vec<Bytes>) {
        self.pub_socket.send(ZmqMessage::try_from(frames).unwrap()).await.unwrap();
    }

    /// Keeps a batch for replay only (as if the PUB socket dropped it).
    pub fn buffer_only(&self, seq: u64, payload: Bytes) {
        self.buffer.lock().unwrap().push((seq, payload));
    }
}

async fn serve_replay(
    mut router: zeromq::RouterSocket,
    buffer: Arc<Mutex<Vec<(u64, Bytes)>>>,
    mode: ReplayMode,
) {
    while let Ok(req) = router.recv().await {
        let frames = req.into_vec();
        let id = frames[0].clone();
        let start = u64::from_be_bytes(frames.last().unwrap().as_ref().try_into().unwrap());
        let held: Vec<(u64, Bytes)> =
            buffer.lock().unwrap().iter().filter(|(s, _)| *s >= start).cloned().collect();
        for (seq, payload) in held {
            let m =
                vec![id.clone(), Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
            let _ = router.send(ZmqMessage::try_from(m).unwrap()).await;
        }
        if mode == ReplayMode::Normal {
            let end = vec![id, Bytes::new(), Bytes::from_static(&[0xFF; 8]), Bytes::new()];
            let _ = router.send(ZmqMessage::try_from(end).unwrap()).await;
        }
    }
}

/// The updater's state for one worker named "w", followed from `fake`.
pub fn follow_fake(fake: &Fake, limits: Limits) -> (Arc<State>, Task) {
    let state = Arc::new(State::with_limits(domain(), ["w".to_string()], limits));
    let ep = Endpoints {
        worker: "w".into(),
        events: fake.events.clone(),
        replay: Some(fake.replay.clone()),
    };
    let task = spawn(follow(Arc::clone(&state), ep));
    (state, task)
}

/// Worker "w"'s `/status` entry.
pub fn status(state: &State) -> Value {
    state.status()["workers"]["w"].clone()
}

pub fn stat(state: &State, key: &str) -> u64 {
    status(state)["stats"][key].as_u64().unwrap_or(0)
}

pub fn cap(state: &State, name: &str) -> u64 {
    status(state)["stats"]["caps_hit"][name].as_u64().unwrap_or(0)
}

pub fn blocks(state: &State, tier: &str) -> u64 {
    status(state)["blocks"][tier].as_u64().unwrap_or(0)
}

/// A real simulated worker of the demo model (dropping it, also when a test fails, aborts its
/// tasks) and an updater state for it; nobody follows it yet.
pub struct SimSetup {
    pub worker: Arc<Worker>,
    pub http: u16,
    pub state: Arc<State>,
    pub name: String,
    pub ep: Endpoints,
    pub bundle: ModelBundle,
}

pub async fn sim_setup(
    encoding: EventEncoding,
    reply_shape: ReplyShape,
    buffer_steps: usize,
) -> SimSetup {
    let events = EventConfig { topic: String::new(), encoding, reply_shape, buffer_steps };
    let profile = HardwareProfile::load("llama3-8b-h100").unwrap();
    let spec = WorkerSpec::loopback("kvroute-demo", profile, events);
    let bundle = ModelBundle::demo().unwrap();
    let worker = Worker::new(spec, bundle.clone(), Ports::default());
    let p = worker.start().await.unwrap();
    let name = format!("127.0.0.1:{}", p.http);
    let domain = DomainBase {
        model: "kvroute-demo".into(),
        tokenizer_fingerprint: bundle.fingerprint(),
        block_size: 16,
        lora_name: None,
    };
    let state = Arc::new(State::new(domain, [name.clone()]));
    let ep = Endpoints {
        worker: name.clone(),
        events: format!("tcp://127.0.0.1:{}", p.events),
        replay: Some(format!("tcp://127.0.0.1:{}", p.replay)),
    };
    SimSetup { worker, http: p.http, state, name, ep, bundle }
}

/// The token test servers require.
pub const TOKEN: &str = "0123456789abcdef";

/// A simulated worker serving `model` with `bundle`, caching in blocks of `block_size`, not
/// started yet (so that a misconfiguration can be set first). Dropping it (also when a test
/// fails) aborts its tasks.
pub fn sim_worker(
    model: &str,
    bundle: ModelBundle,
    block_size: usize,
    lora: LoraSpec,
) -> Arc<Worker> {
    let mut profile = HardwareProfile::load("llama3-8b-h100").unwrap();
    profile.block_size = block_size;
    let events = EventConfig {
        topic: String::new(),
        encoding: EventEncoding::Map,
        reply_shape: ReplyShape::Triple,
        buffer_steps: 1000,
    };
    let spec = WorkerSpec { lora, ..WorkerSpec::loopback(model, profile, events) };
    Worker::new(spec, bundle, Ports::default())
}

/// Starts `w`: its name in snapshots (`127.0.0.1:port`) and its event endpoints.
pub async fn start_sim(w: &Arc<Worker>) -> (String, Endpoints) {
    let p = w.start().await.unwrap();
    let name = format!("127.0.0.1:{}", p.http);
    let ep = Endpoints {
        worker: name.clone(),
        events: format!("tcp://127.0.0.1:{}", p.events),
        replay: Some(format!("tcp://127.0.0.1:{}", p.replay)),
    };
    (name, ep)
}

/// Serves `state`'s HTTP surface (token [`TOKEN`]) on a free loopback port until the task is
/// dropped.
pub async fn serve(state: Arc<State>) -> (u16, Task) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = kvroute_updater::server::router(state, TOKEN);
    let task = spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (port, task)
}

/// Polls `cond` every 20 ms until it holds or `secs` pass (for async conditions).
pub async fn until_async<F, Fut>(secs: u64, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond().await
}
