//! Knowledge index at scale, natively: memory for 64 workers x 16 384 event blocks, and the
//! decision time (hash lookups + cost model + ranking, no tokenization) for an 8k-token prompt,
//! a full snapshot against a delta that changes 1 % of every worker's blocks, and a journal
//! entry's routing credit applied to a full worker (what a filter thread's catch-up does per
//! entry).
//! Run: `cargo bench -p kvroute-core --bench knowledge`.

use std::sync::atomic::Ordering;
use std::time::Instant;

use kvroute_core::decision::config::FilterConfig;
use kvroute_core::decision::hash::block_hashes;
use kvroute_core::decision::load::WorkerLoad;
use kvroute_core::decision::router::Router;
use kvroute_core::wire::delta::Delta;
use kvroute_core::wire::snapshot::{Snapshot, SnapshotWorker};

#[path = "common/alloc.rs"]
mod alloc;
use alloc::{Counting, LIVE};

#[global_allocator]
static A: Counting = Counting;

const WORKERS: usize = 64;
const BLOCKS: usize = 16_384;

fn main() {
    let workers: Vec<String> =
        (0..WORKERS).map(|i| format!("10.0.{}.{}:8000", i / 200, i % 200 + 1)).collect();
    let cfg = FilterConfig::from_json(
        serde_json::json!({"models": [{"name": "kvroute-demo", "workers": workers}]})
            .to_string()
            .as_bytes(),
    )
    .expect("config");
    let mut router = Router::new(&cfg).expect("router");
    // An 8k-token prompt whose first 6k tokens are cached on worker 0 and 2k on workers 1..4.
    let prompt: Vec<u32> = (0..8192).map(|i| (i * 7 % 2000) as u32).collect();
    let seed = router
        .domain(
            &kvroute_core::decision::request::parse(
                kvroute_core::decision::request::Endpoint::Completions,
                br#"{"model":"kvroute-demo","prompt":[1]}"#,
            )
            .expect("req"),
        )
        .expect("domain")
        .seed();
    let hashes = block_hashes(seed, 16, &prompt);
    let before = LIVE.load(Ordering::Relaxed);
    let make = || Snapshot {
        version: 1,
        generated_at_ms: 0,
        workers: workers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let mut gpu: Vec<u64> = (0..BLOCKS as u64)
                    .map(|b| b.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64)
                    .collect();
                let shared = match i {
                    0 => 384,
                    1..=4 => 128,
                    _ => 0,
                };
                gpu[..shared].copy_from_slice(&hashes[..shared]);
                SnapshotWorker {
                    worker: w.clone(),
                    observed_at_ms: 0,
                    compatible: true,
                    gpu,
                    offloaded: vec![],
                    load: None,
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    };
    let snap = make();
    let encoded = snap.encode();
    let t = Instant::now();
    router.apply_snapshot(&snap);
    let apply = t.elapsed();
    drop(snap);
    router.events_checked(0);
    let index_bytes = LIVE.load(Ordering::Relaxed) - before;
    let req = kvroute_core::decision::request::parse(
        kvroute_core::decision::request::Endpoint::Completions,
        serde_json::json!({"model": "kvroute-demo", "prompt": prompt}).to_string().as_bytes(),
    )
    .expect("req");
    let idle = |_: &str| WorkerLoad::default();
    let mut times = Vec::new();
    for i in 0..2000u64 {
        let t = Instant::now();
        let d = router.decide(&req, 0, &idle, 1, i).expect("decide");
        times.push(t.elapsed().as_nanos() as u64);
        assert_eq!(d.predicted_cached_tokens(), 384 * 16);
    }
    times.sort_unstable();
    let q = |p: f64| times[((times.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    println!(
        "knowledge index: {WORKERS} workers x {BLOCKS} blocks = {:.1} MiB of heap ({:.1} bytes/block); snapshot {:.1} MiB, applied in {:.1} ms",
        index_bytes as f64 / 1048576.0,
        index_bytes as f64 / (WORKERS * BLOCKS) as f64,
        encoded.len() as f64 / 1048576.0,
        apply.as_secs_f64() * 1000.0
    );
    println!(
        "decision for an 8192-token prompt given as token ids (hash 512 blocks, look up 64 workers, rank): p50 {:.1} µs, p99 {:.1} µs",
        q(0.5),
        q(0.99)
    );
    // The next version: 1 % of every worker's blocks evicted and as many new ones stored.
    let mut sorted = make();
    for w in &mut sorted.workers {
        w.gpu.sort_unstable();
    }
    let mut next = sorted.clone();
    next.version = 2;
    let churn = BLOCKS / 100;
    for (i, w) in next.workers.iter_mut().enumerate() {
        w.gpu.drain(BLOCKS - churn..);
        w.gpu.extend(
            (0..churn as u64).map(|b| (b + 1_000_000).wrapping_mul(0x51_7CC1_B727_220B) ^ i as u64),
        );
        w.gpu.sort_unstable();
    }
    let delta = Delta::between(&sorted, &next).encode();
    let t = Instant::now();
    let decoded = Delta::decode(&delta).expect("delta");
    router.apply_delta(&decoded);
    let apply_delta = t.elapsed();
    let full = next.encode();
    let t = Instant::now();
    router.apply_snapshot(&Snapshot::decode(&full).expect("snapshot"));
    let apply_full = t.elapsed();
    println!(
        "next version with 1 % of blocks changed on every worker: delta {:.0} KiB decoded + applied in {:.2} ms, full snapshot {:.1} MiB decoded + applied in {:.1} ms (x{:.0} the bytes, x{:.0} the time)",
        delta.len() as f64 / 1024.0,
        apply_delta.as_secs_f64() * 1000.0,
        full.len() as f64 / 1048576.0,
        apply_full.as_secs_f64() * 1000.0,
        full.len() as f64 / delta.len() as f64,
        apply_full.as_secs_f64() / apply_delta.as_secs_f64().max(1e-9)
    );
    // Heap for routed blocks: one worker filled to its bound by routing credits.
    let before = LIVE.load(Ordering::Relaxed);
    let full: Vec<u64> =
        (0..65_536u64).map(|b| (b + (1 << 50)).wrapping_mul(0x2545_F491_4F6C_DD1D)).collect();
    for chunk in full.chunks(512) {
        router.observe(&workers[6], chunk, kvroute_core::wire::journal::Source::Routed, 1);
    }
    let routed_bytes = LIVE.load(Ordering::Relaxed) - before;
    let (cold, warm) = journal_apply(&mut router, &workers[5], 512, 64);
    println!(
        "journal catch-up, one routing credit of 512 blocks on a full worker (65 536 routed blocks, {:.1} bytes/block of heap): p50 {cold:.1} µs all new, {warm:.1} µs with 448 repeated",
        routed_bytes as f64 / full.len() as f64
    );
}

/// Journal catch-up: the time to apply one routing credit of `n` block hashes to one worker,
/// when the hashes are all new (a cold prompt) and when all but the last `fresh` repeat the
/// previous credit (the next turn of a conversation). The worker starts full (at its bound).
fn journal_apply(router: &mut Router, worker: &str, n: usize, fresh: usize) -> (f64, f64) {
    use kvroute_core::wire::journal::{JournalEntry, Source};
    let entry = |seq: u64, hashes: Vec<u64>| JournalEntry {
        seq,
        at_ms: 1 + seq,
        source: Source::Routed,
        worker: worker.to_owned(),
        hashes,
        retract: false,
    };
    let mut next = 1u64 << 40;
    let mut new_hashes = |k: usize| -> Vec<u64> {
        (0..k)
            .map(|_| {
                next += 1;
                next.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            })
            .collect()
    };
    for s in 0..(65_536 / n + 1) as u64 {
        router.apply_journal(&entry(s, new_hashes(n)));
    }
    let mut cold = Vec::new();
    for s in 0..500u64 {
        let e = entry(1000 + s, new_hashes(n));
        let t = Instant::now();
        router.apply_journal(&e);
        cold.push(t.elapsed().as_nanos() as u64);
    }
    let mut warm = Vec::new();
    let prefix = new_hashes(n - fresh);
    for s in 0..500u64 {
        let mut h = prefix.clone();
        h.extend(new_hashes(fresh));
        let e = entry(2000 + s, h);
        let t = Instant::now();
        router.apply_journal(&e);
        warm.push(t.elapsed().as_nanos() as u64);
    }
    let p50 = |v: &mut Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2] as f64 / 1000.0
    };
    (p50(&mut cold), p50(&mut warm))
}
