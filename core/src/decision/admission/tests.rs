use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::decision::config::FilterConfig;

/// A score with these times, built through the cost model (the flow's tests use it too).
pub(crate) fn score(worker: &str, wait_ms: f64, ttft_ms: f64) -> Score {
    // Built through the cost model so that fields added to `Score` need no change here.
    let c = crate::decision::cost::Candidate::<crate::decision::worker::WorkerName> {
        worker: worker.into(),
        cached_blocks: 0,
        offloaded_blocks: 0,
        load: Default::default(),
        adapter_missing: false,
        deviation: 1.0,
    };
    let base = crate::decision::cost::score(&Default::default(), &c, 1, 16);
    Score { wait_ms, prefill_ms: ttft_ms - wait_ms, ttft_ms, ..base }
}

fn workers(r: &[Score]) -> Vec<&str> {
    r.iter().map(|s| s.worker.as_str()).collect()
}

fn cfg() -> AdmissionConfig {
    AdmissionConfig::default()
}

const INTERACTIVE: usize = 0;
const BATCH: usize = 1;

fn ask(deadline_ms: Option<u64>, class: usize) -> Ask {
    Ask { deadline_ms, class }
}

#[test]
fn deadline_header_values() {
    assert_eq!(parse_deadline_ms(b"250"), Some(250));
    assert_eq!(parse_deadline_ms(b" \t250 "), Some(250));
    assert_eq!(parse_deadline_ms(b"999999999999"), Some(999_999_999_999));
    for bad in [
        &b""[..],
        b"0",
        b"000",
        b"-5",
        b"+5",
        b"1.5",
        b"1e3",
        b"abc",
        b"\xff\xfe",
        b"12 3",
        b"9999999999999",
        b"99999999999999999999999",
        b"   ",
    ] {
        assert_eq!(parse_deadline_ms(bad), None, "{bad:?}");
    }
}

#[test]
fn class_header_values() {
    let c = cfg();
    assert_eq!(c.class_of(Some(b"batch")), BATCH);
    assert_eq!(c.class_of(Some(b" BaTcH\t")), BATCH);
    assert_eq!(c.class_of(Some(b"interactive")), INTERACTIVE);
    for garbage in [&b"bulk"[..], b"", b"\xffbatch", b"batch,interactive"] {
        assert_eq!(c.class_of(Some(garbage)), INTERACTIVE, "{garbage:?}");
    }
    assert_eq!(c.class_of(None), INTERACTIVE);
    let mut b = cfg();
    b.default_class = "batch".into();
    assert_eq!(b.class_of(None), BATCH);
    assert_eq!(b.class_of(Some(b"?")), BATCH);
}

#[test]
fn deadline_precedence_is_header_then_class_then_model() {
    let mut c = cfg();
    c.classes[BATCH].deadline_ms = 5_000;
    assert_eq!(c.deadline_ms(Some(b"100"), BATCH, 700), Some(100));
    assert_eq!(c.deadline_ms(Some(b"junk"), BATCH, 700), Some(5_000));
    assert_eq!(c.deadline_ms(None, INTERACTIVE, 700), Some(700));
    assert_eq!(c.deadline_ms(Some(b"0"), INTERACTIVE, 0), None);
    assert_eq!(c.ask(Some(b"40"), Some(b"batch"), 0), ask(Some(40), BATCH));
}

#[test]
fn retry_after_is_rounded_up_and_bounded() {
    let c = cfg();
    assert_eq!(c.retry_after_s(0.0), 1);
    assert_eq!(c.retry_after_s(1.0), 1);
    assert_eq!(c.retry_after_s(1000.0), 1);
    assert_eq!(c.retry_after_s(1000.5), 2);
    assert_eq!(c.retry_after_s(1e12), 60);
    assert_eq!(c.retry_after_s(f64::NAN), 60);
    assert_eq!(c.retry_after_s(f64::INFINITY), 60);
    assert_eq!(c.retry_after_s(-5.0), 1);
}

