//! Passive health of workers, shared by every Envoy thread (`kvroute.health`): a request whose
//! planned worker did not serve it (a connect failure retried elsewhere, a per-try timeout, a
//! reset before any response) or whose stream the worker reset marks that worker down for a
//! backoff that doubles with each failure in a row, up to a cap. When the backoff runs out and
//! the worker showed a sign of life since it went down (the updater scraped its load since
//! then; a deployment without load reports needs none), it is half-open: the first decision
//! that picks it claims the probe (the worker stays out of other decisions meanwhile), and an
//! answer from it clears the record; a failure sends it down again for twice as long. A dead
//! or frozen worker that the updater cannot reach is never probed with a client's request.
//! Decisions leave out every worker that is not up, unless none of the pool is (see
//! `Router::set_down`).
//!
//! Value: `KVH1`, u16 count, then per worker (sorted): u16-length name, `failures` u32,
//! `since_ms` u64 (the last ejection), `until_ms` u64, flags u8 (bit 1: a probe is in
//! flight). A value that does not decode reads as empty (every worker up) and is replaced by
//! the next write.

use std::collections::BTreeMap;

use super::{update, SharedStore, StoreError};
use crate::decision::config::sync::HealthConfig;
use crate::wire::Reader;

/// The shared-data key of the health record.
pub const KEY: &str = "kvroute.health";
const MAGIC: &[u8; 4] = b"KVH1";
const PROBING: u8 = 1;
/// Workers the record keeps at most (past it, new failures are not recorded).
pub const MAX_WORKERS: usize = 4096;

/// One worker's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerHealth {
    /// Failures in a row (each one that found it up, half-open or probing).
    pub failures: u32,
    /// When it last went down (unix ms).
    pub since_ms: u64,
    /// Down until then (unix ms); half-open after it.
    pub until_ms: u64,
    /// A probe request is in flight.
    pub probing: bool,
}

/// The record as read: workers with failures, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthRecord {
    entries: BTreeMap<String, WorkerHealth>,
}

impl HealthRecord {
    /// Reads the record (absent or unreadable: every worker up).
    pub fn read<S: SharedStore + ?Sized>(store: &S) -> HealthRecord {
        HealthRecord::decode(store.get(KEY).0.as_deref()).unwrap_or_default()
    }

    pub fn decode(bytes: Option<&[u8]>) -> Option<HealthRecord> {
        let Some(bytes) = bytes else { return Some(HealthRecord::default()) };
        let mut r = Reader::new(bytes);
        if r.take(4)? != MAGIC {
            return None;
        }
        let n = r.u16()? as usize;
        let mut entries = BTreeMap::new();
        for _ in 0..n {
            let len = r.u16()? as usize;
            let name = std::str::from_utf8(r.take(len)?).ok()?.to_owned();
            let failures = r.u32()?;
            let since_ms = r.u64()?;
            let until_ms = r.u64()?;
            let probing = r.u8()? & PROBING != 0;
            entries.insert(name, WorkerHealth { failures, since_ms, until_ms, probing });
        }
        (r.remaining() == 0).then_some(HealthRecord { entries })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        let n = self.entries.len().min(MAX_WORKERS);
        out.extend_from_slice(&(n as u16).to_le_bytes());
        for (name, e) in self.entries.iter().take(n) {
            let name = &name.as_bytes()[..name.len().min(u16::MAX as usize)];
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name);
            out.extend_from_slice(&e.failures.to_le_bytes());
            out.extend_from_slice(&e.since_ms.to_le_bytes());
            out.extend_from_slice(&e.until_ms.to_le_bytes());
            out.push(if e.probing { PROBING } else { 0 });
        }
        out
    }

    pub fn get(&self, worker: &str) -> Option<&WorkerHealth> {
        self.entries.get(worker)
    }

    /// Down now: in its backoff, or half-open with a probe claimed and not timed out.
    pub fn is_down(&self, worker: &str, now_ms: u64) -> bool {
        self.entries.get(worker).is_some_and(|e| now_ms < e.until_ms)
    }

    /// Workers down now.
    pub fn down(&self, now_ms: u64) -> impl Iterator<Item = &str> {
        self.entries.iter().filter(move |(_, e)| now_ms < e.until_ms).map(|(w, _)| w.as_str())
    }

    /// Workers to leave out of decisions now: down, or past their backoff with no sign of
    /// life since they went down (`alive_since(worker, since_ms)`).
    pub fn out<'a>(
        &'a self,
        now_ms: u64,
        alive_since: impl Fn(&str, u64) -> bool + 'a,
    ) -> impl Iterator<Item = &'a str> + 'a {
        self.entries
            .iter()
            .filter(move |(w, e)| now_ms < e.until_ms || !alive_since(w, e.since_ms))
            .map(|(w, _)| w.as_str())
    }

    /// Whether a decision that picks `worker` now makes it the probe: it has a record, its
    /// backoff ran out and no probe holds it.
    pub fn half_open(&self, worker: &str, now_ms: u64) -> bool {
        self.entries.get(worker).is_some_and(|e| now_ms >= e.until_ms)
    }

    /// Workers with a record (down, half-open or probing).
    pub fn tracked(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }
}

