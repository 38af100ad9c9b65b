//! One worker's block index, bounded and reference-counted.
//!
//! Engines announce blocks by their own hash, per memory tier and (vLLM) per KV cache group,
//! and may announce one hash several times: vLLM caches duplicate blocks of one prefix under
//! one hash, its offloading connector re-announces chunks that overlap, SGLang publishes the
//! same hash for a prefix stored in several `extra_key` namespaces. So a *hold* is kept per
//! (engine hash, tier, group) with a count: each store adds one, each removal takes one, and
//! the hold goes when its count reaches zero. A hold names the canonical (kvroute-size) blocks
//! that the engine block completes (none, one, or several when the engine's pages are smaller
//! or larger than kvroute's blocks); a tier holds a canonical block while any hold that gives
//! prefix credit names it.
//!
//! Each engine hash also records where the chain stands after it (the last canonical block
//! and the tokens since, fewer than a block): an engine hash fingerprints a whole prefix, so
//! this does not depend on the tier or group that announced it, and a later store whose
//! parent it is continues from there.
//!
//! When a bound is reached the index forgets its *oldest-known* holds rather than refusing
//! new ones. With caps above the engine's real capacity, a cap is only reached when removals
//! were missed (or a peer misbehaves); the blocks whose removal was missed were, by
//! definition, stored before it, so the oldest-known are the likeliest to be gone already,
//! while a block just stored is certainly in the engine right now. Refusing new blocks would
//! keep the stale ones, and also turn every later block of the refused chains into an orphan.
//! Two refinements keep chains usable: blocks of one stored event become known tail first (as
//! vLLM frees them, so a prefix's head outlives its tail), and a parent named by a new store is
//! refreshed (it was just used). A prefix's older ancestors are not refreshed: a hot prefix
//! stored long ago can be forgotten first once a cap bites; that is the price of O(1) updates.

use std::collections::HashMap;

use hashlink::LinkedHashMap;

use crate::decode::{EngineKey, Tier};
use crate::limits::{BlockLimits, Cap, CapsHit};

const TIERS: [Tier; 3] = [Tier::Gpu, Tier::Cpu, Tier::Storage];

fn slot(t: Tier) -> usize {
    match t {
        Tier::Gpu => 0,
        Tier::Cpu => 1,
        Tier::Storage => 2,
    }
}

/// Where a chain stands after an engine block: the canonical hash of its last full
/// kvroute-size block (the domain seed before the first) and the tokens after that block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainEnd {
    pub canonical: u64,
    pub pending: Box<[u32]>,
}

#[derive(Debug)]
struct Hold {
    refs: u32,
    /// The canonical blocks this engine block completes.
    blocks: Named,
}

/// Canonical blocks, the common single one inline (no allocation per hold).
#[derive(Debug)]
enum Named {
    One(u64),
    Many(Box<[u64]>),
}

impl Named {
    fn of(blocks: &[u64]) -> Named {
        match blocks {
            [one] => Named::One(*one),
            many => Named::Many(many.into()),
        }
    }

    fn as_slice(&self) -> &[u64] {
        match self {
            Named::One(c) => std::slice::from_ref(c),
            Named::Many(b) => b,
        }
    }
}

#[derive(Debug, Default)]
struct TierIndex {
    /// (engine hash, group) -> hold, oldest-known first.
    holds: LinkedHashMap<(EngineKey, u32), Hold>,
    /// Canonical hash -> how many holds name it.
    canonical: HashMap<u64, u32>,
}

impl TierIndex {
    fn add(&mut self, blocks: &[u64]) {
        for c in blocks {
            *self.canonical.entry(*c).or_insert(0) += 1;
        }
    }

    fn release(&mut self, blocks: &[u64]) {
        for c in blocks {
            if let Some(n) = self.canonical.get_mut(c) {
                *n -= 1;
                if *n == 0 {
                    self.canonical.remove(c);
                }
            }
        }
    }
}

#[derive(Debug)]
struct Chain {
    end: ChainEnd,
    /// The (tier slot, group) holds of this engine hash: the first inline, usually the only.
    first: (usize, u32),
    more: Vec<(usize, u32)>,
}

impl Chain {
    fn at(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        std::iter::once(self.first).chain(self.more.iter().copied())
    }

    /// Forgets hold `a`; true when none is left.
    fn unlink(&mut self, a: (usize, u32)) -> bool {
        if self.first == a {
            match self.more.pop() {
                Some(next) => self.first = next,
                None => return true,
            }
        } else {
            self.more.retain(|&m| m != a);
        }
        false
    }
}

/// A worker's blocks on every tier, within [`BlockLimits`].
#[derive(Debug, Default)]
pub struct BlockIndex {
    limits: BlockLimits,
    tiers: [TierIndex; 3],
    chains: HashMap<EngineKey, Chain>,
}

impl BlockIndex {
    pub fn new(limits: BlockLimits) -> BlockIndex {
        BlockIndex { limits, ..Default::default() }
    }

    pub fn limits(&self) -> BlockLimits {
        self.limits
    }

    /// Holds known (engine hash, tier, group), all tiers together.
    pub fn engine_keys(&self) -> usize {
        self.tiers.iter().map(|t| t.holds.len()).sum()
    }