#[test]
fn a_deadline_no_worker_meets_is_shed_or_best_effort() {
    let c = cfg();
    let mut r = vec![score("a", 0.0, 120.0), score("b", 50.0, 2_600.0)];
    assert_eq!(admit(&mut r, &ask(Some(200), INTERACTIVE), &c), AdmissionVerdict::Admit);
    let shed = admit(&mut r, &ask(Some(100), INTERACTIVE), &c);
    assert_eq!(shed, AdmissionVerdict::Shed { reason: Reason::Deadline, retry_after_s: 1 });
    let mut far = vec![score("a", 2_500.0, 2_600.0)];
    let shed = admit(&mut far, &ask(Some(100), INTERACTIVE), &c);
    assert_eq!(shed, AdmissionVerdict::Shed { reason: Reason::Deadline, retry_after_s: 3 });
    let mut be = cfg();
    be.on_deadline_miss = MissPolicy::BestEffort;
    assert_eq!(
        admit(&mut r, &ask(Some(100), INTERACTIVE), &be),
        AdmissionVerdict::BestEffort(Reason::Deadline)
    );
    // A class may override the policy.
    be.classes[BATCH].on_deadline_miss = Some(MissPolicy::Shed);
    assert!(matches!(admit(&mut r, &ask(Some(100), BATCH), &be), AdmissionVerdict::Shed { .. }));
    // Without a deadline nothing is shed, however slow.
    assert_eq!(admit(&mut far, &ask(None, INTERACTIVE), &c), AdmissionVerdict::Admit);
}

/// Behind a queue admission promises the estimate times the calibrated margin; a worker with
/// nothing queued is promised its estimate. Scored through the cost model, so the margin comes
/// from where the router puts it.
#[test]
fn a_busy_workers_estimate_is_promised_with_the_calibrated_margin() {
    let profile = crate::decision::cost::Profile {
        queue: Some(crate::decision::cost::QueueTerms {
            promise_margin: 1.5,
            ..crate::decision::cost::Profile::default().queue_terms()
        }),
        ..Default::default()
    };
    let worker = |name: &str, queued: u32| crate::decision::cost::Candidate::<
        crate::decision::worker::WorkerName,
    > {
        worker: name.into(),
        cached_blocks: 0,
        offloaded_blocks: 0,
        load: crate::decision::load::WorkerLoad {
            inflight_requests: queued,
            prefilling_requests: queued,
            prefill_tokens: u64::from(queued) * 2_000,
            ..Default::default()
        },
        adapter_missing: false,
        deviation: 1.0,
    };
    let busy = crate::decision::cost::score(&profile, &worker("busy", 1), 2_000, 16);
    let idle = crate::decision::cost::score(&profile, &worker("idle", 0), 2_000, 16);
    assert_eq!((busy.promise_margin, idle.promise_margin), (1.5, 1.0));
    // A deadline the busy worker's estimate meets but its promise does not: shed.
    let deadline = ((busy.ttft_ms + busy.promise_ttft_ms()) / 2.0) as u64;
    let verdict = admit(&mut [busy.clone()], &ask(Some(deadline), INTERACTIVE), &cfg());
    assert!(matches!(verdict, AdmissionVerdict::Shed { reason: Reason::Deadline, .. }));
    // An idle worker's estimate is promised as it is.
    let deadline = idle.ttft_ms.ceil() as u64;
    let verdict = admit(&mut [idle.clone()], &ask(Some(deadline), INTERACTIVE), &cfg());
    assert_eq!(verdict, AdmissionVerdict::Admit);
    // With both, the one whose promise meets the deadline goes first.
    let mut r = vec![busy.clone(), idle.clone()];
    let deadline = idle.ttft_ms.max(busy.ttft_ms).ceil() as u64;
    assert!(busy.promise_ttft_ms() > deadline as f64);
    assert_eq!(admit(&mut r, &ask(Some(deadline), INTERACTIVE), &cfg()), AdmissionVerdict::Admit);
    assert_eq!(workers(&r), ["idle", "busy"]);
    // A class's max_wait_ms is checked against the promised wait.
    let mut c = cfg();
    c.classes[BATCH].max_wait_ms = Some((busy.wait_ms + busy.promise_wait_ms()) / 2.0);
    let verdict = admit(&mut [busy], &ask(None, BATCH), &c);
    assert!(matches!(verdict, AdmissionVerdict::Shed { reason: Reason::Saturated, .. }));
}

