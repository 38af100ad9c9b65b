//! Sequenced snapshot deltas: what changed in the updater's knowledge between two snapshot
//! versions. A delta from version `a` to `b` applies only to a snapshot at version `a`; anything
//! else (a gap) means fetching a full [`Snapshot`]. Little-endian binary with its own magic and
//! format byte; the decoder never panics (fuzz target `delta_decode`).
//!
//! Per worker a delta carries the worker's current head (event age, config verdict, reported
//! load), an optional reset (drop every block first), its base model and adapter list when
//! they changed, then removed and added hashes per tier class. The snapshot's model list
//! travels when it changed. Hash lists in snapshots are kept sorted, which makes diffs a
//! linear merge.
//!
//! Layout (format 2): `KVRD`, format byte, `from_version`, `to_version`, `generated_at_ms`
//! (u64 each), a models flag u8 (1: the model list follows, as in a snapshot), workers (u32
//! count; each: the snapshot's worker head, a flags u8 (1 reset, 2 model follows, 4 adapters
//! follow; other bits are an error), the model, the adapters, then GPU removed, GPU added,
//! offloaded removed, offloaded added (u32 count; each u64)).
//! Format 3 is format 2 followed by a [`PeerSection`] with the peer changes (new credits, new
//! loads, zero loads for loads gone); sent only to callers that ask for peers.
//! Format 4 is format 2 followed by a sections byte: bit 1 the snapshot is the updater's whole
//! pool ([`Snapshot::pool`]), bit 2 a [`PeerSection`] follows, bit 4 the workers removed from
//! the pool follow (u16 count; each u16-length name); other bits are an error. Sent only to
//! callers that ask for the pool (`pool=1`); formats 2 and 3 are unchanged.
//! Sections bit 8: the new list of workers down follows (u16 count; each u16-length name;
//! after the removed workers), when it changed ([`Snapshot::down`]); sent only to callers that
//! ask (`health=1`).
//! Sections bit 16: the new list of the workers' placements follows (after the workers down;
//! laid out as in a snapshot), when it changed ([`Snapshot::placements`]); sent only to callers
//! that ask (`placement=1`).
//! Sections bit 32: the peer section's load entries carry each replica's arrivals (see
//! [`crate::wire::peers`]); sent only to callers that ask (`arrivals=1`) and only while some
//! peer load in the delta has arrivals; set without bit 2 it is an error.

use std::collections::{BTreeMap, HashSet};

use thiserror::Error;

use crate::wire::peers::PeerSection;
use crate::wire::snapshot::{
    placements_len, put_head, put_models, put_names, put_placements, read_head, read_models,
    read_names, read_peer_sections, read_placements, ModelInfo, Snapshot, SnapshotLoad,
    SnapshotWorker, WorkerHead, WorkerPlacement, SECTION_PEERS, SECTION_POOL,
};
use crate::wire::{hashes, put_hashes, put_str, read_str, DecodeLimits, SnapshotError};

/// Sections byte: the new list of workers down follows.
const SECTION_DOWN: u8 = 8;
/// Sections byte: the new list of placements follows.
const SECTION_PLACEMENT: u8 = 16;
/// Sections byte: the peer section's load entries carry arrivals.
const SECTION_ARRIVALS: u8 = 32;
use crate::wire::Reader;

/// Format version of the delta encoding.
pub const DELTA_FORMAT: u8 = 2;
/// Format of a delta with a trailing peer section.
pub const DELTA_FORMAT_PEERS: u8 = 3;
/// Format of a delta with a trailing sections byte (pool flag, peers, removed workers).
pub const DELTA_FORMAT_SECTIONS: u8 = 4;
/// Sections byte: the list of removed workers follows.
const SECTION_REMOVED: u8 = 4;
const MAGIC: &[u8; 4] = b"KVRD";
const RESET: u8 = 1;
const HAS_MODEL: u8 = 2;
const HAS_ADAPTERS: u8 = 4;

