//! Resync that keeps what is known, against a real simulated worker whose replay buffer is
//! small (vLLM's `buffer_steps`): when the buffer has rolled past what the updater last saw,
//! the later-starting replay is applied on top of the blocks known before, and the last-event
//! time only moves with batches (as of when the engine published them), never by the resync.

use crate::common;

use std::sync::Arc;

use common::{sim_setup, spawn, until, SimSetup};
use kvroute_core::decision::hash::block_hashes;
use kvroute_core::decision::request::Prompt;
use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_sim::events::{EventEncoding, ReplyShape};
use kvroute_updater::state::{now_ms, State};
use kvroute_updater::subscriber::follow;
use serde_json::{json, Value};

const BUFFER_STEPS: usize = 4;

fn messages(conv: u64) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": kvroute_testkit::textgen::words(conv, 150)}),
        json!({"role": "user", "content": kvroute_testkit::textgen::words(conv * 100, 20)}),
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
    let tokens = bundle.prompt_tokens(&Prompt::messages(msgs.to_vec())).unwrap();
    let snap = state.snapshot();
    let domain = state.domain_of(&snap.workers[0].worker).unwrap();
    let hashes = block_hashes(domain.seed(None, None), 16, &tokens);
    !hashes.is_empty() && hashes.iter().all(|h| snap.workers[0].gpu.contains(h))
}

fn stats(state: &State, name: &str) -> Value {
    state.status()["workers"][name]["stats"].clone()
}

async fn setup() -> SimSetup {
    sim_setup(EventEncoding::Array, ReplyShape::Triple, BUFFER_STEPS).await
}

#[tokio::test]
async fn a_rolled_over_replay_is_applied_keeping_what_was_known() {
    let SimSetup { worker, http, state, name, ep, bundle } = setup().await;
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
