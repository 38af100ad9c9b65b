//! The three reference cases, measured: worker A busy and holding all of a long prefix, B idle
//! and holding none of it, C moderately loaded and holding half. A sweep over A's load (`n`
//! background requests) shows where each policy sends a probe request (the prefix and a short
//! suffix), what TTFT it got, what every worker's what-if TTFT was just before, and where the
//! best worker stops being A, measured (the what-if best) and as kvroute's cost model predicts.
//!
//! Every cell (one level of load, one policy) runs on a fresh cluster. The state is built by
//! requests sent straight to the workers' own HTTP ports, bypassing Envoy: token-id prompts to
//! `/v1/completions`, so nothing spends CPU tokenizing. kvroute learns the cached prefix from the
//! workers' KV events through the updater (the cell waits until Envoy holds that knowledge); the
//! probe goes out as soon as the workers report the background load on `/metrics`. Background
//! requests have unique prompts: their prefill is the queued work the probe waits behind on a
//! busy worker. Every request of the scenario proper has the same output budget; the warm-up
//! requests that fill the caches generate one token.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use plotters::prelude::*;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::cluster::{Cluster, Policy};
use crate::record::Slo;
use crate::schedule::{completions_body, Scheduled, COMPLETIONS};
use crate::send::{send, SendCtx};
use crate::topology::Topology;
use crate::whatif::{self, WhatIfReply};
use kvroute_core::decision::cost::{self, Candidate, Profile};
use kvroute_core::decision::load::WorkerLoad;
use kvroute_core::decision::worker::WorkerName;

/// The workers' roles, in topology order.
pub const ROLES: [&str; 3] = ["A", "B", "C"];
/// What each role is.
pub const ROLE_DESCRIPTIONS: [&str; 3] =
    ["busy, holds the whole prefix", "idle, holds none of it", "moderately loaded, holds half"];
/// The levels of A's load a sweep visits by default.
pub const DEFAULT_LEVELS: [usize; 7] = [0, 1, 2, 4, 8, 16, 32];
/// The simulated workers' KV block size (every built-in profile's).
pub const BLOCK_SIZE: u32 = 16;
/// The largest `n` the model's crossover is looked for at.
const MAX_MODEL_LEVEL: usize = 1_000_000;
/// How long before the probe the what-if questions leave.
const HEAD_START: Duration = Duration::from_millis(3);
/// Token ids the prompts are drawn from (inside the demo model's vocabulary).
const TOKEN_IDS: std::ops::Range<u32> = 10..1700;

/// The scenario's sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceOptions {
    /// The shared prefix (tokens; a multiple of the block size).
    pub prefix_tokens: usize,
    /// The probe's own tokens after the prefix.
    pub suffix_tokens: usize,
    /// Share of the prefix C holds.
    pub c_share: f64,
    /// Prompt of each background request (unique, so all of it is prefill work).
    pub background_tokens: usize,
    /// Background requests on C (A gets the sweep's level).
    pub c_load: usize,
    /// Output budget of every request of the scenario (background and probe).
    pub output_tokens: u64,
    /// Seeds every prompt.
    pub seed: u64,
    /// Bound on each wait (the updater learning the prefix, the load showing, the probe).
    pub timeout: Duration,
}

impl Default for ReferenceOptions {
    fn default() -> Self {
        ReferenceOptions {
            prefix_tokens: 8192,
            suffix_tokens: 32,
            c_share: 0.5,
            background_tokens: 2048,
            c_load: 2,
            output_tokens: 128,
            seed: 7,
            timeout: Duration::from_secs(60),
        }
    }
}

/// One probe: one level of A's load, one policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// Background requests on A.
    pub level: usize,
    pub policy: String,
    /// The worker that served the probe (index into [`ROLES`]).
    pub chosen: Option<usize>,
    /// The probe's TTFT (engine ms).
    pub ttft_ms: Option<f64>,
    /// Prompt tokens the serving worker reused.
    pub cached_tokens: Option<u64>,
    /// kvroute's estimate for the worker it chose (kvroute policies only).
    pub predicted_ttft_ms: Option<f64>,
    /// Every worker's answer to the probe's what-if, asked a few ms before it was sent (the
    /// oracle's TTFTs: the answers it routed on).
    pub whatif: Vec<Option<WhatIfReply>>,
    /// The what-if best worker.
    pub best: Option<usize>,
    /// The chosen worker's what-if TTFT minus the best one (ms).
    pub regret_ms: Option<f64>,
    /// kvroute's cost model per worker (ms) on the load the workers reported in their what-if
    /// answers and the blocks they hold: what the filter would estimate knowing everything.
    pub model_ms: Vec<f64>,
    /// Why the probe failed, if it did.
    pub error: Option<String>,
}

