//! Where workers are and what moving state between them costs: labels (node, rack, zone,
//! site) per worker, one link cost per level two workers share, the round trip from this Envoy
//! to each site, and which KV pulls between workers the pool supports.
//!
//! Everything here is configuration an admin knows (link speeds, placements), never an
//! engine's speed. A worker whose site is not known is costed as local and flagged
//! ([`SitePlacement::known`]). Without a `topology` section nothing of this applies and decisions
//! are exactly those of a topology-free pool.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The widest level a pair of workers shares, from nearest to farthest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// The same node (NVLink, shared host memory).
    Node,
    /// The same rack, different nodes.
    Rack,
    /// The same zone, different racks.
    Zone,
    /// The same site, different zones.
    Site,
    /// Different sites (a WAN link).
    Wan,
}

/// A worker's placement labels (any may be unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Labels {
    pub site: Option<String>,
    pub zone: Option<String>,
    pub rack: Option<String>,
    pub node: Option<String>,
}

/// One link's cost: round trip and bandwidth (both given: a level's defaults are in
/// [`Links::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Round-trip time (ms).
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub rtt_ms: f64,
    /// Bandwidth (Gbit/s) available to one KV transfer; 0: no transfer over it.
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub gbps: f64,
}

impl Link {
    const fn new(rtt_ms: f64, gbps: f64) -> Link {
        Link { rtt_ms, gbps }
    }

    /// Milliseconds to move `bytes` over this link after its round trip; infinite at zero
    /// bandwidth.
    pub fn transfer_ms(&self, bytes: f64) -> f64 {
        if self.gbps > 0.0 {
            bytes * 8.0 / (self.gbps * 1e6)
        } else {
            f64::INFINITY
        }
    }
}

/// One link per level (defaults: public figures for NVLink, a rack switch, a zone fabric, a
/// metro interconnect and a continental WAN).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Links {
    pub node: Link,
    pub rack: Link,
    pub zone: Link,
    pub site: Link,
    pub wan: Link,
}

impl Default for Links {
    fn default() -> Self {
        Links {
            node: Link::new(0.01, 400.0),
            rack: Link::new(0.05, 200.0),
            zone: Link::new(0.2, 100.0),
            site: Link::new(1.0, 50.0),
            wan: Link::new(40.0, 10.0),
        }
    }
}

impl Links {
    pub fn at(&self, level: Level) -> Link {
        match level {
            Level::Node => self.node,
            Level::Rack => self.rack,
            Level::Zone => self.zone,
            Level::Site => self.site,
            Level::Wan => self.wan,
        }
    }
}

/// A WAN link between two named sites that differs from `links.wan`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SiteLink {
    pub a: String,
    pub b: String,
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub rtt_ms: f64,
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub gbps: f64,
}

/// KV transfer between workers: a worker pulls the prompt's prefix from a holder instead of
/// recomputing it (e.g. LMCache's or llm-d's peer-to-peer pull over NIXL).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct TransferConfig {
    pub enabled: bool,
    /// The widest level a pull may cross; pulls across wider links are never chosen.
    pub max_level: Level,
    /// Fixed cost of one pull (handshake, memory registration), ms.
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub setup_ms: f64,
    /// KV bytes per token of the model (layers x KV heads x head dim x 2 x dtype bytes).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub kv_bytes_per_token: u64,
    /// Request header naming the holder (`host:port`) the chosen worker pulls from.
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"^[a-z0-9-]+$")))]
    pub header: String,
    /// What the engine side maps the header to (documentation only).
    pub mechanism: String,
}

impl TransferConfig {
    /// The default of [`TransferConfig::header`].
    pub const DEFAULT_HEADER: &'static str = "x-kvroute-kv-source";
}

impl Default for TransferConfig {
    fn default() -> Self {
        TransferConfig {
            enabled: false,
            max_level: Level::Zone,
            setup_ms: 2.0,
            // An 8B-class model: 32 layers x 8 KV heads x 128 dims x K,V x bf16.
            kv_bytes_per_token: 131_072,
            header: Self::DEFAULT_HEADER.into(),
            mechanism: "lmcache-p2p".into(),
        }
    }
}

