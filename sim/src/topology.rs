//! Where a simulated worker sits and what its network costs: labels (`--site`, `--node`,
//! `--role`), the client round trip on its HTTP socket (`--client-rtt-ms`), the delay on its
//! KV-event path (`--event-delay-ms`), its links to other sites (`--link SITE=RTT_MS:GBPS`) and
//! the size of the KV a pull moves (`--kv-bytes-per-token`, `--kv-wire-scale`, `--kv-setup-ms`).
//!
//! All these durations are wall-clock milliseconds on real sockets: `--speedup` divides engine
//! time only, never a network delay (a router in front sees the same RTT and link costs as its
//! configuration says).
//!
//! Defaults (no flag given) change nothing: no labels, role `both`, no delay anywhere.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// What a worker does in a prefill/decode (P/D) disaggregated pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SimRole {
    /// Aggregated: prefills and decodes its own requests (vLLM without a KV connector).
    #[default]
    Both,
    /// Serves prefill requests (`max_tokens` 1, `kv_transfer_params.do_remote_decode`) and
    /// keeps their KV for a decode worker to pull.
    Prefill,
    /// Given `x-prefiller-host-port`, has the prompt prefilled there and pulls its KV first.
    Decode,
}

impl SimRole {
    pub fn name(self) -> &'static str {
        match self {
            SimRole::Both => "both",
            SimRole::Prefill => "prefill",
            SimRole::Decode => "decode",
        }
    }
}

/// One network link: round trip and bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimLink {
    pub rtt_ms: f64,
    pub gbps: f64,
}

impl SimLink {
    /// The link to a site no `--link` names (and no `*` default): 0 ms, 100 Gbit/s.
    pub const DEFAULT: SimLink = SimLink { rtt_ms: 0.0, gbps: 100.0 };

    /// Wall time to move `bytes` (full size) over this link, without the round trip.
    pub fn wire_time(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 * 8.0 / (self.gbps * 1e9))
    }

    pub fn rtt(&self) -> Duration {
        ms(self.rtt_ms)
    }
}

/// A duration from milliseconds (negative or NaN: zero).
pub fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(if v.is_finite() && v > 0.0 { v / 1000.0 } else { 0.0 })
}

/// Parses `SITE=RTT_MS:GBPS` (SITE may name a node too; `*`: any peer without a link of its
/// own).
pub fn parse_link(s: &str) -> Result<(String, SimLink), String> {
    let bad = || format!("'{s}' is not SITE=RTT_MS:GBPS (e.g. b=40:10)");
    let (site, cost) = s.split_once('=').ok_or_else(bad)?;
    let (rtt, gbps) = cost.split_once(':').ok_or_else(bad)?;
    let rtt_ms: f64 = rtt.trim().parse().map_err(|_| bad())?;
    let gbps: f64 = gbps.trim().parse().map_err(|_| bad())?;
    if site.is_empty() || !(rtt_ms.is_finite() && rtt_ms >= 0.0) {
        return Err(bad());
    }
    if !(gbps.is_finite() && gbps > 0.0) {
        return Err(format!("'{s}': the bandwidth must be > 0 Gbit/s"));
    }
    Ok((site.to_owned(), SimLink { rtt_ms, gbps }))
}

/// Where a peer worker is: its labels, as its `GET /sim/topology` says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerPlace {
    pub site: Option<String>,
    pub node: Option<String>,
}

impl PeerPlace {
    pub fn site(site: &str) -> PeerPlace {
        PeerPlace { site: Some(site.to_owned()), node: None }
    }
}

/// A worker's place in the topology and its network settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SimTopology {
    pub site: Option<String>,
    pub node: Option<String>,
    pub role: SimRole,
    /// Round trip between the client and this worker, applied on its HTTP socket.
    pub client_rtt_ms: f64,
    /// One-way delay of its KV-event PUB path.
    pub event_delay_ms: f64,
    /// Links from this worker to workers in each site (`*`: any other site).
    pub links: Vec<(String, SimLink)>,
    /// KV size of one token (bytes).
    pub kv_bytes_per_token: u64,
    /// A pull sends 1/scale of the KV's bytes, paced at 1/scale of the bandwidth.
    pub kv_wire_scale: u64,
    /// Fixed cost of one pull (handshake, registration), ms.
    pub kv_setup_ms: f64,
}

impl Default for SimTopology {
    fn default() -> SimTopology {
        SimTopology {
            site: None,
            node: None,
            role: SimRole::Both,
            client_rtt_ms: 0.0,
            event_delay_ms: 0.0,
            links: Vec::new(),
            kv_bytes_per_token: 131_072,
            kv_wire_scale: 1024,
            kv_setup_ms: 0.0,
        }
    }
}

impl SimTopology {
    /// True when no topology flag was given: the worker behaves exactly as before them.
    pub fn is_default(&self) -> bool {
        *self == SimTopology::default()
    }