#[test]
fn workers_that_meet_the_deadline_go_first() {
    // The router's tie band may put a slightly slower worker first.
    let mut r = vec![score("a", 0.0, 104.0), score("b", 0.0, 100.0), score("c", 0.0, 103.0)];
    assert_eq!(admit(&mut r, &ask(Some(103), INTERACTIVE), &cfg()), AdmissionVerdict::Admit);
    assert_eq!(workers(&r), ["b", "c", "a"]);
    // Without a deadline an interactive request keeps the router's order.
    let mut r = vec![score("a", 0.0, 104.0), score("b", 0.0, 100.0)];
    admit(&mut r, &ask(None, INTERACTIVE), &cfg());
    assert_eq!(workers(&r), ["a", "b"]);
}

#[test]
fn batch_gives_a_busy_holder_up_for_an_idle_worker() {
    // "a" holds the prefix but has 60 ms of queued work; "b" recomputes in 80 ms.
    let ranked = vec![score("a", 60.0, 70.0), score("b", 0.0, 80.0)];
    let mut i = ranked.clone();
    admit(&mut i, &ask(None, INTERACTIVE), &cfg());
    assert_eq!(workers(&i), ["a", "b"]);
    let mut b = ranked.clone();
    admit(&mut b, &ask(None, BATCH), &cfg());
    assert_eq!(workers(&b), ["b", "a"]);
}

#[test]
fn batch_is_shed_when_the_pool_waits_longer_than_its_limit() {
    let mut c = cfg();
    c.classes[BATCH].max_wait_ms = Some(0.0);
    let mut idle = vec![score("a", 0.0, 10.0), score("b", 3.0, 13.0)];
    assert_eq!(admit(&mut idle, &ask(None, BATCH), &c), AdmissionVerdict::Admit);
    let mut busy = vec![score("a", 0.5, 10.0), score("b", 3.0, 13.0)];
    assert_eq!(
        admit(&mut busy, &ask(None, BATCH), &c),
        AdmissionVerdict::Shed { reason: Reason::Saturated, retry_after_s: 1 }
    );
    assert_eq!(admit(&mut busy, &ask(None, INTERACTIVE), &c), AdmissionVerdict::Admit);
    // Saturation is checked before the deadline.
    let v = admit(&mut busy, &ask(Some(1), BATCH), &c);
    assert!(matches!(v, AdmissionVerdict::Shed { reason: Reason::Saturated, .. }));
}

#[test]
fn an_empty_ranking_or_unknown_class_is_admitted() {
    assert_eq!(admit(&mut [], &ask(Some(1), BATCH), &cfg()), AdmissionVerdict::Admit);
    let mut r = vec![score("a", 0.0, 10.0)];
    assert_eq!(admit(&mut r, &ask(Some(1), 9), &cfg()), AdmissionVerdict::Admit);
}

#[test]
fn shed_bodies_are_openai_errors_golden() {
    let c = cfg();
    let r = vec![score("a", 0.0, 120.4)];
    let e = shed_error(Reason::Deadline, 1, &r, &ask(Some(50), INTERACTIVE), &c);
    assert_eq!(e.status, 429);
    assert_eq!(
        String::from_utf8(e.body()).unwrap(),
        r#"{"error":{"message":"no worker can return a first token within this request's 50 ms deadline (best estimate 120 ms); retry after 1 s","type":"rate_limit_error","param":null,"code":"ttft_deadline_unmeetable"}}"#
    );
    let mut c = cfg();
    c.classes[BATCH].max_wait_ms = Some(0.0);
    let r = vec![score("a", 30.0, 130.0)];
    let e = shed_error(Reason::Saturated, 1, &r, &ask(None, BATCH), &c);
    assert_eq!(
        String::from_utf8(e.body()).unwrap(),
        r#"{"error":{"message":"the pool is saturated for priority class 'batch' (shortest estimated wait 30 ms, class limit 0 ms); retry after 1 s","type":"rate_limit_error","param":null,"code":"pool_saturated"}}"#
    );
}

