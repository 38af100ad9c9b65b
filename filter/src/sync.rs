//! The singleton (Envoy bootstrap wasm service, same `vm_id` as the filter): pulls knowledge from
//! the updater on a short tick and publishes it in shared data, where every worker thread's
//! filter picks it up when the version moves.
//!
//! The singleton asks for `since=<its version>` and gets 304, a delta (`kvroute_core::delta`)
//! or a full snapshot. It keeps the full snapshot in memory, applies deltas to it, and publishes:
//! - `kvroute.snapshot.head`: see [`Head`] — the current version, when the updater last
//!   confirmed it, the version of the full snapshot in shared data, and which delta sits in
//!   which ring slot;
//! - `kvroute.snapshot.data`: a full snapshot (rewritten every [`FULL_EVERY`] deltas, so a
//!   thread that fell behind the ring still finds a chain from it);
//! - `kvroute.snapshot.delta.<slot>`: the last [`RING`] deltas as received.
//!
//! A thread follows the chain of deltas from its own version; a gap means reading the full
//! snapshot, then the deltas after it. Payloads are validated (decoded) before publication.

use std::time::{Duration, UNIX_EPOCH};

use kvroute_core::config::SnapshotSyncConfig;
use kvroute_core::delta::{is_delta, Delta};
use kvroute_core::snapshot::Snapshot;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, RootContext};
use proxy_wasm::types::MetricType;

pub const HEAD_KEY: &str = "kvroute.snapshot.head";
pub const DATA_KEY: &str = "kvroute.snapshot.data";
/// Delta ring slots in shared data.
pub const RING: usize = 16;
/// The full snapshot in shared data is rewritten after this many deltas.
pub const FULL_EVERY: usize = RING / 2;

pub fn delta_key(slot: u8) -> String {
    format!("kvroute.snapshot.delta.{slot}")
}

/// One delta in the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingEntry {
    pub slot: u8,
    pub from: u64,
    pub to: u64,
}

/// The small key every thread reads on each request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Head {
    pub version: u64,
    /// When the updater last confirmed `version` (unix ms).
    pub checked_at_ms: u64,
    /// Version of the full snapshot under [`DATA_KEY`].
    pub full_version: u64,
    pub ring: Vec<RingEntry>,
}

impl Head {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(25 + 17 * self.ring.len());
        for v in [self.version, self.checked_at_ms, self.full_version] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.push(self.ring.len() as u8);
        for e in &self.ring {
            b.push(e.slot);
            b.extend_from_slice(&e.from.to_le_bytes());
            b.extend_from_slice(&e.to.to_le_bytes());
        }
        b
    }

    pub fn decode(b: &[u8]) -> Option<Head> {
        let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        let n = *b.get(24)? as usize;
        let ring = (0..n.min(RING))
            .map(|k| {
                let at = 25 + 17 * k;
                Some(RingEntry { slot: *b.get(at)?, from: u64_at(at + 1)?, to: u64_at(at + 9)? })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Head {
            version: u64_at(0)?,
            checked_at_ms: u64_at(8)?,
            full_version: u64_at(16)?,
            ring,
        })
    }

    /// The ring entry continuing from `version`.
    pub fn next_after(&self, version: u64) -> Option<RingEntry> {
        self.ring.iter().copied().find(|e| e.from == version)
    }
}

/// Reads the head key.
pub fn read_head() -> Option<Head> {
    let (bytes, _) = hostcalls::get_shared_data(HEAD_KEY).ok()?;
    Head::decode(&bytes?)
}

fn read(key: &str) -> Option<Vec<u8>> {
    hostcalls::get_shared_data(key).ok().and_then(|(d, _)| d)
}

/// Reads the delta of ring entry `e`, if the slot still holds it.
pub fn read_delta(e: RingEntry) -> Option<Delta> {
    let d = Delta::decode(&read(&delta_key(e.slot))?).ok()?;
    (d.from_version == e.from && d.to_version == e.to).then_some(d)
}

/// Reads the full snapshot.
pub fn read_full() -> Option<Snapshot> {
    match Snapshot::decode(&read(DATA_KEY)?) {
        Ok(s) => Some(s),
        Err(e) => {
            log::warn!("kvroute: unreadable snapshot in shared data: {e}");
            None
        }
    }
}

pub struct SnapshotSync {
    cfg: SnapshotSyncConfig,
    full: Option<Snapshot>,
    head: Head,
    next_slot: u8,
    deltas_since_full: usize,
    pending: bool,
    fetched_full: Option<u32>,
    fetched_delta: Option<u32>,
    failed: Option<u32>,
    version_gauge: Option<u32>,
}

