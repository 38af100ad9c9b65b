//! Envoy shared data (one store per `vm_id`, visible to every worker thread): per-worker load
//! counters updated with compare-and-swap, and the knowledge journal ring.

use kvroute_core::journal::JournalEntry;
use kvroute_core::load::{LoadDelta, WorkerLoad};
use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

/// Attempts before a contended compare-and-swap gives up (and the update is counted lost).
const CAS_ATTEMPTS: usize = 64;
/// Journal slots; a thread more than this many entries behind skips ahead.
pub const JOURNAL_SLOTS: u64 = 512;
const JOURNAL_HEAD: &str = "kvroute.journal.head";

fn load_key(worker: &str) -> String {
    format!("kvroute.load.{worker}")
}

/// The router-tracked load of `worker`, across all threads.
pub fn read_load(worker: &str) -> WorkerLoad {
    match hostcalls::get_shared_data(&load_key(worker)) {
        Ok((Some(bytes), _)) => WorkerLoad::decode(&bytes),
        _ => WorkerLoad::default(),
    }
}

/// Applies `delta` to `worker`'s load atomically; returns the new load, or `None` if
/// contention outlasted the attempts.
pub fn update_load(worker: &str, delta: LoadDelta) -> Option<WorkerLoad> {
    let key = load_key(worker);
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = hostcalls::get_shared_data(&key).unwrap_or((None, None));
        let next = bytes.map(|b| WorkerLoad::decode(&b)).unwrap_or_default().apply(delta);
        match hostcalls::set_shared_data(&key, Some(&next.encode()), cas) {
            Ok(()) => return Some(next),
            Err(Status::CasMismatch) => continue,
            Err(_) => return None,
        }
    }
    None
}

fn read_u64(key: &str) -> (u64, Option<u32>) {
    match hostcalls::get_shared_data(key) {
        Ok((Some(b), cas)) if b.len() == 8 => {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b);
            (u64::from_le_bytes(a), cas)
        }
        Ok((_, cas)) => (0, cas),
        Err(_) => (0, None),
    }
}

fn slot_key(seq: u64) -> String {
    format!("kvroute.journal.{}", seq % JOURNAL_SLOTS)
}

/// Appends an entry (its `seq` is assigned here); false if it could not be written.
pub fn journal_append(mut entry: JournalEntry) -> bool {
    for _ in 0..CAS_ATTEMPTS {
        let (head, cas) = read_u64(JOURNAL_HEAD);
        match hostcalls::set_shared_data(JOURNAL_HEAD, Some(&(head + 1).to_le_bytes()), cas) {
            Ok(()) => {
                entry.seq = head;
                return hostcalls::set_shared_data(&slot_key(head), Some(&entry.encode()), None)
                    .is_ok();
            }
            Err(Status::CasMismatch) => continue,
            Err(_) => return false,
        }
    }
    false
}

/// A thread's reading position in the journal.
#[derive(Debug, Default)]
pub struct JournalCursor {
    next: u64,
    /// Entries skipped because this thread fell too far behind or they were unreadable.
    pub skipped: u64,
}

impl JournalCursor {
    /// Reads entries this thread has not applied yet, oldest first. An entry whose slot is not
    /// written yet stops the read; it is retried on the next call.
    pub fn poll(&mut self) -> Vec<JournalEntry> {
        let (head, _) = read_u64(JOURNAL_HEAD);
        if head.saturating_sub(self.next) > JOURNAL_SLOTS {
            let start = head - JOURNAL_SLOTS;
            self.skipped += start - self.next;
            self.next = start;
        }
        let mut out = Vec::new();
        while self.next < head {
            let bytes = match hostcalls::get_shared_data(&slot_key(self.next)) {
                Ok((Some(b), _)) => b,
                _ => break,
            };
            match JournalEntry::decode(&bytes) {
                Ok(e) if e.seq == self.next => out.push(e),
                Ok(e) if e.seq < self.next => break,
                _ => self.skipped += 1,
            }
            self.next += 1;
        }
        out
    }
}
