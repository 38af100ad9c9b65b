//! The evaluation scoped by topology (issue 25), each preset at a tiny size, in process (every
//! Envoy, simulator and updater it starts is stopped when its run ends, also on failure):
//! `two-site` (a remote site holding the prefixes behind a WAN), `pd` (prefill and decode
//! pools) and the transfer reference sweep. Behaviour only, never timing: reports are produced,
//! the network cohorts are there, cross-site decisions and P/D prefill workers are recorded,
//! a pulled prefix is served from cache.

use std::path::Path;
use std::time::Duration;

use kvroute_eval::cluster::Policy;
use kvroute_eval::net::{CROSS_SITE, LOCAL, PD_PREFILLED};
use kvroute_eval::preset::{preset, Scenario};
use kvroute_eval::record::RunResult;
use kvroute_eval::report::{self, Report, Scope, Setup};
use kvroute_eval::runner::{run_policy, RunOptions};
use kvroute_eval::topology::Topology;
use kvroute_eval::transfer::{self, TransferOptions};
use kvroute_eval::workloads::Shape;

/// The scenario with `conversations` two-turn conversations, close together.
fn tiny(mut sc: Scenario, conversations: usize) -> Scenario {
    if let Shape::MultiTurn { conversations: c, turns, start_gap_ms, think_time_ms, .. } =
        &mut sc.workload.shape
    {
        *c = conversations;
        *turns = 2;
        *start_gap_ms = 150;
        *think_time_ms = 500;
    }
    sc
}

/// Every policy once on the scenario, then the report written into `dir`.
async fn run(
    topo: &Topology,
    sc: &Scenario,
    policies: &[Policy],
    dir: &Path,
) -> (Vec<RunResult>, Report) {
    let model = topo.workers.model;
    let sched = sc.workload.schedule_for(model).unwrap();
    let mut runs = Vec::new();
    for &p in policies {
        let opts = RunOptions {
            request_timeout: Duration::from_secs(60),
            progress: false,
            whatif_sample: 0.0,
            prewarm: sc.prewarm.clone(),
            ..Default::default()
        };
        let r = run_policy(topo, p, &sched, sc.workload.slo, &[], &opts)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:#}", p.name()));
        for rec in &r.records {
            assert!(rec.ok(), "{}: request {} failed: {:?}", p.name(), rec.id, rec.error);
        }
        runs.push(r);
    }
    let scope = Scope {
        title: sc.workload.name.clone(),
        model_profile: topo.workers.profile.clone(),
        workload: sc.workload.describe(),
        seed: sc.workload.seed,
        schedule_hash: kvroute_eval::schedule::hash(&sched),
        requests: sched.len(),
        knowledge: String::new(),
        topology: topo.describe(),
        machine: String::new(),
        faults: Vec::new(),
        block_size: 16,
        filter_profile: topo.filter.describe(),
        sim_profile: topo.sim_profile(),
    };
    let rep = report::summarize(&Setup::new(scope, None, sc.workload.slo), &runs);
    report::write(&rep, &runs, dir).unwrap();
    assert!(dir.join("report.md").is_file() && dir.join("report.json").is_file());
    (runs, rep)
}

fn has(tags: &[String], tag: &str) -> bool {
    tags.iter().any(|t| t == tag)
}

