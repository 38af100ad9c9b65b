//! Cross-replica knowledge: what other Envoy replicas routed, as the updater relays it.
//!
//! Each replica's singleton reports its recent routing credits (which worker will hold which
//! blocks) and its in-flight load per worker to the updater (`POST /v1/peers`, a
//! [`PeerReport`]); the updater keeps them briefly and publishes them in snapshots and deltas
//! as a [`PeerSection`], from which every other replica's threads credit the peer's blocks
//! (source `Peer`) and add the peer's in-flight work to their own load estimate. A replica
//! ignores entries carrying its own replica id.
//!
//! Loads name workers by [`crate::decision::load::worker_key`] (what the singleton reads from
//! the load shards); credits name them by address (what the journal holds).
//!
//! Layouts (little-endian; decoders never panic and check counts against the payload before
//! allocating):
//! - load entry (40 bytes): `replica` u64, `worker_key` u64, `at_ms` u64, `inflight` u32,
//!   `prefilling` u32, `prefill_tokens` u64; with arrivals (44 bytes) followed by
//!   `arriving_tokens_per_s` u32;
//! - credit entry: `replica` u64, u16-length worker, `at_ms` u64, hashes (u32 count; each u64);
//! - section (trailing part of snapshot format 4 and delta format 3): `ttl_ms` u64,
//!   `load_ttl_ms` u64, loads (u32 count), credits (u32 count); its load entries carry
//!   arrivals where the snapshot's or delta's sections byte says so (snapshot bit 16, delta
//!   bit 32), which the updater sets only for callers that ask (`arrivals=1`) and only while
//!   some load has arrivals, so other callers get the bytes they always did;
//! - report: `KVRP`, format byte, `replica` u64, `seq` u64, loads (u32 count), credits (u32
//!   count); the updater stamps `replica` and `at_ms` itself. Format 2's load entries carry
//!   arrivals, format 1's do not (what an updater before them reads: a replica whose format 2
//!   report is refused sends format 1 from then on).

use std::collections::BTreeMap;

use thiserror::Error;

use crate::wire::Reader;
use crate::wire::{put_str, read_str, DecodeLimits, SnapshotError};

/// Format byte of a [`PeerReport`] whose load entries carry arrivals.
pub const REPORT_FORMAT: u8 = 2;
/// Format byte of a [`PeerReport`] without arrivals (what updaters before them read).
pub const REPORT_FORMAT_PLAIN: u8 = 1;
const REPORT_MAGIC: &[u8; 4] = b"KVRP";
const LOAD_LEN: usize = 40;
/// A load entry with its arrivals.
const LOAD_LEN_ARRIVALS: usize = 44;
/// Most load entries one section or report may list.
pub const MAX_PEER_LOADS: usize = 1 << 16;
/// Most credit entries one section or report may list.
pub const MAX_PEER_CREDITS: usize = 1 << 16;

/// One replica's router-tracked load on one worker (a zero load: it has none there any more).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerLoad {
    pub replica: u64,
    pub worker_key: u64,
    /// When the updater received it (unix ms, the updater's clock).
    pub at_ms: u64,
    pub inflight: u32,
    /// Requests not at their first response byte yet.
    pub prefilling: u32,
    /// Uncached prompt tokens of the prefilling requests.
    pub prefill_tokens: u64,
    /// Uncached prompt tokens this replica sent the worker per second lately
    /// ([`crate::decision::load::WorkerLoad::arriving_tokens_per_s`]); 0 where the sender's
    /// format or the reader's request carries none.
    pub arriving_tokens_per_s: u32,
}

impl PeerLoad {
    pub fn is_zero(&self) -> bool {
        self.inflight == 0
            && self.prefilling == 0
            && self.prefill_tokens == 0
            && self.arriving_tokens_per_s == 0
    }

    /// The same load with nothing left (a removal marker).
    pub fn zeroed(&self) -> PeerLoad {
        PeerLoad {
            inflight: 0,
            prefilling: 0,
            prefill_tokens: 0,
            arriving_tokens_per_s: 0,
            ..*self
        }
    }
}