    pub fn len(&self, tier: Tier) -> usize {
        self.tiers[slot(tier)].canonical.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tiers.iter().all(|t| t.holds.is_empty())
    }

    pub fn blocks(&self, tier: Tier) -> Vec<u64> {
        let mut v: Vec<u64> = self.tiers[slot(tier)].canonical.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Tiers holding at least one block, with their counts.
    pub fn counts(&self) -> Vec<(Tier, usize)> {
        TIERS.iter().map(|&t| (t, self.len(t))).filter(|(_, n)| *n > 0).collect()
    }

    pub fn clear(&mut self) {
        self.tiers = Default::default();
        self.chains.clear();
    }

    /// Forgets every hold on `tier` (a reset of that pool).
    pub fn clear_tier(&mut self, tier: Tier) {
        let s = slot(tier);
        let holds = std::mem::take(&mut self.tiers[s]);
        for ((key, group), _) in holds.holds {
            self.unlink(key, s, group);
        }
    }

    /// Forgets every hold of `group` (it turned out to give no prefix credit).
    pub fn clear_group(&mut self, group: u32) {
        for s in 0..TIERS.len() {
            let keys: Vec<EngineKey> =
                self.tiers[s].holds.keys().filter(|(_, g)| *g == group).map(|(k, _)| *k).collect();
            for k in keys {
                self.drop_hold(k, s, group);
            }
        }
    }

    fn unlink(&mut self, key: EngineKey, s: usize, group: u32) {
        if self.chains.get_mut(&key).is_some_and(|c| c.unlink((s, group))) {
            self.chains.remove(&key);
        }
    }

    fn drop_hold(&mut self, key: EngineKey, s: usize, group: u32) {
        if let Some(h) = self.tiers[s].holds.remove(&(key, group)) {
            self.tiers[s].release(h.blocks.as_slice());
            self.unlink(key, s, group);
        }
    }

    fn evict_oldest(&mut self, s: usize) -> bool {
        match self.tiers[s].holds.pop_front() {
            Some(((key, group), h)) => {
                self.tiers[s].release(h.blocks.as_slice());
                self.unlink(key, s, group);
                true
            }
            None => false,
        }
    }

    /// Where the chain stands after engine block `key`, if it is held anywhere; its holds are
    /// refreshed (it was just used).
    pub fn chain_end(&mut self, key: EngineKey) -> Option<ChainEnd> {
        let c = self.chains.get(&key)?;
        for (s, g) in c.at() {
            self.tiers[s].holds.to_back(&(key, g));
        }
        Some(c.end.clone())
    }

    /// What a hold of `key` names, preferring one of `group`: the chain end and the canonical
    /// blocks (for a store that carries only the engine hash).
    pub fn known(&self, key: EngineKey, group: u32) -> Option<(ChainEnd, Vec<u64>)> {
        let c = self.chains.get(&key)?;
        let (s, g) = c.at().find(|(_, g)| *g == group).unwrap_or(c.first);
        let h = self.tiers[s].holds.get(&(key, g))?;
        Some((c.end.clone(), h.blocks.as_slice().to_vec()))
    }

    /// One more store of engine block `key` on `tier` in `group`, ending the chain at `end`
    /// and completing canonical `blocks`. A hold already there only counts one more; otherwise
    /// the oldest-known holds are forgotten when a bound would be exceeded (each one counted
    /// in `caps`).
    pub fn store(
        &mut self,
        key: EngineKey,
        tier: Tier,
        group: u32,
        end: ChainEnd,
        blocks: &[u64],
        caps: &mut CapsHit,
    ) {
        let s = slot(tier);
        if let Some(h) = self.tiers[s].holds.to_back(&(key, group)) {
            h.refs = h.refs.saturating_add(1);
            return;
        }
        while self.engine_keys() >= self.limits.max_engine_keys.max(1) {
            // The largest tier gives way.
            let Some(big) = (0..3).max_by_key(|&i| self.tiers[i].holds.len()) else { break };
            if !self.evict_oldest(big) {
                break;
            }
            caps.hit(Cap::EngineKeys);
        }
        let new = blocks.iter().filter(|c| !self.tiers[s].canonical.contains_key(c)).count();
        if new > 0 {
            let max = self.limits.max_blocks_per_tier.max(1);
            while self.tiers[s].canonical.len() + new > max {
                if !self.evict_oldest(s) {
                    break;
                }
                caps.hit(Cap::BlocksPerTier);
            }
        }
        self.tiers[s].add(blocks);
        let blocks = Named::of(blocks);
        self.tiers[s].holds.insert((key, group), Hold { refs: 1, blocks });
        match self.chains.get_mut(&key) {
            Some(c) => c.more.push((s, group)),
            None => {
                self.chains.insert(key, Chain { end, first: (s, group), more: Vec::new() });
            }
        }
    }

    /// One removal of `key` on `tier` in `group`; false if no such hold was known.
    pub fn remove(&mut self, key: EngineKey, tier: Tier, group: u32) -> bool {
        let s = slot(tier);
        match self.tiers[s].holds.get_mut(&(key, group)) {
            Some(h) if h.refs > 1 => h.refs -= 1,
            Some(_) => self.drop_hold(key, s, group),
            None => return false,
        }
        true
    }
}

#[cfg(test)]
mod tests;
