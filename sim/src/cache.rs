//! The paged prefix cache of one simulated worker, with vLLM's semantics: only full blocks are
//! cached; blocks in use are reference-counted; a block whose last user finished stays cached
//! in an LRU free list until it is reallocated; `cached_tokens` is the longest cached
//! block-aligned prefix.
//!
//! The engine's own block identity is SipHash (std's `DefaultHasher`) over the parent, the
//! tokens, the LoRA adapter (every block, as in vLLM's extra keys) and, on block 0, the salt:
//! deliberately a different algorithm from kvroute's xxh3 chain, so the router can never
//! depend on engine hash values.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use hashlink::LinkedHashMap;
use thiserror::Error;

pub type EngineHash = u64;

/// The engine's hash of one block: its parent's hash (none for block 0), its tokens, the
/// request's LoRA adapter, and for block 0 the request's `cache_salt`.
pub fn engine_block_hash(
    parent: Option<EngineHash>,
    block: &[u32],
    salt: Option<&str>,
    lora: Option<&str>,
) -> EngineHash {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    block.hash(&mut h);
    lora.hash(&mut h);
    if parent.is_none() {
        salt.hash(&mut h);
    }
    h.finish()
}

/// The engine's block hashes of `tokens` (full blocks only).
pub fn engine_hashes(
    tokens: &[u32],
    block_size: usize,
    salt: Option<&str>,
    lora: Option<&str>,
) -> Vec<EngineHash> {
    let mut parent = None;
    tokens
        .chunks_exact(block_size.max(1))
        .map(|block| {
            let h = engine_block_hash(parent, block, salt, lora);
            parent = Some(h);
            h
        })
        .collect()
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CacheError {
    #[error("out of KV blocks")]
    OutOfBlocks,
}

/// Block manager: `capacity` blocks, each either in use (ref count > 0) or free-but-cached.
#[derive(Debug, Clone)]
pub struct BlockCache {
    capacity: usize,
    in_use: HashMap<EngineHash, u32>,
    free_cached: LinkedHashMap<EngineHash, ()>,
    /// Blocks in use that hold no cacheable content (partial blocks, not yet full).
    anonymous_in_use: usize,
    /// Counters for metrics.
    pub queries_tokens: u64,
    pub hits_tokens: u64,
}

impl BlockCache {
    pub fn new(capacity: usize) -> Self {
        BlockCache {
            capacity,
            in_use: HashMap::new(),
            free_cached: LinkedHashMap::new(),
            anonymous_in_use: 0,
            queries_tokens: 0,
            hits_tokens: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks held by running requests.
    pub fn used(&self) -> usize {
        self.in_use.len() + self.anonymous_in_use
    }

    /// Blocks cached (in use or free).
    pub fn cached_blocks(&self) -> usize {
        self.in_use.len() + self.free_cached.len()
    }

    /// Leading blocks of `hashes` present in the cache.
    pub fn longest_prefix(&self, hashes: &[EngineHash]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.in_use.contains_key(h) || self.free_cached.contains_key(h))
            .count()
    }

    /// Takes a reference on `hashes[..n]` (all must be cached) and on `extra` fresh blocks
    /// for the rest of the request. Evicts free cached blocks (LRU) to make room; returns the
    /// engine hashes it evicted.
    pub fn acquire(
        &mut self,
        hashes: &[EngineHash],
        extra: usize,
    ) -> Result<Vec<EngineHash>, CacheError> {
        let reuse_free = hashes.iter().filter(|h| self.free_cached.contains_key(h)).count();
        let needed_fresh = extra;
        // Reused free blocks move to in_use, so they stop being evictable.
        let evictable = self.free_cached.len() - reuse_free;
        let truly_free = self.capacity - self.used() - self.free_cached.len();
        if needed_fresh > truly_free + evictable {
            return Err(CacheError::OutOfBlocks);
        }
        for h in hashes {
            if self.free_cached.remove(h).is_some() {
                self.in_use.insert(*h, 1);
            } else if let Some(rc) = self.in_use.get_mut(h) {
                *rc += 1;
            }
        }
        let mut evicted = Vec::new();
        let mut free_now = truly_free;
        while free_now < needed_fresh {
            if let Some((h, ())) = self.free_cached.pop_front() {
                evicted.push(h);
                free_now += 1;
            } else {
                break;
            }
        }
        self.anonymous_in_use += needed_fresh;
        Ok(evicted)
    }

    /// A fresh block of a request became full with content `hash`: it is now cached. If an
    /// identical block is already cached the request shares it and the fresh block is freed.
    /// Returns true when the block is newly stored.
    pub fn fill(&mut self, hash: EngineHash) -> bool {
        self.anonymous_in_use = self.anonymous_in_use.saturating_sub(1);
        if let Some(rc) = self.in_use.get_mut(&hash) {
            *rc += 1;
            return false;
        }
        if self.free_cached.remove(&hash).is_some() {
            self.in_use.insert(hash, 1);
            return false;
        }
        self.in_use.insert(hash, 1);
        true
    }

    /// Drops a request's references: `hashes` (its full, cached blocks, head first) and
    /// `anonymous` fresh blocks that never filled. As in vLLM's KV cache manager, the blocks are
    /// freed tail first: the last block of the request enters the free queue first and is
    /// evicted first, so under pressure a prefix loses its tail before its head.
    pub fn release(&mut self, hashes: &[EngineHash], anonymous: usize) {
        for h in hashes.iter().rev() {
            if let Some(rc) = self.in_use.get_mut(h) {
                *rc -= 1;
                if *rc == 0 {
                    self.in_use.remove(h);
                    self.free_cached.insert(*h, ());
                }
            }
        }
        self.anonymous_in_use = self.anonymous_in_use.saturating_sub(anonymous);
    }

    /// Evicts up to `n` free cached blocks, least recently used first; returns them.
    pub fn evict_free(&mut self, n: usize) -> Vec<EngineHash> {
        (0..n).map_while(|_| self.free_cached.pop_front().map(|(h, ())| h)).collect()
    }

    /// Free cached blocks (evictable).
    pub fn free_cached_len(&self) -> usize {
        self.free_cached.len()
    }

    /// Every cached block hash (in use or free), for consistency checks.
    pub fn cached_set(&self) -> std::collections::BTreeSet<EngineHash> {
        self.in_use.keys().chain(self.free_cached.keys()).copied().collect()
    }

    #[cfg(test)]
    pub fn ref_total(&self) -> u64 {
        self.in_use.values().map(|&r| u64::from(r)).sum::<u64>() + self.anonymous_in_use as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn finished_blocks_stay_cached_until_reallocated() {
        let mut c = BlockCache::new(4);
        let h = engine_hashes(&[1, 2, 3, 4, 5, 6, 7, 8], 4, None, None);
        c.acquire(&[], 2).unwrap();
        assert!(c.fill(h[0]) && c.fill(h[1]));
        c.release(&h, 0);
        assert_eq!(c.longest_prefix(&h), 2);
        // Another request needs all 4 blocks: the two cached ones are evicted, tail first.
        let evicted = c.acquire(&[], 4).unwrap();
        assert_eq!(evicted, vec![h[1], h[0]]);
        assert_eq!(c.longest_prefix(&h), 0);
        assert_eq!(c.acquire(&[], 1), Err(CacheError::OutOfBlocks));
    }

    /// vLLM frees a request's blocks tail first, so eviction takes a prefix's tail blocks
    /// before its head: a later request with the same prefix still hits the leading blocks.
    #[test]
    fn under_pressure_a_prefix_loses_its_tail_before_its_head() {
        let mut c = BlockCache::new(8);
        let prompt: Vec<u32> = (0..24).collect();
        let h = engine_hashes(&prompt, 4, None, None);
        c.acquire(&[], 6).unwrap();
        for x in &h {
            assert!(c.fill(*x));
        }
        c.release(&h, 0);
        // Another request needs 5 fresh blocks: 2 are truly free, 3 cached ones must go.
        let evicted = c.acquire(&[], 5).unwrap();
        assert_eq!(evicted, vec![h[5], h[4], h[3]]);
        assert_eq!(c.longest_prefix(&h), 3, "the head blocks were evicted before the tail");
    }

    #[test]
    fn salt_changes_every_block() {
        let a = engine_hashes(&[1, 2, 3, 4, 5, 6, 7, 8], 4, None, None);
        let b = engine_hashes(&[1, 2, 3, 4, 5, 6, 7, 8], 4, Some("t"), None);
        assert!(a.iter().all(|h| !b.contains(h)));
    }

    #[test]
    fn each_adapter_is_a_cache_domain_of_its_own() {
        let t = [1, 2, 3, 4, 5, 6, 7, 8];
        let base = engine_hashes(&t, 4, None, None);
        let sql = engine_hashes(&t, 4, None, Some("sql"));
        let chat = engine_hashes(&t, 4, None, Some("chat"));
        for (x, y) in [(&base, &sql), (&base, &chat), (&sql, &chat)] {
            assert!(x.iter().all(|h| !y.contains(h)));
        }
        assert_eq!(sql, engine_hashes(&t, 4, None, Some("sql")));
    }

    proptest! {
        /// Random request lifecycles never leak blocks, never exceed capacity, and leave no
        /// references once every request has finished.
        #[test]
        fn no_leaks_and_bounded(reqs in proptest::collection::vec((0u32..6, 1usize..6), 1..40)) {
            let mut c = BlockCache::new(12);
            let mut live: Vec<(Vec<EngineHash>, usize)> = Vec::new();
            for (i, (prefix, blocks)) in reqs.into_iter().enumerate() {
                let tokens: Vec<u32> = (0..blocks as u32 * 2).map(|t| if t < 4 { prefix } else { t + i as u32 * 100 }).collect();
                let hashes = engine_hashes(&tokens, 2, None, None);
                let hit = c.longest_prefix(&hashes);
                prop_assert!(hit <= hashes.len());
                if c.acquire(&hashes[..hit], hashes.len() - hit).is_err() {
                    if let Some((h, _)) = live.pop() { c.release(&h, 0); }
                    continue;
                }
                for h in &hashes[hit..] { c.fill(*h); }
                prop_assert!(c.used() <= c.capacity());
                prop_assert!(c.cached_blocks() <= c.capacity());
                live.push((hashes, 0));
                if i % 3 == 0 {
                    let (h, a) = live.remove(0);
                    c.release(&h, a);
                }
            }
            for (h, a) in live.drain(..) { c.release(&h, a); }
            prop_assert_eq!(c.ref_total(), 0);
            prop_assert_eq!(c.used(), 0);
        }
    }
}
