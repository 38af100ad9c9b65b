//! The harness against workers it did not start: simulators launched separately and given to
//! it as external endpoints (as a real vLLM pool would be), the model taken from the topology,
//! and every worker's prefix cache reset before each run so no policy inherits another's.

use kvroute_eval::cluster::Policy;
use kvroute_eval::runner::{run_policy, RunOptions};
use kvroute_eval::topology::{External, Topology};
use kvroute_eval::workloads::{PromptForm, Shape, Workload};
use kvroute_stack::paths;
use kvroute_stack::sim::SimWorker;

fn workload() -> Workload {
    Workload {
        name: "external".into(),
        seed: 3,
        output_tokens: 4,
        slo: kvroute_eval::record::Slo { ttft_ms: 5000.0, mean_gap_ms: 500.0, stall_ms: 1000.0 },
        shape: Shape::MultiTurn {
            conversations: 3,
            turns: 2,
            system_words: 600,
            user_words: 10,
            start_gap_ms: 100,
            think_time_ms: 400,
            tenants: 1,
        },
        prompts: PromptForm::TokenIds,
    }
}

#[tokio::test]
async fn runs_against_external_workers_and_resets_their_caches_between_runs() {
    let dir = paths::scratch_dir("external-workers").unwrap();
    // Started here, outside the harness: the harness must not start, stop or fault them.
    let mut sims = Vec::new();
    for i in 0..2 {
        sims.push(SimWorker::start(i, &[], &dir).await.unwrap());
    }
    let mut topo = Topology::default();
    topo.workers.external = sims
        .iter()
        .map(|w| External {
            addr: w.addr.clone(),
            events: Some(format!("tcp://127.0.0.1:{}", w.events_port)),
            replay: Some(format!("tcp://127.0.0.1:{}", w.replay_port)),
        })
        .collect();
    topo.validate().unwrap();
    assert!(topo.describe().contains("reset before each run"), "{}", topo.describe());
    let w = workload();
    let sched = w.schedule().unwrap();
    assert!(sched.iter().all(|s| s.endpoint == kvroute_eval::schedule::COMPLETIONS));
    let opts = RunOptions { progress: false, whatif_sample: 0.0, ..Default::default() };
    // The same schedule twice: without the reset, the second run's first turns would hit the
    // cache the first run left behind.
    for policy in [Policy::Kvroute, Policy::LeastRequest, Policy::LeastRequest] {
        let r = run_policy(&topo, policy, &sched, w.slo, &[], &opts).await.unwrap();
        let failed: Vec<_> = r.records.iter().filter(|x| !x.ok()).map(|x| &x.error).collect();
        assert!(failed.is_empty(), "{}: {failed:?}", policy.name());
        assert_eq!(
            r.workers,
            topo.workers.external.iter().map(|e| e.addr.clone()).collect::<Vec<_>>()
        );
        let first_turns: u64 = r
            .records
            .iter()
            .filter(|x| x.cohorts.iter().any(|c| c == "turn-1"))
            .map(|x| x.cached_tokens.unwrap_or(0))
            .sum();
        assert_eq!(first_turns, 0, "{}: a first turn reused a previous run's cache", policy.name());
        let later: u64 = r
            .records
            .iter()
            .filter(|x| x.cohorts.iter().any(|c| c == "turn-2+"))
            .map(|x| x.cached_tokens.unwrap_or(0))
            .sum();
        if policy == Policy::Kvroute {
            assert!(later > 0, "kvroute: second turns reuse the first turns' prefixes");
        }
    }
    // The harness left the workers it did not start running.
    for s in &sims {
        let health = reqwest::get(format!("http://{}/health", s.addr)).await.unwrap();
        assert!(health.status().is_success());
    }
}
