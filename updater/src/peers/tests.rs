use super::*;

fn load(key: u64, prefilling: u32) -> PeerLoad {
    PeerLoad {
        replica: 0,
        worker_key: key,
        at_ms: 0,
        inflight: prefilling,
        prefilling,
        prefill_tokens: 10 * u64::from(prefilling),
        arriving_tokens_per_s: 0,
    }
}

fn report(replica: u64, seq: u64, loads: Vec<PeerLoad>, hashes: &[u64]) -> PeerReport {
    let credits =
        vec![PeerCredit { replica, worker: "w".into(), at_ms: 0, hashes: hashes.to_vec() }];
    PeerReport { replica, seq, loads, credits }
}

fn limits() -> PeerLimits {
    PeerLimits {
        ttl_ms: 1000,
        load_ttl_ms: 500,
        max_replicas: 2,
        max_hashes: 6,
        ..Default::default()
    }
}

#[test]
fn credits_and_loads_are_stamped_published_and_expire() {
    let mut s = PeerStore::new(limits());
    s.report(report(7, 1, vec![load(1, 2)], &[1, 2]), 100).unwrap();
    let p = s.take_pending().unwrap();
    assert_eq!((p.ttl_ms, p.load_ttl_ms), (1000, 500));
    assert_eq!((p.loads[0].replica, p.loads[0].at_ms), (7, 100), "stamped by the updater");
    assert_eq!((p.credits[0].replica, p.credits[0].at_ms), (7, 100));
    assert!(s.take_pending().is_none(), "taken once");
    // Loads expire after 500 ms without a refresh, credits after 1000 ms.
    s.expire(599);
    assert_eq!(s.section().loads.len(), 1);
    s.expire(600);
    assert!(s.section().loads.is_empty());
    assert_eq!(s.section().credits.len(), 1);
    s.expire(1100);
    assert!(s.section().credits.is_empty());
    assert_eq!((s.stats.expired_loads, s.stats.expired_credits), (1, 1));
}

#[test]
fn a_zero_load_removes_and_an_older_report_does_not_overwrite() {
    let mut s = PeerStore::new(limits());
    s.report(report(7, 2, vec![load(1, 2)], &[]), 100).unwrap();
    s.report(report(7, 1, vec![load(1, 5)], &[]), 101).unwrap();
    assert_eq!(s.section().loads[0].prefilling, 2, "seq 1 arrived late");
    assert_eq!(s.stats.stale_loads, 1);
    let _ = s.take_pending();
    s.report(report(7, 3, vec![load(1, 0)], &[]), 102).unwrap();
    assert!(s.section().loads.is_empty());
    let p = s.take_pending().unwrap();
    assert!(p.loads[0].is_zero(), "the removal is published");
}

#[test]
fn replicas_and_hashes_are_bounded() {
    let mut s = PeerStore::new(limits());
    s.report(report(1, 1, vec![], &[1, 2, 3]), 0).unwrap();
    s.report(report(2, 1, vec![], &[4, 5, 6]), 0).unwrap();
    assert_eq!(s.report(report(3, 1, vec![], &[7]), 0), Err(Refused::Replicas(2)));
    assert_eq!(s.report(report(0, 1, vec![], &[7]), 0), Err(Refused::NoReplica));
    assert_eq!(s.stats.refused, 2);
    s.report(report(1, 2, vec![], &[8]), 0).unwrap();
    assert_eq!(s.stats.dropped_hashes, 3, "the oldest credit went");
    let left: Vec<u64> = s.section().credits.iter().flat_map(|c| c.hashes.clone()).collect();
    assert_eq!(left, [4, 5, 6, 8]);
    // A replica heard from no more is forgotten, making room.
    s.expire(5_000);
    s.report(report(3, 1, vec![], &[9]), 5_000).unwrap();
}

#[test]
fn a_section_leaves_out_the_asking_replica() {
    let mut s = PeerStore::new(limits());
    s.report(report(1, 1, vec![load(1, 1)], &[1]), 0).unwrap();
    s.report(report(2, 1, vec![load(1, 1)], &[2]), 0).unwrap();
    let for_1 = s.section().without(1);
    assert!(for_1.loads.iter().chain([].iter()).all(|l| l.replica == 2));
    assert_eq!(for_1.credits.len(), 1);
    assert_eq!(for_1.credits[0].replica, 2);
}
