//! One real updater following simulated workers' KV events over real ZMQ: its ingest
//! (events/s, the cores it uses, its RSS) against the pool's size, and its fan-out to plain
//! HTTP long-poll clients (the requests the filter's singleton sends: `GET /v1/snapshot?since=V
//! &wait_ms=W`, decoding each full snapshot or delta into its own copy) with the freshness of
//! what they hold.
//!
//! The workers are `kvroute-sim` workers, all in one process (as `kvroute-simload` runs them),
//! with a small KV cache so that stores evict (both event kinds flow). Requests go straight to
//! the workers, open loop, each a fresh prompt (every block new: the most events per request).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use kvroute_core::wire::delta::Delta;
use kvroute_core::wire::snapshot::Snapshot;
use kvroute_stack::process::Guard;
use kvroute_stack::stack::{MODEL, UPDATER_TOKEN};
use kvroute_stack::{client, paths};
use serde_json::{json, Value};
use tokio::process::Command;
use tokio::sync::watch;

/// utime + stime of `pid` in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    stat_cpu_seconds(&format!("/proc/{pid}/stat"))
}

/// utime + stime in seconds from a `/proc/…/stat` file (a process's or one of its threads').
pub fn stat_cpu_seconds(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let rest = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

/// The value after `key` in a sim's start-up line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let mut words = line.split_whitespace();
    words.find(|w| *w == key)?;
    words.next()
}

/// A simulated pool and the updater following it.
pub struct SimPool {
    _sim: Guard,
    updater: Guard,
    /// The updater's HTTP port.
    pub port: u16,
    /// Workers' HTTP addresses; worker 0 gets no background load (freshness probes).
    pub addrs: Vec<String>,
    http: reqwest::Client,
}

impl SimPool {
    pub async fn start(workers: usize, dir: &Path) -> anyhow::Result<SimPool> {
        let mut cmd = Command::new(paths::sim_bin()?);
        cmd.args(["--workers", &workers.to_string(), "--base-port", "0"]);
        cmd.args(["--speedup", "20", "--num-gpu-blocks", "1024"]);
        let mut sim = Guard::spawn("kvroute-sim", cmd, &dir.join(format!("sim-{workers}.log")))?;
        let lines = sim.wait_lines("listening on", workers, Duration::from_secs(120)).await?;
        let mut addrs = Vec::new();
        let mut endpoints = Vec::new();
        for l in &lines {
            let addr = field(l, "on").context("sim address")?;
            let (ev, rp) =
                (field(l, "events").context("events")?, field(l, "replay").context("replay")?);
            endpoints.push(format!("{addr},tcp://127.0.0.1:{ev},tcp://127.0.0.1:{rp}"));
            addrs.push(addr.to_owned());
        }
        // The updater with its production defaults (the test stack checks alignment every
        // 300 ms; the default is every 10 s), the demo model.
        let port = paths::free_port()?;
        let mut cmd = Command::new(paths::updater_bin()?);
        cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--token", UPDATER_TOKEN]);
        for e in &endpoints {
            cmd.args(["--worker", e]);
        }
        let log = dir.join(format!("updater-{workers}.log"));
        let mut updater = Guard::spawn("kvroute-updater", cmd, &log)?;
        updater.wait_line("listening on", Duration::from_secs(60)).await?;
        let pool = SimPool { _sim: sim, updater, port, addrs, http: reqwest::Client::new() };
        pool.wait_compatible().await?;
        Ok(pool)
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.updater.pid().context("updater pid")
    }

