//! LoRA adapters and real model bundles, seen from outside over real HTTP and ZMQ: vLLM's
//! `/v1/models` shape, its dynamic adapter API with its answers and error codes, adapters as
//! cache domains of their own (with `lora_name` in the KV events), and the binary serving a
//! Hugging Face bundle (`--model-dir`) with adapters given at start (`--lora`).

use std::sync::Arc;
use std::time::Duration;

use kvroute_core::decision::request::Prompt;
use kvroute_core::decision::tokenize::model::{qwen3, qwen3_dir, ModelBundle};
use kvroute_sim::api::Adapter;
use kvroute_sim::events::{EventConfig, EventEncoding, ReplyShape};
use kvroute_sim::profile::HardwareProfile;
use kvroute_sim::worker::{LoraSpec, Ports, Worker, WorkerSpec};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use zeromq::{Socket, SocketRecv};

const BASE: &str = "kvroute-demo";

async fn worker(lora: LoraSpec) -> (Arc<Worker>, Ports) {
    let events = EventConfig {
        topic: String::new(),
        encoding: EventEncoding::Map,
        reply_shape: ReplyShape::Triple,
        buffer_steps: 1000,
    };
    let profile = HardwareProfile::load("llama3-8b-h100").unwrap();
    let spec = WorkerSpec { lora, ..WorkerSpec::loopback(BASE, profile, events) };
    let w = Worker::new(spec, ModelBundle::demo().unwrap(), Ports::default());
    let ports = w.start().await.unwrap();
    (w, ports)
}

fn sql() -> LoraSpec {
    LoraSpec {
        adapters: vec![Adapter { name: "sql".into(), path: "/adapters/sql".into() }],
        max_loras: 2,
        load_ms: 0,
    }
}

