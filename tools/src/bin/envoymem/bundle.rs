//! The model-bundle step: what Qwen3's bundle costs each Envoy worker thread.
//!
//! Two stacks on the shipped bootstrap with the real updater and the same Envoy concurrency:
//! one serves the demo model only, the other the demo model and Qwen3 (its bundle from the
//! updater, in the transfer form the updater chose). Each waits until every worker thread counts
//! itself bundled (`kvroute_threads_bundled`). Two figures per worker thread:
//!
//! - the VM's linear memory before and after it built Qwen3's bundle, from the filter's own
//!   log line (`built bundle <fingerprint> (<bytes> bytes) in <ms> ms; VM memory a -> b MiB`):
//!   the build's high-water mark, kept for good because a wasm VM's memory never shrinks;
//! - Envoy's RSS with Qwen3 minus without it, divided by the worker threads (the singleton's
//!   download buffers and the parts in shared data counted in).

use std::time::Duration;

use anyhow::Context;
use kvroute_stack::stack::{Pool, Stack, StackOptions};

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

/// Envoy's RSS (kB) once every worker thread has every bundle of `pools`, and its log.
async fn start(pools: Vec<Pool>, concurrency: u32) -> anyhow::Result<(u64, String)> {
    let opts =
        StackOptions { pools, updater: true, envoy_concurrency: concurrency, ..Default::default() };
    let stack = Stack::start(opts).await?;
    stack.envoy.wait_threads_ready(false, Duration::from_secs(120)).await?;
    let rss = stack.envoy.guard.rss_kb().context("reading Envoy's VmRSS")?;
    let log = std::fs::read_to_string(&stack.envoy.log)?;
    Ok((rss, log))
}

/// Measures and prints the step.
pub async fn measure(concurrency: u32) -> anyhow::Result<()> {
    let qwen3 = kvroute_core::decision::tokenize::model::qwen3()
        .context("Qwen3's bundle (./dev setup fetches it)")?;
    let fingerprint = qwen3.fingerprint();
    drop(qwen3);
    let (demo_kb, _) = start(vec![Pool::demo(1)], concurrency).await?;
    let (both_kb, log) = start(vec![Pool::demo(1), Pool::qwen3(1)], concurrency).await?;
    let b = builds(&log, fingerprint);
    anyhow::ensure!(
        b.len() >= concurrency as usize,
        "{} Qwen3 build lines in Envoy's log for {concurrency} worker threads",
        b.len()
    );
    let threads = f64::from(concurrency);
    println!("Qwen3's bundle ({fingerprint:016x}) in Envoy, --concurrency {concurrency}");
    for (i, x) in b.iter().enumerate() {
        println!(
            "  build {i}: {} bytes from shared data in {} ms; VM memory {} -> {} MiB (+{} MiB)",
            x.bytes,
            x.ms,
            x.vm_before_mib,
            x.vm_after_mib,
            x.vm_after_mib.saturating_sub(x.vm_before_mib)
        );
    }
    let worst = b.iter().map(|x| x.vm_after_mib.saturating_sub(x.vm_before_mib)).max();
    println!(
        "  per worker thread: VM growth at most {} MiB; Envoy VmRSS {:.1} MiB with Qwen3, {:.1} MiB without: {:+.1} MiB per thread",
        worst.unwrap_or(0),
        both_kb as f64 / 1024.0,
        demo_kb as f64 / 1024.0,
        (both_kb as f64 - demo_kb as f64) / 1024.0 / threads
    );
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
