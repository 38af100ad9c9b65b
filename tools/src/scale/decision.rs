//! Decision time, native: what the filter does for each request between the body's arrival
//! and the destination header, minus the host calls — parse the body
//! (`request::parse`), decide (`Router::decide`: prefix lookups on every worker of the pool,
//! scoring, the look-ahead), and write the header value. The filter's journal catch-up is left
//! out: it is bounded per request and does not depend on the fleet.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::Context;
use kvroute_core::decision::config::sync::LoadLimits;
use kvroute_core::decision::request::{self, Endpoint};
use kvroute_core::decision::router::Router;
use kvroute_core::shared::fake::{MemStore, Tally};
use kvroute_core::shared::load::{LoadView, Shard};
use kvroute_updater::state::now_ms;

use crate::fleet::mix;

/// Quantiles of one prompt's decisions at one point, and what they decided.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    pub p50_us: f64,
    pub p99_us: f64,
    /// p50 of the core's decision alone (`Router::decide` and the header value, the body
    /// already parsed): what grows with the pool.
    pub decide_p50_us: f64,
    pub samples: usize,
    /// Tokens the chosen worker was predicted to hold.
    pub cached_tokens: u64,
}

/// Router-tracked load as the filter reads it: its own load view, read from a thread's load
/// shard in shared data (an in-memory store here), with a few requests in flight on each
/// worker, some still in prefill.
pub fn loads(workers: &[String]) -> LoadView {
    let (store, counters) = (MemStore::new(), Tally::default());
    let now = now_ms();
    let mut shard = Shard::register(&store, &counters, LoadLimits::default(), now, 1);
    for (i, w) in workers.iter().enumerate() {
        let inflight = (mix(i as u64 ^ 0x10AD) % 6) as u32;
        let prefilling = inflight.min((mix(i as u64 ^ 0x9F) % 2) as u32);
        for r in 0..inflight {
            let started = now.saturating_sub(15);
            let t = shard.start(&counters, w, 2048, started);
            if r >= prefilling {
                shard.first_byte(t);
            }
        }
    }
    LoadView::read(&store, &counters, &shard, now)
}

/// One decision as the filter makes it: its time, the time after the body was parsed, and
/// the tokens it predicted cached.
fn one(
    router: &Router,
    loads: &LoadView,
    body: &[u8],
    now: u64,
    pick: u64,
) -> anyhow::Result<(Duration, Duration, u64)> {
    let t = Instant::now();
    let parsed = request::parse(Endpoint::Completions, body)?;
    let parsed_at = Instant::now();
    let d = router
        .decide(&parsed, body.len(), loads, now, pick)
        .map_err(|e| anyhow::anyhow!("decide: {}", String::from_utf8_lossy(&e.body())))?;
    black_box(d.header_value());
    Ok((t.elapsed(), parsed_at.elapsed(), d.predicted_cached_tokens()))
}

/// Times `iters` decisions on `body` (after a warm-up), stopping early after `budget`. The
/// updater's confirmation is renewed every 64 decisions, as the filter's long poll renews it
/// (event knowledge older than its trusted age would be credited less, then not at all).
pub fn time(
    router: &mut Router,
    loads: &LoadView,
    body: &[u8],
    iters: usize,
    budget: Duration,
) -> anyhow::Result<Timed> {
    let mut now = now_ms();
    router.events_checked(now);
    let mut cached = 0;
    for i in 0..iters.min(50) {
        cached = one(router, loads, body, now, mix(i as u64))?.2;
    }
    let started = Instant::now();
    let (mut us, mut decide_us) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    for i in 0..iters {
        if i % 64 == 63 {
            now = now_ms();
            router.events_checked(now);
        }
        let (all, decide, _) = one(router, loads, body, now, mix(i as u64 ^ 0xD1CE))?;
        us.push(all.as_secs_f64() * 1e6);
        decide_us.push(decide.as_secs_f64() * 1e6);
        if started.elapsed() > budget && us.len() >= 20 {
            break;
        }
    }
    let q = |v: &[f64], p| kvroute_stack::quantile(v, p).context("no samples");
    Ok(Timed {
        p50_us: q(&us, 0.5)?,
        p99_us: q(&us, 0.99)?,
        decide_p50_us: q(&decide_us, 0.5)?,
        samples: us.len(),
        cached_tokens: cached,
    })
}
