use std::sync::Arc;

use super::*;
use crate::decision::load::WorkerLoad;
use crate::shared::fake::{MemStore, Tally};

const M: &str = "llama";

fn sample(worker: &str, i: u64) -> Sample {
    let uncached = 100 + (i * 37) % 4000;
    let p = Profile::default();
    let load = WorkerLoad::default();
    Sample {
        worker: worker.into(),
        uncached_tokens: uncached,
        cached_tokens: 0,
        load,
        fixed_ms: 0.0,
        observed_ms: p.wait_ms(&load) + p.prefill_ms(uncached),
        priority: 0,
        passed: false,
        fill_ms: 0.0,
        wait_factor: 1.0,
    }
}

fn models(prior: Profile) -> Vec<(String, Profile)> {
    vec![(M.to_string(), prior)]
}

#[test]
fn threads_add_their_samples_to_one_state_under_contention() {
    let store = Arc::new(MemStore::new());
    let cfg = CalibrationConfig { min_samples: 10, ..Default::default() };
    let prior = Profile::default();
    init(&*store, M, &prior);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let tally = Tally::default();
                for batch in 0..25u64 {
                    let s: Vec<Sample> =
                        (0..4).map(|i| sample(&format!("10.0.0.{t}:1"), batch * 4 + i)).collect();
                    let p = publish(&*store, &tally, &cfg, M, &prior, &s);
                    assert_eq!(p.map(|p| p.used), Some(4));
                }
                tally.get(Counter::LostUpdate)
            })
        })
        .collect();
    let lost: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(lost, 0, "64 attempts outlast 4 writers");
    let (bytes, _) = store.get(&key(M));
    let st = ModelState::decode(&bytes.unwrap()).unwrap();
    assert_eq!(st.samples, 400, "no sample lost");
    assert_eq!(st.workers.len(), 4);
    let mut reader = CalibReader::default();
    let tally = Tally::default();
    let view = reader.refresh(&*store, &tally, &cfg, &models(prior), 0).expect("a view");
    assert!(view.profile_for(M).is_some());
    assert!(reader.refresh(&*store, &tally, &cfg, &models(prior), 100).is_none(), "unchanged");
    assert_eq!(reader.states()[M].samples, 400);
}

#[test]
fn the_reader_re_reads_only_when_due_and_decodes_only_moved_values() {
    let (store, tally) = (MemStore::new(), Tally::default());
    let cfg = CalibrationConfig { min_samples: 1, refresh_ms: 20, ..Default::default() };
    let prior = Profile::default();
    let mut reader = CalibReader::default();
    assert!(reader.due(&cfg, 0));
    assert!(reader.refresh(&store, &tally, &cfg, &models(prior), 0).is_none(), "nothing yet");
    assert!(!reader.due(&cfg, 19) && reader.due(&cfg, 20));
    publish(&store, &tally, &cfg, M, &prior, &[sample("a:1", 1)]).unwrap();
    let v = reader.refresh(&store, &tally, &cfg, &models(prior), 20).unwrap();
    assert_eq!(v.model(M).map(|m| m.samples), Some(1));
    let p = publish(&store, &tally, &cfg, M, &prior, &[sample("a:1", 2)]).unwrap();
    let own = reader.set_state(&cfg, M, &prior, p.state);
    assert_eq!(own.model(M).map(|m| m.samples), Some(2));
    // A reader configured with another prior ignores this state.
    let mut other = CalibReader::default();
    let changed = Profile { prefill_base_ms: 9.0, ..prior };
    assert!(other.refresh(&store, &tally, &cfg, &models(changed), 0).is_none());
}

#[test]
fn garbage_and_another_prior_start_afresh_and_lost_writes_are_counted() {
    let (store, tally) = (MemStore::new(), Tally::default());
    let cfg = CalibrationConfig::default();
    let prior = Profile::default();
    store.poke(&key(M), b"not a state");
    let mut reader = CalibReader::default();
    assert!(reader.refresh(&store, &tally, &cfg, &models(prior), 0).is_none());
    assert_eq!(tally.get(Counter::Corrupt), 1);
    let p = publish(&store, &tally, &cfg, M, &prior, &[sample("a:1", 1)]).unwrap();
    assert_eq!((p.state.samples, tally.get(Counter::Corrupt)), (1, 2));
    let changed = Profile { prefill_ms_per_token: 0.1, ..prior };
    let p = publish(&store, &tally, &cfg, M, &changed, &[sample("a:1", 2)]).unwrap();
    assert_eq!(p.state.samples, 1, "learned against the new prior only");
    assert!(p.state.matches(&changed));
    store.fail_every(1);
    assert!(publish(&store, &tally, &cfg, M, &prior, &[sample("a:1", 3)]).is_none());
    assert_eq!(tally.get(Counter::LostUpdate), 1);
}

