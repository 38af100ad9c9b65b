//! The transfer reference sweep (issue 25): a busy holder H of a long prefix, an idle worker R
//! that can only recompute it, and an idle peer P that can pull it from H over a link whose
//! bandwidth the sweep varies; H carries `n` background requests. At every (bandwidth, n) the
//! same probe (the prefix and a short suffix) goes at the same instant to H (wait for the
//! holder), to R (recompute) and to P with `x-kvroute-kv-source: H` (pull, then prefill the
//! rest), straight to the workers' own ports; their measured TTFTs are set against what
//! kvroute's cost model predicts with the filter's profile (its own prior, never the
//! simulator's numbers) and the link an administrator configures.
//!
//! Two crossovers per sweep: the bandwidth at which pulling starts to beat recomputing (at
//! n = 0), and, per bandwidth, the holder queue at which pulling starts to beat waiting.
//! Measured crossovers are interpolated between sweep points: pull minus recompute is linear
//! in 1/bandwidth, wait minus pull in n.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::net::KV_SOURCE_HEADER;
use crate::schedule::{completions_body, COMPLETIONS};
use crate::topology::Topology;
use kvroute_core::decision::cost::{self, Candidate, Profile};
use kvroute_core::decision::load::WorkerLoad;
use kvroute_core::decision::worker::WorkerName;
use kvroute_stack::sim::SimWorker;
use kvroute_stack::stack::BundleFrom;

/// The workers' block size (every built-in profile's).
const BLOCK_SIZE: u32 = 16;
/// Token ids the prompts are drawn from (inside the demo model's vocabulary).
const TOKEN_IDS: std::ops::Range<u32> = 10..1700;
/// How long after H's background requests leave the probes do: they are at H and in its
/// queue by then. (A worker reports a request running only once its prefill step ends, so
/// waiting for the load to show would probe an H that has done the work already.)
const HEAD_START: Duration = Duration::from_millis(20);

/// The sweep's sizes and the link's fixed costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferOptions {
    /// The shared prefix (tokens; a multiple of the block size).
    pub prefix_tokens: usize,
    /// The probe's own tokens after the prefix.
    pub suffix_tokens: usize,
    /// Prompt of each background request on H (unique: all prefill work).
    pub background_tokens: usize,
    /// Output budget of background requests and probes.
    pub output_tokens: u64,
    /// The H-P link's bandwidths (Gb/s).
    pub bandwidths_gbps: Vec<f64>,
    /// Background requests on H.
    pub levels: Vec<usize>,
    /// The H-P link's round trip (ms).
    pub link_rtt_ms: f64,
    /// Fixed cost of one pull (ms), as the filter's `transfer.setup_ms`.
    pub setup_ms: f64,
    /// KV bytes per token of the model.
    pub kv_bytes_per_token: u64,
    pub seed: u64,
    /// Bound on each wait.
    pub timeout: Duration,
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            prefix_tokens: 8192,
            suffix_tokens: 32,
            background_tokens: 2048,
            output_tokens: 16,
            bandwidths_gbps: vec![5.0, 10.0, 20.0, 40.0, 80.0, 160.0],
            levels: vec![0, 1, 2, 3, 4, 6, 8, 12, 16],
            link_rtt_ms: 0.2,
            setup_ms: 2.0,
            kv_bytes_per_token: 131_072,
            seed: 7,
            timeout: Duration::from_secs(60),
        }
    }
}

/// One (bandwidth, n) point: each option's measured TTFT (engine ms = wall ms, real time).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TransferCell {
    pub bandwidth_gbps: f64,
    pub level: usize,
    /// The probe on H, behind its `level` background requests.
    pub wait_ms: Option<f64>,
    /// The probe on R (recomputes everything).
    pub recompute_ms: Option<f64>,
    /// The probe on P, pulling the prefix from H first.
    pub pull_ms: Option<f64>,
    /// What P reported cached (the pulled blocks count as cached).
    pub pull_cached_tokens: Option<u64>,
    pub error: Option<String>,
}

