use super::*;
use proptest::prelude::*;

const PROMPT: u64 = 4096;
const EXACT: TieBand = TieBand { abs_ms: 0.0, rel: 0.0 };
const BS: u32 = 16;

fn load(prefill_tokens: u64, prefilling: u32, inflight: u32) -> WorkerLoad {
    WorkerLoad {
        inflight_requests: inflight,
        prefilling_requests: prefilling,
        prefill_tokens,
        prefill_elapsed_ms: 0,
        prefill_sq_tokens: 0,
        arriving_tokens_per_s: 0,
        behind_tokens: 0,
        passing_tokens_per_s: 0,
    }
}

/// The design's three reference cases, output budget equal: A idle without the blocks,
/// B busy (40 decoding requests) with the full prefix, C moderately loaded (1000 queued
/// prefill tokens, 4 decoding) with half the prefix.
fn reference_cases() -> Vec<Candidate> {
    vec![
        Candidate {
            worker: "A".into(),
            cached_blocks: 0,
            offloaded_blocks: 0,
            load: load(0, 0, 0),
            adapter_missing: false,
            deviation: 1.0,
        },
        Candidate {
            worker: "B".into(),
            cached_blocks: 256,
            offloaded_blocks: 0,
            load: load(0, 0, 40),
            adapter_missing: false,
            deviation: 1.0,
        },
        Candidate {
            worker: "C".into(),
            cached_blocks: 128,
            offloaded_blocks: 0,
            load: load(1000, 1, 5),
            adapter_missing: false,
            deviation: 1.0,
        },
    ]
}

fn winner(profile: Profile) -> String {
    rank(&profile, &reference_cases(), PROMPT, BS, Weigh::ties(EXACT), 0)
        .remove(0)
        .worker
        .to_string()
}

fn profile(per_token: f64, interference: f64) -> Profile {
    Profile {
        prefill_base_ms: 0.0,
        prefill_ms_per_token: per_token,
        prefill_ms_per_token_sq: 0.0,
        decode_interference_ms: interference,
        decode_ms_per_seq: 0.0,
        decode_ms_per_1k_context: 0.0,
        transfer_ms_per_token: 0.0,
        adapter_load_ms: 0.0,
        step_token_budget: 0,
        queue: None,
    }
}

#[test]
fn cheap_recompute_and_costly_queueing_pick_the_idle_worker() {
    assert_eq!(winner(profile(0.01, 5.0)), "A");
}

#[test]
fn costly_recompute_and_cheap_queueing_pick_the_busy_worker_with_the_prefix() {
    assert_eq!(winner(profile(0.5, 2.0)), "B");
}

#[test]
fn balanced_costs_pick_the_moderate_worker_with_partial_reuse() {
    assert_eq!(winner(profile(0.05, 8.0)), "C");
}

#[test]
fn near_ties_are_broken_by_the_pick() {
    let c: Vec<Candidate> = ["x", "y", "z"]
        .iter()
        .map(|w| Candidate {
            worker: w.to_string().into(),
            cached_blocks: 0,
            offloaded_blocks: 0,
            load: load(0, 0, 0),
            adapter_missing: false,
            deviation: 1.0,
        })
        .collect();
    let p = Profile::default();
    let firsts: std::collections::BTreeSet<String> = (0..3)
        .map(|pick| rank(&p, &c, 100, BS, Weigh::default(), pick)[0].worker.to_string())
        .collect();
    assert_eq!(firsts.len(), 3);
}

