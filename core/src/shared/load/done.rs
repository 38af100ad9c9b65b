//! When each worker last finished a prefill, as one thread saw it (`kvroute.load.done.<id>`).
//!
//! The work a worker has done on the prompts still in prefill there is at most the time since
//! the oldest of them was sent; on an engine that runs its queue in order it is also at most
//! the time since the last prefill ahead of them ended (before that, the worker was busy with
//! that one). A thread records the time of each first token it sees (the first byte of a
//! successful streamed answer; see `Shard::prefill_ended`), by worker, and writes the table
//! under its own key beside its shard: a separate key, so that a filter that does not know it
//! still reads the shard.

use crate::wire::Reader;

const VERSION: u8 = 1;
const ENTRY_LEN: usize = 16;
/// Most workers one table keeps (the least recent go first): a decision reads every thread's
/// table, so this bounds what a large pool adds to it. A worker whose record went (no first
/// token from it lately, among this many others) is credited by its queue's age alone.
pub const MAX_WORKERS: usize = 256;

pub fn done_key(id: u32) -> String {
    format!("kvroute.load.done.{id}")
}

/// Per worker key, when its last prefill seen by this thread ended (ms).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefillsDone {
    entries: Vec<(u64, u64)>,
}

impl PrefillsDone {
    /// `worker`'s prefill ended at `at_ms`; a later time replaces an earlier one.
    pub fn record(&mut self, worker: u64, at_ms: u64) {
        match self.entries.iter_mut().find(|(w, _)| *w == worker) {
            Some(e) => e.1 = e.1.max(at_ms),
            None => {
                if self.entries.len() >= MAX_WORKERS {
                    if let Some(i) = self.least_recent() {
                        self.entries.swap_remove(i);
                    }
                }
                self.entries.push((worker, at_ms));
            }
        }
    }

    fn least_recent(&self) -> Option<usize> {
        self.entries.iter().enumerate().min_by_key(|(_, (_, at))| *at).map(|(i, _)| i)
    }

    /// Forgets the records of `older_than_ms` ago or more (before `now_ms`); returns whether
    /// any went.
    pub fn expire(&mut self, now_ms: u64, older_than_ms: u64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|(_, at)| now_ms.saturating_sub(*at) < older_than_ms);
        self.entries.len() != before
    }

    /// `(worker key, ended at ms)`, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.entries.iter().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(5 + ENTRY_LEN * self.entries.len());
        b.push(VERSION);
        b.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (w, at) in &self.entries {
            b.extend_from_slice(&w.to_le_bytes());
            b.extend_from_slice(&at.to_le_bytes());
        }
        b
    }

    /// `None` for anything malformed or more than [`MAX_WORKERS`] (never panics). A worker
    /// listed twice is kept twice: readers take the latest.
    pub fn decode(bytes: &[u8]) -> Option<PrefillsDone> {
        Some(PrefillsDone { entries: Self::read(bytes)?.collect() })
    }

    /// The entries of an encoded table, read in place (a decision reads every thread's);
    /// `None` where [`PrefillsDone::decode`] would refuse it.
    pub fn read(bytes: &[u8]) -> Option<impl Iterator<Item = (u64, u64)> + '_> {
        let mut r = Reader::new(bytes);
        if r.u8()? != VERSION {
            return None;
        }
        let n = r.u32()? as usize;
        if n > MAX_WORKERS || r.remaining() != n * ENTRY_LEN {
            return None;
        }
        let word = |b: &[u8]| {
            let mut w = [0u8; 8];
            w.copy_from_slice(b);
            u64::from_le_bytes(w)
        };
        Some(bytes[5..].chunks_exact(ENTRY_LEN).map(move |e| (word(&e[..8]), word(&e[8..]))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_latest_end_per_worker_within_its_bounds() {
        let mut d = PrefillsDone::default();
        d.record(7, 100);
        d.record(7, 90);
        d.record(8, 120);
        assert_eq!(d.iter().collect::<Vec<_>>(), vec![(7, 100), (8, 120)]);
        assert!(!d.expire(150, 100));
        assert!(d.expire(205, 100));
        assert_eq!(d.iter().collect::<Vec<_>>(), vec![(8, 120)]);
        for w in 0..MAX_WORKERS as u64 + 5 {
            d.record(1000 + w, 1000 + w);
        }
        assert_eq!(d.iter().count(), MAX_WORKERS);
        assert!(d.iter().all(|(w, at)| w == at && w >= 1005), "the least recent went first");
    }

    #[test]
    fn golden_bytes_and_what_is_refused() {
        let mut d = PrefillsDone::default();
        d.record(0x0102_0304_0506_0708, 0x1122);
        let bytes = d.encode();
        let want: Vec<u8> =
            [vec![1, 1, 0, 0, 0], vec![8, 7, 6, 5, 4, 3, 2, 1], vec![0x22, 0x11, 0, 0, 0, 0, 0, 0]]
                .concat();
        assert_eq!(bytes, want);
        assert_eq!(PrefillsDone::decode(&bytes), Some(d.clone()));
        assert_eq!(
            PrefillsDone::decode(&PrefillsDone::default().encode()),
            Some(PrefillsDone::default())
        );
        assert_eq!(PrefillsDone::decode(&bytes[..bytes.len() - 1]), None, "truncated");
        assert_eq!(PrefillsDone::decode(&[2, 0, 0, 0, 0]), None, "unknown version");
        let mut huge = vec![1];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(PrefillsDone::decode(&huge), None);
    }
}