/// Per bandwidth: the model's estimates and both queue crossovers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BandwidthRow {
    pub bandwidth_gbps: f64,
    pub predicted_pull_ms: f64,
    /// n at which waiting on H costs as much as pulling to P, as the model predicts
    /// (continuous; 0: pulling beats even an idle holder).
    pub predicted_queue_crossover: Option<f64>,
    /// The same, measured (interpolated between levels; `None`: not inside the sweep).
    pub measured_queue_crossover: Option<f64>,
    /// How much longer a pull took from a busy H than from an idle one (mean over n > 0 minus
    /// n = 0, ms): what the cost model's pull does not include.
    #[serde(default)]
    pub busy_holder_pull_extra_ms: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferReport {
    pub topology: String,
    pub options: TransferOptions,
    pub profile: Profile,
    pub predicted_recompute_ms: f64,
    /// The model's wait on H for each level.
    pub predicted_wait_ms: Vec<f64>,
    pub cells: Vec<TransferCell>,
    pub rows: Vec<BandwidthRow>,
    /// Bandwidth (Gb/s) above which pulling beats recomputing, predicted.
    pub predicted_bandwidth_crossover: Option<f64>,
    /// The same, measured at n = 0 (`None`: not inside the sweep).
    pub measured_bandwidth_crossover: Option<f64>,
}

impl TransferOptions {
    fn probe_tokens(&self) -> u64 {
        (self.prefix_tokens + self.suffix_tokens) as u64
    }

    /// The model's pull time of the prefix over a link of `gbps` (setup, one round trip, the
    /// bytes at the link's bandwidth), then the suffix's prefill on top of it.
    pub fn predicted_pull_ms(&self, profile: &Profile, gbps: f64) -> f64 {
        self.transfer_ms(gbps) + self.suffix_prefill_ms(profile)
    }

    /// The pull as the filter costs it (`TopologyConfig::pull_cost`) on the configuration an
    /// administrator would write for this pool: H and P in one zone, that zone's link at
    /// `gbps`, pulls allowed within the zone.
    fn transfer_ms(&self, gbps: f64) -> f64 {
        let cfg = self.filter_topology(gbps);
        cfg.pull_cost("H", "P").map_or(f64::INFINITY, |c| c.ms(self.prefix_tokens as u64))
    }

    /// The filter's `topology` section for the sweep's pool at `gbps`.
    pub fn filter_topology(&self, gbps: f64) -> kvroute_core::decision::topology::TopologyConfig {
        let place = |node: &str| json!({"site": "a", "zone": "a1", "node": node});
        let v = json!({
            "local_site": "a",
            "workers": {"H": place("h"), "R": place("r"), "P": place("p")},
            "links": {"zone": {"rtt_ms": self.link_rtt_ms, "gbps": gbps}},
            "transfer": {
                "enabled": true,
                "max_level": "zone",
                "setup_ms": self.setup_ms,
                "kv_bytes_per_token": self.kv_bytes_per_token,
            },
        });
        serde_json::from_value(v).unwrap_or_default()
    }

    fn suffix_prefill_ms(&self, profile: &Profile) -> f64 {
        self.score(profile, self.prefix_tokens, 0)
    }

    /// kvroute's TTFT estimate for the probe on a worker holding `cached` prompt tokens with
    /// `n` background requests it routed itself (their sizes known) still in prefill, sent
    /// [`HEAD_START`] before it.
    fn score(&self, profile: &Profile, cached: usize, n: usize) -> f64 {
        let bg = self.background_tokens as u64;
        let load = WorkerLoad {
            inflight_requests: n as u32,
            prefilling_requests: n as u32,
            prefill_tokens: n as u64 * bg,
            prefill_sq_tokens: n as u64 * bg * bg,
            prefill_elapsed_ms: if n > 0 { HEAD_START.as_millis() as u64 } else { 0 },
            arriving_tokens_per_s: 0,
            behind_tokens: 0,
            passing_tokens_per_s: 0,
        };
        let c = Candidate::<WorkerName> {
            worker: "w".into(),
            cached_blocks: cached / BLOCK_SIZE as usize,
            offloaded_blocks: 0,
            load,
            adapter_missing: false,
            deviation: 1.0,
        };
        cost::score(profile, &c, self.probe_tokens(), BLOCK_SIZE).ttft_ms
    }

    pub fn predicted_recompute_ms(&self, profile: &Profile) -> f64 {
        self.score(profile, 0, 0)
    }