#[test]
fn a_shed_requests_detail_names_the_worker_with_the_best_promise_for_its_reason() {
    let mut c = cfg();
    c.classes[BATCH].max_wait_ms = Some(20.0);
    // "b" promises the shortest TTFT, "a" the shortest wait (its margin makes it so).
    let mut a = score("a", 25.0, 200.0);
    a.promise_margin = 1.2;
    a.passed_ms = 4.0;
    let b = score("b", 60.0, 110.0);
    let r = vec![a, b];
    assert_eq!(
        shed_detail(Reason::Deadline, 1, &r, &ask(Some(50), INTERACTIVE), &c),
        "shed=deadline; class=interactive; deadline_ms=50; max_wait_ms=-; best_worker=b; \
         predicted_ttft_ms=110.0; predicted_wait_ms=60.0; promised_ttft_ms=110.0; \
         promised_wait_ms=60.0; passed_ms=0.0; retry_after_s=1"
    );
    assert_eq!(
        shed_detail(Reason::Saturated, 2, &r, &ask(None, BATCH), &c),
        "shed=saturated; class=batch; deadline_ms=-; max_wait_ms=20; best_worker=a; \
         predicted_ttft_ms=200.0; predicted_wait_ms=25.0; promised_ttft_ms=240.0; \
         promised_wait_ms=30.0; passed_ms=4.0; retry_after_s=2"
    );
    // Nothing ranked: no worker, no times.
    assert_eq!(
        shed_detail(Reason::Deadline, 1, &[], &ask(Some(50), INTERACTIVE), &c),
        "shed=deadline; class=interactive; deadline_ms=50; max_wait_ms=-; best_worker=none; \
         predicted_ttft_ms=-; predicted_wait_ms=-; promised_ttft_ms=-; promised_wait_ms=-; \
         passed_ms=-; retry_after_s=1"
    );
}

fn parse(admission: serde_json::Value) -> Result<FilterConfig, String> {
    let v = json!({"models": [{"name": "m", "workers": ["127.0.0.1:1"], "ttft_deadline_ms": 900}],
        "admission": admission});
    FilterConfig::from_json(v.to_string().as_bytes()).map_err(|e| e.to_string())
}

#[test]
fn config_section_defaults_and_validation() {
    let c = parse(json!({})).unwrap();
    assert_eq!(c.admission, AdmissionConfig::default());
    assert_eq!(c.models[0].ttft_deadline_ms, 900);
    let c = parse(json!({"on_deadline_miss": "best_effort", "default_class": "bulk",
        "classes": [{"name": "bulk", "max_wait_ms": 5, "queue_weight": 3}]}))
    .unwrap();
    assert_eq!(c.admission.on_deadline_miss, MissPolicy::BestEffort);
    assert_eq!(c.admission.classes[0].max_wait_ms, Some(5.0));
    let bad = [
        (json!({"deadline_header": "X-Deadline"}), "lowercase"),
        (json!({"priority_header": "x-gateway-destination-endpoint"}), "destination_header"),
        (json!({"priority_header": "x-ttft-deadline-ms"}), "must differ"),
        (json!({"deadline_header": "x-kvroute-deadline"}), "x-kvroute-"),
        (json!({"priority_header": "x-envoy-priority"}), "x-envoy-"),
        (json!({"max_retry_after_s": 0}), "max_retry_after_s"),
        (json!({"classes": []}), "at least one class"),
        (json!({"classes": [{"name": "a.b"}], "default_class": "a.b"}), "[a-z0-9_]"),
        (json!({"classes": [{"name": "a"}, {"name": "a"}], "default_class": "a"}), "twice"),
        (
            json!({"classes": [{"name": "a", "queue_weight": 0.5}], "default_class": "a"}),
            "queue_weight",
        ),
        (
            json!({"classes": [{"name": "a", "max_wait_ms": -1}], "default_class": "a"}),
            "max_wait_ms",
        ),
        (
            json!({"classes": [{"name": "a", "engine_priority": 2147483648u64}],
                "default_class": "a"}),
            "engine_priority",
        ),
        (json!({"default_class": "nope"}), "default_class"),
        (json!({"on_deadline_miss": "drop"}), "unknown variant"),
        (json!({"shed": true}), "unknown field"),
    ];
    for (v, needle) in bad {
        let e = parse(v.clone()).unwrap_err();
        assert!(e.contains(needle), "{v}: {e}");
    }
}

#[test]
fn engine_priority_sets_the_class_value_or_strips_clients_once_any_class_sets_one() {
    // No class sets one: bodies are left alone.
    let c = cfg();
    assert_eq!((c.priority_edit(0), c.priority_edit(1)), (PriorityEdit::Keep, PriorityEdit::Keep));
    let c = parse(json!({"classes": [
        {"name": "interactive", "engine_priority": -5},
        {"name": "batch", "engine_priority": 10},
        {"name": "bulk"},
    ]}))
    .unwrap()
    .admission;
    assert_eq!(c.classes[0].engine_priority, Some(-5));
    assert_eq!(c.priority_edit(0), PriorityEdit::Set(-5));
    assert_eq!(c.priority_edit(1), PriorityEdit::Set(10));
    // A class without one gets the engine's default: a client's own value is removed.
    assert_eq!(c.priority_edit(2), PriorityEdit::Remove);
    let edge = json!({"classes": [{"name": "a", "engine_priority": -2147483648i64}],
        "default_class": "a"});
    assert!(parse(edge).is_ok());
}