#[test]
fn prefill_done_since_the_oldest_request_was_sent_is_not_waited_for() {
    let p = profile(0.1, 1.0);
    let queued = |elapsed| WorkerLoad { prefill_elapsed_ms: elapsed, ..load(10_000, 2, 3) };
    let wait = |elapsed| {
        score(&p, &Candidate { load: queued(elapsed), ..reference_cases()[0].clone() }, 100, BS)
            .wait_ms
    };
    // 1000 ms of queued prefill plus one decoding request.
    assert!((wait(0) - 1_001.0).abs() < 1e-9);
    // 400 ms in, 600 ms of it are left: its blocks are landing.
    assert!((wait(400) - 601.0).abs() < 1e-9);
    assert_eq!(
        score(&p, &Candidate { load: queued(400), ..reference_cases()[0].clone() }, 100, BS)
            .load
            .prefill_tokens,
        6_000
    );
    // Past the whole queue only the decoding request is left; a slower worker is less far.
    assert!((wait(5_000) - 1.0).abs() < 1e-9);
    let slow = Candidate { load: queued(400), deviation: 2.0, ..reference_cases()[0].clone() };
    assert!((score(&p, &slow, 100, BS).wait_ms - 2.0 * 801.0).abs() < 1e-9);
}

#[test]
fn a_queued_prompt_costs_what_computing_it_here_would() {
    let p = Profile::default();
    let idle = Candidate { load: WorkerLoad::default(), ..reference_cases()[0].clone() };
    let own = score(&p, &idle, 8_000, BS);
    // The same 8 k-token prompt queued on a worker (sent just now): waiting for it costs
    // its whole prefill, attention included, not only its linear part.
    let one = WorkerLoad {
        inflight_requests: 1,
        prefilling_requests: 1,
        prefill_tokens: 8_000,
        prefill_sq_tokens: 64_000_000,
        prefill_elapsed_ms: 0,
        arriving_tokens_per_s: 0,
        behind_tokens: 0,
        passing_tokens_per_s: 0,
    };
    let behind = score(&p, &Candidate { load: one, ..idle.clone() }, 0, BS);
    let fill = p.queue_terms().batch_fill_ms;
    assert!(fill > 0.0, "a busy worker's batch fills behind the request");
    assert!((behind.wait_ms - fill - own.prefill_ms).abs() < 1e-9, "{behind:?} {own:?}");
    // Eight 1 k-token prompts queue less attention than one 8 k-token prompt.
    let eight = WorkerLoad {
        prefilling_requests: 8,
        inflight_requests: 8,
        prefill_sq_tokens: 8_000_000,
        ..one
    };
    let many = score(&p, &Candidate { load: eight, ..idle.clone() }, 0, BS);
    let attention_gap = p.prefill_ms_per_token_sq * 56_000_000.0;
    let bases = 7.0 * p.prefill_base_ms;
    assert!((behind.wait_ms - (many.wait_ms - bases) - attention_gap).abs() < 1e-6);
    // Half of it done: the linear part halves, the attention part shrinks to a quarter.
    let per_token = p.prefill_ms_per_token + p.prefill_ms_per_token_sq * 8_000.0;
    let half = WorkerLoad { prefill_elapsed_ms: (4_000.0 * per_token).round() as u64, ..one };
    let left = score(&p, &Candidate { load: half, ..idle }, 0, BS);
    // (The elapsed time is in whole milliseconds: within a millisecond's tokens.)
    assert!((left.load.prefill_tokens as f64 - 4_000.0).abs() < 1.0 / per_token, "{left:?}");
    assert!((left.load.prefill_sq_tokens as f64 / 16e6 - 1.0).abs() < 0.01);
}

#[test]
fn a_partial_hit_still_pays_attention_over_the_reused_prefix() {
    let p = Profile::default();
    // 1 000 new tokens after 7 000 reused ones attend to all 8 000.
    let partial = p.prefill_with_context_ms(1_000, 7_000);
    let short = p.prefill_ms(1_000);
    let full = p.prefill_ms(8_000);
    let want = p.prefill_ms_per_token_sq * (64e6 - 49e6 - 1e6);
    assert!((partial - short - want).abs() < 1e-9);
    assert!(short < partial && partial < full);
    assert_eq!(p.prefill_with_context_ms(1_000, 0), short);
}

