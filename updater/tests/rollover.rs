//! Resync that keeps what is known, against a real simulated worker whose replay buffer is
//! small (vLLM's `buffer_steps`): when the buffer has rolled past what the updater last saw,
//! the later-starting replay is applied on top of the blocks known before, and the last-event
//! time only moves with batches (as of when the engine published them), never by the resync.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use common::{spawn, until};
use kvroute_core::hash::block_hashes;
use kvroute_core::model::ModelBundle;
use kvroute_core::request::Prompt;
use kvroute_sim::events::{EventConfig, EventEncoding, ReplyShape};
use kvroute_sim::profile::Profile;
use kvroute_sim::worker::{Ports, Worker, WorkerSpec};
use kvroute_updater::ingest::DomainBase;
use kvroute_updater::state::{now_ms, State};
use kvroute_updater::subscriber::{follow, Endpoints};
use serde_json::{json, Value};

const BUFFER_STEPS: usize = 4;

fn messages(conv: u64) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": kvroute_core::textgen::words(conv, 150)}),
        json!({"role": "user", "content": kvroute_core::textgen::words(conv * 100, 20)}),
    ]
}

async fn send(http: u16, msgs: &[Value]) {
    let body = json!({"model": "kvroute-demo", "messages": msgs, "max_tokens": 2});
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{http}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
}

/// Whether the updater knows every full block of `msgs`' prompt on the GPU.
fn known(state: &State, bundle: &ModelBundle, msgs: &[Value]) -> bool {
    let tokens = bundle.prompt_tokens(&Prompt::Messages(msgs.to_vec())).unwrap();
    let hashes = block_hashes(state.domain.seed(None, None), 16, &tokens);
    let snap = state.snapshot();
    !hashes.is_empty() && hashes.iter().all(|h| snap.workers[0].gpu.contains(h))
}

fn stats(state: &State, name: &str) -> Value {
    state.status()["workers"][name]["stats"].clone()
}

struct Setup {
    worker: Arc<Worker>,
    http: u16,
    state: Arc<State>,
    name: String,
    ep: Endpoints,
    bundle: ModelBundle,
}

/// A simulated worker (dropping it, also when a test fails, aborts its tasks) and a state
/// for it; nobody follows it yet.
async fn setup() -> Setup {
    let spec = WorkerSpec {
        index: 0,
        host: IpAddr::V4(Ipv4Addr::LOCALHOST),
        model: "kvroute-demo".into(),
        profile: Profile::load("llama3-8b-h100").unwrap(),
        speedup: 10.0,
        events: EventConfig {
            topic: String::new(),
            encoding: EventEncoding::Array,
            reply_shape: ReplyShape::Triple,
            buffer_steps: BUFFER_STEPS,
        },
    };
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
    Setup { worker, http: p.http, state, name, ep, bundle }
}

#[tokio::test]
async fn a_rolled_over_replay_is_applied_keeping_what_was_known() {
    let Setup { worker, http, state, name, ep, bundle } = setup().await;
    let first = spawn(follow(Arc::clone(&state), ep.clone()));
    let before = messages(1);
    send(http, &before).await;
    assert!(until(10, || known(&state, &bundle, &before)).await, "first blocks never arrived");
    let seen = state.status()["workers"][&name]["next_seq"].as_u64().unwrap();

    // The updater stops listening while the worker goes on past its replay buffer.
    drop(first);
    let (_, log) = worker.current().await.unwrap();
    let mut conv = 10;
    let mut last = messages(conv);
    while log.next_seq() < seen + 2 * BUFFER_STEPS as u64 {
        assert!(conv < 200, "the worker published too few batches");
        last = messages(conv);
        send(http, &last).await;
        conv += 1;
    }
    let resync_at = now_ms();
    let _second = spawn(follow(Arc::clone(&state), ep));
    assert!(
        until(10, || known(&state, &bundle, &last)).await,
        "the rolled-over replay was not applied: {}",
        stats(&state, &name)
    );
    let s = stats(&state, &name);
    assert!(known(&state, &bundle, &before), "blocks known before the resync were dropped");
    assert_eq!(s["rollovers"], 1, "{s}");
    assert!(s["resyncs"].as_u64() >= Some(1));
    assert!(s["last_resync_ms"].as_u64() >= Some(resync_at));
    // Every batch applied was published before `resync_at`: the last event is no later.
    let last_event = s["last_event_ms"].as_u64().unwrap();
    assert!(last_event <= resync_at, "last event {last_event} moved past {resync_at}");
    assert_eq!(state.snapshot().workers[0].observed_at_ms, last_event);
}

#[tokio::test]
async fn a_gap_past_the_replay_buffer_keeps_what_was_known_and_the_stream_goes_on() {
    let s = setup().await;
    let _follow = spawn(follow(Arc::clone(&s.state), s.ep.clone()));
    let before = messages(1);
    // The first batches may be published before the subscription is in place: replayed.
    send(s.http, &before).await;
    assert!(until(10, || known(&s.state, &s.bundle, &before)).await, "first blocks never arrived");
    // The PUB socket loses more batches than the replay buffer holds.
    let (_, log) = s.worker.current().await.unwrap();
    let lost = 2 * BUFFER_STEPS as u64;
    log.drop_remaining.store(lost, std::sync::atomic::Ordering::SeqCst);
    let mut conv = 10;
    while log.drop_remaining.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        assert!(conv < 200, "the worker published too few batches");
        send(s.http, &messages(conv)).await;
        conv += 1;
    }
    // The next live batch reveals the gap.
    let last = messages(conv);
    send(s.http, &last).await;
    assert!(
        until(10, || known(&s.state, &s.bundle, &last)).await,
        "the stream stopped after the gap: {}",
        stats(&s.state, &s.name)
    );
    let st = stats(&s.state, &s.name);
    assert!(known(&s.state, &s.bundle, &before), "blocks known before the gap were dropped");
    assert!(st["gaps"].as_u64() >= Some(1), "{st}");
    assert!(st["resyncs"].as_u64() >= Some(1), "{st}");
    assert!(st["rollovers"].as_u64() >= Some(1), "{st}");
}
