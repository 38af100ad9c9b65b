//! The updater's knowledge in shared data: the singleton publishes, every thread follows.
//!
//! - `kvroute.snapshot.head`: see [`Head`] — the current version, when the updater last
//!   confirmed it, the version of the full snapshot in shared data, and the sequence number of
//!   the last delta published;
//! - `kvroute.snapshot.data`: a full snapshot, after the sequence number of the last delta it
//!   includes (rewritten every [`FULL_EVERY`] deltas, or sooner once the deltas since add up to
//!   its size, so a thread that fell behind the ring still finds a chain from it);
//! - `kvroute.snapshot.delta.<slot>`: delta number `n` as received, in slot `n %` [`RING`]
//!   (a slot older than the full snapshot before the current one is blanked, but the last
//!   [`KEEP_DELTAS`]).
//!
//! [`KnowledgePublisher`] is the singleton's side (it keeps the full snapshot in memory and applies
//! each delta to it); [`Follower`] is a thread's side: it follows the deltas from its own
//! version and sequence number, each checked to start where the thread stands, and reads the
//! full snapshot only on a gap. The head stays a few bytes however long the ring: every thread
//! reads it on every request.

use crate::decision::router::Router;
use crate::wire::delta::{is_delta, Delta};
use crate::wire::snapshot::Snapshot;
use crate::wire::DecodeLimits;
use crate::wire::Reader;

use super::{Counter, Counters, SharedStore};

pub const HEAD_KEY: &str = "kvroute.snapshot.head";
pub const DATA_KEY: &str = "kvroute.snapshot.data";
/// Delta slots in shared data. A large pool's loads alone make hundreds of deltas a second
/// (each worker's load every scrape); an idle filter thread catches up on its tick (250 ms by
/// default), and must find its chain still in the ring to avoid reading the full snapshot.
pub const RING: usize = 512;
/// The full snapshot in shared data is rewritten after at most this many deltas.
pub const FULL_EVERY: usize = RING / 2;
/// Deltas a thread applies on the request path; the rest wait for its tick.
pub const REQUEST_DELTAS: usize = 16;
/// A thread this many deltas behind applies the request path's [`REQUEST_DELTAS`] whatever
/// its time budget says (see [`Follower::catch_up_within`]): falling further behind would
/// cost it a full snapshot read once the ring moves past its chain.
pub const FAR_BEHIND: u64 = RING as u64 / 4;
/// The latest deltas are never blanked, however often small full snapshots are rewritten: a
/// thread this far behind still catches up on a request.
pub const KEEP_DELTAS: u64 = 64;

pub fn delta_key(slot: usize) -> String {
    format!("kvroute.snapshot.delta.{slot}")
}

/// The slot of delta number `seq`.
fn slot_of(seq: u64) -> usize {
    (seq % RING as u64) as usize
}

/// The small key every thread reads on each request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Head {
    pub version: u64,
    /// When the updater last confirmed `version` (unix ms).
    pub checked_at_ms: u64,
    /// Version of the full snapshot under [`DATA_KEY`].
    pub full_version: u64,
    /// Sequence number of the last delta published (in slot `seq %` [`RING`]).
    pub seq: u64,
}

impl Head {
    pub const BYTES: usize = 32;

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::BYTES);
        for v in [self.version, self.checked_at_ms, self.full_version, self.seq] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Decodes a head; `None` for anything malformed (never panics).
    pub fn decode(b: &[u8]) -> Option<Head> {
        if b.len() != Self::BYTES {
            return None;
        }
        let mut r = Reader::new(b);
        Some(Head {
            version: r.u64()?,
            checked_at_ms: r.u64()?,
            full_version: r.u64()?,
            seq: r.u64()?,
        })
    }
}

/// Reads the head key.
pub fn read_head<S: SharedStore + ?Sized>(store: &S) -> Option<Head> {
    Head::decode(&store.get(HEAD_KEY).0?)
}

