//! Decisions with a topology: pulls from a holder, forbidden pulls, remote sites, P/D pools,
//! and an empty topology that changes nothing.

use super::*;

fn router_with(v: serde_json::Value) -> Router {
    Router::new(&FilterConfig::from_json(v.to_string().as_bytes()).unwrap()).unwrap()
}

const W: [&str; 3] = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"];

fn pool(topology: serde_json::Value) -> Router {
    router_with(json!({"models":[{"name":"m","workers":W}],
        "tie_band":{"abs_ms":0.0,"rel":0.0}, "topology": topology}))
}

fn labelled(holder_site: &str, max_level: &str) -> serde_json::Value {
    json!({"local_site":"a",
        "workers":{"127.0.0.1:1":{"site":"a","zone":"z","rack":"r","node":"n1"},
                   "127.0.0.1:2":{"site":holder_site,"zone":"z","rack":"r","node":"n2"},
                   "127.0.0.1:3":{"site":"a","zone":"z","rack":"r","node":"n3"}},
        "links":{"rack":{"rtt_ms":0.05,"gbps":400.0}},
        "client_rtt_ms":{"b":80.0},
        "transfer":{"enabled":true,"max_level":max_level,"setup_ms":1.0}})
}

/// The holder (worker 2) with a long queue; workers 1 and 3 a little busy, 1 less than 3.
fn busy(w: &str) -> WorkerLoad {
    let tokens = match w {
        "127.0.0.1:2" => 200_000,
        "127.0.0.1:3" => 600,
        _ => 300,
    };
    WorkerLoad {
        inflight_requests: 1,
        prefilling_requests: 1,
        prefill_tokens: tokens,
        ..Default::default()
    }
}

fn held(r: &mut Router, q: &ParsedRequest, worker: &str) -> Decision {
    let d = r.decide(q, 0, &|_: &str| WorkerLoad::default(), 0, 0).unwrap();
    r.observe(worker, &d.block_hashes, Source::Routed, 0);
    d
}

#[test]
fn an_idle_worker_pulls_the_prefix_from_a_busy_holder_next_to_it() {
    let mut r = pool(labelled("a", "rack"));
    let q = req(None, &LONG.repeat(300));
    held(&mut r, &q, W[1]);
    let d = r.decide(&q, 0, &busy, 10, 0).unwrap();
    let p = d.primary().unwrap();
    assert_eq!(p.worker, W[0], "{:#?}", d.ranked);
    let pull = p.pull.as_ref().expect("a pull");
    assert_eq!(pull.from, W[1]);
    assert_eq!(d.predicted_cached_tokens(), pull.tokens);
    assert_eq!(d.uncached_tokens(), d.prompt_tokens - pull.tokens);
    assert_eq!(d.steering_headers(), vec![("x-kvroute-kv-source", W[1])]);
    let fields = d.detail_fields(W[0], 10);
    assert!(
        fields.starts_with(
            "stall_ms=70.9; decoding=0; growth_ms=70.9; passed_ms=0.0; kv_source=127.0.0.1:2; prefill=none;"
        ),
        "{fields}"
    );
    assert!(
        fields.ends_with("site=a; cross_site=0; site_source=config; site_age_ms=none"),
        "{fields}"
    );
}

#[test]
fn a_pull_the_topology_forbids_is_never_chosen() {
    // The holder is in another zone's site (b) and pulls may cross a rack at most.
    for (site, level) in [("b", "rack"), ("a", "node")] {
        let mut r = pool(labelled(site, level));
        let q = req(None, &LONG.repeat(300));
        held(&mut r, &q, W[1]);
        let d = r.decide(&q, 0, &busy, 10, 0).unwrap();
        assert!(d.ranked.iter().all(|s| s.pull.is_none()), "{site}/{level}: {:#?}", d.ranked);
        assert!(d.steering_headers().is_empty());
    }
}

#[test]
fn a_remote_holder_is_chosen_only_when_its_prefix_saves_more_than_the_round_trip() {
    let idle = |_: &str| WorkerLoad::default();
    let mut r = pool(labelled("b", "node"));
    // A short prompt saves a few ms: the 80 ms round trip to site b is not worth it.
    let short = req(None, &LONG.repeat(8));
    held(&mut r, &short, W[1]);
    let d = r.decide(&short, 0, &idle, 10, 0).unwrap();
    assert_ne!(d.primary().unwrap().worker, W[1]);
    assert!(d.detail_fields(W[1], 10).contains("site=b; cross_site=1;"));
    // Without the round trip the holder wins the same decision.
    let mut near = pool(json!({"local_site":"a"}));
    held(&mut near, &short, W[1]);
    assert_eq!(near.decide(&short, 0, &idle, 10, 0).unwrap().primary().unwrap().worker, W[1]);
    let remote = d.ranked.iter().find(|s| s.worker == W[1]).unwrap();
    assert_eq!(remote.network_ms, 80.0);
}

