//! The price of running streams: a prefill's delay to the streams decoding where it lands,
//! weighed against the new request's TTFT.

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
    Weigh { tie: TieBand { abs_ms: 0.0, rel: 0.0 }, stall_weight }
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
