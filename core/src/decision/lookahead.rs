//! Look-ahead on hot prefixes: the greedy cost model scores one request at a time, so a prefix
//! that many requests share stays on the worker that holds it for as long as waiting there is
//! cheaper than one recompute elsewhere, however many more requests for it are coming. This
//! module remembers how often each prefix was routed recently ([`HotPrefixes`], fed by every
//! routing decision of every thread through the journal) and decides when placing the prefix on
//! one more worker on purpose pays off ([`replica`]).
//!
//! The rule, per request whose prefix some worker holds:
//! - `N`: the routing decisions for that prefix over the last `horizon_ms` (exponentially
//!   decayed), taken as the number expected over the next `horizon_ms`;
//! - `H`: the workers holding the whole matched prefix, `h` the best of them;
//! - the queueing those requests would meet on the holders is `h`'s wait *without* the prefill
//!   of the prefix itself when that is still in flight (it drains; a fan-out's sub-requests
//!   arriving while their shared context is computed are not queued behind lasting work);
//! - a worker `r` without the prefix gains `N / (|H| + 1) · (wait_h − wait_r) · (1 − ttft_r /
//!   horizon)` (its share of the requests to come, each waiting less, from the moment it holds
//!   the prefix) and costs `ttft_r − ttft_h` once (this request's recompute).
//!
//! The best `r` whose gain exceeds its cost becomes the primary: a replication, counted.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::decision::cost::Score;

/// Configuration of the look-ahead (`lookahead` in the filter config).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct LookaheadConfig {
    /// `false`: purely greedy decisions (no deliberate replication).
    pub enabled: bool,
    /// Arrivals over this past window are expected again over the next one (ms).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub horizon_ms: u64,
    /// Fewer expected arrivals than this: no look-ahead.
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub min_arrivals: f64,
    /// Expected arrivals are capped at this (a burst must not justify everything).
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub max_arrivals: f64,
    /// Only prefixes of at least this many blocks are tracked.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub min_blocks: usize,
    /// Most prefixes remembered per thread; past it the coldest go.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_prefixes: usize,
}

impl Default for LookaheadConfig {
    fn default() -> Self {
        LookaheadConfig {
            enabled: true,
            horizon_ms: 2_000,
            min_arrivals: 2.0,
            max_arrivals: 32.0,
            min_blocks: 4,
            max_prefixes: 4_096,
        }
    }
}

impl LookaheadConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.horizon_ms == 0 || self.max_prefixes == 0 || self.min_blocks == 0 {
            return Err(
                "lookahead.horizon_ms, lookahead.max_prefixes and lookahead.min_blocks must be > 0"
                    .into(),
            );
        }
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !ok(self.min_arrivals) || !ok(self.max_arrivals) || self.max_arrivals < self.min_arrivals
        {
            return Err("lookahead: need 0 <= min_arrivals <= max_arrivals (finite)".into());
        }
        Ok(())
    }
}

/// The block depths (1-based counts) at which a prompt's prefixes are tracked: powers of two
/// from `min_blocks`, so a prefix is found at the deepest tracked depth it covers.
fn depths(min_blocks: usize, len: usize) -> impl Iterator<Item = usize> {
    std::iter::successors(Some(min_blocks.max(1).next_power_of_two()), |d| d.checked_mul(2))
        .take_while(move |d| *d <= len)
}

/// A decayed count of routing decisions.
#[derive(Debug, Clone, Copy)]
struct Rate {
    count: f64,
    at_ms: u64,
}

impl Rate {
    fn at(&self, now_ms: u64, horizon_ms: u64) -> f64 {
        let dt = now_ms.saturating_sub(self.at_ms) as f64;
        self.count * (-dt / horizon_ms as f64).exp()
    }
}

/// Recent routing decisions per prefix (keyed by the hash of its last block).
#[derive(Debug, Clone)]
pub struct HotPrefixes {
    cfg: LookaheadConfig,
    rates: HashMap<u64, Rate>,
}

impl HotPrefixes {
    pub fn new(cfg: LookaheadConfig) -> HotPrefixes {
        HotPrefixes { cfg, rates: HashMap::new() }
    }

