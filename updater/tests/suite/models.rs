//! Many models: each worker's model comes from its `/v1/models`, its events are re-hashed with
//! that model's bundle and block size, the canary uses that bundle, and the adapters each
//! worker loaded are learned and published. Real simulated workers over real HTTP and ZMQ.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use kvroute_core::decision::hash::block_hashes;
use kvroute_core::decision::request::Prompt;
use kvroute_core::decision::tokenize::model::{qwen3, qwen3_dir, ModelBundle};
use kvroute_core::wire::snapshot::ModelInfo;
use kvroute_sim::api::Adapter;
use kvroute_sim::worker::LoraSpec;
use kvroute_updater::limits::Limits;
use kvroute_updater::models::{ModelSource, ModelSpec, Models};
use kvroute_updater::state::State;
use kvroute_updater::subscriber::follow;
use serde_json::{json, Value};

/// A state for `models` following `workers`, with the alignment check running (once, then
/// only when asked) and, if `scrape`, `/metrics` + `/v1/models` scraped every 50 ms.
fn updater(
    models: Models,
    workers: &[(String, kvroute_updater::subscriber::Endpoints)],
    scrape: bool,
) -> (Arc<State>, Vec<Task>) {
    let names: Vec<String> = workers.iter().map(|(n, _)| n.clone()).collect();
    let state = Arc::new(State::for_models(Arc::new(models), names.clone(), Limits::default()));
    let mut tasks: Vec<Task> =
        workers.iter().map(|(_, ep)| spawn(follow(Arc::clone(&state), ep.clone()))).collect();
    let hour = Duration::from_secs(3600);
    tasks.push(spawn(kvroute_updater::alignment::run(Arc::clone(&state), names.clone(), hour)));
    if scrape {
        let every = Duration::from_millis(50);
        tasks.push(spawn(kvroute_updater::scrape::run_scrape(Arc::clone(&state), names, every)));
    }
    (state, tasks)
}

fn worker_status(state: &State, name: &str) -> Value {
    state.status()["workers"][name].clone()
}

fn checked(state: &State, name: &str) -> bool {
    worker_status(state, name)["alignment"] != "not checked yet"
}

async fn chat(http: &str, model: &str, msgs: &[Value]) -> Value {
    let body = json!({"model": model, "messages": msgs, "max_tokens": 2});
    let r = reqwest::Client::new()
        .post(format!("http://{http}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    r.json().await.unwrap()
}

fn long_chat(seed: u64) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": kvroute_testkit::textgen::words(seed, 120)}),
        json!({"role": "user", "content": kvroute_testkit::textgen::words(seed + 1, 40)}),
    ]
}

/// Whether `worker`'s published GPU blocks hold every full block of `tokens` in the cache
/// domain of `lora` (none: the base model).
fn holds(state: &State, worker: &str, tokens: &[u32], lora: Option<&str>) -> bool {
    let Some(domain) = state.domain_of(worker) else {
        return false;
    };
    let hashes = block_hashes(domain.seed(None, lora), domain.block_size, tokens);
    let snap = state.snapshot();
    let Some(w) = snap.workers.iter().find(|w| w.worker == worker) else {
        return false;
    };
    !hashes.is_empty() && hashes.iter().all(|h| w.gpu.binary_search(h).is_ok())
}

/// A chat template without Qwen3's `<|im_start|>` markers: an engine started with it renders
/// every conversation differently from the model's own template.
const PLAIN_TEMPLATE: &str = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n\
    {% endfor %}{% if add_generation_prompt %}assistant: {% endif %}";

#[tokio::test]
async fn the_qwen3_canary_marks_only_the_misconfigured_worker_incompatible() {
    let qwen = qwen3().expect("the Qwen3 bundle (./dev setup)");
    let good = sim_worker("Qwen/Qwen3-8B", qwen.clone(), 16, LoraSpec::default());
    let bad = sim_worker("Qwen/Qwen3-8B", qwen.clone(), 16, LoraSpec::default());
    bad.misconfig.lock().unwrap().chat_template = Some(PLAIN_TEMPLATE.into());
    let other = sim_worker("other-model", ModelBundle::demo().unwrap(), 16, LoraSpec::default());
    let sims = [start_sim(&good).await, start_sim(&bad).await, start_sim(&other).await];
    let [(g, _), (b, _), (o, _)] = sims.clone();
    let spec = ModelSpec { name: "Qwen/Qwen3-8B".into(), source: ModelSource::Dir(qwen3_dir()) };
    let models = Models::load(&[spec], &[]).unwrap();
    let (state, _tasks) = updater(models, &sims, false);
    let all_checked = || [&g, &b, &o].iter().all(|w| checked(&state, w));
    assert!(until(20, all_checked).await, "{}", state.status());

    let (gs, bs, os) =
        (worker_status(&state, &g), worker_status(&state, &b), worker_status(&state, &o));
    assert_eq!(gs["compatible"], true, "{gs}");
    assert_eq!(gs["model"], "Qwen/Qwen3-8B");
    assert_eq!(gs["block_size"], 16);
    assert_eq!(bs["compatible"], false, "{bs}");
    assert!(bs["alignment"].as_str().unwrap().contains("canary tokens differ"), "{bs}");
    assert_eq!(os["compatible"], false, "{os}");
    assert!(os["alignment"].as_str().unwrap().contains("not configured"), "{os}");
    assert_eq!(os["model"], "other-model");
    let snap = state.snapshot();
    let info =
        ModelInfo { name: "Qwen/Qwen3-8B".into(), fingerprint: qwen.fingerprint(), block_size: 16 };
    assert_eq!(snap.models, vec![info], "the block size is learned from the compatible worker");
    let compatible: Vec<(&str, bool)> =
        snap.workers.iter().map(|w| (w.worker.as_str(), w.compatible)).collect();
    assert_eq!(compatible.iter().filter(|(_, c)| *c).count(), 1, "{compatible:?}");
    assert!(snap.workers.iter().all(|w| !w.model.is_empty()));

    // The compatible worker's events are re-hashed with Qwen3's tokens, block size and domain.
    let msgs = long_chat(7);
    chat(&g, "Qwen/Qwen3-8B", &msgs).await;
    let tokens = qwen.prompt_tokens(&Prompt::messages(msgs)).unwrap();
    assert!(until(10, || holds(&state, &g, &tokens, None)).await, "{}", worker_status(&state, &g));
}