/// A sample from a worker with a prefill queued ahead: one the promise margin learns from.
fn busy_sample(worker: &str, i: u64) -> Sample {
    let p = Profile::default();
    let load = WorkerLoad {
        inflight_requests: 1,
        prefilling_requests: 1,
        prefill_tokens: 1000,
        ..Default::default()
    };
    let s = sample(worker, i);
    Sample { load, observed_ms: p.wait_ms(&load) + p.prefill_ms(s.uncached_tokens), ..s }
}

fn busy_batch(n: u64) -> Vec<Sample> {
    (0..n).map(|i| busy_sample("a:1", i)).collect()
}

#[test]
fn the_busy_count_has_its_own_key_restarts_with_the_state_and_stops_at_its_threshold() {
    use crate::decision::calib::{codec, PROMISE_FILL_SAMPLES};
    let (store, tally) = (MemStore::new(), Tally::default());
    let cfg = CalibrationConfig { min_samples: 1, refresh_ms: 0, ..Default::default() };
    let prior = Profile::default();
    init(&store, M, &prior);
    let count = |store: &MemStore| store.get(&busy_key(M)).0;
    // Idle samples count none, and nothing is written for them.
    let p = publish(&store, &tally, &cfg, M, &prior, &[sample("a:1", 1)]).unwrap();
    assert_eq!((p.state.busy_samples, count(&store)), (0, None));
    // Busy ones are counted under their own key; the state keeps the encoding that filters
    // from before the count read (priority 0 only: version 2).
    let p = publish(&store, &tally, &cfg, M, &prior, &busy_batch(7)).unwrap();
    assert_eq!(p.state.busy_samples, 7);
    assert_eq!(count(&store), Some(7u64.to_le_bytes().to_vec()), "a little-endian u64");
    let state = store.get(&key(M)).0.unwrap();
    assert_eq!(state[3], codec::VERSION_POOL);
    assert_eq!(ModelState::decode(&state).map(|s| s.busy_samples), Ok(0));
    // A reader takes it in: until the threshold a busy promise holds a whole step.
    let mut reader = CalibReader::default();
    let fill = |v: &Calibrated| v.profile_for(M).unwrap().queue_terms().promise_fill_ms;
    let v = reader.refresh(&store, &tally, &cfg, &models(prior), 0).expect("a view");
    assert_eq!(reader.states()[M].busy_samples, 7);
    assert!(fill(&v) > 0.0);
    // The count is written after the state, so it may move alone: a reader sees that too.
    store.poke(&busy_key(M), &12u64.to_le_bytes());
    let v = reader.refresh(&store, &tally, &cfg, &models(prior), 1).expect("the count moved");
    assert_eq!(reader.states()[M].busy_samples, 12);
    assert!(fill(&v) > 0.0);
    assert!(reader.refresh(&store, &tally, &cfg, &models(prior), 2).is_none(), "unchanged");
    // At the threshold the promise is the estimate times the margin, and the count is no
    // longer written.
    let p = publish(&store, &tally, &cfg, M, &prior, &busy_batch(30)).unwrap();
    assert_eq!(p.state.busy_samples, PROMISE_FILL_SAMPLES);
    let v = reader.refresh(&store, &tally, &cfg, &models(prior), 3).unwrap();
    assert_eq!((reader.states()[M].busy_samples, fill(&v)), (PROMISE_FILL_SAMPLES, 0.0));
    let cas = store.get(&busy_key(M)).1;
    let p = publish(&store, &tally, &cfg, M, &prior, &busy_batch(5)).unwrap();
    assert_eq!((p.state.busy_samples, store.get(&busy_key(M)).1), (PROMISE_FILL_SAMPLES, cas));
    // A changed prior starts the state afresh, and the count with it.
    let changed = Profile { prefill_base_ms: 9.0, ..prior };
    let p = publish(&store, &tally, &cfg, M, &changed, &busy_batch(3)).unwrap();
    assert_eq!((p.state.samples, p.state.busy_samples), (3, 3));
    assert_eq!(count(&store), Some(3u64.to_le_bytes().to_vec()));
    // A count that does not read as one is none; a larger one is the threshold.
    let mut other = CalibReader::default();
    store.poke(&busy_key(M), b"junk");
    other.refresh(&store, &tally, &cfg, &models(changed), 0).unwrap();
    assert_eq!(other.states()[M].busy_samples, 0);
    store.poke(&busy_key(M), &u64::MAX.to_le_bytes());
    let v = other.refresh(&store, &tally, &cfg, &models(changed), 1).unwrap();
    assert_eq!((other.states()[M].busy_samples, fill(&v)), (PROMISE_FILL_SAMPLES, 0.0));
    // The state key of a model named `<M>.busy` is not the count's.
    assert_ne!(key(&format!("{M}.busy")), busy_key(M));
}