impl Cell {
    fn whatif_ms(&self) -> Vec<Option<f64>> {
        self.whatif.iter().map(|w| w.map(|w| w.ttft_ms)).collect()
    }
}

/// The best worker at one level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelBest {
    pub level: usize,
    /// Each worker's what-if TTFT, the mean over the level's cells (engine ms).
    pub whatif_ms: Vec<Option<f64>>,
    /// The lowest of them.
    pub best: Option<usize>,
    /// kvroute's cost model per worker on the load the workers reported, the mean over the
    /// level's cells (ms).
    pub model_ms: Vec<f64>,
    /// The lowest of them: what kvroute would choose knowing that load.
    pub model_best: Option<usize>,
}

/// The sweep's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceReport {
    pub topology: String,
    pub options: ReferenceOptions,
    /// The filter's timing profile, as configured for this topology.
    pub profile: Profile,
    pub policies: Vec<String>,
    pub levels: Vec<usize>,
    pub cells: Vec<Cell>,
    pub best: Vec<LevelBest>,
    /// The smallest `n` at which kvroute's cost model stops preferring A, with A reporting its
    /// `n` background requests running (as once they are admitted) and C its own; `None`: not
    /// below [`MAX_MODEL_LEVEL`].
    pub predicted_crossover: Option<usize>,
    /// The same with A reporting all `n` waiting (the most a worker's queue can tell the model:
    /// a waiting request counts a prefill's base cost, whatever its size).
    pub predicted_crossover_queued: Option<usize>,
    /// The smallest level at which the model, on the load the workers actually reported at the
    /// probe, stops preferring A; `None`: not in the sweep.
    pub model_crossover_observed: Option<usize>,
    /// The smallest level at which the what-if best is not A; `None`: A stays best.
    pub measured_crossover: Option<usize>,
}

impl ReferenceReport {
    pub fn cell(&self, level: usize, policy: &str) -> Option<&Cell> {
        self.cells.iter().find(|c| c.level == level && c.policy == policy)
    }
}

/// The filter's profile for `topo`, as [`Cluster`] configures it (its own prior, never the
/// simulator's numbers).
pub fn filter_profile(topo: &Topology) -> Profile {
    topo.filter.profile()
}

/// kvroute's estimates for the three workers: `cached` prompt tokens each holds, `load` each
/// reports (`running`, `waiting`); the filter's own accounting is empty (the state was built
/// around Envoy), so every waiting request is one it did not send, costed as a typical request
/// of the filter's: the probe's size, the only traffic it routes in the sweep.
pub fn model_estimates(
    profile: &Profile,
    prompt_tokens: u64,
    cached: &[u64],
    load: &[(u32, u32)],
) -> Vec<f64> {
    cached
        .iter()
        .zip(load)
        .enumerate()
        .map(|(i, (c, (running, waiting)))| {
            let reported = kvroute_core::wire::snapshot::SnapshotLoad {
                running: *running,
                waiting: *waiting,
                observed_at_ms: 0,
            };
            let candidate = Candidate::<WorkerName> {
                worker: ROLES.get(i).copied().unwrap_or("?").into(),
                cached_blocks: (*c / u64::from(BLOCK_SIZE)) as usize,
                offloaded_blocks: 0,
                load: kvroute_core::decision::router::combine_load(
                    WorkerLoad::default(),
                    Some(&reported),
                    prompt_tokens,
                ),
                adapter_missing: false,
                deviation: 1.0,
            };
            cost::score(profile, &candidate, prompt_tokens, BLOCK_SIZE).ttft_ms
        })
        .collect()
}

/// The index of the lowest estimate (ties: the lowest index).
fn argmin(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x < v[best] {
            best = i;
        }
    }
    best
}

impl ReferenceOptions {
    fn probe_tokens(&self) -> u64 {
        (self.prefix_tokens + self.suffix_tokens) as u64
    }

    /// Tokens of the prefix C holds (whole blocks).
    fn c_tokens(&self) -> usize {
        let bs = BLOCK_SIZE as usize;
        ((self.prefix_tokens as f64 * self.c_share.clamp(0.0, 1.0)) as usize) / bs * bs
    }

