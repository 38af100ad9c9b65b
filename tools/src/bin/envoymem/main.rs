//! kvroute-envoymem: the filter's memory inside real Envoy with a 64 workers x 16 384 blocks
//! knowledge index, delivered over the real snapshot protocol.
//!
//! Envoy runs the shipped `envoy/kvroute.yaml` (filter on every worker thread + the snapshot
//! singleton on the main thread). Its pool has 64 workers: one real `kvroute-sim`, the others
//! unused loopback ports (requests only serve to make each Envoy thread catch up with the
//! knowledge; the sim is credited with the probe prompt's blocks so that decisions pick it).
//!
//! The knowledge comes from a fixture in this process that answers `/v1/snapshot` on the
//! updater's port the way `kvroute-updater` does (token header, `since` -> 304 when current,
//! a delta when it has one from `since`, else the full snapshot), with synthetic snapshots of
//! random sorted hashes. The fixture only exists to feed this measurement: it is not an
//! updater and is not used anywhere else.
//!
//! Steps: Envoy's RSS with an empty snapshot applied by every thread (before); the big snapshot
//! fetched by the singleton, no request sent yet (singleton side; a worker thread also applies
//! a new snapshot on its own tick, and the output says when one did before this reading); the big snapshot applied by every worker thread (after); then one small
//! delta, followed by every thread through the delta chain.
//!
//! How the growth divides: the singleton side is measured on its own (its VM's decoded copy,
//! the encoded copy in Envoy's shared data, buffers of the fetch); the rest, divided by the
//! number of worker threads, is the per-thread figure (each thread runs its own wasm VM with
//! its own index). A VM's linear memory never shrinks, so a VM's figure is its high-water
//! mark: the bytes read from shared data, the decoded snapshot and the index, as far as they
//! were alive at once. RSS is the whole process's, so it carries some noise (allocator caches,
//! code tier-up); the `/memory` heap line shows what grew outside the VMs.
//!
//! Then, unless `--no-bundle`, what Qwen3's model bundle costs each worker thread
//! (`bundle.rs`: the real updater serves it; VM memory from the filter's build log lines).
//! Run: `target/release/kvroute-envoymem` (after `./dev build`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use kvroute_core::decision::config::FilterConfig;
use kvroute_core::decision::load::WorkerLoad;
use kvroute_core::decision::request::{self, Endpoint};
use kvroute_core::decision::router::Router;
use kvroute_core::wire::delta::Delta;
use kvroute_core::wire::snapshot::{ModelInfo, Snapshot, SnapshotWorker};
use kvroute_stack::envoy::Envoy;
use kvroute_stack::sim::SimWorker;
use kvroute_stack::stack::{self, StackOptions, StackPorts, MODEL, UPDATER_TOKEN};
use kvroute_stack::{client, eventually, paths};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser, Debug)]
#[command(about = "Memory of the kvroute filter in Envoy with a large knowledge index")]
struct Args {
    /// Workers in Envoy's pool and in the snapshot: one real simulated worker, the others
    /// unused loopback ports.
    #[arg(long, default_value_t = 64)]
    workers: usize,
    /// Known blocks per worker in the big snapshot.
    #[arg(long, default_value_t = 16_384)]
    blocks: usize,
    /// Envoy worker threads.
    #[arg(long, default_value_t = 2)]
    concurrency: u32,
    /// Seed of the probe prompt and of the snapshots' random block hashes.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Skip the Qwen3 bundle step.
    #[arg(long)]
    no_bundle: bool,
    /// Envoy worker threads of the bundle step's points (Envoy RSS vs threads x models).
    #[arg(long, value_delimiter = ',', default_value = "2")]
    bundle_threads: Vec<u32>,
    /// Where the bundle step writes its curve (CSV + SVG); none: printed only.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

mod bundle;

const MIB: f64 = 1024.0 * 1024.0;

/// What the fixture serves: the current full snapshot and at most one delta into it.
struct Feed {
    version: u64,
    full: Arc<Vec<u8>>,
    /// `(from_version, encoded delta to version)`.
    delta: Option<(u64, Arc<Vec<u8>>)>,
    served: HashMap<&'static str, u64>,
}

type Shared = Arc<Mutex<Feed>>;

fn lock(feed: &Shared) -> std::sync::MutexGuard<'_, Feed> {
    feed.lock().unwrap_or_else(|e| e.into_inner())
}