    pub fn predicted_wait_ms(&self, profile: &Profile, n: usize) -> f64 {
        self.score(profile, self.prefix_tokens, n)
    }

    /// The bandwidth at which the predicted pull equals the predicted recompute.
    pub fn predicted_bandwidth_crossover(&self, profile: &Profile) -> Option<f64> {
        // The pull is fixed + bits / bandwidth: two bandwidths give both terms.
        let (t1, t2) = (self.transfer_ms(1.0), self.transfer_ms(2.0));
        let per_inverse_gbps = 2.0 * (t1 - t2);
        let fixed = t1 - per_inverse_gbps;
        let budget = self.predicted_recompute_ms(profile) - self.suffix_prefill_ms(profile) - fixed;
        (budget > 0.0 && per_inverse_gbps.is_finite()).then(|| per_inverse_gbps / budget)
    }

    /// The holder queue at which the predicted wait equals the predicted pull over `gbps`
    /// (interpolated between whole requests; `None`: not below 10 000).
    pub fn predicted_queue_crossover(&self, profile: &Profile, gbps: f64) -> Option<f64> {
        let pull = self.predicted_pull_ms(profile, gbps);
        let pts: Vec<(f64, f64)> = (0..10_000)
            .map(|n| (n as f64, pull - self.predicted_wait_ms(profile, n)))
            .take_while(|p| p.1 > 0.0)
            .collect();
        let next = pts.len();
        if next == 10_000 {
            return None;
        }
        let last = pts.last().copied();
        let mut two: Vec<(f64, f64)> = last.into_iter().collect();
        two.push((next as f64, pull - self.predicted_wait_ms(profile, next)));
        zero_crossing(&two)
    }
}

/// Where `f` (sampled at increasing `x`) first goes from above 0 to 0 or below, by linear
/// interpolation; `None` when it does not inside the samples.
pub fn zero_crossing(points: &[(f64, f64)]) -> Option<f64> {
    if points.first().is_some_and(|p| p.1 <= 0.0) {
        return Some(points[0].0);
    }
    points.windows(2).find(|w| w[0].1 > 0.0 && w[1].1 <= 0.0).map(|w| {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        x0 + (x1 - x0) * y0 / (y0 - y1)
    })
}

/// The report from measured cells.
pub fn summarize(
    topo: &Topology,
    opts: &TransferOptions,
    profile: Profile,
    cells: Vec<TransferCell>,
) -> TransferReport {
    let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    // Pull minus recompute at n = 0, against 1/bandwidth, from the fastest link down.
    let mut by_inverse: Vec<(f64, f64)> = cells
        .iter()
        .filter(|c| c.level == 0)
        .filter_map(|c| Some((1.0 / c.bandwidth_gbps, c.recompute_ms? - c.pull_ms?)))
        .collect();
    by_inverse.sort_by(|a, b| a.0.total_cmp(&b.0));
    // recompute - pull is > 0 where pulling wins: the crossing from the fast side.
    // (None when pulling does not win even on the fastest link.)
    let measured_bandwidth_crossover = if by_inverse.first().is_some_and(|p| p.1 > 0.0) {
        zero_crossing(&by_inverse).map(|inv| 1.0 / inv)
    } else {
        None
    };
    let rows = opts
        .bandwidths_gbps
        .iter()
        .map(|&b| {
            let here: Vec<&TransferCell> = cells.iter().filter(|c| c.bandwidth_gbps == b).collect();
            let pull = mean(here.iter().filter_map(|c| c.pull_ms).collect());
            let mut pts: Vec<(f64, f64)> =
                here.iter().filter_map(|c| Some((c.level as f64, pull? - c.wait_ms?))).collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let idle = here.iter().find(|c| c.level == 0).and_then(|c| c.pull_ms);
            let busy =
                mean(here.iter().filter(|c| c.level > 0).filter_map(|c| c.pull_ms).collect());
            BandwidthRow {
                busy_holder_pull_extra_ms: idle.zip(busy).map(|(i, b)| b - i),
                bandwidth_gbps: b,
                predicted_pull_ms: opts.predicted_pull_ms(&profile, b),
                predicted_queue_crossover: opts.predicted_queue_crossover(&profile, b),
                measured_queue_crossover: zero_crossing(&pts),
            }
        })
        .collect();
    TransferReport {
        topology: topo.describe(),
        predicted_recompute_ms: opts.predicted_recompute_ms(&profile),
        predicted_wait_ms: opts
            .levels
            .iter()
            .map(|&n| opts.predicted_wait_ms(&profile, n))
            .collect(),
        predicted_bandwidth_crossover: opts.predicted_bandwidth_crossover(&profile),
        measured_bandwidth_crossover,
        options: opts.clone(),
        profile,
        cells,
        rows,
    }
}

