//! The updater following a simulated worker that publishes the real engines' event shapes
//! (vLLM 0.33's KV cache groups, OffloadingConnector placeholders and duplicate stores;
//! SGLang's small and large pages and EAGLE token pairs): its knowledge still predicts exactly
//! what the worker reports as reused, with evictions, and the worker stays compatible.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::Task;
use kvroute_core::decision::hash::block_hashes;
use kvroute_core::decision::request::Prompt;
use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_sim::events::{EventConfig, EventEncoding, EventShape, ReplyShape};
use kvroute_sim::profile::HardwareProfile;
use kvroute_sim::worker::{Ports, Worker, WorkerSpec};
use kvroute_updater::ingest::DomainBase;
use kvroute_updater::state::State;
use kvroute_updater::subscriber::{follow, Endpoints};
use serde_json::{json, Value};

/// kvroute's block size in these tests.
const BLOCK: usize = 16;

struct Setup {
    _worker: Arc<Worker>,
    _follow: Task,
    http: u16,
    state: Arc<State>,
    name: String,
    bundle: ModelBundle,
    /// The engine's block size.
    engine_block: usize,
}

async fn setup(shape: &str, engine_block: usize, gpu_blocks: usize) -> Setup {
    let mut profile = HardwareProfile::load("llama3-8b-h100").unwrap();
    (profile.block_size, profile.num_gpu_blocks) = (engine_block, gpu_blocks);
    let events = EventConfig {
        topic: String::new(),
        encoding: EventEncoding::Map,
        reply_shape: ReplyShape::Triple,
        buffer_steps: 1000,
    };
    let spec = WorkerSpec::loopback("kvroute-demo", profile, events);
    let bundle = ModelBundle::demo().unwrap();
    let worker = Worker::new(spec, bundle.clone(), Ports::default());
    let p = worker.start().await.unwrap();
    let (_, log) = worker.current().await.unwrap();
    log.set_shape(EventShape::parse(shape).unwrap());
    let name = format!("127.0.0.1:{}", p.http);
    let domain = DomainBase {
        model: "kvroute-demo".into(),
        tokenizer_fingerprint: bundle.fingerprint(),
        block_size: BLOCK as u32,
        lora_name: None,
    };
    let state = Arc::new(State::new(domain, [name.clone()]));
    let ep = Endpoints {
        worker: name.clone(),
        events: format!("tcp://127.0.0.1:{}", p.events),
        replay: Some(format!("tcp://127.0.0.1:{}", p.replay)),
    };
    let task = common::spawn(follow(Arc::clone(&state), ep));
    Setup { _worker: worker, _follow: task, http: p.http, state, name, bundle, engine_block }
}

fn messages(conv: u64, turns: usize) -> Vec<Value> {
    let mut m =
        vec![json!({"role": "system", "content": kvroute_testkit::textgen::words(conv, 150)})];
    for t in 0..turns {
        m.push(json!({"role": "user", "content": kvroute_testkit::textgen::words(conv * 100 + t as u64, 20)}));
    }
    m
}

impl Setup {
    async fn send(&self, msgs: &[Value]) -> u64 {
        let body = json!({"model": "kvroute-demo", "messages": msgs, "max_tokens": 2});
        let r = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/v1/chat/completions", self.http))
            .json(&body)
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
    }

    fn tier(&self, gpu: bool) -> HashSet<u64> {
        let snap = self.state.snapshot();
        let w = &snap.workers[0];
        (if gpu { &w.gpu } else { &w.offloaded }).iter().copied().collect()
    }

    /// The prompt's blocks known on a tier, from the start.
    fn known(&self, msgs: &[Value], gpu: bool) -> usize {
        let tokens = self.bundle.prompt_tokens(&Prompt::messages(msgs.to_vec())).unwrap();
        let seed = self.state.domain_of(&self.name).unwrap().seed(None, None);
        let known = self.tier(gpu);
        block_hashes(seed, BLOCK as u32, &tokens).iter().take_while(|h| known.contains(h)).count()
    }

    /// What the updater's knowledge predicts the worker will reuse for `msgs`: the known
    /// prefix, in whole engine blocks, the last token recomputed.
    fn predicted(&self, msgs: &[Value]) -> u64 {
        let tokens = self.bundle.prompt_tokens(&Prompt::messages(msgs.to_vec())).unwrap();
        let tokens_known = self.known(msgs, true) * BLOCK;
        let e = self.engine_block;
        (tokens_known.min(tokens.len() - 1) / e * e) as u64
    }

    async fn settle(&self, msgs: &[Value]) {
        for _ in 0..150 {
            if self.predicted(msgs) > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn status(&self) -> Value {
        self.state.status()["workers"][&self.name].clone()
    }

    fn stat(&self, key: &str) -> u64 {
        self.status()["stats"][key].as_u64().unwrap_or(0)
    }
}

async fn warm_up(s: &Setup) {
    for i in 0..50 {
        s.send(&messages(9000 + i, 1)).await;
        if s.stat("batches") > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the updater never received an event");
}

/// Conversations, two turns each, on a pool small enough to evict: the second turn's reuse
/// is predicted exactly.
async fn predictions_hold(s: &Setup, label: &str) {
    warm_up(s).await;
    for conv in 0..8u64 {
        let first = messages(conv, 1);
        s.send(&first).await;
        s.settle(&first).await;
        let second = messages(conv, 2);
        let predicted = s.predicted(&second);
        let actual = s.send(&second).await;
        assert!(actual > 0, "{label}: conversation {conv}");
        assert_eq!(predicted, actual, "{label}: conversation {conv}: {}", s.status());
    }
    let st = s.status();
    assert_eq!(st["compatible"], true, "{label}: {st}");
    for counter in ["orphans", "block_size_mismatches", "bad_events", "refused_batches"] {
        assert_eq!(s.stat(counter), 0, "{label}: {counter}: {st}");
    }
}

#[tokio::test]
async fn vllm_groups_offloading_and_duplicate_stores() {
    let s = setup("groups=full_attention,sliding_window;offload;repeat", 16, 96).await;
    predictions_hold(&s, "vllm").await;
    assert!(s.stat("no_credit_group_stores") > 0);
    assert!(s.stat("offload_stores_matched") > 0);
    assert_eq!(s.stat("offload_stores_unmatched"), 0);
    // The offloaded copies of a conversation's blocks outlive their GPU eviction.
    let first = messages(0, 1);
    assert!(s.known(&first, false) > 0, "{}", s.status());
    assert_eq!(s.status()["kv_cache_groups"]["1"], "sliding_window");
}

#[tokio::test]
async fn sglang_pages_of_one_four_and_sixty_four() {
    for (shape, engine_block) in [("page=1", 16), ("page=4;pairs", 16), ("", 64)] {
        let s = setup(shape, engine_block, 1536 / engine_block).await;
        predictions_hold(&s, &format!("'{shape}' on blocks of {engine_block}")).await;
        if shape.contains("pairs") {
            assert!(s.stat("lookahead_stores") > 0);
        }
        assert!(s.stat("rechunked_stores") > 0);
    }
}
