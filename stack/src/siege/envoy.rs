//! Attacks on Envoy itself: a trapped filter VM (does routing come back, and at what cost in
//! failed or unrouted requests?) and idle connections held against its listener (do normal
//! requests still get through?).
//!
//! A request is *routed with knowledge* when Envoy answered 200 and the filter's
//! `x-kvroute-decision` names a worker with `fallback=none`; *passed through* when it answered
//! 200 with no decision (the VM was bypassed: FAIL_OPEN); *load only* when the decision fell
//! back (e.g. `no_bundle`: a fresh VM that has not built its bundle yet); *failed* for any
//! other status, or no answer at all (a reset).

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::client;

/// What one request after an attack got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvoyOutcome {
    /// 200 with a decision naming a worker, made with knowledge (`fallback=none`).
    Routed,
    /// 200 with a decision that fell back (the reason, e.g. `no_bundle`).
    LoadOnly(String),
    /// 200 without a decision: the filter did not run.
    PassedThrough,
    /// Another status (e.g. 503 from a failed-closed VM), or `None`: no answer (reset).
    Failed(Option<u16>),
}

impl EnvoyOutcome {
    /// Classifies a finished request.
    pub fn of(reply: &anyhow::Result<client::Reply>) -> EnvoyOutcome {
        let r = match reply {
            Ok(r) => r,
            Err(_) => return EnvoyOutcome::Failed(None),
        };
        if r.status != 200 {
            return EnvoyOutcome::Failed(Some(r.status));
        }
        match (r.decision_field("worker"), r.decision_field("fallback")) {
            (None, _) => EnvoyOutcome::PassedThrough,
            (Some(_), Some(f)) if f == "none" => EnvoyOutcome::Routed,
            (Some(_), f) => EnvoyOutcome::LoadOnly(f.unwrap_or_default()),
        }
    }
}

/// A small chat request, different for every `i`.
pub fn chat_body(model: &str, i: usize) -> Value {
    json!({"model": model, "max_tokens": 1,
        "messages": [{"role": "user", "content": format!("siege probe {i}: hello there")}]})
}

/// HTTP/1.1 clients that each keep one connection: with the listener's `exact_balance`, `n`
/// of them opened one after the other pin one client to each of `n` Envoy worker threads.
pub fn pinned_clients(n: usize) -> anyhow::Result<Vec<reqwest::Client>> {
    (0..n)
        .map(|_| {
            Ok(reqwest::Client::builder()
                .http1_only()
                .pool_max_idle_per_host(1)
                .timeout(Duration::from_secs(10))
                .build()?)
        })
        .collect()
}

/// What followed one VM trap.
#[derive(Debug, Clone, Default)]
pub struct TrapReport {
    /// What the trapping request itself got: `reset`, or its status.
    pub trap_answer: String,
    /// Requests sent after the trap (every client, every round).
    pub sent: usize,
    pub routed: usize,
    /// Fell back to load-only routing (mostly `no_bundle` while a fresh VM builds its bundle).
    pub load_only: usize,
    pub passed_through: usize,
    /// Answered with an error status or reset.
    pub failed: usize,
    /// The statuses among `failed` (`None`: reset).
    pub failures: Vec<Option<u16>>,
    /// From the trap to the end of the last round in which some client was not routed with
    /// knowledge; zero when none was; `None` when the last round still had one.
    pub recovered_after: Option<Duration>,
}

impl TrapReport {
    /// Not routed with knowledge (passed through or load only).
    pub fn unrouted(&self) -> usize {
        self.passed_through + self.load_only
    }
}