#[tokio::test]
async fn two_site_scopes_by_site_and_records_cross_site_decisions() {
    let plan = preset("two-site", 7).unwrap();
    // The 40 ms WAN.
    let sc = tiny(plan.scenarios[1].clone(), 4);
    let topo = sc.topology(&plan).clone();
    let addrs_site = |r: &RunResult, w: &str| r.workers.iter().position(|x| x == w).unwrap() >= 2;
    let dir = kvroute_stack::paths::scratch_dir("topology-eval-two-site").unwrap();
    let (runs, rep) = run(&topo, &sc, &plan.policies, &dir).await;
    for r in &runs {
        for rec in &r.records {
            let w = rec.worker.as_deref().expect("a serving worker");
            let remote = addrs_site(r, w);
            // Every request is in its site's cohort, and cross-site or local by where it ran.
            assert!(has(&rec.cohorts, if remote { "site:b" } else { "site:a" }), "{rec:?}");
            assert_eq!(has(&rec.cohorts, CROSS_SITE), remote, "{}: {rec:?}", r.policy);
            if !remote && rec.topo.as_ref().and_then(|t| t.kv_source.as_ref()).is_none() {
                assert!(has(&rec.cohorts, LOCAL));
            }
            let decision = rec.topo.as_ref();
            match r.policy.as_str() {
                // The network-aware filter says where it sent the request.
                "kvroute" => {
                    let d = decision.expect("kvroute records its topology fields");
                    assert_eq!(d.site.as_deref(), Some(if remote { "b" } else { "a" }));
                    assert_eq!(d.cross_site, remote);
                }
                // The network-blind one knows no site.
                "prefix-only" => assert!(decision.is_none_or(|d| !d.cross_site)),
                _ => assert!(decision.is_none(), "least-request has no decision header"),
            }
        }
    }
    // Site b holds every prefix at the start: the network-blind policy goes there.
    let blind = runs.iter().find(|r| r.policy == "prefix-only").unwrap();
    assert!(blind.records.iter().any(|r| has(&r.cohorts, CROSS_SITE)));
    assert!(rep.cohorts.iter().any(|c| c == CROSS_SITE), "{:?}", rep.cohorts);
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("network: sites a (2 workers, local"), "the scope names the sites");
    assert!(md.contains("Cohort `cross-site`"), "a cohort of its own");
}

#[tokio::test]
async fn pd_names_the_prefill_worker_and_the_unaware_policy_does_not() {
    let plan = preset("pd", 7).unwrap();
    let sc = tiny(plan.scenarios[0].clone(), 4);
    let dir = kvroute_stack::paths::scratch_dir("topology-eval-pd").unwrap();
    // Least-request (the report's noise floor) tells nothing new here.
    let policies: Vec<Policy> =
        plan.policies.iter().copied().filter(|p| *p != Policy::LeastRequest).collect();
    let (runs, rep) = run(&plan.topology, &sc, &policies, &dir).await;
    for r in &runs {
        let (prefill, decode) = r.workers.split_at(2);
        for rec in &r.records {
            let w = rec.worker.as_deref().expect("a serving worker");
            assert!(decode.iter().any(|d| d == w), "{}: served by a decode worker", r.policy);
            let named = rec.topo.as_ref().and_then(|t| t.prefill.clone());
            if r.policy == "kvroute-no-pd" || r.policy == "least-request" {
                assert_eq!(named, None);
                assert!(!has(&rec.cohorts, PD_PREFILLED));
            } else {
                let p = named.unwrap_or_else(|| panic!("{}: no prefill worker", r.policy));
                assert!(prefill.contains(&p), "{}: {p} is a prefill worker", r.policy);
                assert!(has(&rec.cohorts, PD_PREFILLED));
            }
        }
    }
    // The KV handed over from the prefill worker counts as cached on the decode worker.
    let kv = runs.iter().find(|r| r.policy == "kvroute").unwrap();
    assert!(kv.records.iter().all(|r| r.cached_tokens.unwrap_or(0) > 0), "prompts handed over");
    assert!(rep.cohorts.iter().any(|c| c == PD_PREFILLED));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("P/D: 2 prefill + 2 decode workers"));
}

#[tokio::test]
async fn the_transfer_sweep_serves_pulled_prefixes_from_cache() {
    let topo = preset("demo", 7).unwrap().topology;
    let opts = TransferOptions {
        bandwidths_gbps: vec![20.0, 160.0],
        levels: vec![0, 2],
        ..Default::default()
    };
    let dir = kvroute_stack::paths::scratch_dir("topology-eval-transfer").unwrap();
    let rep = transfer::run(&topo, &opts, &dir).await.unwrap();
    assert_eq!(rep.cells.len(), 4);
    for c in &rep.cells {
        assert_eq!(c.error, None);
        assert!(c.wait_ms.is_some() && c.recompute_ms.is_some() && c.pull_ms.is_some());
        let cached = c.pull_cached_tokens.expect("P reports what it reused");
        assert!(cached >= opts.prefix_tokens as u64, "the pulled prefix is cached: {cached}");
    }
    assert!(rep.predicted_bandwidth_crossover.is_some());
    assert!(dir.join("transfer.md").is_file() && dir.join("transfer.json").is_file());
}
