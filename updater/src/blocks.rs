//! One worker's block index, bounded: per tier, the engine's block hashes mapped to canonical
//! hashes in the order they became known, and the canonical blocks with how many engine hashes
//! name each.
//!
//! When a bound is reached the index forgets its *oldest-known* entries rather than refusing
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

#[derive(Debug, Default)]
struct TierIndex {
    /// Engine hash -> canonical hash, oldest-known first.
    by_engine: LinkedHashMap<EngineKey, u64>,
    /// Canonical hash -> how many engine hashes name it.
    canonical: HashMap<u64, u32>,
}

impl TierIndex {
    fn release(&mut self, canonical: u64) {
        if let Some(n) = self.canonical.get_mut(&canonical) {
            *n -= 1;
            if *n == 0 {
                self.canonical.remove(&canonical);
            }
        }
    }

    fn evict_oldest(&mut self) -> bool {
        match self.by_engine.pop_front() {
            Some((_, c)) => {
                self.release(c);
                true
            }
            None => false,
        }
    }
}

/// A worker's blocks on every tier, within [`BlockLimits`].
#[derive(Debug, Default)]
pub struct BlockIndex {
    limits: BlockLimits,
    tiers: [TierIndex; 3],
}

impl BlockIndex {
    pub fn new(limits: BlockLimits) -> BlockIndex {
        BlockIndex { limits, tiers: Default::default() }
    }

    pub fn limits(&self) -> BlockLimits {
        self.limits
    }

    /// Engine hashes known, all tiers together.
    pub fn engine_keys(&self) -> usize {
        self.tiers.iter().map(|t| t.by_engine.len()).sum()
    }

    pub fn len(&self, tier: Tier) -> usize {
        self.tiers[slot(tier)].canonical.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tiers.iter().all(|t| t.by_engine.is_empty())
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
    }

    /// The canonical hash of parent `key`, looked up on `tier` first, then on any tier (an
    /// offloaded chain may continue a GPU block). A parent found is refreshed: it was just used.
    pub fn parent(&mut self, key: EngineKey, tier: Tier) -> Option<u64> {
        let order = std::iter::once(tier).chain(TIERS.into_iter().filter(move |&t| t != tier));
        for t in order {
            if let Some(c) = self.tiers[slot(t)].by_engine.to_back(&key) {
                return Some(*c);
            }
        }
        None
    }

    /// Records that `key` names `canonical` on `tier`, forgetting the oldest-known entries
    /// when a bound would be exceeded (each one counted in `caps`).
    pub fn insert(&mut self, key: EngineKey, tier: Tier, canonical: u64, caps: &mut CapsHit) {
        let s = slot(tier);
        if let Some(old) = self.tiers[s].by_engine.remove(&key) {
            self.tiers[s].release(old);
        }
        while self.engine_keys() >= self.limits.max_engine_keys.max(1) {
            // The largest tier gives way.
            let Some(big) = (0..3).max_by_key(|&i| self.tiers[i].by_engine.len()) else { break };
            if !self.tiers[big].evict_oldest() {
                break;
            }
            caps.hit(Cap::EngineKeys);
        }
        let t = &mut self.tiers[s];
        if !t.canonical.contains_key(&canonical) {
            while t.canonical.len() >= self.limits.max_blocks_per_tier.max(1) {
                if !t.evict_oldest() {
                    break;
                }
                caps.hit(Cap::BlocksPerTier);
            }
        }
        t.by_engine.insert(key, canonical);
        *t.canonical.entry(canonical).or_insert(0) += 1;
    }

    /// Forgets `key` on `tier`.
    pub fn remove(&mut self, key: EngineKey, tier: Tier) {
        let t = &mut self.tiers[slot(tier)];
        if let Some(c) = t.by_engine.remove(&key) {
            t.release(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(blocks: usize, keys: usize) -> BlockIndex {
        BlockIndex::new(BlockLimits { max_blocks_per_tier: blocks, max_engine_keys: keys })
    }

    #[test]
    fn the_oldest_known_blocks_give_way() {
        let (mut ix, mut caps) = (index(3, 100), CapsHit::default());
        for k in 1..=3 {
            ix.insert(k, Tier::Gpu, k * 10, &mut caps);
        }
        // Block 1 was used as a parent: it is now the newest.
        assert_eq!(ix.parent(1, Tier::Gpu), Some(10));
        ix.insert(4, Tier::Gpu, 40, &mut caps);
        assert_eq!(ix.blocks(Tier::Gpu), vec![10, 30, 40]);
        assert_eq!(caps.get(Cap::BlocksPerTier), 1);
        // Other tiers have their own bound.
        ix.insert(5, Tier::Cpu, 50, &mut caps);
        assert_eq!((ix.len(Tier::Gpu), ix.len(Tier::Cpu)), (3, 1));
    }

    #[test]
    fn engine_keys_are_bounded_and_shared_canonicals_counted() {
        let (mut ix, mut caps) = (index(100, 4), CapsHit::default());
        // Two engine hashes for one canonical block (e.g. two KV-cache groups).
        ix.insert(1, Tier::Gpu, 7, &mut caps);
        ix.insert(2, Tier::Gpu, 7, &mut caps);
        ix.remove(1, Tier::Gpu);
        assert_eq!(ix.blocks(Tier::Gpu), vec![7], "still named by engine hash 2");
        for k in 10..20 {
            ix.insert(k, Tier::Gpu, k, &mut caps);
        }
        assert_eq!(ix.engine_keys(), 4);
        assert_eq!(caps.get(Cap::EngineKeys), 7);
        assert!(!ix.blocks(Tier::Gpu).contains(&7));
    }

    #[test]
    fn removal_is_per_tier() {
        let (mut ix, mut caps) = (index(10, 10), CapsHit::default());
        ix.insert(1, Tier::Gpu, 7, &mut caps);
        ix.insert(1, Tier::Cpu, 7, &mut caps);
        ix.remove(1, Tier::Gpu);
        assert!(ix.blocks(Tier::Gpu).is_empty());
        assert_eq!(ix.blocks(Tier::Cpu), vec![7], "the offloaded copy stays");
    }
}
