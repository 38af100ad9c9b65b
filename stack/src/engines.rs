//! Conformance with the engines' own code: a Python driver (integration/python/) plays a named
//! scenario through an engine's own KV-event publisher, imported from its pinned wheel
//! (`./dev setup` unpacks vLLM's and SGLang's sources into `.cache/engines/`), and the real
//! `kvroute-updater` follows it. The driver also writes the knowledge a correct consumer holds
//! afterwards (token chains per tier, worked out in Python from the scenario's story); the test
//! hashes those chains with kvroute's own chain hash and compares them with what the updater
//! holds: `/status` block counts per tier and the snapshot's canonical hashes.
//!
//! The worker's HTTP side (`/v1/models`, `/tokenize`, `/metrics`) is a simulated worker, so the
//! updater identifies the model and its block size as usual, or, for SGLang, an SGLang HTTP
//! surface in front of it ([`crate::sglang_face`]) that announces the page size as SGLang does;
//! only the event endpoints are the engine's publisher. Every process is killed when [`Conformance`] drops, also on failure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use kvroute_core::decision::hash::{block_hashes, CacheDomain};
use kvroute_core::wire::snapshot::Snapshot;
use serde_json::Value;

use crate::paths::{self, free_port, repo_root};
use crate::process::Guard;
use crate::sglang_face::SglangFace;
use crate::sim::SimWorker;
use crate::stack::{Updater, UPDATER_TOKEN};

/// Where `./dev setup` unpacked `engine`'s sources (`.cache/engines/<engine>`, or under
/// `$KVROUTE_ENGINES`), or `None` when it did not (then the tests skip, except in CI: with `CI`
/// set a missing engine is an error, returned as `Err`).
pub fn engine_dir(engine: &str) -> anyhow::Result<Option<PathBuf>> {
    let base = std::env::var_os("KVROUTE_ENGINES")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/engines"));
    let dir = base.join(engine);
    let python = python();
    let have = dir.join(engine).is_dir() && python.exists();
    if have {
        return Ok(Some(dir));
    }
    anyhow::ensure!(
        std::env::var_os("CI").is_none(),
        "{} or {} is missing: run ./dev setup (in CI the engine conformance tests must run)",
        dir.display(),
        python.display()
    );
    crate::paths::skipped(
        &format!("kvroute-integration engine_{engine}::*"),
        &format!("{} is absent (./dev setup fetches the engine's pinned wheel)", dir.display()),
    );
    Ok(None)
}

/// The tests' Python (`.venv`, with integration/python/requirements.txt installed).
pub fn python() -> PathBuf {
    std::env::var_os("KVROUTE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/python"))
}

/// What the driver says a correct consumer knows after the scenario.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Expected {
    /// The engine's block size in the scenario (tokens).
    pub block_size: u32,
    /// Per tier (`GPU`, `CPU`, `STORAGE`): token prefixes, each ending with one known block.
    pub tiers: BTreeMap<String, Vec<Vec<u32>>>,
    /// Blocks that must not be on the GPU tier (and may be on a lower one, or nowhere).
    #[serde(default)]
    pub not_gpu: Vec<Vec<u32>>,
    /// Blocks that must be on no tier.
    #[serde(default)]
    pub gone: Vec<Vec<u32>>,
}

/// One scenario's processes: the simulated worker's HTTP side, the driver (the engine's
/// publisher) and the updater.
pub struct Conformance {
    pub dir: PathBuf,
    pub sim: SimWorker,
    /// The worker's HTTP `ip:port` as the updater knows it: the simulated worker's, or the
    /// SGLang surface's in front of it.
    pub worker: String,
    pub driver: Guard,
    pub updater: Updater,
    go: PathBuf,
    expect: PathBuf,
}

/// How to start one scenario.
pub struct EngineScenario<'a> {
    /// `vllm` or `sglang`: `.cache/engines/<engine>`.
    pub engine: &'a str,
    /// The driver script in integration/python/.
    pub driver: &'a str,
    pub scenario: &'a str,
    /// Extra driver flags.
    pub driver_args: Vec<String>,
    /// Extra simulated-worker flags (e.g. `--block-size 16`: what the worker announces).
    pub sim_args: Vec<String>,
    /// Extra updater flags (e.g. `--block-size 16`).
    pub updater_args: Vec<String>,
    /// Announce the worker as SGLang does (`/server_info`, `sglang:page_size`) in front of the
    /// simulated worker, instead of the simulated worker's vLLM-style announcement.
    pub sglang_face: Option<SglangFace>,
}

