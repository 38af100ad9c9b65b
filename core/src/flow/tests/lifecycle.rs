use crate::decision::misdeploy::Unrouted;
use crate::decision::request::Endpoint;
use crate::flow::lifecycle::{Effect, Intake, Lifecycle, Step};
use crate::wire::journal::Source;

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";

fn journal(worker: &str, source: Source, retract: bool) -> Effect {
    Effect::Journal { worker: worker.into(), source, retract }
}

fn failed(worker: &str, why: &str) -> Effect {
    Effect::Failed { worker: worker.into(), why: why.into() }
}

#[test]
fn a_decision_credits_the_planned_worker() {
    let f = Lifecycle::new(A, true);
    assert_eq!(f.routed(), journal(A, Source::Routed, false));
    assert_eq!((f.planned(), f.served(), f.status()), (A, A, None));
}

#[test]
fn a_retry_moves_load_and_credit_from_the_planned_to_the_serving_worker() {
    let mut f = Lifecycle::new(A, true);
    let out = f.response_started(Some(200), Some(B), b"via_upstream", false);
    assert_eq!(
        out,
        vec![
            Effect::Served { planned: false },
            Effect::MoveLoad { to: B.into() },
            failed(A, "another worker served its request"),
            Effect::Answered { worker: B.into() },
            journal(A, Source::Routed, true),
            journal(B, Source::Routed, false),
        ]
    );
    assert_eq!(f.served(), B);
    // The served worker's answer ends: the load it carries is released, credit confirmed.
    assert_eq!(
        f.finish(Some(32)),
        vec![
            Effect::Release,
            Effect::Audit { worker: B.into(), actual: 32 },
            journal(B, Source::Feedback, false)
        ]
    );
}

#[test]
fn a_retry_that_failed_too_leaves_no_credit_anywhere() {
    let mut f = Lifecycle::new(A, false);
    let out = f.response_started(Some(503), Some(B), b"via_upstream", false);
    assert!(out.contains(&journal(A, Source::Routed, true)));
    assert!(!out.iter().any(|e| matches!(e, Effect::Journal { retract: false, .. })));
}

#[test]
fn a_cluster_that_ignores_the_header_does_not_blame_the_planned_worker() {
    let mut f = Lifecycle::new(A, false);
    let out = f.response_started(Some(200), Some(B), b"via_upstream", true);
    assert!(!out.contains(&failed(A, "another worker served its request")));
    assert!(out.contains(&Effect::MoveLoad { to: B.into() }));
}

#[test]
fn a_failed_answer_from_the_planned_worker_retracts_its_credit() {
    let mut f = Lifecycle::new(A, true);
    let out = f.response_started(Some(500), Some(A), b"via_upstream", false);
    assert_eq!(
        out,
        vec![
            Effect::Served { planned: true },
            Effect::Answered { worker: A.into() },
            journal(A, Source::Routed, true)
        ]
    );
}

#[test]
fn a_local_reply_that_blames_the_upstream_marks_it_failed_and_retracts() {
    let mut f = Lifecycle::new(A, true);
    let details = b"upstream_reset_before_response_started{connection_failure}";
    let out = f.response_started(Some(503), None, details, false);
    assert_eq!(
        out,
        vec![
            failed(A, "upstream_reset_before_response_started{connection_failure}"),
            journal(A, Source::Routed, true)
        ]
    );
    // Envoy's own overflow is not the worker's failure.
    let mut g = Lifecycle::new(A, true);
    let out = g.response_started(
        Some(503),
        None,
        b"upstream_reset_before_response_started{overflow}",
        false,
    );
    assert_eq!(out, vec![journal(A, Source::Routed, true)]);
}

#[test]
fn the_load_is_released_exactly_once_however_the_stream_ends() {
    // Trailers end it, then the log comes.
    let mut f = Lifecycle::new(A, true);
    f.response_started(Some(200), Some(A), b"via_upstream", false);
    assert_eq!(f.finish(None), vec![Effect::Release]);
    assert!(f.released());
    assert!(f.finish(None).is_empty());
    assert!(f.finish(Some(5)).is_empty());
}

#[test]
fn a_reset_before_any_response_gives_the_credit_back() {
    let mut f = Lifecycle::new(A, true);
    assert_eq!(f.finish(Some(100)), vec![Effect::Release, journal(A, Source::Routed, true)]);
    assert!(f.finish(None).is_empty());
}

