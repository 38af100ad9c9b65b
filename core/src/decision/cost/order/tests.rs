//! The bounded ranking against the whole one, over seeded random pools.

use proptest::prelude::*;

use super::super::{Candidate, Profile, Reach, Score, TieBand, Weigh};
use super::{from_total_order, rank_bounded, total_order};
use crate::decision::load::WorkerLoad;

const BS: u32 = 16;
const PROMPT: u64 = 4096;

/// One run of workers with the same inputs: queued prefills, cached blocks, decoding
/// requests, flags (bit 0: a slower deviation, bit 1: an adapter missing, bit 2: half the
/// cached blocks offloaded), and how many workers in a row.
type Run = (u64, usize, u32, u8, usize);

/// A pool of runs of workers with equal inputs: few distinct loads and matches, so that many
/// costs tie; named in order, then rotated out of it by `rotate`.
fn pool(runs: &[Run], rotate: usize) -> Vec<Candidate> {
    let inputs =
        runs.iter().flat_map(|&(q, b, d, flags, n)| std::iter::repeat_n((q, b, d, flags), n));
    let mut cs: Vec<Candidate> = inputs
        .enumerate()
        .map(|(i, (queued, blocks, decoding, flags))| Candidate {
            worker: format!("w{i:04}").into(),
            cached_blocks: blocks,
            offloaded_blocks: if flags & 4 != 0 { blocks / 2 } else { 0 },
            load: WorkerLoad {
                inflight_requests: decoding + u32::from(queued > 0),
                prefilling_requests: u32::from(queued > 0),
                prefill_tokens: queued * 512,
                prefill_elapsed_ms: 0,
                prefill_sq_tokens: WorkerLoad::even_sq_tokens(queued * 512, u32::from(queued > 0)),
                arriving_tokens_per_s: 0,
                behind_tokens: 0,
                passing_tokens_per_s: 0,
            },
            adapter_missing: flags & 2 != 0,
            deviation: if flags & 1 != 0 { 1.5 } else { 1.0 },
        })
        .collect();
    if !cs.is_empty() {
        let n = cs.len();
        cs.rotate_left(rotate % n);
    }
    cs
}

fn least(r: &[Score], f: impl Fn(&Score) -> f64) -> Option<f64> {
    r.iter().map(f).min_by(f64::total_cmp)
}

/// The least TTFT among the holders of the longest match.
fn best_holder(r: &[Score]) -> Option<f64> {
    let longest = r.iter().map(|s| s.cached_tokens).max().filter(|&l| l > 0)?;
    least(&r.iter().filter(|s| s.cached_tokens == longest).cloned().collect::<Vec<_>>(), |s| {
        s.ttft_ms
    })
}

proptest! {
    #[test]
    fn the_bounded_ranking_is_the_whole_rankings_prefix_plus_what_admission_reads(
        runs in proptest::collection::vec(
            (0u64..4, prop_oneof![Just(0usize), 0usize..3, Just(200)], 0u32..3,
             prop_oneof![2 => Just(0u8), 1 => 0u8..8], prop_oneof![Just(1usize), 1usize..6]),
            0..60),
        rotate in 0usize..200,
        keep in 1usize..12,
        pick in any::<u64>(),
        stall_weight in prop_oneof![Just(0.0), 0.0f64..2.0],
        margin in prop_oneof![Just(1.0), 1.0f64..3.0],
    ) {
        let cs = pool(&runs, rotate);
        let mut p = Profile::default();
        let mut q = p.queue_terms();
        q.promise_margin = margin;
        p.queue = Some(q);
        let weigh = Weigh { tie: TieBand::default(), stall_weight, stream_steps: 0 };
        let sorted = rotate % cs.len().max(1) == 0;
        let whole = rank_bounded(&p, &cs, &[], (PROMPT, BS), weigh, pick, (usize::MAX, sorted));
        let bounded = rank_bounded(&p, &cs, &[], (PROMPT, BS), weigh, pick, (keep, sorted));
        prop_assert_eq!(whole.len(), cs.len());
        let head = keep.min(whole.len());
        prop_assert_eq!(&bounded[..head], &whole[..head]);
        prop_assert!(bounded.len() <= head + 3);
        // The rest is a subsequence of the whole ranking past the kept head.
        let mut later = whole[head..].iter();
        for s in &bounded[head..] {
            prop_assert!(later.any(|w| w == s), "{} is out of order", s.worker);
        }
        prop_assert_eq!(least(&bounded, Score::promise_ttft_ms), least(&whole, Score::promise_ttft_ms));
        prop_assert_eq!(least(&bounded, Score::promise_wait_ms), least(&whole, Score::promise_wait_ms));
        prop_assert_eq!(best_holder(&bounded), best_holder(&whole));
    }
}

