use super::*;

fn index(blocks: usize, keys: usize) -> BlockIndex {
    BlockIndex::new(BlockLimits { max_blocks_per_tier: blocks, max_engine_keys: keys })
}

fn end(c: u64) -> ChainEnd {
    ChainEnd { canonical: c, pending: Box::new([]) }
}

fn put(ix: &mut BlockIndex, key: u64, tier: Tier, group: u32, c: u64, caps: &mut CapsHit) {
    ix.store(key, tier, group, end(c), &[c], caps);
}

#[test]
fn the_oldest_known_blocks_give_way() {
    let (mut ix, mut caps) = (index(3, 100), CapsHit::default());
    for k in 1..=3 {
        put(&mut ix, k, Tier::Gpu, 0, k * 10, &mut caps);
    }
    // Block 1 was used as a parent: it is now the newest.
    assert_eq!(ix.chain_end(1), Some(end(10)));
    put(&mut ix, 4, Tier::Gpu, 0, 40, &mut caps);
    assert_eq!(ix.blocks(Tier::Gpu), vec![10, 30, 40]);
    assert_eq!(caps.get(Cap::BlocksPerTier), 1);
    // Other tiers have their own bound.
    put(&mut ix, 5, Tier::Cpu, 0, 50, &mut caps);
    assert_eq!((ix.len(Tier::Gpu), ix.len(Tier::Cpu)), (3, 1));
}

#[test]
fn engine_keys_are_bounded_and_shared_canonicals_counted() {
    let (mut ix, mut caps) = (index(100, 4), CapsHit::default());
    // Two engine hashes for one canonical block (e.g. two lookahead variants).
    put(&mut ix, 1, Tier::Gpu, 0, 7, &mut caps);
    put(&mut ix, 2, Tier::Gpu, 0, 7, &mut caps);
    assert!(ix.remove(1, Tier::Gpu, 0));
    assert_eq!(ix.blocks(Tier::Gpu), vec![7], "still named by engine hash 2");
    for k in 10..20 {
        put(&mut ix, k, Tier::Gpu, 0, k, &mut caps);
    }
    assert_eq!(ix.engine_keys(), 4);
    assert_eq!(caps.get(Cap::EngineKeys), 7);
    assert!(!ix.blocks(Tier::Gpu).contains(&7));
    assert!(ix.chain_end(2).is_none(), "an evicted hold's chain goes with it");
}

#[test]
fn removal_is_per_tier() {
    let (mut ix, mut caps) = (index(10, 10), CapsHit::default());
    put(&mut ix, 1, Tier::Gpu, 0, 7, &mut caps);
    put(&mut ix, 1, Tier::Cpu, 0, 7, &mut caps);
    ix.remove(1, Tier::Gpu, 0);
    assert!(ix.blocks(Tier::Gpu).is_empty());
    assert_eq!(ix.blocks(Tier::Cpu), vec![7], "the offloaded copy stays");
    assert_eq!(ix.chain_end(1), Some(end(7)), "the chain is still known from the CPU tier");
}

#[test]
fn stores_and_removals_are_counted_per_hash_tier_and_group() {
    let (mut ix, mut caps) = (index(10, 10), CapsHit::default());
    put(&mut ix, 1, Tier::Gpu, 0, 7, &mut caps);
    put(&mut ix, 1, Tier::Gpu, 0, 7, &mut caps);
    put(&mut ix, 1, Tier::Gpu, 1, 7, &mut caps);
    assert_eq!(ix.engine_keys(), 2);
    assert!(ix.remove(1, Tier::Gpu, 0));
    assert_eq!(ix.blocks(Tier::Gpu), vec![7], "stored twice in group 0, removed once");
    assert!(ix.remove(1, Tier::Gpu, 0));
    assert_eq!(ix.blocks(Tier::Gpu), vec![7], "group 1 still holds it");
    assert!(!ix.remove(1, Tier::Gpu, 0), "nothing left in group 0");
    assert!(ix.remove(1, Tier::Gpu, 1));
    assert!(ix.blocks(Tier::Gpu).is_empty() && ix.is_empty());
    assert!(ix.chain_end(1).is_none());
}