/// Reads delta number `seq`, if its slot holds a delta that decodes.
fn read_delta<S: SharedStore + ?Sized>(store: &S, seq: u64, l: &DecodeLimits) -> Option<Delta> {
    Delta::decode_with(&store.get(&delta_key(slot_of(seq))).0?, l).ok()
}

/// The full snapshot's value: the sequence number of the last delta it includes, then the
/// snapshot.
fn full_value(seq: u64, snapshot: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + snapshot.len());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(snapshot);
    v
}

/// Reads the full snapshot and the sequence number it stands at; `Err` for a value that does
/// not decode.
fn read_full<S: SharedStore + ?Sized>(
    store: &S,
    l: &DecodeLimits,
) -> Option<Result<(u64, Snapshot), ()>> {
    let v = store.get(DATA_KEY).0?;
    let Some((seq, snap)) = v.split_first_chunk::<8>() else { return Some(Err(())) };
    Some(Snapshot::decode_with(snap, l).map(|s| (u64::from_le_bytes(*seq), s)).map_err(|_| ()))
}

/// What a catch-up asks its caller: whether to apply another delta (the time budget), and,
/// given the head, whether to leave the waiting deltas to a catch-up due right after.
type Asks<'a> = (&'a mut dyn FnMut() -> bool, &'a mut dyn FnMut(&Head) -> bool);

/// A thread's position in the knowledge chain.
#[derive(Debug, Default)]
pub struct Follower {
    version: u64,
    /// The sequence number of the last delta applied (or included in the full snapshot read).
    seq: u64,
    limits: DecodeLimits,
}

/// What one catch-up did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Followed {
    pub deltas: u64,
    pub full: u64,
    /// Deltas were waiting and were left to a catch-up already due (see
    /// [`Follower::catch_up_or_defer`]): 1, else 0.
    pub deferred: u64,
}

impl Follower {
    pub fn new(limits: DecodeLimits) -> Self {
        Follower { version: 0, seq: 0, limits }
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// Brings `router` to the published version: along the ring's deltas from this thread's
    /// version, or from the full snapshot when the chain has a gap. With `allow_full` false
    /// (the request path) a gap is left for the next tick instead of decoding megabytes, and
    /// at most [`REQUEST_DELTAS`] deltas are applied.
    pub fn catch_up<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        counters: &dyn Counters,
        router: &mut Router,
        allow_full: bool,
    ) -> Followed {
        self.catch_up_within(store, counters, router, allow_full, &mut || true)
    }