/// Aborts the filter VM of the Envoy worker thread that takes a fresh connection (the filter's
/// `fault_injection.trap_path`), then for `window` sends rounds of one request per client in
/// `clients` (each pinned to a thread, see [`pinned_clients`]; the trap lands on one of
/// theirs) and classifies every answer.
pub async fn trap_and_measure(
    base_url: &str,
    trap_path: &str,
    model: &str,
    clients: &[reqwest::Client],
    window: Duration,
) -> anyhow::Result<TrapReport> {
    let trapper = reqwest::Client::builder()
        .http1_only()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()?;
    let trapped = trapper.post(format!("{base_url}{trap_path}")).body("{}").send().await;
    let mut report = TrapReport {
        trap_answer: match trapped {
            Ok(r) => r.status().as_u16().to_string(),
            Err(_) => "reset".into(),
        },
        ..TrapReport::default()
    };
    let start = Instant::now();
    let mut last_bad: Option<Duration> = None;
    let mut last_round_bad = false;
    let mut i = 0usize;
    while start.elapsed() < window {
        let mut bad = false;
        let round = clients.iter().enumerate().map(|(k, http)| {
            let body = chat_body(model, i * clients.len() + k);
            async move { client::chat(http, base_url, &body).await }
        });
        for reply in futures::future::join_all(round).await {
            report.sent += 1;
            match EnvoyOutcome::of(&reply) {
                EnvoyOutcome::Routed => report.routed += 1,
                EnvoyOutcome::LoadOnly(_) => {
                    report.load_only += 1;
                    bad = true;
                }
                EnvoyOutcome::PassedThrough => {
                    report.passed_through += 1;
                    bad = true;
                }
                EnvoyOutcome::Failed(s) => {
                    report.failed += 1;
                    report.failures.push(s);
                    bad = true;
                }
            }
        }
        if bad {
            last_bad = Some(start.elapsed());
        }
        last_round_bad = bad;
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    report.recovered_after = match (last_round_bad, last_bad) {
        (true, _) => None,
        (false, None) => Some(Duration::ZERO),
        (false, Some(t)) => Some(t),
    };
    Ok(report)
}

/// Connections held open against a listener: some idle (connected, nothing sent), some with a
/// partial request line (never finished). Dropping it closes them all.
pub struct IdleFlood {
    conns: Vec<TcpStream>,
    /// Connections the kernel completed (accepted by Envoy or still in its backlog).
    pub opened: usize,
    /// Of those, the ones that sent a partial request line.
    pub partial: usize,
    /// Connect attempts that failed or timed out (a full backlog drops SYNs).
    pub not_opened: usize,
}

impl IdleFlood {
    /// Opens `idle + partial` connections to `addr` (`ip:port`), at most 64 connecting at a
    /// time, each given `connect_timeout`.
    pub async fn open(
        addr: &str,
        idle: usize,
        partial: usize,
        connect_timeout: Duration,
    ) -> anyhow::Result<IdleFlood> {
        use futures::StreamExt;
        let addr: std::net::SocketAddr = addr.parse()?;
        let attempts = (0..idle + partial).map(|i| async move {
            let c = tokio::time::timeout(connect_timeout, TcpStream::connect(addr)).await;
            let mut s = match c {
                Ok(Ok(s)) => s,
                _ => return None,
            };
            let is_partial = i >= idle;
            if is_partial {
                // A request line that never ends: no CRLF, no headers.
                let _ = s.write_all(b"POST /v1/chat/completions HTT").await;
            }
            Some((s, is_partial))
        });
        let results: Vec<_> = futures::stream::iter(attempts).buffer_unordered(64).collect().await;
        let mut flood = IdleFlood { conns: Vec::new(), opened: 0, partial: 0, not_opened: 0 };
        for r in results {
            match r {
                Some((s, p)) => {
                    flood.opened += 1;
                    flood.partial += usize::from(p);
                    flood.conns.push(s);
                }
                None => flood.not_opened += 1,
            }
        }
        Ok(flood)
    }

    /// How many of the flood's connections the server has not closed yet (a read that would
    /// block means open; end of stream or an error means closed).
    pub fn still_open(&self) -> usize {
        let mut buf = [0u8; 512];
        self.conns
            .iter()
            .filter(|s| match s.try_read(&mut buf) {
                Ok(0) => false,
                Ok(_) => true,
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            })
            .count()
    }

    /// Closes every connection.
    pub fn close(self) {
        drop(self.conns);
    }
}

/// Normal requests sent while an attack holds: how many got through, and how long that took.
#[derive(Debug, Clone, Default)]
pub struct Served {
    /// Requests that got a 200 (after as many tries as the deadline allowed).
    pub ok: usize,
    /// Tries that failed (refused, reset, timed out, or an error status).
    pub failed_tries: usize,
    /// From the first try to the last request's 200 (or to the deadline).
    pub elapsed: Duration,
}

/// Sends `n` requests one after the other, each on a fresh connection, trying each again
/// (every 250 ms, each try bounded by `try_timeout`) until it gets a 200 or `deadline` passes.
pub async fn serve_through(
    base_url: &str,
    model: &str,
    n: usize,
    try_timeout: Duration,
    deadline: Duration,
) -> anyhow::Result<Served> {
    let start = Instant::now();
    let mut served = Served::default();
    'requests: for i in 0..n {
        loop {
            if start.elapsed() >= deadline {
                break 'requests;
            }
            let left = deadline.saturating_sub(start.elapsed());
            let http = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .timeout(try_timeout.min(left))
                .build()?;
            let reply = client::chat(&http, base_url, &chat_body(model, 1_000_000 + i)).await;
            if matches!(&reply, Ok(r) if r.status == 200) {
                served.ok += 1;
                break;
            }
            served.failed_tries += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    served.elapsed = start.elapsed();
    Ok(served)
}

/// Spellings of `/v1/chat/completions` a server that decodes or normalises paths would serve.
pub const ODD_PATHS: [&str; 9] = [
    "/v1/chat/%63ompletions",
    "/v1/chat/completion%73",
    "/%761/chat/completions",
    "/v1//chat/completions",
    "/v1/./chat/completions",
    "/v1/x/../chat/completions",
    "/v1/chat/completions/",
    "/v1%2Fchat%2Fcompletions",
    "/v1/chat%2fcompletions",
];

/// What Envoy did with a request on an odd path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathOutcome {
    /// The filter decided (a decision header naming a worker), whatever the worker answered.
    Routed(u16),
    /// Envoy answered itself (no upstream: no `x-envoy-upstream-service-time`), with this status.
    Refused(u16),
    /// A worker answered a request the filter did not route.
    PassedThrough(u16),
    /// No answer at all.
    NoAnswer,
}

/// Sends a chat request for `model` to `path` over `proto` on a fresh connection.
pub async fn try_path(
    addr: std::net::SocketAddr,
    proto: crate::rawhttp::Proto,
    path: &str,
    model: &str,
) -> PathOutcome {
    let body = chat_body(model, 7).to_string();
    let req = crate::rawhttp::RawRequest::post(path.as_bytes().to_vec(), body.into_bytes())
        .header("content-type", "application/json");
    let r = match crate::rawhttp::send(addr, proto, &req, Duration::from_secs(10)).await {
        Ok(r) => r,
        Err(_) => return PathOutcome::NoAnswer,
    };
    let decided = r
        .header("x-kvroute-decision")
        .is_some_and(|d| client::decision_field(&d, "worker").is_some());
    if decided {
        PathOutcome::Routed(r.status)
    } else if r.header("x-envoy-upstream-service-time").is_some() {
        PathOutcome::PassedThrough(r.status)
    } else {
        PathOutcome::Refused(r.status)
    }
}

/// This process's open-file limits (soft, hard), from `/proc/self/limits`.
pub fn own_nofile() -> anyhow::Result<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/limits")?;
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .ok_or_else(|| anyhow::anyhow!("no open-file limit in /proc/self/limits"))?;
    let nums: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    match nums[..] {
        [soft, hard, ..] => Ok((soft, hard)),
        _ => anyhow::bail!("unreadable open-file limit: {line}"),
    }
}

/// Makes sure this process (the attacker) may hold `need` descriptors: raises its soft
/// open-file limit to the hard one with `prlimit` when it is lower. Fails when even the hard
/// limit is too low.
pub fn ensure_own_nofile(need: u64) -> anyhow::Result<()> {
    let (soft, hard) = own_nofile()?;
    if soft >= need {
        return Ok(());
    }
    anyhow::ensure!(hard >= need, "open-file hard limit {hard} is below the {need} needed");
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &std::process::id().to_string(), &format!("--nofile={hard}:{hard}")])
        .status()?;
    anyhow::ensure!(status.success(), "prlimit could not raise the open-file limit to {hard}");
    Ok(())
}

/// Lowers process `pid`'s open-file limit (soft and hard) to `n` with `prlimit`.
pub fn limit_nofile(pid: u32, n: u64) -> anyhow::Result<()> {
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={n}:{n}")])
        .status()?;
    anyhow::ensure!(status.success(), "prlimit --nofile={n} on pid {pid} failed");
    Ok(())
}
