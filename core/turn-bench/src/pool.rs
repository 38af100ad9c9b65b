//! The `pool` case: the router's decision for a 4 096-token token-id prompt (the prompt
//! `kvroute-scale` sends through Envoy) on pools of 64 and 1 024 workers, so that the part of
//! a decision that grows with the pool can be timed and profiled as the filter's wasm.
//!
//! Every worker holds two 4 096-token prompts on its GPU tier (an updater snapshot, as a
//! filter thread takes it in), each starting with one of 8 shared system prompts of 8 blocks,
//! as `kvroute-scale` fills its pool through Envoy; the middle worker also holds the hit
//! prompt, which starts with the first system prompt (so about a quarter of the pool holds its
//! first 8 blocks). Two fleets:
//! `idle` (every worker reports nothing running, as `kvroute-scale`'s simulated pool between
//! its requests) and `loaded` (a few requests running and waiting on each worker, some in this
//! thread's load view). A miss shares no block with anything held.

use std::time::Instant;

use kvroute_core::decision::config::sync::LoadLimits;
use kvroute_core::decision::config::FilterConfig;
use kvroute_core::decision::request::{self, Endpoint};
use kvroute_core::decision::router::Router;
use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_core::shared::fake::{MemStore, Tally};
use kvroute_core::shared::load::{LoadView, Shard};
use kvroute_core::wire::snapshot::{ModelInfo, Snapshot, SnapshotLoad, SnapshotWorker};
use serde_json::json;

use crate::quantile;

const MODEL: &str = crate::MODEL;
/// Tokens of the hit and miss prompts (`kvroute-scale --envoy-prompt-tokens`' default).
const PROMPT_TOKENS: usize = 4096;
/// Prompts each worker holds besides the hit (`kvroute-scale --envoy-fill`'s default).
const FILL: u64 = 2;
const NOW_MS: u64 = 1_000_000;
/// Shared system prompts the workers' prompts start with, as `kvroute-scale` fills its pool:
/// each prompt with one of [`SYSTEM_PROMPTS`], the hit with the first.
const SYSTEM_PROMPTS: u64 = 8;
/// Tokens of a shared system prompt (8 blocks of 16).
const SHARED_TOKENS: usize = 128;
const SYSTEM_SEED: u64 = 1 << 40;

/// Times `iters` hits and misses on each pool size and fleet, and prints them with the
/// 1 024 / 64 ratios; `evict`: each decision starts with cold CPU caches.
pub fn run(iters: usize, bundle: &ModelBundle, evict: bool) -> Result<(), String> {
    let mut evict = evict.then(|| vec![1u8; crate::EVICT_BYTES]);
    let cold = if evict.is_some() { ", cold caches" } else { "" };
    println!("pool: {PROMPT_TOKENS}-token token ids, Router::decide alone{cold}, µs (p50 p99)");
    println!("{:<8} {:>7} {:>15} {:>15}", "fleet", "workers", "hit", "miss");
    for loaded in [false, true] {
        let fleet = if loaded { "loaded" } else { "idle" };
        let mut p50 = Vec::new();
        for workers in [64, 1024] {
            let mut pool = Pool::new(workers, loaded, bundle)?;
            let hit = pool.time(true, iters, evict.as_deref_mut())?;
            let miss = pool.time(false, iters, evict.as_deref_mut())?;
            let cell = |v: &[f64]| format!("{:>7.1} {:>7.1}", quantile(v, 0.5), quantile(v, 0.99));
            println!("{fleet:<8} {workers:>7} {} {}", cell(&hit), cell(&miss));
            p50.push((quantile(&hit, 0.5), quantile(&miss, 0.5)));
        }
        if let [(h64, m64), (h1k, m1k)] = p50[..] {
            println!("{fleet:<8} 1024/64 hit {:.2}x miss {:.2}x", h1k / h64, m1k / m64);
        }
    }
    Ok(())
}

/// Token id `i` of the stream `seed` (a splitmix64 of both, below Qwen3's vocabulary).
fn token(seed: u64, i: u64) -> u32 {
    let mut x = (seed << 32 ^ i).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    1 + ((x ^ (x >> 31)) % 100_000) as u32
}

/// The body of prompt `seed`: with `system`, its first [`SHARED_TOKENS`] are that shared
/// system prompt's.
fn body(seed: u64, system: Option<u64>) -> Vec<u8> {
    let shared = system.map_or(0, |_| SHARED_TOKENS as u64);
    let ids: Vec<u32> = (0..PROMPT_TOKENS as u64)
        .map(|i| match system {
            Some(s) if i < shared => token(SYSTEM_SEED + s, i),
            _ => token(seed, i),
        })
        .collect();
    json!({"model": MODEL, "prompt": ids, "max_tokens": 1}).to_string().into_bytes()
}

struct Pool {
    router: Router,
    loads: LoadView,
    hit: Vec<u8>,
    miss: Vec<u8>,
}

