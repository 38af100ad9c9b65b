//! Where the workers are (site, zone, rack, node), what the links between them cost, and the
//! clients' round trip to each site: one description that gives every simulated worker its
//! flags (`--site`, `--node`, `--client-rtt-ms`, `--event-delay-ms`, `--link`, `--role`) and the
//! filter its `topology` section. The filter is told only what an administrator knows (labels,
//! link latency and bandwidth, client RTT per site, the KV size per token of the model); never
//! how fast the simulated workers compute.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The label levels, narrowest first, then `wan` (different sites).
pub const LEVELS: [&str; 5] = ["node", "rack", "zone", "site", "wan"];
/// The request header naming the worker a prefix is pulled from (contract of issue 25).
pub const KV_SOURCE_HEADER: &str = "x-kvroute-kv-source";
/// The request header naming the prefill worker of a disaggregated request (llm-d's sidecar).
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";

/// The network of a topology. Absent: every worker local, nothing delayed, the filter's config
/// without a `topology` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetSpec {
    /// The site the Envoy instances and the clients run in.
    pub local_site: Option<String>,
    /// Labels per worker, in topology order (workers past the end: unlabelled, local).
    pub places: Vec<PlaceSpec>,
    /// Link cost per level two workers share (`node`, `rack`, `zone`, `site`, `wan`); a level
    /// not given takes [`default_link`].
    pub links: BTreeMap<String, LinkSpec>,
    /// Per-pair WAN overrides.
    pub site_links: Vec<SiteLinkSpec>,
    /// The round trip from the clients (and Envoy) to workers of each site.
    pub client_rtt_ms: BTreeMap<String, f64>,
    /// KV pulls between workers (absent: none).
    pub transfer: Option<TransferSpec>,
}

/// One worker's labels and role.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlaceSpec {
    pub site: String,
    pub zone: Option<String>,
    pub rack: Option<String>,
    pub node: Option<String>,
    /// `both` (default), `prefill` or `decode`.
    pub role: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    pub rtt_ms: f64,
    pub gbps: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteLinkSpec {
    pub a: String,
    pub b: String,
    pub rtt_ms: f64,
    pub gbps: f64,
}

/// What the pool supports for pulling a prefix from a peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransferSpec {
    pub enabled: bool,
    /// The widest level a pull may cross.
    pub max_level: String,
    /// Fixed cost of one pull.
    pub setup_ms: f64,
    /// KV bytes per token of the model (128 KiB: an 8B-class model in bf16).
    pub kv_bytes_per_token: u64,
    pub mechanism: String,
}

impl Default for TransferSpec {
    fn default() -> Self {
        TransferSpec {
            enabled: true,
            max_level: "zone".into(),
            setup_ms: 2.0,
            kv_bytes_per_token: 131_072,
            mechanism: "lmcache-p2p".into(),
        }
    }
}

/// A level's link when the topology names none (datacenter-typical figures: NVLink-class
/// within a node, 200/100/50 Gb/s fabric across racks, zones and a site's buildings, a
/// 10 Gb/s WAN at 40 ms).
pub fn default_link(level: &str) -> LinkSpec {
    let (rtt_ms, gbps) = match level {
        "node" => (0.0, 400.0),
        "rack" => (0.05, 200.0),
        "zone" => (0.2, 100.0),
        "site" => (0.5, 50.0),
        _ => (40.0, 10.0),
    };
    LinkSpec { rtt_ms, gbps }
}

impl PlaceSpec {
    fn role(&self) -> &str {
        self.role.as_deref().unwrap_or("both")
    }
}