/// The `topology` section of the filter configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct TopologyConfig {
    /// The site this Envoy runs in; workers of unknown site are costed as in it.
    pub local_site: Option<String>,
    /// Labels per worker (`ip:port`, as in the pools).
    pub workers: BTreeMap<String, Labels>,
    pub links: Links,
    /// WAN links between named sites that differ from `links.wan` (either order).
    pub site_links: Vec<SiteLink>,
    /// Round trip (ms) from this Envoy to workers of each site: paid once on a request's time
    /// to first token. Sites not listed: 0 for the local site, `links.wan.rtt_ms` otherwise.
    pub client_rtt_ms: BTreeMap<String, f64>,
    pub transfer: TransferConfig,
    /// Workers whose labels (some of them) the updater discovered, with when it last saw them
    /// (unix ms); filled by [`TopologyConfig::with_discovered`], never configured.
    #[serde(skip)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub discovered: BTreeMap<String, u64>,
}

/// Where one worker is, as a decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SitePlacement {
    /// Its site, or the local site when not known.
    pub site: Option<String>,
    /// False: its site is not known (costed as local, flagged).
    pub known: bool,
    /// Where its labels come from: `config`, `discovered` (by the updater, with
    /// `observed_at_ms`), or `none`.
    pub source: &'static str,
    pub observed_at_ms: Option<u64>,
}

/// Labels the updater discovered for one worker, seen at `observed_at_ms` (unix ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredLabels {
    pub worker: String,
    pub labels: Labels,
    pub observed_at_ms: u64,
}

impl TopologyConfig {
    pub fn validate(&self) -> Result<(), String> {
        let links = [
            ("node", self.links.node),
            ("rack", self.links.rack),
            ("zone", self.links.zone),
            ("site", self.links.site),
            ("wan", self.links.wan),
        ];
        let mut all: Vec<(String, f64, f64)> =
            links.iter().map(|(n, l)| (format!("links.{n}"), l.rtt_ms, l.gbps)).collect();
        all.extend(
            self.site_links
                .iter()
                .map(|s| (format!("site_links {}-{}", s.a, s.b), s.rtt_ms, s.gbps)),
        );
        for (name, rtt, gbps) in all {
            if !(rtt.is_finite() && rtt >= 0.0 && gbps.is_finite() && gbps >= 0.0) {
                return Err(format!("topology.{name}: rtt_ms and gbps must be finite and >= 0"));
            }
        }
        for (site, rtt) in &self.client_rtt_ms {
            if !(rtt.is_finite() && *rtt >= 0.0) {
                return Err(format!("topology.client_rtt_ms.{site} must be finite and >= 0"));
            }
        }
        let t = &self.transfer;
        if !(t.setup_ms.is_finite() && t.setup_ms >= 0.0) || t.kv_bytes_per_token == 0 {
            return Err("topology.transfer: setup_ms must be >= 0, kv_bytes_per_token > 0".into());
        }
        if t.header.is_empty()
            || t.header
                .bytes()
                .any(|b| !(b.is_ascii_lowercase() || b == b'-' || b.is_ascii_digit()))
        {
            return Err(format!(
                "topology.transfer.header '{}' must be a lowercase name",
                t.header
            ));
        }
        Ok(())
    }

    /// The labels of `worker`, with an unknown site read as the local one.
    fn labels(&self, worker: &str) -> (Option<&str>, Option<&Labels>) {
        let l = self.workers.get(worker);
        let site = l.and_then(|l| l.site.as_deref()).or(self.local_site.as_deref());
        (site, l)
    }

    pub fn placement(&self, worker: &str) -> SitePlacement {
        let (site, l) = self.labels(worker);
        let observed_at_ms = self.discovered.get(worker).copied();
        let source = match (l, observed_at_ms) {
            (None, _) => "none",
            (Some(_), Some(_)) => "discovered",
            (Some(_), None) => "config",
        };
        SitePlacement {
            site: site.map(str::to_owned),
            known: l.is_some_and(|l| l.site.is_some()),
            source,
            observed_at_ms,
        }
    }

