//! Online calibration's cost per sample, natively: `ModelState::observe` (the robust
//! least-squares update and its box-constrained solve) and the state's encode + decode that
//! every shared-data write of a batch adds. A filter thread pays this on the response path of
//! every `calibration.flush_samples`-th routed request, for the whole batch.
//! Run: `cargo bench -p kvroute-core --bench calib`.

use kvroute_core::decision::calib::{CalibrationConfig, ModelState, Sample};
use kvroute_core::decision::cost::Profile;
use kvroute_core::decision::load::WorkerLoad;

#[path = "common/timing.rs"]
#[allow(dead_code)]
mod timing;

/// Deterministic samples from 8 workers: prefills of 100–8 000 tokens, half of them behind a
/// queue, first bytes from a pool a little slower than the prior with ±10 % noise.
fn samples(n: usize) -> Vec<Sample> {
    let mix = |x: u64| x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    (0..n as u64)
        .map(|i| {
            let r = mix(i + 1);
            let uncached = 100 + r % 7_900;
            let queued = if r >> 20 & 1 == 1 { 1 + (r >> 24) % 4_000 } else { 0 };
            let prefilling = u32::from(queued > 0);
            let observed = 8.0 + (uncached + queued) as f64 * 0.04;
            let noise = 0.9 + ((r >> 40) % 200) as f64 / 1000.0;
            Sample {
                worker: format!("10.0.0.{}:8000", r % 8),
                uncached_tokens: uncached,
                cached_tokens: (r >> 8) % 2_000,
                load: WorkerLoad {
                    inflight_requests: prefilling + ((r >> 32) % 6) as u32,
                    prefilling_requests: prefilling,
                    prefill_tokens: queued,
                    prefill_elapsed_ms: 0,
                    prefill_sq_tokens: queued * queued,
                    arriving_tokens_per_s: 0,
                    behind_tokens: 0,
                    passing_tokens_per_s: 0,
                },
                fixed_ms: 0.0,
                observed_ms: observed * noise,
                priority: 0,
                passed: false,
                fill_ms: 0.0,
                wait_factor: 1.0,
            }
        })
        .collect()
}

fn main() {
    let cfg = CalibrationConfig::default();
    let prior = Profile::default();
    let batch = cfg.flush_samples;
    let all = samples(timing::RUNS * batch + 2_000);
    // Warmed up: the state has seen 2 000 samples, as on a pool that has run a while.
    let mut state = ModelState::new(&prior);
    for s in &all[..2_000] {
        state.observe(&cfg, s);
    }
    let mut next = all[2_000..].chunks(batch);
    let observe = timing::time(|| {
        if let Some(chunk) = next.next() {
            for s in chunk {
                std::hint::black_box(state.observe(&cfg, s));
            }
        }
    });
    let codec = timing::time(|| {
        let bytes = state.encode();
        std::hint::black_box(ModelState::decode(&bytes).ok());
    });
    let per = |t: &[u64], p| timing::q(t, p) / batch as f64;
    println!(
        "calibration, {batch} samples per shared-data write: observe p50 {:.2} µs, p99 {:.2} µs per sample; state encode + decode p50 {:.2} µs per write",
        per(&observe, 0.5),
        per(&observe, 0.99),
        timing::q(&codec, 0.5)
    );
}
