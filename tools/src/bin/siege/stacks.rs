//! The stacks the attacks run against: the release stack (three simulated workers, Envoy with
//! the filter and the shipped bootstrap, the updater), with what one attack needs changed,
//! and the updater started by the bench itself under real limits (`prlimit`) where an attack
//! targets it.

use std::time::Duration;

use anyhow::Context;
use kvroute_stack::eventually;
use kvroute_stack::process::Guard;
use kvroute_stack::siege::updater::{peak_rss_kb, start_limited, ChildLimits, ZmtpPublisher};
use kvroute_stack::stack::{Stack, StackOptions, UPDATER_TOKEN};
use serde_json::{json, Value};

/// The release stack: 3 workers, Envoy (2 threads) with the filter, the updater.
pub fn release() -> StackOptions {
    StackOptions { workers: 3, updater: true, ..Default::default() }
}

/// The release stack with workers that take 20 ms a step, so that streams are in flight
/// whenever an attack lands, and the health configuration of the `health` tests (a per-try
/// first-byte timeout of 1.5–3 s for these short prompts).
pub fn streaming() -> StackOptions {
    StackOptions {
        sim_args: ["--step-floor-ms", "20"].map(String::from).to_vec(),
        filter: json!({"health": {
            "base_backoff_ms": 1000,
            "max_backoff_ms": 4000,
            "first_byte_timeout": {"factor": 4.0, "margin_ms": 500, "min_ms": 1500, "max_ms": 3000}
        }}),
        ..release()
    }
}

/// The per-try timeout's upper bound in [`streaming`] stacks.
pub const PER_TRY_MAX: Duration = Duration::from_millis(3_000);

/// Starts a stack, trying once more when the first start fails (the harness picks free ports
/// by binding and releasing them, so another process on the machine can take one in between:
/// a start-up failure, not an attack's result).
pub async fn start(opts: StackOptions) -> anyhow::Result<Stack> {
    match Stack::start(opts.clone()).await {
        Ok(s) => Ok(s),
        Err(e) => {
            eprintln!("    the stack did not start ({e:#}); once more");
            Stack::start(opts).await
        }
    }
}

/// Peak resident memory (kB) of Envoy and of `updater` (the stack's own when `None`).
pub fn peaks(stack: &Stack, updater: Option<&Guard>) -> (Option<u64>, Option<u64>) {
    let envoy = stack.envoy.guard.pid().and_then(peak_rss_kb);
    let updater = updater.or(stack.updater.as_ref().map(|u| &u.guard));
    (envoy, updater.and_then(Guard::pid).and_then(peak_rss_kb))
}

/// An updater the bench starts for a stack started without one (`updater: false`), on the
/// port Envoy's singleton polls, following the stack's workers; worker 0's KV events come
/// from `publisher` instead of the worker when given.
pub struct LimitedUpdater {
    pub guard: Guard,
    pub port: u16,
    /// The name (HTTP address) of the worker whose events `publisher` sends.
    pub published: String,
    pub dir: std::path::PathBuf,
}

impl LimitedUpdater {
    pub async fn start(
        stack: &Stack,
        publisher: Option<&ZmtpPublisher>,
        limits: ChildLimits,
    ) -> anyhow::Result<LimitedUpdater> {
        let port = stack.updater_port;
        let mut args: Vec<String> = vec![
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--token".into(),
            UPDATER_TOKEN.into(),
            "--align-interval-ms".into(),
            "300".into(),
            "--envoy-admin".into(),
            format!("http://127.0.0.1:{}", stack.envoy.admin_port),
        ];
        for (i, w) in stack.workers.iter().enumerate() {
            args.push("--worker".into());
            args.push(match (i, publisher) {
                (0, Some(p)) => format!("{},{}", w.addr, p.endpoint()),
                _ => format!(
                    "{},tcp://127.0.0.1:{},tcp://127.0.0.1:{}",
                    w.addr, w.events_port, w.replay_port
                ),
            });
        }
        let dir = stack.dir.join("siege-updater");
        std::fs::create_dir_all(&dir)?;
        let guard = start_limited(&args, limits, &dir).await?;
        let published = stack.workers.first().context("a stack without workers")?.addr.clone();
        Ok(LimitedUpdater { guard, port, published, dir })
    }

    /// `/status`, within 5 s.
    pub async fn status(&self) -> Option<Value> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().ok()?;
        let url = format!("http://127.0.0.1:{}/status", self.port);
        http.get(url).send().await.ok()?.json().await.ok()
    }

    /// The published worker's entry of `/status`.
    pub async fn published_worker(&self) -> Option<Value> {
        Some(self.status().await?["workers"][&self.published].clone())
    }

    /// Waits until the published worker is subscribed and aligned; its block size.
    pub async fn wait_subscribed(&self, publisher: &ZmtpPublisher) -> anyhow::Result<u32> {
        let bs = eventually(
            "the published worker aligned and subscribed",
            Duration::from_secs(30),
            || async {
                let w = self.published_worker().await?;
                (publisher.subscribers() > 0 && w["connected"] == true && w["member"] == true)
                    .then(|| w["block_size"].as_u64())
                    .flatten()
            },
        )
        .await?;
        Ok(u32::try_from(bs)?)
    }

    /// Waits until the published worker's next expected sequence number is `seq` (every batch
    /// before it applied or refused).
    pub async fn wait_seq(&self, seq: u64, what: &str, timeout: Duration) -> anyhow::Result<()> {
        eventually(what, timeout, || async {
            let w = self.published_worker().await?;
            (w["next_seq"].as_u64() == Some(seq)).then_some(())
        })
        .await
    }

    /// Lines of the updater's log that contain `needle`.
    pub fn log_lines(&self, needle: &str) -> usize {
        let text = std::fs::read_to_string(self.dir.join("updater.log")).unwrap_or_default();
        text.lines().filter(|l| l.contains(needle)).count()
    }
}

/// Waits until every Envoy worker thread routes with knowledge (bundles built, snapshot in).
pub async fn ready(stack: &Stack) -> anyhow::Result<()> {
    stack.envoy.wait_threads_ready(true, Duration::from_secs(120)).await
}
