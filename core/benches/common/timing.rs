//! Sampling and reporting for the benchmarks that compare a cold path with a cached one: the
//! cold path runs twice (before and after the cached one), and the ratio of its two medians is
//! the noise floor.

use std::time::Instant;

/// Samples per measurement.
pub const RUNS: usize = 200;

/// `RUNS` timings (ns) of `f`, sorted.
pub fn time(mut f: impl FnMut()) -> Vec<u64> {
    sample(|| {
        let t = Instant::now();
        f();
        t.elapsed().as_nanos() as u64
    })
}

/// `RUNS` values (ns) returned by `f`, which times what it wants itself, sorted.
pub fn sample(mut f: impl FnMut() -> u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..RUNS).map(|_| f()).collect();
    v.sort_unstable();
    v
}

/// The `p` quantile of sorted ns, in µs.
pub fn q(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize] as f64 / 1000.0
}

/// Prints p50/p99 of the two cold runs and the cached one, then cold / cached at p50 with the
/// noise floor.
pub fn report(cold: &str, cached: &str, cold_a: &[u64], cold_b: &[u64], warm: &[u64]) {
    let first = format!("{cold} (1st run)");
    let second = format!("{cold} (2nd run)");
    for (name, t) in [(first.as_str(), cold_a), (second.as_str(), cold_b), (cached, warm)] {
        println!("{name:>15}: p50 {:>8.1} µs, p99 {:>8.1} µs", q(t, 0.5), q(t, 0.99));
    }
    let floor = q(cold_a, 0.5) / q(cold_b, 0.5);
    println!(
        "{cold} / {cached} at p50: x{:.1} (noise floor: {cold} runs differ by x{:.2})",
        q(cold_a, 0.5).min(q(cold_b, 0.5)) / q(warm, 0.5),
        floor.max(1.0 / floor)
    );
}
