//! This replica's side of cross-replica knowledge: its id, and what the singleton forwards to
//! the updater.
//!
//! **Why the singleton forwards on a short tick** (rather than each request context sending
//! its own HTTP call): the journal and the load shards in shared data already hold every
//! decision of every thread of this Envoy, with leases that bound leaks. The singleton reads
//! them every `forward_ms` (5 ms by default) and sends at most one small report in flight: one
//! call per tick however many requests arrived (batched, bounded by `max_hashes_per_report`),
//! nothing added to the request path, the updater's token only in the singleton's config, and
//! load sent as per-worker totals, so a lost report or a dead replica can only leave a load
//! that expires at the updater and at every reader (`load_ttl_ms`). The cost is up to one
//! tick of delay, well inside the 25 ms freshness goal.
//!
//! The replica id is random per Envoy process, created once in shared data (`kvroute.replica.id`)
//! by whichever of the singleton and the threads comes first; everyone re-reads it on its tick.

use std::collections::{BTreeMap, HashMap};

use super::journal::JournalCursor;
use super::load::{limits, LoadView};
use super::{Counters, SharedStore};
use crate::decision::config::sync::{LoadLimits, PeerSyncConfig};
use crate::decision::load::WorkerLoad;
use crate::wire::journal::Source;
use crate::wire::peers::{PeerCredit, PeerLoad, PeerReport};

pub const REPLICA_KEY: &str = "kvroute.replica.id";

/// The replica id in shared data, if one was created.
pub fn read_replica<S: SharedStore + ?Sized>(store: &S) -> Option<u64> {
    let bytes = store.get(REPLICA_KEY).0?;
    let id = u64::from_le_bytes(bytes.as_slice().try_into().ok()?);
    (id != 0).then_some(id)
}

/// This Envoy's replica id: the one in shared data, or (none yet) `seed` written there. Two
/// first writers may race; the later write wins and both read it back (and again on each tick).
pub fn replica_id<S: SharedStore + ?Sized>(store: &S, seed: u64) -> u64 {
    if let Some(id) = read_replica(store) {
        return id;
    }
    let id = seed.max(1);
    let _ = store.set(REPLICA_KEY, &id.to_le_bytes(), None);
    read_replica(store).unwrap_or(id)
}

/// The singleton's reader of this replica's decisions and load.
#[derive(Debug)]
pub struct Forwarder {
    cfg: PeerSyncConfig,
    seq: u64,
    cursor: JournalCursor,
    /// Credits read from the journal and not sent yet, per worker (hashes in routing order).
    pending: BTreeMap<String, (u64, Vec<u64>)>,
    pending_hashes: usize,
    /// The loads last sent, by worker key.
    sent: HashMap<u64, WorkerLoad>,
    last_sent_ms: u64,
    /// Reports go out in format 1, without arrivals: the updater refused format 2.
    plain: bool,
}

/// What one poll found.
#[derive(Debug, Default)]
pub struct Forwarded {
    pub report: Option<PeerReport>,
    /// Hashes dropped because reports could not keep up.
    pub dropped_hashes: u64,
}

impl Forwarder {
    /// Starts at the journal's current head: what was routed before is not reported.
    pub fn new<S: SharedStore + ?Sized>(store: &S, cfg: PeerSyncConfig) -> Forwarder {
        Forwarder {
            cfg,
            seq: 0,
            cursor: JournalCursor::at_head(store),
            pending: BTreeMap::new(),
            pending_hashes: 0,
            sent: HashMap::new(),
            last_sent_ms: 0,
            plain: false,
        }
    }

    pub fn config(&self) -> &PeerSyncConfig {
        &self.cfg
    }

