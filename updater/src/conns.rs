//! The HTTP server's connections as a bounded resource: an accept loop that serves each
//! connection with hyper (HTTP/1.1) and
//!
//! - closes a connection that has not completed a request head [`ConnLimits::header_read_timeout`]
//!   after it opened, or after the first byte of its next request (a partial request);
//! - closes a kept-alive connection with no request in flight for
//!   [`ConnLimits::idle_timeout`] (a long poll is a request in flight: never cut);
//! - keeps at most [`ConnLimits::max_connections`] open, a cap lowered at start to fit the
//!   process's open-files limit ([`ConnLimits::clamped`]). A connection arriving at the cap
//!   closes the idle connection least worth keeping: one that never sent the shared token
//!   before one that did (an Envoy), the longest idle first. Connections with a request in
//!   flight are never closed for room; when every one has, the new connection is refused.
//!
//! Every connection shed is counted by reason ([`ConnStats`], on `/status` and `/metrics`).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Header carrying the shared token.
/// Default of open HTTP connections (lowered to what the open-files limit leaves, see
/// [`ConnLimits::clamped`]).
pub const MAX_CONNECTIONS: usize = 4096;
/// Default of the wait for a request's headers (ms).
pub const HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Default idle timeout (ms): longer than a long poll's longest wait, so a connection in a long
/// poll is never idle.
pub const IDLE_TIMEOUT_MS: u64 = 60_000;

pub const TOKEN_HEADER: &str = "x-kvroute-token";

/// Constant-time comparison, so the token cannot be guessed byte by byte from timings.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Bounds on the HTTP server's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: MAX_CONNECTIONS,
            header_read_timeout: Duration::from_millis(HEADER_READ_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(IDLE_TIMEOUT_MS),
        }
    }
}

impl ConnLimits {
    /// The cap lowered to what an open-files limit of `nofile` leaves for HTTP connections:
    /// a quarter of it (at least 64 descriptors) stays for the workers' ZMQ sockets, their
    /// relays, scrapes and replays, but never more than half.
    pub fn clamped(self, nofile: Option<u64>) -> ConnLimits {
        let Some(n) = nofile else { return self };
        let room = n.saturating_sub((n / 4).max(64)).max(n / 2).max(1);
        let max_connections = self.max_connections.min(usize::try_from(room).unwrap_or(usize::MAX));
        ConnLimits { max_connections, ..self }
    }
}

/// The soft open-files limit (`RLIMIT_NOFILE`) from `/proc/self/limits`, where readable.
pub fn nofile_limit() -> Option<u64> {
    parse_nofile(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

/// The soft limit on the `Max open files` line of a `/proc/<pid>/limits` text.
pub fn parse_nofile(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

/// Counters of the HTTP server's connections.
#[derive(Debug, Default)]
pub struct ConnStats {
    cap: AtomicU64,
    nofile: AtomicU64,
    open: AtomicU64,
    accepted: AtomicU64,
    /// Idle connections closed to make room for a new one.
    shed_for_room: AtomicU64,
    /// New connections refused: every open one had a request in flight.
    refused: AtomicU64,
    header_timeouts: AtomicU64,
    idle_timeouts: AtomicU64,
    accept_errors: AtomicU64,
}

impl ConnStats {
    pub fn new(limits: &ConnLimits, nofile: Option<u64>) -> ConnStats {
        let s = ConnStats::default();
        s.cap.store(limits.max_connections as u64, Relaxed);
        s.nofile.store(nofile.unwrap_or(0), Relaxed);
        s
    }

    pub fn open(&self) -> u64 {
        self.open.load(Relaxed)
    }

    /// Connections shed, all reasons together.
    pub fn shed(&self) -> u64 {
        [&self.shed_for_room, &self.refused, &self.header_timeouts, &self.idle_timeouts]
            .iter()
            .map(|c| c.load(Relaxed))
            .sum()
    }

    /// `/status` → `http`.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "connections": self.open(),
            "max_connections": self.cap.load(Relaxed),
            "open_files_limit": self.nofile.load(Relaxed),
            "accepted": self.accepted.load(Relaxed),
            "accept_errors": self.accept_errors.load(Relaxed),
            "shed": {
                "for_room": self.shed_for_room.load(Relaxed),
                "refused": self.refused.load(Relaxed),
                "header_timeout": self.header_timeouts.load(Relaxed),
                "idle_timeout": self.idle_timeouts.load(Relaxed),
            },
        })
    }

    /// The connection gauges and counters, on `/metrics` (`kvroute_updater_http_*`).
    pub fn register(&self, f: &mut crate::families::Families<'_>) {
        f.level("http_connections", "HTTP connections open", self.open());
        f.level("http_max_connections", "Cap on HTTP connections", self.cap.load(Relaxed));
        f.count("http_accepted", "HTTP connections accepted", self.accepted.load(Relaxed));
        let shed = f.counter::<ShedLabels>("http_connections_shed", "HTTP connections shed");
        for (reason, c) in [
            ("for_room", &self.shed_for_room),
            ("refused", &self.refused),
            ("header_timeout", &self.header_timeouts),
            ("idle_timeout", &self.idle_timeouts),
        ] {
            shed.get_or_create(&ShedLabels { reason }).inc_by(c.load(Relaxed));
        }
    }
}

