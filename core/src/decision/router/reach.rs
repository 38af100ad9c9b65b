//! Each candidate's [`Reach`] under the configured topology: the round trip to it from this
//! Envoy and the pulls it could make from the other candidates that hold more of the prompt.

use std::borrow::Borrow;

use crate::decision::cost::{Candidate, PullOffer, Reach};
use crate::decision::topology::TopologyConfig;
use crate::decision::worker::WorkerName;

/// The reaches of `cands` (in order). `network`: whether the client talks to these workers
/// (false for a P/D pool's prefill workers); `extra` is added to each one's estimate. Without
/// a topology there is no network time and no pull.
pub(super) fn reaches<W: Borrow<WorkerName>>(
    topo: Option<&TopologyConfig>,
    cands: &[Candidate<W>],
    network: bool,
    extra: &dyn Fn(&str) -> f64,
) -> Vec<Reach> {
    cands
        .iter()
        .map(|c| Reach {
            network_ms: match topo {
                Some(t) if network => t.client_rtt_ms(c.name()),
                _ => 0.0,
            },
            extra_ms: extra(c.name()),
            pulls: topo.map(|t| offers(t, c, cands)).unwrap_or_default(),
        })
        .collect()
}

/// The holders `c` could pull from: the other candidates believed to hold more leading
/// blocks, over a link the topology allows.
fn offers<W: Borrow<WorkerName>>(
    t: &TopologyConfig,
    c: &Candidate<W>,
    cands: &[Candidate<W>],
) -> Vec<PullOffer> {
    if !t.transfer.enabled {
        return Vec::new();
    }
    cands
        .iter()
        .filter(|h| h.name() != c.name() && h.cached_blocks > c.cached_blocks)
        .filter_map(|h| {
            let cost = t.pull_cost(h.name(), c.name())?;
            Some(PullOffer { from: h.name().to_string(), blocks: h.cached_blocks, cost })
        })
        .collect()
}
