//! Conformance with vLLM's own KV-event publisher (vllm/distributed/kv_events.py of the pinned
//! vllm 0.33.0 wheel, unmodified, driven by integration/python/vllm_driver.py with vLLM's own
//! block hashing): each scenario's events go through the real `kvroute-updater`, and the
//! knowledge it holds per tier must be what the engine's cache holds. Skipped (with a message)
//! when `./dev setup` has not unpacked the engine, except in CI.

use kvroute_stack::engines::{run, EngineOutcome, EngineScenario};

async fn scenario(name: &str) -> Option<EngineOutcome> {
    let s = EngineScenario {
        engine: "vllm",
        driver: "vllm_driver.py",
        scenario: name,
        driver_args: Vec::new(),
        sim_args: vec!["--block-size".into(), "16".into()],
        updater_args: Vec::new(),
        sglang_face: None,
    };
    match run(s).await {
        Ok(o) => o,
        Err(e) => panic!("vLLM scenario '{name}': {e:#}"),
    }
}

/// Chains sharing a prefix (the second stored with the first's block as parent), then the
/// first's tail reallocated.
#[tokio::test]
async fn plain_chains() {
    scenario("chains").await;
}

/// The offloading connector's default stores (no token ids, block size 0, medium CPU) name
/// blocks the GPU announced: they are the CPU tier's; a GPU eviction keeps the CPU copy; a
/// self-describing CPU store continues a chain.
#[tokio::test]
async fn offloading_connector_stores() {
    scenario("offload").await;
}

/// One hash in a full-attention and a sliding-window KV cache group: known while the
/// full-attention group holds it, whatever the sliding-window group freed; not once only the
/// sliding-window group holds it.
#[tokio::test]
async fn kv_cache_groups() {
    scenario("groups").await;
}

/// Repeated stores of one hash (overlapping offload chunks) are reference-counted: one removal
/// per store.
#[tokio::test]
async fn repeated_stores_and_removals() {
    scenario("refcount").await;
}

/// AllBlocksCleared empties the GPU tier; the CPU tier is kept.
#[tokio::test]
async fn all_blocks_cleared_is_gpu_only() {
    scenario("cleared").await;
}

/// Blocks marked `locality="REMOTE"` are another node's; a connector's own medium string is
/// not the GPU.
#[tokio::test]
async fn remote_locality_and_unknown_medium() {
    scenario("remote").await;
}

/// EAGLE's lookahead_token_ids extend the engine's hash, not the block's tokens.
#[tokio::test]
async fn lookahead_token_ids() {
    scenario("lookahead").await;
}

/// A new publisher (sequence from 0) is a restarted engine: what the old one announced is gone.
#[tokio::test]
async fn publisher_restart() {
    scenario("restart").await;
}

/// A batch dropped on the PUB socket is fetched from the publisher's replay socket.
#[tokio::test]
async fn dropped_batch_replayed() {
    if let Some(o) = scenario("replay").await {
        let stats = &o.worker["stats"];
        assert!(stats["gaps"].as_u64() >= Some(1), "the dropped batch was not noticed: {stats}");
        assert!(stats["replays"].as_u64() >= Some(1), "nothing was replayed: {stats}");
    }
}
