use super::*;
use proptest::prelude::*;

fn worker(name: &str, gpu: Vec<u64>, observed: u64) -> SnapshotWorker {
    SnapshotWorker {
        worker: name.into(),
        observed_at_ms: observed,
        compatible: true,
        gpu,
        offloaded: Vec::new(),
        load: None,
        model: "m".into(),
        adapters: Vec::new(),
    }
}

fn snap(version: u64, workers: Vec<SnapshotWorker>) -> Snapshot {
    let models = vec![ModelInfo { name: "m".into(), fingerprint: 1, block_size: 16 }];
    Snapshot {
        version,
        generated_at_ms: version * 10,
        models,
        workers,
        peers: None,
        pool: false,
        down: vec![],
        placements: vec![],
    }
}

#[test]
fn golden_bytes() {
    crate::conformance::codecs::delta_golden();
}

#[test]
fn golden_bytes_removing_workers() {
    crate::conformance::codecs::delta_golden_removing_workers();
    crate::conformance::codecs::delta_golden_with_workers_down();
    crate::conformance::codecs::delta_golden_with_placements();
}

#[test]
fn golden_bytes_with_models_and_a_new_worker() {
    crate::conformance::codecs::delta_golden_with_models_and_a_new_worker();
}

#[test]
fn model_and_adapter_changes_travel_alone_and_compose() {
    let old = snap(1, vec![worker("a", vec![1], 5)]);
    let mut mid = snap(2, vec![worker("a", vec![1], 5)]);
    mid.workers[0].adapters = vec!["sql".into()];
    let d1 = Delta::between(&old, &mid);
    assert_eq!(d1.workers.len(), 1);
    let w = &d1.workers[0];
    assert_eq!((w.model.as_ref(), w.adapters.as_ref()), (None, Some(&vec!["sql".to_string()])));
    assert!(!w.reset && w.gpu.is_empty());
    assert_eq!(d1.models, None);
    let mut new = mid.clone();
    new.version = 3;
    new.workers[0].model = "q".into();
    new.models.push(ModelInfo { name: "q".into(), fingerprint: 2, block_size: 16 });
    let d2 = Delta::between(&mid, &new);
    assert_eq!(d2.workers[0].model.as_deref(), Some("q"));
    assert_eq!(d2.workers[0].adapters, None);
    assert_eq!(d2.models.as_ref(), Some(&new.models));
    let d13 = Delta::compose(&[d1, d2]).unwrap();
    assert_eq!(d13.workers[0].model.as_deref(), Some("q"));
    assert_eq!(d13.workers[0].adapters.as_deref(), Some(&["sql".to_string()][..]));
    let mut s = old.clone();
    s.apply_delta(&Delta::decode(&d13.encode()).unwrap()).unwrap();
    assert_eq!(s, new);
    // Nothing changed: no worker entry.
    assert!(Delta::between(&new, &new).workers.is_empty());
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
        // Workers come and go (the pool the updater discovers).
        let present: Vec<bool> = (0..sets.len()).map(|_| rng.random_range(0..4) != 0).collect();
        let workers = sets
            .iter()
            .enumerate()
            .filter(|(i, _)| present[*i])
            .map(|(i, s)| {
                let mut w = worker(&format!("w{i}"), s.iter().copied().collect(), v as u64);
                w.offloaded = s.iter().filter(|h| *h % 3 == 0).copied().collect();
                w.compatible = rng.random_range(0..5) != 0;
                w.model = ["m", "q"][rng.random_range(0..2)].into();
                w.adapters = (0..rng.random_range(0..3)).map(|a| format!("lora{a}")).collect();
                w
            })
            .collect();
        let mut s = snap(v as u64 + 1, workers);
        s.pool = true;
        if rng.random_range(0..3) == 0 {
            s.models[0].block_size = rng.random_range(0..3) * 16;
        }
        // Placements are learned, change and are forgotten with their worker.
        let mut placements = Vec::new();
        for w in &s.workers {
            if rng.random_range(0..3) != 0 {
                placements.push(WorkerPlacement {
                    worker: w.worker.clone(),
                    zone: Some(format!("z{}", rng.random_range(0..2))),
                    node: (rng.random_range(0..2) == 0).then(|| "n1".to_string()),
                    observed_at_ms: v as u64,
                    ..WorkerPlacement::default()
                });
            }
        }
        s.placements = placements;
        out.push(s);
    }
    out
}

proptest! {
    #[test]
    fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = Delta::decode(&bytes);
        for format in [2u8, 4] {
            let mut with_magic = b"KVRD".to_vec();
            with_magic.push(format);
            with_magic.extend_from_slice(&bytes);
            let _ = Delta::decode(&with_magic);
        }
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
        prop_assert_eq!(&chained.models, &last.models);
        prop_assert_eq!(&chained.placements, &last.placements);
        prop_assert!(chained.pool);
        let mut composed = snaps[0].clone();
        composed.apply_delta(&Delta::compose(&deltas).unwrap()).unwrap();
        prop_assert_eq!(&composed.workers, &last.workers);
        prop_assert_eq!(&composed.models, &last.models);
        prop_assert_eq!(&composed.placements, &last.placements);
        prop_assert_eq!(composed.version, last.version);
    }
}
