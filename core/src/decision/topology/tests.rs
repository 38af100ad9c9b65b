use super::*;

fn labels(site: &str, zone: &str, rack: &str, node: &str) -> Labels {
    let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    Labels { site: some(site), zone: some(zone), rack: some(rack), node: some(node) }
}

fn topo() -> TopologyConfig {
    let mut t = TopologyConfig { local_site: Some("a".into()), ..Default::default() };
    for (w, l) in [
        ("10.0.0.1:80", labels("a", "a1", "r1", "n1")),
        ("10.0.0.2:80", labels("a", "a1", "r1", "n1")),
        ("10.0.0.3:80", labels("a", "a1", "r1", "n2")),
        ("10.0.0.4:80", labels("a", "a1", "r2", "n3")),
        ("10.0.0.5:80", labels("a", "a2", "r9", "n9")),
        ("10.0.0.6:80", labels("b", "b1", "r1", "n1")),
        ("10.0.0.7:80", labels("c", "", "", "")),
    ] {
        t.workers.insert(w.into(), l);
    }
    t.site_links.push(SiteLink { a: "b".into(), b: "a".into(), rtt_ms: 25.0, gbps: 40.0 });
    t.client_rtt_ms.insert("b".into(), 30.0);
    t.transfer.enabled = true;
    t
}

#[test]
fn the_level_is_the_nearest_label_both_share() {
    let t = topo();
    assert_eq!(t.level("10.0.0.1:80", "10.0.0.2:80"), Level::Node);
    assert_eq!(t.level("10.0.0.1:80", "10.0.0.3:80"), Level::Rack);
    assert_eq!(t.level("10.0.0.1:80", "10.0.0.4:80"), Level::Zone);
    assert_eq!(t.level("10.0.0.1:80", "10.0.0.5:80"), Level::Site);
    assert_eq!(t.level("10.0.0.1:80", "10.0.0.6:80"), Level::Wan);
    // The same rack name in another zone is another rack.
    assert_eq!(t.level("10.0.0.6:80", "10.0.0.1:80"), Level::Wan);
    // A worker without labels is in the local site, sharing nothing below it.
    assert_eq!(t.level("10.0.0.1:80", "10.9.9.9:80"), Level::Site);
    assert_eq!(t.level("10.0.0.7:80", "10.9.9.9:80"), Level::Wan);
}

#[test]
fn unknown_sites_are_local_but_flagged() {
    let t = topo();
    let p = t.placement("10.9.9.9:80");
    assert_eq!((p.site.as_deref(), p.known), (Some("a"), false));
    let p = t.placement("10.0.0.6:80");
    assert_eq!((p.site.as_deref(), p.known), (Some("b"), true));
    assert_eq!(t.client_rtt_ms("10.9.9.9:80"), 0.0);
    assert_eq!(t.client_rtt_ms("10.0.0.6:80"), 30.0);
    // A remote site without its own figure pays the default WAN round trip.
    assert_eq!(t.client_rtt_ms("10.0.0.7:80"), t.links.wan.rtt_ms);
}

#[test]
fn site_links_override_the_wan_default_in_either_order() {
    let t = topo();
    assert_eq!(t.link("10.0.0.1:80", "10.0.0.6:80"), Link { rtt_ms: 25.0, gbps: 40.0 });
    assert_eq!(t.link("10.0.0.6:80", "10.0.0.2:80"), Link { rtt_ms: 25.0, gbps: 40.0 });
    assert_eq!(t.link("10.0.0.1:80", "10.0.0.7:80"), t.links.wan);
    assert_eq!(t.link("10.0.0.1:80", "10.0.0.3:80"), t.links.rack);
}

#[test]
fn pulls_follow_the_transfer_settings_and_never_cross_a_forbidden_level() {
    let mut t = topo();
    // Zone is the widest allowed by default: rack and zone pulls yes, another zone no.
    let rack = t.pull_cost("10.0.0.3:80", "10.0.0.1:80").unwrap();
    let link = t.links.rack;
    assert!((rack.fixed_ms - (t.transfer.setup_ms + link.rtt_ms)).abs() < 1e-12);
    // 128 KiB per token at 200 Gbit/s: 1 048 576 bits / 2e8 bits per ms.
    assert!((rack.ms_per_token - 131_072.0 * 8.0 / 200e6).abs() < 1e-12);
    assert!(t.pull_cost("10.0.0.4:80", "10.0.0.1:80").is_some());
    assert!(t.pull_cost("10.0.0.5:80", "10.0.0.1:80").is_none());
    assert!(t.pull_cost("10.0.0.6:80", "10.0.0.1:80").is_none());
    assert!(t.pull_cost("10.0.0.1:80", "10.0.0.1:80").is_none());
    t.transfer.max_level = Level::Wan;
    let wan = t.pull_cost("10.0.0.6:80", "10.0.0.1:80").unwrap();
    assert!((wan.fixed_ms - (t.transfer.setup_ms + 25.0)).abs() < 1e-12);
    t.site_links[0].gbps = 0.0;
    assert!(t.pull_cost("10.0.0.6:80", "10.0.0.1:80").is_none(), "no bandwidth, no pull");
    t.transfer.enabled = false;
    assert!(t.pull_cost("10.0.0.3:80", "10.0.0.1:80").is_none());
}