    /// The link to a worker at `place` (its node, then its site, names a `--link`; else the
    /// `*` link, else [`SimLink::DEFAULT`]).
    pub fn link_to(&self, place: &PeerPlace) -> (String, SimLink) {
        let find = |name: &str| self.links.iter().find(|(s, _)| s == name);
        place
            .node
            .as_deref()
            .and_then(find)
            .or_else(|| place.site.as_deref().and_then(find))
            .or_else(|| find("*"))
            .map_or_else(|| ("*".to_owned(), SimLink::DEFAULT), |(s, l)| (s.clone(), *l))
    }

    /// The one-way client delay (half the client RTT).
    pub fn client_one_way(&self) -> Duration {
        ms(self.client_rtt_ms) / 2
    }

    pub fn event_delay(&self) -> Duration {
        ms(self.event_delay_ms)
    }

    /// Real bytes a pull sends per KV block of `block_size` tokens (at least 1).
    pub fn wire_bytes_per_block(&self, block_size: usize) -> u64 {
        (self.kv_bytes_per_token * block_size as u64).div_ceil(self.kv_wire_scale.max(1)).max(1)
    }
}

/// The links of one worker in use: each is a shared resource, so concurrent pulls over one
/// link split its bandwidth (every chunk reserves its transmission time on the link's clock,
/// after whatever is already reserved).
#[derive(Debug, Default)]
pub struct LinkClocks {
    next_free: Mutex<HashMap<String, Instant>>,
}

impl LinkClocks {
    /// Reserves `d` of transmission on link `name`; returns when that slot ends. A slot that
    /// ended within [`LinkClocks::SLACK`] of now is taken as still running: a transfer that
    /// sleeps chunk by chunk wakes a little late each time (the timer's tick), and that lateness
    /// must not add up over its chunks.
    pub fn reserve(&self, name: &str, d: Duration) -> Instant {
        let mut m = self.next_free.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let slot = m.entry(name.to_owned()).or_insert(now);
        let start = if now.saturating_duration_since(*slot) <= Self::SLACK { *slot } else { now };
        let end = start + d;
        *slot = end;
        end
    }

    /// How late a wake-up may be and still continue the link's last slot (tokio's timer
    /// wakes on the millisecond tick after a deadline).
    pub const SLACK: Duration = Duration::from_millis(2);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_parse_and_resolve() {
        let (s, l) = parse_link("b=40:10").unwrap();
        assert_eq!((s.as_str(), l), ("b", SimLink { rtt_ms: 40.0, gbps: 10.0 }));
        assert!(parse_link("b=40").is_err());
        assert!(parse_link("=1:1").is_err());
        assert!(parse_link("b=1:0").is_err());
        assert!(parse_link("b=-1:1").is_err());
        let t = SimTopology {
            links: vec![parse_link("a=0.2:100").unwrap(), parse_link("*=50:5").unwrap()],
            ..SimTopology::default()
        };
        assert_eq!(t.link_to(&PeerPlace::site("a")).1.rtt_ms, 0.2);
        assert_eq!(t.link_to(&PeerPlace::site("c")).1.gbps, 5.0);
        assert_eq!(t.link_to(&PeerPlace::default()).0, "*");
        assert_eq!(SimTopology::default().link_to(&PeerPlace::site("a")).1, SimLink::DEFAULT);
        // A node's own link wins over its site's.
        let n = SimTopology { links: vec![parse_link("n2=0:400").unwrap()], ..t.clone() };
        let place = PeerPlace { site: Some("a".into()), node: Some("n2".into()) };
        assert_eq!(n.link_to(&place).1.gbps, 400.0);
        assert!(SimTopology::default().is_default() && !t.is_default());
    }

    #[test]
    fn wire_size_and_time() {
        let t = SimTopology::default();
        // 16 tokens x 128 KiB = 2 MiB per block, 2 KiB on the wire.
        assert_eq!(t.wire_bytes_per_block(16), 2048);
        let l = SimLink { rtt_ms: 1.0, gbps: 8.0 };
        assert_eq!(l.wire_time(1_000_000_000), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_pulls_share_a_link() {
        let c = LinkClocks::default();
        let t0 = Instant::now();
        let d = Duration::from_millis(10);
        assert_eq!(c.reserve("a", d), t0 + d);
        // A second transfer on the same link queues behind the first; another link does not.
        assert_eq!(c.reserve("a", d), t0 + 2 * d);
        assert_eq!(c.reserve("b", d), t0 + d);
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_wake_up_does_not_slow_a_transfer_down() {
        let c = LinkClocks::default();
        let t0 = Instant::now();
        let d = Duration::from_millis(10);
        let mut end = c.reserve("a", d);
        for _ in 0..9 {
            // Each chunk's sleep ends one tick late.
            tokio::time::sleep_until(end + Duration::from_millis(1)).await;
            end = c.reserve("a", d);
        }
        assert_eq!(end, t0 + 10 * d);
        // An idle link starts a new transfer now.
        tokio::time::sleep_until(end + LinkClocks::SLACK * 2).await;
        assert_eq!(c.reserve("a", d), end + LinkClocks::SLACK * 2 + d);
    }
}
