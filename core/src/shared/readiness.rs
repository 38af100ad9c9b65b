//! Which of Envoy's worker threads can route, as every thread sees it: each thread's VM marks
//! itself (`kvroute.thread.<shard id>`: bundled, ready, when) at every tick, and the gauges
//! `kvroute.threads.bundled` / `kvroute.threads.ready` are counted from the marks of the
//! listed load shards that are fresh. A VM that dies (a trap; Envoy's `FAIL_RELOAD` then
//! clones a new one on that thread, with a new shard) stops marking, so it leaves the count
//! within the freshness window instead of being counted forever.
//!
//! Value: version byte `1`, flags u8 (bit 0: every model has its bundle; bit 1: that, and
//! knowledge from the updater has arrived), `at_ms` u64 (little-endian). Anything else reads
//! as not ready.

use super::{load, SharedStore};
use crate::wire::Reader;

const VERSION: u8 = 1;
const BUNDLED: u8 = 1;
const READY: u8 = 2;

/// One thread's state as it marked it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mark {
    /// Every model configured has its bundle on that thread.
    pub bundled: bool,
    /// Bundled, and knowledge from the updater has arrived.
    pub ready: bool,
    /// When it was written (unix ms).
    pub at_ms: u64,
}

impl Mark {
    pub fn encode(&self) -> Vec<u8> {
        let flags = (u8::from(self.bundled) * BUNDLED) | (u8::from(self.ready) * READY);
        let mut b = vec![VERSION, flags];
        b.extend_from_slice(&self.at_ms.to_le_bytes());
        b
    }

    /// `None` for anything malformed (never panics).
    pub fn decode(bytes: &[u8]) -> Option<Mark> {
        let mut r = Reader::new(bytes);
        if r.u8()? != VERSION {
            return None;
        }
        let flags = r.u8()?;
        let at_ms = r.u64()?;
        (r.remaining() == 0).then_some(Mark {
            bundled: flags & BUNDLED != 0,
            ready: flags & READY != 0,
            at_ms,
        })
    }
}

/// Writes this thread's mark (a lost write is retried by the next tick).
pub fn mark<S: SharedStore + ?Sized>(store: &S, id: u32, m: Mark) {
    let _ = store.set(&load::mark_key(id), &m.encode(), None);
}

/// Empties shard `id`'s mark (its thread is gone).
pub fn clear<S: SharedStore + ?Sized>(store: &S, id: u32) {
    let _ = store.set(&load::mark_key(id), &[], None);
}

/// Threads (bundled, ready) among the listed shards whose mark is at most `fresh_ms` old.
pub fn count<S: SharedStore + ?Sized>(store: &S, now_ms: u64, fresh_ms: u64) -> (u32, u32) {
    let mut n = (0u32, 0u32);
    for id in load::listed(store) {
        let Some(m) = store.get(&load::mark_key(id)).0.as_deref().and_then(Mark::decode) else {
            continue;
        };
        if now_ms.saturating_sub(m.at_ms) > fresh_ms {
            continue;
        }
        n.0 += u32::from(m.bundled);
        n.1 += u32::from(m.ready);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::fake::MemStore;
    use crate::shared::load::{encode_registry, REGISTRY_KEY};

    #[test]
    fn marks_round_trip_and_refuse_anything_else() {
        let m = Mark { bundled: true, ready: false, at_ms: 1_700_000_000_123 };
        assert_eq!(Mark::decode(&m.encode()), Some(m));
        let golden = [1, 1, 0x7b, 0x68, 0xe5, 0xcf, 0x8b, 0x01, 0, 0];
        assert_eq!(m.encode(), golden, "wire layout");
        assert_eq!(Mark::decode(&[]), None);
        assert_eq!(Mark::decode(&[2, 3, 0, 0, 0, 0, 0, 0, 0, 0]), None, "unknown version");
        assert_eq!(Mark::decode(&golden[..9]), None, "truncated");
        assert_eq!(Mark::decode(&[golden.as_slice(), &[0]].concat()), None, "trailing bytes");
    }

    #[test]
    fn counts_fresh_marks_of_listed_shards_only() {
        let store = MemStore::default();
        store.set(REGISTRY_KEY, &encode_registry(&[1, 2, 3, 4]), None).unwrap();
        mark(&store, 1, Mark { bundled: true, ready: true, at_ms: 10_000 });
        mark(&store, 2, Mark { bundled: true, ready: false, at_ms: 10_000 });
        // A VM that died marked itself ready long ago: not counted.
        mark(&store, 3, Mark { bundled: true, ready: true, at_ms: 1_000 });
        // Not listed (its shard was swept): not counted however fresh.
        mark(&store, 9, Mark { bundled: true, ready: true, at_ms: 10_000 });
        assert_eq!(count(&store, 10_500, 2_000), (2, 1));
        clear(&store, 1);
        assert_eq!(count(&store, 10_500, 2_000), (1, 0));
        store.set(&load::mark_key(4), b"garbage", None).unwrap();
        assert_eq!(count(&store, 10_500, 2_000), (1, 0));
    }
}
