//! The fill of a busy worker's next step, foreseen from its arrivals
//! ([`Score::fill_forecast_ms`]): in the promise only, bounded by a step's room.

use proptest::prelude::*;

use super::*;

const BS: u32 = 16;

fn worker(load: WorkerLoad, deviation: f64) -> Candidate {
    Candidate {
        worker: "w".into(),
        cached_blocks: 0,
        offloaded_blocks: 0,
        load,
        adapter_missing: false,
        deviation,
    }
}

/// One 2 000-token prompt queued, sent just now, with `per_s` prompt tokens arriving per
/// second.
fn queued(per_s: u64) -> WorkerLoad {
    WorkerLoad {
        inflight_requests: 1,
        prefilling_requests: 1,
        prefill_tokens: 2_000,
        prefill_sq_tokens: 4_000_000,
        prefill_elapsed_ms: 0,
        arriving_tokens_per_s: per_s,
        behind_tokens: 0,
        passing_tokens_per_s: 0,
    }
}

#[test]
fn the_arrivals_while_a_request_waits_fill_its_step_in_the_promise_only() {
    let p = Profile::default();
    let still = score(&p, &worker(queued(0), 1.0), 2_000, BS);
    let busy = score(&p, &worker(queued(40_000), 1.0), 2_000, BS);
    // The estimate, and so the ranking, is the same: only the promise foresees the fill.
    assert_eq!((busy.ttft_ms, busy.cost_ms), (still.ttft_ms, still.cost_ms));
    assert_eq!((still.fill_forecast_ms, still.promise_extra_ms), (0.0, 0.0));
    // 40 k tokens/s over the wait for the queue ahead (the wait without the learned fill),
    // at the worker's prefill speed, beyond the learned fill the estimate holds already.
    let fill = p.queue_terms().batch_fill_ms;
    let ahead = still.wait_ms - fill;
    let want = 40_000.0 * ahead / 1000.0 * p.prefill_ms_per_token - fill;
    assert!(want > 0.0 && (busy.fill_forecast_ms - want).abs() < 1e-9, "{busy:?}");
    assert_eq!(busy.promise_extra_ms, busy.fill_forecast_ms);
    assert!((busy.promise_ttft_ms() - still.promise_ttft_ms() - want).abs() < 1e-9);
    // A slower worker waits longer and prefills the arrivals slower.
    let slow = score(&p, &worker(queued(40_000), 2.0), 2_000, BS);
    let want_slow = (40_000.0 * 2.0 * ahead / 1000.0 * p.prefill_ms_per_token - fill) * 2.0;
    assert!((slow.fill_forecast_ms - want_slow).abs() < 1e-9, "{slow:?}");
}

#[test]
fn the_fill_stops_at_the_room_the_requests_last_chunk_leaves_in_a_step() {
    let p = Profile::default();
    let flood = queued(u64::MAX / 2_000);
    let fill = p.queue_terms().batch_fill_ms;
    let room = |own: u64| score(&p, &worker(flood, 1.0), own, BS).fill_forecast_ms;
    let step = p.step_token_budget;
    assert!((room(2_000) - ((step - 2_000) as f64 * p.prefill_ms_per_token - fill)).abs() < 1e-9);
    // A prompt of a step and a half: its last chunk is half a step.
    let half = step + step / 2;
    assert!((room(half) - ((step / 2) as f64 * p.prefill_ms_per_token - fill)).abs() < 1e-9);
    // A last chunk that fills its step whole leaves no room.
    assert_eq!(room(2 * step), 0.0);
    // An idle worker starts the request's step at once: nothing fills it first.
    let idle = WorkerLoad { arriving_tokens_per_s: u64::MAX / 2_000, ..WorkerLoad::default() };
    let at_once = score(&p, &worker(idle, 1.0), 2_000, BS);
    assert_eq!((at_once.fill_forecast_ms, at_once.promise_extra_ms), (0.0, 0.0));
}

#[test]
fn less_urgent_prompts_queued_behind_the_request_fill_its_step_too() {
    let p = Profile::default();
    // Two 2 000-token prompts queued; the second, less urgent and not started, waits behind.
    let both = WorkerLoad {
        prefilling_requests: 2,
        inflight_requests: 2,
        prefill_tokens: 4_000,
        ..queued(0)
    };
    let part = WorkerLoad { prefilling_requests: 1, inflight_requests: 1, ..queued(0) };
    let seen = both.less(part);
    assert_eq!((seen.prefill_tokens, seen.behind_tokens), (2_000, 2_000));
    let fill = p.queue_terms().batch_fill_ms;
    let urgent = score(&p, &worker(seen, 1.0), 2_000, BS);
    let want = 2_000.0 * p.prefill_ms_per_token - fill;
    assert!((urgent.fill_forecast_ms - want).abs() < 1e-9, "{urgent:?}");
    // Behind and arriving together still fill at most the step's room.
    let flood = WorkerLoad { arriving_tokens_per_s: 1_000_000, behind_tokens: 5_000, ..queued(0) };
    let full = score(&p, &worker(flood, 1.0), 2_000, BS);
    let room = (p.step_token_budget - 2_000) as f64 * p.prefill_ms_per_token - fill;
    assert!((full.fill_forecast_ms - room).abs() < 1e-9, "{full:?}");
}

#[test]
fn a_promise_still_learning_its_margin_keeps_the_larger_of_its_fills() {
    let mut p = Profile::default();
    let mut q = p.queue_terms();
    q.promise_fill_ms = 100.0;
    p.queue = Some(q);
    let few = score(&p, &worker(queued(4_000), 1.0), 2_000, BS);
    assert!(few.fill_forecast_ms > 0.0 && few.fill_forecast_ms < 100.0, "{few:?}");
    assert_eq!(few.promise_extra_ms, 100.0);
    let many = score(&p, &worker(queued(u64::MAX / 2_000), 1.0), 2_000, BS);
    assert!(many.fill_forecast_ms > 100.0, "{many:?}");
    assert_eq!(many.promise_extra_ms, many.fill_forecast_ms);
}

proptest! {
    /// The foreseen fill is never negative, never more than a whole step at the worker's
    /// speed, grows with the arrival rate and leaves the estimate alone.
    #[test]
    fn the_foreseen_fill_is_bounded_and_grows_with_the_arrivals(
        queued_tokens in 1u64..40_000,
        own in 1u64..20_000,
        per_s in 0u64..1_000_000,
        more in 0u64..1_000_000,
        deviation in 0.25f64..4.0,
    ) {
        let p = Profile::default();
        let load = |per_s| WorkerLoad { prefill_tokens: queued_tokens, ..queued(per_s) };
        let a = score(&p, &worker(load(per_s), deviation), own, BS);
        let b = score(&p, &worker(load(per_s + more), deviation), own, BS);
        let step = p.step_token_budget as f64 * p.prefill_ms_per_token * deviation;
        prop_assert!(a.fill_forecast_ms >= 0.0 && a.fill_forecast_ms <= step);
        prop_assert!(b.fill_forecast_ms >= a.fill_forecast_ms);
        prop_assert!(a.promise_extra_ms >= a.fill_forecast_ms);
        prop_assert_eq!(a.ttft_ms, b.ttft_ms);
    }
}