async fn post(port: u16, path: &str, body: &Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn models(port: u16) -> Vec<Value> {
    let v: Value = reqwest::get(format!("http://127.0.0.1:{port}/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["data"].as_array().unwrap().clone()
}

fn ids(models: &[Value]) -> Vec<&str> {
    models.iter().map(|m| m["id"].as_str().unwrap()).collect()
}

fn chat(model: &str, seed: u64) -> Value {
    json!({"model": model, "max_tokens": 2,
        "messages": [{"role": "user", "content": kvroute_testkit::textgen::words(seed, 200)}]})
}

/// The `cached_tokens` of a successful chat completion.
async fn cached(port: u16, body: &Value) -> u64 {
    let (code, text) = post(port, "/v1/chat/completions", body).await;
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["model"], body["model"], "the answer names the model asked for");
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
}

/// vLLM's error body: `{"error": {"message", "type", "param", "code": <status>}}`.
fn error(text: &str) -> Value {
    serde_json::from_str::<Value>(text).unwrap()["error"].clone()
}

#[tokio::test]
async fn models_list_the_base_and_adapters_in_vllms_shape() {
    let (_w, p) = worker(sql()).await;
    let m = models(p.http).await;
    assert_eq!(ids(&m), [BASE, "sql"]);
    assert_eq!(m[0]["parent"], Value::Null);
    assert_eq!(m[0]["root"], BASE);
    assert!(m[0]["max_model_len"].as_u64().unwrap() > 0);
    assert_eq!(m[1]["parent"], BASE);
    assert_eq!(m[1]["root"], "/adapters/sql");
    assert_eq!(m[1]["max_model_len"], Value::Null);
    for card in &m {
        assert_eq!(card["object"], "model");
        assert!(card["permission"].is_array());
    }
}

#[tokio::test]
async fn the_adapter_api_answers_as_vllm_does() {
    let (w, p) = worker(sql()).await;
    let load = |body: Value| async move { post(p.http, "/v1/load_lora_adapter", &body).await };
    let (code, text) = load(json!({"lora_name": "chat", "lora_path": "/adapters/chat"})).await;
    assert_eq!((code, text.as_str()), (200, "Success: LoRA adapter 'chat' added successfully."));
    assert_eq!(ids(&models(p.http).await), [BASE, "sql", "chat"]);

    let (code, text) = load(json!({"lora_name": "chat", "lora_path": "/adapters/chat"})).await;
    let e = error(&text);
    assert_eq!((code, &e["type"], &e["code"]), (400, &json!("InvalidUserInput"), &json!(400)));
    assert!(e["message"].as_str().unwrap().contains("has already been loaded"), "{e}");
    let (code, _) =
        load(json!({"lora_name": "chat", "lora_path": "/v2", "load_inplace": true})).await;
    assert_eq!(code, 200, "load_inplace reloads a loaded adapter");
    assert_eq!(models(p.http).await[2]["root"], "/v2");
    let (code, text) = load(json!({"lora_name": "x"})).await;
    assert_eq!(code, 400);
    assert_eq!(error(&text)["message"], "Both 'lora_name' and 'lora_path' must be provided.");
    assert_eq!(load(json!({"lora_name": BASE, "lora_path": "/a"})).await.0, 400);

    let unload = |body: Value| async move { post(p.http, "/v1/unload_lora_adapter", &body).await };
    let (code, text) = unload(json!({"lora_name": "nope"})).await;
    let e = error(&text);
    assert_eq!((code, &e["type"], &e["code"]), (404, &json!("NotFoundError"), &json!(404)));
    assert_eq!(e["message"], "The lora adapter 'nope' cannot be found.");
    assert_eq!(unload(json!({})).await.0, 400);
    let (code, text) = unload(json!({"lora_name": "chat"})).await;
    assert_eq!((code, text.as_str()), (200, "Success: LoRA adapter 'chat' removed successfully."));
    assert_eq!(ids(&models(p.http).await), [BASE, "sql"]);

    // A request for an adapter that is not loaded gets vLLM's 404.
    let (code, text) = post(p.http, "/v1/chat/completions", &chat("chat", 1)).await;
    let e = error(&text);
    assert_eq!((code, &e["type"], &e["code"]), (404, &json!("NotFoundError"), &json!(404)));
    assert_eq!(e["message"], "The model `chat` does not exist.");
    assert_eq!(e["param"], "model");
    let tokenize = json!({"model": "chat", "prompt": "hello"});
    assert_eq!(post(p.http, "/tokenize", &tokenize).await.0, 404);

    // Adapters loaded through the API are gone after a restart; those given at start stay.
    load(json!({"lora_name": "chat", "lora_path": "/adapters/chat"})).await;
    w.start().await.unwrap();
    assert_eq!(ids(&models(p.http).await), [BASE, "sql"]);
}

#[tokio::test]
async fn an_adapter_load_delay_keeps_it_unusable_until_loaded() {
    let (_w, p) = worker(LoraSpec { load_ms: 1000, ..sql() }).await;
    let port = p.http;
    let loading = tokio::spawn(async move {
        let body = json!({"lora_name": "slow", "lora_path": "/adapters/slow"});
        post(port, "/v1/load_lora_adapter", &body).await
    });
    // A listing that answered well within the load delay does not have it yet.
    let asked = std::time::Instant::now();
    let listed_early = ids(&models(p.http).await).contains(&"slow");
    if asked.elapsed() < Duration::from_millis(500) {
        assert!(!listed_early, "listed while still loading");
        let (code, _) = post(p.http, "/v1/chat/completions", &chat("slow", 3)).await;
        assert!(code == 404 || asked.elapsed() >= Duration::from_millis(900), "{code}");
    }
    assert_eq!(loading.await.unwrap().0, 200);
    assert!(ids(&models(p.http).await).contains(&"slow"));
    assert_eq!(cached(p.http, &chat("slow", 3)).await, 0);
}

/// A msgpack value as JSON (map keys as strings).
fn to_json(v: &rmpv::Value) -> Value {
    use rmpv::Value as M;
    match v {
        M::Nil => Value::Null,
        M::Boolean(b) => json!(b),
        M::Integer(i) => i.as_u64().map_or_else(|| json!(i.as_i64()), |u| json!(u)),
        M::F32(f) => json!(f),
        M::F64(f) => json!(f),
        M::String(s) => json!(s.as_str()),
        M::Binary(b) => json!(b),
        M::Array(a) => Value::Array(a.iter().map(to_json).collect()),
        M::Map(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.as_str().unwrap_or_default().to_owned(), to_json(v)))
                .collect(),
        ),
        M::Ext(_, b) => json!(b),
    }
}