/// Blocks a replica routed to a worker (which will hold them once it prefilled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerCredit {
    pub replica: u64,
    pub worker: String,
    /// When the updater received it (unix ms).
    pub at_ms: u64,
    pub hashes: Vec<u64>,
}

/// Peer knowledge in a snapshot (everything live) or a delta (what changed: new credits, new
/// load values, zero loads for loads that went away).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerSection {
    /// Credits older than this (against the snapshot's `generated_at_ms`) are dropped.
    pub ttl_ms: u64,
    /// Loads not refreshed for this long stop counting.
    pub load_ttl_ms: u64,
    pub loads: Vec<PeerLoad>,
    pub credits: Vec<PeerCredit>,
}

/// What a replica sends the updater.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerReport {
    pub replica: u64,
    /// Increases with every report of this replica; loads of an older report are ignored.
    pub seq: u64,
    pub loads: Vec<PeerLoad>,
    pub credits: Vec<PeerCredit>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PeerError {
    #[error("not a kvroute peer report")]
    Magic,
    #[error(
        "peer report format {0} is not supported (expected {REPORT_FORMAT_PLAIN} or {REPORT_FORMAT})"
    )]
    Format(u8),
    #[error(transparent)]
    Body(#[from] SnapshotError),
}

/// The load entries, each with its arrivals where `arrivals`.
fn put_loads(out: &mut Vec<u8>, loads: &[PeerLoad], arrivals: bool) {
    let loads = &loads[..loads.len().min(MAX_PEER_LOADS)];
    out.extend_from_slice(&(loads.len() as u32).to_le_bytes());
    for l in loads {
        for v in [l.replica, l.worker_key, l.at_ms] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&l.inflight.to_le_bytes());
        out.extend_from_slice(&l.prefilling.to_le_bytes());
        out.extend_from_slice(&l.prefill_tokens.to_le_bytes());
        if arrivals {
            out.extend_from_slice(&l.arriving_tokens_per_s.to_le_bytes());
        }
    }
}

fn put_credits(out: &mut Vec<u8>, credits: &[PeerCredit]) {
    let credits = &credits[..credits.len().min(MAX_PEER_CREDITS)];
    out.extend_from_slice(&(credits.len() as u32).to_le_bytes());
    for c in credits {
        out.extend_from_slice(&c.replica.to_le_bytes());
        put_str(out, &c.worker);
        out.extend_from_slice(&c.at_ms.to_le_bytes());
        crate::wire::put_hashes(out, &c.hashes);
    }
}

fn read_loads(r: &mut Reader<'_>, arrivals: bool) -> Result<Vec<PeerLoad>, SnapshotError> {
    let t = || SnapshotError::Truncated;
    let n = r.u32().ok_or_else(t)? as usize;
    if n > MAX_PEER_LOADS {
        return Err(SnapshotError::TooLarge(n));
    }
    if r.remaining() < n * if arrivals { LOAD_LEN_ARRIVALS } else { LOAD_LEN } {
        return Err(t());
    }
    (0..n)
        .map(|_| {
            Ok(PeerLoad {
                replica: r.u64().ok_or_else(t)?,
                worker_key: r.u64().ok_or_else(t)?,
                at_ms: r.u64().ok_or_else(t)?,
                inflight: r.u32().ok_or_else(t)?,
                prefilling: r.u32().ok_or_else(t)?,
                prefill_tokens: r.u64().ok_or_else(t)?,
                arriving_tokens_per_s: if arrivals { r.u32().ok_or_else(t)? } else { 0 },
            })
        })
        .collect()
}

fn read_credits(
    r: &mut Reader<'_>,
    limits: &DecodeLimits,
) -> Result<Vec<PeerCredit>, SnapshotError> {
    let t = || SnapshotError::Truncated;
    let n = r.u32().ok_or_else(t)? as usize;
    if n > MAX_PEER_CREDITS {
        return Err(SnapshotError::TooLarge(n));
    }
    // Each credit takes at least 22 bytes.
    if r.remaining() < n * 22 {
        return Err(t());
    }
    (0..n)
        .map(|_| {
            Ok(PeerCredit {
                replica: r.u64().ok_or_else(t)?,
                worker: read_str(r)?,
                at_ms: r.u64().ok_or_else(t)?,
                hashes: crate::wire::hashes(r, limits)?,
            })
        })
        .collect()
}

