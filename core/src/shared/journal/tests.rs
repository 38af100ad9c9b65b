use std::sync::Arc;

use super::*;
use crate::shared::fake::{MemStore, Tally};
use crate::wire::journal::Source;

fn entry(worker: &str, n: usize) -> JournalEntry {
    JournalEntry {
        seq: 0,
        at_ms: 1,
        source: Source::Routed,
        worker: worker.into(),
        hashes: (0..n as u64).collect(),
        retract: false,
    }
}

const LIMITS: JournalLimits = JournalLimits { max_hashes_per_entry: 100, max_hashes_per_poll: 250 };

fn drain(store: &MemStore, cursor: &mut JournalCursor, t: &Tally) -> Vec<JournalEntry> {
    let mut all = Vec::new();
    for _ in 0..1000 {
        let (batch, more) = cursor.poll(store, t, LIMITS.max_hashes_per_poll);
        all.extend(batch);
        if !more {
            return all;
        }
    }
    panic!("journal never drained");
}

#[test]
fn appends_from_many_threads_all_land_once() {
    let store = Arc::new(MemStore::new());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let tally = Tally::default();
                for _ in 0..40 {
                    assert!(append(&*store, &tally, &LIMITS, entry(&format!("w{t}"), 1)));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let tally = Tally::default();
    let got = drain(&store, &mut JournalCursor::default(), &tally);
    assert_eq!(got.len(), 320);
    let mut seqs: Vec<u64> = got.iter().map(|e| e.seq).collect();
    seqs.dedup();
    assert_eq!(seqs, (0..320).collect::<Vec<_>>());
    for t in 0..8 {
        assert_eq!(got.iter().filter(|e| e.worker == format!("w{t}")).count(), 40);
    }
    assert_eq!(tally.get(Counter::JournalSkipped), 0);
}

#[test]
fn a_cursor_left_behind_the_ring_skips_ahead_and_counts() {
    let store = MemStore::new();
    let t = Tally::default();
    for _ in 0..(SLOTS + 88) {
        assert!(append(&store, &t, &LIMITS, entry("w", 1)));
    }
    let mut cursor = JournalCursor::default();
    let got = drain(&store, &mut cursor, &t);
    assert_eq!(got.len() as u64, SLOTS);
    assert_eq!(got[0].seq, 88);
    assert_eq!(t.get(Counter::JournalSkipped), 88);
    // Caught up: nothing more, and new entries arrive in order.
    assert!(drain(&store, &mut cursor, &t).is_empty());
    append(&store, &t, &LIMITS, entry("w", 1));
    assert_eq!(drain(&store, &mut cursor, &t)[0].seq, SLOTS + 88);
}

#[test]
fn lost_writes_are_counted_and_never_block_readers() {
    let store = MemStore::new();
    let t = Tally::default();
    store.fail_every(3);
    let ok = (0..30).filter(|_| append(&store, &t, &LIMITS, entry("w", 1))).count();
    store.fail_every(0);
    assert!(ok < 30 && ok > 0, "{ok}");
    assert_eq!(t.get(Counter::LostUpdate), 30 - ok as u64);
    // A claimed slot whose write was lost holds nothing: the reader waits at it for a few
    // polls (its writer may be about to fill it), then gives it up.
    let mut cursor = JournalCursor::default();
    let mut got = Vec::new();
    for _ in 0..200 {
        got.extend(drain(&store, &mut cursor, &t));
    }
    assert_eq!(got.len(), ok);
    assert!(t.get(Counter::JournalSkipped) <= t.get(Counter::LostUpdate));
}

#[test]
fn a_flood_of_huge_entries_is_capped_per_entry_and_per_poll() {
    let store = MemStore::new();
    let t = Tally::default();
    for _ in 0..SLOTS {
        append(&store, &t, &LIMITS, entry("w", 16_384));
    }
    assert_eq!(t.get(Counter::JournalHashesCapped), SLOTS * (16_384 - 100));
    let mut cursor = JournalCursor::default();
    let (first, more) = cursor.poll(&store, &t, LIMITS.max_hashes_per_poll);
    assert!(more);
    assert_eq!(first.len(), 3, "250 hashes per poll: three entries of 100");
    assert!(first.iter().all(|e| e.hashes.len() == 100));
    assert!(t.get(Counter::JournalDeferred) > 0);
    let rest = drain(&store, &mut cursor, &t);
    assert_eq!(rest.len() as u64 + 3, SLOTS);
}

#[test]
fn corrupt_slots_are_skipped_and_counted() {
    let store = MemStore::new();
    let t = Tally::default();
    for _ in 0..4 {
        append(&store, &t, &LIMITS, entry("w", 2));
    }
    store.poke(&slot_key(1), b"\x01garbage");
    store.poke(&slot_key(2), &[]);
    store.poke(HEAD_KEY, &4u64.to_le_bytes());
    let got = drain(&store, &mut JournalCursor::default(), &t);
    assert_eq!(got.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![0, 3]);
    assert_eq!(t.get(Counter::Corrupt), 2);
    // A head that is not 8 bytes reads as an empty journal, never a panic.
    store.poke(HEAD_KEY, b"xyz");
    assert!(drain(&store, &mut JournalCursor::default(), &t).is_empty());
}

#[test]
fn a_read_stopped_by_its_applier_leaves_the_rest_in_order() {
    let (store, t) = (MemStore::new(), Tally::default());
    for i in 0..6 {
        assert!(append(&store, &t, &LIMITS, entry(&format!("w{i}"), 10)));
    }
    let mut cursor = JournalCursor::default();
    let mut seen = Vec::new();
    // The applier stops after the second entry: the four others wait, counted as deferred.
    let more = cursor.each(&store, &t, LIMITS.max_hashes_per_poll, |e| {
        seen.push(e.seq);
        seen.len() < 2
    });
    assert!(more);
    assert_eq!(seen, vec![0, 1]);
    assert_eq!(t.get(Counter::JournalDeferred), 4);
    // The next read starts where it stopped; nothing is lost or read twice.
    let rest: Vec<u64> = drain(&store, &mut cursor, &t).iter().map(|e| e.seq).collect();
    assert_eq!(rest, vec![2, 3, 4, 5]);
    assert_eq!(t.get(Counter::JournalSkipped), 0);
}

#[test]
fn a_reader_far_behind_reads_on_out_of_time() {
    let (store, t) = (MemStore::new(), Tally::default());
    let n = FAR_BEHIND + 10;
    for _ in 0..n {
        assert!(append(&store, &t, &LIMITS, entry("w", 1)));
    }
    let mut cursor = JournalCursor::default();
    let mut seen = 0;
    // Out of time after every entry: it reads on until no more than FAR_BEHIND are left.
    let more = cursor.each(&store, &t, usize::MAX, |_| {
        seen += 1;
        false
    });
    assert!(more);
    assert_eq!(seen, 10);
    assert_eq!(t.get(Counter::JournalDeferred), FAR_BEHIND);
}