impl Conformance {
    /// Starts the worker's HTTP side, the driver (waits for its READY) and the updater; then
    /// waits until the updater identified the worker's model and block size, and lets the
    /// driver play. `engines` is [`engine_dir`]'s directory.
    pub async fn start(engines: &Path, s: EngineScenario<'_>) -> anyhow::Result<Conformance> {
        let dir = paths::scratch_dir(&format!("{}-{}", s.engine, s.scenario))?;
        let sim = SimWorker::start(0, &s.sim_args, &dir).await?;
        let worker = match s.sglang_face.clone() {
            Some(face) => face.serve(sim.addr.clone()).await?,
            None => sim.addr.clone(),
        };
        let (events, replay) = (free_port()?, free_port()?);
        let (go, expect) = (dir.join("go"), dir.join("expect.json"));
        let script = repo_root().join("integration/python").join(s.driver);
        let mut cmd = tokio::process::Command::new(python());
        cmd.arg(&script)
            .arg("--engines")
            .arg(engines)
            .args(["--events", &events.to_string(), "--replay", &replay.to_string()])
            .args(["--scenario", s.scenario])
            .arg("--go")
            .arg(&go)
            .arg("--expect")
            .arg(&expect)
            .args(&s.driver_args)
            .env("PYTHONDONTWRITEBYTECODE", "1");
        let mut driver = Guard::spawn(s.driver, cmd, &dir.join("driver.log"))?;
        if let Err(e) = driver.wait_line("READY", Duration::from_secs(60)).await {
            let log = std::fs::read_to_string(dir.join("driver.log")).unwrap_or_default();
            anyhow::bail!("{e}\ndriver log:\n{log}");
        }
        let endpoint = format!("{worker},tcp://127.0.0.1:{events},tcp://127.0.0.1:{replay}");
        let updater =
            Updater::start_with_args(free_port()?, None, &[endpoint], &s.updater_args, &dir)
                .await?;
        let c = Conformance { dir, sim, worker: worker.clone(), driver, updater, go, expect };
        let identified = crate::eventually(
            "the updater identified the worker's model and block size and subscribed",
            Duration::from_secs(30),
            || async {
                let s = c.updater.status().await.ok()?;
                let w = &s["workers"][&worker];
                // Subscribed, and past its first catch-up from replay (which it makes once its
                // subscription had time to reach the publisher): live batches now arrive live.
                let subscribed = w["connected"] == Value::Bool(true)
                    && w["stats"]["replays"].as_u64().is_some_and(|n| n >= 1);
                (w["block_size"].as_u64().is_some()
                    && w["compatible"] == Value::Bool(true)
                    && subscribed)
                    .then_some(())
            },
        )
        .await;
        if let Err(e) = identified {
            anyhow::bail!("{e}\n{}", c.diagnostics().await);
        }
        std::fs::write(&c.go, b"go").context("writing the go file")?;
        Ok(c)
    }

    /// The driver's expectation, once it has published the scenario.
    pub async fn expected(&self) -> anyhow::Result<Expected> {
        let path = self.expect.clone();
        let found = crate::eventually("the driver's expectation", Duration::from_secs(60), || {
            let path = path.clone();
            async move { std::fs::read(&path).ok() }
        })
        .await;
        let bytes = match found {
            Ok(b) => b,
            Err(e) => anyhow::bail!("{e}\n{}", self.diagnostics().await),
        };
        serde_json::from_slice(&bytes).context("reading the driver's expectation")
    }

