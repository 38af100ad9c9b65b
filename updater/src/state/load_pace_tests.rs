//! What a scrape publishes: loads at most once per `load_publish_ms`, the pacer waking the
//! long polls for the loads that waited; a `/v1/models` answer that repeats the last, nothing.

use kvroute_core::wire::delta::Delta;

use super::*;
use crate::engine_metrics::EngineLoad;

const W1: &str = "10.0.0.1:8000";
const W2: &str = "10.0.0.2:8000";

fn state(load_publish_ms: u64) -> Arc<State> {
    let limits = Limits { load_publish_ms, ..Limits::default() };
    let workers = [W1.to_string(), W2.to_string()];
    Arc::new(State::for_models(Arc::new(Models::default()), workers, limits))
}

fn load(running: f64) -> EngineLoad {
    EngineLoad { running: Some(running), waiting: Some(0.0), kv_usage: None, observed_at_ms: 7 }
}

fn delta(a: Answer) -> Delta {
    match a {
        Answer::Delta(d) => d,
        other => panic!("expected a delta, got {other:?}"),
    }
}

/// The load `worker` carries in what a caller at `since` receives.
fn running_in(s: &State, since: u64, worker: &str) -> Option<u32> {
    let d = delta(s.answer_query(Some(since), None, true, false, false));
    d.workers.iter().find(|w| w.worker == worker).and_then(|w| w.load).map(|l| l.running)
}

#[test]
fn loads_wait_for_their_pace_even_when_other_changes_go_out() {
    let s = state(600_000);
    let v0 = s.version();
    // The first loads are due: published at once.
    s.set_load(W1, load(1.0));
    let v1 = s.version();
    assert!(v1 > v0);
    assert_eq!(running_in(&s, v0, W1), Some(1));
    // The next ones wait: no new version for them alone.
    s.set_load(W1, load(2.0));
    s.set_load(W2, load(3.0));
    assert_eq!(s.version(), v1);
    // Another change (a worker joins) goes out without them.
    assert!(s.add_worker("10.0.0.3:8000"));
    let v2 = s.version();
    assert!(v2 > v1);
    assert_eq!((running_in(&s, v1, W1), running_in(&s, v1, W2)), (None, None), "not in it");
}

#[test]
fn without_a_pace_every_scrape_is_published() {
    let s = state(0);
    let mut v = s.version();
    for running in 1..5 {
        s.set_load(W1, load(f64::from(running)));
        let next = s.version();
        assert!(next > v, "scrape {running}");
        v = next;
    }
}

#[tokio::test]
async fn the_pacer_wakes_the_long_polls_for_loads_that_waited() {
    let s = state(20);
    s.set_load(W1, load(1.0));
    let v1 = s.version();
    s.set_load(W1, load(2.0));
    // A long poll at v1 waits: the scrape alone woke nobody; the pacer does, once it is due.
    let changed = s.changed();
    let pacer = tokio::spawn(Arc::clone(&s).pace_loads());
    let woken = tokio::time::timeout(std::time::Duration::from_secs(10), changed).await;
    pacer.abort();
    assert!(woken.is_ok(), "no long poll was woken for the load");
    assert!(s.version() > v1);
    assert_eq!(running_in(&s, v1, W1), Some(2));
}

#[test]
fn a_models_answer_that_repeats_the_last_marks_nothing_changed() {
    let s = state(0);
    let served = |adapters: &[&str]| crate::worker_check::ServedModels {
        base: None,
        adapters: adapters.iter().map(|a| a.to_string()).collect(),
        adapters_cut: 0,
        names_too_long: 0,
    };
    let v0 = s.version();
    s.apply_served(W1, served(&["sql"]));
    assert_eq!(s.dirty(), [W1]);
    let v1 = s.version();
    assert!(v1 > v0, "a new adapter is a change");
    // Every scrape asks again: the same answer is not a change to publish (the worker's hash
    // lists are not rebuilt for it).
    s.apply_served(W1, served(&["sql"]));
    assert!(s.dirty().is_empty());
    s.apply_served(W1, served(&[]));
    assert_eq!(s.dirty(), [W1]);
    assert!(s.version() > v1, "an adapter unloaded is a change");
}
