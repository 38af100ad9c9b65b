use proptest::prelude::*;

use super::*;
use crate::decision::load::{worker_key, WorkerLoad};
use crate::decision::peers::PeerView;
use crate::wire::delta::Delta;
use crate::wire::snapshot::{Snapshot, SNAPSHOT_FORMAT, SNAPSHOT_FORMAT_PEERS};

fn load(replica: u64, key: u64, at_ms: u64, prefilling: u32) -> PeerLoad {
    PeerLoad {
        replica,
        worker_key: key,
        at_ms,
        inflight: prefilling + 1,
        prefilling,
        prefill_tokens: 100 * u64::from(prefilling),
        arriving_tokens_per_s: 0,
    }
}

fn credit(replica: u64, worker: &str, at_ms: u64, hashes: &[u64]) -> PeerCredit {
    PeerCredit { replica, worker: worker.into(), at_ms, hashes: hashes.to_vec() }
}

fn section() -> PeerSection {
    PeerSection {
        ttl_ms: 1000,
        load_ttl_ms: 500,
        loads: vec![load(7, 9, 100, 1)],
        credits: vec![credit(7, "w", 100, &[1, 2])],
    }
}

#[test]
fn report_golden_bytes() {
    crate::conformance::codecs::peer_report_golden();
}

#[test]
fn snapshot_with_peers_is_format_4_and_its_section_trails() {
    let plain = Snapshot { version: 2, generated_at_ms: 3, ..Default::default() };
    let old = plain.encode();
    assert_eq!(old[4], SNAPSHOT_FORMAT);
    let with = Snapshot { peers: Some(section()), ..plain.clone() };
    let bytes = with.encode();
    assert_eq!(bytes[4], SNAPSHOT_FORMAT_PEERS);
    // Format 4 = format 3's bytes (but the format byte), then the section.
    assert_eq!(&bytes[5..old.len()], &old[5..]);
    let mut tail = Vec::new();
    section().encode_into(&mut tail);
    assert_eq!(&bytes[old.len()..], &tail[..]);
    assert_eq!(&tail[..16], &[1000u64.to_le_bytes(), 500u64.to_le_bytes()].concat()[..]);
    assert_eq!(Snapshot::decode(&bytes), Ok(with));
    assert_eq!(Snapshot::decode(&old), Ok(plain));
    for n in old.len()..bytes.len() {
        assert!(Snapshot::decode(&bytes[..n]).is_err());
    }
}

#[test]
fn delta_with_peers_round_trips_and_applies() {
    let s1 = Snapshot { version: 1, generated_at_ms: 100, ..Default::default() };
    let s2 = Snapshot { version: 2, generated_at_ms: 200, peers: Some(section()), ..s1.clone() };
    let d = Delta::between(&s1, &s2);
    assert_eq!(d.peers, Some(section()));
    let bytes = d.encode();
    assert_eq!(bytes[4], crate::wire::delta::DELTA_FORMAT_PEERS);
    assert_eq!(Delta::decode(&bytes), Ok(d.clone()));
    let mut s = s1.clone();
    s.apply_delta(&d).unwrap();
    assert_eq!(s.peers, Some(section()));
    // The load goes away, the credit stays.
    let mut gone = section();
    gone.loads.clear();
    let s3 = Snapshot { version: 3, generated_at_ms: 300, peers: Some(gone.clone()), ..s1 };
    let d2 = Delta::between(&s2, &s3);
    let p = d2.peers.clone().unwrap();
    assert!(p.credits.is_empty() && p.loads.len() == 1 && p.loads[0].is_zero());
    s.apply_delta(&d2).unwrap();
    assert_eq!(s.peers, Some(gone));
    // Composed, the zero load survives as a removal marker.
    let c = Delta::compose(&[d, d2]).unwrap();
    let p = c.peers.unwrap();
    assert_eq!((p.loads.len(), p.credits.len()), (1, 1));
    assert!(p.loads[0].is_zero());
}

#[test]
fn merges_replace_loads_add_credits_and_expire() {
    let mut full = section();
    let newer = PeerSection {
        ttl_ms: 1000,
        load_ttl_ms: 500,
        loads: vec![load(7, 9, 400, 3), load(8, 9, 400, 1)],
        credits: vec![credit(8, "v", 400, &[5])],
    };
    full.merge(&newer, 400, false);
    assert_eq!(full.loads.len(), 2);
    assert_eq!(full.loads.iter().find(|l| l.replica == 7).unwrap().prefilling, 3);
    assert_eq!(full.credits.len(), 2);
    // At 1150 the first credit (100) is past its 1000 ms; loads (400) past their 500 ms.
    full.expire(1150, false);
    assert_eq!(full.credits.len(), 1);
    assert!(full.loads.is_empty());
    assert_eq!(full.without(8).credits.len(), 0);
}

