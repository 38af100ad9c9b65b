use super::*;
use proptest::prelude::*;

fn worker(name: &str, gpu: Vec<u64>, observed: u64) -> WorkerKnowledge {
    WorkerKnowledge {
        worker: name.into(),
        observed_at_ms: observed,
        compatible: true,
        gpu,
        offloaded: Vec::new(),
        load: None,
    }
}

fn snap(version: u64, workers: Vec<WorkerKnowledge>) -> Snapshot {
    Snapshot { version, generated_at_ms: version * 10, workers }
}

#[test]
fn golden_bytes() {
    let d = Delta {
        from_version: 3,
        to_version: 4,
        generated_at_ms: 40,
        workers: vec![WorkerDelta {
            worker: "w".into(),
            observed_at_ms: 39,
            compatible: true,
            load: None,
            reset: false,
            gpu: SetChange { add: vec![7], remove: vec![5] },
            offloaded: SetChange::default(),
        }],
    };
    let mut want = b"KVRD\x01".to_vec();
    for v in [3u64, 4, 40] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    want.extend_from_slice(&1u32.to_le_bytes());
    want.extend_from_slice(&1u16.to_le_bytes());
    want.push(b'w');
    want.extend_from_slice(&39u64.to_le_bytes());
    want.extend_from_slice(&[1, 0, 0]); // compatible, no load, no reset
    want.extend_from_slice(&1u32.to_le_bytes());
    want.extend_from_slice(&5u64.to_le_bytes()); // gpu removed
    want.extend_from_slice(&1u32.to_le_bytes());
    want.extend_from_slice(&7u64.to_le_bytes()); // gpu added
    want.extend_from_slice(&0u32.to_le_bytes());
    want.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(d.encode(), want);
    assert_eq!(Delta::decode(&want), Ok(d));
    assert!(is_delta(&want));
    assert!(!is_delta(&snap(1, vec![]).encode()));
}

#[test]
fn corrupt_input_is_an_error() {
    let old = snap(1, vec![worker("a", vec![1, 2], 5)]);
    let new = snap(2, vec![worker("a", vec![2, 3], 6)]);
    let bytes = Delta::between(&old, &new).encode();
    for n in 0..bytes.len() {
        assert!(Delta::decode(&bytes[..n]).is_err());
    }
    let mut bad = bytes.clone();
    bad[4] = 9;
    assert_eq!(Delta::decode(&bad), Err(DeltaError::Format(9)));
    assert_eq!(Delta::decode(&new.encode()), Err(DeltaError::Magic));
}

#[test]
fn a_delta_only_applies_to_its_base_version() {
    let old = snap(1, vec![worker("a", vec![1], 5)]);
    let new = snap(2, vec![worker("a", vec![1, 2], 6)]);
    let d = Delta::between(&old, &new);
    let mut other = snap(7, vec![]);
    assert_eq!(other.apply_delta(&d), Err(DeltaError::Gap { from: 1, to: 2, have: 7 }));
    let mut base = old.clone();
    base.apply_delta(&d).unwrap();
    assert_eq!(base, new);
}

#[test]
fn a_cleared_worker_is_sent_as_a_reset() {
    let old = snap(1, vec![worker("a", (0..100).collect(), 5)]);
    let new = snap(2, vec![worker("a", vec![500], 6)]);
    let d = Delta::between(&old, &new);
    assert!(d.workers[0].reset);
    assert_eq!(d.workers[0].gpu, SetChange { add: vec![500], remove: vec![] });
    let mut s = old.clone();
    s.apply_delta(&d).unwrap();
    assert_eq!(s, new);
}

#[test]
fn unchanged_workers_are_left_out() {
    let a = worker("a", vec![1, 2], 5);
    let old = snap(1, vec![a.clone(), worker("b", vec![3], 5)]);
    let new = snap(2, vec![a, worker("b", vec![3, 4], 5)]);
    let d = Delta::between(&old, &new);
    assert_eq!(d.workers.len(), 1);
    assert_eq!(d.workers[0].worker, "b");
}

#[test]
fn compose_needs_contiguous_versions() {
    let s1 = snap(1, vec![worker("a", vec![1], 1)]);
    let s2 = snap(2, vec![worker("a", vec![2], 2)]);
    let s3 = snap(3, vec![worker("a", vec![3], 3)]);
    let d12 = Delta::between(&s1, &s2);
    let d23 = Delta::between(&s2, &s3);
    assert_eq!(Delta::compose(&[d23.clone(), d12.clone()]), None);
    assert_eq!(Delta::compose(&[]), None);
    let d13 = Delta::compose(&[d12, d23]).unwrap();
    assert_eq!((d13.from_version, d13.to_version), (1, 3));
}

/// A random evolution of a few workers' block sets.
fn evolve(seed: u64, steps: usize) -> Vec<Snapshot> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut sets: Vec<std::collections::BTreeSet<u64>> = vec![Default::default(); 3];
    let mut out = Vec::new();
    for v in 0..steps {
        for s in sets.iter_mut() {
            match rng.random_range(0..10) {
                0 => s.clear(),
                1..=5 => {
                    for _ in 0..rng.random_range(0..20) {
                        s.insert(rng.random_range(0..200));
                    }
                }
                _ => {
                    for _ in 0..rng.random_range(0..10) {
                        s.remove(&rng.random_range(0..200));
                    }
                }
            }
        }
        let workers = sets
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut w = worker(&format!("w{i}"), s.iter().copied().collect(), v as u64);
                w.offloaded = s.iter().filter(|h| *h % 3 == 0).copied().collect();
                w.compatible = rng.random_range(0..5) != 0;
                w
            })
            .collect();
        out.push(snap(v as u64 + 1, workers));
    }
    out
}

proptest! {
    #[test]
    fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = Delta::decode(&bytes);
        let mut with_magic = b"KVRD\x01".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = Delta::decode(&with_magic);
    }

    /// Differential: applying each step's delta, or one composed delta, reproduces the last
    /// snapshot exactly, and every delta survives its encoding.
    #[test]
    fn chains_and_compositions_reproduce_the_target(seed: u64, steps in 2usize..12) {
        let snaps = evolve(seed, steps);
        let deltas: Vec<Delta> = snaps.windows(2).map(|w| Delta::between(&w[0], &w[1])).collect();
        let mut chained = snaps[0].clone();
        for d in &deltas {
            let wire = Delta::decode(&d.encode()).unwrap();
            prop_assert_eq!(&wire, d);
            chained.apply_delta(&wire).unwrap();
        }
        let last = snaps.last().unwrap();
        prop_assert_eq!(&chained.workers, &last.workers);
        let mut composed = snaps[0].clone();
        composed.apply_delta(&Delta::compose(&deltas).unwrap()).unwrap();
        prop_assert_eq!(&composed.workers, &last.workers);
        prop_assert_eq!(composed.version, last.version);
    }
}