fn ranked_strategy() -> impl Strategy<Value = Vec<Score>> {
    prop::collection::vec((0.0f64..5_000.0, 0.0f64..5_000.0), 1..6).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (wait, prefill))| score(&format!("w{i}"), wait, wait + prefill))
            .collect()
    })
}

fn is_shed(v: AdmissionVerdict) -> bool {
    matches!(v, AdmissionVerdict::Shed { .. })
}

proptest! {
    #[test]
    fn a_request_whose_best_estimate_meets_its_deadline_is_never_shed(
        ranked in ranked_strategy(), slack in 0u64..1_000, class in 0usize..2,
    ) {
        let best = ranked.iter().map(|s| s.ttft_ms).fold(f64::INFINITY, f64::min);
        let deadline = best.ceil() as u64 + slack;
        let mut r = ranked.clone();
        let v = admit(&mut r, &ask(Some(deadline.max(1)), class), &cfg());
        prop_assert_eq!(v, AdmissionVerdict::Admit);
        // The first worker then meets it.
        prop_assert!(r[0].ttft_ms <= deadline.max(1) as f64);
    }

    #[test]
    fn shedding_is_monotone_in_the_deadline(
        ranked in ranked_strategy(), d in 1u64..10_000, shorter in 0u64..10_000, class in 0usize..2,
    ) {
        let d2 = d.saturating_sub(shorter).max(1);
        let v1 = admit(&mut ranked.clone(), &ask(Some(d), class), &cfg());
        let v2 = admit(&mut ranked.clone(), &ask(Some(d2), class), &cfg());
        prop_assert!(!is_shed(v1) || is_shed(v2), "shed at {d} but not at {d2}");
        let none = admit(&mut ranked.clone(), &ask(None, class), &cfg());
        prop_assert!(!is_shed(none) || is_shed(v1));
    }

    #[test]
    fn batch_is_shed_before_interactive_at_equal_load(
        ranked in ranked_strategy(), d in prop::option::of(1u64..10_000),
        batch_wait in 0.0f64..1_000.0, extra in 0.0f64..1_000.0, limit_interactive: bool,
    ) {
        let mut c = cfg();
        c.classes[BATCH].max_wait_ms = Some(batch_wait);
        c.classes[INTERACTIVE].max_wait_ms = limit_interactive.then_some(batch_wait + extra);
        let i = admit(&mut ranked.clone(), &ask(d, INTERACTIVE), &c);
        let b = admit(&mut ranked.clone(), &ask(d, BATCH), &c);
        prop_assert!(!is_shed(i) || is_shed(b), "interactive {i:?} but batch {b:?}");
    }

    #[test]
    fn retry_after_is_at_least_one_and_bounded(
        ranked in ranked_strategy(), d in 1u64..100_000, max in 1u32..120, class in 0usize..2,
    ) {
        let mut c = cfg();
        c.max_retry_after_s = max;
        c.classes[BATCH].max_wait_ms = Some(10.0);
        if let AdmissionVerdict::Shed { retry_after_s, .. } = admit(&mut ranked.clone(), &ask(Some(d), class), &c) {
            prop_assert!((1..=max).contains(&retry_after_s));
        }
    }

    #[test]
    fn interactive_without_deadline_keeps_the_routers_order_and_every_class_permutes(
        ranked in ranked_strategy(), d in prop::option::of(1u64..10_000), class in 0usize..2,
    ) {
        let mut r = ranked.clone();
        admit(&mut r, &ask(None, INTERACTIVE), &cfg());
        prop_assert_eq!(&r, &ranked);
        let mut r = ranked.clone();
        admit(&mut r, &ask(d, class), &cfg());
        let mut a = workers(&r);
        let mut b = workers(&ranked);
        a.sort_unstable();
        b.sort_unstable();
        prop_assert_eq!(a, b);
    }
}
