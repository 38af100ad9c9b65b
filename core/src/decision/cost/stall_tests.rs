//! The price of running streams: a prefill's delay to the streams decoding where it lands,
//! and its decode's growth of the steps every stream in flight there runs in, weighed against
//! the new request's TTFT.

use super::*;
use proptest::prelude::*;

const BS: u32 = 16;
const PROMPT: u64 = 8_192;

fn worker(name: &str, cached_blocks: usize, decoding: u32, queued_tokens: u64) -> Candidate {
    let prefilling = u32::from(queued_tokens > 0);
    Candidate {
        worker: name.into(),
        cached_blocks,
        offloaded_blocks: 0,
        load: WorkerLoad {
            inflight_requests: decoding + prefilling,
            prefilling_requests: prefilling,
            prefill_tokens: queued_tokens,
            ..Default::default()
        },
        adapter_missing: false,
        deviation: 1.0,
    }
}

fn exact(stall_weight: f64) -> Weigh {
    Weigh { tie: TieBand { abs_ms: 0.0, rel: 0.0 }, stall_weight, stream_steps: 0 }
}

/// [`exact`] pricing the request's decode over `steps` steps.
fn streaming(stall_weight: f64, steps: u64) -> Weigh {
    Weigh { stream_steps: steps, ..exact(stall_weight) }
}

/// `c`'s score when ranked alone with `weigh`.
fn alone(c: &Candidate, weigh: Weigh) -> Score {
    rank(&Profile::default(), std::slice::from_ref(c), PROMPT, BS, weigh, 0).remove(0)
}

fn arb_worker() -> impl Strategy<Value = Candidate> {
    (0usize..600, 0u32..64, 0u64..40_000, 0u32..1000)
        .prop_map(|(b, d, q, id)| worker(&format!("w{id}-{b}-{d}-{q}"), b, d, q))
}

#[test]
fn the_stall_is_the_prefill_time_once_per_decoding_stream() {
    let p = Profile::default();
    let idle = score(&p, &worker("idle", 0, 0, 0), PROMPT, BS);
    assert_eq!(idle.stall_ms, 0.0);
    let busy = score(&p, &worker("busy", 0, 12, 0), PROMPT, BS);
    assert_eq!(busy.stall_ms, 12.0 * busy.prefill_ms);
    // A hit computes little, so it delays the same streams far less than a miss.
    let hit = score(&p, &worker("hit", 500, 12, 0), PROMPT, BS);
    assert!(hit.stall_ms * 10.0 < busy.stall_ms, "{} vs {}", hit.stall_ms, busy.stall_ms);
}

#[test]
fn a_priced_stall_sends_a_miss_to_the_worker_with_fewer_streams() {
    let p = Profile::default();
    // Two workers without the prefix: one decoding 40 streams (its steps slow a new prefill a
    // little), one decoding 2 behind a short queue.
    let cs = [worker("streams", 0, 40, 0), worker("queue", 0, 2, 600)];
    assert_eq!(rank(&p, &cs, PROMPT, BS, exact(0.0), 0)[0].worker, "streams");
    assert_eq!(rank(&p, &cs, PROMPT, BS, exact(1.0), 0)[0].worker, "queue");
}

#[test]
fn a_cache_hit_keeps_its_worker_when_its_stall_is_small() {
    let p = Profile::default();
    // The holder decodes 16 streams; the hit's short prefill delays them less than sending the
    // whole prompt elsewhere costs the new request.
    let cs = [worker("holder", 500, 16, 0), worker("idle", 0, 0, 0)];
    let r = rank(&p, &cs, PROMPT, BS, exact(1.0), 0);
    assert_eq!(r[0].worker, "holder");
    assert!(r[0].cost_ms > r[0].ttft_ms);
}

#[test]
fn the_decode_growth_is_priced_once_per_stream_in_flight() {
    let p = Profile::default();
    // 3 decoding, 2 still in prefill: all five will run in the steps the new stream lengthens.
    let mut c = worker("w", 0, 3, 4_000);
    c.load.inflight_requests += 1;
    c.load.prefilling_requests += 1;
    let per_step = p.decode_ms_per_seq + p.decode_ms_per_1k_context * PROMPT as f64 / 1000.0;
    let s = alone(&c, streaming(1.0, 100));
    assert!((s.growth_ms - 5.0 * 100.0 * per_step).abs() < 1e-9, "{}", s.growth_ms);
    assert!((s.stall_ms - (3.0 * s.prefill_ms + s.growth_ms)).abs() < 1e-9);
    assert_eq!(s.cost_ms, s.ttft_ms + s.stall_ms);
    // No steps priced, or an idle worker: no growth.
    assert_eq!(alone(&c, exact(1.0)).growth_ms, 0.0);
    assert_eq!(alone(&worker("idle", 0, 0, 0), streaming(1.0, 100)).growth_ms, 0.0);
    // A longer context grows each step more.
    let short = stream_growth_ms(&p, 1_000, 100);
    assert!(stream_growth_ms(&p, 32_000, 100) > 10.0 * short);
}

