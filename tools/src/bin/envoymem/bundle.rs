//! The model-bundle step: what Qwen3's bundle costs each Envoy worker thread.
//!
//! For each Envoy concurrency asked for, three stacks on the shipped bootstraps: Envoy without
//! the filter (least-request), with the filter and the demo model, and with the demo model and
//! Qwen3 (both bundles from the real updater, in the transfer form it chose). Each filter stack
//! waits until every worker thread counts itself bundled (`kvroute_threads_bundled`). Two
//! figures per worker thread:
//!
//! - the VM's linear memory before and after it built Qwen3's bundle, from the filter's own
//!   log line (`built bundle <fingerprint> (<bytes> bytes) in <ms> ms; VM memory a -> b MiB`):
//!   the build's high-water mark, kept for good because a wasm VM's memory never shrinks;
//! - Envoy's RSS with Qwen3 minus without it, divided by the worker threads (the singleton's
//!   download buffers and the parts in shared data counted in).
//!
//! With `--out DIR`, the points go to `DIR/envoy_rss_vs_threads.{csv,svg}`.

use std::time::Duration;

use std::path::Path;

use anyhow::Context;
use kvroute_stack::stack::{Pool, RoutePolicy, Stack, StackOptions};

#[path = "../../scale/out.rs"]
mod out;
use out::Curve;

/// One `built bundle` line of the filter.
struct Build {
    bytes: u64,
    ms: u64,
    vm_before_mib: u64,
    vm_after_mib: u64,
}

/// The build lines in Envoy's log for the bundle `fingerprint`.
fn builds(log: &str, fingerprint: u64) -> Vec<Build> {
    let tag = format!("built bundle {fingerprint:016x} (");
    log.lines()
        .filter_map(|l| {
            let rest = &l[l.find(&tag)? + tag.len()..];
            let (bytes, rest) = rest.split_once(" bytes) in ")?;
            let (ms, rest) = rest.split_once(" ms; VM memory ")?;
            let (before, rest) = rest.split_once(" -> ")?;
            let after = rest.split_whitespace().next()?;
            Some(Build {
                bytes: bytes.parse().ok()?,
                ms: ms.parse().ok()?,
                vm_before_mib: before.parse().ok()?,
                vm_after_mib: after.parse().ok()?,
            })
        })
        .collect()
}

/// Envoy's RSS (kB) once every worker thread has every bundle of `pools` (`None`: Envoy
/// without the filter), and its log.
async fn start(pools: Option<Vec<Pool>>, concurrency: u32) -> anyhow::Result<(u64, String)> {
    let opts = StackOptions {
        policy: if pools.is_some() { RoutePolicy::Kvroute } else { RoutePolicy::LeastRequest },
        pools: pools.clone().unwrap_or_default(),
        workers: 1,
        updater: pools.is_some(),
        envoy_concurrency: concurrency,
        ..Default::default()
    };
    let stack = Stack::start(opts).await?;
    if pools.is_some() {
        stack.envoy.wait_threads_ready(false, Duration::from_secs(180)).await?;
    }
    let rss = stack.envoy.guard.rss_kb().context("reading Envoy's VmRSS")?;
    let log = std::fs::read_to_string(&stack.envoy.log)?;
    Ok((rss, log))
}

/// One point of the curve: Envoy with `threads` worker threads.
async fn point(threads: u32, fingerprint: u64) -> anyhow::Result<Vec<f64>> {
    let (bare_kb, _) = start(None, threads).await?;
    let (demo_kb, _) = start(Some(vec![Pool::demo(1)]), threads).await?;
    let (both_kb, log) = start(Some(vec![Pool::demo(1), Pool::qwen3(1)]), threads).await?;
    let b = builds(&log, fingerprint);
    anyhow::ensure!(
        b.len() >= threads as usize,
        "{} Qwen3 build lines in Envoy's log for {threads} worker threads",
        b.len()
    );
    println!("  --concurrency {threads}:");
    for (i, x) in b.iter().enumerate() {
        println!(
            "    build {i}: {} bytes from shared data in {} ms; VM memory {} -> {} MiB (+{} MiB)",
            x.bytes,
            x.ms,
            x.vm_before_mib,
            x.vm_after_mib,
            x.vm_after_mib.saturating_sub(x.vm_before_mib)
        );
    }
    let growth = b.iter().map(|x| x.vm_after_mib.saturating_sub(x.vm_before_mib)).max();
    let mib = |kb: u64| kb as f64 / 1024.0;
    let per_thread = (mib(both_kb) - mib(demo_kb)) / f64::from(threads);
    println!(
        "    Envoy VmRSS {:.1} MiB without the filter, {:.1} MiB with it (demo model), {:.1} MiB with demo + Qwen3: \
         Qwen3 {per_thread:+.1} MiB per thread (VM growth at most {} MiB)",
        mib(bare_kb),
        mib(demo_kb),
        mib(both_kb),
        growth.unwrap_or(0)
    );
    Ok(vec![
        f64::from(threads),
        mib(bare_kb),
        mib(demo_kb),
        mib(both_kb),
        per_thread,
        growth.unwrap_or(0) as f64,
    ])
}

/// Measures and prints the step for each of `threads`; the curve goes to `out` when given.
pub async fn measure(threads: &[u32], out: Option<&Path>) -> anyhow::Result<()> {
    let qwen3 = kvroute_core::decision::tokenize::model::qwen3()
        .context("Qwen3's bundle (./dev setup fetches it)")?;
    let fingerprint = qwen3.fingerprint();
    drop(qwen3);
    println!("Qwen3's bundle ({fingerprint:016x}) in Envoy");
    let mut curve = Curve::new(
        "envoy_rss_vs_threads",
        "Envoy RSS vs worker threads and models".into(),
        &[
            "threads",
            "no_filter_mib",
            "demo_mib",
            "demo_qwen3_mib",
            "qwen3_rss_per_thread_mib",
            "qwen3_vm_growth_per_thread_mib",
        ],
    )
    .plotting(&["no_filter_mib", "demo_mib", "demo_qwen3_mib"], "Envoy VmRSS, MiB");
    for &t in threads {
        curve.push(point(t, fingerprint).await?);
    }
    if let Some(dir) = out {
        std::fs::create_dir_all(dir)?;
        curve.write(dir)?;
        println!("  curve: {}", dir.join("envoy_rss_vs_threads.csv").display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::builds;

    #[test]
    fn build_lines_are_read_for_their_fingerprint_only() {
        let log = "[info][wasm] wasm log kvroute kvroute: kvroute: built bundle 9afb354e220e2f7b \
                   (2434053 bytes) in 33 ms; VM memory 2 -> 11 MiB\n\
                   [info][wasm] kvroute: built bundle e9cdd676c283da62 (25693 bytes) in 4 ms; VM memory 1 -> 2 MiB\n\
                   [info] kvroute: built bundle 9afb354e220e2f7b (garbled";
        let b = builds(log, 0x9afb_354e_220e_2f7b);
        assert_eq!(b.len(), 1);
        assert_eq!(
            (b[0].bytes, b[0].ms, b[0].vm_before_mib, b[0].vm_after_mib),
            (2434053, 33, 2, 11)
        );
    }
}