/// What a reported failure did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The worker went down (from up, half-open or a failed probe) for `backoff_ms`.
    Ejected { failures: u32, backoff_ms: u64 },
    /// It was down already (another request that was in flight failed too): nothing changed.
    AlreadyDown,
    /// The record is full: not recorded.
    Full,
}

fn rewrite<S: SharedStore + ?Sized, T>(
    store: &S,
    f: impl Fn(&mut HealthRecord) -> T,
) -> Result<T, StoreError> {
    update(store, KEY, |bytes| {
        let mut h = HealthRecord::decode(bytes).unwrap_or_default();
        let out = f(&mut h);
        (h.encode(), out)
    })
}

/// `worker` failed a request at `now_ms`.
pub fn report_failure<S: SharedStore + ?Sized>(
    store: &S,
    cfg: &HealthConfig,
    worker: &str,
    now_ms: u64,
) -> Result<Failure, StoreError> {
    rewrite(store, |h| {
        let prev = h.entries.get(worker).copied();
        if prev.is_some_and(|e| now_ms < e.until_ms && !e.probing) {
            return Failure::AlreadyDown;
        }
        if prev.is_none() && h.entries.len() >= MAX_WORKERS {
            return Failure::Full;
        }
        let failures = prev.map_or(0, |e| e.failures).saturating_add(1);
        let backoff_ms = cfg.backoff_ms(failures);
        let until_ms = now_ms.saturating_add(backoff_ms);
        let e = WorkerHealth { failures, since_ms: now_ms, until_ms, probing: false };
        h.entries.insert(worker.to_owned(), e);
        Failure::Ejected { failures, backoff_ms }
    })
}

/// `worker` answered a request at `now_ms`: a half-open or probing worker is up again (its
/// record goes). An answer while it is down (a request sent before it failed) changes
/// nothing. True when the record went.
pub fn report_answer<S: SharedStore + ?Sized>(
    store: &S,
    worker: &str,
    now_ms: u64,
) -> Result<bool, StoreError> {
    let known = HealthRecord::read(store);
    match known.get(worker) {
        None => return Ok(false),
        Some(e) if now_ms < e.until_ms && !e.probing => return Ok(false),
        Some(_) => {}
    }
    rewrite(store, |h| match h.entries.get(worker) {
        Some(e) if e.probing || now_ms >= e.until_ms => h.entries.remove(worker).is_some(),
        _ => false,
    })
}

/// A decision picked `worker`: if it is half-open, this request is its probe and the worker
/// stays out of other decisions for `probe_hold_ms`. True when this call claimed the probe.
pub fn claim_probe<S: SharedStore + ?Sized>(
    store: &S,
    cfg: &HealthConfig,
    worker: &str,
    now_ms: u64,
) -> Result<bool, StoreError> {
    rewrite(store, |h| match h.entries.get_mut(worker) {
        Some(e) if now_ms >= e.until_ms => {
            e.until_ms = now_ms.saturating_add(cfg.probe_hold_ms);
            e.probing = true;
            true
        }
        _ => false,
    })
}

/// Which response ends say that the worker failed the request (Envoy's
/// `response.code_details`): a reset or connect failure before any response (not a circuit
/// breaker overflow, which is Envoy's own limit), a per-try or route timeout, or a reset of a
/// response already streaming (the worker died mid-stream).
pub fn worker_failed(code_details: &[u8]) -> bool {
    let d = code_details;
    let starts = |p: &[u8]| d.starts_with(p);
    let overflow = d.windows(8).any(|w| w == b"overflow");
    (starts(b"upstream_reset_before_response_started") && !overflow)
        || starts(b"upstream_reset_after_response_started")
        || starts(b"upstream_per_try_timeout")
        || starts(b"upstream_per_try_idle_timeout")
        || starts(b"upstream_response_timeout")
}

#[cfg(test)]
mod tests;