impl SnapshotSync {
    pub fn new(cfg: SnapshotSyncConfig) -> Self {
        let c = MetricType::Counter;
        SnapshotSync {
            cfg,
            full: None,
            head: Head::default(),
            next_slot: 0,
            deltas_since_full: 0,
            pending: false,
            fetched_full: hostcalls::define_metric(c, "kvroute.sync.full_snapshots").ok(),
            fetched_delta: hostcalls::define_metric(c, "kvroute.sync.deltas").ok(),
            failed: hostcalls::define_metric(c, "kvroute.sync.fetch_failures").ok(),
            version_gauge: hostcalls::define_metric(
                MetricType::Gauge,
                "kvroute.sync.snapshot_version",
            )
            .ok(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.get_current_time().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }

    fn count(id: Option<u32>) {
        if let Some(id) = id {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }

    pub fn start(&mut self) {
        self.set_tick_period(Duration::from_millis(self.cfg.interval_ms));
    }

    fn version(&self) -> u64 {
        self.full.as_ref().map_or(0, |s| s.version)
    }

    fn write_head(&self) {
        let _ = hostcalls::set_shared_data(HEAD_KEY, Some(&self.head.encode()), None);
    }

    fn publish_full(&mut self, encoded: Option<Vec<u8>>) {
        let Some(full) = &self.full else { return };
        let bytes = encoded.unwrap_or_else(|| full.encode());
        let _ = hostcalls::set_shared_data(DATA_KEY, Some(&bytes), None);
        self.head.full_version = full.version;
        self.deltas_since_full = 0;
    }

    fn take_full(&mut self, body: Vec<u8>) -> Result<(), String> {
        let snap = Snapshot::decode(&body).map_err(|e| e.to_string())?;
        self.head.version = snap.version;
        self.head.ring.clear();
        self.full = Some(snap);
        self.publish_full(Some(body));
        Self::count(self.fetched_full);
        Ok(())
    }

    fn take_delta(&mut self, body: Vec<u8>) -> Result<(), String> {
        let d = Delta::decode(&body).map_err(|e| e.to_string())?;
        let Some(full) = self.full.as_mut() else { return Err("delta without a base".into()) };
        full.apply_delta(&d).map_err(|e| e.to_string())?;
        let slot = self.next_slot;
        self.next_slot = ((slot as usize + 1) % RING) as u8;
        // Unlist the slot before overwriting it, so no thread trusts a half-written chain.
        self.head.ring.retain(|e| e.slot != slot);
        self.write_head();
        let _ = hostcalls::set_shared_data(&delta_key(slot), Some(&body), None);
        self.head.ring.push(RingEntry { slot, from: d.from_version, to: d.to_version });
        self.head.version = d.to_version;
        self.deltas_since_full += 1;
        if self.deltas_since_full >= FULL_EVERY {
            self.publish_full(None);
        }
        Self::count(self.fetched_delta);
        Ok(())
    }
}

impl Context for SnapshotSync {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        self.pending = false;
        let status = self.get_http_call_response_header(":status").unwrap_or_default();
        let now = self.now_ms();
        let taken = match status.as_str() {
            "304" => Ok(()),
            "200" => {
                let body = self.get_http_call_response_body(0, body_size).unwrap_or_default();
                if is_delta(&body) {
                    self.take_delta(body)
                } else {
                    self.take_full(body)
                }
            }
            other => Err(format!("updater answered {other}")),
        };
        match taken {
            Ok(()) => {
                self.head.checked_at_ms = now;
                self.write_head();
                if let Some(id) = self.version_gauge {
                    let _ = hostcalls::record_metric(id, self.head.version);
                }
            }
            Err(e) => {
                log::debug!("kvroute: snapshot sync: {e}");
                if self.full.is_some() && status == "200" {
                    // Out of step with the updater: start over from a full snapshot.
                    self.full = None;
                }
                Self::count(self.failed);
            }
        }
    }
}

impl RootContext for SnapshotSync {
    fn on_tick(&mut self) {
        if self.pending {
            return;
        }
        let path = format!("/v1/snapshot?since={}", self.version());
        let headers = vec![
            (":method", "GET"),
            (":path", path.as_str()),
            (":authority", self.cfg.authority.as_str()),
            ("x-kvroute-token", self.cfg.token.as_str()),
        ];
        let timeout = Duration::from_millis(self.cfg.timeout_ms);
        match self.dispatch_http_call(&self.cfg.cluster, headers, None, vec![], timeout) {
            Ok(_) => self.pending = true,
            Err(_) => Self::count(self.failed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_round_trips_and_rejects_truncation() {
        let h = Head {
            version: 9,
            checked_at_ms: 1234,
            full_version: 7,
            ring: vec![
                RingEntry { slot: 3, from: 7, to: 8 },
                RingEntry { slot: 4, from: 8, to: 9 },
            ],
        };
        let b = h.encode();
        assert_eq!(Head::decode(&b), Some(h.clone()));
        for n in 0..b.len() {
            assert_eq!(Head::decode(&b[..n]), None);
        }
        assert_eq!(h.next_after(7).map(|e| e.slot), Some(3));
        assert_eq!(h.next_after(9), None);
    }
}