    /// Waits until the updater identified every worker (alignment checked).
    async fn wait_compatible(&self) -> anyhow::Result<()> {
        for _ in 0..600 {
            let s = self.status().await?;
            let ws = s["workers"].as_object().map(|m| m.values().cloned().collect::<Vec<_>>());
            let ok = ws.as_ref().is_some_and(|w| {
                w.len() == self.addrs.len() && w.iter().all(|v| v["compatible"] == true)
            });
            if ok {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        anyhow::bail!("the updater did not identify all {} workers", self.addrs.len())
    }

    async fn status(&self) -> anyhow::Result<Value> {
        let url = format!("http://127.0.0.1:{}/status", self.port);
        Ok(self.http.get(url).send().await?.json().await?)
    }

    /// Events the updater ingested so far, all workers.
    async fn events(&self) -> anyhow::Result<u64> {
        let s = self.status().await?;
        let ws = s["workers"].as_object().context("status workers")?;
        Ok(ws.values().filter_map(|w| w["stats"]["events"].as_u64()).sum())
    }

    /// Open-loop requests at `rate`/s to workers 1.. (round robin) until `stop` is set.
    fn background(&self, rate: f64, stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<u64> {
        let (http, addrs) = (self.http.clone(), self.addrs.clone());
        tokio::spawn(async move {
            let gap = Duration::from_secs_f64(1.0 / rate.max(0.1));
            let start = tokio::time::Instant::now();
            let mut sent = 0u64;
            while !*stop.borrow() {
                let n = addrs.len().saturating_sub(1).max(1);
                let url = format!("http://{}", addrs[(1 + sent as usize % n) % addrs.len()]);
                let body = chat(0xB6_0000_0000 + sent, 300);
                let http = http.clone();
                tokio::spawn(async move { client::chat(&http, &url, &body).await.ok() });
                sent += 1;
                tokio::time::sleep_until(start + gap * sent as u32).await;
            }
            sent
        })
    }
}

fn chat(seed: u64, words: usize) -> Value {
    json!({"model": MODEL, "max_tokens": 1,
        "messages": [{"role": "user", "content": kvroute_testkit::textgen::words(seed, words)}]})
}

/// One point of the ingest curve.
pub struct Ingest {
    pub idle_cores: f64,
    pub events_per_s: f64,
    pub load_cores: f64,
    /// Events per second of updater CPU (all of it, idle work included).
    pub events_per_core_s: f64,
    pub rss_mib: f64,
}

/// Idle for `idle_s`, then `rate` requests/s for `load_s`.
pub async fn ingest(pool: &SimPool, rate: f64, idle_s: f64, load_s: f64) -> anyhow::Result<Ingest> {
    let pid = pool.pid()?;
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(idle_s)).await;
    let idle_cores = (cpu_seconds(pid) - c0) / t0.elapsed().as_secs_f64();
    let (stop_tx, stop) = watch::channel(false);
    let load = pool.background(rate, stop);
    // Settle: the first requests' events arrive after their prefill.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (e0, c0, t0) = (pool.events().await?, cpu_seconds(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(load_s)).await;
    let (e1, c1, wall) = (pool.events().await?, cpu_seconds(pid), t0.elapsed().as_secs_f64());
    stop_tx.send(true).ok();
    load.await?;
    let events = e1.saturating_sub(e0) as f64;
    let load_cores = (c1 - c0) / wall;
    // All of its CPU under load (alignment checks and scrapes included): a floor on what
    // one core ingests.
    let work = (c1 - c0).max(1e-3);
    let rss = kvroute_stack::process::rss_kb(pid).map_or(f64::NAN, |kb| kb as f64 / 1024.0);
    Ok(Ingest {
        idle_cores,
        events_per_s: events / wall,
        load_cores,
        events_per_core_s: events / work,
        rss_mib: rss,
    })
}

/// A long-poll client's news: how many answers added blocks on worker 0, and when the last did.
type Seen = (u64, Instant);

/// One plain HTTP long-poll client: keeps its own copy of the knowledge, as the filter does.
async fn long_poll(
    http: reqwest::Client,
    url: String,
    probe_worker: String,
    seen: watch::Sender<Seen>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<u64> {
    let mut copy: Option<Snapshot> = None;
    let mut bytes = 0u64;
    while !*stop.borrow() {
        let since = copy.as_ref().map_or(String::new(), |s| format!("&since={}", s.version));
        let r = http
            .get(format!("{url}/v1/snapshot?wait_ms=2000{since}"))
            .header("x-kvroute-token", UPDATER_TOKEN)
            .send()
            .await?;
        if r.status() == reqwest::StatusCode::NOT_MODIFIED {
            continue;
        }
        anyhow::ensure!(r.status().is_success(), "long poll: {}", r.status());
        let kind = r.headers().get("x-kvroute-snapshot-kind").map(|v| v.as_bytes().to_vec());
        let body = r.bytes().await?;
        let at = Instant::now();
        bytes += body.len() as u64;
        if kind.as_deref() == Some(b"delta") {
            let d = Delta::decode(&body)?;
            let added = d.workers.iter().any(|w| w.worker == probe_worker && !w.gpu.add.is_empty());
            match copy.as_mut().map(|c| c.apply_delta(&d)) {
                Some(Ok(())) => {}
                _ => copy = None,
            }
            if added {
                seen.send_modify(|s| *s = (s.0 + 1, at));
            }
        } else {
            let full = Snapshot::decode(&body)?;
            // A full answer (a new client, or one too far behind for a delta) shows new blocks
            // on worker 0 as hashes its copy did not hold.
            let held = |s: &Snapshot| {
                s.workers.iter().find(|w| w.worker == probe_worker).map(|w| w.gpu.clone())
            };
            let before = copy.as_ref().and_then(held);
            let added = match (before, held(&full)) {
                (Some(old), Some(new)) => new.iter().any(|h| old.binary_search(h).is_err()),
                _ => false,
            };
            copy = Some(full);
            if added {
                seen.send_modify(|s| *s = (s.0 + 1, at));
            }
        }
    }
    Ok(bytes)
}

/// One point of the fan-out curve.
pub struct Fanout {
    pub freshness_p50_ms: f64,
    pub freshness_p99_ms: f64,
    pub samples: usize,
    pub updater_cores: f64,
    pub bytes_per_s: f64,
}

/// `clients` long-poll clients while `rate` requests/s run on the other workers; `probes`
/// fresh prompts sent to worker 0, each timed from its sending until every client's copy
/// shows new blocks on worker 0.
pub async fn fanout(
    pool: &SimPool,
    clients: usize,
    rate: f64,
    probes: usize,
) -> anyhow::Result<Fanout> {
    let url = format!("http://127.0.0.1:{}", pool.port);
    let (stop_tx, stop) = watch::channel(false);
    let pid = pool.pid()?;
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    let mut seen = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (tx, rx) = watch::channel((0, Instant::now()));
        let http = reqwest::Client::new();
        tasks.push(tokio::spawn(long_poll(
            http,
            url.clone(),
            pool.addrs[0].clone(),
            tx,
            stop.clone(),
        )));
        seen.push(rx);
    }
    let load = pool.background(rate, stop.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let probe_url = format!("http://{}", pool.addrs[0]);
    let mut lags = Vec::new();
    for p in 0..probes {
        let before: Vec<u64> = seen.iter().map(|s| s.borrow().0).collect();
        let sent = Instant::now();
        // A prompt new to worker 0 (each point's probes differ): it stores new blocks.
        let r = client::chat(
            &pool.http,
            &probe_url,
            &chat(0xF0_0000_0000 + ((clients as u64) << 20) + p as u64, 200),
        )
        .await?;
        anyhow::ensure!(r.status == 200, "probe failed: {}", r.status);
        for (s, b) in seen.iter_mut().zip(&before) {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let got = tokio::time::timeout_at(deadline, s.wait_for(|v| v.0 > *b))
                .await
                .map(|r| r.map(|v| *v));
            let at = match got {
                Ok(r) => r?.1,
                Err(_) => anyhow::bail!(
                    "probe {p}: a client never saw it (answers with new blocks on {}: {} before, {} now)",
                    pool.addrs[0],
                    b,
                    s.borrow().0
                ),
            };
            lags.push(at.saturating_duration_since(sent).as_secs_f64() * 1000.0);
        }
    }
    stop_tx.send(true).ok();
    load.await?;
    let mut bytes = 0;
    for t in tasks {
        bytes += t.await??;
    }
    // Over the whole point: the clients' first full snapshots, the warm-up and the probes.
    let (cores, wall) = ((cpu_seconds(pid) - c0) / t0.elapsed().as_secs_f64(), t0.elapsed());
    lags.sort_by(f64::total_cmp);
    let q = |p| kvroute_stack::nearest_rank(&lags, p).unwrap_or(f64::NAN);
    Ok(Fanout {
        freshness_p50_ms: q(0.5),
        freshness_p99_ms: q(0.99),
        samples: lags.len(),
        updater_cores: cores,
        bytes_per_s: bytes as f64 / wall.as_secs_f64(),
    })
}
