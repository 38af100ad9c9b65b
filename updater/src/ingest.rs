//! Per-worker knowledge built from its event stream. Every stored block is re-hashed
//! canonically from its token ids with kvroute's chain hash and the worker's cache domain; the
//! engine's own hash values are only used as keys to find parents and removals.
//!
//! What the engines send, and how it is read:
//! - Engine pages (SGLang's page size, 1 by default; a vLLM group's block size) that divide
//!   kvroute's block size or are a multiple of it are re-chunked along the parent chain into
//!   kvroute-size blocks: a block is credited once the engine block completing it is held.
//!   Pages larger than kvroute's blocks credit each block they contain, so a prompt that
//!   diverges inside such a page is over-credited by less than one page.
//! - Stores and removals are reference-counted per (engine hash, tier, KV cache group).
//! - vLLM KV cache groups: only full-attention kinds (`full_attention`, `mla_attention`,
//!   `sink_full_attention`, or no kind announced) give prefix credit. Sliding-window,
//!   chunked-local, Mamba and other groups give none (a window only keeps the tail, so the
//!   honest simple choice is no credit at all); their events are counted, not indexed. The
//!   full-attention credit is not capped by what those groups still hold, although the
//!   engine's hit needs them too: hybrid models can be over-credited.
//! - `extra_key` (SGLang): in the default event format a namespaced node publishes the same
//!   hashes and fields as a plain one, so the updater cannot keep them apart; counting each
//!   store keeps one copy's eviction from dropping the other, but a plain request can still
//!   be credited with blocks only that namespace hits.
//! - vLLM's offloading placeholders (`token_ids=[]`, `block_size=0`) are matched by engine
//!   hash to a block already known, whose blocks the lower tier then holds too; unmatched
//!   ones are counted and ignored. (A chunk of several blocks is credited with the blocks of
//!   its last hash only: under-credit, never over-credit.)
//! - Lookahead hashing (vLLM's `lookahead_token_ids`, SGLang's `[t_i, t_i+1]` pairs under
//!   EAGLE/MTP): the engine's hash also covers the next token(s), but kvroute's router hashes
//!   the prompt's blocks on their own tokens, so the canonical hash is over the block's own
//!   tokens (one engine block per lookahead variant, all naming the same canonical block).
//!   A prompt diverging exactly at a block's end may be over-credited by that one block.
//! - Blocks held elsewhere (`locality: "REMOTE"`, SGLang's "EXTERNAL") and media nobody
//!   documents are counted and ignored, never taken as the worker's own GPU.
//! - `AllBlocksCleared` clears the GPU tier (vLLM keeps its offloaded CPU tier); SGLang's
//!   flush also clears its HiCache host tier ("CPU_PINNED"), which is cleared when that tier
//!   was seen; a medium named in the event clears that tier. (vLLM's reset with
//!   `reset_connector` also empties the offloading tier without a single event: those CPU
//!   blocks stay known until the caps forget them.)

use std::collections::BTreeMap;

use kvroute_core::decision::hash::{block_hash, CacheDomain};

