//! The cost model with a [`Reach`]: network time, pulls from a holder, and a remote holder
//! against a local idle worker.

use super::*;
use crate::decision::topology::PullCost;
use proptest::prelude::*;

const BS: u32 = 16;

fn candidate(
    worker: &str,
    cached_blocks: usize,
    prefill_tokens: u64,
    prefilling: u32,
) -> Candidate {
    Candidate {
        worker: worker.into(),
        cached_blocks,
        offloaded_blocks: 0,
        load: WorkerLoad {
            inflight_requests: prefilling,
            prefilling_requests: prefilling,
            prefill_tokens,
            ..Default::default()
        },
        adapter_missing: false,
        deviation: 1.0,
    }
}

fn offer(from: &str, blocks: usize, fixed_ms: f64, gbps: f64) -> PullOffer {
    // 128 KiB of KV per token.
    let ms_per_token = 131_072.0 * 8.0 / (gbps * 1e6);
    PullOffer { from: from.into(), blocks, cost: PullCost { fixed_ms, ms_per_token } }
}

const EXACT: Weigh =
    Weigh { tie: TieBand { abs_ms: 0.0, rel: 0.0 }, stall_weight: 0.0, stream_steps: 0 };

#[test]
fn an_idle_peer_pulls_from_a_busy_holder_over_a_fast_link() {
    let p = Profile::default();
    // The three cases: A idle without the prefix, B holding all 8 k tokens behind 30 k queued
    // tokens, C idle next to B (100 Gbit/s) without it.
    let cs = [candidate("A", 0, 0, 0), candidate("B", 512, 30_000, 4), candidate("C", 0, 0, 0)];
    let reaches = [
        Reach::default(),
        Reach::default(),
        Reach { pulls: vec![offer("B", 512, 2.2, 100.0)], ..Default::default() },
    ];
    let r = rank_reached(&p, &cs, &reaches, 8_192, BS, EXACT, 0);
    assert_eq!(r[0].worker, "C", "{r:#?}");
    let pull = r[0].pull.as_ref().unwrap();
    assert_eq!((pull.from.as_str(), pull.tokens), ("B", 511 * 16));
    assert_eq!(r[0].uncached_tokens, 16);
    // 8 176 tokens x 1 048 576 bits at 1e8 bits/ms, plus the fixed part.
    assert!((pull.ms - (2.2 + 8_176.0 * 131_072.0 * 8.0 / 100e6)).abs() < 1e-9);
    assert!((r[0].ttft_ms - (pull.ms + r[0].prefill_ms + r[0].wait_ms)).abs() < 1e-9);
    // Without the link, C and A tie at a full recompute, and B's queue costs more than both.
    let r = rank(&p, &cs, 8_192, BS, EXACT, 0);
    assert_ne!(r[0].worker, "B");
    assert!(r[0].pull.is_none());
}

#[test]
fn no_reach_scores_exactly_as_before() {
    let p = Profile::default();
    let c = candidate("w", 100, 5_000, 2);
    assert_eq!(score_reached(&p, &c, &Reach::default(), 4_000, BS), score(&p, &c, 4_000, BS));
}

fn arb_candidate() -> impl Strategy<Value = Candidate> {
    (0usize..600, 0u64..40_000, 0u32..8).prop_map(|(b, t, n)| candidate("w", b, t, n))
}

proptest! {
    #[test]
    fn topology_free_ranking_is_unchanged(
        cs in proptest::collection::vec(arb_candidate(), 1..8), prompt in 0u64..16_384, pick in any::<u64>()
    ) {
        let cs: Vec<Candidate> = cs.into_iter().enumerate()
            .map(|(i, c)| Candidate { worker: format!("w{i}").into(), ..c }).collect();
        let p = Profile::default();
        let none = vec![Reach::default(); cs.len()];
        prop_assert_eq!(
            rank_reached(&p, &cs, &none, prompt, BS, Weigh::default(), pick),
            rank(&p, &cs, prompt, BS, Weigh::default(), pick)
        );
        prop_assert_eq!(
            rank_reached(&p, &cs, &[], prompt, BS, Weigh::default(), pick),
            rank(&p, &cs, prompt, BS, Weigh::default(), pick)
        );
    }

    #[test]
    fn an_offer_never_costs_more_and_is_taken_only_when_it_beats_recompute(
        c in arb_candidate(), holder in 0usize..600, fixed in 0.0f64..100.0, gbps in 0.001f64..800.0,
        prompt in 0u64..16_384
    ) {
        let p = Profile::default();
        let without = score(&p, &c, prompt, BS);
        let reach = Reach { pulls: vec![offer("h", holder, fixed, gbps)], ..Default::default() };
        let with = score_reached(&p, &c, &reach, prompt, BS);
        prop_assert!(with.ttft_ms <= without.ttft_ms + 1e-9);
        match &with.pull {
            Some(pull) => {
                prop_assert!(pull.tokens > 0 && holder > c.cached_blocks);
                prop_assert!(pull.ms + with.prefill_ms < without.prefill_ms);
                prop_assert_eq!(with.cached_tokens + pull.tokens + with.uncached_tokens, prompt);
            }
            None => prop_assert_eq!(with.clone(), without),
        }
    }

    #[test]
    fn pulling_never_beats_recompute_as_bandwidth_goes_to_zero(
        c in arb_candidate(), holder in 0usize..600, prompt in 0u64..16_384, exp in 3i32..12
    ) {
        let p = Profile::default();
        let gbps = 10f64.powi(-exp);
        let reach = Reach { pulls: vec![offer("h", holder, 0.0, gbps)], ..Default::default() };
        prop_assert!(score_reached(&p, &c, &reach, prompt, BS).pull.is_none());
    }

    #[test]
    fn a_remote_holder_never_wins_once_its_round_trip_exceeds_the_prefill_it_saves(
        blocks in 1usize..600, prompt in 32u64..16_384, local_rtt in 0.0f64..2.0, extra in 0.001f64..200.0,
        pick in any::<u64>()
    ) {
        let p = Profile::default();
        let local = candidate("local", 0, 0, 0);
        let remote = candidate("remote", blocks, 0, 0);
        let saved = score(&p, &local, prompt, BS).prefill_ms - score(&p, &remote, prompt, BS).prefill_ms;
        let reaches = [
            Reach { network_ms: local_rtt, ..Default::default() },
            Reach { network_ms: local_rtt + saved + extra, ..Default::default() },
        ];
        let r = rank_reached(&p, &[local, remote], &reaches, prompt, BS, EXACT, pick);
        prop_assert_eq!(&r[0].worker, "local");
    }
}
