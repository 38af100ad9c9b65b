//! Block-manager throughput: request lifecycles (prefix lookup, acquire, fill, release) per
//! second on one core, on a cache under eviction pressure. Run: `cargo bench -p kvroute-sim`.

use std::hint::black_box;
use std::time::Instant;

use kvroute_sim::cache::{engine_hashes, BlockCache};

fn main() {
    let bs = 16;
    let mut cache = BlockCache::new(16_384);
    // 64 shared prefixes of 32 blocks, each request adds 8 unique blocks.
    let prefixes: Vec<Vec<u32>> =
        (0..64u32).map(|p| (0..512).map(|t| p * 10_000 + t).collect()).collect();
    let requests = 200_000u32;
    let mut ops = 0u64;
    let start = Instant::now();
    for r in 0..requests {
        let mut tokens = prefixes[(r % 64) as usize].clone();
        tokens.extend((0..128).map(|t| 1_000_000 + r * 128 + t));
        let hashes = engine_hashes(&tokens, bs, None, None);
        let hit = cache.longest_prefix(&hashes);
        if cache.acquire(&hashes[..hit], hashes.len() - hit).is_err() {
            continue;
        }
        for h in &hashes[hit..] {
            cache.fill(*h);
        }
        cache.release(black_box(&hashes), 0);
        // One lookup, one acquire, one fill per new block, one release per block.
        ops += 2 + 2 * (hashes.len() - hit) as u64 + hit as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "block manager: {requests} request lifecycles in {secs:.2} s = {:.0} lifecycles/s, {:.1} M block operations/s (one core)",
        f64::from(requests) / secs,
        ops as f64 / secs / 1e6
    );
}