#[test]
fn a_hold_may_name_several_blocks_or_none() {
    let (mut ix, mut caps) = (index(10, 10), CapsHit::default());
    ix.store(1, Tier::Gpu, 0, end(3), &[2, 3], &mut caps);
    let partial = ChainEnd { canonical: 3, pending: Box::new([9, 9]) };
    ix.store(2, Tier::Gpu, 0, partial.clone(), &[], &mut caps);
    assert_eq!(ix.blocks(Tier::Gpu), vec![2, 3]);
    assert_eq!(ix.known(2, 5), Some((partial, vec![])));
    ix.clear_tier(Tier::Gpu);
    assert!(ix.is_empty() && ix.chain_end(1).is_none());
}

#[test]
fn a_group_can_be_forgotten_alone() {
    let (mut ix, mut caps) = (index(10, 10), CapsHit::default());
    put(&mut ix, 1, Tier::Gpu, 0, 7, &mut caps);
    put(&mut ix, 2, Tier::Gpu, 1, 8, &mut caps);
    put(&mut ix, 2, Tier::Cpu, 1, 8, &mut caps);
    ix.clear_group(1);
    assert_eq!(ix.blocks(Tier::Gpu), vec![7]);
    assert!(ix.blocks(Tier::Cpu).is_empty());
    assert!(ix.chain_end(2).is_none());
}

mod model {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[derive(Debug, Clone)]
    enum Op {
        Store(u64, usize, u32),
        Remove(u64, usize, u32),
        ClearTier(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..6u64, 0..3usize, 0..2u32).prop_map(|(k, t, g)| Op::Store(k, t, g)),
            4 => (0..6u64, 0..3usize, 0..2u32).prop_map(|(k, t, g)| Op::Remove(k, t, g)),
            1 => (0..3usize).prop_map(Op::ClearTier),
        ]
    }

    /// Engine hash `k` names canonical blocks `k / 2` (two hashes share one block, as
    /// lookahead variants do) and, for odd hashes, also `100 + k` (a page of two blocks).
    fn blocks_of(k: u64) -> Vec<u64> {
        if k % 2 == 1 {
            vec![k / 2, 100 + k]
        } else {
            vec![k / 2]
        }
    }

    proptest! {
        /// Against a plain count per (hash, tier, group): a tier holds exactly the blocks of
        /// the holds whose stores outnumber their removals since the tier's last reset.
        #[test]
        fn holds_are_counted_like_a_plain_model(ops in proptest::collection::vec(op(), 0..60)) {
            let (mut ix, mut caps) = (index(1000, 1000), CapsHit::default());
            let mut refs: BTreeMap<(u64, usize, u32), u32> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Store(k, t, g) => {
                        let b = blocks_of(k);
                        ix.store(k, TIERS[t], g, end(k), &b, &mut caps);
                        *refs.entry((k, t, g)).or_insert(0) += 1;
                    }
                    Op::Remove(k, t, g) => {
                        let known = refs.get(&(k, t, g)).copied().unwrap_or(0) > 0;
                        prop_assert_eq!(ix.remove(k, TIERS[t], g), known);
                        if known {
                            *refs.entry((k, t, g)).or_insert(0) -= 1;
                        }
                    }
                    Op::ClearTier(t) => {
                        ix.clear_tier(TIERS[t]);
                        refs.retain(|(_, tt, _), _| *tt != t);
                    }
                }
                refs.retain(|_, n| *n > 0);
                for (t, tier) in TIERS.iter().enumerate() {
                    let want: BTreeSet<u64> = refs
                        .keys()
                        .filter(|(_, tt, _)| *tt == t)
                        .flat_map(|(k, _, _)| blocks_of(*k))
                        .collect();
                    let got: BTreeSet<u64> = ix.blocks(*tier).into_iter().collect();
                    prop_assert_eq!(got, want);
                }
                for k in 0..6u64 {
                    let held = refs.keys().any(|(kk, _, _)| *kk == k);
                    prop_assert_eq!(ix.chain_end(k).is_some(), held);
                }
                prop_assert_eq!(ix.engine_keys(), refs.len());
            }
        }
    }
}
