//! Killed and frozen workers under steady client traffic, measured from outside: what Envoy
//! sent to the worker (its per-host counters in the admin `/clusters`), when Envoy's active
//! health check failed it, and what every client request saw (status, serving worker, time).
//! Shared by the `health` integration tests and the `kvroute-siege` bench.
//!
//! - [`kill_under_load`]: `kill -9` of one worker while streams run; counts the attempts Envoy
//!   still made to it after its health check failed (plus one interval), and the client errors
//!   of requests in flight at the kill against those sent after it.
//! - [`freeze_under_load`]: `SIGSTOP` of one worker (continued again on every path, see
//!   [`Frozen`]); counts requests sent after the freeze that waited past a bound, and those in
//!   flight at the freeze. One of them is the next turn of a conversation the worker served
//!   just before (a long prompt it holds), so that the freeze is met by at least one request.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::client;
use crate::stack::Stack;
use crate::workload::Conversation;

/// The health check interval of the shipped bootstraps (`envoy/kvroute.yaml`): "one
/// interval" of grace after the check failed.
pub const HC_INTERVAL: Duration = Duration::from_secs(1);

/// One upstream host's counters from Envoy's admin `/clusters`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCounters {
    /// Requests sent on a connection to it.
    pub rq_total: u64,
    /// Connections to it that failed (a dead worker: every attempt).
    pub cx_connect_fail: u64,
    /// Tries that timed out on it (per-try timeouts).
    pub rq_timeout: u64,
}

impl HostCounters {
    /// Attempts Envoy made to the host: requests sent plus connections refused.
    pub fn attempts(&self) -> u64 {
        self.rq_total + self.cx_connect_fail
    }

    /// Counters gained since `before`.
    pub fn since(&self, before: &HostCounters) -> HostCounters {
        HostCounters {
            rq_total: self.rq_total.saturating_sub(before.rq_total),
            cx_connect_fail: self.cx_connect_fail.saturating_sub(before.cx_connect_fail),
            rq_timeout: self.rq_timeout.saturating_sub(before.rq_timeout),
        }
    }
}

/// `worker`'s line values in a `/clusters` text (`workers::<addr>::<key>::<value>`).
pub fn host_values<'a>(clusters: &'a str, worker: &str) -> BTreeMap<&'a str, &'a str> {
    let prefix = format!("workers::{worker}::");
    clusters
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|rest| rest.split_once("::"))
        .collect()
}

async fn clusters(stack: &Stack) -> anyhow::Result<String> {
    let url = format!("{}/clusters", stack.envoy.admin_url());
    Ok(reqwest::get(url).await?.text().await?)
}

/// `worker`'s counters now.
pub async fn host_counters(stack: &Stack, worker: &str) -> anyhow::Result<HostCounters> {
    let text = clusters(stack).await?;
    let v = host_values(&text, worker);
    let n = |k: &str| -> anyhow::Result<u64> {
        v.get(k)
            .with_context(|| format!("no {k} for {worker} in /clusters"))?
            .parse()
            .map_err(|e| anyhow::anyhow!("{k} of {worker}: {e}"))
    };
    Ok(HostCounters {
        rq_total: n("rq_total")?,
        cx_connect_fail: n("cx_connect_fail")?,
        rq_timeout: n("rq_timeout")?,
    })
}

/// Waits until Envoy's active health check has failed `worker`; returns when it saw it.
pub async fn wait_hc_failed(stack: &Stack, worker: &str, timeout: Duration) -> anyhow::Result<()> {
    crate::eventually(&format!("{worker} failed its health check"), timeout, || async {
        let text = clusters(stack).await.ok()?;
        let flags = host_values(&text, worker).get("health_flags").map(|f| f.to_string())?;
        flags.contains("failed_active_hc").then_some(())
    })
    .await
}

/// Waits until Envoy's active health check passes `worker` again.
pub async fn wait_hc_healthy(stack: &Stack, worker: &str, timeout: Duration) -> anyhow::Result<()> {
    crate::eventually(&format!("{worker} passed its health check"), timeout, || async {
        let text = clusters(stack).await.ok()?;
        (host_values(&text, worker).get("health_flags") == Some(&"healthy")).then_some(())
    })
    .await
}

