//! Simulated workers, one process each (so a test can kill one). Topology flags (`--site`,
//! `--client-rtt-ms`, `--link`, `--role`, ...; see the `kvroute_sim` crate docs) go in `args`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tokio::process::Command;

use crate::paths;
use crate::process::Guard;

/// A running simulated worker.
pub struct SimWorker {
    pub guard: Guard,
    /// HTTP `ip:port`.
    pub addr: String,
    pub events_port: u16,
    pub replay_port: u16,
    pub admin_port: u16,
}

/// The value after `key` in the sim's start-up line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let mut words = line.split_whitespace();
    words.find(|w| *w == key)?;
    words.next()
}

impl SimWorker {
    /// Starts one worker on free loopback ports with extra `args`.
    pub async fn start(index: usize, args: &[String], dir: &Path) -> anyhow::Result<SimWorker> {
        let mut cmd = Command::new(paths::sim_bin()?);
        cmd.args(["--workers", "1", "--base-port", "0"]).args(args);
        let mut guard =
            Guard::spawn(&format!("sim-{index}"), cmd, &dir.join(format!("sim-{index}.log")))?;
        let line = guard.wait_line("listening on", Duration::from_secs(30)).await?;
        let port = |k: &str| -> anyhow::Result<u16> {
            field(&line, k)
                .and_then(|p| p.parse().ok())
                .with_context(|| format!("no {k} port in '{line}'"))
        };
        Ok(SimWorker {
            addr: field(&line, "on").context("no address in sim output")?.to_owned(),
            events_port: port("events")?,
            replay_port: port("replay")?,
            admin_port: port("admin")?,
            guard,
        })
    }

    /// The KV-event batches the worker published from sequence `from` on, still in its
    /// replay buffer (`GET /admin/events`): `[{"seq", "batch": [ts, [event...], rank]}]`.
    pub async fn kv_events(&self, from: u64) -> anyhow::Result<serde_json::Value> {
        let url = format!("http://127.0.0.1:{}/admin/events?from={from}", self.admin_port);
        let resp = reqwest::get(url).await?;
        anyhow::ensure!(resp.status().is_success(), "admin events: {}", resp.status());
        Ok(resp.json().await?)
    }

    /// A metric's value on the worker's `/metrics` (its first sample; `None` when absent).
    pub async fn metric(&self, name: &str) -> anyhow::Result<Option<f64>> {
        let text = reqwest::get(format!("http://{}/metrics", self.addr)).await?.text().await?;
        let prefix = format!("{name}{{");
        Ok(text
            .lines()
            .find(|l| l.starts_with(&prefix) || l.split_whitespace().next() == Some(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok()))
    }

    /// Waits (at most 20 s) until the worker's engine queue holds at least `n` requests
    /// (`vllm:num_requests_waiting`).
    pub async fn until_waiting(&self, n: u64) -> anyhow::Result<()> {
        let queued = || async {
            let w = self.metric("vllm:num_requests_waiting").await.ok()??;
            (w >= n as f64).then_some(())
        };
        let what = format!("{n} requests waiting on {}", self.addr);
        crate::eventually(&what, Duration::from_secs(20), queued).await
    }

    /// POSTs to the worker's fault endpoint, e.g. `evict?percent=50`.
    pub async fn admin(
        &self,
        path_and_query: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<serde_json::Value> {
        let url = format!("http://127.0.0.1:{}/admin/{path_and_query}", self.admin_port);
        let http = reqwest::Client::new();
        let req = match body {
            Some(b) => http.post(url).json(&b),
            None => http.post(url),
        };
        let resp = req.send().await?;
        let status = resp.status();
        let v: serde_json::Value = resp.json().await?;
        anyhow::ensure!(status.is_success(), "admin {path_and_query}: {status} {v}");
        Ok(v)
    }
}
