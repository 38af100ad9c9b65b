//! Prefix lookups for a whole pool at once, driven by the [`Holders`](super::holders::Holders) of each prompt block:
//! a block is looked up once, and only the workers that hold it are visited. A block nobody
//! holds ends every match with one probe, whatever the pool's size.

use super::{KnowledgeIndex, PrefixMatch, Walk};

/// Not a worker in the index.
const NONE: u32 = u32::MAX;
/// A slot no asked worker has.
const NOT_ASKED: u32 = u32::MAX;
/// A slot asked about whose match has not started.
const ASKED: u32 = u32::MAX - 1;

impl KnowledgeIndex {
    /// [`KnowledgeIndex::prefix_match`] of each of `workers`, given by their
    /// [`worker_key`](crate::decision::load::worker_key) (`out[i]` for `workers[i]`), equal to
    /// asking for each in turn.
    pub fn prefix_matches(&self, workers: &[u64], hashes: &[u64], now_ms: u64) -> Vec<PrefixMatch> {
        // Each asked worker's slot id (NONE: not in the index); a worker named twice shares
        // its slot's match.
        let ids: Vec<u32> =
            workers.iter().map(|w| self.ids.get(w).copied().unwrap_or(NONE)).collect();
        // Slot id -> NOT_ASKED, ASKED, or the position of its match in `visited`. A match (and
        // its walk) starts when its worker is met as a holder of the prompt's first block, so
        // `visited` is in slot order, the order of holder lists: a block many workers share is
        // credited in memory order, and a worker that holds none of the prompt is never read.
        let mut state = vec![NOT_ASKED; self.slots.len()];
        for &id in &ids {
            if let Some(s) = state.get_mut(id as usize) {
                *s = ASKED;
            }
        }
        let mut visited: Vec<(PrefixMatch, Walk<'_>)> = Vec::new();
        for (b, &h) in hashes.iter().enumerate() {
            let mut advanced = false;
            for holder in self.holders.get(h) {
                let id = holder.id() as usize;
                let Some(s) = state.get_mut(id) else { continue };
                // Only a worker that matched every block before this one continues.
                if *s == ASKED {
                    let slot = self.slots.get(id).and_then(Option::as_ref);
                    let Some(slot) = slot.filter(|_| b == 0) else { continue };
                    *s = visited.len() as u32;
                    visited.push((PrefixMatch::default(), Walk::new(self, slot, now_ms)));
                }
                let Some((m, walk)) = visited.get_mut(*s as usize) else { continue };
                if m.blocks != b {
                    continue;
                }
                advanced |= walk.credit(h, holder.flags(), m);
            }
            if !advanced {
                break;
            }
        }
        ids.iter()
            .map(|&id| {
                let at = state.get(id as usize).copied().unwrap_or(NOT_ASKED);
                let mut m = visited.get(at as usize).map(|v| v.0).unwrap_or_default();
                self.fade(&mut m, now_ms);
                m
            })
            .collect()
    }
}