fn step(i: u64) -> StepSample {
    let streams = 1.0 + (i % 40) as f64;
    let context_tokens = streams * (500.0 + ((i * 131) % 5000) as f64);
    // A step 1.5 times the profile's costs on a 6 ms base.
    let p = Profile::default();
    let step_ms = 6.0
        + 1.5 * (p.decode_ms_per_seq * streams + p.decode_ms_per_1k_context * context_tokens / 1e3);
    StepSample { streams, context_tokens, step_ms }
}

#[test]
fn the_decode_step_has_its_own_key_and_reaches_every_readers_view() {
    let (store, tally) = (MemStore::new(), Tally::default());
    let cfg = CalibrationConfig { min_samples: 10, refresh_ms: 0, ..Default::default() };
    let prior = Profile::default();
    init(&store, M, &prior);
    let ttft_before = store.get(&key(M)).0;
    let mut reader = CalibReader::default();
    let v = reader.refresh(&store, &tally, &cfg, &models(prior), 0).expect("the fresh states");
    assert_eq!(v.steps(M), None, "too few samples");
    for batch in 0..50u64 {
        let s: Vec<StepSample> = (0..8).map(|i| step(batch * 8 + i)).collect();
        let (st, used) = publish_steps(&store, &tally, &cfg, M, &prior, &s).expect("written");
        assert_eq!((used, st.samples), (8, (batch + 1) * 8));
    }
    assert_eq!(store.get(&key(M)).0, ttft_before, "the TTFT state is untouched");
    let v = reader.refresh(&store, &tally, &cfg, &models(prior), 1).expect("the step moved");
    let (per_seq, per_1k) = v.steps(M).expect("learned");
    assert!((per_seq / (1.5 * prior.decode_ms_per_seq) - 1.0).abs() < 0.05, "{per_seq}");
    assert!((per_1k / (1.5 * prior.decode_ms_per_1k_context) - 1.0).abs() < 0.05, "{per_1k}");
    let p = v.profile_or(M, 0, &prior);
    assert_eq!((p.decode_ms_per_seq, p.decode_ms_per_1k_context), (per_seq, per_1k));
    assert!(reader.refresh(&store, &tally, &cfg, &models(prior), 2).is_none(), "unchanged");
    // A writer's own state is its view at once.
    let (st, _) = publish_steps(&store, &tally, &cfg, M, &prior, &[step(7)]).unwrap();
    assert_eq!(reader.set_steps(&cfg, M, st.clone()).steps(M), st.learned(&cfg));
}

#[test]
fn a_corrupt_or_foreign_decode_step_starts_afresh() {
    let (store, tally) = (MemStore::new(), Tally::default());
    let cfg = CalibrationConfig { min_samples: 1, ..Default::default() };
    let prior = Profile::default();
    store.poke(&steps_key(M), b"KVS\x01 short");
    let mut reader = CalibReader::default();
    assert!(reader.refresh(&store, &tally, &cfg, &models(prior), 0).is_none());
    assert_eq!(tally.get(Counter::Corrupt), 1);
    let (st, _) = publish_steps(&store, &tally, &cfg, M, &prior, &[step(1)]).unwrap();
    assert_eq!((st.samples, tally.get(Counter::Corrupt)), (1, 2));
    let changed = Profile { decode_ms_per_seq: 0.05, ..prior };
    let (st, _) = publish_steps(&store, &tally, &cfg, M, &changed, &[step(2)]).unwrap();
    assert_eq!(st.samples, 1, "learned against the new prior only");
    let mut other = CalibReader::default();
    let v = other.refresh(&store, &tally, &cfg, &models(prior), 0);
    assert!(v.is_none_or(|v| v.steps(M).is_none()), "a reader with the old prior ignores it");
    store.fail_every(1);
    assert!(publish_steps(&store, &tally, &cfg, M, &prior, &[step(3)]).is_none());
    assert_eq!(tally.get(Counter::LostUpdate), 1);
}
