//! The knowledge journal in shared data: a ring of [`JournalEntry`] slots and a head counter.
//! A writer claims a sequence number with compare-and-swap on the head, then fills its slot;
//! every thread reads the slots it has not applied yet. Both ends are bounded: an entry carries
//! at most `max_hashes_per_entry` hashes, and one poll returns at most `max_hashes_per_poll`
//! (the rest waits for the next poll, e.g. on the thread's tick, off the request path).

use super::{read_u64, update, Counter, Counters, SharedStore};
use crate::decision::config::sync::JournalLimits;
use crate::wire::journal::JournalEntry;

/// Journal slots; a thread more than this many entries behind skips ahead.
pub const SLOTS: u64 = 512;
pub const HEAD_KEY: &str = "kvroute.journal.head";

pub fn slot_key(seq: u64) -> String {
    format!("kvroute.journal.{}", seq % SLOTS)
}

/// Appends `entry` (its `seq` is assigned here, its hashes capped); false if it could not be
/// written (counted as a lost update).
pub fn append<S: SharedStore + ?Sized>(
    store: &S,
    counters: &dyn Counters,
    limits: &JournalLimits,
    mut entry: JournalEntry,
) -> bool {
    if entry.hashes.len() > limits.max_hashes_per_entry {
        let cut = entry.hashes.len() - limits.max_hashes_per_entry;
        counters.count(Counter::JournalHashesCapped, cut as u64);
        entry.hashes.truncate(limits.max_hashes_per_entry);
    }
    let claimed = update(store, HEAD_KEY, |b| {
        let head = read_u64(b);
        ((head + 1).to_le_bytes().to_vec(), head)
    });
    let written = claimed.and_then(|seq| {
        entry.seq = seq;
        store.set(&slot_key(seq), &entry.encode(), None)
    });
    if written.is_err() {
        counters.count(Counter::LostUpdate, 1);
    }
    written.is_ok()
}

/// A thread's reading position in the journal.
#[derive(Debug, Default)]
pub struct JournalCursor {
    next: u64,
    /// Polls in a row that found slot `next` claimed but not written.
    stalled: u32,
}

/// A reader this many entries behind reads on even when its applier asks it to stop (see
/// [`JournalCursor::each`]): a time budget must not cost entries, which the ring overwrites
/// [`SLOTS`] entries later.
pub const FAR_BEHIND: u64 = SLOTS / 4;

/// Polls a claimed-but-unwritten slot may hold the reader before it is given up (its writer
/// lost the write, or its VM died between claiming and writing).
const STALL_POLLS: u32 = 3;

impl JournalCursor {
    /// A cursor at the journal's current head: entries written before are never read.
    pub fn at_head<S: SharedStore + ?Sized>(store: &S) -> JournalCursor {
        JournalCursor { next: read_u64(store.get(HEAD_KEY).0.as_deref()), stalled: 0 }
    }

    /// Entries this thread has not applied yet, oldest first, up to `max_hashes` hashes (at
    /// least one entry). An entry whose slot is not written yet stops the read; it is retried
    /// on the next call. Returns the entries and whether more are waiting.
    pub fn poll<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        counters: &dyn Counters,
        max_hashes: usize,
    ) -> (Vec<JournalEntry>, bool) {
        let mut out = Vec::new();
        let more = self.each(store, counters, max_hashes, |e| {
            out.push(e);
            true
        });
        (out, more)
    }

    /// Hands the entries [`JournalCursor::poll`] would return to `apply`, one at a time, as
    /// they are read; `apply` returning `false` stops the read after that entry (the rest
    /// waits, counted as deferred), unless the reader is more than [`FAR_BEHIND`] entries
    /// behind. Returns whether more are waiting.
    pub fn each<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        counters: &dyn Counters,
        max_hashes: usize,
        mut apply: impl FnMut(JournalEntry) -> bool,
    ) -> bool {
        let head = read_u64(store.get(HEAD_KEY).0.as_deref());
        if head.saturating_sub(self.next) > SLOTS {
            let start = head - SLOTS;
            counters.count(Counter::JournalSkipped, start - self.next);
            self.next = start;
        }
        let (mut hashes, mut read, mut go_on) = (0usize, 0usize, true);
        while self.next < head {
            if !go_on || (read > 0 && hashes >= max_hashes) {
                counters.count(Counter::JournalDeferred, head - self.next);
                return true;
            }
            let slot = store.get(&slot_key(self.next)).0;
            let entry = slot.as_deref().map(JournalEntry::decode);
            match entry {
                Some(Ok(e)) if e.seq == self.next => {
                    hashes += e.hashes.len();
                    read += 1;
                    self.next += 1;
                    self.stalled = 0;
                    go_on = apply(e) || head - self.next > FAR_BEHIND;
                    continue;
                }
                // The writer claimed the slot but has not filled it yet: wait a few polls.
                None | Some(Ok(_)) if self.stalled < STALL_POLLS => {
                    self.stalled += 1;
                    break;
                }
                None => counters.count(Counter::JournalSkipped, 1),
                Some(Ok(_)) => counters.count(Counter::JournalSkipped, 1),
                Some(Err(_)) => {
                    counters.count(Counter::JournalSkipped, 1);
                    counters.count(Counter::Corrupt, 1);
                }
            }
            self.next += 1;
            self.stalled = 0;
        }
        false
    }
}

#[cfg(test)]
mod tests;
