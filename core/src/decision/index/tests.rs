use super::room::ROOM_FROM;
use super::*;
use rand::{rngs::StdRng, Rng, SeedableRng};

fn keys(names: &[&str]) -> Vec<u64> {
    names.iter().map(|w| worker_key(w)).collect()
}

const LIMITS: IndexLimits = IndexLimits {
    max_blocks_per_worker: 8,
    routed_ttl_ms: 1000,
    feedback_ttl_ms: 5000,
    event_ttl_ms: 0,
    peer_ttl_ms: 1000,
};

#[test]
fn prefix_stops_at_first_gap_and_reports_age() {
    let mut ix = KnowledgeIndex::new(LIMITS);
    ix.insert("a", &[1, 2, 3], Source::Routed, 100);
    ix.insert("a", &[5], Source::KvEvent, 200);
    let m = ix.prefix_match("a", &[1, 2, 3, 4, 5], 300);
    let want = PrefixMatch {
        blocks: 3,
        oldest_age_ms: 200,
        from_events: 0,
        offloaded: 0,
        routed_age_ms: Some(200),
        from_peers: 0,
    };
    assert_eq!(m, want);
    assert_eq!(ix.prefix_match("b", &[1], 300).blocks, 0);
}

#[test]
fn a_retraction_takes_back_routing_credit_only() {
    let mut ix = KnowledgeIndex::new(LIMITS);
    ix.insert("a", &[1, 2], Source::Feedback, 0);
    ix.insert("a", &[3, 4], Source::Routed, 0);
    ix.insert("b", &[1, 2, 3, 4], Source::Routed, 0);
    ix.retract_routed("a", &[1, 2, 3, 4]);
    assert_eq!(ix.prefix_match("a", &[1, 2, 3, 4], 10).blocks, 2, "feedback stays");
    assert_eq!(ix.prefix_match("b", &[1, 2, 3, 4], 10).blocks, 4, "other workers untouched");
    ix.retract_routed("nobody", &[1]);
}

#[test]
fn routed_knowledge_expires_events_do_not() {
    let mut ix = KnowledgeIndex::new(LIMITS);
    ix.insert("a", &[1], Source::Routed, 0);
    ix.insert("a", &[2], Source::KvEvent, 0);
    assert_eq!(ix.prefix_match("a", &[1], 999).blocks, 1);
    assert_eq!(ix.prefix_match("a", &[1], 1000).blocks, 0);
    assert_eq!(ix.prefix_match("a", &[2], 1_000_000).blocks, 1);
}

#[test]
fn memory_is_bounded_per_worker() {
    let mut ix = KnowledgeIndex::new(LIMITS);
    let hashes: Vec<u64> = (0..100).collect();
    ix.insert("a", &hashes, Source::KvEvent, 0);
    assert_eq!(ix.len("a"), 8);
    assert_eq!(ix.prefix_match("a", &[92, 93], 0).blocks, 2);
    ix.clear_worker("a");
    assert!(ix.is_empty());
}

#[test]
fn fresh_events_supersede_older_guesses_and_stale_events_are_ignored() {
    let trust = EventTrust { max_age_ms: 1000, grace_ms: 100 };
    let mut ix = KnowledgeIndex::with_trust(LIMITS_LONG, trust);
    ix.insert("a", &[1, 2, 3], Source::Feedback, 0);
    assert_eq!(ix.prefix_match("a", &[1, 2, 3], 50).blocks, 3);
    // Events at t=500 report only block 1: the older guesses about 2 and 3 give way.
    ix.set_events("a", &[1], &[], 500);
    ix.events_checked(500);
    assert_eq!(ix.event_state(600), (true, true));
    let m = ix.prefix_match("a", &[1, 2, 3], 600);
    assert_eq!((m.blocks, m.from_events), (1, 1));
    // A prediction made after the last event still counts.
    ix.insert("a", &[1, 2], Source::Routed, 700);
    assert_eq!(ix.prefix_match("a", &[1, 2, 3], 750).blocks, 2);
    // Three quarters of the allowed age: event credit is halved.
    ix.set_events("a", &[1, 2, 3, 4], &[], 500);
    assert_eq!(ix.prefix_match("a", &[1, 2, 3, 4], 500 + 750).from_events, 2);
    ix.set_events("a", &[1], &[], 500);
    // Unconfirmed for longer than max_age: events are ignored, history counts again.
    assert_eq!(ix.event_state(2000), (true, false));
    assert_eq!(ix.prefix_match("a", &[1, 2, 3], 2000).from_events, 0);
    assert_eq!(ix.prefix_match("a", &[1, 2, 3], 2000).blocks, 3);
}

const LIMITS_LONG: IndexLimits = IndexLimits {
    max_blocks_per_worker: 64,
    routed_ttl_ms: 100_000,
    feedback_ttl_ms: 100_000,
    event_ttl_ms: 0,
    peer_ttl_ms: 1000,
};

