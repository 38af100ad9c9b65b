//! Decision time inside Envoy against the pool's size: the filter in a real Envoy (2 worker
//! threads) in front of a [`SimPool`] (simulated workers in one process, the real updater
//! following their KV events over ZMQ, its snapshots long-polled by the filter's singleton).
//!
//! Each worker is filled straight (not through Envoy) with `fill` prompts of
//! [`fleet::PROMPT_TOKENS`] tokens, and the middle worker with the hit prompt (of the length
//! asked, 4 096 tokens by default), so the filter
//! knows them from the engines' events, as in production. Then, through Envoy, one client
//! connection sends the hit prompt (one worker holds it) and fresh prompts (nobody holds them),
//! as token ids (no tokenization). Each answer's `x-kvroute-decision` gives the filter's own
//! timing (Envoy's clock): `decision_us` minus `parse_us` (the body) and `catchup_us` (the
//! journal and the updater's knowledge) is the decision proper, which the native curve times;
//! `decision_us` itself is the whole decision (the `whole` columns).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use kvroute_stack::client::{self, Reply};
use kvroute_stack::envoy::Envoy;
use kvroute_stack::paths;
use kvroute_stack::stack::{write_config, StackPorts, MODEL};
use serde_json::json;

use crate::fleet;
use crate::pin::Pinning;
use crate::updater::{self, SimPool};

/// Envoy worker threads.
const THREADS: u32 = 2;

/// The columns of one point, after `workers`.
pub const COLUMNS: &[&str] = &[
    "hit_p50_us",
    "hit_p99_us",
    "miss_p50_us",
    "miss_p99_us",
    "hit_catchup_p50_us",
    "miss_catchup_p50_us",
    "parse_p50_us",
    "hit_cached_tokens",
    "miss_cached_tokens",
    "samples",
    "idle_main_cores",
    "idle_worker_cores",
    "idle_deltas_per_s",
    "idle_full_reads_per_s",
    "hit_whole_p50_us",
    "hit_whole_p99_us",
    "miss_whole_p50_us",
    "miss_whole_p99_us",
];

/// CPU seconds of Envoy's main thread (the filter's singleton follows the updater there) and
/// of all its other threads (the worker threads, where the filter's threads decide).
fn thread_cpu(pid: u32) -> (f64, f64) {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    let (mut main, mut rest) = (0.0, 0.0);
    for t in tasks {
        let tid = t.file_name().to_string_lossy().into_owned();
        let s = updater::stat_cpu_seconds(&format!("/proc/{pid}/task/{tid}/stat"));
        match tid == pid.to_string() {
            true => main += s,
            false => rest += s,
        }
    }
    (main, rest)
}

/// Envoy's upkeep with no requests for `idle`: cores of its main thread and of the others,
/// deltas the singleton took in and full snapshots the filter threads read, per second.
async fn idle_upkeep(envoy: &Envoy, idle: Duration) -> anyhow::Result<[f64; 4]> {
    let pid = envoy.guard.pid().context("envoy exited")?;
    let counts = || async {
        let m = envoy.prometheus().await?;
        let get = |k: &str| m.get(k).copied().unwrap_or(0.0);
        anyhow::Ok((
            get("kvroute_sync_deltas"),
            get("kvroute_knowledge_updates{kvroute_kind=\"full\"}"),
        ))
    };
    let ((d0, f0), (m0, w0), t0) = (counts().await?, thread_cpu(pid), Instant::now());
    tokio::time::sleep(idle).await;
    let ((d1, f1), (m1, w1)) = (counts().await?, thread_cpu(pid));
    let s = t0.elapsed().as_secs_f64();
    Ok([(m1 - m0) / s, (w1 - w0) / s, (d1 - d0) / s, (f1 - f0) / s])
}

