//! Room made ahead in the index's large hash tables, off the request path. A `hashbrown` table
//! that runs out of room grows, or drops its tombstones, all at once: every entry is copied or
//! moved, which takes milliseconds for a large table inside Envoy. The tick calls
//! [`Room::make`] for each table, so that the request path's inserts find the room already
//! there.

use std::collections::HashSet;
use std::hash::BuildHasher;

use hashlink::LinkedHashMap;

/// Tables smaller than this are left to grow on their own: growing those is cheap.
pub const ROOM_FROM: usize = 4096;

/// A hash table whose room can be made ahead.
pub trait Table {
    fn entries(&self) -> usize;
    /// How many entries it takes before it must grow or rehash: `hashbrown`'s `capacity()`,
    /// the entries plus the inserts it has left (a tombstone takes one of those).
    fn takes(&self) -> usize;
    fn reserve_more(&mut self, more: usize);
}

/// [`Table`] for a map or set type whose `len`, `capacity` and `reserve` are `hashbrown`'s.
macro_rules! table {
    ($($generics:ident),* ; $t:ty) => {
        impl<$($generics),*> Table for $t
        where
            S: BuildHasher,
        {
            fn entries(&self) -> usize {
                self.len()
            }
            fn takes(&self) -> usize {
                self.capacity()
            }
            fn reserve_more(&mut self, more: usize) {
                self.reserve(more);
            }
        }
    };
}

table!(V, S; LinkedHashMap<u64, V, S>);
table!(S; HashSet<u64, S>);

/// One table's use of its room since the last [`Room::make`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Room {
    /// The inserts it had left then, and its entries then (`None`: never made).
    then: Option<(usize, usize)>,
}

impl Room {
    /// Makes room in `table` for twice what the period since the last call used, at least an
    /// eighth of its entries and at most a quarter (room costs memory: a table never takes
    /// more than one doubling ahead of its own growth). Reserves double that, so that the next
    /// call, after a period like the last, finds room enough and does nothing. `true`: it
    /// reserved.
    pub fn make(&mut self, table: &mut impl Table) -> bool {
        let entries = table.entries();
        let left = table.takes().saturating_sub(entries);
        let used = self.then.map_or(0, |(left_then, entries_then)| {
            left_then.saturating_sub(left).max(entries.saturating_sub(entries_then))
        });
        let want = (entries / 8).max(2 * used).min(entries / 4);
        let reserve = entries >= ROOM_FROM && left < want;
        if reserve {
            table.reserve_more(2 * want);
        }
        self.then = Some((table.takes().saturating_sub(entries), entries));
        reserve
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Set = HashSet<u64>;

    /// A set filled until it has less than an eighth of its entries left before it grows.
    fn nearly_full() -> Set {
        let mut s = Set::new();
        let mut n = 0u64;
        while s.len() < ROOM_FROM || s.capacity() - s.len() >= s.len() / 8 {
            n += 1;
            s.insert(n);
        }
        s
    }

    /// Inserts `k` new entries; whether the set grew meanwhile.
    fn grows(s: &mut Set, k: usize) -> bool {
        let (before, next) = (s.capacity(), s.len() as u64 + 1_000_000);
        s.extend(next..next + k as u64);
        s.capacity() != before
    }

    #[test]
    fn a_first_call_makes_room_for_an_eighth() {
        let mut s = nearly_full();
        let n = s.len();
        let mut room = Room::default();
        assert!(room.make(&mut s));
        assert!(s.capacity() - n >= n / 4 && s.capacity() <= 3 * n, "{} for {n}", s.capacity());
        assert!(!room.make(&mut s), "nothing used since: nothing to do");
        assert!(!grows(&mut s, n / 8));
    }

    #[test]
    fn the_room_follows_what_a_period_used() {
        let mut s = nearly_full();
        let mut room = Room::default();
        room.make(&mut s);
        // A period inserts more than the eighth made at first.
        let burst = s.len() / 5;
        grows(&mut s, burst);
        room.make(&mut s);
        // Periods like it find the room made.
        for _ in 0..4 {
            assert!(!grows(&mut s, burst));
            room.make(&mut s);
        }
    }

    /// Replaces the `k` oldest entries (numbered from `oldest`) by as many new ones, as a
    /// full LRU does; whether the set grew or rehashed meanwhile (its room jumped).
    fn churns(s: &mut Set, oldest: &mut u64, k: usize) -> bool {
        let mut jumped = false;
        for _ in 0..k {
            let before = s.capacity();
            s.remove(oldest);
            s.insert(*oldest + s.len() as u64 + 1);
            *oldest += 1;
            jumped |= s.capacity() > before + 2;
        }
        jumped
    }

    #[test]
    fn under_churn_the_tombstones_are_dropped_ahead() {
        for ahead in [false, true] {
            let mut s = nearly_full();
            let (mut oldest, k) = (1, s.len() / 4);
            let mut room = Room::default();
            let mut jumped = false;
            for _ in 0..8 {
                if ahead {
                    room.make(&mut s);
                }
                jumped |= churns(&mut s, &mut oldest, k);
            }
            assert_eq!(jumped, !ahead, "room made each period: {ahead}");
        }
    }

    #[test]
    fn the_room_made_is_at_most_half_the_entries() {
        let mut s = nearly_full();
        let mut room = Room::default();
        room.make(&mut s);
        let n = 4 * s.len();
        grows(&mut s, n);
        let (entries, before) = (s.len(), s.capacity());
        room.make(&mut s);
        assert!(s.capacity() < 2 * before.max(entries + entries / 2), "{}", s.capacity());
    }

    #[test]
    fn small_tables_are_left_alone() {
        let mut s: Set = (0..ROOM_FROM as u64 - 1).collect();
        s.shrink_to_fit();
        assert!(!Room::default().make(&mut s));
    }
}