    /// What the model sees at level `n`: cached tokens and reported load per worker, every
    /// background request reported waiting (`queued`) or running.
    fn model_view(&self, n: usize, queued: bool) -> (Vec<u64>, Vec<(u32, u32)>) {
        let cached = vec![self.prefix_tokens as u64, 0, self.c_tokens() as u64];
        let split = |k: usize| if queued { (0, k as u32) } else { (k as u32, 0) };
        let load = vec![split(n), (0, 0), split(self.c_load)];
        (cached, load)
    }

    /// The cost model's choice at level `n`.
    fn model_choice(&self, profile: &Profile, n: usize, queued: bool) -> usize {
        let (cached, load) = self.model_view(n, queued);
        argmin(&model_estimates(profile, self.probe_tokens(), &cached, &load))
    }
}

/// The smallest `n` at which the cost model stops preferring A, every background request
/// reported waiting (`queued`) or running; `None` below [`MAX_MODEL_LEVEL`].
pub fn predicted_crossover(
    profile: &Profile,
    opts: &ReferenceOptions,
    queued: bool,
) -> Option<usize> {
    let prefers_a = |n| opts.model_choice(profile, n, queued) == 0;
    if prefers_a(MAX_MODEL_LEVEL) {
        return None;
    }
    if !prefers_a(0) {
        return Some(0);
    }
    // The estimate for A grows with n and the others' do not: bisect.
    let (mut lo, mut hi) = (0usize, MAX_MODEL_LEVEL);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if prefers_a(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(hi)
}

/// `len` token ids from `rng`.
fn ids(rng: &mut rand::rngs::StdRng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.random_range(TOKEN_IDS)).collect()
}

/// Runs the sweep: for every level of `levels` and every policy of `policies`, a fresh
/// three-worker cluster (`topo`'s simulated workers, its count replaced by 3), the state built,
/// one probe. Writes `reference.md`, `reference.json` and `reference.svg` into `out_dir`.
pub async fn run(
    topo: &Topology,
    policies: &[Policy],
    levels: &[usize],
    out_dir: &Path,
    opts: &ReferenceOptions,
) -> anyhow::Result<ReferenceReport> {
    anyhow::ensure!(topo.workers.external.is_empty(), "the reference cases need simulated workers");
    anyhow::ensure!(
        opts.prefix_tokens > 0 && opts.prefix_tokens % BLOCK_SIZE as usize == 0,
        "prefix_tokens must be a positive multiple of {BLOCK_SIZE}"
    );
    anyhow::ensure!(opts.suffix_tokens > 0 && opts.background_tokens > 0, "empty prompts");
    let mut topo = topo.clone();
    topo.workers.count = ROLES.len();
    let profile = filter_profile(&topo);
    let mut cells = Vec::new();
    for &level in levels {
        for &policy in policies {
            let cell = run_cell(&topo, policy, level, opts, &profile)
                .await
                .with_context(|| format!("reference case n={level}, {}", policy.name()))?;
            cells.push(cell);
        }
    }
    let report = summarize(&topo, policies, levels, opts, profile, cells);
    std::fs::create_dir_all(out_dir)?;
    std::fs::write(out_dir.join("reference.md"), markdown(&report))?;
    std::fs::write(out_dir.join("reference.json"), serde_json::to_string_pretty(&report)?)?;
    std::fs::write(out_dir.join("reference.svg"), plot(&report)?)?;
    Ok(report)
}

/// The report from measured cells (the crossovers and each level's best).
pub fn summarize(
    topo: &Topology,
    policies: &[Policy],
    levels: &[usize],
    opts: &ReferenceOptions,
    profile: Profile,
    cells: Vec<Cell>,
) -> ReferenceReport {
    let best: Vec<LevelBest> = levels
        .iter()
        .map(|&level| {
            let here: Vec<&Cell> = cells.iter().filter(|c| c.level == level).collect();
            let mean =
                |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
            let whatif_ms: Vec<Option<f64>> = (0..ROLES.len())
                .map(|w| {
                    mean(
                        here.iter()
                            .filter_map(|c| c.whatif_ms().get(w).copied().flatten())
                            .collect(),
                    )
                })
                .collect();
            let model: Vec<Option<f64>> = (0..ROLES.len())
                .map(|w| mean(here.iter().filter_map(|c| c.model_ms.get(w).copied()).collect()))
                .collect();
            LevelBest {
                level,
                best: whatif::best(&whatif_ms),
                whatif_ms,
                model_best: whatif::best(&model),
                model_ms: model.iter().flatten().copied().collect(),
            }
        })
        .collect();
    let past_a = |b: &Option<usize>| b.is_some_and(|w| w != 0);
    let measured_crossover = best.iter().find(|b| past_a(&b.best)).map(|b| b.level);
    let model_crossover_observed = best.iter().find(|b| past_a(&b.model_best)).map(|b| b.level);
    ReferenceReport {
        topology: topo.describe(),
        options: opts.clone(),
        predicted_crossover: predicted_crossover(&profile, opts, false),
        predicted_crossover_queued: predicted_crossover(&profile, opts, true),
        model_crossover_observed,
        profile,
        policies: policies.iter().map(|p| p.name().to_owned()).collect(),
        levels: levels.to_vec(),
        cells,
        best,
        measured_crossover,
    }
}