/// The sweep's workers: H, R, P in one zone of site `a`, the H-P link at `gbps`.
async fn start_workers(
    topo: &Topology,
    opts: &TransferOptions,
    gbps: f64,
    dir: &Path,
) -> anyhow::Result<Vec<SimWorker>> {
    let mut base = vec![
        "--profile".to_string(),
        topo.workers.profile.clone(),
        "--speedup".into(),
        "1".into(),
        "--kv-bytes-per-token".into(),
        opts.kv_bytes_per_token.to_string(),
        // The pull's fixed cost, as the filter's `transfer.setup_ms` says (a network figure).
        "--kv-setup-ms".into(),
        opts.setup_ms.to_string(),
    ];
    base.extend(topo.workers.model.pool(0, BundleFrom::Updater).sim_args());
    let link = format!("a={}:{gbps}", opts.link_rtt_ms);
    let mut out = Vec::new();
    for (i, node) in ["h", "r", "p"].iter().enumerate() {
        let mut args = base.clone();
        args.extend(["--site".into(), "a".into(), "--node".into(), (*node).into()]);
        args.extend(["--link".into(), link.clone()]);
        out.push(SimWorker::start(i, &args, dir).await?);
    }
    Ok(out)
}

/// A streamed completion straight to a worker: its TTFT (ms) and cached tokens.
async fn probe(
    http: &reqwest::Client,
    worker: &str,
    body: &Value,
    source: Option<&str>,
) -> anyhow::Result<(f64, Option<u64>)> {
    let start = Instant::now();
    let mut req = http.post(format!("http://{worker}{COMPLETIONS}")).json(body);
    if let Some(s) = source {
        req = req.header(KV_SOURCE_HEADER, s);
    }
    let resp = req.send().await.with_context(|| format!("probing {worker}"))?;
    anyhow::ensure!(resp.status().is_success(), "probing {worker}: {}", resp.status());
    let mut stream = resp.bytes_stream();
    let mut timer = crate::sse::SseTimer::new();
    while let Some(chunk) = stream.next().await {
        timer.push(&chunk?, start.elapsed());
    }
    let m = timer.finish(start.elapsed());
    let ttft = m.ttft.with_context(|| format!("no token from {worker}"))?;
    Ok((ttft.as_secs_f64() * 1000.0, m.cached_tokens))
}

/// Aborts background requests when dropped.
struct Background(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Background {
    fn drop(&mut self) {
        self.0.iter().for_each(|h| h.abort());
    }
}

fn ids(rng: &mut rand::rngs::StdRng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.random_range(TOKEN_IDS)).collect()
}