/// One decision as its header tells it (µs, tokens).
struct Timed {
    /// `decision_us` without the body parse and the catch-up.
    proper: f64,
    /// `decision_us` whole (no tokenization: the prompt is token ids).
    whole: f64,
    catchup: f64,
    /// The journal's part of `catchup` (the rest is the updater's knowledge).
    journal: f64,
    parse: f64,
    /// The router's decision alone (lookups, scoring, the look-ahead), inside `proper`.
    decide: f64,
    cached_tokens: f64,
    /// The client's round trip (µs): the worker's answer, Envoy, and any wait of the request
    /// on its Envoy thread outside the filter's callbacks, which `decision_us` does not see.
    client: f64,
    /// The load shard of the Envoy thread that decided (the header's `thread`).
    thread: String,
}

/// Sends `body` and reads its timing, with the client's round trip.
async fn timed(conn: &reqwest::Client, url: &str, body: Vec<u8>) -> anyhow::Result<Timed> {
    let sent = Instant::now();
    let r = client::send(conn, url, "/v1/completions", body, &[]).await?;
    let client = sent.elapsed().as_secs_f64() * 1e6;
    Ok(Timed { client, ..timing(&r)? })
}

fn timing(r: &Reply) -> anyhow::Result<Timed> {
    anyhow::ensure!(r.status == 200, "request failed: {} {}", r.status, r.body);
    let field = |k: &str| -> anyhow::Result<f64> {
        r.decision_field(k)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {k} in x-kvroute-decision {:?}", r.decision))
    };
    let (d, p, c) = (field("decision_us")?, field("parse_us")?, field("catchup_us")?);
    // Filters before the field was added give none.
    let journal = field("journal_us").unwrap_or(f64::NAN);
    let decide = field("decide_us").unwrap_or(f64::NAN);
    let cached_tokens = field("predicted_cached_tokens")?;
    Ok(Timed {
        proper: (d - p - c).max(0.0),
        whole: d,
        catchup: c,
        journal,
        parse: p,
        decide,
        cached_tokens,
        client: f64::NAN,
        thread: r.decision_field("thread").unwrap_or_default().to_string(),
    })
}

fn p(v: &[f64], q: f64) -> anyhow::Result<f64> {
    kvroute_stack::quantile(v, q).context("no samples")
}

/// The header of [`point`]'s per-decision lines.
pub const SAMPLE_COLUMNS: &str =
    "workers,kind,seq,decision_us,parse_us,catchup_us,journal_us,proper_us,decide_us,client_us,thread";

