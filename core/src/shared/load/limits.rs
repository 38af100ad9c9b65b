//! The threads' reading of the load shards, published for the singleton.
//!
//! The singleton reads the same shards to report this replica's load to the updater
//! ([`crate::shared::peers::Forwarder`]), but it is configured apart from the filter (its
//! `snapshot_sync` section), and the filter's `load` section is not in its configuration.
//! Every thread writes the limits its own reads use under [`LIMITS_KEY`] when it registers
//! its shard; the singleton reads them on each poll, so that it counts an entry, a shard and
//! an arrival rate exactly as the threads do. Layout: a version byte (1), then `lease_ms`,
//! `shard_timeout_ms` and `arrival_window_ms`, each a little-endian u64.

use super::super::SharedStore;
use crate::decision::config::sync::LoadLimits;

pub const LIMITS_KEY: &str = "kvroute.load.limits";
const VERSION: u8 = 1;
const LEN: usize = 25;

/// The part of `limits` a reader of the shards uses, as written under [`LIMITS_KEY`].
fn encode(limits: &LoadLimits) -> Vec<u8> {
    let mut out = Vec::with_capacity(LEN);
    out.push(VERSION);
    for v in [limits.lease_ms, limits.shard_timeout_ms, limits.arrival_window_ms] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// `base` with the reader's limits in `bytes`; `None` when they are not a version this
/// reads.
fn decode(bytes: &[u8], base: LoadLimits) -> Option<LoadLimits> {
    if bytes.len() != LEN || bytes[0] != VERSION {
        return None;
    }
    let at = |i: usize| {
        let b: [u8; 8] = bytes[1 + 8 * i..9 + 8 * i].try_into().ok()?;
        Some(u64::from_le_bytes(b))
    };
    let (lease_ms, shard_timeout_ms) = (at(0)?, at(1)?);
    // A zero lease would count nothing: not a limit any thread reads with.
    (lease_ms > 0).then_some(LoadLimits {
        lease_ms,
        shard_timeout_ms,
        arrival_window_ms: at(2)?,
        ..base
    })
}

/// Writes the reader's part of `limits` unless it is there already (a thread of this Envoy
/// registering its shard; all of them read with the same `load` section).
pub fn publish<S: SharedStore + ?Sized>(store: &S, limits: &LoadLimits) {
    let bytes = encode(limits);
    if store.get(LIMITS_KEY).0.as_deref() != Some(bytes.as_slice()) {
        // Lost to a concurrent writer of the same section: nothing to redo.
        let _ = store.set(LIMITS_KEY, &bytes, None);
    }
}

/// The limits the threads published, over `base` (its other fields kept); `base` itself
/// where none were published (no thread registered yet, or one of a filter before this key).
pub fn published<S: SharedStore + ?Sized>(store: &S, base: LoadLimits) -> LoadLimits {
    store.get(LIMITS_KEY).0.and_then(|b| decode(&b, base)).unwrap_or(base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::fake::MemStore;

    #[test]
    fn the_threads_limits_reach_a_reader_configured_apart() {
        let store = MemStore::new();
        let base = LoadLimits::default();
        assert_eq!(published(&store, base), base, "nothing published: the reader's own");
        let threads = LoadLimits {
            lease_ms: 30_000,
            shard_timeout_ms: 40_000,
            arrival_window_ms: 0,
            max_inflight_per_thread: 7,
            ..base
        };
        publish(&store, &threads);
        let got = published(&store, base);
        assert_eq!(
            (got.lease_ms, got.shard_timeout_ms, got.arrival_window_ms),
            (30_000, 40_000, 0)
        );
        assert_eq!(got.max_inflight_per_thread, base.max_inflight_per_thread, "not a reader's");
        // The bytes on the wire (golden): version 1, then the three values.
        let mut want = vec![1u8];
        for v in [30_000u64, 40_000, 0] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(store.get(LIMITS_KEY).0.unwrap(), want);
    }

    #[test]
    fn unreadable_limits_leave_the_readers_own() {
        let store = MemStore::new();
        let base = LoadLimits::default();
        let zero_lease = encode(&LoadLimits { lease_ms: 0, ..base });
        for bad in [vec![], vec![2u8; LEN], vec![1u8; LEN - 1], zero_lease] {
            store.set(LIMITS_KEY, &bad, None).unwrap();
            assert_eq!(published(&store, base), base, "{bad:?}");
        }
    }
}