/// Receives KV-event batches until one holds a `BlockStored` whose `lora_name` is `lora`;
/// returns that event (map form).
async fn stored_for(sub: &mut zeromq::SubSocket, lora: &str) -> Option<Value> {
    for _ in 0..200 {
        let m = tokio::time::timeout(Duration::from_secs(5), sub.recv()).await.ok()?.ok()?;
        let payload = m.into_vec().get(2)?.clone();
        let batch = rmpv::decode::read_value(&mut &payload[..]).ok()?;
        for ev in batch[1].as_array()? {
            let json = to_json(ev);
            if json["type"] == "BlockStored" && json["lora_name"] == lora {
                return Some(json);
            }
        }
    }
    None
}

#[tokio::test]
async fn each_adapter_caches_in_its_own_domain_and_its_events_name_it() {
    let (_w, p) = worker(sql()).await;
    let mut sub = zeromq::SubSocket::new();
    sub.connect(&format!("tcp://127.0.0.1:{}", p.events)).await.unwrap();
    sub.subscribe("").await.unwrap();
    post(p.http, "/v1/load_lora_adapter", &json!({"lora_name": "chat", "lora_path": "/c"})).await;

    assert_eq!(cached(p.http, &chat(BASE, 5)).await, 0);
    assert!(cached(p.http, &chat(BASE, 5)).await > 0);
    // The same prompt for an adapter shares nothing with the base model or another adapter.
    assert_eq!(cached(p.http, &chat("sql", 5)).await, 0);
    assert!(cached(p.http, &chat("sql", 5)).await > 0);
    assert_eq!(cached(p.http, &chat("chat", 5)).await, 0);
    assert!(cached(p.http, &chat(BASE, 5)).await > 0, "the adapters evicted the base's blocks");

    // ZMQ's slow joiner may have dropped the first batches: send until the adapter's arrive.
    let mut found = None;
    for seed in 0..20 {
        cached(p.http, &chat("sql", 100 + seed)).await;
        if let Ok(Some(ev)) =
            tokio::time::timeout(Duration::from_millis(500), stored_for(&mut sub, "sql")).await
        {
            found = Some(ev);
            break;
        }
    }
    let ev = found.expect("no BlockStored named the adapter");
    // vLLM's extra keys: the adapter's name in every block's keys.
    let blocks = ev["block_hashes"].as_array().unwrap().len();
    assert_eq!(ev["extra_keys"], json!(vec![vec!["sql"]; blocks]));
}

/// The binary with `--model-dir` renders and tokenizes with that bundle and lists `--lora`
/// adapters; the child process is killed when the test ends (also on failure).
#[tokio::test]
async fn the_binary_serves_a_hugging_face_bundle_and_adapters_given_at_start() {
    let qwen = qwen3().expect("the Qwen3 bundle (./dev setup)");
    let dir = qwen3_dir();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(["--workers", "1", "--base-port", "0", "--model", "Qwen/Qwen3-8B", "--lora"])
        .arg("sql=/adapters/sql")
        .arg("--model-dir")
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("no start-up line")
        .unwrap()
        .unwrap();
    let addr = line.split_whitespace().skip_while(|w| *w != "on").nth(1).unwrap().to_owned();
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();

    let m = models(port).await;
    assert_eq!(ids(&m), ["Qwen/Qwen3-8B", "sql"]);
    assert_eq!(m[0]["root"], dir.display().to_string());
    assert_eq!(m[1]["parent"], "Qwen/Qwen3-8B");
    let msgs = vec![
        json!({"role": "system", "content": "You are terse."}),
        json!({"role": "user", "content": "Route this, please."}),
    ];
    let body = json!({"model": "Qwen/Qwen3-8B", "messages": msgs, "add_generation_prompt": true});
    let (code, text) = post(port, "/tokenize", &body).await;
    assert_eq!(code, 200, "{text}");
    let got: Vec<u32> = serde_json::from_str::<Value>(&text).unwrap()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(got, qwen.prompt_tokens(&Prompt::messages(msgs)).unwrap());
    assert_eq!(got[0], qwen.encode("<|im_start|>", false).unwrap()[0]);
    let answer = json!({"model": "sql", "max_tokens": 3,
        "messages": [{"role": "user", "content": "hello"}]});
    assert_eq!(post(port, "/v1/chat/completions", &answer).await.0, 200);
    child.kill().await.unwrap();
}
