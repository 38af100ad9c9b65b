//! The three reference cases, measured on real Envoy and simulated workers: a small sweep of
//! A's load where the oracle never regrets its choice and, with A loaded enough, the what-if
//! best is no longer A (the worker holding the whole prefix).

use kvroute_eval::cluster::Policy;
use kvroute_eval::reference::{self, ReferenceOptions};
use kvroute_eval::topology::Topology;

#[tokio::test]
async fn a_small_sweep_shows_the_crossover_and_a_regret_free_oracle() {
    let mut topo = Topology::default();
    topo.workers.count = 3;
    let dir = kvroute_stack::paths::scratch_dir("reference-test").unwrap();
    let opts = ReferenceOptions::default();
    let levels = [0, 16];
    let r = reference::run(&topo, &[Policy::Oracle, Policy::LeastRequest], &levels, &dir, &opts)
        .await
        .unwrap();
    let md = reference::markdown(&r);
    assert_eq!(r.cells.len(), 4, "{md}");
    for c in &r.cells {
        assert!(c.error.is_none(), "n={} {}: {:?}\n{md}", c.level, c.policy, c.error);
        assert!(c.whatif.iter().all(Option::is_some), "every worker answered\n{md}");
        assert!(c.ttft_ms.is_some() && c.chosen.is_some(), "{md}");
    }
    for &n in &levels {
        let o = r.cell(n, "oracle").unwrap();
        assert_eq!(o.regret_ms, Some(0.0), "n={n}: the oracle chose the what-if best\n{md}");
        assert_eq!(o.chosen, o.best, "{md}");
        // What it got is what the simulation said, within one step of the chosen worker (a
        // step boundary, loopback latency, scheduling noise on a small machine).
        let (got, said) = (o.ttft_ms.unwrap(), o.whatif[o.chosen.unwrap()].unwrap().ttft_ms);
        assert!(
            (got - said).abs() <= said.max(20.0) * 0.25 + 100.0,
            "n={n}: {got} vs {said}\n{md}"
        );
    }
    // Idle apart from the background: A reuses the whole prefix and wins.
    assert_eq!(r.best[0].best, Some(0), "{md}");
    let a = r.cell(0, "oracle").unwrap().whatif[0].unwrap();
    assert!(a.cached_tokens >= opts.prefix_tokens as u64 - 16, "{a:?}\n{md}");
    // Sixteen unique prompts queued on A outweigh recomputing (half) the prefix elsewhere.
    assert_ne!(r.best[1].best, Some(0), "{md}");
    assert_eq!(r.measured_crossover, Some(16), "{md}");
    // The cost model, seeing A's background requests as running, does not leave A this early.
    assert!(r.predicted_crossover.is_none_or(|n| n > 16), "{md}");
    for f in ["reference.md", "reference.json", "reference.svg"] {
        assert!(dir.join(f).is_file(), "{f} written");
    }
}