/// Why a connection was shed (`kvroute_updater_http_connections_shed_total`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ShedLabels {
    pub reason: &'static str,
}

/// One open connection, as the accept loop, the reaper and its own task see it. Times are
/// milliseconds since the server's epoch plus one (0: none).
#[derive(Debug, Default)]
struct Slot {
    /// Requests in flight.
    busy: AtomicU32,
    /// Since when a request head is being awaited (opened, or first byte of the next request).
    head_since: AtomicU64,
    /// Since when no request has been in flight.
    idle_since: AtomicU64,
    /// A request on it carried the right token.
    authed: AtomicBool,
    kill: Notify,
}

/// The registry of open connections.
struct Conns {
    limits: ConnLimits,
    stats: Arc<ConnStats>,
    token: Arc<str>,
    epoch: Instant,
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    next_id: AtomicU64,
}

impl Conns {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a new connection, closing an idle one if at the cap; `None`: refused.
    fn admit(&self) -> Option<(u64, Arc<Slot>)> {
        let now = self.now();
        let mut slots = self.slots();
        if slots.len() >= self.limits.max_connections {
            let victim = slots
                .iter()
                .filter(|(_, s)| s.busy.load(Relaxed) == 0)
                .min_by_key(|(_, s)| (s.authed.load(Relaxed), s.idle_since.load(Relaxed)))
                .map(|(id, _)| *id);
            match victim.and_then(|id| slots.remove(&id)) {
                Some(s) => {
                    s.kill.notify_one();
                    self.stats.shed_for_room.fetch_add(1, Relaxed);
                }
                None => {
                    self.stats.refused.fetch_add(1, Relaxed);
                    return None;
                }
            }
        }
        let id = self.next_id.fetch_add(1, Relaxed);
        let slot = Arc::new(Slot::default());
        slot.head_since.store(now, Relaxed);
        slot.idle_since.store(now, Relaxed);
        slots.insert(id, Arc::clone(&slot));
        self.stats.open.store(slots.len() as u64, Relaxed);
        self.stats.accepted.fetch_add(1, Relaxed);
        Some((id, slot))
    }

    fn remove(&self, id: u64) {
        let mut slots = self.slots();
        slots.remove(&id);
        self.stats.open.store(slots.len() as u64, Relaxed);
    }