    /// Reads new routing credits from the journal and the current loads from the shards; a
    /// report when there is something to send (new credits, changed loads, a heartbeat due).
    /// `replica` is this replica's id.
    pub fn poll<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        counters: &dyn Counters,
        replica: u64,
        now_ms: u64,
    ) -> Forwarded {
        let mut out = Forwarded::default();
        let cap = self.cfg.max_hashes_per_report;
        loop {
            let (entries, more) = self.cursor.poll(store, counters, cap);
            for e in entries.into_iter().filter(|e| !e.retract && e.source == Source::Routed) {
                self.pending_hashes += e.hashes.len();
                let (at, list) = self.pending.entry(e.worker).or_default();
                *at = (*at).max(e.at_ms);
                list.extend_from_slice(&e.hashes);
            }
            if !more {
                break;
            }
        }
        out.dropped_hashes = self.shed(4 * cap);
        let view = LoadView::read_all(store, counters, self.load_limits(store), now_ms);
        let current: HashMap<u64, WorkerLoad> =
            // The elapsed time moves every millisecond and does not travel: only counts do (and
            // the squares are rebuilt from the counts on the other side).
            view.loads()
                .map(|(k, l)| (k, WorkerLoad { prefill_elapsed_ms: 0, prefill_sq_tokens: 0, ..l }))
                .filter(|(_, l)| *l != WorkerLoad::default())
                .collect();
        let heartbeat = !current.is_empty()
            && now_ms.saturating_sub(self.last_sent_ms) >= self.cfg.heartbeat_ms;
        let mut loads: Vec<PeerLoad> = current
            .iter()
            .filter(|(k, l)| heartbeat || self.sent.get(k) != Some(l))
            .map(|(k, l)| peer_load(replica, *k, l))
            .collect();
        loads.extend(
            self.sent
                .keys()
                .filter(|k| !current.contains_key(k))
                .map(|k| peer_load(replica, *k, &WorkerLoad::default())),
        );
        if loads.is_empty() && self.pending.is_empty() {
            return out;
        }
        let credits = self.take_credits(replica, cap);
        self.sent = current;
        self.last_sent_ms = now_ms;
        self.seq += 1;
        out.report = Some(PeerReport { replica, seq: self.seq, loads, credits });
        out
    }

    /// The limits the filter's threads read the load shards with (published by them, see
    /// [`limits`]), the arrival window overridden where `peers.arrival_window_ms` is set.
    fn load_limits<S: SharedStore + ?Sized>(&self, store: &S) -> LoadLimits {
        let threads = limits::published(store, LoadLimits::default());
        match self.cfg.arrival_window_ms {
            Some(w) => LoadLimits { arrival_window_ms: w, ..threads },
            None => threads,
        }
    }

    /// The report could not be delivered: every load is sent again with the next one.
    pub fn failed(&mut self) {
        self.sent.clear();
    }

    /// The updater refused the report as malformed (400): one that reads format 1 only
    /// refuses format 2, so reports go out in format 1 from now on (their arrivals are lost,
    /// the rest is not), and every load is sent again. True when this changed the format.
    pub fn refused(&mut self) -> bool {
        self.failed();
        !std::mem::replace(&mut self.plain, true)
    }

    /// The report's bytes, in the format the updater reads.
    pub fn encode(&self, report: &PeerReport) -> Vec<u8> {
        report.encode_with(!self.plain)
    }

    /// Up to `cap` pending hashes as credits (a worker's list is cut, its rest kept).
    fn take_credits(&mut self, replica: u64, cap: usize) -> Vec<PeerCredit> {
        let mut credits = Vec::new();
        let mut room = cap;
        while room > 0 {
            let Some((worker, (at_ms, mut hashes))) = self.pending.pop_first() else { break };
            let rest = if hashes.len() > room { hashes.split_off(room) } else { Vec::new() };
            room -= hashes.len();
            self.pending_hashes -= hashes.len();
            if !rest.is_empty() {
                self.pending.insert(worker.clone(), (at_ms, rest));
            }
            credits.push(PeerCredit { replica, worker, at_ms, hashes });
        }
        credits
    }

    /// Drops pending hashes past `max`, the largest worker lists first.
    fn shed(&mut self, max: usize) -> u64 {
        let mut dropped = 0u64;
        while self.pending_hashes > max {
            let Some(w) =
                self.pending.iter().max_by_key(|(_, (_, l))| l.len()).map(|(w, _)| w.clone())
            else {
                break;
            };
            if let Some((_, l)) = self.pending.remove(&w) {
                self.pending_hashes -= l.len();
                dropped += l.len() as u64;
            }
        }
        dropped
    }
}

fn peer_load(replica: u64, worker_key: u64, l: &WorkerLoad) -> PeerLoad {
    PeerLoad {
        replica,
        worker_key,
        at_ms: 0,
        inflight: l.inflight_requests,
        prefilling: l.prefilling_requests,
        prefill_tokens: l.prefill_tokens,
        arriving_tokens_per_s: u32::try_from(l.arriving_tokens_per_s).unwrap_or(u32::MAX),
    }
}

#[cfg(test)]
mod tests;