impl NetSpec {
    pub fn validate(&self, workers: usize) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.places.len() <= workers,
            "net.places: {} places for {workers} workers",
            self.places.len()
        );
        for p in &self.places {
            anyhow::ensure!(!p.site.is_empty(), "net.places: every place needs a site");
            anyhow::ensure!(
                ["both", "prefill", "decode"].contains(&p.role()),
                "net.places: role {} (both, prefill or decode)",
                p.role()
            );
        }
        for (level, l) in &self.links {
            anyhow::ensure!(LEVELS.contains(&level.as_str()), "net.links: unknown level {level}");
            check_link(l.rtt_ms, l.gbps)?;
        }
        for l in &self.site_links {
            check_link(l.rtt_ms, l.gbps)?;
        }
        for (site, rtt) in &self.client_rtt_ms {
            anyhow::ensure!(rtt.is_finite() && *rtt >= 0.0, "net.client_rtt_ms.{site}: >= 0");
        }
        if let Some(t) = &self.transfer {
            anyhow::ensure!(LEVELS.contains(&t.max_level.as_str()), "net.transfer.max_level");
            anyhow::ensure!(t.setup_ms.is_finite() && t.setup_ms >= 0.0, "net.transfer.setup_ms");
            anyhow::ensure!(t.kv_bytes_per_token > 0, "net.transfer.kv_bytes_per_token: > 0");
        }
        let prefill = self.places.iter().filter(|p| p.role() == "prefill").count();
        anyhow::ensure!(
            prefill == 0 || prefill < workers,
            "net.places: a disaggregated pool needs decode workers too"
        );
        Ok(())
    }

    pub fn place(&self, worker: usize) -> Option<&PlaceSpec> {
        self.places.get(worker)
    }

    /// The site of worker `i` (`None`: unlabelled, treated as local).
    pub fn site(&self, worker: usize) -> Option<&str> {
        self.place(worker).map(|p| p.site.as_str())
    }

    pub fn is_prefill(&self, worker: usize) -> bool {
        self.place(worker).is_some_and(|p| p.role() == "prefill")
    }

    /// A disaggregated pool: some workers are prefill-only.
    pub fn disaggregated(&self) -> bool {
        self.places.iter().any(|p| p.role() == "prefill")
    }

    /// The level two workers share (`wan`: different sites; unlabelled: `site`).
    pub fn level(&self, a: usize, b: usize) -> &'static str {
        let (Some(pa), Some(pb)) = (self.place(a), self.place(b)) else { return "site" };
        if pa.site != pb.site {
            return "wan";
        }
        let same = |x: &Option<String>, y: &Option<String>| x.is_some() && x == y;
        if same(&pa.node, &pb.node) {
            "node"
        } else if same(&pa.rack, &pb.rack) {
            "rack"
        } else if same(&pa.zone, &pb.zone) {
            "zone"
        } else {
            "site"
        }
    }

    fn level_link(&self, level: &str) -> LinkSpec {
        self.links.get(level).copied().unwrap_or_else(|| default_link(level))
    }

    /// The link between workers `a` and `b`.
    pub fn link(&self, a: usize, b: usize) -> LinkSpec {
        let level = self.level(a, b);
        if level == "wan" {
            if let (Some(sa), Some(sb)) = (self.site(a), self.site(b)) {
                if let Some(l) = self.site_link(sa, sb) {
                    return l;
                }
            }
        }
        self.level_link(level)
    }

    fn site_link(&self, a: &str, b: &str) -> Option<LinkSpec> {
        self.site_links
            .iter()
            .find(|l| (l.a == a && l.b == b) || (l.a == b && l.b == a))
            .map(|l| LinkSpec { rtt_ms: l.rtt_ms, gbps: l.gbps })
    }

    /// The client round trip to worker `i` (0 for an unlabelled worker or an unnamed site).
    pub fn client_rtt(&self, worker: usize) -> f64 {
        self.site(worker).and_then(|s| self.client_rtt_ms.get(s)).copied().unwrap_or(0.0)
    }

    /// Whether worker `i` is in another site than the clients.
    pub fn cross_site(&self, worker: usize) -> bool {
        match (self.site(worker), self.local_site.as_deref()) {
            (Some(s), Some(l)) => s != l,
            _ => false,
        }
    }

    fn sites(&self) -> Vec<&str> {
        let mut s: Vec<&str> = self.places.iter().map(|p| p.site.as_str()).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// The extra simulator flags of worker `i` of `n`: its labels and role, the clients' RTT
    /// to it, the one-way delay of its KV events to the updater (which runs beside Envoy: half
    /// the client RTT), and one `--link` per site (its own site: the widest link to a peer
    /// there).
    pub fn sim_args(&self, i: usize, n: usize) -> Vec<String> {
        let Some(p) = self.place(i) else { return Vec::new() };
        let mut a = vec!["--site".to_string(), p.site.clone()];
        if let Some(node) = &p.node {
            a.extend(["--node".into(), node.clone()]);
        }
        if p.role() != "both" {
            a.extend(["--role".into(), p.role().to_owned()]);
        }
        let rtt = self.client_rtt(i);
        if rtt > 0.0 {
            a.extend(["--client-rtt-ms".into(), rtt.to_string()]);
            a.extend(["--event-delay-ms".into(), (rtt / 2.0).to_string()]);
        }
        for site in self.sites() {
            let peers: Vec<usize> =
                (0..n).filter(|&j| j != i && self.site(j) == Some(site)).collect();
            let worst = peers.iter().map(|&j| self.link(i, j)).reduce(|x, y| {
                if (y.rtt_ms, -y.gbps) > (x.rtt_ms, -x.gbps) {
                    y
                } else {
                    x
                }
            });
            if let Some(l) = worst {
                a.extend(["--link".into(), format!("{site}={}:{}", l.rtt_ms, l.gbps)]);
            }
        }
        if let Some(t) = &self.transfer {
            a.extend(["--kv-bytes-per-token".into(), t.kv_bytes_per_token.to_string()]);
            // The pull mechanism's fixed cost is the network's, like the links: what the
            // administrator configures is what the simulated transfer pays.
            a.extend(["--kv-setup-ms".into(), t.setup_ms.to_string()]);
        }
        a
    }

    /// The filter's `topology` section for workers `addrs` (topology order).
    pub fn filter_section(&self, addrs: &[String]) -> Value {
        let mut workers = serde_json::Map::new();
        for (i, addr) in addrs.iter().enumerate() {
            if let Some(p) = self.place(i) {
                let mut l = json!({"site": p.site});
                for (k, v) in [("zone", &p.zone), ("rack", &p.rack), ("node", &p.node)] {
                    if let Some(v) = v {
                        l[k] = json!(v);
                    }
                }
                workers.insert(addr.clone(), l);
            }
        }
        let links: serde_json::Map<String, Value> = LEVELS
            .iter()
            .map(|l| {
                let k = self.level_link(l);
                (l.to_string(), json!({"rtt_ms": k.rtt_ms, "gbps": k.gbps}))
            })
            .collect();
        let mut t = json!({
            "workers": workers,
            "links": links,
            "site_links": self.site_links.iter().map(|l| json!({
                "a": l.a, "b": l.b, "rtt_ms": l.rtt_ms, "gbps": l.gbps
            })).collect::<Vec<_>>(),
            "client_rtt_ms": self.client_rtt_ms,
        });
        if let Some(s) = &self.local_site {
            t["local_site"] = json!(s);
        }
        if let Some(x) = &self.transfer {
            t["transfer"] = json!({
                "enabled": x.enabled,
                "max_level": x.max_level,
                "setup_ms": x.setup_ms,
                "kv_bytes_per_token": x.kv_bytes_per_token,
                "header": KV_SOURCE_HEADER,
                "mechanism": x.mechanism,
            });
        }
        t
    }

    /// One line for the report's scope header: sites, their client RTT, links, transfer, roles.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        let sites: Vec<String> = self
            .sites()
            .iter()
            .map(|s| {
                let n = self.places.iter().filter(|p| p.site == *s).count();
                let local = if self.local_site.as_deref() == Some(s) { ", local" } else { "" };
                let rtt = self.client_rtt_ms.get(*s).copied().unwrap_or(0.0);
                format!("{s} ({n} workers{local}, client RTT {rtt} ms)")
            })
            .collect();
        parts.push(format!("sites {}", sites.join(", ")));
        let used: Vec<String> = LEVELS
            .iter()
            .filter(|l| self.links.contains_key(**l))
            .map(|l| {
                let k = self.level_link(l);
                format!("{l} {} ms/{} Gb/s", k.rtt_ms, k.gbps)
            })
            .chain(
                self.site_links
                    .iter()
                    .map(|l| format!("{}-{} {} ms/{} Gb/s", l.a, l.b, l.rtt_ms, l.gbps)),
            )
            .collect();
        if !used.is_empty() {
            parts.push(format!("links {}", used.join(", ")));
        }
        parts.push(match &self.transfer {
            Some(t) if t.enabled => format!(
                "KV pulls up to {} ({} ms setup, {} B/token, {})",
                t.max_level, t.setup_ms, t.kv_bytes_per_token, t.mechanism
            ),
            _ => "no KV pulls".into(),
        });
        let prefill = self.places.iter().filter(|p| p.role() == "prefill").count();
        if prefill > 0 {
            parts.push(format!(
                "P/D: {prefill} prefill + {} decode workers",
                self.places.iter().filter(|p| p.role() == "decode").count()
            ));
        }
        format!("network: {}", parts.join("; "))
    }
}

