//! The evaluation harness on real Envoy and simulated workers: a deliberately bad policy (all
//! traffic pinned to one worker) must show up in the report as queue imbalance and starved
//! cohorts, and every policy must see the same schedule.

use kvroute_eval::cluster::Policy;
use kvroute_eval::preset;
use kvroute_eval::report::{self, Scope, Setup};
use kvroute_eval::runner::{run_policy, RunOptions};
use kvroute_eval::schedule;

#[tokio::test]
async fn a_pinned_policy_shows_as_imbalance_and_starved_cohorts() {
    let plan = preset::preset("selfcheck", 11).unwrap();
    let sc = &plan.scenarios[0];
    let sched = sc.workload.schedule().unwrap();
    assert_eq!(schedule::hash(&sched), schedule::hash(&sc.workload.schedule().unwrap()));
    // A warm-up runs first (unrecorded, then the caches reset): the counts below hold with it.
    let opts = RunOptions { progress: false, warmup_per_envoy: 4, ..Default::default() };
    let mut runs = Vec::new();
    for policy in [Policy::Pinned, Policy::LeastRequest] {
        let r =
            run_policy(&plan.topology, policy, &sched, sc.workload.slo, &[], &opts).await.unwrap();
        assert_eq!(
            r.records.len(),
            sched.len(),
            "{}: every scheduled request is recorded",
            r.policy
        );
        let failed: Vec<_> = r.records.iter().filter(|x| !x.ok()).map(|x| &x.error).collect();
        assert!(failed.is_empty(), "{}: {failed:?}", r.policy);
        runs.push(r);
    }
    let scope = Scope {
        title: "selfcheck".into(),
        model_profile: plan.topology.workers.profile.clone(),
        workload: sc.workload.describe(),
        seed: sc.workload.seed,
        schedule_hash: schedule::hash(&sched),
        requests: sched.len(),
        knowledge: "none".into(),
        topology: plan.topology.describe(),
        machine: "test".into(),
        faults: vec![],
        block_size: 16,
        filter_profile: String::new(),
        sim_profile: String::new(),
    };
    let rep = report::summarize(&Setup::new(scope, None, sc.workload.slo), &runs);
    let n = plan.topology.worker_count() as f64;
    let pinned = rep.policy("pinned").unwrap();
    let lr = rep.policy("least-request").unwrap();
    let share = pinned.queue.workers.iter().map(|w| w.share.unwrap_or(0.0)).fold(0.0, f64::max);
    assert_eq!(share, 1.0, "pinned: one worker served everything");
    let imb = pinned.queue.imbalance.expect("queue samples during the run");
    assert!(imb > n / 2.0 && imb <= n, "pinned imbalance {imb}, expected close to {n}");
    assert!(lr.queue.imbalance.is_some_and(|i| i < imb), "least-request spreads the queue");
    // Starved: the pinned worker's queue makes the first turns wait far longer.
    let p99 = |p: &report::PolicyReport, c: &str| p.cohort(c).and_then(|c| c.ttft_p99_ms).unwrap();
    assert!(p99(pinned, "turn-1") > p99(lr, "turn-1"), "first turns starve behind one queue");
    let md = report::markdown(&rep);
    assert!(md.contains("imbalance"), "the report names the imbalance");
}