/// `POST` a non-streaming completion straight to a worker and wait for it.
async fn complete(http: &reqwest::Client, worker: &str, body: &Value) -> anyhow::Result<()> {
    let resp = http
        .post(format!("http://{worker}{COMPLETIONS}"))
        .json(body)
        .send()
        .await
        .with_context(|| format!("warming {worker}"))?;
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    anyhow::ensure!(status.is_success(), "warming {worker}: {status} {text}");
    Ok(())
}

/// A streaming request straight to a worker, read to its end (or until aborted).
fn background(http: &reqwest::Client, worker: &str, body: Value) -> tokio::task::JoinHandle<()> {
    let req = http.post(format!("http://{worker}{COMPLETIONS}")).json(&body);
    tokio::spawn(async move {
        if let Ok(mut resp) = req.send().await {
            while let Ok(Some(_)) = resp.chunk().await {}
        }
    })
}

/// Aborts the background requests when the cell ends, however it ends.
struct Background(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Background {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

/// Polls `check` every 10 ms (the probe's timing matters) until it returns `Some`.
async fn until<T, F, Fut>(what: &str, timeout: Duration, check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    kvroute_stack::eventually_every(what, timeout, Duration::from_millis(10), check).await
}

/// Whether the policy's updater follows the workers' KV events.
fn learns_from_events(policy: Policy) -> bool {
    policy.events()
}

/// Waits until the updater knows A's and C's prefix blocks and every Envoy holds that snapshot.
async fn wait_for_knowledge(
    cluster: &Cluster,
    addrs: &[String],
    blocks: [usize; 2],
    timeout: Duration,
) -> anyhow::Result<()> {
    let Some(updater) = cluster.updater.as_ref() else { return Ok(()) };
    let gpu = |s: &Value, w: &str| s["workers"][w]["blocks"]["GPU"].as_u64().unwrap_or(0) as usize;
    let version = until("the updater to learn the warm-up from KV events", timeout, || async {
        let s = updater.status().await.ok()?;
        (gpu(&s, &addrs[0]) >= blocks[0] && gpu(&s, &addrs[2]) >= blocks[1])
            .then(|| s["version"].as_f64().unwrap_or(0.0))
    })
    .await?;
    for e in &cluster.envoys {
        until("Envoy to hold the updater's snapshot", timeout, || async {
            e.prometheus()
                .await
                .ok()
                .and_then(|m| m.get("kvroute_sync_snapshot_version").copied())
                .filter(|v| *v >= version)
        })
        .await?;
    }
    Ok(())
}

async fn run_cell(
    topo: &Topology,
    policy: Policy,
    level: usize,
    opts: &ReferenceOptions,
    profile: &Profile,
) -> anyhow::Result<Cell> {
    let cluster = Cluster::start(topo, policy, &[]).await?;
    let addrs = cluster.addrs();
    let model = topo.workers.model.name();
    let http = reqwest::Client::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let prefix = ids(&mut rng, opts.prefix_tokens);
    let suffix = ids(&mut rng, opts.suffix_tokens);
    let half = opts.c_tokens();
    // The caches: the whole prefix on A, half of it on C.
    let warm = |p: &[u32]| json!({"model": model, "prompt": p, "max_tokens": 1});
    let (warm_a, warm_c) = (warm(&prefix), warm(&prefix[..half]));
    let (a, c) = tokio::join!(complete(&http, &addrs[0], &warm_a), async {
        if half == 0 {
            return Ok(());
        }
        complete(&http, &addrs[2], &warm_c).await
    });
    a?;
    c?;
    if learns_from_events(policy) {
        let bs = BLOCK_SIZE as usize;
        wait_for_knowledge(&cluster, &addrs, [opts.prefix_tokens / bs, half / bs], opts.timeout)
            .await?;
    }
    // The load: `level` background requests on A, a fixed few on C, each with its own prompt.
    let mut bg = Background(Vec::new());
    for (w, n) in [(0, level), (2, opts.c_load)] {
        for _ in 0..n {
            let body =
                completions_body(model, &ids(&mut rng, opts.background_tokens), opts.output_tokens);
            bg.0.push(background(&http, &addrs[w], body));
        }
    }
    let quick = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
    until("the workers to report the background load", opts.timeout, || async {
        for (w, n) in [(0, level), (2, opts.c_load)] {
            let (r, wt) = crate::runner::scrape_queue(&quick, &addrs[w]).await?;
            if ((r + wt) as usize) < n {
                return None;
            }
        }
        Some(())
    })
    .await?;
    // The probe, through the policy's Envoy.
    let mut prompt = prefix.clone();
    prompt.extend_from_slice(&suffix);
    let body = completions_body(model, &prompt, opts.output_tokens);
    let s = Scheduled {
        at: Duration::ZERO,
        endpoint: COMPLETIONS,
        body: body.clone(),
        output_tokens: opts.output_tokens,
        cohorts: vec!["probe".into()],
    };
    let ctx = SendCtx {
        policy,
        workers: addrs.clone(),
        whatif_sample: 0.0,
        speedup: topo.workers.speedup,
        slo: Slo { ttft_ms: f64::INFINITY, mean_gap_ms: f64::INFINITY, stall_ms: f64::INFINITY },
        timeout: opts.timeout,
    };
    let url = cluster.urls().into_iter().next().context("no Envoy")?;
    // Every worker's what-if leaves just before the probe, so the questions reach the workers
    // first (a question that came after the probe would count it in its worker's queue) and
    // the answers count from (nearly) the probe's departure.
    let (asked, rec) = tokio::join!(whatif::ask_all(&http, &addrs, COMPLETIONS, &body), async {
        tokio::time::sleep(HEAD_START).await;
        send(&http, &url, 0, &s, &ctx).await
    });
    drop(bg);
    // The oracle's answers are the ones it routed on (asked at the same instant).
    let whatif: Vec<Option<WhatIfReply>> = if rec.whatif_ms.is_empty() {
        asked
    } else {
        asked
            .iter()
            .zip(&rec.whatif_ms)
            .map(|(a, t)| Some(WhatIfReply { ttft_ms: (*t)?, ..(*a)? }))
            .collect()
    };
    let whatif_ms: Vec<Option<f64>> = whatif.iter().map(|w| w.map(|w| w.ttft_ms)).collect();
    let chosen = rec.worker.as_deref().and_then(|w| whatif::index_of(&addrs, w));
    let (cached, load): (Vec<u64>, Vec<(u32, u32)>) = if whatif.iter().all(Option::is_some) {
        whatif.iter().flatten().map(|w| (w.cached_tokens, (w.running, w.waiting))).unzip()
    } else {
        opts.model_view(level, false)
    };
    Ok(Cell {
        level,
        policy: policy.name().into(),
        chosen,
        ttft_ms: rec.ttft_ms,
        cached_tokens: rec.cached_tokens,
        predicted_ttft_ms: rec.predicted_ttft_ms,
        best: whatif::best(&whatif_ms),
        regret_ms: chosen.and_then(|c| whatif::regret(&whatif_ms, c)),
        model_ms: model_estimates(profile, opts.probe_tokens(), &cached, &load),
        whatif,
        error: rec.error,
    })
}

fn role(w: Option<usize>) -> &'static str {
    w.and_then(|w| ROLES.get(w).copied()).unwrap_or("-")
}

fn num(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0}"))
}