    pub fn config(&self) -> &LookaheadConfig {
        &self.cfg
    }

    pub fn len(&self) -> usize {
        self.rates.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rates.is_empty()
    }

    /// Counts one routing decision for a prompt with these block hashes, made at `at_ms`.
    pub fn record(&mut self, hashes: &[u64], at_ms: u64) {
        if !self.cfg.enabled {
            return;
        }
        let horizon = self.cfg.horizon_ms;
        for d in depths(self.cfg.min_blocks, hashes.len()) {
            let r = self.rates.entry(hashes[d - 1]).or_insert(Rate { count: 0.0, at_ms });
            // An entry from "the future" (another thread's clock) is taken as now.
            let now = at_ms.max(r.at_ms);
            r.count = r.at(now, horizon) + 1.0;
            r.at_ms = now;
        }
        if self.rates.len() > self.cfg.max_prefixes {
            self.evict(at_ms);
        }
    }

    /// Drops the coldest eighth (at least the excess). It runs on the request path (a journal
    /// entry), so the coldest are selected, not sorted: linear in the map's size.
    fn evict(&mut self, now_ms: u64) {
        let horizon = self.cfg.horizon_ms;
        let mut by_rate: Vec<(f64, u64)> =
            self.rates.iter().map(|(k, r)| (r.at(now_ms, horizon), *k)).collect();
        let excess = self.rates.len() - self.cfg.max_prefixes;
        let n = excess.max(self.cfg.max_prefixes / 8).min(by_rate.len());
        if n == 0 {
            return;
        }
        if n < by_rate.len() {
            by_rate.select_nth_unstable_by(n - 1, |a, b| a.0.total_cmp(&b.0));
        }
        for (_, k) in by_rate.iter().take(n) {
            self.rates.remove(k);
        }
    }

    /// Routing decisions expected over the next horizon for the first `blocks` blocks of this
    /// prompt (the deepest tracked depth within them), capped.
    pub fn expected(&self, hashes: &[u64], blocks: usize, now_ms: u64) -> f64 {
        if !self.cfg.enabled {
            return 0.0;
        }
        let depth = depths(self.cfg.min_blocks, blocks.min(hashes.len())).last();
        let n = depth
            .and_then(|d| self.rates.get(&hashes[d - 1]))
            .map_or(0.0, |r| r.at(now_ms, self.cfg.horizon_ms));
        n.min(self.cfg.max_arrivals)
    }
}

/// A candidate as the look-ahead sees it: its score and how much of its wait is the prefill of
/// the request's own prefix, still in flight there (ms).
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    pub score: &'a Score,
    pub inflight_ms: f64,
}

/// The index (into `ranked`) of the worker to place the prefix on, if replicating pays off;
/// `expected` is [`HotPrefixes::expected`] for the best holder's prefix.
pub fn replica(cfg: &LookaheadConfig, ranked: &[Held<'_>], expected: f64) -> Option<usize> {
    if !cfg.enabled || expected < cfg.min_arrivals || expected <= 0.0 {
        return None;
    }
    let full = ranked.iter().map(|c| c.score.cached_tokens).max()?;
    if full == 0 {
        return None;
    }
    let holders = ranked.iter().filter(|c| c.score.cached_tokens >= full);
    let h = holders.clone().min_by(|a, b| a.score.ttft_ms.total_cmp(&b.score.ttft_ms))?;
    let steady_wait = (h.score.wait_ms - h.inflight_ms).max(0.0);
    let share = expected / (holders.count() as f64 + 1.0);
    let horizon = cfg.horizon_ms as f64;
    ranked
        .iter()
        .enumerate()
        .filter(|(_, r)| r.score.cached_tokens < full)
        .filter_map(|(i, r)| {
            let cost = r.score.ttft_ms - h.score.ttft_ms;
            let window = (1.0 - r.score.ttft_ms / horizon).max(0.0);
            let gain = share * (steady_wait - r.score.wait_ms).max(0.0) * window;
            // A worker cheaper right now is the greedy choice already, not a replication.
            (cost > 0.0 && gain > cost).then_some((i, gain - cost))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests;