/// One bandwidth: fresh workers, H warmed with the prefix once, then every level.
async fn run_bandwidth(
    topo: &Topology,
    opts: &TransferOptions,
    gbps: f64,
    dir: &Path,
) -> anyhow::Result<Vec<TransferCell>> {
    let workers = start_workers(topo, opts, gbps, dir).await?;
    let addrs: Vec<String> = workers.iter().map(|w| w.addr.clone()).collect();
    let model = topo.workers.model.name();
    let http = reqwest::Client::builder().timeout(opts.timeout).build()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let prefix = ids(&mut rng, opts.prefix_tokens);
    let warm = json!({"model": model, "prompt": prefix, "max_tokens": 1});
    let resp = http.post(format!("http://{}{COMPLETIONS}", addrs[0])).json(&warm).send().await?;
    anyhow::ensure!(resp.status().is_success(), "warming H: {}", resp.status());
    let _ = resp.bytes().await;
    let quick = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
    let mut cells = Vec::new();
    for &level in &opts.levels {
        // R and P start without the prefix; H idle before its load.
        crate::cluster::reset_prefix_caches(&addrs[1..], "/reset_prefix_cache").await?;
        kvroute_stack::eventually_every(
            "H to be idle",
            opts.timeout,
            Duration::from_millis(10),
            || async {
                let (r, w) = crate::runner::scrape_queue(&quick, &addrs[0]).await?;
                (r + w == 0).then_some(())
            },
        )
        .await?;
        let mut suffix = prefix.clone();
        suffix.extend(ids(&mut rng, opts.suffix_tokens));
        let body = completions_body(model, &suffix, opts.output_tokens);
        let mut bg = Background(Vec::new());
        for _ in 0..level {
            let b =
                completions_body(model, &ids(&mut rng, opts.background_tokens), opts.output_tokens);
            let req = http.post(format!("http://{}{COMPLETIONS}", addrs[0])).json(&b);
            bg.0.push(tokio::spawn(async move {
                if let Ok(mut r) = req.send().await {
                    while let Ok(Some(_)) = r.chunk().await {}
                }
            }));
        }
        if level > 0 {
            tokio::time::sleep(HEAD_START).await;
        }
        let (h, r, p) = tokio::join!(
            probe(&http, &addrs[0], &body, None),
            probe(&http, &addrs[1], &body, None),
            probe(&http, &addrs[2], &body, Some(&addrs[0])),
        );
        // Let the background finish (its streams are read to the end) before the next level.
        for t in std::mem::take(&mut bg.0) {
            let _ = tokio::time::timeout(opts.timeout, t).await;
        }
        let error = [&h, &r, &p].iter().find_map(|x| x.as_ref().err().map(|e| format!("{e:#}")));
        cells.push(TransferCell {
            bandwidth_gbps: gbps,
            level,
            wait_ms: h.as_ref().ok().map(|x| x.0),
            recompute_ms: r.as_ref().ok().map(|x| x.0),
            pull_ms: p.as_ref().ok().map(|x| x.0),
            pull_cached_tokens: p.as_ref().ok().and_then(|x| x.1),
            error,
        });
    }
    Ok(cells)
}

/// Runs the sweep and writes `transfer.md` and `transfer.json` into `out_dir`.
pub async fn run(
    topo: &Topology,
    opts: &TransferOptions,
    out_dir: &Path,
) -> anyhow::Result<TransferReport> {
    anyhow::ensure!(topo.workers.external.is_empty(), "the transfer sweep needs simulated workers");
    anyhow::ensure!(
        opts.prefix_tokens > 0 && opts.prefix_tokens % BLOCK_SIZE as usize == 0,
        "prefix_tokens must be a positive multiple of {BLOCK_SIZE}"
    );
    anyhow::ensure!(
        opts.bandwidths_gbps.iter().all(|b| b.is_finite() && *b > 0.0),
        "bandwidths must be > 0"
    );
    let profile = topo.filter.profile();
    let mut topo = topo.clone();
    topo.workers.count = 3;
    topo.workers.speedup = 1.0;
    topo.net = None;
    let topo = &topo;
    let dir = kvroute_stack::paths::scratch_dir("bench-transfer")?;
    let mut cells = Vec::new();
    for &b in &opts.bandwidths_gbps {
        let sub = dir.join(format!("bw-{b}"));
        std::fs::create_dir_all(&sub)?;
        cells.extend(
            run_bandwidth(topo, opts, b, &sub)
                .await
                .with_context(|| format!("transfer sweep at {b} Gb/s"))?,
        );
    }
    let report = summarize(topo, opts, profile, cells);
    std::fs::create_dir_all(out_dir)?;
    std::fs::write(out_dir.join("transfer.md"), markdown(&report))?;
    std::fs::write(out_dir.join("transfer.json"), serde_json::to_string_pretty(&report)?)?;
    Ok(report)
}

fn num(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0}"))
}

fn one(v: Option<f64>) -> String {
    v.map_or("none in the sweep".into(), |v| format!("{v:.1}"))
}

/// How far `measured` is from `predicted`, relative (`None` without both).
pub fn relative_error(measured: Option<f64>, predicted: Option<f64>) -> Option<f64> {
    let (m, p) = (measured?, predicted?);
    (p.abs() > 1e-9).then(|| (m - p).abs() / p.abs())
}