/// Added and removed hashes of one tier class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetChange {
    pub add: Vec<u64>,
    pub remove: Vec<u64>,
}

impl SetChange {
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }

    /// The change from sorted `old` to sorted `new`.
    fn between(old: &[u64], new: &[u64]) -> SetChange {
        let (mut i, mut j) = (0, 0);
        let mut c = SetChange::default();
        while i < old.len() || j < new.len() {
            match (old.get(i), new.get(j)) {
                (Some(a), Some(b)) if a == b => {
                    i += 1;
                    j += 1;
                }
                (Some(a), Some(b)) if a < b => {
                    c.remove.push(*a);
                    i += 1;
                }
                (Some(a), None) => {
                    c.remove.push(*a);
                    i += 1;
                }
                (_, Some(b)) => {
                    c.add.push(*b);
                    j += 1;
                }
                (None, None) => break,
            }
        }
        c
    }

    /// Applies the change to a sorted, deduplicated list, keeping it so.
    fn apply(&self, list: &mut Vec<u64>) {
        if !self.remove.is_empty() {
            let gone: HashSet<u64> = self.remove.iter().copied().collect();
            list.retain(|h| !gone.contains(h));
        }
        if !self.add.is_empty() {
            list.extend_from_slice(&self.add);
            list.sort_unstable();
            list.dedup();
        }
    }
}

/// What changed for one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerDelta {
    pub worker: String,
    pub observed_at_ms: u64,
    pub compatible: bool,
    pub load: Option<SnapshotLoad>,
    /// Drop every known block of this worker before applying the changes.
    pub reset: bool,
    /// Its base model, when it changed (always for a worker new to the receiver).
    pub model: Option<String>,
    /// Its loaded LoRA adapters, when they changed (always for a new worker).
    pub adapters: Option<Vec<String>>,
    pub gpu: SetChange,
    pub offloaded: SetChange,
}

/// The changes from snapshot version `from_version` to `to_version`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    pub from_version: u64,
    pub to_version: u64,
    pub generated_at_ms: u64,
    /// The snapshot's new model list, when it changed.
    pub models: Option<Vec<ModelInfo>>,
    /// Workers with any change; the others are unchanged.
    pub workers: Vec<WorkerDelta>,
    /// Peer changes (format 3), when the caller asked for peers.
    pub peers: Option<PeerSection>,
    /// The snapshot it leads to is the updater's whole pool (format 4, [`Snapshot::pool`]).
    pub pool: bool,
    /// Workers that left the pool (sorted): a receiver forgets them (format 4).
    pub removed: Vec<String>,
    /// The snapshot's new list of workers down, when it changed ([`Snapshot::down`]).
    pub down: Option<Vec<String>>,
    /// The snapshot's new list of placements, when it changed ([`Snapshot::placements`]).
    pub placements: Option<Vec<WorkerPlacement>>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DeltaError {
    #[error("not a kvroute delta")]
    Magic,
    #[error(
        "delta format {0} is not supported (expected {DELTA_FORMAT} to {DELTA_FORMAT_SECTIONS})"
    )]
    Format(u8),
    #[error(transparent)]
    Body(#[from] SnapshotError),
    #[error("delta {from}->{to} does not apply to version {have}")]
    Gap { from: u64, to: u64, have: u64 },
}