    /// [`Follower::catch_up`], asking `go_on` after each delta whether to apply another (a
    /// request's time budget, `knowledge.catch_up_budget_us`): the rest waits for the next
    /// call. A thread more than [`FAR_BEHIND`] deltas behind does not ask.
    pub fn catch_up_within<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        counters: &dyn Counters,
        router: &mut Router,
        allow_full: bool,
        go_on: &mut dyn FnMut() -> bool,
    ) -> Followed {
        self.follow(store, counters, router, allow_full, (go_on, &mut |_| false))
    }

    /// [`Follower::catch_up_within`] on the request path, which may leave waiting deltas to a
    /// catch-up already due: when deltas wait, `due` is asked once, with the head, whether one
    /// will run right after this request (the singleton's wake for them, about to be sent or
    /// still queued for this thread). If so, none is applied now, and `deferred` says so. A
    /// thread with no knowledge yet, or more than [`FAR_BEHIND`] deltas behind, does not ask.
    pub fn catch_up_or_defer<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        counters: &dyn Counters,
        router: &mut Router,
        go_on: &mut dyn FnMut() -> bool,
        due: &mut dyn FnMut(&Head) -> bool,
    ) -> Followed {
        let allow_full = self.version == 0;
        self.follow(store, counters, router, allow_full, (go_on, due))
    }

    /// The catch-up itself, asking the caller as [`Asks`] says.
    fn follow<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        counters: &dyn Counters,
        router: &mut Router,
        allow_full: bool,
        (go_on, due): Asks<'_>,
    ) -> Followed {
        let mut done = Followed::default();
        let Some(head) = read_head(store) else { return done };
        router.events_checked(head.checked_at_ms);
        if head.version == self.version {
            return done;
        }
        let near = head.seq.saturating_sub(self.seq) <= FAR_BEHIND;
        if self.version != 0 && near && due(&head) {
            done.deferred = 1;
            return done;
        }
        let budget = if allow_full { RING } else { REQUEST_DELTAS };
        self.chain(store, router, (&head, budget), &mut done, go_on);
        // The full snapshot helps only if it is not the one this thread already stands on.
        if allow_full && self.version != head.version && self.version != head.full_version {
            match read_full(store, &self.limits) {
                Some(Ok((seq, full))) => {
                    router.apply_snapshot(&full);
                    (self.version, self.seq) = (full.version, seq);
                    done.full += 1;
                    self.chain(store, router, (&head, budget), &mut done, go_on);
                }
                Some(Err(())) => counters.count(Counter::Corrupt, 1),
                None => {}
            }
        }
        done
    }

    /// Applies the deltas after this thread's, up to the head, at most `budget` and while
    /// `go_on` says so: each must start at the thread's version (a slot already overwritten by
    /// a later delta, or not yet written, does not, and ends the chain).
    fn chain<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        router: &mut Router,
        (head, budget): (&Head, usize),
        done: &mut Followed,
        go_on: &mut dyn FnMut() -> bool,
    ) {
        for i in 0..budget {
            let far = head.seq.saturating_sub(self.seq) > FAR_BEHIND;
            if i > 0 && !far && !go_on() {
                break;
            }
            if self.version == head.version || self.seq >= head.seq {
                break;
            }
            let Some(d) = read_delta(store, self.seq + 1, &self.limits) else { break };
            if d.from_version != self.version {
                break;
            }
            router.apply_delta(&d);
            done.deltas += 1;
            (self.version, self.seq) = (d.to_version, self.seq + 1);
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
    deltas_since_full: usize,
    /// Bytes of the deltas since the full snapshot was last written, and that snapshot's.
    bytes_since_full: usize,
    full_bytes: usize,
    /// The sequence number of the last full snapshot written: the slots up to the one before
    /// it are blanked, but the last [`KEEP_DELTAS`].
    full_seq: u64,
    /// The slots of the deltas up to this sequence number are blanked.
    blanked: u64,
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

    /// Writes the full snapshot at the current sequence number, then blanks the slots that
    /// only a thread behind the one before it could still use (such a thread reads this one).
    fn publish_full<S: SharedStore + ?Sized>(&mut self, store: &S, encoded: Option<Vec<u8>>) {
        let Some(full) = &self.full else { return };
        let bytes = encoded.unwrap_or_else(|| full.encode());
        let seq = self.head.seq;
        let _ = store.set(DATA_KEY, &full_value(seq, &bytes), None);
        self.head.full_version = full.version;
        (self.deltas_since_full, self.bytes_since_full, self.full_bytes) = (0, 0, bytes.len());
        let upto = self.full_seq.min(seq.saturating_sub(KEEP_DELTAS));
        for n in (self.blanked + 1).max(seq.saturating_sub(RING as u64) + 1)..=upto {
            let _ = store.set(&delta_key(slot_of(n)), &[], None);
        }
        self.blanked = self.blanked.max(upto);
        self.full_seq = seq;
    }

    fn take_full<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        body: Vec<u8>,
    ) -> Result<(), PublishError> {
        let snap = Snapshot::decode_with(&body, &self.limits)?;
        self.head.version = snap.version;
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
        // The head naming it is written after (`confirmed`); a slot overwritten while a thread
        // reads it fails that thread's version check.
        self.head.seq += 1;
        let _ = store.set(&delta_key(slot_of(self.head.seq)), &body, None);
        self.head.version = d.to_version;
        self.deltas_since_full += 1;
        self.bytes_since_full += body.len();
        // Rewriting the full snapshot costs its size: at most once per as many bytes of deltas.
        if self.deltas_since_full >= FULL_EVERY || self.bytes_since_full >= self.full_bytes {
            self.publish_full(store, None);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