/// A response: status line, extra headers, body.
type Response = (&'static str, Vec<(String, String)>, Arc<Vec<u8>>);

/// The response to one request head.
fn answer(head: &str, feed: &Shared) -> Response {
    let empty = Arc::new(Vec::new());
    let mut lines = head.split("\r\n");
    let target = lines.next().and_then(|l| l.split_whitespace().nth(1)).unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if path != "/v1/snapshot" {
        return ("404 Not Found", vec![], empty);
    }
    let token = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("x-kvroute-token"))
        .map(|(_, v)| v.trim());
    if token != Some(UPDATER_TOKEN) {
        return (
            "401 Unauthorized",
            vec![],
            Arc::new(b"missing or wrong x-kvroute-token\n".to_vec()),
        );
    }
    let since = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("since="))
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|v| *v > 0);
    let mut f = lock(feed);
    if since == Some(f.version) {
        *f.served.entry("304").or_default() += 1;
        return ("304 Not Modified", vec![], empty);
    }
    let version = f.version;
    let (kind, body) = match &f.delta {
        Some((from, d)) if since == Some(*from) => ("delta", Arc::clone(d)),
        _ => ("full", Arc::clone(&f.full)),
    };
    *f.served.entry(kind).or_default() += 1;
    let headers = vec![
        ("content-type".into(), "application/octet-stream".into()),
        ("x-kvroute-snapshot-version".into(), version.to_string()),
        ("x-kvroute-snapshot-kind".into(), kind.into()),
    ];
    ("200 OK", headers, body)
}

/// One HTTP/1.1 connection from Envoy's singleton (keep-alive; GET requests without bodies).
async fn serve_conn(mut sock: TcpStream, feed: Shared) -> anyhow::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            if buf.len() > 64 * 1024 {
                bail!("request head over 64 KiB");
            }
            let n = sock.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end);
        let (status, headers, body) = answer(&head, &feed);
        let mut out = format!("HTTP/1.1 {status}\r\n");
        for (k, v) in headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        if !status.starts_with("304") {
            out.push_str(&format!("content-length: {}\r\n", body.len()));
        }
        out.push_str("\r\n");
        sock.write_all(out.as_bytes()).await?;
        sock.write_all(&body).await?;
    }
}

async fn serve(listener: TcpListener, feed: Shared) {
    while let Ok((sock, _)) = listener.accept().await {
        let feed = Arc::clone(&feed);
        tokio::spawn(async move {
            if let Err(e) = serve_conn(sock, feed).await {
                eprintln!("snapshot fixture: {e:#}");
            }
        });
    }
}

/// `kB` fields of `/proc/<pid>/status`, in bytes.
fn proc_status(pid: u32) -> anyhow::Result<HashMap<String, u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let kb: u64 = v.trim().strip_suffix(" kB")?.trim().parse().ok()?;
            Some((k.to_owned(), kb * 1024))
        })
        .collect())
}

struct Counters {
    thread_full: f64,
    thread_delta: f64,
    sync_full: f64,
    sync_delta: f64,
    sync_failures: f64,
}

async fn counters(envoy: &Envoy) -> anyhow::Result<Counters> {
    let m = envoy.prometheus().await?;
    let get = |name: &str| m.get(name).copied().unwrap_or(0.0);
    Ok(Counters {
        thread_full: get("kvroute_knowledge_updates{kvroute_kind=\"full\"}"),
        thread_delta: get("kvroute_knowledge_updates{kvroute_kind=\"delta\"}"),
        sync_full: get("kvroute_sync_full_snapshots"),
        sync_delta: get("kvroute_sync_deltas"),
        sync_failures: get("kvroute_sync_fetch_failures"),
    })
}