#[test]
fn usage_of_a_failed_answer_is_audited_but_not_credited() {
    let mut f = Lifecycle::new(A, true);
    f.response_started(Some(429), Some(A), b"via_upstream", false);
    assert_eq!(
        f.finish(Some(0)),
        vec![Effect::Release, Effect::Audit { worker: A.into(), actual: 0 }]
    );
}

#[test]
fn the_first_byte_ends_prefill_once_and_calibrates_only_the_scored_worker() {
    let mut f = Lifecycle::new(A, true);
    f.response_started(Some(200), Some(A), b"via_upstream", false);
    assert_eq!(f.first_byte(), vec![Effect::FirstByte { prefill_ended: true }, Effect::Calibrate]);
    assert!(f.first_byte().is_empty());
    // Served elsewhere: the estimate was for another worker.
    let mut g = Lifecycle::new(A, true);
    g.response_started(Some(200), Some(B), b"via_upstream", false);
    assert_eq!(g.first_byte(), vec![Effect::FirstByte { prefill_ended: true }]);
    // Not a first token (non-streamed, many output tokens), or a failed answer.
    let mut h = Lifecycle::new(A, false);
    h.response_started(Some(200), Some(A), b"via_upstream", false);
    assert_eq!(h.first_byte(), vec![Effect::FirstByte { prefill_ended: false }]);
    let mut i = Lifecycle::new(A, true);
    i.response_started(Some(500), Some(A), b"via_upstream", false);
    assert_eq!(i.first_byte(), vec![Effect::FirstByte { prefill_ended: false }]);
}

#[test]
fn a_stream_reset_after_the_response_began_marks_the_served_worker_down() {
    let mut f = Lifecycle::new(A, true);
    assert_eq!(f.ended(b"upstream_reset_after_response_started{remote_reset}"), None);
    f.response_started(Some(200), Some(B), b"via_upstream", false);
    assert_eq!(
        f.ended(b"upstream_reset_after_response_started{remote_reset}"),
        Some(failed(B, "reset its response stream"))
    );
    assert_eq!(f.ended(b"via_upstream"), None);
}

#[test]
fn only_posts_to_known_endpoints_are_routed() {
    let mut i = Intake::default();
    assert_eq!(i.headers(b"GET", b"/v1/chat/completions", false), Step::Continue);
    assert!(!i.wants_body());
    assert_eq!(i.body(10, true, 100), Step::Continue);
    let mut i = Intake::default();
    assert_eq!(i.headers(b"POST", b"/v1/models", false), Step::Continue);
    let mut i = Intake::default();
    assert_eq!(i.headers(b"POST", b"/v1/chat/completions", false), Step::WaitForBody);
    assert!(i.wants_body());
}

#[test]
fn the_body_is_buffered_then_decided_on_at_its_end_or_at_the_trailers() {
    let mut i = Intake::default();
    i.headers(b"POST", b"/v1/completions", false);
    assert_eq!(i.body(10, false, 100), Step::Buffer);
    assert_eq!(i.body(20, true, 100), Step::Decide { endpoint: Endpoint::Completions, len: 20 });
    let mut t = Intake::default();
    t.headers(b"POST", b"/v1/completions", false);
    assert_eq!(t.body(30, false, 100), Step::Buffer);
    assert_eq!(t.trailers(), Step::Decide { endpoint: Endpoint::Completions, len: 30 });
}

#[test]
fn empty_and_oversized_bodies_are_refused() {
    let mut i = Intake::default();
    let Step::Reject(e) = i.headers(b"POST", b"/v1/completions", true) else { panic!() };
    assert_eq!(e.status, 400);
    let mut t = Intake::default();
    t.headers(b"POST", b"/v1/completions", false);
    let Step::Reject(e) = t.trailers() else { panic!() };
    assert_eq!(e.status, 400);
    let mut big = Intake::default();
    big.headers(b"POST", b"/v1/completions", false);
    let Step::Reject(e) = big.body(101, false, 100) else { panic!() };
    assert_eq!(e.status, 413);
    assert!(!big.wants_body());
    assert_eq!(big.body(200, true, 100), Step::Continue);
}

#[test]
fn a_request_passed_on_streams_through_unrouted() {
    let mut i = Intake::default();
    i.headers(b"POST", b"/v1/completions", false);
    i.pass_on(Unrouted::BodyNotDelivered);
    assert_eq!(i.unrouted(), Some(Unrouted::BodyNotDelivered));
    assert_eq!(i.body(10, true, 100), Step::Continue);
    assert_eq!(i.trailers(), Step::Continue);
}
