//! Other Envoy replicas' recent routing, kept briefly: a knowledge source of its own beside
//! the workers' KV events. Each replica's singleton reports (`POST /v1/peers`) the blocks it
//! just routed and its in-flight load per worker; the store keeps credits for `ttl_ms` and
//! loads for `load_ttl_ms` (a replica re-sends its loads while it holds any), and hands every
//! change to the next publication, which is published at once.
//!
//! Bounded: at most `max_replicas` replicas, `max_hashes` credited hashes in all (the oldest
//! credits go first), and the caller caps each report's body. Every drop is counted.

use std::collections::{BTreeMap, VecDeque};

use kvroute_core::wire::peers::{PeerCredit, PeerLoad, PeerReport, PeerSection};

/// Bounds and lifetimes of the peer store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerLimits {
    /// Credits older than this are dropped.
    pub ttl_ms: u64,
    /// Loads not refreshed for this long are dropped.
    pub load_ttl_ms: u64,
    pub max_replicas: usize,
    /// Most credited hashes held, over all replicas and workers.
    pub max_hashes: usize,
    /// Largest report body accepted (bytes).
    pub max_report_bytes: usize,
}

impl Default for PeerLimits {
    fn default() -> Self {
        PeerLimits {
            ttl_ms: 10_000,
            load_ttl_ms: 3_000,
            max_replicas: 256,
            max_hashes: 1 << 20,
            max_report_bytes: 1 << 20,
        }
    }
}

/// What the store counted (`/status` and `/metrics`).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct PeerStats {
    pub reports: u64,
    /// Reports refused: a new replica past `max_replicas`, a body too large or malformed.
    pub refused: u64,
    /// Loads of a report older than one already applied (reordered delivery).
    pub stale_loads: u64,
    pub credits: u64,
    /// Hashes dropped to stay under `max_hashes`.
    pub dropped_hashes: u64,
    pub expired_credits: u64,
    pub expired_loads: u64,
}

/// Why a report was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error("too many replicas (max {0})")]
    Replicas(usize),
    #[error("replica id 0 is reserved")]
    NoReplica,
}

#[derive(Debug, Default)]
struct Replica {
    last_seq: u64,
    last_seen_ms: u64,
}

#[derive(Debug)]
pub struct PeerStore {
    limits: PeerLimits,
    replicas: BTreeMap<u64, Replica>,
    loads: BTreeMap<(u64, u64), PeerLoad>,
    credits: VecDeque<PeerCredit>,
    hashes: usize,
    /// Changes not published yet.
    pending: PeerSection,
    pub stats: PeerStats,
}

impl PeerStore {
    pub fn new(limits: PeerLimits) -> PeerStore {
        PeerStore {
            limits,
            replicas: BTreeMap::new(),
            loads: BTreeMap::new(),
            credits: VecDeque::new(),
            hashes: 0,
            pending: PeerSection::default(),
            stats: PeerStats::default(),
        }
    }

    pub fn limits(&self) -> &PeerLimits {
        &self.limits
    }

    /// Takes a report received at `now_ms` (the updater's clock stamps every entry).
    pub fn report(&mut self, r: PeerReport, now_ms: u64) -> Result<(), Refused> {
        if r.replica == 0 {
            self.stats.refused += 1;
            return Err(Refused::NoReplica);
        }
        self.expire(now_ms);
        if !self.replicas.contains_key(&r.replica)
            && self.replicas.len() >= self.limits.max_replicas
        {
            self.stats.refused += 1;
            return Err(Refused::Replicas(self.limits.max_replicas));
        }
        self.stats.reports += 1;
        let rep = self.replicas.entry(r.replica).or_default();
        rep.last_seen_ms = now_ms;
        let fresh = r.seq > rep.last_seq;
        if fresh {
            rep.last_seq = r.seq;
            for l in r.loads {
                let l = PeerLoad { replica: r.replica, at_ms: now_ms, ..l };
                if l.is_zero() {
                    if self.loads.remove(&(l.replica, l.worker_key)).is_some() {
                        self.pending.loads.push(l);
                    }
                } else {
                    self.loads.insert((l.replica, l.worker_key), l);
                    self.pending.loads.push(l);
                }
            }
        } else if !r.loads.is_empty() {
            self.stats.stale_loads += 1;
        }
        for c in r.credits.into_iter().filter(|c| !c.hashes.is_empty()) {
            let c = PeerCredit { replica: r.replica, at_ms: now_ms, ..c };
            self.stats.credits += 1;
            self.hashes += c.hashes.len();
            self.pending.credits.push(c.clone());
            self.credits.push_back(c);
        }
        while self.hashes > self.limits.max_hashes {
            let Some(c) = self.credits.pop_front() else { break };
            self.hashes -= c.hashes.len();
            self.stats.dropped_hashes += c.hashes.len() as u64;
        }
        Ok(())
    }

