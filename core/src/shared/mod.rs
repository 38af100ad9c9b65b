//! The protocol kvroute speaks over Envoy shared data (one key-value store per `vm_id`, seen by
//! every worker thread and the singleton), written against the small [`SharedStore`] trait so
//! it runs the same over proxy-wasm (the filter's implementation) and over [`fake::MemStore`]
//! in tests.
//!
//! - [`journal`]: the ring of knowledge observations every thread applies (routing credit,
//!   response feedback, retractions), bounded per entry and per poll.
//! - [`load`]: router-tracked in-flight requests, one shard per thread (single writer, no
//!   compare-and-swap on the hot path), each entry with a lease; dead shards and expired
//!   entries stop counting, and worker-reported load trims over-counts.
//! - [`epoch`]: one counter under compare-and-swap that orders an Envoy's decisions, so that
//!   of two threads deciding at the same instant one ranks again seeing the other's request.
//! - [`knowledge`]: the updater's snapshots as the singleton publishes them (head, delta ring,
//!   full snapshot) and the chain follower each thread uses to catch up.
//! - [`bundles`]: model bundles the singleton fetches from the updater part by part, and the
//!   manifest from which every thread builds its tokenizers.
//! - [`calib`]: the online calibration state per model, learned from every thread's samples.
//! - [`health`]: workers that failed requests (down for a backoff, then probed), so every
//!   thread leaves them out of its decisions at once.
//! - [`readiness`]: each thread's mark (bundled, ready, when), from which the readiness gauges
//!   count the threads that can route; a dead VM's mark goes stale.
//! - [`peers`]: this replica's id and the singleton's forwarder of its decisions and load to
//!   the updater (cross-replica knowledge).
//! - [`wake`]: the shared queues by which the singleton wakes the threads when it publishes
//!   knowledge.
//!
//! Time is passed in as unix milliseconds; nothing here reads a clock.

pub mod bundles;
pub mod calib;
pub mod epoch;
pub mod fake;
pub mod health;
pub mod journal;
pub mod knowledge;
pub mod load;
pub mod misdeploy;
pub mod peers;
pub mod readiness;
pub mod wake;

use thiserror::Error;

/// Why a shared-data write failed.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// The value changed since it was read (compare-and-swap lost).
    #[error("compare-and-swap mismatch")]
    CasMismatch,
    /// Any other host failure.
    #[error("shared data unavailable")]
    Unavailable,
}

/// A value and the token that a compare-and-swap write must present (`None`: absent).
pub type Versioned = (Option<Vec<u8>>, Option<u32>);

/// Envoy shared data as kvroute uses it.
pub trait SharedStore {
    /// The value under `key` and its CAS token; an absent key reads as `(None, None)`.
    fn get(&self, key: &str) -> Versioned;
    /// Writes `value`; with `cas`, only if the value is still the one that token was read with.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError>;
}

/// Events the protocol counts; the filter maps them to Envoy stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// A shared write that could not be made (contention outlasted the attempts, host error).
    LostUpdate,
    /// Journal entries a thread skipped (it fell behind the ring, or they were unreadable).
    JournalSkipped,
    /// Hashes left out of a journal entry by the per-entry cap.
    JournalHashesCapped,
    /// Journal entries left for later by the per-poll cap.
    JournalDeferred,
    /// In-flight entries that stopped counting because their lease ran out.
    LeaseExpired,
    /// In-flight entries of a thread that stopped writing (its VM died).
    ShardDropped,
    /// In-flight entries removed because the worker reported fewer requests.
    Reconciled,
    /// Unreadable shared-data values (wrong format, truncated).
    Corrupt,
    /// In-flight entries dropped because a thread tracked more than its cap.
    InflightCapped,
}

impl Counter {
    pub const ALL: [Counter; 9] = [
        Counter::LostUpdate,
        Counter::JournalSkipped,
        Counter::JournalHashesCapped,
        Counter::JournalDeferred,
        Counter::LeaseExpired,
        Counter::ShardDropped,
        Counter::Reconciled,
        Counter::Corrupt,
        Counter::InflightCapped,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Counter::LostUpdate => "lost_update",
            Counter::JournalSkipped => "journal_skipped",
            Counter::JournalHashesCapped => "journal_hashes_capped",
            Counter::JournalDeferred => "journal_deferred",
            Counter::LeaseExpired => "lease_expired",
            Counter::ShardDropped => "shard_dropped",
            Counter::Reconciled => "reconciled",
            Counter::Corrupt => "corrupt",
            Counter::InflightCapped => "inflight_capped",
        }
    }
}

/// Where the protocol reports what it counted.
pub trait Counters {
    fn count(&self, what: Counter, n: u64);
}

/// Attempts before a contended compare-and-swap gives up (and the update is counted lost).
pub const CAS_ATTEMPTS: usize = 64;

/// Read-modify-write of `key` under compare-and-swap: `f` maps the current value (absent:
/// `None`) to the next one. Returns what was written, or the error after the attempts.
pub fn update<S: SharedStore + ?Sized, T>(
    store: &S,
    key: &str,
    mut f: impl FnMut(Option<&[u8]>) -> (Vec<u8>, T),
) -> Result<T, StoreError> {
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = store.get(key);
        let (next, out) = f(bytes.as_deref());
        match store.set(key, &next, cas) {
            Ok(()) => return Ok(out),
            Err(StoreError::CasMismatch) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::CasMismatch)
}

/// A little-endian u64 value (absent or malformed: 0).
pub(crate) fn read_u64(bytes: Option<&[u8]>) -> u64 {
    bytes.and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes)
}