/// Waits until the updater reports `worker`'s membership (from Envoy's health) as `member`.
pub async fn wait_updater_member(
    stack: &Stack,
    worker: &str,
    member: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let port = stack.updater.as_ref().context("the stack has no updater")?.port;
    let url = format!("http://127.0.0.1:{port}/status");
    crate::eventually(&format!("the updater reports {worker} member={member}"), timeout, || {
        let url = url.clone();
        async move {
            let v: serde_json::Value = reqwest::get(&url).await.ok()?.json().await.ok()?;
            (v["workers"][worker]["member"].as_bool()? == member).then_some(())
        }
    })
    .await
}

/// One client request as the client saw it.
#[derive(Debug, Clone)]
pub struct ClientRequest {
    /// When it was sent, from the start of the traffic.
    pub at: Duration,
    /// How long it took (to the end of its body, or to the client's deadline).
    pub took: Duration,
    /// The HTTP status; `None`: a transport error, or no answer within the deadline.
    pub status: Option<u16>,
    /// Whether it ran into the client's deadline.
    pub timed_out: bool,
    /// The worker that served it (the simulator's `x-worker-id`).
    pub worker: Option<String>,
}

impl ClientRequest {
    pub fn ok(&self) -> bool {
        self.status == Some(200)
    }
}

/// Steady traffic: `concurrency` clients, each sending streamed chat turns of its own
/// conversations back to back until stopped.
pub struct Traffic {
    started: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    sent: Arc<Mutex<Vec<ClientRequest>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// How the clients of [`Traffic`] send.
#[derive(Debug, Clone)]
pub struct TrafficShape {
    pub concurrency: usize,
    pub model: String,
    pub max_tokens: u64,
    /// Each request is abandoned (counted `timed_out`) after this long.
    pub deadline: Duration,
}

impl Traffic {
    pub fn start(base_url: &str, shape: &TrafficShape) -> Traffic {
        let started = Instant::now();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..shape.concurrency)
            .map(|client| {
                let (stop, sent, url, shape) =
                    (Arc::clone(&stop), Arc::clone(&sent), base_url.to_owned(), shape.clone());
                tokio::spawn(async move {
                    let http = reqwest::Client::new();
                    let mut n = 0usize;
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let c = Conversation::new(41, client * 1000 + n / 4, 120, 12, 4);
                        let body = c.body(&shape.model, n % 4, shape.max_tokens, true);
                        n += 1;
                        let at = started.elapsed();
                        let s = send_timed(&http, &url, &body, shape.deadline, at).await;
                        sent.lock().unwrap_or_else(|e| e.into_inner()).push(s);
                    }
                })
            })
            .collect();
        Traffic { started, stop, sent, tasks }
    }

    /// Time since the traffic started (the clock of [`ClientRequest::at`]).
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Requests finished so far.
    pub fn finished(&self) -> usize {
        self.sent.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Stops the clients (each finishes or abandons its request within its deadline) and
    /// returns every request.
    pub async fn stop(self) -> Vec<ClientRequest> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in self.tasks {
            let _ = t.await;
        }
        let mut sent = std::mem::take(&mut *self.sent.lock().unwrap_or_else(|e| e.into_inner()));
        sent.sort_by_key(|s| s.at);
        sent
    }
}

/// What [`kill_under_load`] measured.
#[derive(Debug, Clone, Default)]
pub struct KillReport {
    /// Attempts Envoy made to the killed worker from one interval after its health check
    /// failed to the end of the traffic (the goal: 0).
    pub attempts_after_hc: HostCounters,
    /// Requests sent before the kill that failed (its in-flight streams).
    pub errors_in_flight: usize,
    /// Requests sent after the kill that failed (the goal: 0).
    pub errors_after: usize,
    /// Requests sent after the kill, and of them those the killed worker served (0: dead).
    pub sent_after: usize,
    /// Time from the kill to the failed health check.
    pub hc_failed_after: Duration,
}

/// Kills `victim` (an index into `stack.workers`) after `warmup` of traffic, waits for its
/// health check to fail, and keeps the traffic going for `after` once one interval passed.
pub async fn kill_under_load(
    stack: &mut Stack,
    victim: usize,
    shape: &TrafficShape,
    warmup: Duration,
    after: Duration,
) -> anyhow::Result<KillReport> {
    let addr = stack.workers[victim].addr.clone();
    let traffic = Traffic::start(&stack.base_url(), shape);
    tokio::time::sleep(warmup).await;
    let killed_at = traffic.now();
    stack.kill_worker(victim).await;
    let hc = wait_hc_failed(stack, &addr, Duration::from_secs(30)).await;
    let hc_failed_after = traffic.now().saturating_sub(killed_at);
    tokio::time::sleep(HC_INTERVAL).await;
    let before = host_counters(stack, &addr).await;
    tokio::time::sleep(after).await;
    let end = host_counters(stack, &addr).await;
    let sent = traffic.stop().await;
    hc?;
    let attempts_after_hc = end?.since(&before?);
    let errors = |after_kill: bool| {
        sent.iter().filter(|s| (s.at >= killed_at) == after_kill && !s.ok()).count()
    };
    let later: Vec<&ClientRequest> = sent.iter().filter(|s| s.at >= killed_at).collect();
    anyhow::ensure!(
        later.iter().all(|s| s.worker.as_deref() != Some(addr.as_str())),
        "the killed worker served a request"
    );
    Ok(KillReport {
        attempts_after_hc,
        errors_in_flight: errors(false),
        errors_after: errors(true),
        sent_after: later.len(),
        hc_failed_after,
    })
}

