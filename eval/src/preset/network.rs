//! The presets that scope by topology (issue 25): `two-site` (the prefix held in a remote site
//! over a WAN, local workers idle, the WAN's round trip swept) and `pd` (a prefill pool and a
//! decode pool). Both run the simulator in real time (its link and client delays are on the
//! real sockets) and tell the filter only the network an administrator knows.

use std::collections::BTreeMap;

use super::{plan, scenario, topology, words, workload, ComparisonPlan, Scenario, SLO_8B};
use crate::cluster::Policy;
use crate::net::{LinkSpec, NetSpec, PlaceSpec, SiteLinkSpec, TransferSpec};
use crate::topology::Topology;
use crate::workloads::{Shape, Workload};

/// The WAN round trips `two-site` sweeps (ms).
pub const WAN_RTTS_MS: [f64; 3] = [20.0, 40.0, 80.0];
/// The shared prefix of `two-site` (tokens): ~70 ms of prefill on the sourced 8B/H100 profile,
/// so a 20 ms WAN round trip pays for itself, and 80 ms no longer does.
pub const TWO_SITE_PREFIX_TOKENS: usize = 2000;

fn place(site: &str, zone: &str, node: &str, role: Option<&str>) -> PlaceSpec {
    PlaceSpec {
        site: site.into(),
        zone: Some(zone.into()),
        rack: None,
        node: Some(node.into()),
        role: role.map(str::to_owned),
    }
}

/// Four workers, two in site `a` (the clients' and Envoy's) and two in site `b`, `rtt_ms` of
/// WAN between them at 10 Gb/s; pulls allowed across the WAN (the cost model must refuse the
/// ones that do not pay).
pub fn two_site_topology(rtt_ms: f64) -> Topology {
    let mut t = topology(4, "llama3-8b-h100", 1);
    t.workers.speedup = 1.0;
    t.net = Some(NetSpec {
        local_site: Some("a".into()),
        places: vec![
            place("a", "a1", "n1", None),
            place("a", "a1", "n2", None),
            place("b", "b1", "n3", None),
            place("b", "b1", "n4", None),
        ],
        links: BTreeMap::from([("wan".to_string(), LinkSpec { rtt_ms, gbps: 10.0 })]),
        site_links: vec![SiteLinkSpec { a: "a".into(), b: "b".into(), rtt_ms, gbps: 10.0 }],
        client_rtt_ms: BTreeMap::from([("a".to_string(), 0.3), ("b".to_string(), rtt_ms)]),
        transfer: Some(TransferSpec { max_level: "wan".into(), ..Default::default() }),
    });
    t
}

/// Conversations of four tenants, each with its own ~2 k-token system prompt that site `b`
/// already holds; two turns each, light load (the local workers stay idle).
fn two_site_workload(name: &str, seed: u64) -> Workload {
    workload(
        name,
        seed,
        SLO_8B,
        Shape::MultiTurn {
            conversations: 12,
            turns: 2,
            system_words: words(TWO_SITE_PREFIX_TOKENS),
            user_words: 40,
            start_gap_ms: 500,
            think_time_ms: 1500,
            tenants: 4,
        },
    )
}

/// The remote-prefix workload at each WAN round trip of [`WAN_RTTS_MS`]: kvroute against
/// least-request and the network-blind prefix-only policy.
pub fn two_site(seed: u64) -> ComparisonPlan {
    let scenarios: Vec<Scenario> = WAN_RTTS_MS
        .iter()
        .map(|&rtt| Scenario {
            topology: Some(two_site_topology(rtt)),
            prewarm: vec![2, 3],
            ..scenario(two_site_workload(&format!("two-site-rtt{rtt}"), seed))
        })
        .collect();
    let mut p = plan(
        "two-site",
        two_site_topology(WAN_RTTS_MS[1]),
        vec![Policy::Kvroute, Policy::LeastRequest, Policy::KvroutePrefixOnly],
        scenarios,
    );
    p.repeats = 2;
    p.whatif_sample = 0.0;
    p.warmup_per_envoy = 8;
    p
}

/// Two prefill workers and two decode workers on four nodes of one zone (100 Gb/s between
/// them: the KV hand-off of an 8 k-token prompt takes ~85 ms).
pub fn pd_topology() -> Topology {
    let mut t = topology(4, "llama3-8b-h100", 1);
    t.workers.speedup = 1.0;
    t.net = Some(NetSpec {
        local_site: Some("a".into()),
        places: vec![
            place("a", "a1", "n1", Some("prefill")),
            place("a", "a1", "n2", Some("prefill")),
            place("a", "a1", "n3", Some("decode")),
            place("a", "a1", "n4", Some("decode")),
        ],
        client_rtt_ms: BTreeMap::from([("a".to_string(), 0.3)]),
        transfer: Some(TransferSpec::default()),
        ..Default::default()
    });
    t
}

/// Multi-turn chat with two tenants' long system prompts on the P/D pool, at its own rate and
/// twice it: kvroute (P/D-aware: prefill worker by cache, queue and hand-off, decode worker by
/// load), kvroute unaware of the split (decode workers only, each prefilling), and the
/// load-only P/D baseline (the same P/D config, no cache credit); least-request for the noise
/// floor.
pub fn pd(seed: u64) -> ComparisonPlan {
    let w = workload(
        "pd-multi-turn",
        seed,
        SLO_8B,
        Shape::MultiTurn {
            conversations: 16,
            turns: 3,
            system_words: words(6000),
            user_words: 60,
            start_gap_ms: 400,
            think_time_ms: 2000,
            tenants: 2,
        },
    );
    let mut p = plan(
        "pd",
        pd_topology(),
        // Least-request (decode workers only, each prefilling) gives the noise floor.
        vec![Policy::Kvroute, Policy::KvrouteNoPd, Policy::KvrouteLoadOnly, Policy::LeastRequest],
        vec![Scenario { rate_scales: Some(vec![1.0, 2.0]), ..scenario(w) }],
    );
    p.repeats = 2;
    p.whatif_sample = 0.0;
    p.warmup_per_envoy = 8;
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_presets_are_valid_and_name_their_network() {
        let p = two_site(7);
        p.validate().unwrap();
        assert_eq!(p.scenarios.len(), WAN_RTTS_MS.len());
        for (s, rtt) in p.scenarios.iter().zip(WAN_RTTS_MS) {
            let net = s.topology(&p).net.as_ref().unwrap();
            assert_eq!(net.client_rtt_ms["b"], rtt);
            assert!(net.cross_site(2) && !net.cross_site(0));
            assert_eq!(s.prewarm, [2, 3]);
            assert!(s.topology(&p).describe().contains("sites a (2 workers, local"));
        }
        assert!(p.policies.contains(&Policy::KvroutePrefixOnly));
        let d = pd(7);
        d.validate().unwrap();
        let net = d.topology.net.as_ref().unwrap();
        assert!(net.disaggregated());
        assert!(d.topology.describe().contains("P/D: 2 prefill + 2 decode workers"));
    }
}
