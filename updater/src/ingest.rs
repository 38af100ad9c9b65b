//! Per-worker knowledge built from its event stream. Every stored block is re-hashed
//! canonically from its token ids with kvroute's chain hash and the worker's cache domain; the
//! engine's own hash values are only used as keys to find parents and removals.

use std::collections::BTreeMap;

use kvroute_core::hash::{block_hash, CacheDomain};

use crate::blocks::BlockIndex;
use crate::decode::{Batch, EngineEvent, EngineKey, Tier};
use crate::limits::{BlockLimits, CapsHit};

/// What kvroute's hashing needs to know about the served model (the tenant salt comes from
/// each chain's first block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainBase {
    pub model: String,
    pub tokenizer_fingerprint: u64,
    pub block_size: u32,
    pub lora_name: Option<String>,
}

impl DomainBase {
    pub fn seed(&self, salt: Option<&str>, lora: Option<&str>) -> u64 {
        CacheDomain {
            model: self.model.clone(),
            tokenizer_fingerprint: self.tokenizer_fingerprint,
            block_size: self.block_size,
            lora_name: lora.map(str::to_owned).or_else(|| self.lora_name.clone()),
            tenant_salt: salt.map(str::to_owned),
        }
        .seed()
    }
}

/// Where a sequence number stands relative to the stream so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqCheck {
    /// The next expected one (or the first ever seen).
    InOrder,
    /// Batches `from..to` were missed.
    Gap { from: u64, to: u64 },
    /// The publisher restarted (the sequence went back: PUB never repeats a batch).
    Restart,
}

/// Counters for `/status` and metrics.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct WorkerStats {
    pub batches: u64,
    pub events: u64,
    pub gaps: u64,
    pub replays: u64,
    pub resyncs: u64,
    /// Times the live subscription was silent while replay held new batches (then renewed).
    pub resubscribes: u64,
    /// Stored blocks whose parent was unknown (missed events): not indexed.
    pub orphans: u64,
    /// Stored events whose block size differs from kvroute's: not indexed.
    pub block_size_mismatches: u64,
    pub unknown_events: u64,
    /// Replays whose window started later than asked (the engine's buffer rolled over): what
    /// they held was applied, what was known before stayed.
    pub rollovers: u64,
    /// Replays cut short by a replay cap.
    pub replays_cut: u64,
    /// Batches refused or undecodable (oversized, not msgpack, wrong shape).
    pub bad_batches: u64,
    /// How often each cap was hit.
    pub caps_hit: CapsHit,
    /// Unix ms of the last applied batch. Only events move it, never a resync.
    pub last_event_ms: u64,
    /// Unix ms of the last resync: blocks known before it are as of this time (what was
    /// removed in batches the updater could not get is unknown).
    pub last_resync_ms: u64,
}

/// One worker's knowledge.
#[derive(Debug, Default)]
pub struct WorkerKnowledge {
    pub next_seq: Option<u64>,
    /// Sequence number and payload digest of the last applied batch: a replay that starts
    /// with it again proves the publisher's history continues (same process).
    pub last_applied: Option<(u64, u64)>,
    index: BlockIndex,
    pub stats: WorkerStats,
}

impl WorkerKnowledge {
    /// Classifies `seq`; the caller replays or resyncs as told, then calls [`apply`].
    pub fn check(&self, seq: u64) -> SeqCheck {
        match self.next_seq {
            // The first batch seen: anything published before it is fetched from replay.
            None if seq > 0 => SeqCheck::Gap { from: 0, to: seq },
            None => SeqCheck::InOrder,
            Some(next) if seq == next => SeqCheck::InOrder,
            Some(next) if seq > next => SeqCheck::Gap { from: next, to: seq },
            Some(_) => SeqCheck::Restart,
        }
    }

    /// Knowledge bounded by `limits`.
    pub fn with_limits(limits: BlockLimits) -> WorkerKnowledge {
        WorkerKnowledge { index: BlockIndex::new(limits), ..Default::default() }
    }

    /// Forgets every block (publisher restart, worker removed, cache reset).
    pub fn clear(&mut self) {
        self.index.clear();
    }