proptest! {
    /// The integer key orders costs exactly as `f64::total_cmp` does (signs, zeros,
    /// infinities and NaNs included), so ranking by it changes no order; and it gives back
    /// the very cost it was made of, bit for bit.
    #[test]
    fn the_integer_order_of_costs_is_total_cmps(
        a in prop_oneof![any::<f64>(), Just(0.0), Just(-0.0), Just(f64::INFINITY),
                         Just(f64::NEG_INFINITY), Just(f64::NAN), Just(-f64::NAN),
                         Just(f64::MIN_POSITIVE), Just(f64::MAX), Just(f64::MIN)],
        b in prop_oneof![any::<f64>(), Just(0.0), Just(-0.0), Just(f64::INFINITY),
                         Just(f64::NEG_INFINITY), Just(f64::NAN), Just(-f64::NAN),
                         Just(1.0), Just(-1.0), Just(f64::MAX), Just(f64::MIN)],
    ) {
        prop_assert_eq!(total_order(a).cmp(&total_order(b)), a.total_cmp(&b));
        prop_assert_eq!(total_order(a).cmp(&total_order(a)), std::cmp::Ordering::Equal);
        prop_assert_eq!(from_total_order(total_order(a)).to_bits(), a.to_bits());
        prop_assert_eq!(from_total_order(total_order(b)).to_bits(), b.to_bits());
    }
}

/// A quiet pool's workers share the estimate of the worker before them only while every
/// input is equal: one worker better than its neighbours in any single input is estimated on
/// its own, and comes first.
#[test]
fn a_worker_unlike_its_neighbour_is_estimated_on_its_own() {
    // A queued prefill, 3 cached blocks of which 1 offloaded, an adapter missing, slower.
    let base = pool(&[(1, 3, 1, 7, 1)], 0).remove(0);
    type Change = fn(&mut Candidate);
    let variants: [(&str, Change); 5] = [
        ("more cached blocks", |c| c.cached_blocks += 1),
        ("no block offloaded", |c| c.offloaded_blocks = 0),
        ("less load", |c| c.load.prefill_tokens /= 2),
        ("the adapter loaded", |c| c.adapter_missing = false),
        ("a faster deviation", |c| c.deviation = 1.0),
    ];
    let p = Profile::default();
    let weigh =
        Weigh { tie: TieBand { abs_ms: 0.0, rel: 0.0 }, stall_weight: 0.0, stream_steps: 0 };
    for (what, change) in variants {
        for at in [1, 40, 99] {
            let mut cs: Vec<Candidate> = (0..100)
                .map(|i| Candidate { worker: format!("w{i:04}").into(), ..base.clone() })
                .collect();
            change(&mut cs[at]);
            let whole = rank_bounded(&p, &cs, &[], (PROMPT, BS), weigh, 0, (usize::MAX, true));
            let bounded = rank_bounded(&p, &cs, &[], (PROMPT, BS), weigh, 0, (8, true));
            assert_eq!(whole[0].worker.to_string(), format!("w{at:04}"), "{what} at {at}");
            assert_eq!(bounded[..8], whole[..8], "{what} at {at}");
        }
    }
}

/// Equal workers reached differently are estimated each on its own: the nearest comes first.
#[test]
fn equal_workers_with_their_own_reach_are_estimated_each() {
    let cs = pool(&[(0, 0, 0, 0, 100)], 0);
    let far = Reach { network_ms: 5.0, ..Reach::default() };
    let mut reaches = vec![far; cs.len()];
    reaches[40].network_ms = 1.0;
    let weigh =
        Weigh { tie: TieBand { abs_ms: 0.0, rel: 0.0 }, stall_weight: 0.0, stream_steps: 0 };
    let ranked =
        rank_bounded(&Profile::default(), &cs, &reaches, (PROMPT, BS), weigh, 0, (8, true));
    assert_eq!(ranked[0].worker.to_string(), "w0040");
    assert_eq!(ranked[0].network_ms, 1.0);
    assert_eq!(ranked[1].network_ms, 5.0);
}