/// The obviously-correct reference: a recency-ordered list per worker.
#[derive(Default)]
struct Naive {
    workers: HashMap<String, Vec<(u64, Observation)>>,
}

impl Naive {
    fn insert(&mut self, w: &str, hashes: &[u64], source: Source, now: u64) {
        let list = self.workers.entry(w.into()).or_default();
        for &h in hashes {
            list.retain(|(x, _)| *x != h);
            list.push((h, Observation { source, at_ms: now }));
        }
        while list.len() > LIMITS.max_blocks_per_worker {
            list.remove(0);
        }
        while list.first().is_some_and(|(_, o)| !LIMITS.alive(o, now)) {
            list.remove(0);
        }
    }
    fn remove(&mut self, w: &str, hashes: &[u64]) {
        if let Some(list) = self.workers.get_mut(w) {
            list.retain(|(x, _)| !hashes.contains(x));
        }
    }
    fn prefix(&self, w: &str, hashes: &[u64], now: u64) -> usize {
        let Some(list) = self.workers.get(w) else {
            return 0;
        };
        hashes
            .iter()
            .take_while(|h| list.iter().any(|(x, o)| x == *h && LIMITS.alive(o, now)))
            .count()
    }
}

#[test]
fn differential_against_naive_reference() {
    for seed in 0..20u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut ix = KnowledgeIndex::new(LIMITS);
        let mut naive = Naive::default();
        let mut now = 0u64;
        for _ in 0..400 {
            now += rng.random_range(0..300);
            let w = ["a", "b", "c"][rng.random_range(0..3)];
            let hashes: Vec<u64> =
                (0..rng.random_range(1..6)).map(|_| rng.random_range(0..16)).collect();
            match rng.random_range(0..10) {
                0..=4 => {
                    let src =
                        [Source::Routed, Source::KvEvent, Source::Feedback][rng.random_range(0..3)];
                    ix.insert(w, &hashes, src, now);
                    naive.insert(w, &hashes, src, now);
                }
                5 => {
                    ix.remove(w, &hashes);
                    naive.remove(w, &hashes);
                }
                _ => assert_eq!(
                    ix.prefix_match(w, &hashes, now).blocks,
                    naive.prefix(w, &hashes, now),
                    "seed {seed}"
                ),
            }
        }
    }
}

/// The pool-wide lookup against the per-worker walk, over seeded random histories of every
/// kind of change (observations of each source, event views set and changed, removals,
/// retractions, workers forgotten and their ids reused, confirmations going stale).
#[test]
fn prefix_matches_equal_the_per_worker_walk() {
    const W: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
    let trust = EventTrust { max_age_ms: 2000, grace_ms: 300 };
    for seed in 0..40u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut ix = KnowledgeIndex::with_trust(LIMITS, trust);
        let mut now = 0u64;
        let some = |rng: &mut StdRng| -> Vec<u64> {
            (0..rng.random_range(0..6)).map(|_| rng.random_range(0..12)).collect()
        };
        for step in 0..600 {
            now += rng.random_range(0..200);
            let w = W[rng.random_range(0..W.len())];
            match rng.random_range(0..12) {
                0..=3 => {
                    let src = [Source::Routed, Source::KvEvent, Source::Feedback, Source::Peer]
                        [rng.random_range(0..4)];
                    ix.insert(w, &some(&mut rng), src, now);
                }
                4 => ix.set_events(w, &some(&mut rng), &some(&mut rng), now),
                5 => {
                    let (ga, gr, oa, or) =
                        (some(&mut rng), some(&mut rng), some(&mut rng), some(&mut rng));
                    let change = EventChange {
                        reset: rng.random_bool(0.2),
                        gpu_add: &ga,
                        gpu_remove: &gr,
                        offloaded_add: &oa,
                        offloaded_remove: &or,
                    };
                    ix.change_events(w, change, now);
                }
                6 => ix.remove(w, &some(&mut rng)),
                7 => ix.retract_routed(w, &some(&mut rng)),
                8 if rng.random_bool(0.3) => ix.clear_worker(w),
                9 => ix.events_checked(now.saturating_sub(rng.random_range(0..2500))),
                _ => {
                    let mut asked: Vec<&str> =
                        W.iter().copied().filter(|_| rng.random_bool(0.7)).collect();
                    if rng.random_bool(0.1) {
                        asked.push(W[0]);
                    }
                    asked.push("nobody");
                    let prompt: Vec<u64> = (0..rng.random_range(0..10))
                        .map(|i| if rng.random_bool(0.8) { i } else { rng.random_range(0..12) })
                        .collect();
                    let keys: Vec<u64> = asked.iter().map(|w| worker_key(w)).collect();
                    let got = ix.prefix_matches(keys.iter().copied(), &prompt, now);
                    assert!(got.is_empty() || got.len() == asked.len(), "seed {seed} step {step}");
                    for (i, w) in asked.iter().enumerate() {
                        assert_eq!(
                            got.get(i).copied().unwrap_or_default(),
                            ix.prefix_match(w, &prompt, now),
                            "seed {seed} step {step} worker {w}"
                        );
                    }
                }
            }
            assert_holders_exact(&ix, 12, seed, step);
        }
        for w in W {
            ix.clear_worker(w);
        }
        assert_eq!(ix.holders.hashes(), 0, "seed {seed}: forgotten workers leave no holders");
    }
}