/// Measures one point: `iters` hits and `iters` misses of `tokens` tokens through Envoy in
/// front of `pool`, then Envoy's upkeep during `idle` without requests; with `pinning`, Envoy
/// runs on its own CPU; `budget_us` sets the filter's `knowledge.catch_up_budget_us`. Each
/// decision's timing goes to `samples` as a CSV line ([`SAMPLE_COLUMNS`]).
pub async fn point(
    pool: &SimPool,
    dir: &Path,
    fill: usize,
    (iters, idle, tokens, budget_us): (usize, Duration, usize, Option<u64>),
    pinning: Option<&Pinning>,
    samples: &mut Vec<String>,
) -> anyhow::Result<Vec<f64>> {
    let http = reqwest::Client::new();
    let n = pool.addrs.len();
    // Fill every worker straight, a few at a time.
    let mut sent = Vec::new();
    for (i, addr) in pool.addrs.iter().enumerate() {
        for k in 0..fill {
            let body = fleet::body(&fleet::fill_prompt((i * fill + k) as u64));
            let (http, url) = (http.clone(), format!("http://{addr}"));
            sent.push(tokio::spawn(async move {
                client::send(&http, &url, "/v1/completions", body, &[]).await
            }));
            if sent.len() >= 16 {
                for h in sent.drain(..) {
                    h.await??;
                }
            }
        }
    }
    for h in sent.drain(..) {
        h.await??;
    }
    let hit = fleet::body(&fleet::prompt_of(true, tokens));
    let holder = format!("http://{}", pool.addrs[n / 2]);
    client::send(&http, &holder, "/v1/completions", hit.clone(), &[]).await?;

    let mut filter = json!({"models": [{"name": MODEL, "workers": pool.addrs}],
                            "expose_decision_header": true});
    if let Some(us) = budget_us {
        filter["knowledge"] = json!({"catch_up_budget_us": us});
    }
    // Ports picked free can be taken by then (a thousand workers' connections use ephemeral
    // ports): Envoy starts again on others.
    let first = (paths::free_port()?, paths::free_port()?);
    let envoy = Envoy::start_retrying_ports(first, dir, THREADS, |admin, listen| {
        let ports = StackPorts { admin, listen, updater: pool.port };
        write_config("kvroute.yaml", dir, ports, &pool.addrs, &filter)
    })
    .await?;
    if let Some(p) = pinning {
        let pid = envoy.guard.pid().context("envoy exited before it was pinned")?;
        if p.apply_envoy(pid)? == 0 {
            eprintln!("--pin-envoy: no Envoy thread named as a worker; all of Envoy pinned");
        }
    }
    envoy.wait_healthy(n).await?;
    let url = envoy.base_url();
    // One connection, so that one Envoy thread decides every request, as a conversation's
    // would: HTTP/2 sends each request on it (an HTTP/1.1 pool opens a second connection now
    // and then, while the first is being handed back to it).
    let conn = reqwest::Client::builder().http2_prior_knowledge().build()?;
    let ask = |body: Vec<u8>| client::send(&conn, &url, "/v1/completions", body, &[]);
    // Until the filter holds the updater's knowledge of the hit prompt (its snapshot
    // carries every worker's events).
    let mut known = false;
    for _ in 0..300 {
        if timing(&ask(hit.clone()).await?)?.cached_tokens >= (tokens / 2) as f64 {
            known = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::ensure!(known, "the filter never learned the hit prompt's holder ({n} workers)");
    let (mut hits, mut misses) = (Vec::new(), Vec::new());
    for i in 0..iters {
        hits.push(timed(&conn, &url, hit.clone()).await?);
        let fresh = fleet::body(&fleet::fresh_prompt(0x3155_0000_0000 + i as u64, tokens));
        misses.push(timed(&conn, &url, fresh).await?);
    }
    for (kind, timed) in [("hit", &hits), ("miss", &misses)] {
        for (seq, t) in timed.iter().enumerate() {
            let (w, p, c, j, d) = (t.whole, t.parse, t.catchup, t.journal, t.proper);
            let (decide, client, thread) = (t.decide, t.client.round(), &t.thread);
            samples
                .push(format!("{n},{kind},{seq},{w},{p},{c},{j},{d},{decide},{client},{thread}"));
        }
    }
    let upkeep = idle_upkeep(&envoy, idle).await?;
    drop(envoy);
    let col = |v: &[Timed], f: fn(&Timed) -> f64| -> Vec<f64> { v.iter().map(f).collect() };
    let (hd, md) = (col(&hits, |t| t.proper), col(&misses, |t| t.proper));
    let parse: Vec<f64> = hits.iter().chain(&misses).map(|t| t.parse).collect();
    Ok(vec![
        p(&hd, 0.5)?,
        p(&hd, 0.99)?,
        p(&md, 0.5)?,
        p(&md, 0.99)?,
        p(&col(&hits, |t| t.catchup), 0.5)?,
        p(&col(&misses, |t| t.catchup), 0.5)?,
        p(&parse, 0.5)?,
        p(&col(&hits, |t| t.cached_tokens), 0.5)?,
        p(&col(&misses, |t| t.cached_tokens), 0.5)?,
        iters as f64,
        upkeep[0],
        upkeep[1],
        upkeep[2],
        upkeep[3],
        p(&col(&hits, |t| t.whole), 0.5)?,
        p(&col(&hits, |t| t.whole), 0.99)?,
        p(&col(&misses, |t| t.whole), 0.5)?,
        p(&col(&misses, |t| t.whole), 0.99)?,
    ])
}
