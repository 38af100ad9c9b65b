//! Golden bytes of the knowledge codecs (updater → Envoy and between Envoy threads): a journal
//! entry, a snapshot, two deltas and a peer report, each encoded to the exact bytes and decoded
//! back; and counts a 32-bit decoder cannot hold, refused instead of overflowing.

use crate::wire::delta::{is_delta, Delta, DeltaError, SetChange, WorkerDelta};
use crate::wire::journal::JournalEntry;
use crate::wire::journal::Source;
use crate::wire::peers::{PeerCredit, PeerError, PeerLoad, PeerReport};
use crate::wire::snapshot::{ModelInfo, Snapshot, SnapshotWorker, WorkerPlacement};
use crate::wire::{DecodeLimits, SnapshotError};

/// The journal entry of the golden bytes.
pub fn journal_sample() -> JournalEntry {
    JournalEntry {
        seq: 7,
        at_ms: 1000,
        source: Source::Routed,
        worker: "127.0.0.1:8001".into(),
        hashes: vec![1, u64::MAX],
        retract: false,
    }
}

pub fn journal_golden() {
    let bytes = journal_sample().encode();
    let mut want = vec![1u8, 7, 0, 0, 0, 0, 0, 0, 0, 0xe8, 3, 0, 0, 0, 0, 0, 0, 1, 14];
    want.extend_from_slice(b"127.0.0.1:8001");
    want.extend_from_slice(&[2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
    want.extend_from_slice(&[0xff; 8]);
    assert_eq!(bytes, want);
    assert_eq!(JournalEntry::decode(&bytes), Ok(journal_sample()));
    let retract = JournalEntry { retract: true, ..journal_sample() };
    let b = retract.encode();
    assert_eq!(b[17], 0x81);
    assert_eq!(JournalEntry::decode(&b), Ok(retract));
}

/// The snapshot of the golden bytes.
pub fn snapshot_sample() -> Snapshot {
    Snapshot {
        version: 3,
        generated_at_ms: 1000,
        models: vec![ModelInfo { name: "m".into(), fingerprint: 9, block_size: 16 }],
        workers: vec![SnapshotWorker {
            worker: "127.0.0.1:8000".into(),
            observed_at_ms: 999,
            compatible: true,
            gpu: vec![1, 2],
            offloaded: vec![],
            load: None,
            model: "m".into(),
            adapters: vec!["sql".into()],
        }],
        peers: None,
        pool: false,
        down: vec![],
        placements: vec![],
    }
}

pub fn snapshot_golden() {
    let mut want = b"KVRS\x03".to_vec();
    want.extend_from_slice(&3u64.to_le_bytes());
    want.extend_from_slice(&1000u64.to_le_bytes());
    want.extend_from_slice(&1u16.to_le_bytes()); // one model
    want.extend_from_slice(&1u16.to_le_bytes());
    want.push(b'm');
    want.extend_from_slice(&9u64.to_le_bytes());
    want.extend_from_slice(&16u32.to_le_bytes());
    want.extend_from_slice(&1u32.to_le_bytes()); // one worker
    want.extend_from_slice(&14u16.to_le_bytes());
    want.extend_from_slice(b"127.0.0.1:8000");
    want.extend_from_slice(&999u64.to_le_bytes());
    want.push(1);
    want.push(0);
    want.extend_from_slice(&1u16.to_le_bytes()); // its model
    want.push(b'm');
    want.extend_from_slice(&1u16.to_le_bytes()); // one adapter
    want.extend_from_slice(&3u16.to_le_bytes());
    want.extend_from_slice(b"sql");
    want.extend_from_slice(&2u32.to_le_bytes());
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(&2u64.to_le_bytes());
    want.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(snapshot_sample().encode(), want);
    assert_eq!(Snapshot::decode(&want), Ok(snapshot_sample()));
}

pub fn delta_golden() {
    let d = Delta {
        peers: None,
        pool: false,
        removed: vec![],
        down: None,
        placements: None,
        from_version: 3,
        to_version: 4,
        generated_at_ms: 40,
        models: None,
        workers: vec![WorkerDelta {
            worker: "w".into(),
            observed_at_ms: 39,
            compatible: true,
            load: None,
            reset: false,
            model: None,
            adapters: Some(vec!["sql".into()]),
            gpu: SetChange { add: vec![7], remove: vec![5] },
            offloaded: SetChange::default(),
        }],
    };
    let mut want = b"KVRD\x02".to_vec();
    for v in [3u64, 4, 40] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    want.push(0); // models unchanged
    want.extend_from_slice(&1u32.to_le_bytes());
    want.extend_from_slice(&1u16.to_le_bytes());
    want.push(b'w');
    want.extend_from_slice(&39u64.to_le_bytes());
    want.extend_from_slice(&[1, 0]); // compatible, no load
    want.push(4); // flags: no reset, no model, adapters follow
    want.extend_from_slice(&1u16.to_le_bytes());
    want.extend_from_slice(&3u16.to_le_bytes());
    want.extend_from_slice(b"sql");
    want.extend_from_slice(&1u32.to_le_bytes());
    want.extend_from_slice(&5u64.to_le_bytes()); // gpu removed
    want.extend_from_slice(&1u32.to_le_bytes());
    want.extend_from_slice(&7u64.to_le_bytes()); // gpu added
    want.extend_from_slice(&0u32.to_le_bytes());
    want.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(d.encode(), want);
    assert_eq!(Delta::decode(&want), Ok(d));
    assert!(is_delta(&want));
    assert!(!is_delta(&Snapshot { version: 1, ..Snapshot::default() }.encode()));
}

/// Format 5: the sample as the updater's whole pool; format 3's bytes, then the sections byte
/// (1: pool). Unknown section bits are refused.
pub fn snapshot_pool_golden() {
    let pool = Snapshot { pool: true, ..snapshot_sample() };
    let mut want = snapshot_sample().encode();
    want[4] = 5;
    want.push(1);
    assert_eq!(pool.encode(), want);
    assert_eq!(Snapshot::decode(&want), Ok(pool));
    let mut bad = want.clone();
    *bad.last_mut().unwrap() = 1 | 16;
    assert_eq!(Snapshot::decode(&bad), Err(SnapshotError::Flags(17)));
    assert_eq!(Snapshot::decode(&want[..want.len() - 1]), Err(SnapshotError::Truncated));
}

/// Format 5 without the pool flag: a snapshot that names a worker down (sections bit 4, after
/// the workers); with no worker down the bytes are format 3's, as before.
pub fn snapshot_down_golden() {
    let down = Snapshot { down: vec!["127.0.0.1:8000".into()], ..snapshot_sample() };
    let mut want = snapshot_sample().encode();
    assert_eq!(want[4], 3, "nobody down: format 3");
    want[4] = 5;
    want.push(4); // sections: the workers down follow
    want.extend_from_slice(&1u16.to_le_bytes());
    want.extend_from_slice(&14u16.to_le_bytes());
    want.extend_from_slice(b"127.0.0.1:8000");
    assert_eq!(down.encode(), want);
    assert_eq!(Snapshot::decode(&want), Ok(down.clone()));
    let pool = Snapshot { pool: true, ..down };
    let mut want_pool = want.clone();
    want_pool[snapshot_sample().encode().len()] = 1 | 4;
    assert_eq!(pool.encode(), want_pool);
    assert_eq!(Snapshot::decode(&want_pool), Ok(pool));
    assert_eq!(Snapshot::decode(&want[..want.len() - 1]), Err(SnapshotError::Truncated));
}

/// Format 4 without the pool flag: a delta whose only change is the list of workers down
/// (sections bit 8, after the removed workers); an empty list (nobody down any more) travels
/// too.
pub fn delta_golden_with_workers_down() {
    let d = Delta {
        from_version: 8,
        to_version: 9,
        generated_at_ms: 90,
        down: Some(vec!["w".into()]),
        ..Delta::default()
    };
    let mut want = b"KVRD\x04".to_vec();
    for v in [8u64, 9, 90] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    want.push(0); // models unchanged
    want.extend_from_slice(&0u32.to_le_bytes()); // no worker changed
    want.push(8); // sections: the workers down follow
    want.extend_from_slice(&1u16.to_le_bytes());
    want.extend_from_slice(&1u16.to_le_bytes());
    want.push(b'w');
    assert_eq!(d.encode(), want);
    assert_eq!(Delta::decode(&want), Ok(d.clone()));
    let mut s = Snapshot { version: 8, ..snapshot_sample() };
    s.apply_delta(&d).unwrap();
    assert_eq!(s.down, vec!["w".to_string()]);
    let back = Delta { from_version: 9, to_version: 10, down: Some(vec![]), ..d.clone() };
    let b = back.encode();
    assert_eq!(&b[34..], &[8, 0, 0], "an empty list: nobody down");
    s.apply_delta(&Delta::decode(&b).unwrap()).unwrap();
    assert!(s.down.is_empty());
    let none = Delta { down: None, ..d };
    assert_eq!(none.encode()[4], 2, "no change to the list: format 2, as before");
}

/// The placement of the golden bytes: zone and node known, site and rack not.
pub fn placement_sample() -> WorkerPlacement {
    WorkerPlacement {
        worker: "127.0.0.1:8000".into(),
        site: None,
        zone: Some("z1".into()),
        rack: None,
        node: Some("n1".into()),
        observed_at_ms: 998,
    }
}

fn placement_bytes() -> Vec<u8> {
    let mut want = 1u16.to_le_bytes().to_vec(); // one placement
    want.extend_from_slice(&14u16.to_le_bytes());
    want.extend_from_slice(b"127.0.0.1:8000");
    want.extend_from_slice(&998u64.to_le_bytes());
    want.extend_from_slice(&0u16.to_le_bytes()); // site unknown
    want.extend_from_slice(&2u16.to_le_bytes());
    want.extend_from_slice(b"z1");
    want.extend_from_slice(&0u16.to_le_bytes()); // rack unknown
    want.extend_from_slice(&2u16.to_le_bytes());
    want.extend_from_slice(b"n1");
    want
}

/// Format 5 with the placements (sections bit 8, after the workers down); without any the
/// bytes are format 3's, as before. Unknown section bits are still refused.
pub fn snapshot_placement_golden() {
    let placed = Snapshot { placements: vec![placement_sample()], ..snapshot_sample() };
    let mut want = snapshot_sample().encode();
    assert_eq!(want[4], 3, "no placement: format 3");
    let at = want.len();
    want[4] = 5;
    want.push(8); // sections: the placements follow
    want.extend_from_slice(&placement_bytes());
    assert_eq!(placed.encode(), want);
    assert_eq!(Snapshot::decode(&want), Ok(placed.clone()));
    let both = Snapshot { pool: true, down: vec!["w".into()], ..placed };
    let mut want_both = want[..at].to_vec();
    want_both.push(1 | 4 | 8);
    want_both.extend_from_slice(&[1, 0, 1, 0, b'w']); // the workers down first
    want_both.extend_from_slice(&placement_bytes());
    assert_eq!(both.encode(), want_both);
    assert_eq!(Snapshot::decode(&want_both), Ok(both));
    for n in at..want.len() {
        assert_eq!(Snapshot::decode(&want[..n]), Err(SnapshotError::Truncated));
    }
    let mut bad = want.clone();
    bad[at] = 8 | 16;
    assert_eq!(Snapshot::decode(&bad), Err(SnapshotError::Flags(24)));
}

/// Format 4: a delta whose only change is the list of placements (sections bit 16, after the
/// workers down); an empty list (every placement forgotten) travels too.
pub fn delta_golden_with_placements() {
    let d = Delta {
        from_version: 8,
        to_version: 9,
        generated_at_ms: 90,
        placements: Some(vec![placement_sample()]),
        ..Delta::default()
    };
    let mut want = b"KVRD\x04".to_vec();
    for v in [8u64, 9, 90] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    want.push(0); // models unchanged
    want.extend_from_slice(&0u32.to_le_bytes()); // no worker changed
    want.push(16); // sections: the placements follow
    want.extend_from_slice(&placement_bytes());
    assert_eq!(d.encode(), want);
    assert_eq!(Delta::decode(&want), Ok(d.clone()));
    let mut s = Snapshot { version: 8, ..snapshot_sample() };
    s.apply_delta(&d).unwrap();
    assert_eq!(s.placements, vec![placement_sample()]);
    let gone = Delta { from_version: 9, to_version: 10, placements: Some(vec![]), ..d.clone() };
    let b = gone.encode();
    assert_eq!(&b[34..], &[16, 0, 0], "an empty list: no placement known");
    s.apply_delta(&Delta::decode(&b).unwrap()).unwrap();
    assert!(s.placements.is_empty());
    assert_eq!(Delta { placements: None, ..d }.encode()[4], 2, "no change: format 2");
    let mut bad = want.clone();
    bad[34] = 32;
    assert_eq!(Delta::decode(&bad), Err(DeltaError::Body(SnapshotError::Flags(32))));
}

/// Format 4: a pool delta that removes two workers and changes none.
pub fn delta_golden_removing_workers() {
    let d = Delta {
        from_version: 8,
        to_version: 9,
        generated_at_ms: 90,
        pool: true,
        removed: vec!["10.0.0.7:8000".into(), "w".into()],
        ..Delta::default()
    };
    let mut want = b"KVRD\x04".to_vec();
    for v in [8u64, 9, 90] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    want.push(0); // models unchanged
    want.extend_from_slice(&0u32.to_le_bytes()); // no worker changed
    want.push(1 | 4); // sections: pool, removed workers follow
    want.extend_from_slice(&2u16.to_le_bytes());
    want.extend_from_slice(&13u16.to_le_bytes());
    want.extend_from_slice(b"10.0.0.7:8000");
    want.extend_from_slice(&1u16.to_le_bytes());
    want.push(b'w');
    assert_eq!(d.encode(), want);
    assert_eq!(Delta::decode(&want), Ok(d.clone()));
    let mut s = Snapshot { version: 8, pool: true, ..snapshot_sample() };
    s.workers[0].worker = "w".into();
    s.apply_delta(&d).unwrap();
    assert!(s.workers.is_empty() && s.pool && s.version == 9);
    let mut bad = want.clone();
    bad[34] = 0x20;
    assert_eq!(Delta::decode(&bad), Err(DeltaError::Body(SnapshotError::Flags(0x20))));
}

pub fn delta_golden_with_models_and_a_new_worker() {
    let d = Delta {
        peers: None,
        pool: false,
        removed: vec![],
        down: None,
        placements: None,
        from_version: 1,
        to_version: 2,
        generated_at_ms: 5,
        models: Some(vec![ModelInfo { name: "q".into(), fingerprint: 7, block_size: 32 }]),
        workers: vec![WorkerDelta {
            worker: "w".into(),
            observed_at_ms: 0,
            compatible: false,
            load: None,
            reset: true,
            model: Some("q".into()),
            adapters: Some(vec![]),
            gpu: SetChange::default(),
            offloaded: SetChange::default(),
        }],
    };
    let mut want = b"KVRD\x02".to_vec();
    for v in [1u64, 2, 5] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    want.push(1); // the model list follows
    want.extend_from_slice(&1u16.to_le_bytes());
    want.extend_from_slice(&1u16.to_le_bytes());
    want.push(b'q');
    want.extend_from_slice(&7u64.to_le_bytes());
    want.extend_from_slice(&32u32.to_le_bytes());
    want.extend_from_slice(&1u32.to_le_bytes());
    want.extend_from_slice(&1u16.to_le_bytes());
    want.push(b'w');
    want.extend_from_slice(&0u64.to_le_bytes());
    want.extend_from_slice(&[0, 0]); // incompatible, no load
    want.push(1 | 2 | 4); // reset, model, adapters
    want.extend_from_slice(&1u16.to_le_bytes());
    want.push(b'q');
    want.extend_from_slice(&0u16.to_le_bytes()); // no adapters
    for _ in 0..4 {
        want.extend_from_slice(&0u32.to_le_bytes());
    }
    assert_eq!(d.encode(), want);
    assert_eq!(Delta::decode(&want), Ok(d));
    // Unknown flag bits are refused.
    let mut bad = want.clone();
    let flags_at = want.len() - 16 - 2 - 1 - 2 - 1;
    assert_eq!(bad[flags_at], 7);
    bad[flags_at] = 0x17;
    assert_eq!(Delta::decode(&bad), Err(DeltaError::Body(SnapshotError::Flags(0x17))));
}

pub fn peer_report_golden() {
    let r = PeerReport {
        replica: 7,
        seq: 3,
        loads: vec![PeerLoad {
            replica: 7,
            worker_key: 9,
            at_ms: 0,
            inflight: 2,
            prefilling: 1,
            prefill_tokens: 100,
            arriving_tokens_per_s: 4000,
        }],
        credits: vec![PeerCredit { replica: 7, worker: "w".into(), at_ms: 5, hashes: vec![1] }],
    };
    // Format 1 (no arrivals), then format 2: the same with each load's arrivals after it.
    let report = |format: u8| {
        let mut want = vec![b'K', b'V', b'R', b'P', format];
        want.extend_from_slice(&7u64.to_le_bytes());
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes()); // one load
        for v in [7u64, 9, 0] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&100u64.to_le_bytes());
        if format == 2 {
            want.extend_from_slice(&4000u32.to_le_bytes());
        }
        want.extend_from_slice(&1u32.to_le_bytes()); // one credit
        want.extend_from_slice(&7u64.to_le_bytes());
        want.extend_from_slice(&1u16.to_le_bytes());
        want.push(b'w');
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&1u64.to_le_bytes());
        want
    };
    let limits = DecodeLimits::default();
    let (plain, want) = (report(1), report(2));
    assert_eq!(r.encode_with(false), plain);
    assert_eq!(r.encode(), want);
    assert_eq!(PeerReport::decode_with(&want, &limits), Ok(r.clone()));
    let mut without = r.clone();
    without.loads[0].arriving_tokens_per_s = 0;
    assert_eq!(PeerReport::decode_with(&plain, &limits), Ok(without));
    for bytes in [&plain, &want] {
        for n in 0..bytes.len() {
            assert!(PeerReport::decode_with(&bytes[..n], &limits).is_err());
        }
    }
    let mut bad = want.clone();
    bad[4] = 3;
    assert_eq!(PeerReport::decode_with(&bad, &limits), Err(PeerError::Format(3)));
    let tight = DecodeLimits { max_hashes_per_worker: 0, ..limits };
    assert!(PeerReport::decode_with(&want, &tight).is_err(), "hashes per credit are bounded");
}

/// A hash count whose size in bytes (`count * 8`) is past `usize::MAX` on a 32-bit target
/// (0x2000_0001 * 8 wraps to 8 there), under limits an operator may set as high as they like,
/// is refused as truncated: never an arithmetic overflow (a panic in a debug build, a wrapped
/// size check in a release one).
pub fn hash_counts_past_the_32_bit_address_space_are_refused() {
    let unbounded = DecodeLimits { max_hashes_per_worker: usize::MAX, ..DecodeLimits::default() };
    let mut bytes = snapshot_sample().encode();
    // The first worker's GPU hash count: two hashes then an empty offloaded list end the payload.
    let at = bytes.len() - 4 - 2 * 8 - 4;
    assert_eq!(bytes[at..at + 4], 2u32.to_le_bytes());
    bytes[at..at + 4].copy_from_slice(&0x2000_0001u32.to_le_bytes());
    assert_eq!(Snapshot::decode_with(&bytes, &unbounded), Err(SnapshotError::Truncated));
    assert_eq!(Snapshot::decode(&bytes), Err(SnapshotError::TooLarge(0x2000_0001)));
}