    /// This topology with the updater's discovered labels added: a label the configuration
    /// gives a worker wins, the discovered ones fill in the rest (a worker placed by the
    /// configuration alone keeps source `config`).
    pub fn with_discovered(&self, found: &[DiscoveredLabels]) -> TopologyConfig {
        let mut out = self.clone();
        out.discovered.clear();
        for d in found {
            let entry = out.workers.entry(d.worker.clone()).or_default();
            let before = entry.clone();
            let fill = |mine: &mut Option<String>, theirs: &Option<String>| {
                if mine.is_none() {
                    mine.clone_from(theirs);
                }
            };
            fill(&mut entry.site, &d.labels.site);
            fill(&mut entry.zone, &d.labels.zone);
            fill(&mut entry.rack, &d.labels.rack);
            fill(&mut entry.node, &d.labels.node);
            if *entry != before {
                out.discovered.insert(d.worker.clone(), d.observed_at_ms);
            }
        }
        out.workers.retain(|_, l| *l != Labels::default());
        out
    }

    /// Whether `worker` is placed in a site other than this Envoy's.
    pub fn is_cross_site(&self, worker: &str) -> bool {
        let p = self.placement(worker);
        p.known && self.local_site.is_some() && p.site != self.local_site
    }

    /// The round trip from this Envoy to `worker` (ms).
    pub fn client_rtt_ms(&self, worker: &str) -> f64 {
        let (site, _) = self.labels(worker);
        match site {
            Some(s) => self.client_rtt_ms.get(s).copied().unwrap_or(
                if Some(s) == self.local_site.as_deref() || self.local_site.is_none() {
                    0.0
                } else {
                    self.links.wan.rtt_ms
                },
            ),
            None => 0.0,
        }
    }

    /// The level two workers share: the nearest label both carry and agree on, from the node
    /// outwards. Labels missing on either side count as different below their site.
    pub fn level(&self, a: &str, b: &str) -> Level {
        let ((sa, la), (sb, lb)) = (self.labels(a), self.labels(b));
        if sa != sb {
            return Level::Wan;
        }
        let same = |f: fn(&Labels) -> Option<&String>| match (la.and_then(f), lb.and_then(f)) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        };
        if same(|l| l.zone.as_ref()) {
            if same(|l| l.rack.as_ref()) {
                if same(|l| l.node.as_ref()) {
                    return Level::Node;
                }
                return Level::Rack;
            }
            return Level::Zone;
        }
        Level::Site
    }

    /// The link between two workers.
    pub fn link(&self, a: &str, b: &str) -> Link {
        let level = self.level(a, b);
        if level == Level::Wan {
            let ((sa, _), (sb, _)) = (self.labels(a), self.labels(b));
            if let Some(s) = self.site_links.iter().find(|s| {
                (Some(s.a.as_str()), Some(s.b.as_str())) == (sa, sb)
                    || (Some(s.b.as_str()), Some(s.a.as_str())) == (sa, sb)
            }) {
                return Link { rtt_ms: s.rtt_ms, gbps: s.gbps };
            }
        }
        self.links.at(level)
    }

    /// What pulling from `holder` to `receiver` costs, or `None` when the pool does not
    /// transfer KV or the topology forbids this pair.
    pub fn pull_cost(&self, holder: &str, receiver: &str) -> Option<PullCost> {
        let t = &self.transfer;
        if !t.enabled || holder == receiver || self.level(holder, receiver) > t.max_level {
            return None;
        }
        let link = self.link(holder, receiver);
        if link.gbps <= 0.0 {
            return None;
        }
        Some(PullCost {
            fixed_ms: t.setup_ms + link.rtt_ms,
            ms_per_token: link.transfer_ms(t.kv_bytes_per_token as f64),
        })
    }

    /// Moving the KV of `tokens` tokens from `from` to `to` (P/D hand-off): the fixed cost
    /// plus size over bandwidth over their link (infinite without bandwidth).
    pub fn handoff_ms(&self, from: &str, to: &str, tokens: u64) -> f64 {
        if from == to {
            return 0.0;
        }
        let link = self.link(from, to);
        self.transfer.setup_ms
            + link.rtt_ms
            + link.transfer_ms(tokens as f64 * self.transfer.kv_bytes_per_token as f64)
    }
}

/// The cost of one possible pull: `fixed_ms + tokens · ms_per_token`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PullCost {
    pub fixed_ms: f64,
    pub ms_per_token: f64,
}

impl PullCost {
    pub fn ms(&self, tokens: u64) -> f64 {
        self.fixed_ms + tokens as f64 * self.ms_per_token
    }
}

#[cfg(test)]
mod tests;
