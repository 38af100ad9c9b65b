//! The order of one Envoy's decisions. The threads of an Envoy decide at the same instant (a
//! burst's requests land on several threads at once), and each reads the others' load shards
//! before any of them has written its new request: all see the same idle worker and all queue
//! there. Envoy's own least-request balancer does not have this blind spot (its per-host
//! counters are shared atomics).
//!
//! An [`Epoch`] orders the decisions optimistically, with one shared counter
//! ([`EPOCH_KEY`]) under compare-and-swap:
//! 1. a thread reads the epoch (value and CAS token) before it reads the load view;
//! 2. it decides, and writes its new request into its load shard;
//! 3. it advances the epoch with the token of step 1 ([`Epoch::advance`]).
//!
//! [`Advance::Alone`]: no other thread of this Envoy advanced the epoch since step 1, so no
//! decision was made between this thread's view and its write. [`Advance::Raced`]: another
//! thread's decision came in between. That thread wrote its shard before it advanced the
//! epoch, so a view read now holds its request: the loser takes its own request back out,
//! reads the epoch and the view again, ranks again (the prompt's tokens and block hashes are
//! kept) and advances once more, without a further retry (at most one re-ranking per
//! request). Of two threads that raced, exactly one ranks again, seeing the other. Requests
//! that end or reach their first byte do not advance the epoch: only decisions conflict.
//!
//! The cost on a request that raced nothing is one shared-data read and one write. Shared
//! data has no compare-and-swap on an absent key: the first advance writes it unordered.

use super::{SharedStore, StoreError};

/// The shared counter of this Envoy's decisions (8 bytes, little-endian).
pub const EPOCH_KEY: &str = "kvroute.load.epoch";

/// The epoch as read before a decision's load view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch {
    value: u64,
    /// `None`: the key was absent (or unreadable as a counter).
    cas: Option<u32>,
}

/// What advancing the epoch found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// No other decision of this Envoy since the epoch was read.
    Alone,
    /// Another thread decided in between: rank again on a fresh view.
    Raced,
    /// Not known: the key was absent (now written), or the host refused the write.
    Unordered,
}

impl Epoch {
    /// Reads the epoch; a value that is not 8 bytes counts as absent (the next advance
    /// rewrites it).
    pub fn read<S: SharedStore + ?Sized>(store: &S) -> Epoch {
        let (bytes, cas) = store.get(EPOCH_KEY);
        let value =
            bytes.as_deref().and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_le_bytes);
        match value {
            Some(value) => Epoch { value, cas },
            None => Epoch { value: 0, cas: None },
        }
    }

    /// The value read (for tests and diagnostics).
    pub fn value(&self) -> u64 {
        self.value
    }

    /// Advances the epoch under compare-and-swap with the token it was read with.
    pub fn advance<S: SharedStore + ?Sized>(&self, store: &S) -> Advance {
        let next = self.value.wrapping_add(1).to_le_bytes();
        match (self.cas, store.set(EPOCH_KEY, &next, self.cas)) {
            (Some(_), Ok(())) => Advance::Alone,
            (Some(_), Err(StoreError::CasMismatch)) => Advance::Raced,
            _ => Advance::Unordered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::fake::MemStore;

    #[test]
    fn of_two_threads_that_read_the_same_epoch_the_second_to_advance_raced() {
        let store = MemStore::new();
        assert_eq!(Epoch::read(&store).advance(&store), Advance::Unordered, "absent key");
        let (a, b) = (Epoch::read(&store), Epoch::read(&store));
        assert_eq!(a.value(), 1);
        assert_eq!(a.advance(&store), Advance::Alone);
        assert_eq!(b.advance(&store), Advance::Raced);
        // The loser reads again and advances after the winner.
        let again = Epoch::read(&store);
        assert_eq!(again.value(), 2);
        assert_eq!(again.advance(&store), Advance::Alone);
        assert_eq!(Epoch::read(&store).value(), 3);
    }

    #[test]
    fn a_value_that_is_not_a_counter_is_rewritten_unordered() {
        let store = MemStore::new();
        store.set(EPOCH_KEY, b"junk", None).unwrap();
        let e = Epoch::read(&store);
        assert_eq!((e.value(), e.advance(&store)), (0, Advance::Unordered));
        assert_eq!(Epoch::read(&store).value(), 1);
        assert_eq!(Epoch::read(&store).advance(&store), Advance::Alone);
    }
}
