//! Conformance with SGLang's own KV-cache code (the pinned sglang 0.5.23 wheel, unmodified: its
//! RadixCache driven by inserts, evictions and resets, its event recorder and its ZMQ
//! publisher, run by integration/python/sglang_driver.py with a list-backed torch stand-in; see
//! that file for every stand-in): each scenario's events go through the real `kvroute-updater`,
//! and the knowledge it holds per tier must be the radix cache's, in kvroute's blocks. Skipped
//! (with a message) when `./dev setup` has not unpacked the engine, except in CI. The last two
//! tests read SGLang's announcements (block size, load, a non-Jinja template) from an
//! in-process SGLang HTTP surface and need no engine sources.

use std::time::Duration;

use kvroute_stack::engines::{run, EngineOutcome, EngineScenario};
use kvroute_stack::sglang_face::SglangFace;
use kvroute_stack::sim::SimWorker;
use kvroute_stack::stack::Updater;
use kvroute_stack::{eventually, paths};
use serde_json::Value;

/// kvroute's block size for the model when configured (`--block-size`).
const BLOCK: u32 = 16;

/// Runs `name` with SGLang page size `page`. `explicit`: the updater is told the block size
/// (`--block-size 16`); else it learns it from what the worker announces as SGLang does
/// (`/server_info` `kv_events.block_size`, `sglang:page_size`): the page size, or blocks of 16
/// for pages dividing 16.
async fn scenario(name: &str, page: u32, explicit: bool) -> Option<EngineOutcome> {
    let (block, updater_args) = if explicit {
        (BLOCK, vec!["--block-size".to_string(), BLOCK.to_string()])
    } else {
        (if BLOCK % page == 0 { BLOCK } else { page }, Vec::new())
    };
    let s = EngineScenario {
        engine: "sglang",
        driver: "sglang_driver.py",
        scenario: name,
        driver_args: vec![
            "--page-size".into(),
            page.to_string(),
            "--block-size".into(),
            block.to_string(),
        ],
        sim_args: Vec::new(),
        updater_args,
        sglang_face: Some(SglangFace {
            page_size: page,
            dcp_size: 1,
            builtin_template: false,
            running: 0,
            waiting: 0,
            token_usage: 0.0,
        }),
    };
    match run(s).await {
        Ok(o) => o,
        Err(e) => panic!(
            "SGLang scenario '{name}' (page size {page}, explicit block size {explicit}): {e:#}"
        ),
    }
}

/// SGLang's default page size 1: one page per token, re-chunked into kvroute's blocks.
#[tokio::test]
async fn page_size_1() {
    scenario("pages", 1, true).await;
}

#[tokio::test]
async fn page_size_1_learned_block_size() {
    scenario("pages", 1, false).await;
}

#[tokio::test]
async fn page_size_16() {
    scenario("pages", 16, false).await;
}

#[tokio::test]
async fn page_size_16_explicit_block_size() {
    scenario("pages", 16, true).await;
}

/// Pages larger than kvroute's blocks: each page is several blocks.
#[tokio::test]
async fn page_size_64() {
    scenario("pages", 64, true).await;
}

#[tokio::test]
async fn page_size_64_learned_block_size() {
    scenario("pages", 64, false).await;
}

/// EAGLE/MTP: token ids arrive as `[t_i, t_i+1]` pairs.
#[tokio::test]
async fn speculative_decoding_bigram_pairs() {
    scenario("bigram", 1, true).await;
}

/// Two extra_key namespaces with the same tokens publish the same hashes: evicting one keeps
/// the other.
#[tokio::test]
async fn extra_key_namespaces() {
    scenario("extra_key", 1, true).await;
}

/// HiCache: a node written back to host memory (CPU_PINNED) stays there after the device copy
/// is evicted.
#[tokio::test]
async fn hicache_host_tier() {
    scenario("hicache", 16, true).await;
}

/// A batch dropped on PUB comes back from the replay socket.
#[tokio::test]
async fn dropped_batch_replayed() {
    if let Some(o) = scenario("replay", 16, true).await {
        let stats = &o.worker["stats"];
        assert!(stats["gaps"].as_u64() >= Some(1), "the dropped batch was not noticed: {stats}");
        assert!(stats["replays"].as_u64() >= Some(1), "nothing was replayed: {stats}");
    }
}

/// /flush_cache: AllBlocksCleared forgets every block; later stores count again.
#[tokio::test]
async fn flush_cache() {
    scenario("flush", 16, true).await;
}

/// Starts the updater following an SGLang HTTP surface (`face`) and waits until its `/status`
/// entry for the worker satisfies `done`; returns that entry. Needs no engine sources.
async fn follow_face(tag: &str, face: SglangFace, done: impl Fn(&Value) -> bool) -> Value {
    follow_face_with(tag, face, &[], done).await
}