#[test]
fn the_engine_recomputes_the_last_token_so_an_exact_multiple_reuses_one_block_less() {
    assert_eq!(reusable_tokens(64, 16), 48);
    assert_eq!(reusable_tokens(65, 16), 64);
    assert_eq!(reusable_tokens(63, 16), 48);
    assert_eq!(reusable_tokens(17, 16), 16);
    assert_eq!(reusable_tokens(16, 16), 0);
    assert_eq!(reusable_tokens(5, 16), 0);
    assert_eq!(reusable_tokens(0, 16), 0);
    assert_eq!(reusable_tokens(100, 0), 0);
    // Page size 1 (SGLang's default): everything but the last token.
    assert_eq!(reusable_tokens(100, 1), 99);
    let p = Profile::default();
    for blocks in 1..8u64 {
        let prompt = blocks * u64::from(BS);
        let c = Candidate::<WorkerName> {
            worker: "w".into(),
            cached_blocks: blocks as usize,
            offloaded_blocks: blocks as usize,
            load: load(0, 0, 0),
            adapter_missing: false,
            deviation: 1.0,
        };
        let s = score(&p, &c, prompt, BS);
        assert_eq!(s.cached_tokens, prompt - u64::from(BS), "{prompt}");
        assert_eq!(s.uncached_tokens, u64::from(BS));
        let want = (prompt - u64::from(BS)) as f64 * p.transfer_ms_per_token;
        assert!((s.transfer_ms - want).abs() < 1e-9);
    }
}

#[test]
fn invalid_profiles_are_rejected() {
    assert!(profile(-1.0, 0.0).validate().is_err());
    assert!(profile(f64::NAN, 0.0).validate().is_err());
    assert!(profile(0.0, 1.0).validate().is_err());
    assert!(Profile::default().validate().is_ok());
}

fn arb_candidate() -> impl Strategy<Value = Candidate> {
    (0usize..300, 0u64..20_000, 0u32..8, 0u32..64, 0usize..300).prop_map(|(b, t, p, i, o)| {
        Candidate {
            worker: format!("w{b}-{t}-{p}-{i}-{o}").into(),
            cached_blocks: b,
            offloaded_blocks: o.min(b),
            load: load(t, p, p + i),
            adapter_missing: false,
            deviation: 1.0,
        }
    })
}