fn crossover_text(c: Option<usize>, beyond: &str) -> String {
    c.map_or(beyond.to_owned(), |n| format!("n = {n}"))
}

/// The report in Markdown: the scenario, both crossovers, one table row per level.
pub fn markdown(r: &ReferenceReport) -> String {
    let o = &r.options;
    let mut md = String::new();
    let _ =
        writeln!(md, "# Reference cases: busy with the prefix, idle without, moderate with half\n");
    let _ = writeln!(md, "- Topology: {}", r.topology);
    let _ = writeln!(
        md,
        "- Probe: a {}-token prefix and a {}-token suffix (token ids to `/v1/completions`), \
         {} output tokens; every background request: a unique {}-token prompt, the same output budget",
        o.prefix_tokens, o.suffix_tokens, o.output_tokens, o.background_tokens
    );
    for (i, (name, what)) in ROLES.iter().zip(ROLE_DESCRIPTIONS).enumerate() {
        let detail = match i {
            0 => format!("{} prefix tokens, n background requests", o.prefix_tokens),
            1 => "nothing cached, no load".to_owned(),
            _ => format!("{} prefix tokens, {} background requests", o.c_tokens(), o.c_load),
        };
        let _ = writeln!(md, "- Worker {name}: {what} ({detail})");
    }
    let never = format!("none up to n = {MAX_MODEL_LEVEL}");
    let _ = writeln!(
        md,
        "- Crossover, measured (the what-if best stops being A): {}",
        crossover_text(r.measured_crossover, "none in the sweep")
    );
    let _ = writeln!(
        md,
        "- Crossover, kvroute's cost model (prefill {} ms + {} ms/token + {:e} ms/token², {} ms \
         per decoding request; it knows each worker's cached prefix and reported queue, not the \
         size of requests it did not route): on the queues reported at the probe {}; with A's \
         n background requests all reported running {}; all reported waiting {}",
        r.profile.prefill_base_ms,
        r.profile.prefill_ms_per_token,
        r.profile.prefill_ms_per_token_sq,
        r.profile.decode_interference_ms,
        crossover_text(r.model_crossover_observed, "none in the sweep"),
        crossover_text(r.predicted_crossover, &never),
        crossover_text(r.predicted_crossover_queued, &never),
    );
    let _ = writeln!(
        md,
        "- TTFTs in engine ms. What-if: each worker's forward simulation of the probe, asked as \
         it was sent (means over the level's cells). Regret: the chosen worker's what-if TTFT \
         minus the best one's. Model: kvroute's estimate per worker on the queue each reported \
         then (the filter itself may hold an older scrape).\n"
    );
    let _ = write!(md, "| n | what-if A / B / C (ms) | best | model A / B / C (ms) |");
    for p in &r.policies {
        let _ = write!(md, " {p}: worker, TTFT, regret |");
    }
    md.push('\n');
    md.push_str("|---:|---|:-:|---|");
    for _ in &r.policies {
        md.push_str("---|");
    }
    md.push('\n');
    for b in &r.best {
        let whatifs: Vec<String> = b.whatif_ms.iter().map(|v| num(*v)).collect();
        let model: Vec<String> = b.model_ms.iter().map(|v| format!("{v:.0}")).collect();
        let _ = write!(
            md,
            "| {} | {} | {} | {} |",
            b.level,
            whatifs.join(" / "),
            role(b.best),
            model.join(" / ")
        );
        for p in &r.policies {
            match r.cell(b.level, p) {
                Some(c) if c.error.is_none() => {
                    let _ = write!(
                        md,
                        " {}, {}, {} |",
                        role(c.chosen),
                        num(c.ttft_ms),
                        num(c.regret_ms)
                    );
                }
                Some(c) => {
                    let _ = write!(md, " failed: {} |", c.error.as_deref().unwrap_or(""));
                }
                None => md.push_str(" - |"),
            }
        }
        md.push('\n');
    }
    md
}