/// A stopped process (`SIGSTOP`), continued when dropped, so that a failing test never leaves
/// it stopped (the stack then kills it as usual).
pub struct Frozen {
    pid: u32,
    continued: bool,
}

fn signal(sig: &str, pid: u32) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .context("running kill")?;
    anyhow::ensure!(status.success(), "kill {sig} {pid} failed");
    Ok(())
}

impl Frozen {
    /// Stops process `pid`, and returns once the kernel shows it stopped (at most 5 s): a
    /// request sent after this returns gets no byte from it until [`Frozen::cont`].
    pub fn stop(pid: u32) -> anyhow::Result<Frozen> {
        signal("-STOP", pid)?;
        let frozen = Frozen { pid, continued: false };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !is_stopped(pid) {
            anyhow::ensure!(Instant::now() < deadline, "process {pid} did not stop within 5 s");
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(frozen)
    }

    /// Continues it now.
    pub fn cont(&mut self) -> anyhow::Result<()> {
        if !self.continued {
            signal("-CONT", self.pid)?;
            self.continued = true;
        }
        Ok(())
    }
}

/// Whether `/proc/<pid>/stat` shows process `pid` stopped (state `T`).
fn is_stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command name, which is in parentheses and may hold spaces.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) == Some("T")
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = self.cont();
    }
}

/// What [`freeze_under_load`] measured.
#[derive(Debug, Clone, Default)]
pub struct FreezeReport {
    /// The worker frozen: the one that served the held conversation's first turn.
    pub frozen: String,
    /// Requests sent after the freeze.
    pub sent_after: usize,
    /// Of them, those that waited longer than the bound (the goal: 0).
    pub waited_past_bound: usize,
    /// Of them, those that failed.
    pub errors_after: usize,
    /// The longest wait of a request sent after the freeze.
    pub slowest_after: Duration,
    /// Requests sent before the freeze that ran into the client's deadline (streams the
    /// worker had begun answering: no retry can take them over).
    pub hung_in_flight: usize,
    /// Tries Envoy timed out on the frozen worker.
    pub try_timeouts: u64,
    /// How long the next turn of the conversation the worker held took (sent at the freeze:
    /// about one per-try timeout when it met the frozen worker).
    pub held_turn_took: Duration,
    /// Whether the worker served requests again after it was continued (within the wait).
    pub served_again: bool,
}

