//! Prefix lookups for a whole pool at once, driven by the [`Holders`](super::holders::Holders) of each prompt block:
//! a block is looked up once, and only the workers that hold it are visited. A block nobody
//! holds ends every match with one probe, whatever the pool's size.
//!
//! A block every worker shares (a system prompt) is credited once per holder, so the loop over
//! a holder list reads only a small [`Progress`] per slot: a block on the GPU tier of a fresh
//! event view (the common case) is counted there. Only the other cases read the worker's slot,
//! through its [`Walk`], made the first time one is needed.

use super::{fade, holders::GPU, KnowledgeIndex, PrefixMatch, Walk};

/// A slot no asked worker has (also: a worker not in the index).
const NOT_ASKED: u32 = u32::MAX;
/// A slot asked about whose match has not started.
const ASKED: u32 = u32::MAX - 1;
/// A slot whose match started and has no [`Walk`] yet (every block so far was counted in its
/// [`Progress`]).
const STARTED: u32 = u32::MAX - 2;

/// One slot's match as the loop over holders sees it (16 bytes: a thousand workers' fit in
/// L1).
#[derive(Debug, Clone, Copy)]
struct Progress {
    /// [`NOT_ASKED`], [`ASKED`], [`STARTED`], or the position of the slot's match and walk.
    at: u32,
    /// Leading blocks credited so far (the match's `blocks`).
    blocks: u32,
    /// How many of them were credited from the fresh event view's GPU tier here, not through
    /// [`Walk::credit`]: added to the match's `from_events` at the end.
    gpu: u32,
    /// The slot has an event view and it counts (as [`Walk`]'s `events`).
    fresh: bool,
}

impl KnowledgeIndex {
    /// [`KnowledgeIndex::prefix_match`] of each of `workers`, given by their
    /// [`worker_key`](crate::decision::load::worker_key) (`out[i]` for `workers[i]`), equal to
    /// asking for each in turn. Empty when nobody holds the prompt's first block: then every
    /// worker's match is the default one, and a large pool's miss writes no match at all.
    pub fn prefix_matches(
        &self,
        workers: impl IntoIterator<Item = u64>,
        hashes: &[u64],
        now_ms: u64,
    ) -> Vec<PrefixMatch> {
        // A prompt whose first block nobody holds matches nowhere: no worker's slot is read
        // (a miss costs one probe, whatever the pool's size).
        let first = hashes.first().map_or(&[][..], |&h| self.holders.get(h));
        if first.is_empty() {
            return Vec::new();
        }
        // Each asked worker's slot id; a worker named twice shares its slot's match.
        let ids: Vec<u32> =
            workers.into_iter().map(|w| self.ids.get(&w).copied().unwrap_or(NOT_ASKED)).collect();
        let idle = Progress { at: NOT_ASKED, blocks: 0, gpu: 0, fresh: false };
        let mut progress = vec![idle; self.slots.len()];
        for &id in &ids {
            if let Some(p) = progress.get_mut(id as usize) {
                p.at = ASKED;
            }
        }
        // A match starts when its worker is met as a holder of the prompt's first block, so
        // `walks` are in slot order, the order of holder lists, and a worker that holds none of
        // the prompt is never read.
        let fresh = self.event_state(now_ms).1;
        let mut walks: Vec<(PrefixMatch, Walk<'_>)> = Vec::new();
        for (b, &h) in (0..u32::MAX).zip(hashes) {
            let mut advanced = false;
            // The first block's holders were read above.
            let holders = if b == 0 { first } else { self.holders.get(h) };
            for holder in holders {
                let id = holder.id() as usize;
                let Some(p) = progress.get_mut(id) else { continue };
                if p.at == ASKED && b == 0 {
                    p.at = STARTED;
                    p.fresh = fresh && self.events_at.get(id).is_some_and(Option::is_some);
                }
                // Only a started match that credited every block before this one continues.
                if p.at >= ASKED || p.blocks != b {
                    continue;
                }
                // `Walk::credit`'s first case, counted without reading the slot.
                if p.fresh && holder.flags() & GPU != 0 {
                    p.blocks += 1;
                    p.gpu += 1;
                    advanced = true;
                    continue;
                }
                if p.at == STARTED {
                    let Some(slot) = self.slots.get(id).and_then(Option::as_ref) else { continue };
                    p.at = walks.len() as u32;
                    walks.push((PrefixMatch::default(), Walk::new(self, slot, now_ms)));
                }
                let Some((m, walk)) = walks.get_mut(p.at as usize) else { continue };
                if walk.credit(h, holder.flags(), m) {
                    p.blocks += 1;
                    advanced = true;
                }
            }
            if !advanced {
                break;
            }
        }
        let weight = self.event_weight(now_ms);
        ids.iter()
            .map(|&id| {
                let p = progress.get(id as usize).unwrap_or(&idle);
                if p.at >= ASKED {
                    return PrefixMatch::default();
                }
                let credited = walks.get(p.at as usize).map(|w| w.0).unwrap_or_default();
                let mut m = PrefixMatch { blocks: p.blocks as usize, ..credited };
                if p.gpu > 0 {
                    let at = self.events_at.get(id as usize).copied().flatten().unwrap_or(now_ms);
                    m.from_events += p.gpu as usize;
                    m.oldest_age_ms = m.oldest_age_ms.max(now_ms.saturating_sub(at));
                }
                fade(&mut m, weight);
                m
            })
            .collect()
    }
}