#[test]
fn a_view_ignores_its_own_replica_and_expires_loads() {
    let w = "127.0.0.1:1";
    let key = worker_key(w);
    let mut v = PeerView::default();
    v.set_replica(7);
    let s = PeerSection {
        ttl_ms: 1000,
        load_ttl_ms: 500,
        loads: vec![load(7, key, 100, 1), load(8, key, 100, 2), load(9, key, 100, 1)],
        credits: vec![credit(7, w, 100, &[1]), credit(8, w, 100, &[2])],
    };
    let credits: Vec<u64> = v.apply(&s, true).map(|c| c.replica).collect();
    assert_eq!(credits, [8], "its own credit is not returned");
    let l = v.load(worker_key(w), 200);
    assert_eq!((l.prefilling_requests, l.inflight_requests, l.prefill_tokens), (3, 5, 300));
    assert_eq!(v.load(worker_key("127.0.0.1:2"), 200), WorkerLoad::default());
    assert_eq!(v.load(worker_key(w), 600), WorkerLoad::default(), "expired");
    // A delta's zero load removes replica 8's.
    let gone = PeerSection { loads: vec![load(8, key, 150, 0)], credits: vec![], ..s.clone() };
    let zero = PeerLoad { inflight: 0, ..gone.loads[0] };
    let gone = PeerSection { loads: vec![zero], ..gone };
    let _ = v.apply(&gone, false).count();
    assert_eq!(v.load(worker_key(w), 200).prefilling_requests, 1);
}

#[test]
fn arrivals_travel_only_where_a_load_has_them_and_the_reader_asks() {
    let plain =
        Snapshot { version: 2, generated_at_ms: 3, peers: Some(section()), ..Default::default() };
    let mut arriving = section();
    arriving.loads[0].arriving_tokens_per_s = 1200;
    let with = Snapshot { peers: Some(arriving.clone()), ..plain.clone() };
    // A snapshot: format 5 with sections bits 2 and 16, its load entries 4 bytes longer.
    let bytes = with.encode();
    assert_eq!(bytes[4], crate::wire::snapshot::SNAPSHOT_FORMAT_SECTIONS);
    assert_eq!(bytes.len(), plain.encode().len() + 1 + 4);
    assert_eq!(Snapshot::decode(&bytes), Ok(with.clone()));
    for n in 0..bytes.len() {
        assert!(Snapshot::decode(&bytes[..n]).is_err());
    }
    // Without them (a reader that did not ask), the bytes are what they always were.
    let without = Snapshot { peers: Some(arriving.clone().without_arrivals()), ..plain.clone() };
    assert_eq!(without.encode(), plain.encode());
    assert_eq!(plain.encode()[4], SNAPSHOT_FORMAT_PEERS);
    // A delta likewise (bit 32), and applied it keeps the arrivals.
    let d = Delta::between(&plain, &with);
    assert_eq!(d.peers.as_ref().map(|p| p.loads[0].arriving_tokens_per_s), Some(1200));
    let dbytes = d.encode();
    assert_eq!(dbytes[4], crate::wire::delta::DELTA_FORMAT_SECTIONS);
    assert_eq!(Delta::decode(&dbytes), Ok(d.clone()));
    let mut s = plain.clone();
    s.apply_delta(&d).unwrap();
    assert_eq!(s.peers, Some(arriving.clone()));
    // The arrivals bit without a peer section is refused.
    let mut bad = Snapshot { pool: true, ..Snapshot::default() }.encode();
    let at = bad.len() - 1;
    assert_eq!(bad[at], 1, "the sections byte ends a pool snapshot without peers");
    bad[at] = 1 | 16;
    assert!(Snapshot::decode(&bad).is_err());
}

#[test]
fn other_replicas_arrivals_add_to_the_workers_rate() {
    let key = worker_key("127.0.0.1:1");
    let mut v = PeerView::default();
    v.set_replica(7);
    let with =
        |replica, rate| PeerLoad { arriving_tokens_per_s: rate, ..load(replica, key, 100, 1) };
    let s = PeerSection {
        loads: vec![with(7, 5000), with(8, 1000), with(9, 300)],
        credits: vec![],
        ..section()
    };
    let _ = v.apply(&s, true).count();
    assert_eq!(v.load(key, 200).arriving_tokens_per_s, 1300, "its own replica's left out");
    // A load whose only work left is its arrivals still counts them; one with none is gone.
    let only = PeerLoad { inflight: 0, prefilling: 0, prefill_tokens: 0, ..with(8, 700) };
    assert!(!only.is_zero() && only.zeroed().is_zero());
    let _ = v.apply(&PeerSection { loads: vec![only, with(9, 300).zeroed()], ..s }, false).count();
    assert_eq!(v.load(key, 200).arriving_tokens_per_s, 700);
}

proptest! {
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = PeerReport::decode_with(&bytes, &DecodeLimits::default());
        let mut with_magic = b"KVRP\x01".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = PeerReport::decode_with(&with_magic, &DecodeLimits::default());
        let mut snap = Snapshot::default().encode();
        snap[4] = SNAPSHOT_FORMAT_PEERS;
        snap.extend_from_slice(&bytes);
        let _ = Snapshot::decode(&snap);
    }

    #[test]
    fn reports_round_trip(replica: u64, seq: u64, hashes in proptest::collection::vec(any::<u64>(), 0..20),
                          workers in proptest::collection::vec("[0-9.:]{1,21}", 0..4)) {
        let r = PeerReport {
            replica,
            seq,
            loads: workers
                .iter()
                .map(|w| PeerLoad { arriving_tokens_per_s: seq as u32, ..load(replica, w.len() as u64, seq, 2) })
                .collect(),
            credits: workers.iter().map(|w| credit(replica, w, seq, &hashes)).collect(),
        };
        prop_assert_eq!(PeerReport::decode_with(&r.encode(), &DecodeLimits::default()), Ok(r.clone()));
        // Format 1 carries everything but the arrivals.
        let plain = PeerReport {
            loads: r.loads.iter().map(|l| PeerLoad { arriving_tokens_per_s: 0, ..*l }).collect(),
            ..r.clone()
        };
        prop_assert_eq!(PeerReport::decode_with(&r.encode_with(false), &DecodeLimits::default()), Ok(plain));
    }
}