/// [`follow_face`] with `extra` updater flags.
async fn follow_face_with(
    tag: &str,
    face: SglangFace,
    extra: &[String],
    done: impl Fn(&Value) -> bool,
) -> Value {
    let dir = paths::scratch_dir(tag).unwrap();
    let sim = SimWorker::start(0, &[], &dir).await.unwrap();
    let addr = face.serve(sim.addr.clone()).await.unwrap();
    let (events, replay) = (paths::free_port().unwrap(), paths::free_port().unwrap());
    let endpoint = format!("{addr},tcp://127.0.0.1:{events},tcp://127.0.0.1:{replay}");
    let mut extra = extra.to_vec();
    extra.extend(["--scrape-interval-ms".to_string(), "200".to_string()]);
    let updater =
        Updater::start_with_args(paths::free_port().unwrap(), None, &[endpoint], &extra, &dir)
            .await
            .unwrap();
    let last = std::sync::Mutex::new(Value::Null);
    let found =
        eventually("the worker's announcements in /status", Duration::from_secs(30), || async {
            let w = updater.status().await.ok()?["workers"][&addr].clone();
            *last.lock().ok()? = w.clone();
            done(&w).then_some(w)
        })
        .await;
    match found {
        Ok(w) => w,
        Err(e) => panic!("{e}: last status {}; logs in {}", last.lock().unwrap(), dir.display()),
    }
}

/// SGLang announces its events' width in /server_info (page size 16 x DCP size 4) and its
/// load with a `priority=""` total plus per-priority samples, from every TP rank: the model's
/// block size is 64 and the load is counted once.
#[tokio::test]
async fn sglang_announcements_block_size_and_load() {
    let face = SglangFace {
        page_size: 16,
        dcp_size: 4,
        builtin_template: false,
        running: 6,
        waiting: 4,
        token_usage: 0.25,
    };
    let w = follow_face("sglang-face", face, |w| {
        w["compatible"] == Value::Bool(true) && w["reported_load"].is_object()
    })
    .await;
    assert_eq!(w["block_size"], 64, "{w}");
    let load = &w["reported_load"];
    assert_eq!((load["running"].as_f64(), load["waiting"].as_f64()), (Some(6.0), Some(4.0)), "{w}");
    assert_eq!(load["kv_usage"].as_f64(), Some(0.25), "{w}");
}

/// SGLang's default page size 1 with kvroute's block size 16 configured: the updater re-chunks
/// pages into blocks, so a page size that divides the block size is no mismatch (and the model
/// keeps its block size of 16).
#[tokio::test]
async fn sglang_page_size_1_is_compatible_with_block_size_16() {
    let face = SglangFace {
        page_size: 1,
        dcp_size: 1,
        builtin_template: false,
        running: 0,
        waiting: 0,
        token_usage: 0.0,
    };
    let extra = ["--block-size".to_string(), "16".to_string()];
    let w = follow_face_with("sglang-face-page1", face, &extra, |w| {
        w["alignment"].as_str().is_some_and(|a| a.contains("block size"))
            || w["compatible"] == Value::Bool(true)
    })
    .await;
    assert_eq!(w["compatible"], Value::Bool(true), "{w}");
    assert_eq!(w["block_size"], 16, "{w}");
}

/// Without a configured block size, a page size of 1 is not learned as the model's block size
/// (every prompt would be one block per token): pages are grouped into blocks of 16.
#[tokio::test]
async fn sglang_page_size_1_learned_as_blocks_of_16() {
    let face = SglangFace {
        page_size: 1,
        dcp_size: 1,
        builtin_template: false,
        running: 0,
        waiting: 0,
        token_usage: 0.0,
    };
    let w = follow_face("sglang-face-page1-learned", face, |w| {
        w["compatible"] == Value::Bool(true) && w["block_size"].is_u64()
    })
    .await;
    assert_eq!(w["block_size"], 16, "{w}");
}

/// A worker whose chat template is built in (not Jinja) answers /tokenize with 400: /status
/// says so, not that the canary tokens differ.
#[tokio::test]
async fn sglang_non_jinja_template_is_named() {
    let face = SglangFace {
        page_size: 1,
        dcp_size: 1,
        builtin_template: true,
        running: 0,
        waiting: 0,
        token_usage: 0.0,
    };
    let w = follow_face("sglang-face-jinja", face, |w| {
        // A verdict about the template (not "not checked yet").
        w["alignment"].as_str().is_some_and(|a| a.contains("tokenize") || a.contains("canary"))
    })
    .await;
    let why = w["alignment"].as_str().unwrap_or_default();
    assert!(why.contains("HTTP 400") && why.contains("Jinja"), "{w}");
    assert!(!why.contains("canary tokens differ"), "{w}");
    assert_eq!(w["compatible"], Value::Bool(false), "{w}");
}