/// Envoy's tcmalloc figures from admin `/memory` (`allocated`, `heap_size`, ...), in bytes.
async fn envoy_heap(envoy: &Envoy) -> anyhow::Result<HashMap<String, u64>> {
    let v: Value = reqwest::get(format!("{}/memory", envoy.admin_url())).await?.json().await?;
    let obj = v.as_object().context("/memory is not an object")?;
    Ok(obj.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.parse().ok()?))).collect())
}

#[derive(Debug, Clone, Copy)]
struct Mem {
    rss: u64,
    hwm: u64,
    heap: u64,
}

async fn measure(pid: u32, envoy: &Envoy) -> anyhow::Result<Mem> {
    let s = proc_status(pid)?;
    let heap = envoy_heap(envoy).await?;
    Ok(Mem {
        rss: s.get("VmRSS").copied().context("no VmRSS")?,
        hwm: s.get("VmHWM").copied().context("no VmHWM")?,
        heap: heap.get("allocated").copied().unwrap_or(0),
    })
}

fn mib(b: u64) -> f64 {
    b as f64 / MIB
}

fn diff(a: u64, b: u64) -> f64 {
    (b as f64 - a as f64) / MIB
}

/// Sends requests through Envoy, each on a new connection (so both threads get some), until
/// `done` holds for the counters; returns the number sent and how many were answered 200.
async fn drive(
    envoy: &Envoy,
    body: &Value,
    what: &str,
    done: impl Fn(&Counters) -> bool,
) -> anyhow::Result<(u64, u64)> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build()?;
    let sent = std::cell::Cell::new((0u64, 0u64));
    eventually(what, Duration::from_secs(120), || async {
        let (n, ok) = sent.get();
        let r = client::chat(&http, &envoy.base_url(), body).await.ok();
        let ok = ok + u64::from(r.is_some_and(|r| r.status == 200));
        sent.set((n + 1, ok));
        let c = counters(envoy).await.ok()?;
        done(&c).then_some(())
    })
    .await?;
    Ok(sent.get())
}

/// Waits (no requests) until the singleton's counters satisfy `done`.
async fn singleton(
    envoy: &Envoy,
    what: &str,
    done: impl Fn(&Counters) -> bool,
) -> anyhow::Result<()> {
    eventually(what, Duration::from_secs(60), || async {
        let c = counters(envoy).await.ok()?;
        done(&c).then_some(())
    })
    .await
}

