//! Prefix lookups for a whole pool at once, driven by the [`Holders`](super::holders::Holders) of each prompt block:
//! a block is looked up once, and only the workers that hold it are visited. A block nobody
//! holds ends every match with one probe, whatever the pool's size.

use super::{KnowledgeIndex, PrefixMatch, Walk};

/// Not a worker asked about.
const NONE: u32 = u32::MAX;

impl KnowledgeIndex {
    /// [`KnowledgeIndex::prefix_match`] of each of `workers`, given by their
    /// [`worker_key`](crate::decision::load::worker_key) (`out[i]` for `workers[i]`), equal to
    /// asking for each in turn.
    pub fn prefix_matches(&self, workers: &[u64], hashes: &[u64], now_ms: u64) -> Vec<PrefixMatch> {
        // Each asked worker's slot id (NONE: not in the index). The matches are kept by slot
        // id: holder lists are sorted by id, so a block many workers share is credited in
        // memory order. A worker named twice shares its slot's match.
        let ids: Vec<u32> =
            workers.iter().map(|w| self.ids.get(w).copied().unwrap_or(NONE)).collect();
        let mut asked = vec![false; self.slots.len()];
        for &id in &ids {
            if let Some(a) = asked.get_mut(id as usize) {
                *a = true;
            }
        }
        // A slot's walk is set up when one of its blocks is first met: a worker that holds
        // none of the prompt is never read.
        let mut state: Vec<(PrefixMatch, Option<Walk<'_>>)> = Vec::new();
        state.resize_with(self.slots.len(), Default::default);
        for (b, &h) in hashes.iter().enumerate() {
            let mut advanced = false;
            for holder in self.holders.get(h) {
                let id = holder.id() as usize;
                let (Some(true), Some((m, walk))) = (asked.get(id), state.get_mut(id)) else {
                    continue;
                };
                // Only a worker that matched every block before this one continues.
                if m.blocks != b {
                    continue;
                }
                if walk.is_none() {
                    *walk = self
                        .slots
                        .get(id)
                        .and_then(Option::as_ref)
                        .map(|slot| Walk::new(self, slot, now_ms));
                }
                if let Some(walk) = walk {
                    advanced |= walk.credit(h, holder.flags(), m);
                }
            }
            if !advanced {
                break;
            }
        }
        ids.iter()
            .map(|&id| {
                let mut m = state.get(id as usize).map(|s| s.0).unwrap_or_default();
                self.fade(&mut m, now_ms);
                m
            })
            .collect()
    }
}