/// Cohort of requests served in another site than the clients'.
pub const CROSS_SITE: &str = "cross-site";
/// Cohort of requests whose worker pulled the prefix from a peer (`kv_source` named).
pub const PULLED: &str = "kv-pulled";
/// Cohort of requests served in the clients' site without a pull.
pub const LOCAL: &str = "local";
/// Cohort of disaggregated requests (a prefill worker named).
pub const PD_PREFILLED: &str = "pd-prefilled";

impl NetSpec {
    /// The network cohorts of a record served by one of `workers` (topology order): the
    /// serving worker's `site:<name>`, then [`CROSS_SITE`], [`PULLED`] (each a cohort of its
    /// own, so their TTFT and gaps are apart from the rest) or [`LOCAL`], and [`PD_PREFILLED`].
    /// The site comes from where the worker is (every policy alike), else from the decision.
    pub fn cohort_tags(
        &self,
        workers: &[String],
        rec: &crate::record::RequestRecord,
    ) -> Vec<String> {
        let Some(worker) = rec.worker.as_deref() else { return Vec::new() };
        let index = workers.iter().position(|w| w == worker);
        let decided = rec.topo.as_ref();
        let site = index
            .and_then(|i| self.site(i).map(str::to_owned))
            .or_else(|| decided.and_then(|d| d.site.clone()));
        let cross = match index {
            Some(i) if self.site(i).is_some() => self.cross_site(i),
            _ => decided.is_some_and(|d| d.cross_site),
        };
        let pulled = decided.is_some_and(|d| d.kv_source.is_some());
        let mut t = Vec::new();
        if let Some(s) = site {
            t.push(format!("site:{s}"));
        }
        if cross {
            t.push(CROSS_SITE.into());
        }
        if pulled {
            t.push(PULLED.into());
        }
        if !cross && !pulled {
            t.push(LOCAL.into());
        }
        if decided.is_some_and(|d| d.prefill.is_some()) {
            t.push(PD_PREFILLED.into());
        }
        t
    }
}