    /// Drops credits and loads past their lifetimes (receivers expire them on their own, so
    /// nothing is published for it) and replicas with neither.
    pub fn expire(&mut self, now_ms: u64) {
        while let Some(c) = self.credits.front() {
            if now_ms.saturating_sub(c.at_ms) < self.limits.ttl_ms {
                break;
            }
            self.hashes -= c.hashes.len();
            self.credits.pop_front();
            self.stats.expired_credits += 1;
        }
        let ttl = self.limits.load_ttl_ms;
        let before = self.loads.len();
        self.loads.retain(|_, l| now_ms.saturating_sub(l.at_ms) < ttl);
        self.stats.expired_loads += (before - self.loads.len()) as u64;
        let keep = self.limits.ttl_ms.max(ttl);
        self.replicas.retain(|_, r| now_ms.saturating_sub(r.last_seen_ms) < keep);
    }

    /// The changes since the last call, if any.
    pub fn take_pending(&mut self) -> Option<PeerSection> {
        if self.pending.is_empty() {
            return None;
        }
        let mut p = std::mem::take(&mut self.pending);
        p.ttl_ms = self.limits.ttl_ms;
        p.load_ttl_ms = self.limits.load_ttl_ms;
        Some(p)
    }

    /// Everything live (a full snapshot's section).
    pub fn section(&self) -> PeerSection {
        PeerSection {
            ttl_ms: self.limits.ttl_ms,
            load_ttl_ms: self.limits.load_ttl_ms,
            loads: self.loads.values().copied().collect(),
            credits: self.credits.iter().cloned().collect(),
        }
    }

    /// Replicas known (that reported and were not expired).
    pub fn replicas(&self) -> usize {
        self.replicas.len()
    }

    /// Credited hashes held, all replicas together.
    pub fn hashes(&self) -> usize {
        self.hashes
    }

    /// `/status`: per replica, its loads (by worker key) and credited hashes.
    pub fn status(&self) -> serde_json::Value {
        let replicas: serde_json::Map<String, serde_json::Value> = self
            .replicas
            .iter()
            .map(|(id, r)| {
                let loads: Vec<serde_json::Value> = self
                    .loads
                    .values()
                    .filter(|l| l.replica == *id)
                    .map(|l| {
                        serde_json::json!({
                            "worker_key": format!("{:016x}", l.worker_key),
                            "inflight": l.inflight,
                            "prefilling": l.prefilling,
                            "prefill_tokens": l.prefill_tokens,
                            "arriving_tokens_per_s": l.arriving_tokens_per_s,
                        })
                    })
                    .collect();
                let hashes: usize =
                    self.credits.iter().filter(|c| c.replica == *id).map(|c| c.hashes.len()).sum();
                (
                    format!("{id:016x}"),
                    serde_json::json!({"last_seq": r.last_seq, "loads": loads, "hashes": hashes}),
                )
            })
            .collect();
        serde_json::json!({ "replicas": replicas, "hashes": self.hashes, "stats": self.stats })
    }
}

#[cfg(test)]
mod tests;