use crate::blocks::{BlockIndex, ChainEnd};
use crate::decode::{Batch, EngineEvent, Place, Stored, Tier};
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
pub struct IngestStats {
    pub batches: u64,
    pub events: u64,
    pub gaps: u64,
    pub replays: u64,
    pub resyncs: u64,
    /// Times the live subscription was silent while replay held new batches (then renewed).
    pub resubscribes: u64,
    /// Stored blocks whose parent was unknown (missed events): not indexed.
    pub orphans: u64,
    /// Stored events whose block size neither divides kvroute's nor is a multiple of it: not
    /// indexed.
    pub block_size_mismatches: u64,
    pub unknown_events: u64,
    /// Replays whose window started later than asked (the engine's buffer rolled over): what
    /// they held was applied, what was known before stayed.
    pub rollovers: u64,
    /// Replays cut short by a replay cap.
    pub replays_cut: u64,
    /// Batches refused or undecodable (oversized, over a decoding cap, not msgpack, wrong
    /// shape).
    pub bad_batches: u64,
    /// ZMQ messages that are not a batch at all: no 8-byte sequence frame or no payload frame.
    pub malformed_messages: u64,
    /// Events whose fields could not be read: skipped, the rest of their batch applied.
    pub bad_events: u64,
    /// Batches all of whose events were refused (bad, orphaned, block size): they do not move
    /// the last-event time.
    pub refused_batches: u64,
    /// Stores whose engine pages are not kvroute's block size, re-chunked into kvroute blocks.
    pub rechunked_stores: u64,
    /// vLLM offloading placeholders (no token ids) matched by engine hash to a known block.
    pub offload_stores_matched: u64,
    /// vLLM offloading placeholders whose engine hash was not known: ignored.
    pub offload_stores_unmatched: u64,
    /// Stores in KV cache groups that give no prefix credit (sliding window, Mamba, ...).
    pub no_credit_group_stores: u64,
    /// Stores whose hashes cover lookahead tokens (EAGLE/MTP): canonical on the block's own
    /// tokens.
    pub lookahead_stores: u64,
    /// Stores and removals of blocks held elsewhere (`locality: "REMOTE"`, "EXTERNAL"):
    /// ignored.
    pub remote_events: u64,
    /// Stores and removals with a medium no engine documents: ignored.
    pub unknown_medium_events: u64,
    /// Removals of a block not known on that tier and group.
    pub unknown_removals: u64,
    /// How often each cap was hit.
    pub caps_hit: CapsHit,
    /// Unix ms of the last applied batch. Only events move it, never a resync, nor a batch
    /// whose events were all refused.
    pub last_event_ms: u64,
    /// Unix ms of the last resync: blocks known before it are as of this time (what was
    /// removed in batches the updater could not get is unknown).
    pub last_resync_ms: u64,
}

/// Whether a vLLM KV cache group of `kind` gives prefix credit (no kind: older releases and
/// SGLang, one full-attention cache).
fn kind_gives_credit(kind: Option<&str>) -> bool {
    matches!(kind, None | Some("full_attention" | "mla_attention" | "sink_full_attention"))
}

/// One worker's knowledge.
#[derive(Debug, Default)]
pub struct WorkerKnowledge {
    pub next_seq: Option<u64>,
    /// Sequence number and payload digest of the last applied batch: a replay that starts
    /// with it again proves the publisher's history continues (same process).
    pub last_applied: Option<(u64, u64)>,
    index: BlockIndex,
    /// vLLM KV cache groups' kinds, as their stores announced them.
    kinds: BTreeMap<u32, String>,
    /// The host tier is SGLang's HiCache ("CPU_PINNED"): a cache flush clears it too.
    host_follows_flush: bool,
    pub stats: IngestStats,
}