/// Freezes a worker after `warmup` of traffic for `frozen_for` (the one that served the first
/// turn of a conversation whose next turn is sent at the freeze), then continues it and waits
/// up to `recovery` for it to serve again. `bound`: the longest a request sent after the
/// freeze may take (the per-try timeout plus the request's own time).
pub async fn freeze_under_load(
    stack: &Stack,
    shape: &TrafficShape,
    warmup: Duration,
    frozen_for: Duration,
    bound: Duration,
    recovery: Duration,
) -> anyhow::Result<FreezeReport> {
    let traffic = Traffic::start(&stack.base_url(), shape);
    tokio::time::sleep(warmup).await;
    let (held, addr) = held_conversation(stack, &shape.model).await?;
    let victim = stack.workers.iter().position(|w| w.addr == addr);
    let victim = victim.with_context(|| format!("{addr} is not a worker of the stack"))?;
    let pid = stack.workers[victim].guard.pid().context("the worker is not running")?;
    let before = host_counters(stack, &addr).await?;
    // Taken once the worker is stopped: a request sent while the signal was on its way may
    // have got its first byte and then stalled for the whole freeze, which is not the per-try
    // timeout this measures.
    let mut frozen = Frozen::stop(pid)?;
    let frozen_at = traffic.now();
    let probe = probe_held(stack, &traffic, &held, shape);
    tokio::time::sleep(frozen_for).await;
    let thawed_at = traffic.now();
    frozen.cont()?;
    // Awaited after the thaw: a probe still held there ends with it, never extends the freeze.
    let probe = probe.await.context("the probe of the frozen worker panicked")?;
    let served_again = crate::eventually("the continued worker serves again", recovery, || {
        let http = reqwest::Client::new();
        let (url, addr, model) = (stack.base_url(), addr.clone(), shape.model.clone());
        async move {
            let c = Conversation::new(43, 0, 120, 12, 1);
            let r = client::chat(&http, &url, &c.body(&model, 0, 2, true)).await.ok()?;
            (r.worker.as_deref() == Some(addr.as_str())).then_some(())
        }
    })
    .await
    .is_ok();
    let mut sent = traffic.stop().await;
    let held_turn_took = probe.took;
    sent.push(probe);
    let end = host_counters(stack, &addr).await?;
    let window: Vec<&ClientRequest> =
        sent.iter().filter(|s| s.at >= frozen_at && s.at < thawed_at).collect();
    Ok(FreezeReport {
        frozen: addr,
        sent_after: window.len(),
        waited_past_bound: window.iter().filter(|s| s.took > bound || s.timed_out).count(),
        errors_after: window.iter().filter(|s| !s.ok()).count(),
        slowest_after: window.iter().map(|s| s.took).max().unwrap_or_default(),
        hung_in_flight: sent.iter().filter(|s| s.at < frozen_at && s.timed_out).count(),
        try_timeouts: end.since(&before).rq_timeout,
        held_turn_took,
        served_again,
    })
}

/// A fresh conversation with a long system prompt, and the worker that served its first
/// turn: that worker is the cheapest place for its next turn, so that freezing it is met by
/// at least that request whatever the loads at the freeze (the traffic's own requests may all
/// avoid a frozen worker, whose stuck streams count as load).
async fn held_conversation(stack: &Stack, model: &str) -> anyhow::Result<(Conversation, String)> {
    let c = Conversation::new(47, 0, 1500, 12, 2);
    let r = client::chat(&reqwest::Client::new(), &stack.base_url(), &c.body(model, 0, 2, true))
        .await?;
    anyhow::ensure!(r.status == 200, "the held conversation's first turn got {}", r.status);
    let worker = r.worker.context("the held conversation's first turn named no worker")?;
    Ok((c, worker))
}

/// Sends the next turn of `held` now, as one more client of `traffic`.
fn probe_held(
    stack: &Stack,
    traffic: &Traffic,
    held: &Conversation,
    shape: &TrafficShape,
) -> tokio::task::JoinHandle<ClientRequest> {
    let (url, body, deadline) =
        (stack.base_url(), held.body(&shape.model, 1, 2, true), shape.deadline);
    let at = traffic.now();
    tokio::spawn(
        async move { send_timed(&reqwest::Client::new(), &url, &body, deadline, at).await },
    )
}

/// Sends one chat request, abandoned after `deadline`; `at`: when, on the traffic's clock.
async fn send_timed(
    http: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
    deadline: Duration,
    at: Duration,
) -> ClientRequest {
    let t0 = Instant::now();
    let (status, worker, timed_out) =
        match tokio::time::timeout(deadline, client::chat(http, url, body)).await {
            Ok(Ok(r)) => (Some(r.status), r.worker, false),
            Ok(Err(_)) => (None, None, false),
            Err(_) => (None, None, true),
        };
    ClientRequest { at, took: t0.elapsed(), status, timed_out, worker }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_one_hosts_values_from_clusters() {
        let text = "workers::127.0.0.1:8001::rq_total::12\n\
                    workers::127.0.0.1:8001::cx_connect_fail::3\n\
                    workers::127.0.0.1:8001::health_flags::/failed_active_hc\n\
                    workers::127.0.0.1:80011::rq_total::99\n\
                    other::127.0.0.1:8001::rq_total::7\n";
        let v = host_values(text, "127.0.0.1:8001");
        assert_eq!(v.get("rq_total"), Some(&"12"));
        assert_eq!(v.get("cx_connect_fail"), Some(&"3"));
        assert_eq!(v.get("health_flags"), Some(&"/failed_active_hc"));
        assert_eq!(v.len(), 3);
        let c = HostCounters { rq_total: 12, cx_connect_fail: 3, rq_timeout: 0 };
        assert_eq!(c.attempts(), 15);
        let d = c.since(&HostCounters { rq_total: 10, cx_connect_fail: 3, rq_timeout: 0 });
        assert_eq!(d.attempts(), 2);
    }
}