proptest! {
    #[test]
    fn more_cached_blocks_never_cost_more(c in arb_candidate(), extra in 0usize..50, prompt in 0u64..8192) {
        let p = Profile::default();
        let more = Candidate { cached_blocks: c.cached_blocks + extra, ..c.clone() };
        prop_assert!(score(&p, &more, prompt, BS).ttft_ms <= score(&p, &c, prompt, BS).ttft_ms);
    }

    #[test]
    fn credit_never_exceeds_what_the_engine_reuses(c in arb_candidate(), prompt in 0u64..8192, bs in 1u32..64) {
        let s = score(&Profile::default(), &c, prompt, bs);
        prop_assert!(s.cached_tokens <= reusable_tokens(prompt, bs));
        prop_assert!(s.cached_tokens < prompt || prompt == 0);
        prop_assert_eq!(s.cached_tokens % u64::from(bs), 0);
        prop_assert_eq!(s.cached_tokens + s.uncached_tokens, prompt);
    }

    #[test]
    fn gpu_blocks_beat_offloaded_ones_which_beat_recompute(c in arb_candidate(), k in 0usize..300, prompt in 0u64..8192) {
        let p = Profile::default();
        let moved = Candidate { offloaded_blocks: (c.offloaded_blocks + k).min(c.cached_blocks), ..c.clone() };
        let none = Candidate { cached_blocks: 0, offloaded_blocks: 0, ..c.clone() };
        let (base, after) = (score(&p, &c, prompt, BS), score(&p, &moved, prompt, BS));
        prop_assert!(after.ttft_ms >= base.ttft_ms);
        // Loading over PCIe is cheaper than recomputing in the default profile.
        prop_assert!(after.ttft_ms <= score(&p, &none, prompt, BS).ttft_ms);
        prop_assert!(after.transfer_ms >= 0.0 && after.transfer_ms <= after.cached_tokens as f64 * p.transfer_ms_per_token);
    }

    #[test]
    fn more_elapsed_prefill_never_costs_more(c in arb_candidate(), e in 0u64..10_000, more in 0u64..10_000) {
        let p = Profile::default();
        let at = |elapsed| Candidate { load: WorkerLoad { prefill_elapsed_ms: elapsed, ..c.load }, ..c.clone() };
        prop_assert!(score(&p, &at(e + more), 4096, BS).ttft_ms <= score(&p, &at(e), 4096, BS).ttft_ms);
    }

    #[test]
    fn more_load_never_costs_less(c in arb_candidate(), t in 0u64..5000, d in 0u32..10) {
        let p = Profile::default();
        let started = WorkerLoad {
            inflight_requests: c.load.inflight_requests + 1,
            prefilling_requests: c.load.prefilling_requests + 1,
            prefill_tokens: c.load.prefill_tokens + t, prefill_elapsed_ms: 0, prefill_sq_tokens: 0,
            arriving_tokens_per_s: 0,
            behind_tokens: 0,
            passing_tokens_per_s: 0,
        };
        let busier = Candidate { load: started, ..c.clone() };
        let decoding = Candidate { load: WorkerLoad { inflight_requests: c.load.inflight_requests + d, ..c.load }, ..c.clone() };
        let base = score(&p, &c, 4096, BS).ttft_ms;
        prop_assert!(score(&p, &busier, 4096, BS).ttft_ms >= base);
        prop_assert!(score(&p, &decoding, 4096, BS).ttft_ms >= base);
    }

    #[test]
    fn the_worker_with_the_adapter_loaded_ranks_first_until_its_queue_outweighs_loading_it(
        c in arb_candidate(), others in 1usize..6, prompt in 0u64..32_768, pick in any::<u64>()
    ) {
        let p = Profile::default();
        let exact = Weigh::ties(EXACT);
        let mut cs = vec![Candidate { worker: "loaded".into(), ..c.clone() }];
        cs.extend((0..others).map(|i| Candidate {
            worker: format!("cold{i}").into(),
            adapter_missing: true,
            ..c.clone()
        }));
        prop_assert_eq!(&rank(&p, &cs, prompt, BS, exact, pick)[0].worker, "loaded");
        // Queued prefill work on it that takes longer than loading the adapter: it loses.
        cs[0].load.prefill_tokens += (p.adapter_load_ms / p.prefill_ms_per_token) as u64 + 1;
        prop_assert_ne!(&rank(&p, &cs, prompt, BS, exact, pick)[0].worker, "loaded");
    }

    #[test]
    fn after_the_primary_equal_costs_follow_in_name_order_whatever_the_input_order(
        loads in proptest::collection::vec(0u64..3, 2..40),
        rotate in 0usize..40,
        pick in any::<u64>(),
    ) {
        // Few distinct loads: many exact ties, in name order or rotated out of it.
        let mut cs: Vec<Candidate> = loads.iter().enumerate().map(|(i, &t)| Candidate {
            worker: format!("w{i:03}").into(),
            cached_blocks: 0,
            offloaded_blocks: 0,
            load: load(t * 1000, t.min(1) as u32, t as u32),
            adapter_missing: false,
            deviation: 1.0,
        }).collect();
        let n = cs.len();
        cs.rotate_left(rotate % n);
        let r = rank(&Profile::default(), &cs, 4096, BS, Weigh::ties(EXACT), pick);
        let mut want: Vec<(f64, String)> =
            r[1..].iter().map(|s| (s.cost_ms, s.worker.to_string())).collect();
        want.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let got: Vec<(f64, String)> = r[1..].iter().map(|s| (s.cost_ms, s.worker.to_string())).collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn ranking_is_a_permutation_with_primary_in_the_tie_band(
        cs in proptest::collection::vec(arb_candidate(), 1..8),
        pick in any::<u64>(),
        stall_weight in prop_oneof![Just(0.0), 0.0f64..4.0],
    ) {
        let p = Profile::default();
        let tie = TieBand::default();
        let r = rank(&p, &cs, 4096, BS, Weigh { tie, stall_weight, ..Weigh::default() }, pick);
        prop_assert_eq!(r.len(), cs.len());
        let best = r.iter().map(|s| s.cost_ms).fold(f64::INFINITY, f64::min);
        prop_assert!(r[0].cost_ms <= best + tie.abs_ms.max(tie.rel * best));
        for s in &r {
            prop_assert_eq!(s.cost_ms, s.ttft_ms + stall_weight * s.stall_ms);
        }
        for w in r[1..].windows(2) {
            prop_assert!(w[0].cost_ms <= w[1].cost_ms);
        }
        let mut a: Vec<_> = r.iter().map(|s| s.worker.clone()).collect();
        let mut b: Vec<_> = cs.iter().map(|c| c.worker.clone()).collect();
        a.sort();
        b.sort();
        prop_assert_eq!(a, b);
    }
}

#[test]
fn urgent_arrivals_stretch_the_wait_by_the_share_of_the_worker_they_take() {
    let p = Profile::default();
    // Arrivals that take half the worker's prefill time double the wait for the work ahead
    // beyond the next step's budget: here three quarters of it.
    let budget = p.step_token_budget;
    let half = (500.0 / p.prefill_ms_per_token).round() as u64;
    let ahead = load(budget * 4, 16, 16);
    let mut l = ahead;
    l.passing_tokens_per_s = half;
    let f = passed_factor(&p, &l, 1.0);
    assert!((f - 1.75).abs() < 1e-3, "{f}");
    // A worker twice as slow gives them twice the share of its time.
    let slow = passed_factor(&p, &WorkerLoad { passing_tokens_per_s: half / 2, ..l }, 2.0);
    assert!((slow - f).abs() < 1e-3, "{slow}");
    // More than the worker can serve: held at ten times the work beyond the budget.
    l.passing_tokens_per_s = half * 4;
    assert!((passed_factor(&p, &l, 1.0) - (1.0 + 9.0 * 0.75)).abs() < 1e-9);
    // Without a budget the whole queue is stretched.
    let no_budget = Profile { step_token_budget: 0, ..p };
    assert!((passed_factor(&no_budget, &l, 1.0) - 10.0).abs() < 1e-9);
    // A queue that fits in the next step is not passed.
    let short = WorkerLoad { passing_tokens_per_s: half, ..load(budget, 4, 4) };
    assert_eq!(passed_factor(&p, &short, 1.0), 1.0);
    l.passing_tokens_per_s = 0;
    assert_eq!(passed_factor(&p, &l, 1.0), 1.0);

    let c = |load: WorkerLoad| Candidate::<WorkerName> {
        worker: "A".into(),
        cached_blocks: 0,
        offloaded_blocks: 0,
        load,
        adapter_missing: false,
        deviation: 1.0,
    };
    let plain = score(&p, &c(ahead), PROMPT, BS);
    let passed = WorkerLoad { passing_tokens_per_s: half, ..ahead };
    let s = score(&p, &c(passed), PROMPT, BS);
    assert!((s.wait_factor - f).abs() < 1e-12);
    // The queued prefill is stretched; the fill of the step it waits for is not.
    let q = p.queue_terms();
    let queued = (budget * 4) as f64 * q.ms_per_token + 16.0 * q.step_ms;
    assert!((plain.wait_ms - queued - q.batch_fill_ms).abs() < 1e-9);
    assert!((s.wait_ms - queued * f - q.batch_fill_ms).abs() < 1e-9, "{}", s.wait_ms);
    assert_eq!(p.wait_ms(&passed), s.wait_ms);
    assert_eq!(s.prefill_ms, plain.prefill_ms, "its own prefill is not passed once started");
    assert!((s.passed_ms - queued * (f - 1.0)).abs() < 1e-9);
    assert!((s.ttft_ms - plain.ttft_ms - s.passed_ms).abs() < 1e-9);
    assert!(s.promise_wait_ms() > plain.promise_wait_ms());
    // The ranking leaves it out.
    assert!((s.cost_ms - plain.cost_ms).abs() < 1e-9);
    // On a worker with nothing queued the request starts at once: nothing passes it.
    let idle = WorkerLoad { passing_tokens_per_s: half, ..load(0, 0, 4) };
    let s = score(&p, &c(idle), PROMPT, BS);
    assert_eq!(s.wait_factor, 1.0);
}
