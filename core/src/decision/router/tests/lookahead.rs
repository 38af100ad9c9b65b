//! The look-ahead inside a decision: a hot prefix held by a worker with a lasting queue is
//! placed on one more worker; a prefix still in flight on its holder (a fan-out) is not, though
//! a long answer's decode beside the one in flight may send it elsewhere.

use super::*;
use crate::decision::cost::{stream_growth_ms, Profile};
use crate::wire::journal::JournalEntry;

fn two_workers() -> Router {
    let cfg = FilterConfig::from_json(
        json!({"models":[{"name":"m","workers":["127.0.0.1:1","127.0.0.1:2"]}],
               "tie_band":{"abs_ms":0.0,"rel":0.0}})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    Router::new(&cfg).unwrap()
}

fn routed(r: &mut Router, worker: &str, hashes: &[u64], at_ms: u64) {
    r.apply_journal(&JournalEntry {
        seq: 0,
        at_ms,
        source: Source::Routed,
        worker: worker.into(),
        hashes: hashes.to_vec(),
        retract: false,
    });
}

/// The holder has ~90 ms of other prefill queued: less than a recompute elsewhere.
fn queued_on_holder(w: &str) -> WorkerLoad {
    if w == "127.0.0.1:1" {
        WorkerLoad {
            inflight_requests: 2,
            prefilling_requests: 2,
            prefill_tokens: 2_500,
            prefill_elapsed_ms: 0,
            prefill_sq_tokens: 0,
            arriving_tokens_per_s: 0,
            behind_tokens: 0,
            passing_tokens_per_s: 0,
        }
    } else {
        WorkerLoad::default()
    }
}

fn decide_after(arrivals: &[u64], now_ms: u64) -> Decision {
    let mut r = two_workers();
    let q = req(None, &LONG.repeat(200));
    let hashes = r.decide(&q, 0, &|_: &str| WorkerLoad::default(), 0, 0).unwrap().block_hashes;
    for &at in arrivals {
        routed(&mut r, "127.0.0.1:1", &hashes, at);
    }
    r.decide(&q, 0, &queued_on_holder, now_ms, 0).unwrap()
}

#[test]
fn a_hot_prefix_behind_a_lasting_queue_is_placed_on_another_worker() {
    // Ten requests for it over the last second, the last one long done.
    let arrivals: Vec<u64> = (0..10).map(|i| 1_000 + i * 100).collect();
    let d = decide_after(&arrivals, 2_500);
    assert!(d.replicated);
    assert_eq!(d.primary().unwrap().worker, "127.0.0.1:2");
    assert_eq!(d.predicted_cached_tokens(), 0);
    // The holder stays the first fallback, and the estimates are the cost model's own.
    assert_eq!(d.ranked[1].worker, "127.0.0.1:1");
    assert!(d.ranked[1].ttft_ms < d.ranked[0].ttft_ms);
}

#[test]
fn a_cold_prefix_stays_greedy() {
    let d = decide_after(&[1_000], 2_500);
    assert!(!d.replicated);
    assert_eq!(d.primary().unwrap().worker, "127.0.0.1:1");
}

#[test]
fn a_fan_out_waits_for_its_context_in_flight_instead_of_recomputing_it() {
    // The same ten requests, all within the last few ms: the holder's queue is the shared
    // context being prefilled right now.
    let arrivals: Vec<u64> = (0..10).map(|i| 2_490 + i).collect();
    let d = decide_after(&arrivals, 2_500);
    assert!(!d.replicated);
    assert_eq!(d.primary().unwrap().worker, "127.0.0.1:1");
}

#[test]
fn look_ahead_off_is_greedy() {
    let cfg = FilterConfig::from_json(
        json!({"models":[{"name":"m","workers":["127.0.0.1:1","127.0.0.1:2"]}],
               "tie_band":{"abs_ms":0.0,"rel":0.0},"lookahead":{"enabled":false}})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let mut r = Router::new(&cfg).unwrap();
    let q = req(None, &LONG.repeat(200));
    let hashes = r.decide(&q, 0, &|_: &str| WorkerLoad::default(), 0, 0).unwrap().block_hashes;
    for i in 0..10 {
        routed(&mut r, "127.0.0.1:1", &hashes, 1_000 + i * 100);
    }
    let d = r.decide(&q, 0, &queued_on_holder, 2_500, 0).unwrap();
    assert!(!d.replicated);
    assert_eq!(d.primary().unwrap().worker, "127.0.0.1:1");
}

/// The same prompt in flight on worker 1 (routed just now, nothing else queued but that
/// prefill), worker 2 idle: which worker each pick of the next request for it goes to, asking
/// for `max_tokens`.
fn next_to_a_prefill_in_flight(max_tokens: u64) -> Vec<String> {
    let cfg = FilterConfig::from_json(
        json!({"models":[{"name":"m","workers":["127.0.0.1:1","127.0.0.1:2"]}],
               "tie_band":{"abs_ms":2.0,"rel":0.05}})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let mut r = Router::new(&cfg).unwrap();
    let q = ParsedRequest { max_tokens: Some(max_tokens), ..req(None, &LONG.repeat(200)) };
    let first = r.decide(&q, 0, &|_: &str| WorkerLoad::default(), 0, 0).unwrap();
    routed(&mut r, "127.0.0.1:1", &first.block_hashes, 0);
    let tokens = first.uncached_tokens();
    let inflight = |w: &str| {
        if w == "127.0.0.1:1" {
            WorkerLoad {
                inflight_requests: 1,
                prefilling_requests: 1,
                prefill_tokens: tokens,
                prefill_elapsed_ms: 0,
                prefill_sq_tokens: 0,
                arriving_tokens_per_s: 0,
                behind_tokens: 0,
                passing_tokens_per_s: 0,
            }
        } else {
            WorkerLoad::default()
        }
    };
    (0..8)
        .map(|pick| r.decide(&q, 0, &inflight, 1, pick).unwrap().ranked[0].worker.to_string())
        .collect()
}

#[test]
fn among_equal_estimates_the_worker_sharing_the_prompt_wins() {
    // Waiting for the prefill in flight on worker 1 costs about what recomputing on worker 2
    // does; a one-token answer runs no decode beside it, and the tie goes to less work.
    assert_eq!(next_to_a_prefill_in_flight(1), vec!["127.0.0.1:1"; 8]);
}

#[test]
fn ranked_again_a_request_prices_its_stream_as_it_did() {
    // A claim ranks a decision again on a newer load view (`Router::rerank`): the request's
    // own output limit still sets how long its stream is priced.
    let r = router();
    let busy = |_: &str| WorkerLoad { inflight_requests: 3, ..Default::default() };
    for (max_tokens, steps) in [(Some(1), 0.0), (Some(9), 8.0), (None, 127.0)] {
        let q = ParsedRequest { max_tokens, ..req(None, &LONG.repeat(20)) };
        let d = r.decide(&q, 0, &busy, 0, 0).unwrap();
        let again = r.rerank(&q, &d, &busy, 1, 0).unwrap();
        let p = Profile::default();
        let growth = 3.0 * stream_growth_ms(&p, d.prompt_tokens, 1) * steps;
        for s in [d.primary().unwrap(), again.primary().unwrap()] {
            assert!((s.growth_ms - growth).abs() < 1e-6, "{max_tokens:?}: {}", s.growth_ms);
        }
    }
}

#[test]
fn a_long_answer_leaves_the_worker_whose_stream_it_would_slow() {
    // Asking for 128 tokens, the request would decode beside the one in flight on worker 1,
    // each step of both longer (the fan-out's sub-requests on their context's holder): at an
    // equal TTFT that decides it.
    assert_eq!(next_to_a_prefill_in_flight(128), vec!["127.0.0.1:2"; 8]);
}