/// The position of `n` on the plot's x axis (level `i` at `i`, in between linearly).
fn x_of(levels: &[usize], n: f64) -> Option<f64> {
    let last = levels.len().checked_sub(1)?;
    if n < levels[0] as f64 || n > levels[last] as f64 {
        return None;
    }
    for i in 0..last {
        let (a, b) = (levels[i] as f64, levels[i + 1] as f64);
        if n >= a && n <= b {
            return Some(i as f64 + if b > a { (n - a) / (b - a) } else { 0.0 });
        }
    }
    Some(last as f64)
}

/// TTFT vs A's load: one line per policy (the probe's TTFT), the what-if best as a dashed
/// black line, the crossovers as vertical lines (the model's named in the caption when it is
/// beyond the sweep).
pub fn plot(r: &ReferenceReport) -> anyhow::Result<String> {
    const FONT: &str = "sans-serif";
    let levels = &r.levels;
    let n_levels = levels.len().max(1);
    let best_line: Vec<(f64, f64)> = r
        .best
        .iter()
        .enumerate()
        .filter_map(|(i, b)| Some((i as f64, b.whatif_ms.get(b.best?).copied().flatten()?)))
        .collect();
    let lines: Vec<(&str, Vec<(f64, f64)>)> = r
        .policies
        .iter()
        .map(|p| {
            let pts = levels
                .iter()
                .enumerate()
                .filter_map(|(i, &n)| Some((i as f64, r.cell(n, p)?.ttft_ms?)))
                .collect();
            (p.as_str(), pts)
        })
        .collect();
    let y_hi = lines
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.1))
        .chain(best_line.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let y_hi = if y_hi > 0.0 { y_hi * 1.15 } else { 1.0 };
    let x_hi = (n_levels - 1).max(1) as f64;
    let off_chart = |c: Option<usize>| match c {
        Some(n) if x_of(levels, n as f64).is_some() => None,
        Some(n) => Some(n.to_string()),
        None => Some("never".to_owned()),
    };
    let notes: Vec<String> = [
        ("model crossover, all running", r.predicted_crossover),
        ("model crossover, all waiting", r.predicted_crossover_queued),
    ]
    .into_iter()
    .filter_map(|(what, c)| Some(format!("{what}: n = {}", off_chart(c)?)))
    .collect();
    let title = if notes.is_empty() {
        "Probe TTFT vs A's load".to_owned()
    } else {
        format!("Probe TTFT vs A's load (off the chart: {})", notes.join("; "))
    };
    let labels = levels.clone();
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (900, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.2f64..x_hi + 0.2, 0f64..y_hi)?;
        chart
            .configure_mesh()
            .x_labels(n_levels)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    labels.get(i as usize).map_or(String::new(), |n| n.to_string())
                } else {
                    String::new()
                }
            })
            .x_desc("n: background requests on A")
            .y_desc("TTFT (engine ms)")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        for (i, (policy, pts)) in lines.iter().enumerate() {
            let c = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
                .label(*policy)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))?;
        }
        chart
            .draw_series(DashedLineSeries::new(best_line.clone(), 6, 4, BLACK.stroke_width(2)))?
            .label("what-if best")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        let mut mark = |n: Option<usize>, label: &str, color: RGBColor| -> anyhow::Result<()> {
            if let Some(x) = n.and_then(|n| x_of(levels, n as f64)) {
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(x, 0.0), (x, y_hi)],
                        color.stroke_width(2),
                    )))?
                    .label(label.to_owned())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
            }
            Ok(())
        };
        mark(r.measured_crossover, "crossover, measured", RGBColor(200, 0, 0))?;
        mark(
            r.model_crossover_observed,
            "crossover, model on reported queues",
            RGBColor(0, 0, 200),
        )?;
        mark(r.predicted_crossover, "crossover, model, all running", RGBColor(0, 140, 200))?;
        mark(r.predicted_crossover_queued, "crossover, model, all waiting", RGBColor(120, 0, 200))?;
        crate::report::plots::legend(&mut chart, SeriesLabelPosition::UpperLeft, 13)?;
        root.present()?;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo() -> Topology {
        let mut t = Topology::default();
        t.workers.count = 3;
        t
    }

    #[test]
    fn the_filter_profile_follows_the_topology() {
        assert_eq!(filter_profile(&topo()), Profile::default());
        let mut t = topo();
        t.filter.prior_scale = 2.0;
        let p = filter_profile(&t);
        assert_eq!(p.prefill_ms_per_token, 2.0 * Profile::default().prefill_ms_per_token);
    }

    #[test]
    fn the_model_prefers_the_prefix_until_running_requests_outweigh_recompute() {
        let opts = ReferenceOptions::default();
        let p = filter_profile(&topo());
        let n = predicted_crossover(&p, &opts, false).expect("a crossover");
        assert_eq!(opts.model_choice(&p, n - 1, false), 0);
        assert_ne!(opts.model_choice(&p, n, false), 0);
        // Waiting requests weigh more (a prefill's base each): the crossover comes earlier.
        let q = predicted_crossover(&p, &opts, true).expect("a crossover");
        assert!(q < n, "{q} < {n}");
        assert_eq!(opts.model_choice(&p, q - 1, true), 0);
        assert_ne!(opts.model_choice(&p, q, true), 0);
        // Recomputing half the prefix on C against 0.5 ms per request running on A.
        let c = model_estimates(&p, opts.probe_tokens(), &[0, 0, 4096], &[(0, 0), (0, 0), (2, 0)]);
        let a = |n| {
            model_estimates(&p, opts.probe_tokens(), &[8192, 0, 0], &[(n, 0), (0, 0), (0, 0)])[0]
        };
        assert!(a(n as u32) > c[2] && a(n as u32 - 1) <= c[2]);
        // Waiting requests kvroute did not send cost a prefill's base and a typical request's
        // tokens (here the probe's 100, with their attention) each, instead of the decode
        // interference of running ones, and the worker is busy: a batch fills behind the probe.
        let w = model_estimates(&p, 100, &[0], &[(0, 4)]);
        let r = model_estimates(&p, 100, &[0], &[(4, 0)]);
        let each = p.prefill_base_ms
            + 100.0 * p.prefill_ms_per_token
            + 100.0 * 100.0 * p.prefill_ms_per_token_sq
            - p.decode_interference_ms;
        let want = 4.0 * each + p.queue_terms().batch_fill_ms;
        assert!((w[0] - r[0] - want).abs() < 1e-9, "{} vs {want}", w[0] - r[0]);
    }

    #[test]
    fn no_crossover_when_nothing_can_beat_the_prefix() {
        let opts = ReferenceOptions { c_share: 1.0, c_load: 1_000_000_000, ..Default::default() };
        let p = Profile { decode_interference_ms: 0.0, ..filter_profile(&topo()) };
        assert_eq!(predicted_crossover(&p, &opts, false), None);
    }

    fn answer(ttft_ms: f64) -> Option<WhatIfReply> {
        Some(WhatIfReply { ttft_ms, cached_tokens: 0, prompt_tokens: 8224, running: 0, waiting: 0 })
    }

    fn cell(level: usize, policy: &str, chosen: usize, whatif: [f64; 3]) -> Cell {
        let whatif: Vec<Option<WhatIfReply>> = whatif.iter().map(|t| answer(*t)).collect();
        let ms: Vec<Option<f64>> = whatif.iter().map(|w| w.map(|w| w.ttft_ms)).collect();
        Cell {
            level,
            policy: policy.into(),
            chosen: Some(chosen),
            ttft_ms: ms[chosen],
            cached_tokens: None,
            predicted_ttft_ms: None,
            best: whatif::best(&ms),
            regret_ms: whatif::regret(&ms, chosen),
            model_ms: vec![10.0, 1700.0, 900.0],
            whatif,
            error: None,
        }
    }

    fn report() -> ReferenceReport {
        let cells = vec![
            cell(0, "oracle", 0, [20.0, 1700.0, 1300.0]),
            cell(0, "kvroute", 0, [22.0, 1700.0, 1300.0]),
            cell(8, "oracle", 2, [1700.0, 1700.0, 1250.0]),
            cell(8, "kvroute", 0, [1720.0, 1700.0, 1250.0]),
        ];
        summarize(
            &topo(),
            &[Policy::Oracle, Policy::Kvroute],
            &[0, 8],
            &ReferenceOptions::default(),
            filter_profile(&topo()),
            cells,
        )
    }

    #[test]
    fn summary_finds_the_measured_crossover_and_renders() {
        let r = report();
        assert_eq!(r.measured_crossover, Some(8));
        assert_eq!(r.best[0].best, Some(0));
        assert_eq!(r.best[0].whatif_ms[0], Some(21.0), "the mean over the level's cells");
        assert_eq!(r.cell(8, "kvroute").unwrap().regret_ms, Some(470.0));
        let md = markdown(&r);
        assert!(md.contains("| 8 | 1710 / 1700 / 1250 | C |"), "{md}");
        assert!(md.contains("C, 1250, 0 |"), "{md}");
        assert!(md.contains("A, 1720, 470 |"), "{md}");
        let svg = plot(&r).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("what-if best"), "{svg}");
        assert!(svg.contains("crossover, measured"));
        let back: ReferenceReport =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn plot_positions_between_levels() {
        let l = [0, 1, 2, 4, 8];
        assert_eq!(x_of(&l, 3.0), Some(2.5));
        assert_eq!(x_of(&l, 8.0), Some(4.0));
        assert_eq!(x_of(&l, 9.0), None);
        assert_eq!(x_of(&[], 1.0), None);
        let empty =
            summarize(&topo(), &[], &[], &ReferenceOptions::default(), Profile::default(), vec![]);
        assert!(plot(&empty).is_ok());
        assert!(markdown(&empty).contains("none in the sweep"));
    }
}