impl PeerSection {
    pub fn is_empty(&self) -> bool {
        self.loads.is_empty() && self.credits.is_empty()
    }

    /// Hashes and entries it holds (what bounds the updater's delta ring count).
    pub fn weight(&self) -> usize {
        self.loads.len() + self.credits.iter().map(|c| 1 + c.hashes.len()).sum::<usize>()
    }

    /// Whether some load carries arrivals: then its load entries are written with them, and
    /// the snapshot or delta says so in its sections byte.
    pub fn has_arrivals(&self) -> bool {
        self.loads.iter().any(|l| l.arriving_tokens_per_s != 0)
    }

    /// The section for a reader that does not read arrivals (`arrivals=1` not asked): its
    /// loads without them (a load with nothing else becomes a removal marker, which is what
    /// it is to that reader).
    pub fn without_arrivals(self) -> PeerSection {
        let loads =
            self.loads.iter().map(|l| PeerLoad { arriving_tokens_per_s: 0, ..*l }).collect();
        PeerSection { loads, ..self }
    }

    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ttl_ms.to_le_bytes());
        out.extend_from_slice(&self.load_ttl_ms.to_le_bytes());
        put_loads(out, &self.loads, self.has_arrivals());
        put_credits(out, &self.credits);
    }

    /// Reads a section whose load entries carry arrivals where `arrivals`.
    pub(crate) fn decode_from(
        r: &mut Reader<'_>,
        limits: &DecodeLimits,
        arrivals: bool,
    ) -> Result<PeerSection, SnapshotError> {
        let t = || SnapshotError::Truncated;
        Ok(PeerSection {
            ttl_ms: r.u64().ok_or_else(t)?,
            load_ttl_ms: r.u64().ok_or_else(t)?,
            loads: read_loads(r, arrivals)?,
            credits: read_credits(r, limits)?,
        })
    }

    pub(crate) fn encoded_len(&self) -> usize {
        let load_len = if self.has_arrivals() { LOAD_LEN_ARRIVALS } else { LOAD_LEN };
        20 + load_len * self.loads.len()
            + self.credits.iter().map(|c| 22 + c.worker.len() + 8 * c.hashes.len()).sum::<usize>()
    }

    /// Takes in a newer section (a delta's changes): loads replace the same replica's load on
    /// the same worker, credits are added, and then whatever is past its TTL at `now_ms` goes.
    /// With `keep_zero` (composing deltas) zero loads stay as removal markers; otherwise (a
    /// full view) they remove the load.
    pub fn merge(&mut self, newer: &PeerSection, now_ms: u64, keep_zero: bool) {
        self.ttl_ms = newer.ttl_ms;
        self.load_ttl_ms = newer.load_ttl_ms;
        let mut loads: BTreeMap<(u64, u64), PeerLoad> =
            self.loads.iter().map(|l| ((l.replica, l.worker_key), *l)).collect();
        for l in &newer.loads {
            loads.insert((l.replica, l.worker_key), *l);
        }
        self.loads = loads.into_values().filter(|l| keep_zero || !l.is_zero()).collect();
        self.credits.extend(newer.credits.iter().cloned());
        self.expire(now_ms, keep_zero);
    }

    /// Drops credits past `ttl_ms` and (unless `keep_zero`, where a stale load still matters
    /// as the latest value) loads past `load_ttl_ms`; also keeps at most
    /// [`MAX_PEER_CREDITS`] / [`MAX_PEER_LOADS`], the newest.
    pub fn expire(&mut self, now_ms: u64, keep_zero: bool) {
        let (ttl, load_ttl) = (self.ttl_ms, self.load_ttl_ms);
        self.credits.retain(|c| now_ms.saturating_sub(c.at_ms) < ttl);
        if !keep_zero {
            self.loads.retain(|l| now_ms.saturating_sub(l.at_ms) < load_ttl);
        }
        if self.credits.len() > MAX_PEER_CREDITS {
            let cut = self.credits.len() - MAX_PEER_CREDITS;
            self.credits.drain(..cut);
        }
        if self.loads.len() > MAX_PEER_LOADS {
            self.loads.sort_by_key(|l| std::cmp::Reverse(l.at_ms));
            self.loads.truncate(MAX_PEER_LOADS);
        }
    }

    /// The changes from `old` to `new`: loads that differ (zero for those gone), credits not
    /// in `old`. `None` when nothing changed.
    pub fn between(old: Option<&PeerSection>, new: Option<&PeerSection>) -> Option<PeerSection> {
        let empty = PeerSection::default();
        let (old, new) = match (old, new) {
            (None, None) => return None,
            (o, n) => (o.unwrap_or(&empty), n.unwrap_or(&empty)),
        };
        let mut loads: Vec<PeerLoad> =
            new.loads.iter().filter(|l| !old.loads.contains(l)).copied().collect();
        for l in &old.loads {
            let key = (l.replica, l.worker_key);
            if !new.loads.iter().any(|n| (n.replica, n.worker_key) == key) {
                loads.push(l.zeroed());
            }
        }
        let credits: Vec<PeerCredit> =
            new.credits.iter().filter(|c| !old.credits.contains(c)).cloned().collect();
        let same_ttl = old.ttl_ms == new.ttl_ms && old.load_ttl_ms == new.load_ttl_ms;
        if loads.is_empty() && credits.is_empty() && same_ttl {
            return None;
        }
        Some(PeerSection { ttl_ms: new.ttl_ms, load_ttl_ms: new.load_ttl_ms, loads, credits })
    }

    /// The section without `replica`'s own entries (what that replica is sent).
    pub fn without(&self, replica: u64) -> PeerSection {
        PeerSection {
            ttl_ms: self.ttl_ms,
            load_ttl_ms: self.load_ttl_ms,
            loads: self.loads.iter().filter(|l| l.replica != replica).copied().collect(),
            credits: self.credits.iter().filter(|c| c.replica != replica).cloned().collect(),
        }
    }
}