#[tokio::test]
async fn adapters_are_learned_per_worker_and_hashed_in_their_own_domain() {
    let lora = LoraSpec {
        adapters: vec![Adapter { name: "sql".into(), path: "/adapters/sql".into() }],
        max_loras: 2,
        load_ms: 0,
    };
    let bundle = ModelBundle::demo().unwrap();
    let w = sim_worker("kvroute-demo", bundle.clone(), 16, lora);
    let sims = [start_sim(&w).await];
    let name = sims[0].0.clone();
    let models = Models::load(&["kvroute-demo".parse().unwrap()], &[]).unwrap();
    let (state, _tasks) = updater(models, &sims, true);
    let adapters = |state: &State| state.snapshot().workers[0].adapters.clone();
    assert!(until(20, || adapters(&state) == ["sql"] && checked(&state, &name)).await);
    assert_eq!(worker_status(&state, &name)["compatible"], true);

    let http = reqwest::Client::new();
    let post =
        |path: &str, body: Value| http.post(format!("http://{name}/v1/{path}")).json(&body).send();
    let r = post("load_lora_adapter", json!({"lora_name": "chat", "lora_path": "/a/chat"}));
    assert_eq!(r.await.unwrap().status(), 200);
    assert!(until(10, || adapters(&state) == ["chat", "sql"]).await, "{:?}", adapters(&state));
    assert_eq!(
        post("unload_lora_adapter", json!({"lora_name": "sql"})).await.unwrap().status(),
        200
    );
    assert!(until(10, || adapters(&state) == ["chat"]).await, "{:?}", adapters(&state));

    // A request naming the adapter is cached in the adapter's domain, and so known there.
    let msgs = long_chat(11);
    let tokens = bundle.prompt_tokens(&Prompt::messages(msgs.clone())).unwrap();
    chat(&name, "chat", &msgs).await;
    assert!(until(10, || holds(&state, &name, &tokens, Some("chat"))).await);
    assert!(!holds(&state, &name, &tokens, None), "adapter blocks credited to the base model");
}

#[tokio::test]
async fn a_worker_announcing_another_block_size_than_the_learned_one_is_incompatible() {
    let demo = ModelBundle::demo().unwrap();
    let a = sim_worker("kvroute-demo", demo.clone(), 16, LoraSpec::default());
    let b = sim_worker("kvroute-demo", demo.clone(), 24, LoraSpec::default());
    let c = sim_worker("kvroute-demo", demo.clone(), 32, LoraSpec::default());
    let sims = [start_sim(&a).await, start_sim(&b).await, start_sim(&c).await];
    let models = Models::load(&["kvroute-demo".parse().unwrap()], &[]).unwrap();
    let (state, _tasks) = updater(models, &sims, false);
    let (an, bn, cn) = (&sims[0].0, &sims[1].0, &sims[2].0);
    assert!(until(20, || [an, bn, cn].iter().all(|w| checked(&state, w))).await);
    assert_eq!(worker_status(&state, an)["compatible"], true);
    let bs = worker_status(&state, bn);
    assert_eq!(bs["compatible"], false);
    assert!(bs["alignment"].as_str().unwrap().contains("announced block size 24"), "{bs}");
    assert_eq!(state.snapshot().models[0].block_size, 16);
    // Pages of 32 are a multiple of the learned 16: re-chunked, the worker is credited in
    // blocks of 16 (the whole pages its prompt filled).
    assert_eq!(worker_status(&state, cn)["compatible"], true);
    let msgs = long_chat(21);
    let tokens = demo.prompt_tokens(&Prompt::messages(msgs.clone())).unwrap();
    chat(cn, "kvroute-demo", &msgs).await;
    let full_pages = &tokens[..(tokens.len() - 1) / 32 * 32];
    assert!(
        until(10, || holds(&state, cn, full_pages, None)).await,
        "{}",
        worker_status(&state, cn)
    );
    let cs = worker_status(&state, cn);
    assert_eq!(cs["stats"]["block_size_mismatches"], 0, "{cs}");
    assert!(cs["stats"]["rechunked_stores"].as_u64().unwrap() > 0, "{cs}");

    // Configured, the block size is checked, never learned: 16 and 32 fit 32, 24 does not.
    let models =
        Models::load(&["kvroute-demo".parse().unwrap()], &[("kvroute-demo".into(), 32)]).unwrap();
    let (state, _tasks) = updater(models, &sims, false);
    assert!(until(20, || [an, bn, cn].iter().all(|w| checked(&state, w))).await);
    assert_eq!(worker_status(&state, an)["compatible"], true);
    assert_eq!(worker_status(&state, bn)["compatible"], false);
    assert_eq!(worker_status(&state, cn)["compatible"], true);
    assert_eq!(state.snapshot().models[0].block_size, 32);
}