impl Pool {
    fn new(workers: usize, loaded: bool, bundle: &ModelBundle) -> Result<Pool, String> {
        let names: Vec<String> = (0..workers)
            .map(|i| format!("10.{}.{}.{}:8000", (i >> 16) & 255, (i >> 8) & 255, i & 255))
            .collect();
        let cfg = json!({"models": [{"name": MODEL, "workers": names}]});
        let cfg = FilterConfig::from_json(cfg.to_string().as_bytes()).map_err(|e| e.to_string())?;
        let mut router = Router::new(&cfg).map_err(|e| e.to_string())?;
        router.set_bundle(MODEL, Some(bundle.clone()));
        let plan = router.plan().model(MODEL).ok_or("no model plan")?;
        let info = ModelInfo {
            name: MODEL.into(),
            fingerprint: plan.fingerprint().ok_or("no bundle fingerprint")?,
            block_size: plan.block_size,
        };
        let empty = LoadView::default();
        // The router's own block hashes of a prompt: decided once on an empty pool.
        let hashes = |seed: u64, system: Option<u64>| -> Result<Vec<u64>, String> {
            let b = body(seed, system);
            let parsed = request::parse(Endpoint::Completions, &b).map_err(|e| e.to_string())?;
            let d = router
                .decide(&parsed, b.len(), &empty, NOW_MS, 0)
                .map_err(|e| String::from_utf8_lossy(&e.body()).into_owned())?;
            Ok(d.block_hashes)
        };
        let (hit_seed, miss_seed) = (1 << 30, (1 << 30) + 1);
        let hit_blocks = hashes(hit_seed, Some(0))?;
        let mut snap = Snapshot {
            version: 1,
            generated_at_ms: NOW_MS,
            models: vec![info],
            ..Snapshot::default()
        };
        for (i, name) in names.iter().enumerate() {
            let mut gpu = Vec::new();
            for p in 0..FILL {
                let seed = i as u64 * FILL + p;
                gpu.extend(hashes(seed, Some(seed % SYSTEM_PROMPTS))?);
            }
            if i == workers / 2 {
                gpu.extend(&hit_blocks);
            }
            let (running, waiting) = if loaded { (i as u32 % 8, i as u32 % 3) } else { (0, 0) };
            snap.workers.push(SnapshotWorker {
                worker: name.clone(),
                observed_at_ms: NOW_MS,
                compatible: true,
                gpu,
                load: Some(SnapshotLoad { running, waiting, observed_at_ms: NOW_MS }),
                model: MODEL.into(),
                ..SnapshotWorker::default()
            });
        }
        router.apply_snapshot(&snap);
        router.events_checked(NOW_MS);
        let loads = if loaded { load_view(&names) } else { LoadView::default() };
        let (hit, miss) = (body(hit_seed, Some(0)), body(miss_seed, None));
        Ok(Pool { router, loads, hit, miss })
    }

    /// The router's decision time (µs) of `iters` hits or misses, after a warm-up; with
    /// `evict`, the caches are evicted before each decision.
    fn time(
        &mut self,
        hit: bool,
        iters: usize,
        mut evict: Option<&mut [u8]>,
    ) -> Result<Vec<f64>, String> {
        let b = if hit { &self.hit } else { &self.miss };
        let parsed = request::parse(Endpoint::Completions, b).map_err(|e| e.to_string())?;
        let mut us = Vec::with_capacity(iters);
        for i in 0..iters + iters.min(20) {
            if let Some(buf) = evict.as_deref_mut() {
                crate::evict_caches(buf);
            }
            let t = Instant::now();
            let d = decide(&self.router, &parsed, b.len(), &self.loads, i as u64)?;
            if i >= iters.min(20) {
                us.push(t.elapsed().as_secs_f64() * 1e6);
            }
            // A hit goes where part of it is cached (the holder, or in a loaded pool maybe a
            // less busy holder of its system prompt); a miss is cached nowhere.
            if hit != (d > 0) {
                return Err(format!("predicted {d} cached tokens (hit: {hit})"));
            }
        }
        Ok(us)
    }
}

/// One decision, a frame of its own for CPU profiles: the tokens predicted cached on the
/// chosen worker.
#[inline(never)]
fn decide(
    router: &Router,
    parsed: &request::ParsedRequest,
    len: usize,
    loads: &LoadView,
    pick: u64,
) -> Result<u64, String> {
    let d = router
        .decide(parsed, len, loads, NOW_MS, pick)
        .map_err(|e| String::from_utf8_lossy(&e.body()).into_owned())?;
    std::hint::black_box(d.header_value());
    Ok(d.predicted_cached_tokens())
}

/// This thread's load view: one to five requests in flight on every other worker, the first
/// of each still in prefill.
fn load_view(workers: &[String]) -> LoadView {
    let (store, counters) = (MemStore::new(), Tally::default());
    let mut shard = Shard::register(&store, &counters, LoadLimits::default(), NOW_MS, 1);
    for (i, w) in workers.iter().enumerate().step_by(2) {
        for r in 0..1 + i % 5 {
            let t = shard.start(&counters, w, 2048, NOW_MS - 15);
            if r > 0 {
                shard.first_byte(t);
            }
        }
    }
    LoadView::read(&store, &counters, &shard, NOW_MS)
}