fn check_link(rtt_ms: f64, gbps: f64) -> anyhow::Result<()> {
    anyhow::ensure!(rtt_ms.is_finite() && rtt_ms >= 0.0, "link rtt_ms: >= 0");
    anyhow::ensure!(gbps.is_finite() && gbps > 0.0, "link gbps: > 0");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(site: &str, zone: &str, node: &str) -> PlaceSpec {
        PlaceSpec {
            site: site.into(),
            zone: Some(zone.into()),
            node: Some(node.into()),
            ..Default::default()
        }
    }

    fn two_sites() -> NetSpec {
        NetSpec {
            local_site: Some("a".into()),
            places: vec![place("a", "a1", "n1"), place("a", "a1", "n2"), place("b", "b1", "n3")],
            site_links: vec![SiteLinkSpec {
                a: "b".into(),
                b: "a".into(),
                rtt_ms: 20.0,
                gbps: 5.0,
            }],
            client_rtt_ms: [("a".to_string(), 0.3), ("b".to_string(), 20.0)].into(),
            transfer: Some(TransferSpec::default()),
            ..Default::default()
        }
    }

    #[test]
    fn levels_links_and_sites() {
        let n = two_sites();
        n.validate(3).unwrap();
        assert_eq!(n.level(0, 1), "zone");
        assert_eq!(n.level(0, 2), "wan");
        assert_eq!(n.link(2, 0), LinkSpec { rtt_ms: 20.0, gbps: 5.0 }, "the pair override");
        assert_eq!(n.link(0, 1), default_link("zone"));
        assert!(n.cross_site(2) && !n.cross_site(0));
        assert!(!n.cross_site(7), "an unlabelled worker is local");
        assert_eq!(n.client_rtt(2), 20.0);
        assert!(n.validate(2).is_err(), "more places than workers");
    }

    #[test]
    fn sim_flags_and_filter_section_agree() {
        let n = two_sites();
        let a = n.sim_args(2, 3).join(" ");
        assert!(a.contains("--site b --node n3"), "{a}");
        assert!(a.contains("--client-rtt-ms 20 --event-delay-ms 10"), "{a}");
        assert!(a.contains("--link a=20:5"), "{a}");
        assert!(!a.contains("--link b="), "no peer in its own site: {a}");
        let a0 = n.sim_args(0, 3).join(" ");
        assert!(a0.contains("--link a=0.2:100") && a0.contains("--link b=20:5"), "{a0}");
        let addrs: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", 8000 + i)).collect();
        let f = n.filter_section(&addrs);
        assert_eq!(f["local_site"], "a");
        assert_eq!(f["workers"]["127.0.0.1:8002"]["site"], "b");
        assert_eq!(f["links"]["wan"]["gbps"], 10.0);
        assert_eq!(f["transfer"]["header"], KV_SOURCE_HEADER);
        assert_eq!(f["client_rtt_ms"]["b"], 20.0);
        // The filter reads it as its own configuration.
        let cfg: kvroute_core::decision::topology::TopologyConfig =
            serde_json::from_value(f.clone()).unwrap();
        cfg.validate().unwrap();
        assert!(cfg.pull_cost("127.0.0.1:8002", "127.0.0.1:8000").is_none(), "beyond the zone");
        assert!(cfg.pull_cost("127.0.0.1:8001", "127.0.0.1:8000").is_some(), "within the zone");
        let d = n.describe();
        assert!(d.contains("a (2 workers, local, client RTT 0.3 ms)"), "{d}");
        assert!(d.contains("a-b 20 ms/5 Gb/s") || d.contains("b-a 20 ms/5 Gb/s"), "{d}");
    }

    #[test]
    fn network_cohorts() {
        let n = two_sites();
        let addrs: Vec<String> = (0..3).map(|i| format!("w{i}")).collect();
        let rec = |w: &str, header: &str| crate::record::RequestRecord {
            worker: Some(w.into()),
            topo: crate::record::TopoDecision::parse(header),
            ..Default::default()
        };
        assert_eq!(n.cohort_tags(&addrs, &rec("w2", "")), ["site:b", CROSS_SITE]);
        assert_eq!(n.cohort_tags(&addrs, &rec("w0", "")), ["site:a", LOCAL]);
        let pulled = "worker=w1; kv_source=w2; prefill=none; network_ms=0.3; transfer_ms=12.5; \
                      site=a; cross_site=0";
        let r = rec("w1", pulled);
        assert_eq!(n.cohort_tags(&addrs, &r), ["site:a", PULLED]);
        let d = r.topo.unwrap();
        assert_eq!(
            (d.kv_source.as_deref(), d.prefill, d.transfer_ms),
            (Some("w2"), None, Some(12.5))
        );
        assert!(!d.cross_site);
        let far = rec("w9", "worker=w9; kv_source=none; site=c; cross_site=1");
        assert_eq!(n.cohort_tags(&addrs, &far), ["site:c", CROSS_SITE]);
        assert!(n.cohort_tags(&addrs, &crate::record::RequestRecord::default()).is_empty());
        assert_eq!(crate::record::TopoDecision::parse("worker=w1; fallback=0"), None);
    }

    #[test]
    fn roles() {
        let mut n = two_sites();
        n.places[0].role = Some("prefill".into());
        n.validate(3).unwrap();
        assert!(n.disaggregated() && n.is_prefill(0) && !n.is_prefill(1));
        assert!(n.sim_args(0, 3).join(" ").contains("--role prefill"));
        n.places[1].role = Some("nope".into());
        assert!(n.validate(3).is_err());
    }
}
