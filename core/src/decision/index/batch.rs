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
        let mut out = vec![PrefixMatch::default(); workers.len()];
        // Slot id -> position in `workers`; each position's walk, set up once.
        let mut at = vec![NONE; self.slots.len()];
        let mut walks: Vec<Option<Walk<'_>>> = Vec::with_capacity(workers.len());
        let mut repeated = Vec::new();
        for (i, w) in workers.iter().enumerate() {
            let slot =
                self.ids.get(w).and_then(|&id| Some((id, self.slots.get(id as usize)?.as_ref()?)));
            let Some((id, slot)) = slot else {
                walks.push(None);
                continue;
            };
            match at.get_mut(id as usize) {
                Some(p) if *p == NONE => {
                    *p = i as u32;
                    walks.push(Some(Walk::new(self, slot, now_ms)));
                }
                // A worker named twice: its second position is answered on its own.
                _ => {
                    repeated.push(i);
                    walks.push(None);
                }
            }
        }
        for (b, &h) in hashes.iter().enumerate() {
            let mut advanced = false;
            for holder in self.holders.get(h) {
                let Some(&p) = at.get(holder.id() as usize) else { continue };
                let (Some(m), Some(Some(walk))) = (out.get_mut(p as usize), walks.get(p as usize))
                else {
                    continue;
                };
                // Only a worker that matched every block before this one continues.
                if m.blocks != b {
                    continue;
                }
                advanced |= walk.credit(h, holder.flags(), m);
            }
            if !advanced {
                break;
            }
        }
        for m in &mut out {
            self.fade(m, now_ms);
        }
        for i in repeated {
            if let (Some(m), Some(&w)) = (out.get_mut(i), workers.get(i)) {
                *m = self.prefix_match_of(w, hashes, now_ms);
            }
        }
        out
    }
}