/// Every worker's holder flags for hashes `0..hashes` are exactly where its slot has them.
fn assert_holders_exact(ix: &KnowledgeIndex, hashes: u64, seed: u64, step: usize) {
    for h in 0..hashes {
        let mut want: Vec<(u32, u32)> = ix
            .slots
            .iter()
            .flatten()
            .map(|w| {
                let view = w.events.as_ref();
                let mut f = 0;
                if view.is_some_and(|e| e.blocks.contains(&h)) {
                    f |= holders::GPU;
                }
                if view.is_some_and(|e| e.offloaded.contains(&h)) {
                    f |= holders::OFFLOADED;
                }
                if w.blocks.contains_key(&h) {
                    f |= holders::OBSERVED;
                }
                (w.id, f)
            })
            .filter(|&(_, f)| f != 0)
            .collect();
        want.sort_unstable();
        let got: Vec<(u32, u32)> = ix.holders.get(h).iter().map(|x| (x.id(), x.flags())).collect();
        assert_eq!(got, want, "seed {seed} step {step} hash {h}");
    }
    for (id, slot) in ix.slots.iter().enumerate() {
        let want = slot.as_ref().and_then(|w| w.events.as_ref()).map(|e| e.observed_at_ms);
        let got = ix.events_at.get(id).copied().flatten();
        assert_eq!(got, want, "seed {seed} step {step}: slot {id}'s event time");
    }
}

#[test]
fn a_block_nobody_holds_ends_every_match_and_forgotten_workers_leave_no_holders() {
    let mut ix = KnowledgeIndex::new(LIMITS_LONG);
    ix.events_checked(0);
    ix.set_events("a", &[1, 2, 3], &[4], 0);
    ix.set_events("b", &[1, 2], &[], 0);
    ix.insert("b", &[3], Source::Routed, 0);
    let got = ix.prefix_matches(keys(&["a", "b", "c"]), &[1, 2, 3, 4, 9, 5], 10);
    let blocks: Vec<usize> = got.iter().map(|m| m.blocks).collect();
    assert_eq!(blocks, [4, 3, 0]);
    assert_eq!((got[0].offloaded, got[1].routed_age_ms), (1, Some(10)));
    ix.clear_worker("a");
    ix.clear_worker("b");
    assert_eq!(ix.holders.hashes(), 0, "every record taken off");
    // Ids are reused: a new worker starts empty.
    ix.insert("c", &[7], Source::Feedback, 0);
    assert!(ix.prefix_matches(keys(&["c", "a"]), &[1, 7], 10).is_empty(), "nobody holds 1");
    assert_eq!(ix.prefix_matches(keys(&["c"]), &[7, 1], 10)[0].blocks, 1);
}

/// Each large table's `capacity()` for worker "a": its observations, its event view's GPU
/// tier, the holders. Without removals, it changes only when a table grows.
fn capacities(ix: &KnowledgeIndex) -> [usize; 3] {
    let w = ix.slot("a").expect("a slot");
    let events = w.events.as_ref().map_or(0, |e| e.blocks.capacity());
    [w.blocks.capacity(), events, room::Table::takes(&ix.holders)]
}

/// Credits block `h` to worker "a" both ways: observed, and in its event view.
fn hold(ix: &mut KnowledgeIndex, h: u64) {
    ix.insert("a", &[h], Source::Routed, 0);
    let change = EventChange { gpu_add: &[h], ..Default::default() };
    ix.change_events("a", change, 0);
}

#[test]
fn room_made_ahead_spares_the_next_inserts_a_growth() {
    let limits = IndexLimits { max_blocks_per_worker: 1 << 20, ..LIMITS };
    for ahead in [false, true] {
        let mut ix = KnowledgeIndex::new(limits);
        // Fill until every table has less than an eighth of its size left before it grows.
        let mut n = 1u64;
        hold(&mut ix, n);
        while capacities(&ix)[0] - n as usize >= (n as usize / 8).max(1) || n < ROOM_FROM as u64 {
            n += 1;
            hold(&mut ix, n);
            assert!(n < 1 << 16, "never near full");
        }
        if ahead {
            assert_eq!(ix.make_room(), 3, "observations, event view, holders");
            assert_eq!(ix.make_room(), 0, "room enough now");
        }
        let before = capacities(&ix);
        for h in n + 1..=n + n / 8 {
            hold(&mut ix, h);
        }
        let grew: Vec<bool> = before.iter().zip(capacities(&ix)).map(|(b, a)| a != *b).collect();
        assert_eq!(grew, vec![!ahead; 3], "an eighth more after make_room: {ahead}");
    }
}