#[test]
fn a_handoff_costs_its_size_over_the_link() {
    let t = topo();
    let ms = t.handoff_ms("10.0.0.1:80", "10.0.0.6:80", 1000);
    let want = t.transfer.setup_ms + 25.0 + 1000.0 * 131_072.0 * 8.0 / 40e6;
    assert!((ms - want).abs() < 1e-9);
    assert_eq!(t.handoff_ms("10.0.0.1:80", "10.0.0.1:80", 1000), 0.0);
}

#[test]
fn invalid_topologies_are_refused() {
    assert!(topo().validate().is_ok());
    let mut t = topo();
    t.links.wan.rtt_ms = -1.0;
    assert!(t.validate().is_err());
    let mut t = topo();
    t.site_links[0].gbps = f64::NAN;
    assert!(t.validate().is_err());
    let mut t = topo();
    t.client_rtt_ms.insert("x".into(), f64::INFINITY);
    assert!(t.validate().is_err());
    let mut t = topo();
    t.transfer.kv_bytes_per_token = 0;
    assert!(t.validate().is_err());
    let mut t = topo();
    t.transfer.header = "X-Bad".into();
    assert!(t.validate().is_err());
}

#[test]
fn the_section_parses_with_defaults() {
    let t: TopologyConfig = serde_json::from_str(
        r#"{"local_site":"a","workers":{"10.0.0.1:80":{"site":"b","node":"n"}},
            "links":{"wan":{"rtt_ms":60,"gbps":5}},"transfer":{"enabled":true,"max_level":"wan"}}"#,
    )
    .unwrap();
    assert_eq!(t.links.wan, Link { rtt_ms: 60.0, gbps: 5.0 });
    assert_eq!(t.links.rack, Links::default().rack);
    assert_eq!(t.transfer.max_level, Level::Wan);
    assert_eq!(t.transfer.header, "x-kvroute-kv-source");
    assert!(serde_json::from_str::<TopologyConfig>(r#"{"sites":{}}"#).is_err());
    // A link is given whole: half of one would silently take another level's figure.
    assert!(serde_json::from_str::<TopologyConfig>(r#"{"links":{"wan":{"rtt_ms":60}}}"#).is_err());
}

#[test]
fn discovered_labels_fill_what_the_configuration_leaves_out() {
    let mut t = topo();
    t.workers.insert("10.0.0.8:80".into(), Labels { zone: Some("z".into()), ..Default::default() });
    let found = |w: &str, site: &str, node: &str| DiscoveredLabels {
        worker: w.into(),
        labels: labels(site, "", "", node),
        observed_at_ms: 77,
    };
    let merged = t.with_discovered(&[
        // The configuration placed it: its site stays a, its labels stay the configured ones.
        found("10.0.0.1:80", "b", "other"),
        // The configuration gave a zone only: the site comes from discovery.
        found("10.0.0.8:80", "b", "n8"),
        // Not configured at all.
        found("10.0.0.9:80", "b", ""),
    ]);
    let p = merged.placement("10.0.0.1:80");
    assert_eq!((p.site.as_deref(), p.source, p.observed_at_ms), (Some("a"), "config", None));
    assert_eq!(merged.workers["10.0.0.1:80"], t.workers["10.0.0.1:80"]);
    let p = merged.placement("10.0.0.8:80");
    assert_eq!((p.site.as_deref(), p.known, p.source), (Some("b"), true, "discovered"));
    assert_eq!(p.observed_at_ms, Some(77));
    assert_eq!(merged.workers["10.0.0.8:80"].zone.as_deref(), Some("z"));
    assert!(merged.is_cross_site("10.0.0.9:80"));
    assert_eq!(merged.level("10.0.0.9:80", "10.0.0.6:80"), Level::Site);
    let p = merged.placement("10.9.9.9:80");
    assert_eq!((p.known, p.source), (false, "none"));
    // Nothing discovered: the configuration as it was.
    assert_eq!(t.with_discovered(&[]), t);
}