/// The best option of three TTFTs: `wait`, `recompute` or `pull`.
fn best(w: Option<f64>, r: Option<f64>, p: Option<f64>) -> &'static str {
    let opts = [("wait", w), ("recompute", r), ("pull", p)];
    opts.iter()
        .filter_map(|(n, v)| Some((*n, (*v)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map_or("-", |x| x.0)
}

pub fn markdown(r: &TransferReport) -> String {
    let o = &r.options;
    let p = &r.profile;
    let mut md = String::new();
    let _ = writeln!(md, "# Transfer reference sweep: wait for the holder, recompute, or pull\n");
    let _ = writeln!(md, "- Topology: {}", r.topology);
    let _ = writeln!(
        md,
        "- Workers (one zone of one site, real time): H holds a {}-token prefix and carries n \
         background requests (unique {}-token prompts); R is idle and recomputes; P is idle and \
         pulls the prefix from H (`{KV_SOURCE_HEADER}`) over a link of {} ms RTT at the swept \
         bandwidth, {} ms setup, {} KV bytes per token",
        o.prefix_tokens, o.background_tokens, o.link_rtt_ms, o.setup_ms, o.kv_bytes_per_token
    );
    let _ = writeln!(
        md,
        "- Probe: the prefix and a {}-token suffix, {} output tokens, sent at the same instant to \
         H, R and P straight to their ports; TTFT in ms",
        o.suffix_tokens, o.output_tokens
    );
    let _ = writeln!(
        md,
        "- Prediction: kvroute's cost model (`cost::score`) with the filter's profile (prefill {} \
         ms + {} ms/token + {:e} ms/token²), H's background requests known by size; pull = \
         setup + RTT + bytes / bandwidth + the suffix's prefill on the pulled prefix",
        p.prefill_base_ms, p.prefill_ms_per_token, p.prefill_ms_per_token_sq
    );
    let err = relative_error(r.measured_bandwidth_crossover, r.predicted_bandwidth_crossover);
    let _ = writeln!(
        md,
        "- **Bandwidth crossover** (pull beats recompute above it, n = 0): predicted {} Gb/s, \
         measured {} Gb/s{}\n",
        one(r.predicted_bandwidth_crossover),
        one(r.measured_bandwidth_crossover),
        err.map(|e| format!(" ({:.0} % apart)", e * 100.0)).unwrap_or_default()
    );
    md.push_str(
        "| Gb/s | predicted pull (ms) | queue crossover n, predicted | measured | apart | \
         pull from a busy H minus from an idle H (ms) |\n",
    );
    md.push_str("|---:|---:|---:|---:|---:|---:|\n");
    for row in &r.rows {
        let e = relative_error(row.measured_queue_crossover, row.predicted_queue_crossover);
        let _ = writeln!(
            md,
            "| {} | {:.0} | {} | {} | {} | {} |",
            row.bandwidth_gbps,
            row.predicted_pull_ms,
            row.predicted_queue_crossover.map_or("-".into(), |v| format!("{v:.1}")),
            row.measured_queue_crossover.map_or("-".into(), |v| format!("{v:.1}")),
            e.map_or("-".into(), |e| format!("{:.0} %", e * 100.0)),
            num(row.busy_holder_pull_extra_ms)
        );
    }
    let _ = writeln!(
        md,
        "\nPredicted recompute on R: {:.0} ms. Per cell, measured (predicted):\n",
        r.predicted_recompute_ms
    );
    md.push_str("| Gb/s | n | wait on H | recompute on R | pull to P | P cached | best |\n");
    md.push_str("|---:|---:|---:|---:|---:|---:|:-:|\n");
    for c in &r.cells {
        let pw =
            o.levels.iter().position(|l| *l == c.level).and_then(|i| r.predicted_wait_ms.get(i));
        let pp = o.predicted_pull_ms(&r.profile, c.bandwidth_gbps);
        if let Some(e) = &c.error {
            let _ = writeln!(md, "| {} | {} | failed: {e} | | | | |", c.bandwidth_gbps, c.level);
            continue;
        }
        let _ = writeln!(
            md,
            "| {} | {} | {} ({}) | {} ({:.0}) | {} ({pp:.0}) | {} | {} |",
            c.bandwidth_gbps,
            c.level,
            num(c.wait_ms),
            num(pw.copied()),
            num(c.recompute_ms),
            r.predicted_recompute_ms,
            num(c.pull_ms),
            c.pull_cached_tokens.map_or("-".into(), |v| v.to_string()),
            best(c.wait_ms, c.recompute_ms, c.pull_ms)
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictions_cross_where_the_costs_meet() {
        let o = TransferOptions::default();
        let p = Profile::default();
        // The filter's own pull cost: setup + RTT + bytes at the link's bandwidth.
        let bits = 8192.0 * 131_072.0 * 8.0;
        assert!((o.transfer_ms(10.0) - (2.0 + 0.2 + bits / 10e9 * 1000.0)).abs() < 1e-9);
        let b = o.predicted_bandwidth_crossover(&p).expect("a crossover");
        assert!((o.predicted_pull_ms(&p, b) - o.predicted_recompute_ms(&p)).abs() < 1e-6);
        assert!(o.predicted_pull_ms(&p, b * 2.0) < o.predicted_recompute_ms(&p));
        // Pulling never beats recomputing as bandwidth goes to 0.
        assert!(o.predicted_pull_ms(&p, 1e-6) > o.predicted_recompute_ms(&p));
        let pull = o.predicted_pull_ms(&p, 40.0);
        let n = o.predicted_queue_crossover(&p, 40.0).expect("a queue crossover");
        let (lo, hi) = (n.floor() as usize, n.ceil() as usize);
        assert!(o.predicted_wait_ms(&p, lo) <= pull && o.predicted_wait_ms(&p, hi) >= pull);
        // A holder with more queued work waits longer.
        assert!(o.predicted_wait_ms(&p, 4) > o.predicted_wait_ms(&p, 2));
        // Even a free link costs a pull its setup: an idle holder still wins, but barely.
        let free = o.predicted_queue_crossover(&p, 1e6).unwrap();
        assert!(free > 0.0 && free < 1.0, "{free}");
    }

    #[test]
    fn zero_crossings_interpolate() {
        assert_eq!(zero_crossing(&[(0.0, 10.0), (1.0, -10.0)]), Some(0.5));
        assert_eq!(zero_crossing(&[(0.0, -1.0), (1.0, 2.0)]), Some(0.0));
        assert_eq!(zero_crossing(&[(0.0, 1.0), (1.0, 2.0)]), None);
        assert_eq!(zero_crossing(&[]), None);
    }

    #[test]
    fn summary_finds_measured_crossovers_and_renders() {
        let o = TransferOptions {
            bandwidths_gbps: vec![10.0, 40.0],
            levels: vec![0, 4],
            ..Default::default()
        };
        let cell = |b: f64, n: usize, w: f64, r: f64, p: f64| TransferCell {
            bandwidth_gbps: b,
            level: n,
            wait_ms: Some(w),
            recompute_ms: Some(r),
            pull_ms: Some(p),
            pull_cached_tokens: Some(8192),
            error: None,
        };
        let cells = vec![
            cell(10.0, 0, 10.0, 300.0, 860.0),
            cell(10.0, 4, 300.0, 300.0, 860.0),
            cell(40.0, 0, 10.0, 300.0, 220.0),
            cell(40.0, 4, 330.0, 300.0, 220.0),
        ];
        let r = summarize(&Topology::default(), &o, Profile::default(), cells);
        // recompute - pull: at 1/40 +80, at 1/10 -560: crossing at 1/b = 1/40 + 0.075*80/640.
        let b = r.measured_bandwidth_crossover.unwrap();
        assert!((1.0 / b - (0.025 + 0.075 * 80.0 / 640.0)).abs() < 1e-9, "{b}");
        let row = &r.rows[1];
        // pull - wait: +210 at 0, -110 at 4: n = 4 * 210 / 320.
        assert!((row.measured_queue_crossover.unwrap() - 2.625).abs() < 1e-9);
        assert_eq!(row.busy_holder_pull_extra_ms, Some(0.0));
        let md = markdown(&r);
        assert!(md.contains("Bandwidth crossover"), "{md}");
        assert!(md.contains("| 40 | 4 | 330"), "{md}");
        let back: TransferReport =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