/// Whether an event was taken (false: refused and counted).
type Taken = bool;

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

    /// Forgets every block (publisher restart, worker removed, domain change).
    pub fn clear(&mut self) {
        self.index.clear();
        self.kinds.clear();
        self.host_follows_flush = false;
    }

    /// Blocks per tier.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        self.index.counts().into_iter().map(|(t, n)| (t.name(), n)).collect()
    }

    /// Whether no block is known on any tier.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Holds (engine hash, tier, group) known, all tiers.
    pub fn engine_keys(&self) -> usize {
        self.index.engine_keys()
    }

    pub fn blocks(&self, tier: Tier) -> Vec<u64> {
        self.index.blocks(tier)
    }

    /// The KV cache groups' kinds learned from stores (for `/status`).
    pub fn group_kinds(&self) -> &BTreeMap<u32, String> {
        &self.kinds
    }

    /// Applies batch `seq` (already checked); `stamp_ms` is when it was observed (the last
    /// event time never goes back, and a batch whose events were all refused leaves it).
    pub fn apply(&mut self, seq: u64, batch: &Batch, domain: &DomainBase, stamp_ms: u64) {
        self.next_seq = Some(seq + 1);
        self.stats.batches += 1;
        let mut taken = batch.events.is_empty();
        for e in &batch.events {
            self.stats.events += 1;
            taken |= match e {
                EngineEvent::Stored(s) => self.store(s, domain),
                EngineEvent::Removed { hashes, place, group } => {
                    let group = group.unwrap_or(0);
                    let credited = kind_gives_credit(self.kinds.get(&group).map(String::as_str));
                    if let Some(tier) = self.own_tier(*place) {
                        for k in hashes {
                            if !self.index.remove(*k, tier, group) && credited {
                                self.stats.unknown_removals += 1;
                            }
                        }
                    }
                    true
                }
                EngineEvent::AllCleared { place } => {
                    match place.map(|p| self.own_tier(p)) {
                        None => {
                            self.index.clear_tier(Tier::Gpu);
                            if self.host_follows_flush {
                                self.index.clear_tier(Tier::Cpu);
                            }
                        }
                        Some(Some(tier)) => self.index.clear_tier(tier),
                        Some(None) => {}
                    }
                    true
                }
                EngineEvent::Unknown(_) => {
                    self.stats.unknown_events += 1;
                    true
                }
                EngineEvent::Bad(_) => {
                    self.stats.bad_events += 1;
                    false
                }
            };
        }
        if taken {
            self.stats.last_event_ms = self.stats.last_event_ms.max(stamp_ms);
        } else {
            self.stats.refused_batches += 1;
        }
    }

    /// The worker's own tier at `place`; events elsewhere are counted and ignored.
    fn own_tier(&mut self, place: Place) -> Option<Tier> {
        match place {
            Place::Remote => self.stats.remote_events += 1,
            Place::Unknown => self.stats.unknown_medium_events += 1,
            Place::HostPinned => self.host_follows_flush = true,
            _ => {}
        }
        place.tier()
    }

    /// Whether `group` gives prefix credit; learns its kind when the store names one (a group
    /// that turns out to give none forgets what was indexed for it).
    fn group_credit(&mut self, group: u32, kind: Option<&str>) -> bool {
        if let Some(kind) = kind {
            if self.kinds.get(&group).map(String::as_str) != Some(kind) {
                let before = kind_gives_credit(self.kinds.get(&group).map(String::as_str));
                self.kinds.insert(group, kind.to_owned());
                if before && !kind_gives_credit(Some(kind)) {
                    self.index.clear_group(group);
                }
            }
        }
        kind_gives_credit(self.kinds.get(&group).map(String::as_str))
    }

    fn store(&mut self, s: &Stored, domain: &DomainBase) -> Taken {
        let Some(tier) = self.own_tier(s.place) else {
            return true;
        };
        let group = s.group.unwrap_or(0);
        if !self.group_credit(group, s.kind.as_deref()) {
            self.stats.no_credit_group_stores += 1;
            return true;
        }
        if s.token_ids.is_empty() {
            // vLLM's offloading placeholder (`block_size` 0), or a connector's store without
            // tokens (Mooncake's): only the engine hash.
            for k in &s.hashes {
                match self.index.known(*k, group) {
                    Some((end, blocks)) => {
                        self.stats.offload_stores_matched += 1;
                        let caps = &mut self.stats.caps_hit;
                        self.index.store(*k, tier, group, end, &blocks, caps);
                    }
                    None => self.stats.offload_stores_unmatched += 1,
                }
            }
            return true;
        }
        let (page, block) = (s.block_size, domain.block_size as usize);
        if page == 0 || block == 0 || s.token_ids.len() != s.hashes.len() * page {
            self.stats.orphans += s.hashes.len() as u64;
            return false;
        }
        if page != block {
            if page % block != 0 && block % page != 0 {
                self.stats.block_size_mismatches += 1;
                return false;
            }
            self.stats.rechunked_stores += 1;
        }
        self.stats.lookahead_stores += u64::from(s.lookahead);
        let start = match s.parent {
            None => ChainEnd {
                canonical: domain.seed(s.salt.as_deref(), s.lora_name.as_deref()),
                pending: Box::new([]),
            },
            Some(p) => match self.index.chain_end(p) {
                Some(end) => end,
                None => {
                    self.stats.orphans += s.hashes.len() as u64;
                    return false;
                }
            },
        };
        let (mut canonical, mut pending) = (start.canonical, start.pending.into_vec());
        let chain: Vec<_> = s
            .hashes
            .iter()
            .zip(s.token_ids.chunks_exact(page))
            .map(|(k, tokens)| {
                pending.extend_from_slice(tokens);
                let mut blocks = Vec::new();
                for full in pending.chunks_exact(block) {
                    canonical = block_hash(canonical, full);
                    blocks.push(canonical);
                }
                pending.drain(..pending.len() - pending.len() % block);
                let end = ChainEnd { canonical, pending: pending.clone().into_boxed_slice() };
                (*k, end, blocks)
            })
            .collect();
        // Tail first, so that under a cap a prefix's head outlives its tail (see `blocks`).
        for (k, end, blocks) in chain.into_iter().rev() {
            self.index.store(k, tier, group, end, &blocks, &mut self.stats.caps_hit);
        }
        true
    }
}

#[cfg(test)]
mod tests;