#[test]
fn an_empty_topology_changes_no_decision() {
    let plain = router();
    let empty = pool(json!({}));
    let loads = [busy as fn(&str) -> WorkerLoad, |_: &str| WorkerLoad::default()];
    for (i, text) in [LONG.repeat(3), LONG.repeat(50), LONG.repeat(400)].iter().enumerate() {
        let q = req(None, text);
        for (pick, load) in loads.iter().enumerate() {
            let (a, b) = (
                plain.decide(&q, 0, load, i as u64, pick as u64).unwrap(),
                empty.decide(&q, 0, load, i as u64, pick as u64).unwrap(),
            );
            assert_eq!(a.ranked, b.ranked);
            assert!(b.steering_headers().is_empty());
        }
    }
}

#[test]
fn a_pd_pool_names_a_decode_worker_and_the_prefill_worker_holding_the_prefix() {
    let decode = ["127.0.0.1:11", "127.0.0.1:12"];
    let prefill = ["127.0.0.1:21", "127.0.0.1:22"];
    let mut r =
        router_with(json!({"models":[{"name":"m","workers":decode,"prefill_workers":prefill}],
        "tie_band":{"abs_ms":0.0,"rel":0.0}}));
    let q = req(None, &LONG.repeat(300));
    held(&mut r, &q, prefill[1]);
    // The first decode worker is busier.
    let load = |w: &str| match w {
        "127.0.0.1:11" => WorkerLoad { inflight_requests: 30, ..Default::default() },
        _ => WorkerLoad::default(),
    };
    let d = r.decide(&q, 0, &load, 10, 0).unwrap();
    assert_eq!(d.primary().unwrap().worker, decode[1]);
    assert_eq!(d.prefill[0].worker, prefill[1], "{:#?}", d.prefill);
    assert!(d.prefill[0].cached_tokens > 0);
    assert_eq!(d.steering_headers(), vec![("x-prefiller-host-port", prefill[1])]);
    assert!(d.header_value().split(',').all(|w| decode.contains(&w)));
    // The decode primary's estimate is the whole request's.
    assert_eq!(d.primary().unwrap().ttft_ms, d.prefill[0].ttft_ms);
    assert!(r.plan().steering_headers().iter().any(|h| h == "x-prefiller-host-port"));
    assert!(r.routable_workers().contains(&prefill[0]));
}

#[test]
fn discovered_labels_place_workers_the_configuration_does_not() {
    use crate::decision::topology::{DiscoveredLabels, Labels};
    let idle = |_: &str| WorkerLoad::default();
    let mut r = pool(json!({"local_site":"a","client_rtt_ms":{"b":80.0}}));
    let q = req(None, &LONG.repeat(8));
    held(&mut r, &q, W[1]);
    assert_eq!(r.decide(&q, 0, &idle, 10, 0).unwrap().primary().unwrap().worker, W[1]);
    let site_b = |w: &str| DiscoveredLabels {
        worker: w.into(),
        labels: Labels { site: Some("b".into()), ..Default::default() },
        observed_at_ms: 5,
    };
    r.set_discovered(vec![site_b(W[1])]);
    let d = r.decide(&q, 0, &idle, 10, 0).unwrap();
    assert_ne!(d.primary().unwrap().worker, W[1], "the holder is 80 ms away now");
    assert!(d
        .detail_fields(W[1], 10)
        .ends_with("site=b; cross_site=1; site_source=discovered; site_age_ms=5"));
    assert!(d
        .detail_fields(W[0], 10)
        .ends_with("site=unknown; cross_site=0; site_source=none; site_age_ms=none"));
    // Gone from discovery: local again.
    r.set_discovered(Vec::new());
    assert_eq!(r.decide(&q, 0, &idle, 10, 0).unwrap().primary().unwrap().worker, W[1]);
    // The same through the updater's snapshot and a delta.
    let placed = crate::wire::snapshot::WorkerPlacement {
        worker: W[1].into(),
        site: Some("b".into()),
        zone: None,
        rack: None,
        node: None,
        observed_at_ms: 5,
    };
    let snap = crate::wire::snapshot::Snapshot { placements: vec![placed], ..Default::default() };
    r.apply_snapshot(&snap);
    assert!(r.topology().unwrap().is_cross_site(W[1]));
    let delta = crate::wire::delta::Delta { placements: Some(Vec::new()), ..Default::default() };
    r.apply_delta(&delta);
    assert!(!r.topology().unwrap().is_cross_site(W[1]));
}

#[test]
fn a_pd_request_decodes_where_less_kv_must_be_handed_over() {
    let decode = ["127.0.0.1:11", "127.0.0.1:12"];
    let prefill = ["127.0.0.1:21", "127.0.0.1:22"];
    let mut r =
        router_with(json!({"models":[{"name":"m","workers":decode,"prefill_workers":prefill}],
        "tie_band":{"abs_ms":0.0,"rel":0.0}}));
    let idle = |_: &str| WorkerLoad::default();
    let q = req(None, &LONG.repeat(300));
    // The second decode worker decoded this conversation before: it holds the prefix, and the
    // hand-off moves only what it lacks (over the default link within a site).
    held(&mut r, &q, decode[1]);
    for pick in 0..4 {
        let d = r.decide(&q, 0, &idle, 10, pick).unwrap();
        assert_eq!(d.primary().unwrap().worker, decode[1], "pick {pick}: {:#?}", d.ranked);
    }
}
