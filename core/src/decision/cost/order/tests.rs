//! The bounded ranking against the whole one, over seeded random pools.

use proptest::prelude::*;

use super::super::{Candidate, Profile, Score, TieBand, Weigh};
use super::{rank_bounded, total_order};
use crate::decision::load::WorkerLoad;

const BS: u32 = 16;
const PROMPT: u64 = 4096;

/// A pool of `loads.len()` workers: few distinct loads and matches, so that many costs tie;
/// named in order, then rotated out of it by `rotate`.
fn pool(loads: &[(u64, usize, u32)], rotate: usize) -> Vec<Candidate> {
    let mut cs: Vec<Candidate> = loads
        .iter()
        .enumerate()
        .map(|(i, &(queued, blocks, decoding))| Candidate {
            worker: format!("w{i:04}").into(),
            cached_blocks: blocks,
            offloaded_blocks: 0,
            load: WorkerLoad {
                inflight_requests: decoding + u32::from(queued > 0),
                prefilling_requests: u32::from(queued > 0),
                prefill_tokens: queued * 512,
                prefill_elapsed_ms: 0,
                prefill_sq_tokens: WorkerLoad::even_sq_tokens(queued * 512, u32::from(queued > 0)),
            },
            adapter_missing: false,
            deviation: 1.0,
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
        loads in proptest::collection::vec((0u64..4, prop_oneof![Just(0usize), 0usize..3, Just(200)], 0u32..3), 0..160),
        rotate in 0usize..200,
        keep in 1usize..12,
        pick in any::<u64>(),
        stall_weight in prop_oneof![Just(0.0), 0.0f64..2.0],
        margin in prop_oneof![Just(1.0), 1.0f64..3.0],
    ) {
        let cs = pool(&loads, rotate);
        let mut p = Profile::default();
        let mut q = p.queue_terms();
        q.promise_margin = margin;
        p.queue = Some(q);
        let weigh = Weigh { tie: TieBand::default(), stall_weight };
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
    /// infinities and NaNs included), so ranking by it changes no order.
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
    }
}