#[test]
fn a_hit_leaves_a_holder_whose_many_streams_its_decode_would_slow() {
    // The holder has the whole prompt cached and runs 30 streams: a hit's prefill barely
    // stalls them, but 127 steps of one more 8 k-token context slow every one of them.
    let p = Profile::default();
    let cs = [worker("holder", 600, 30, 0), worker("idle", 0, 0, 0)];
    assert_eq!(rank(&p, &cs, PROMPT, BS, exact(1.0), 0)[0].worker, "holder");
    let r = rank(&p, &cs, PROMPT, BS, streaming(1.0, 127), 0);
    assert_eq!(r[0].worker, "idle", "{r:#?}");
    // A short answer keeps the hit; TTFT alone keeps it whatever the length.
    assert_eq!(rank(&p, &cs, PROMPT, BS, streaming(1.0, 4), 0)[0].worker, "holder");
    assert_eq!(rank(&p, &cs, PROMPT, BS, streaming(0.0, 127), 0)[0].worker, "holder");
}

#[test]
fn a_stream_is_priced_over_its_output_tokens_at_most_the_horizon() {
    let w = Weigh::default();
    assert_eq!(w.for_stream(None, 128).stream_steps, 127);
    assert_eq!(w.for_stream(Some(24), 128).stream_steps, 23);
    assert_eq!(w.for_stream(Some(4_096), 128).stream_steps, 127);
    // One token is the prefill's: no decode step. A zero horizon prices none.
    assert_eq!(w.for_stream(Some(1), 128).stream_steps, 0);
    assert_eq!(w.for_stream(Some(0), 128).stream_steps, 0);
    assert_eq!(w.for_stream(Some(50), 0).stream_steps, 0);
    let priced = exact(2.0).for_stream(Some(9), 128);
    assert_eq!((priced.stall_weight, priced.stream_steps), (2.0, 8));
}

proptest! {
    #[test]
    fn a_zero_weight_ranks_on_ttft_alone(
        cs in proptest::collection::vec(arb_worker(), 1..8), pick in any::<u64>()
    ) {
        let p = Profile::default();
        let r = rank(&p, &cs, PROMPT, BS, Weigh::ties(TieBand::default()), pick);
        for s in &r {
            prop_assert_eq!(s.cost_ms, s.ttft_ms);
        }
    }

    /// Minimising `ttft + w · stall`: a larger weight never picks a worker whose streams suffer
    /// more, and never one whose TTFT is better (the trade is one way).
    #[test]
    fn a_larger_weight_trades_ttft_for_less_stall(
        cs in proptest::collection::vec(arb_worker(), 1..8),
        w1 in 0.0f64..2.0,
        more in 0.0f64..4.0,
    ) {
        let p = Profile::default();
        let a = rank(&p, &cs, PROMPT, BS, exact(w1), 0).remove(0);
        let b = rank(&p, &cs, PROMPT, BS, exact(w1 + more), 0).remove(0);
        let tol = 1e-9 * (1.0 + a.cost_ms.abs() + b.cost_ms.abs());
        prop_assert!(b.stall_ms <= a.stall_ms + tol, "{} > {}", b.stall_ms, a.stall_ms);
        prop_assert!(b.ttft_ms + tol >= a.ttft_ms, "{} < {}", b.ttft_ms, a.ttft_ms);
    }

    /// Whatever the steps priced, one more request in flight (decoding or still in prefill)
    /// never lowers the stall, and more steps never lower it either.
    #[test]
    fn more_streams_or_steps_never_lower_the_growth(
        c in arb_worker(), extra in 0u32..32, prefilling in any::<bool>(), steps in 0u64..4096,
        more in 0u64..4096,
    ) {
        let mut crowded = c.clone();
        crowded.load.inflight_requests += extra;
        if prefilling {
            crowded.load.prefilling_requests += extra;
        }
        let base = alone(&c, streaming(1.0, steps));
        let tol = 1e-9 * (1.0 + base.stall_ms);
        prop_assert!(alone(&crowded, streaming(1.0, steps)).growth_ms + tol >= base.growth_ms);
        prop_assert!(alone(&c, streaming(1.0, steps + more)).stall_ms + tol >= base.stall_ms);
        prop_assert!(base.growth_ms <= base.stall_ms + tol);
    }

    #[test]
    fn more_streams_never_lower_the_stall(c in arb_worker(), extra in 0u32..32) {
        let p = Profile::default();
        let more = Candidate {
            load: WorkerLoad { inflight_requests: c.load.inflight_requests + extra, ..c.load },
            ..c.clone()
        };
        prop_assert!(score(&p, &more, PROMPT, BS).stall_ms >= score(&p, &c, PROMPT, BS).stall_ms);
    }
}
