//! Which requests were passed over by more urgent ones (`kvroute.load.passed.<id>`).
//!
//! On an engine that schedules by priority (vLLM's `--scheduling-policy priority`), a request
//! that has not started yet waits for every more urgent request that arrives after it: its
//! first byte then holds their prefills, which its decision could not count (they were not
//! sent yet). Learned from, such first bytes make the workers look slower than they are, and
//! the most urgent class, which nothing passes, is then estimated too long (see
//! `CalibrationConfig::skip_passed`).
//!
//! A thread records, per worker and engine priority, the latest send time among the requests
//! whose first token it saw: the same table as [`PrefillsDone`], keyed by [`pass_key`] and
//! written under its own key beside the shard, only by threads told to
//! ([`Shard::record_passes`]: where some class sets an engine priority, and only for requests
//! more urgent than the least urgent class, which passes nobody). At a first byte,
//! [`Shard::passed_over`] asks every thread's table whether a more urgent request sent to the
//! same worker after this one has had its first token already.

use super::{registry, PrefillsDone, Shard};
use crate::shared::{Counter, Counters, SharedStore};

pub fn passed_key(id: u32) -> String {
    format!("kvroute.load.passed.{id}")
}

/// The table key of `worker` (its worker key) at engine `priority`.
pub fn pass_key(worker: u64, priority: i32) -> u64 {
    // A fixed odd multiplier spreads the priority over all 64 bits; priority 0 is the worker.
    worker ^ u64::from(priority as u32).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Shard {
    /// Which requests' first tokens this thread records: those sent at an engine priority more
    /// urgent than `below` (the least urgent class's, which passes nobody). `None`: nothing is
    /// recorded or written, as where no class sets an engine priority.
    pub fn record_passes(&mut self, below: Option<i32>) {
        self.passes_below = below;
    }

    /// Whether a request sent to the worker of key `worker` at `sent_ms` was passed over: a
    /// request sent there after it (later than `sent_ms`) at one of the engine priorities
    /// `more_urgent` had its first token before now, as this thread or another recorded it.
    /// Requests whose first tokens no thread saw (answers not streamed, other replicas) are
    /// not known here.
    pub fn passed_over<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        counters: &dyn Counters,
        worker: u64,
        more_urgent: &[i32],
        sent_ms: u64,
    ) -> bool {
        if more_urgent.is_empty() {
            return false;
        }
        let keys: Vec<u64> = more_urgent.iter().map(|&p| pass_key(worker, p)).collect();
        let after = |(k, sent): (u64, u64)| sent > sent_ms && keys.contains(&k);
        if self.passes.iter().any(after) {
            return true;
        }
        registry(store, counters).into_iter().filter(|&id| id != self.id).any(|id| {
            let bytes = store.get(&passed_key(id)).0.unwrap_or_default();
            let found = PrefillsDone::read(&bytes).map(|mut table| table.any(after));
            if found.is_none() && !bytes.is_empty() {
                counters.count(Counter::Corrupt, 1);
            }
            found.unwrap_or(false)
        })
    }

    /// Records the end of the prefill of a request sent to `worker` at `sent_ms` with engine
    /// `priority` (see [`Shard::record_passes`]).
    pub(super) fn record_pass(&mut self, worker: u64, priority: i32, sent_ms: u64) {
        if self.passes_below.is_some_and(|least| priority < least) {
            self.passes.record(pass_key(worker, priority), sent_ms);
            self.passes_dirty.set(true);
        }
    }
}
