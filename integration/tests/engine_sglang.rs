//! Conformance with SGLang's own KV-event code (the pinned sglang 0.5.23 wheel, unmodified:
//! its ZMQ publisher and the radix cache's event recorder, driven by
//! integration/python/sglang_driver.py over a radix tree of plain nodes; see that file for the
//! stand-ins): each scenario's events go through the real `kvroute-updater`, and the knowledge
//! it holds per tier must be the radix cache's, in kvroute's blocks. Skipped (with a message)
//! when `./dev setup` has not unpacked the engine, except in CI.

use kvroute_integration::engines::{run, Scenario};

/// kvroute's block size for the model in these tests.
const BLOCK: u32 = 16;

/// Runs `name` with SGLang page size `page`; `explicit`: the updater is told the block size
/// (`--block-size`), else it learns it from the worker's announcement.
async fn scenario(name: &str, page: u32, explicit: bool) {
    let mut updater_args = Vec::new();
    if explicit {
        updater_args = vec!["--block-size".to_string(), BLOCK.to_string()];
    }
    let s = Scenario {
        engine: "sglang",
        driver: "sglang_driver.py",
        scenario: name,
        driver_args: vec![
            "--page-size".into(),
            page.to_string(),
            "--block-size".into(),
            BLOCK.to_string(),
        ],
        sim_args: vec!["--block-size".into(), BLOCK.to_string()],
        updater_args,
    };
    if let Err(e) = run(s).await {
        panic!(
            "SGLang scenario '{name}' (page size {page}, explicit block size {explicit}): {e:#}"
        );
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
    scenario("replay", 16, true).await;
}

/// /flush_cache: AllBlocksCleared forgets every block; later stores count again.
#[tokio::test]
async fn flush_cache() {
    scenario("flush", 16, true).await;
}
