//! The updater's knowledge in shared data: the singleton publishes, every thread follows.
//!
//! - `kvroute.snapshot.head`: see [`Head`] — the current version, when the updater last
//!   confirmed it, the version of the full snapshot in shared data, and which delta sits in
//!   which ring slot;
//! - `kvroute.snapshot.data`: a full snapshot (rewritten every [`FULL_EVERY`] deltas, so a
//!   thread that fell behind the ring still finds a chain from it);
//! - `kvroute.snapshot.delta.<slot>`: the last [`RING`] deltas as received.
//!
//! [`KnowledgePublisher`] is the singleton's side (it keeps the full snapshot in memory and applies
//! each delta to it); [`Follower`] is a thread's side: it follows the chain of deltas from its
//! own version, and reads the full snapshot only on a gap.

use crate::decision::router::Router;
use crate::wire::delta::{is_delta, Delta};
use crate::wire::snapshot::Snapshot;
use crate::wire::DecodeLimits;
use crate::wire::Reader;

use super::{Counter, Counters, SharedStore};

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
        b.push(self.ring.len().min(RING) as u8);
        for e in self.ring.iter().take(RING) {
            b.push(e.slot);
            b.extend_from_slice(&e.from.to_le_bytes());
            b.extend_from_slice(&e.to.to_le_bytes());
        }
        b
    }

    /// Decodes a head; `None` for anything malformed (never panics).
    pub fn decode(b: &[u8]) -> Option<Head> {
        let mut r = Reader::new(b);
        let (version, checked_at_ms, full_version) = (r.u64()?, r.u64()?, r.u64()?);
        let n = r.u8()? as usize;
        if n > RING || r.remaining() != 17 * n {
            return None;
        }
        let ring = (0..n)
            .map(|_| Some(RingEntry { slot: r.u8()?, from: r.u64()?, to: r.u64()? }))
            .collect::<Option<Vec<_>>>()?;
        Some(Head { version, checked_at_ms, full_version, ring })
    }

    /// The ring entry continuing from `version`.
    pub fn next_after(&self, version: u64) -> Option<RingEntry> {
        self.ring.iter().copied().find(|e| e.from == version)
    }
}

/// Reads the head key.
pub fn read_head<S: SharedStore + ?Sized>(store: &S) -> Option<Head> {
    Head::decode(&store.get(HEAD_KEY).0?)
}

/// Reads the delta of ring entry `e`, if the slot still holds it.
fn read_delta<S: SharedStore + ?Sized>(store: &S, e: RingEntry, l: &DecodeLimits) -> Option<Delta> {
    let d = Delta::decode_with(&store.get(&delta_key(e.slot)).0?, l).ok()?;
    (d.from_version == e.from && d.to_version == e.to).then_some(d)
}

/// A thread's position in the knowledge chain.
#[derive(Debug, Default)]
pub struct Follower {
    version: u64,
    limits: DecodeLimits,
}

/// What one catch-up did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Followed {
    pub deltas: u64,
    pub full: u64,
}

impl Follower {
    pub fn new(limits: DecodeLimits) -> Self {
        Follower { version: 0, limits }
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// Brings `router` to the published version: along the ring's deltas from this thread's
    /// version, or from the full snapshot when the chain has a gap. With `allow_full` false
    /// (the request path) a gap is left for the next tick instead of decoding megabytes.
    pub fn catch_up<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        counters: &dyn Counters,
        router: &mut Router,
        allow_full: bool,
    ) -> Followed {
        let mut done = Followed::default();
        let Some(head) = read_head(store) else { return done };
        router.events_checked(head.checked_at_ms);
        if head.version == self.version {
            return done;
        }
        self.chain(store, router, &head, &mut done);
        // The full snapshot helps only if it is not the one this thread already stands on.
        if allow_full && self.version != head.version && self.version != head.full_version {
            let full = store.get(DATA_KEY).0.map(|b| Snapshot::decode_with(&b, &self.limits));
            match full {
                Some(Ok(full)) => {
                    router.apply_snapshot(&full);
                    self.version = full.version;
                    done.full += 1;
                    self.chain(store, router, &head, &mut done);
                }
                Some(Err(_)) => counters.count(Counter::Corrupt, 1),
                None => {}
            }
        }
        done
    }