fn random_hashes(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).map(|_| rng.random()).collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!(a.workers >= 2, "--workers must be at least 2");
    let dir = paths::scratch_dir("envoymem")?;
    let sim = SimWorker::start(0, &[], &dir).await?;
    // Distinct free loopback ports: all held while picking, released before Envoy starts.
    let held = (0..a.workers + 2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut free =
        held.iter().map(|l| l.local_addr().map(|a| a.port())).collect::<Result<Vec<u16>, _>>()?;
    drop(held);
    let mut take = || free.pop().context("out of ports");
    let ports = StackPorts { admin: take()?, listen: take()?, updater: take()? };
    let mut addrs = vec![sim.addr.clone()];
    for _ in 1..a.workers {
        addrs.push(format!("127.0.0.1:{}", take()?));
    }
    let filter = stack::filter_config(&addrs, &StackOptions::default());

    // The probe prompt's block hashes, as the filter computes them.
    let body = json!({"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "user", "content": kvroute_testkit::textgen::words(a.seed, 400)}]});
    let cfg = FilterConfig::from_json(filter.to_string().as_bytes())?;
    let router = Router::new(&cfg)?;
    let parsed = request::parse(Endpoint::Chat, body.to_string().as_bytes())?;
    let idle = |_: &str| WorkerLoad::default();
    let probe = router
        .decide(&parsed, body.to_string().len(), &idle, 0, 0)
        .map_err(|e| anyhow::anyhow!("deciding the probe: {e:?}"))?
        .block_hashes;
    anyhow::ensure!(!probe.is_empty(), "the probe prompt has no full block");
    drop(router);

    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let empty = Snapshot {
        version: 1,
        generated_at_ms: now_ms,
        workers: addrs
            .iter()
            .map(|w| SnapshotWorker {
                worker: w.clone(),
                observed_at_ms: now_ms,
                compatible: true,
                gpu: vec![],
                offloaded: vec![],
                load: None,
                model: MODEL.into(),
                ..Default::default()
            })
            .collect(),
        // What the updater names: the model, its bundle's fingerprint and block size.
        models: vec![ModelInfo {
            name: MODEL.into(),
            fingerprint: kvroute_core::decision::tokenize::model::ModelBundle::demo()?
                .fingerprint(),
            block_size: cfg.models.first().map_or(16, |m| m.block_size),
        }],
        ..Default::default()
    };
    let feed: Shared = Arc::new(Mutex::new(Feed {
        version: empty.version,
        full: Arc::new(empty.encode()),
        delta: None,
        served: HashMap::new(),
    }));
    let listener = TcpListener::bind(("127.0.0.1", ports.updater)).await?;
    let server = tokio::spawn(serve(listener, Arc::clone(&feed)));

    let config = stack::write_config("kvroute.yaml", &dir, ports, &addrs, &filter)?;
    let envoy = Envoy::start(&config, ports.admin, ports.listen, &dir, a.concurrency).await?;
    let pid = envoy.guard.pid().context("envoy pid")?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))?;
    anyhow::ensure!(comm.trim() == "envoy", "pid {pid} is '{}', not envoy", comm.trim());
    let threads = f64::from(a.concurrency);

    // Before: every thread has applied the empty snapshot (and served some requests).
    singleton(&envoy, "the singleton's empty snapshot", |c| c.sync_full >= 1.0).await?;
    drive(&envoy, &body, "every thread on the empty snapshot", |c| c.thread_full >= threads)
        .await?;
    let c0 = counters(&envoy).await?;
    let before = measure(pid, &envoy).await?;

    // The big snapshot: the sim holds the probe's blocks, every worker `blocks` hashes.
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let mut big = empty.clone();
    big.version = 2;
    for (i, w) in big.workers.iter_mut().enumerate() {
        let mut gpu = random_hashes(&mut rng, a.blocks);
        if i == 0 {
            gpu.truncate(a.blocks.saturating_sub(probe.len()));
            gpu.extend_from_slice(&probe);
            gpu.sort_unstable();
            gpu.dedup();
        }
        w.gpu = gpu;
    }
    let hashes: usize = big.workers.iter().map(|w| w.gpu.len()).sum();
    let encoded = big.encode();
    let snapshot_bytes = encoded.len();
    {
        let mut f = lock(&feed);
        f.version = big.version;
        f.full = Arc::new(encoded);
    }
    singleton(&envoy, "the singleton's big snapshot", |c| c.sync_full >= c0.sync_full + 1.0)
        .await?;
    let fetched = measure(pid, &envoy).await?;
    // Worker threads apply a new snapshot on their own tick too, not only on a request: how
    // many had already when the singleton side was read.
    let early = (counters(&envoy).await?.thread_full - c0.thread_full).max(0.0);
    let (sent, ok) = drive(&envoy, &body, "every thread on the big snapshot", |c| {
        c.thread_full >= c0.thread_full + threads
    })
    .await?;
    let after = measure(pid, &envoy).await?;
    let c1 = counters(&envoy).await?;
    // A decision credits the sim with the probe's blocks from events.
    let http = reqwest::Client::new();
    let credited = client::chat(&http, &envoy.base_url(), &body).await?;

    // A small delta: one worker loses 256 blocks and gains 256.
    let mut next = big.clone();
    next.version = 3;
    if let Some(w) = next.workers.get_mut(1) {
        w.gpu.drain(..256.min(w.gpu.len()));
        w.gpu.extend(random_hashes(&mut rng, 256));
        w.gpu.sort_unstable();
        w.gpu.dedup();
    }
    let delta = Delta::between(&big, &next);
    let delta_bytes = delta.encode();
    let delta_len = delta_bytes.len();
    {
        let mut f = lock(&feed);
        f.version = next.version;
        f.full = Arc::new(next.encode());
        f.delta = Some((big.version, Arc::new(delta_bytes)));
    }
    drop((big, next, empty));
    singleton(&envoy, "the singleton's delta", |c| c.sync_delta >= c1.sync_delta + 1.0).await?;
    drive(&envoy, &body, "every thread on the delta", |c| {
        c.thread_delta >= c1.thread_delta + threads
    })
    .await?;
    let with_delta = measure(pid, &envoy).await?;
    let c2 = counters(&envoy).await?;
    let served = lock(&feed).served.clone();
    server.abort();

    let singleton_mib = diff(before.rss, fetched.rss);
    let threads_mib = diff(fetched.rss, after.rss);
    let total_mib = diff(before.rss, after.rss);
    println!("kvroute filter memory in Envoy (pid {pid}, --concurrency {})", a.concurrency);
    println!(
        "  knowledge: {} workers x {} blocks = {hashes} hashes; full snapshot {:.2} MiB on the wire",
        a.workers,
        a.blocks,
        snapshot_bytes as f64 / MIB
    );
    println!(
        "  VmRSS: before {:.1} MiB | singleton fetched {:.1} MiB | all threads applied {:.1} MiB | after delta {:.1} MiB",
        mib(before.rss),
        mib(fetched.rss),
        mib(after.rss),
        mib(with_delta.rss)
    );
    println!(
        "  VmHWM (peak RSS): before {:.1} MiB, after {:.1} MiB, after delta {:.1} MiB",
        mib(before.hwm),
        mib(after.hwm),
        mib(with_delta.hwm)
    );
    println!(
        "  Envoy heap (tcmalloc allocated, outside the wasm VMs): before {:.1} MiB, singleton fetched {:+.1} MiB, threads applied {:+.1} MiB",
        mib(before.heap),
        diff(before.heap, fetched.heap),
        diff(fetched.heap, after.heap)
    );
    println!(
        "  growth: total {total_mib:.1} MiB = singleton side {singleton_mib:.1} MiB + worker threads {threads_mib:.1} MiB ({})",
        if early > 0.0 {
            format!("{early} thread(s) applied it on their tick before the singleton side was read: the split is not clean, use the even split below")
        } else {
            "no thread had applied it when the singleton side was read".to_string()
        }
    );
    println!(
        "  per worker thread: {:.1} MiB (the threads' growth / {}: each thread has its own VM and index)",
        threads_mib / threads,
        a.concurrency
    );
    println!(
        "  total / (threads + 1 for the singleton's copy) = {:.1} MiB (an even split; the measured split is above)",
        total_mib / (threads + 1.0)
    );
    println!(
        "  native: 26 MiB per index for the same size (cargo bench -p kvroute-core --bench knowledge, live heap of the index alone)"
    );
    println!(
        "  delta: {delta_len} bytes; singleton deltas {} -> {}, thread delta updates {} -> {}, RSS {:+.1} MiB",
        c1.sync_delta,
        c2.sync_delta,
        c1.thread_delta,
        c2.thread_delta,
        diff(after.rss, with_delta.rss)
    );
    println!(
        "  counters: thread full updates {} -> {} -> {}; singleton full {}; fetch failures {}; fixture served {served:?}",
        c0.thread_full, c1.thread_full, c2.thread_full, c2.sync_full, c2.sync_failures
    );
    println!(
        "  requests to bring every thread onto the big snapshot: {sent} ({ok} answered 200); probe decision: status {}, {}",
        credited.status,
        credited.decision.as_deref().unwrap_or("no decision header")
    );
    drop(envoy);
    if !a.no_bundle {
        bundle::measure(&a.bundle_threads, a.out.as_deref()).await?;
    }
    Ok(())
}

kvroute_stack::help_test!(Args);