    /// Closes the connections past a timeout.
    fn reap(&self) {
        let now = self.now();
        let (header, idle) = (
            self.limits.header_read_timeout.as_millis() as u64,
            self.limits.idle_timeout.as_millis() as u64,
        );
        let mut slots = self.slots();
        slots.retain(|_, s| {
            if s.busy.load(Relaxed) > 0 {
                return true;
            }
            let head = s.head_since.load(Relaxed);
            let counter = if head != 0 && now.saturating_sub(head) > header {
                &self.stats.header_timeouts
            } else if head == 0 && now.saturating_sub(s.idle_since.load(Relaxed)) > idle {
                &self.stats.idle_timeouts
            } else {
                return true;
            };
            counter.fetch_add(1, Relaxed);
            s.kill.notify_one();
            false
        });
        self.stats.open.store(slots.len() as u64, Relaxed);
    }
}

/// Marks a request in flight on a connection until dropped.
struct Busy {
    slot: Arc<Slot>,
    conns: Arc<Conns>,
}

impl Busy {
    fn begin(slot: &Arc<Slot>, conns: &Arc<Conns>, authed: bool) -> Busy {
        slot.busy.fetch_add(1, Relaxed);
        slot.head_since.store(0, Relaxed);
        if authed {
            slot.authed.store(true, Relaxed);
        }
        Busy { slot: Arc::clone(slot), conns: Arc::clone(conns) }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.slot.idle_since.store(self.conns.now(), Relaxed);
        self.slot.busy.fetch_sub(1, Relaxed);
    }
}

/// A TCP stream that tells its slot when bytes of a new request arrive.
struct Tracked {
    inner: TcpStream,
    slot: Arc<Slot>,
    conns: Arc<Conns>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before && this.slot.busy.load(Relaxed) == 0 {
            let _ = this.slot.head_since.compare_exchange(0, this.conns.now(), Relaxed, Relaxed);
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Serves `app` on `listener` within `limits`; `token` tells an Envoy's connections from
/// others. Runs until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    token: &str,
    limits: ConnLimits,
    stats: Arc<ConnStats>,
) -> io::Result<()> {
    let conns = Arc::new(Conns {
        limits,
        stats,
        token: token.into(),
        epoch: Instant::now(),
        slots: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(0),
    });
    let reaper = {
        let conns = Arc::clone(&conns);
        let every = (limits.header_read_timeout.min(limits.idle_timeout) / 4)
            .clamp(Duration::from_millis(25), Duration::from_secs(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                conns.reap();
            }
        })
    };
    let _reaper = AbortOnDrop(reaper);
    let app = TowerToHyperService::new(app);
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors (EMFILE, ENFILE) or a connection reset before accept:
                // wait a little instead of spinning.
                conns.stats.accept_errors.fetch_add(1, Relaxed);
                let out_of_fds = matches!(e.raw_os_error(), Some(23 | 24));
                let pause = if out_of_fds { 100 } else { 5 };
                tokio::time::sleep(Duration::from_millis(pause)).await;
                continue;
            }
        };
        let Some((id, slot)) = conns.admit() else {
            drop(stream);
            continue;
        };
        tokio::spawn(serve_one(stream, app.clone(), Arc::clone(&conns), id, slot));
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn serve_one(
    stream: TcpStream,
    app: TowerToHyperService<Router>,
    conns: Arc<Conns>,
    id: u64,
    slot: Arc<Slot>,
) {
    let _ = stream.set_nodelay(true);
    let io =
        TokioIo::new(Tracked { inner: stream, slot: Arc::clone(&slot), conns: Arc::clone(&conns) });
    let svc = {
        let (slot, conns) = (Arc::clone(&slot), Arc::clone(&conns));
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let given = req.headers().get(TOKEN_HEADER);
            let authed = given.is_some_and(|v| same(v.as_bytes(), conns.token.as_bytes()));
            let busy = Busy::begin(&slot, &conns, authed);
            let fut = hyper::service::Service::call(&app, req);
            async move {
                let _busy = busy;
                fut.await
            }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        // The reaper applies the header and idle timeouts (hyper's would also cut idle
        // kept-alive connections at the header timeout).
        .header_read_timeout(None)
        .keep_alive(true)
        .serve_connection(io, svc);
    tokio::select! {
        _ = conn => {}
        _ = slot.kill.notified() => {}
    }
    conns.remove(id);
}

#[cfg(test)]
mod tests;
