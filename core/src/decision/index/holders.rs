//! The index turned inside out: for each block hash, which workers have any record of it and
//! where (their event view's GPU or lower tier, their observations). A decision looks each
//! prompt block up once here instead of once per worker, so a block nobody holds costs one
//! probe whatever the pool's size.
//!
//! Most blocks have one holder, stored inline; blocks many workers share (system prompts)
//! point into a list of holders sorted by worker id.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::HashMap;

use foldhash::fast::RandomState as Fast;

/// The block is in the worker's event view, GPU tier.
pub const GPU: u32 = 1;
/// The block is in the worker's event view, a lower tier only.
pub const OFFLOADED: u32 = 2;
/// The worker has an observation of the block (routed, feedback, peer or a direct event).
pub const OBSERVED: u32 = 4;
const FLAGS: u32 = 7;
const SHIFT: u32 = 3;

/// The most workers the index numbers (ids are packed with three flag bits into a `u32`).
pub const MAX_WORKERS: u32 = u32::MAX >> SHIFT;

/// One holder: a worker id and its flags, packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder(u32);

impl Holder {
    pub fn id(self) -> u32 {
        self.0 >> SHIFT
    }

    pub fn flags(self) -> u32 {
        self.0 & FLAGS
    }

    fn new(id: u32, flags: u32) -> Holder {
        Holder((id << SHIFT) | (flags & FLAGS))
    }
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    /// The only holder.
    One(Holder),
    /// Index into `Holders::lists` (two holders or more).
    Many(u32),
}

/// Block hash -> its holders.
#[derive(Debug, Default)]
pub struct Holders {
    map: HashMap<u64, Entry, Fast>,
    /// Holder lists, sorted by worker id; a freed list is empty and its index in `free`.
    lists: Vec<Vec<Holder>>,
    free: Vec<u32>,
}

impl Holders {
    /// The holders of `hash` (sorted by worker id).
    pub fn get(&self, hash: u64) -> &[Holder] {
        match self.map.get(&hash) {
            None => &[],
            Some(Entry::One(h)) => std::slice::from_ref(h),
            Some(Entry::Many(i)) => self.lists.get(*i as usize).map_or(&[], Vec::as_slice),
        }
    }

    /// Adds `flag` to worker `id`'s record of `hash`.
    pub fn set(&mut self, hash: u64, id: u32, flag: u32) {
        let slot = match self.map.entry(hash) {
            MapEntry::Vacant(v) => {
                v.insert(Entry::One(Holder::new(id, flag)));
                return;
            }
            MapEntry::Occupied(o) => o.into_mut(),
        };
        match *slot {
            Entry::One(h) if h.id() == id => *slot = Entry::One(Holder::new(id, h.flags() | flag)),
            Entry::One(h) => {
                let mut list = vec![h, Holder::new(id, flag)];
                list.sort_unstable_by_key(|h| h.id());
                *slot = Entry::Many(new_list(&mut self.lists, &mut self.free, list));
            }
            Entry::Many(i) => {
                let Some(list) = self.lists.get_mut(i as usize) else { return };
                match list.binary_search_by_key(&id, |h| h.id()) {
                    Ok(at) => list[at] = Holder::new(id, list[at].flags() | flag),
                    Err(at) => list.insert(at, Holder::new(id, flag)),
                }
            }
        }
    }

    /// Takes `flag` off worker `id`'s record of `hash`; a worker with no flag left is no
    /// longer a holder, and a hash without holders is forgotten.
    pub fn clear(&mut self, hash: u64, id: u32, flag: u32) {
        let MapEntry::Occupied(mut o) = self.map.entry(hash) else { return };
        match *o.get() {
            Entry::One(h) if h.id() == id => {
                let left = h.flags() & !flag;
                if left == 0 {
                    o.remove();
                } else {
                    *o.get_mut() = Entry::One(Holder::new(id, left));
                }
            }
            Entry::One(_) => {}
            Entry::Many(i) => {
                let Some(list) = self.lists.get_mut(i as usize) else { return };
                let Ok(at) = list.binary_search_by_key(&id, |h| h.id()) else { return };
                let left = list[at].flags() & !flag;
                if left != 0 {
                    list[at] = Holder::new(id, left);
                    return;
                }
                list.remove(at);
                if list.len() == 1 {
                    let only = list[0];
                    list.clear();
                    list.shrink_to_fit();
                    self.free.push(i);
                    *o.get_mut() = Entry::One(only);
                }
            }
        }
    }

    /// Hashes with at least one holder.
    #[cfg(test)]
    pub fn hashes(&self) -> usize {
        self.map.len()
    }
}

impl super::room::Table for Holders {
    fn entries(&self) -> usize {
        self.map.len()
    }
    fn takes(&self) -> usize {
        self.map.capacity()
    }
    fn reserve_more(&mut self, more: usize) {
        self.map.reserve(more);
    }
}

/// Stores `list` in a freed slot of `lists`, or a new one; its index.
fn new_list(lists: &mut Vec<Vec<Holder>>, free: &mut Vec<u32>, list: Vec<Holder>) -> u32 {
    if let Some(i) = free.pop() {
        if let Some(slot) = lists.get_mut(i as usize) {
            *slot = list;
            return i;
        }
    }
    lists.push(list);
    (lists.len() - 1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};
    use std::collections::BTreeMap;

    #[test]
    fn holders_follow_a_naive_map_of_flags() {
        for seed in 0..10u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut h = Holders::default();
            let mut naive: BTreeMap<(u64, u32), u32> = BTreeMap::new();
            for _ in 0..3000 {
                let (hash, id) = (rng.random_range(0..8u64), rng.random_range(0..12u32));
                let flag = [GPU, OFFLOADED, OBSERVED][rng.random_range(0..3)];
                if rng.random_bool(0.55) {
                    h.set(hash, id, flag);
                    *naive.entry((hash, id)).or_default() |= flag;
                } else {
                    h.clear(hash, id, flag);
                    if let Some(f) = naive.get_mut(&(hash, id)) {
                        *f &= !flag;
                        if *f == 0 {
                            naive.remove(&(hash, id));
                        }
                    }
                }
                for hash in 0..8u64 {
                    let want: Vec<(u32, u32)> = naive
                        .range((hash, 0)..=(hash, u32::MAX))
                        .map(|(&(_, id), &f)| (id, f))
                        .collect();
                    let got: Vec<(u32, u32)> =
                        h.get(hash).iter().map(|x| (x.id(), x.flags())).collect();
                    assert_eq!(got, want, "seed {seed}, hash {hash}");
                }
            }
            let used = naive.keys().map(|k| k.0).collect::<std::collections::BTreeSet<_>>();
            assert_eq!(h.hashes(), used.len());
        }
    }
}