    fn chain<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        router: &mut Router,
        head: &Head,
        done: &mut Followed,
    ) {
        for _ in 0..RING {
            let Some(e) = head.next_after(self.version) else { break };
            let Some(d) = read_delta(store, e, &self.limits) else { break };
            router.apply_delta(&d);
            done.deltas += 1;
            self.version = d.to_version;
        }
    }
}

/// Why an updater payload was not taken.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("snapshot: {0}")]
    Snapshot(#[from] crate::wire::SnapshotError),
    #[error("delta: {0}")]
    Delta(#[from] crate::wire::delta::DeltaError),
    #[error("a delta arrived before any full snapshot")]
    NoBase,
}

/// The singleton's side: validates what the updater sends and publishes it.
#[derive(Debug, Default)]
pub struct KnowledgePublisher {
    full: Option<Snapshot>,
    head: Head,
    next_slot: u8,
    deltas_since_full: usize,
    limits: DecodeLimits,
}

/// What an updater payload was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    Full,
    Delta,
}

impl KnowledgePublisher {
    pub fn new(limits: DecodeLimits) -> Self {
        KnowledgePublisher { limits, ..Default::default() }
    }

    /// The version of the knowledge held (0: none yet).
    pub fn version(&self) -> u64 {
        self.full.as_ref().map_or(0, |s| s.version)
    }

    pub fn head(&self) -> &Head {
        &self.head
    }

    /// The models (and their bundle fingerprints) the updater's current snapshot names.
    pub fn models(&self) -> &[crate::wire::snapshot::ModelInfo] {
        self.full.as_ref().map_or(&[], |s| s.models.as_slice())
    }

    /// Takes a 200 body from the updater (a full snapshot or a delta). On an error the
    /// publisher forgets its base, so the next request asks for a full snapshot.
    pub fn take<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        body: Vec<u8>,
    ) -> Result<Taken, PublishError> {
        let taken = if is_delta(&body) {
            self.take_delta(store, body).map(|_| Taken::Delta)
        } else {
            self.take_full(store, body).map(|_| Taken::Full)
        };
        if taken.is_err() {
            self.full = None;
        }
        taken
    }

    /// The updater confirmed the current version at `now_ms` (any successful answer).
    pub fn confirmed<S: SharedStore + ?Sized>(&mut self, store: &S, now_ms: u64) {
        self.head.checked_at_ms = now_ms;
        self.write_head(store);
    }

    fn write_head<S: SharedStore + ?Sized>(&self, store: &S) {
        let _ = store.set(HEAD_KEY, &self.head.encode(), None);
    }

    fn publish_full<S: SharedStore + ?Sized>(&mut self, store: &S, encoded: Option<Vec<u8>>) {
        let Some(full) = &self.full else { return };
        let bytes = encoded.unwrap_or_else(|| full.encode());
        let _ = store.set(DATA_KEY, &bytes, None);
        self.head.full_version = full.version;
        self.deltas_since_full = 0;
    }

    fn take_full<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        body: Vec<u8>,
    ) -> Result<(), PublishError> {
        let snap = Snapshot::decode_with(&body, &self.limits)?;
        self.head.version = snap.version;
        self.head.ring.clear();
        self.full = Some(snap);
        self.publish_full(store, Some(body));
        Ok(())
    }

    fn take_delta<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        body: Vec<u8>,
    ) -> Result<(), PublishError> {
        let d = Delta::decode_with(&body, &self.limits)?;
        let full = self.full.as_mut().ok_or(PublishError::NoBase)?;
        full.apply_delta(&d)?;
        let slot = self.next_slot;
        self.next_slot = ((slot as usize + 1) % RING) as u8;
        // Unlist the slot before overwriting it, so no thread trusts a half-written chain.
        self.head.ring.retain(|e| e.slot != slot);
        self.write_head(store);
        let _ = store.set(&delta_key(slot), &body, None);
        self.head.ring.push(RingEntry { slot, from: d.from_version, to: d.to_version });
        self.head.version = d.to_version;
        self.deltas_since_full += 1;
        if self.deltas_since_full >= FULL_EVERY {
            self.publish_full(store, None);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