    /// Blocks per tier.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        self.index.counts().into_iter().map(|(t, n)| (t.name(), n)).collect()
    }

    /// Whether no block is known on any tier.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Engine hashes mapped to canonical ones (all tiers).
    pub fn engine_keys(&self) -> usize {
        self.index.engine_keys()
    }

    pub fn blocks(&self, tier: Tier) -> Vec<u64> {
        self.index.blocks(tier)
    }

    /// Applies batch `seq` (already checked); `stamp_ms` is when it was observed (the last
    /// event time never goes back).
    pub fn apply(&mut self, seq: u64, batch: &Batch, domain: &DomainBase, stamp_ms: u64) {
        self.next_seq = Some(seq + 1);
        self.stats.batches += 1;
        self.stats.last_event_ms = self.stats.last_event_ms.max(stamp_ms);
        for e in &batch.events {
            self.stats.events += 1;
            match e {
                EngineEvent::Stored {
                    hashes,
                    parent,
                    token_ids,
                    block_size,
                    tier,
                    lora_name,
                    salt,
                } => self.store(
                    hashes,
                    *parent,
                    token_ids,
                    *block_size,
                    *tier,
                    lora_name.as_deref(),
                    salt.as_deref(),
                    domain,
                ),
                EngineEvent::Removed { hashes, tier } => {
                    for k in hashes {
                        self.index.remove(*k, *tier);
                    }
                }
                EngineEvent::AllCleared => self.clear(),
                EngineEvent::Unknown(_) => self.stats.unknown_events += 1,
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn store(
        &mut self,
        hashes: &[EngineKey],
        parent: Option<EngineKey>,
        tokens: &[u32],
        block_size: usize,
        tier: Tier,
        lora: Option<&str>,
        salt: Option<&str>,
        domain: &DomainBase,
    ) {
        if block_size != domain.block_size as usize {
            self.stats.block_size_mismatches += 1;
            return;
        }
        if block_size == 0 || tokens.len() != hashes.len() * block_size {
            self.stats.orphans += hashes.len() as u64;
            return;
        }
        let mut canonical = match parent {
            None => domain.seed(salt, lora),
            Some(p) => match self.index.parent(p, tier) {
                Some(c) => c,
                None => {
                    self.stats.orphans += hashes.len() as u64;
                    return;
                }
            },
        };
        let chain: Vec<(EngineKey, u64)> = hashes
            .iter()
            .zip(tokens.chunks_exact(block_size))
            .map(|(k, block)| {
                canonical = block_hash(canonical, block);
                (*k, canonical)
            })
            .collect();
        // Tail first, so that under a cap a prefix's head outlives its tail (see `blocks`).
        for (k, c) in chain.into_iter().rev() {
            self.index.insert(k, tier, c, &mut self.stats.caps_hit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_core::hash::block_hashes;

    fn domain() -> DomainBase {
        DomainBase { model: "m".into(), tokenizer_fingerprint: 1, block_size: 4, lora_name: None }
    }

    fn stored(
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        salt: Option<&str>,
    ) -> Batch {
        Batch {
            ts: 0.0,
            rank: None,
            events: vec![EngineEvent::Stored {
                hashes,
                parent,
                token_ids: tokens,
                block_size: 4,
                tier: Tier::Gpu,
                lora_name: None,
                salt: salt.map(str::to_owned),
            }],
        }
    }

    #[test]
    fn canonical_hashes_equal_the_routers_whatever_the_engine_hashes() {
        let d = domain();
        let tokens: Vec<u32> = (0..12).collect();
        let mut w = WorkerKnowledge::default();
        // The engine publishes the chain in two events with its own (arbitrary) hashes.
        w.apply(0, &stored(vec![900, 901], None, tokens[..8].to_vec(), Some("t")), &d, 1);
        w.apply(1, &stored(vec![902], Some(901), tokens[8..].to_vec(), None), &d, 2);
        let want = block_hashes(d.seed(Some("t"), None), 4, &tokens);
        let mut want_sorted = want.clone();
        want_sorted.sort_unstable();
        assert_eq!(w.blocks(Tier::Gpu), want_sorted);
        // Removal by engine hash.
        w.apply(
            2,
            &Batch {
                ts: 0.0,
                rank: None,
                events: vec![EngineEvent::Removed { hashes: vec![902], tier: Tier::Gpu }],
            },
            &d,
            3,
        );
        assert_eq!(w.blocks(Tier::Gpu).len(), 2);
        assert!(!w.blocks(Tier::Gpu).contains(&want[2]));
    }

    #[test]
    fn orphans_and_mismatches_are_counted_not_indexed() {
        let d = domain();
        let mut w = WorkerKnowledge::default();
        w.apply(0, &stored(vec![5], Some(77), vec![1, 2, 3, 4], None), &d, 1);
        assert_eq!(w.stats.orphans, 1);
        let mut b = stored(vec![6], None, vec![1, 2, 3, 4, 5, 6, 7, 8], None);
        if let EngineEvent::Stored { block_size, .. } = &mut b.events[0] {
            *block_size = 8;
        }
        w.apply(1, &b, &d, 2);
        assert_eq!(w.stats.block_size_mismatches, 1);
        assert!(w.blocks(Tier::Gpu).is_empty());
    }

    #[test]
    fn sequence_checks() {
        let mut w = WorkerKnowledge::default();
        assert_eq!(w.check(0), SeqCheck::InOrder);
        assert_eq!(w.check(5), SeqCheck::Gap { from: 0, to: 5 });
        w.next_seq = Some(6);
        assert_eq!(w.check(6), SeqCheck::InOrder);
        assert_eq!(w.check(9), SeqCheck::Gap { from: 6, to: 9 });
        assert_eq!(w.check(0), SeqCheck::Restart);
        assert_eq!(w.check(3), SeqCheck::Restart);
    }
}