/// Whether `bytes` start like a delta (rather than a full snapshot).
pub fn is_delta(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

impl WorkerDelta {
    /// What changed for one worker (hash lists sorted); `None` when nothing did.
    pub fn between(old: Option<&SnapshotWorker>, new: &SnapshotWorker) -> Option<WorkerDelta> {
        let empty = Vec::new();
        let gpu = SetChange::between(old.map_or(&empty, |p| &p.gpu), &new.gpu);
        let offloaded = SetChange::between(old.map_or(&empty, |p| &p.offloaded), &new.offloaded);
        let model = (old.map(|p| &p.model) != Some(&new.model)).then(|| new.model.clone());
        let adapters =
            (old.map(|p| &p.adapters) != Some(&new.adapters)).then(|| new.adapters.clone());
        let head_same = old.is_some_and(|p| {
            p.observed_at_ms == new.observed_at_ms
                && p.compatible == new.compatible
                && p.load == new.load
        });
        if head_same
            && model.is_none()
            && adapters.is_none()
            && gpu.is_empty()
            && offloaded.is_empty()
        {
            return None;
        }
        // After a clear, sending the new contents is shorter than listing every removal; a
        // worker that becomes compatible again is sent whole (receivers emptied its view).
        let reset = old.is_none()
            || old.is_some_and(|p| p.compatible != new.compatible)
            || gpu.remove.len() + offloaded.remove.len() > new.gpu.len() + new.offloaded.len();
        let (gpu, offloaded) = if reset {
            (
                SetChange { add: new.gpu.clone(), remove: Vec::new() },
                SetChange { add: new.offloaded.clone(), remove: Vec::new() },
            )
        } else {
            (gpu, offloaded)
        };
        Some(WorkerDelta {
            worker: new.worker.clone(),
            observed_at_ms: new.observed_at_ms,
            compatible: new.compatible,
            load: new.load,
            reset,
            model,
            adapters,
            gpu,
            offloaded,
        })
    }
}

impl Delta {
    /// The changes from `old` to `new` (both with sorted hash lists, as the updater makes them);
    /// when `new` is the whole pool, the workers it no longer lists are removed.
    pub fn between(old: &Snapshot, new: &Snapshot) -> Delta {
        let before: BTreeMap<&str, &SnapshotWorker> =
            old.workers.iter().map(|w| (w.worker.as_str(), w)).collect();
        let workers = new
            .workers
            .iter()
            .filter_map(|w| WorkerDelta::between(before.get(w.worker.as_str()).copied(), w))
            .collect();
        // Only a snapshot of the whole pool says that a worker it does not list is gone.
        let after: HashSet<&str> = new.workers.iter().map(|w| w.worker.as_str()).collect();
        let removed: Vec<String> = match new.pool {
            true => before.keys().filter(|w| !after.contains(*w)).map(|w| w.to_string()).collect(),
            false => Vec::new(),
        };
        Delta {
            from_version: old.version,
            to_version: new.version,
            generated_at_ms: new.generated_at_ms,
            models: (old.models != new.models).then(|| new.models.clone()),
            workers,
            peers: PeerSection::between(old.peers.as_ref(), new.peers.as_ref()),
            pool: new.pool,
            removed,
            down: (old.down != new.down).then(|| new.down.clone()),
            placements: (old.placements != new.placements).then(|| new.placements.clone()),
        }
    }

    /// One delta with the effect of applying `deltas` in order; `None` if they are not
    /// contiguous (or there are none).
    pub fn compose(deltas: &[Delta]) -> Option<Delta> {
        let first = deltas.first()?;
        let mut version = first.from_version;
        // Per worker: head of the latest delta, reset seen, final presence per hash, and the
        // latest model and adapters sent.
        struct Acc<'a> {
            head: &'a WorkerDelta,
            reset: bool,
            gpu: BTreeMap<u64, bool>,
            off: BTreeMap<u64, bool>,
            model: Option<&'a String>,
            adapters: Option<&'a Vec<String>>,
        }
        let mut acc: BTreeMap<&str, Acc<'_>> = BTreeMap::new();
        // Removed and not back since: the receiver forgets them.
        let mut removed: std::collections::BTreeSet<&str> = Default::default();
        let mut models = None;
        let mut peers: Option<PeerSection> = None;
        for d in deltas {
            if d.from_version != version {
                return None;
            }
            version = d.to_version;
            if d.models.is_some() {
                models = d.models.clone();
            }
            if let Some(p) = &d.peers {
                // Zero loads stay: a receiver may hold the load they remove.
                peers.get_or_insert_with(PeerSection::default).merge(p, d.generated_at_ms, true);
            }
            for w in &d.removed {
                acc.remove(w.as_str());
                removed.insert(w.as_str());
            }
            for w in &d.workers {
                // A worker back after its removal comes whole (a reset with model and
                // adapters, as for any worker new to the receiver).
                removed.remove(w.worker.as_str());
                let e = acc.entry(w.worker.as_str()).or_insert_with(|| Acc {
                    head: w,
                    reset: false,
                    gpu: BTreeMap::new(),
                    off: BTreeMap::new(),
                    model: None,
                    adapters: None,
                });
                e.head = w;
                e.model = w.model.as_ref().or(e.model);
                e.adapters = w.adapters.as_ref().or(e.adapters);
                if w.reset {
                    e.reset = true;
                    e.gpu.clear();
                    e.off.clear();
                }
                for (change, map) in [(&w.gpu, &mut e.gpu), (&w.offloaded, &mut e.off)] {
                    for h in &change.remove {
                        map.insert(*h, false);
                    }
                    for h in &change.add {
                        map.insert(*h, true);
                    }
                }
            }
        }
        let collect = |m: &BTreeMap<u64, bool>, reset: bool| SetChange {
            add: m.iter().filter(|(_, p)| **p).map(|(h, _)| *h).collect(),
            remove: if reset {
                Vec::new()
            } else {
                m.iter().filter(|(_, p)| !**p).map(|(h, _)| *h).collect()
            },
        };
        let workers = acc
            .into_values()
            .map(|a| WorkerDelta {
                worker: a.head.worker.clone(),
                observed_at_ms: a.head.observed_at_ms,
                compatible: a.head.compatible,
                load: a.head.load,
                reset: a.reset,
                model: a.model.cloned(),
                adapters: a.adapters.cloned(),
                gpu: collect(&a.gpu, a.reset),
                offloaded: collect(&a.off, a.reset),
            })
            .collect();
        let generated_at_ms = deltas.last().map_or(0, |d| d.generated_at_ms);
        Some(Delta {
            from_version: first.from_version,
            to_version: version,
            generated_at_ms,
            models,
            workers,
            peers,
            pool: deltas.last().is_some_and(|d| d.pool),
            removed: removed.into_iter().map(str::to_owned).collect(),
            down: deltas.iter().rev().find_map(|d| d.down.clone()),
            placements: deltas.iter().rev().find_map(|d| d.placements.clone()),
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let size: usize = self
            .workers
            .iter()
            .map(|w| {
                52 + w.worker.len()
                    + w.model.as_ref().map_or(0, String::len)
                    + w.adapters.iter().flatten().map(|a| 2 + a.len()).sum::<usize>()
                    + 8 * (w.gpu.add.len()
                        + w.gpu.remove.len()
                        + w.offloaded.add.len()
                        + w.offloaded.remove.len())
            })
            .sum::<usize>()
            + self.peers.as_ref().map_or(0, PeerSection::encoded_len)
            + self.removed.iter().map(|w| 2 + w.len()).sum::<usize>()
            + self.down.iter().flatten().map(|w| 2 + w.len()).sum::<usize>()
            + self.placements.as_deref().map_or(0, placements_len);
        let mut out = Vec::with_capacity(37 + size);
        out.extend_from_slice(MAGIC);
        let arrivals = self.peers.as_ref().is_some_and(PeerSection::has_arrivals);
        let sections = self.pool
            || !self.removed.is_empty()
            || self.down.is_some()
            || self.placements.is_some()
            || arrivals;
        out.push(match (sections, self.peers.is_some()) {
            (true, _) => DELTA_FORMAT_SECTIONS,
            (false, true) => DELTA_FORMAT_PEERS,
            (false, false) => DELTA_FORMAT,
        });
        out.extend_from_slice(&self.from_version.to_le_bytes());
        out.extend_from_slice(&self.to_version.to_le_bytes());
        out.extend_from_slice(&self.generated_at_ms.to_le_bytes());
        match &self.models {
            None => out.push(0),
            Some(m) => {
                out.push(1);
                put_models(&mut out, m);
            }
        }
        out.extend_from_slice(&(self.workers.len() as u32).to_le_bytes());
        for w in &self.workers {
            put_head(&mut out, &w.worker, w.observed_at_ms, w.compatible, w.load.as_ref());
            let flags = if w.reset { RESET } else { 0 }
                | if w.model.is_some() { HAS_MODEL } else { 0 }
                | if w.adapters.is_some() { HAS_ADAPTERS } else { 0 };
            out.push(flags);
            if let Some(m) = &w.model {
                put_str(&mut out, m);
            }
            if let Some(a) = &w.adapters {
                put_names(&mut out, a);
            }
            for list in [&w.gpu.remove, &w.gpu.add, &w.offloaded.remove, &w.offloaded.add] {
                put_hashes(&mut out, list);
            }
        }
        if sections {
            out.push(
                if self.pool { SECTION_POOL } else { 0 }
                    | if self.peers.is_some() { SECTION_PEERS } else { 0 }
                    | if self.removed.is_empty() { 0 } else { SECTION_REMOVED }
                    | if self.down.is_some() { SECTION_DOWN } else { 0 }
                    | if self.placements.is_some() { SECTION_PLACEMENT } else { 0 }
                    | if arrivals { SECTION_ARRIVALS } else { 0 },
            );
        }
        if let Some(p) = &self.peers {
            p.encode_into(&mut out);
        }
        if !self.removed.is_empty() {
            put_names(&mut out, &self.removed);
        }
        if let Some(down) = &self.down {
            put_names(&mut out, down);
        }
        if let Some(p) = &self.placements {
            put_placements(&mut out, p);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Delta, DeltaError> {
        Self::decode_with(bytes, &DecodeLimits::default())
    }

    /// Decodes within `limits`.
    pub fn decode_with(bytes: &[u8], limits: &DecodeLimits) -> Result<Delta, DeltaError> {
        let mut r = Reader::new(bytes);
        let t = || DeltaError::Body(SnapshotError::Truncated);
        if r.take(4).ok_or_else(t)? != MAGIC {
            return Err(DeltaError::Magic);
        }
        let format = r.u8().ok_or_else(t)?;
        if !(DELTA_FORMAT..=DELTA_FORMAT_SECTIONS).contains(&format) {
            return Err(DeltaError::Format(format));
        }
        let from_version = r.u64().ok_or_else(t)?;
        let to_version = r.u64().ok_or_else(t)?;
        let generated_at_ms = r.u64().ok_or_else(t)?;
        let models = match r.u8().ok_or_else(t)? {
            0 => None,
            1 => Some(read_models(&mut r, limits)?),
            f => return Err(SnapshotError::Flags(f).into()),
        };
        let n = r.u32().ok_or_else(t)? as usize;
        if n > limits.max_workers {
            return Err(SnapshotError::TooLarge(n).into());
        }
        let mut workers = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let WorkerHead { worker, observed_at_ms, compatible, load } = read_head(&mut r)?;
            let flags = r.u8().ok_or_else(t)?;
            if flags & !(RESET | HAS_MODEL | HAS_ADAPTERS) != 0 {
                return Err(SnapshotError::Flags(flags).into());
            }
            let reset = flags & RESET != 0;
            let model = if flags & HAS_MODEL != 0 { Some(read_str(&mut r)?) } else { None };
            let adapters = if flags & HAS_ADAPTERS != 0 {
                Some(read_names(&mut r, limits.max_adapters_per_worker)?)
            } else {
                None
            };
            let gpu_remove = hashes(&mut r, limits)?;
            let gpu_add = hashes(&mut r, limits)?;
            let off_remove = hashes(&mut r, limits)?;
            let off_add = hashes(&mut r, limits)?;
            workers.push(WorkerDelta {
                worker,
                observed_at_ms,
                compatible,
                load,
                reset,
                model,
                adapters,
                gpu: SetChange { add: gpu_add, remove: gpu_remove },
                offloaded: SetChange { add: off_add, remove: off_remove },
            });
        }
        let sections = match format {
            DELTA_FORMAT_PEERS => SECTION_PEERS,
            DELTA_FORMAT_SECTIONS => {
                let known = SECTION_POOL
                    | SECTION_PEERS
                    | SECTION_REMOVED
                    | SECTION_DOWN
                    | SECTION_PLACEMENT
                    | SECTION_ARRIVALS;
                read_peer_sections(&mut r, known, SECTION_ARRIVALS)?
            }
            _ => 0,
        };
        let peers = match sections & SECTION_PEERS {
            0 => None,
            _ => Some(PeerSection::decode_from(&mut r, limits, sections & SECTION_ARRIVALS != 0)?),
        };
        let removed = match sections & SECTION_REMOVED {
            0 => Vec::new(),
            _ => read_names(&mut r, limits.max_workers)?,
        };
        let down = match sections & SECTION_DOWN {
            0 => None,
            _ => Some(read_names(&mut r, limits.max_workers)?),
        };
        let placements = match sections & SECTION_PLACEMENT {
            0 => None,
            _ => Some(read_placements(&mut r, limits)?),
        };
        if r.remaining() != 0 {
            return Err(SnapshotError::Trailing.into());
        }
        let pool = sections & SECTION_POOL != 0;
        Ok(Delta {
            from_version,
            to_version,
            generated_at_ms,
            models,
            workers,
            peers,
            pool,
            removed,
            down,
            placements,
        })
    }
}

impl Snapshot {
    /// Moves this snapshot to the delta's version; refuses a delta from another version.
    pub fn apply_delta(&mut self, d: &Delta) -> Result<(), DeltaError> {
        if d.from_version != self.version {
            return Err(DeltaError::Gap {
                from: d.from_version,
                to: d.to_version,
                have: self.version,
            });
        }
        if !d.removed.is_empty() {
            let gone: HashSet<&str> = d.removed.iter().map(String::as_str).collect();
            self.workers.retain(|k| !gone.contains(k.worker.as_str()));
        }
        for w in &d.workers {
            // Workers come in name order (the updater's): a binary search finds one of a large
            // pool, and only a worker it misses (new, or a list out of order) costs a scan.
            let found = match self.workers.binary_search_by(|k| k.worker.as_str().cmp(&w.worker)) {
                Ok(i) => Some(i),
                Err(_) => self.workers.iter().position(|k| k.worker == w.worker),
            };
            let i = match found {
                Some(i) => i,
                None => {
                    // Kept in name order, as the updater lists workers.
                    let i = self.workers.partition_point(|k| k.worker < w.worker);
                    self.workers.insert(
                        i,
                        SnapshotWorker {
                            worker: w.worker.clone(),
                            compatible: true,
                            ..SnapshotWorker::default()
                        },
                    );
                    i
                }
            };
            let k = &mut self.workers[i];
            k.observed_at_ms = w.observed_at_ms;
            k.compatible = w.compatible;
            k.load = w.load;
            if let Some(m) = &w.model {
                k.model.clone_from(m);
            }
            if let Some(a) = &w.adapters {
                k.adapters.clone_from(a);
            }
            if w.reset {
                k.gpu.clear();
                k.offloaded.clear();
            }
            w.gpu.apply(&mut k.gpu);
            w.offloaded.apply(&mut k.offloaded);
        }
        if let Some(m) = &d.models {
            self.models.clone_from(m);
        }
        if let Some(p) = &d.peers {
            self.peers.get_or_insert_with(PeerSection::default).merge(p, d.generated_at_ms, false);
        }
        if let Some(down) = &d.down {
            self.down.clone_from(down);
        }
        if let Some(p) = &d.placements {
            self.placements.clone_from(p);
        }
        self.pool = d.pool;
        self.version = d.to_version;
        self.generated_at_ms = d.generated_at_ms;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