    /// The updater's snapshot (full).
    pub async fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let bytes = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{}/v1/snapshot", self.updater.port))
            .header("x-kvroute-token", UPDATER_TOKEN)
            .send()
            .await?
            .error_for_status()?
            .bytes()
            .await?;
        Snapshot::decode(&bytes).map_err(|e| anyhow::anyhow!("decoding the snapshot: {e}"))
    }

    /// What differs between the updater's knowledge of the worker and `want`; `None` when
    /// nothing does.
    pub async fn mismatch(&self, want: &Expected) -> anyhow::Result<Option<String>> {
        let status = self.updater.status().await?;
        let w = &status["workers"][&self.worker];
        let snap = self.snapshot().await?;
        let model = w["model"].as_str().unwrap_or_default();
        let info = snap
            .models
            .iter()
            .find(|m| m.name == model)
            .with_context(|| format!("model '{model}' not in the snapshot"))?;
        anyhow::ensure!(
            info.block_size == want.block_size,
            "the updater hashes in blocks of {}, the scenario's are {}",
            info.block_size,
            want.block_size
        );
        let seed = CacheDomain {
            model: info.name.clone(),
            tokenizer_fingerprint: info.fingerprint,
            block_size: info.block_size,
            lora_name: None,
            tenant_salt: None,
        }
        .seed();
        let hash = |prefixes: &[Vec<u32>]| -> BTreeSet<u64> {
            prefixes
                .iter()
                .filter_map(|p| block_hashes(seed, want.block_size, p).last().copied())
                .collect()
        };
        let tier = |t: &str| hash(want.tiers.get(t).map(Vec::as_slice).unwrap_or_default());
        let (gpu, cpu, storage) = (tier("GPU"), tier("CPU"), tier("STORAGE"));
        let not_gpu = hash(&want.not_gpu);
        let gone = hash(&want.gone);
        let Some(mine) = snap.workers.iter().find(|k| k.worker == self.worker) else {
            return Ok(Some("the worker is not in the snapshot".into()));
        };
        let have_gpu: BTreeSet<u64> = mine.gpu.iter().copied().collect();
        let have_off: BTreeSet<u64> = mine.offloaded.iter().copied().collect();
        let want_off: BTreeSet<u64> = cpu.union(&storage).copied().collect();
        let count = |t: &str| w["blocks"][t].as_u64().unwrap_or(0) as usize;
        let mut problems = Vec::new();
        if have_gpu != gpu {
            problems.push(format!(
                "GPU: {} expected blocks missing, {} unexpected",
                gpu.difference(&have_gpu).count(),
                have_gpu.difference(&gpu).count()
            ));
        }
        let extra_off: BTreeSet<u64> = have_off.difference(&want_off).copied().collect();
        if !want_off.is_subset(&have_off) || !extra_off.is_subset(&not_gpu) {
            problems.push(format!(
                "offloaded: {} expected blocks missing, {} unexpected",
                want_off.difference(&have_off).count(),
                extra_off.difference(&not_gpu).count()
            ));
        }
        if count("GPU") != gpu.len() {
            problems.push(format!("/status GPU count {} != {}", count("GPU"), gpu.len()));
        }
        let lower = count("CPU") + count("STORAGE");
        let lower_want = cpu.len() + storage.len();
        if count("CPU") < cpu.len()
            || count("STORAGE") < storage.len()
            || lower > lower_want + not_gpu.len()
        {
            problems.push(format!(
                "/status CPU {} STORAGE {}, expected {} and {} (+ at most {} of unknown media)",
                count("CPU"),
                count("STORAGE"),
                cpu.len(),
                storage.len(),
                not_gpu.len()
            ));
        }
        let on_gpu_wrongly = not_gpu.intersection(&have_gpu).count();
        if on_gpu_wrongly > 0 {
            problems.push(format!("{on_gpu_wrongly} blocks of an unknown medium on the GPU tier"));
        }
        let still = gone.iter().filter(|h| have_gpu.contains(h) || have_off.contains(h)).count();
        if still > 0 {
            problems.push(format!("{still} blocks that must be gone are still known"));
        }
        Ok((!problems.is_empty()).then(|| problems.join("; ")))
    }

    /// Plays the scenario to its end and waits until the updater's knowledge is the expected
    /// one; fails with what differs, the updater's status and where the logs are.
    pub async fn converges(&self) -> anyhow::Result<Expected> {
        let want = self.expected().await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let last = match self.mismatch(&want).await {
                Ok(None) => return Ok(want),
                Ok(Some(m)) => m,
                Err(e) => format!("{e:#}"),
            };
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "the updater's knowledge differs from the engine's: {last}\n{}",
                    self.diagnostics().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The updater's status for the worker and where the logs are.
    pub async fn diagnostics(&self) -> String {
        let status = match self.updater.status().await {
            Ok(s) => s["workers"][&self.worker].to_string(),
            Err(e) => e.to_string(),
        };
        let tail = crate::process::log_tail(&self.dir.join("driver.log"), 20);
        format!(
            "updater status of the worker: {status}\ndriver log (tail):\n{tail}\nlogs in {}",
            self.dir.display()
        )
    }
}

/// What a scenario came to: the expectation met and the updater's `/status` entry for the
/// worker then (its counters say how it got there: gaps, replays, resyncs...).
#[derive(Debug, Clone)]
pub struct EngineOutcome {
    pub expected: Expected,
    pub worker: Value,
}

/// Runs one scenario to convergence, or says why it was skipped (`Ok(None)`).
pub async fn run(s: EngineScenario<'_>) -> anyhow::Result<Option<EngineOutcome>> {
    let Some(engines) = engine_dir(s.engine)? else { return Ok(None) };
    let c = Conformance::start(&engines, s).await?;
    let expected = c.converges().await?;
    let status = c.updater.status().await?;
    Ok(Some(EngineOutcome { expected, worker: status["workers"][&c.worker].clone() }))
}
