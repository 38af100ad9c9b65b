//! Placement labels: learned from discovery, published with their age to callers that ask,
//! forgotten with their worker.

use kvroute_core::decision::topology::Labels;
use kvroute_core::wire::delta::Delta;
use kvroute_core::wire::snapshot::{Snapshot, WorkerPlacement};

use super::*;

fn state() -> State {
    State::for_models(
        Arc::new(Models::default()),
        ["10.0.0.1:8000".to_string(), "10.0.0.2:8000".to_string()],
        Limits::default(),
    )
}

fn zone(z: &str) -> Labels {
    Labels { site: Some("east".into()), zone: Some(z.into()), ..Labels::default() }
}

fn full(a: Answer) -> Snapshot {
    match a {
        Answer::Full(s) => s,
        other => panic!("expected a full snapshot, got {other:?}"),
    }
}

fn delta(a: Answer) -> Delta {
    match a {
        Answer::Delta(d) => d,
        other => panic!("expected a delta, got {other:?}"),
    }
}

#[test]
fn labels_reach_snapshots_and_deltas_with_their_age() {
    let s = state();
    let v0 = s.version();
    assert!(full(s.answer_query(None, None, true, true, true)).placements.is_empty());
    s.set_labels("10.0.0.1:8000", &zone("e1"), 1_000);
    s.set_labels("nobody:1", &zone("e1"), 1_000);
    let snap = full(s.answer_query(None, None, true, true, true));
    let want = WorkerPlacement {
        worker: "10.0.0.1:8000".into(),
        site: Some("east".into()),
        zone: Some("e1".into()),
        rack: None,
        node: None,
        observed_at_ms: 1_000,
    };
    assert_eq!(
        snap.placements,
        std::slice::from_ref(&want),
        "an unknown worker's labels are not kept"
    );
    let d = delta(s.answer_query(Some(v0), None, true, true, true));
    assert_eq!(d.placements.as_deref(), Some(std::slice::from_ref(&want)));
    // A caller that does not ask gets the bytes it always got.
    let old = full(s.answer_query(None, None, true, true, false));
    assert!(old.placements.is_empty());
    assert_eq!(delta(s.answer_query(Some(v0), None, true, true, false)).placements, None);
    // Seen again later: the age moves; a changed zone travels in a delta of its own.
    let v1 = s.version();
    s.set_labels("10.0.0.1:8000", &zone("e2"), 2_000);
    let d = delta(s.answer_query(Some(v1), None, true, true, true));
    let moved = WorkerPlacement { zone: Some("e2".into()), observed_at_ms: 2_000, ..want };
    assert_eq!(d.placements, Some(vec![moved.clone()]));
    assert!(d.workers.is_empty(), "only the placements changed");
    let mut at_v1 = snap.clone();
    at_v1.version = v1;
    at_v1.apply_delta(&d).unwrap();
    assert_eq!(at_v1.placements, [moved]);
    // No label known before or now: nothing changes.
    let v2 = s.version();
    s.set_labels("10.0.0.2:8000", &Labels::default(), 3_000);
    assert_eq!(s.version(), v2);
    // The worker leaves: its placement goes with it.
    assert!(s.remove_worker("10.0.0.1:8000"));
    let d = delta(s.answer_query(Some(v2), None, true, true, true));
    assert_eq!(d.placements, Some(vec![]));
    assert!(full(s.answer_query(None, None, true, true, true)).placements.is_empty());
}

#[test]
fn status_shows_each_workers_placement_and_its_age() {
    let s = state();
    let l = Labels { node: Some("n1".into()), rack: Some("r1".into()), ..Labels::default() };
    s.set_labels("10.0.0.2:8000", &l, now_ms());
    let st = s.status();
    let p = &st["workers"]["10.0.0.2:8000"]["placement"];
    assert_eq!((p["node"].as_str(), p["rack"].as_str()), (Some("n1"), Some("r1")));
    assert!(p["site"].is_null() && p["age_ms"].as_u64().is_some_and(|a| a < 60_000));
    assert!(st["workers"]["10.0.0.1:8000"]["placement"].is_null());
}