impl PeerReport {
    /// Format 2: the loads with their arrivals.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with(true)
    }

    /// Format 2 where `arrivals`, else format 1 (the loads without them, for an updater that
    /// reads format 1 only).
    pub fn encode_with(&self, arrivals: bool) -> Vec<u8> {
        let load_len = if arrivals { LOAD_LEN_ARRIVALS } else { LOAD_LEN };
        let mut out = Vec::with_capacity(
            29 + load_len * self.loads.len()
                + self
                    .credits
                    .iter()
                    .map(|c| 22 + c.worker.len() + 8 * c.hashes.len())
                    .sum::<usize>(),
        );
        out.extend_from_slice(REPORT_MAGIC);
        out.push(if arrivals { REPORT_FORMAT } else { REPORT_FORMAT_PLAIN });
        out.extend_from_slice(&self.replica.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        put_loads(&mut out, &self.loads, arrivals);
        put_credits(&mut out, &self.credits);
        out
    }

    /// Decodes format 1 or 2 within `limits` (hashes per credit bounded by
    /// `max_hashes_per_worker`).
    pub fn decode_with(bytes: &[u8], limits: &DecodeLimits) -> Result<PeerReport, PeerError> {
        let mut r = Reader::new(bytes);
        let t = || PeerError::Body(SnapshotError::Truncated);
        if r.take(4).ok_or_else(t)? != REPORT_MAGIC {
            return Err(PeerError::Magic);
        }
        let format = r.u8().ok_or_else(t)?;
        if format != REPORT_FORMAT && format != REPORT_FORMAT_PLAIN {
            return Err(PeerError::Format(format));
        }
        let replica = r.u64().ok_or_else(t)?;
        let seq = r.u64().ok_or_else(t)?;
        let loads = read_loads(&mut r, format == REPORT_FORMAT)?;
        let credits = read_credits(&mut r, limits)?;
        if r.remaining() != 0 {
            return Err(SnapshotError::Trailing.into());
        }
        Ok(PeerReport { replica, seq, loads, credits })
    }

    pub fn is_empty(&self) -> bool {
        self.loads.is_empty() && self.credits.is_empty()
    }
}

#[cfg(test)]
mod tests;
