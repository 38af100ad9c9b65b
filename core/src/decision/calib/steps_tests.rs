use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::codec::CodecError;
use super::steps::{median_gap, token_events, StreamSteps, MAX_GAPS, MIN_GAPS};
use super::*;

/// A decode step unlike the configured profile's: 1.7× its per-sequence cost, 2.5× its
/// per-context cost, and a 6 ms base.
const TRUE_BASE: f64 = 6.0;
const TRUE_PER_SEQ: f64 = 0.051;
const TRUE_PER_1K: f64 = 0.1;

fn true_step(streams: f64, context: f64) -> f64 {
    TRUE_BASE + TRUE_PER_SEQ * streams + TRUE_PER_1K * context / 1000.0
}

/// A stream on a worker running 1 to 64 requests, whose prompts hold `per_stream` tokens each
/// (or, with `None`, 200 to 8 000 tokens each, drawn per sample).
fn draw(rng: &mut StdRng, per_stream: Option<f64>) -> StepSample {
    let streams = f64::from(rng.random_range(1..=64u32));
    let each = per_stream.unwrap_or_else(|| rng.random_range(200.0..8000.0));
    let context_tokens = streams * each;
    StepSample { streams, context_tokens, step_ms: true_step(streams, context_tokens) }
}

fn learn(prior: &Profile, n: usize, per_stream: Option<f64>, seed: u64) -> StepState {
    let cfg = CalibrationConfig::default();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut st = StepState::new(prior);
    for _ in 0..n {
        let s = draw(&mut rng, per_stream);
        assert!(st.observe(&cfg, &s));
    }
    st
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    (got / want - 1.0).abs() <= tol
}

#[test]
fn streams_of_varied_contexts_teach_both_coefficients_and_the_base() {
    let prior = Profile::default();
    for seed in [1, 2, 3] {
        let [base, per_seq, per_1k] = learn(&prior, 2000, None, seed).coefficients();
        assert!(close(base, TRUE_BASE, 0.05), "seed {seed}: base {base}");
        assert!(close(per_seq, TRUE_PER_SEQ, 0.05), "seed {seed}: per seq {per_seq}");
        assert!(close(per_1k, TRUE_PER_1K, 0.05), "seed {seed}: per 1k {per_1k}");
    }
}

#[test]
fn alike_contexts_teach_what_a_stream_adds_though_not_how_it_splits() {
    let prior = Profile::default();
    let st = learn(&prior, 2000, Some(3000.0), 4);
    let [_, per_seq, per_1k] = st.coefficients();
    // What a stream of 3 000 tokens adds to each step is learned, though not how it splits.
    let added = per_seq + per_1k * 3.0;
    let want = TRUE_PER_SEQ + TRUE_PER_1K * 3.0;
    assert!(close(added, want, 0.05), "added {added} want {want}");
    let s = StepSample { streams: 10.0, context_tokens: 30_000.0, step_ms: 0.0 };
    assert!(close(st.model_ms(&s), true_step(10.0, 30_000.0), 0.02));
}

#[test]
fn the_coefficients_stay_within_their_bound_and_a_zero_prior_stays_zero() {
    let cfg = CalibrationConfig::default();
    let prior = Profile { decode_ms_per_1k_context: 0.0, ..Profile::default() };
    let mut st = StepState::new(&prior);
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..500 {
        let streams = f64::from(rng.random_range(1..=64u32));
        // A per-sequence cost 100 times the prior's.
        let s =
            StepSample { streams, context_tokens: streams * 2000.0, step_ms: 6.0 + 3.0 * streams };
        assert!(st.observe(&cfg, &s));
    }
    let [_, per_seq, per_1k] = st.coefficients();
    assert!(close(per_seq, prior.decode_ms_per_seq * cfg.coefficient_bound, 1e-9), "{per_seq}");
    assert_eq!(per_1k, 0.0);
}

#[test]
fn unusable_samples_are_refused_and_change_nothing() {
    let cfg = CalibrationConfig::default();
    let mut st = StepState::new(&Profile::default());
    let before = st.clone();
    for (streams, context_tokens, step_ms) in [
        (4.0, 4000.0, 0.0),
        (4.0, 4000.0, -3.0),
        (4.0, 4000.0, f64::NAN),
        (0.0, 4000.0, 7.0),
        (4.0, f64::INFINITY, 7.0),
        (4.0, -1.0, 7.0),
    ] {
        assert!(!st.observe(&cfg, &StepSample { streams, context_tokens, step_ms }));
    }
    assert_eq!(st, before);
}

#[test]
fn a_few_wild_medians_barely_move_what_many_samples_taught() {
    let cfg = CalibrationConfig::default();
    let prior = Profile::default();
    let mut st = learn(&prior, 1000, None, 6);
    let before = st.coefficients();
    for _ in 0..5 {
        // A stream stalled behind a long prefill on every other step.
        let s = StepSample { streams: 8.0, context_tokens: 16_000.0, step_ms: 400.0 };
        assert!(st.observe(&cfg, &s));
    }
    for (b, a) in before.iter().zip(st.coefficients()) {
        assert!(close(a, *b, 0.1), "{b} -> {a}");
    }
}

#[test]
fn the_view_takes_the_learned_step_once_there_are_enough_samples() {
    let cfg = CalibrationConfig::default();
    let prior = Profile::default();
    let mut view = Calibrated::default();
    let few = learn(&prior, cfg.min_samples as usize - 1, None, 7);
    view.set_steps("m", &few, &cfg);
    assert_eq!(view.profile_or("m", 0, &prior), prior);
    let many = learn(&prior, 2000, None, 7);
    view.set_steps("m", &many, &cfg);
    let p = view.profile_or("m", 0, &prior);
    assert!(close(p.decode_ms_per_seq, TRUE_PER_SEQ, 0.05));
    assert!(close(p.decode_ms_per_1k_context, TRUE_PER_1K, 0.05));
    // Nothing else of the profile moves, and another model keeps its own.
    assert_eq!(
        Profile { decode_ms_per_seq: 0.0, decode_ms_per_1k_context: 0.0, ..p },
        Profile { decode_ms_per_seq: 0.0, decode_ms_per_1k_context: 0.0, ..prior }
    );
    assert_eq!(view.profile_or("other", 0, &prior), prior);
    for off in [
        CalibrationConfig { enabled: false, ..cfg },
        CalibrationConfig { learn_decode_step: false, ..cfg },
    ] {
        view.set_steps("m", &many, &cfg);
        view.set_steps("m", &many, &off);
        assert_eq!(view.steps("m"), None);
        assert_eq!(view.profile_or("m", 0, &prior), prior);
    }
}

#[test]
fn a_streams_step_is_the_median_of_its_four_step_means() {
    let short = [7.0f32; MIN_GAPS - 1];
    assert_eq!(median_gap(&short), None);
    // Steps of 5.5 ms seen on whole milliseconds: 5, 6, 5, 6, ...
    let ticks: Vec<f32> = (0..24).map(|i| if i % 2 == 0 { 5.0 } else { 6.0 }).collect();
    assert_eq!(median_gap(&ticks), Some(5.5));
    // Two steps that carried a prefill chunk spoil the windows they are in, not the median.
    let mut gaps = vec![7.0f32; 24];
    gaps[3] = 250.0;
    gaps[17] = 180.0;
    assert_eq!(median_gap(&gaps), Some(7.0));
}

const EVENT: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n";

#[test]
fn a_stream_is_timed_by_its_events_not_its_chunks() {
    assert_eq!(token_events(EVENT), 1);
    assert_eq!(token_events(&[EVENT, EVENT, b"data: [DONE]\n\n"].concat()), 2);
    assert_eq!(token_events(b"{\"choices\":[]}"), 0);
    let ms = 1_000_000u64;
    let mut s = StreamSteps::new(4, 1500.0);
    s.chunk(100 * ms, EVENT);
    for i in 1..=6u64 {
        s.chunk((100 + 7 * i) * ms, EVENT);
    }
    // Half an event, then its rest: only the chunk with the event ends a step.
    s.chunk(149 * ms, b"data: {\"choices\":[{\"del");
    s.chunk(150 * ms, b"ta\":{}}]}\n\n");
    assert_eq!(s.sample(), None, "seven gaps");
    // Two events coalesced on the way: two steps of 7 ms.
    s.chunk(163 * ms, &[EVENT, EVENT].concat());
    let got = s.sample().expect("nine gaps");
    assert_eq!((got.streams, got.context_tokens), (4.0, 6000.0));
    assert!((got.step_ms - 7.0).abs() < 1e-6, "{}", got.step_ms);
    // The batch seen at the first byte and after 4 gaps, not the decision's.
    let mut joined = StreamSteps::new(2, 1000.0);
    joined.batch(5, Some(2000.0));
    let mut looks = Vec::new();
    for i in 0..=MIN_GAPS as u64 {
        joined.chunk((i + 1) * ms, EVENT);
        if joined.wants_batch() {
            looks.push(joined.gaps());
            joined.batch(3, None);
        }
    }
    assert_eq!(looks, [4], "once, at 4 gaps (16 not reached)");
    let got = joined.sample().expect("eight gaps");
    assert_eq!((got.streams, got.context_tokens), (4.0, 8_000.0));
    // A body that is no event stream has no steps; a stream's gaps stop at the cap.
    let mut plain = StreamSteps::new(1, 10.0);
    for i in 0..20 {
        plain.chunk(i * ms, b"{\"id\":1}");
    }
    assert_eq!(plain.sample(), None);
    let mut long = StreamSteps::new(0, 10.0);
    for i in 0..1000 {
        long.chunk((i + 1) * ms, EVENT);
    }
    assert_eq!(long.sample().map(|s| s.streams), Some(1.0), "itself at least");
    assert_eq!(long.gaps(), MAX_GAPS);
}

#[test]
fn the_encoding_is_fixed_and_round_trips() {
    let st = learn(&Profile::default(), 50, None, 8);
    let bytes = st.encode();
    assert_eq!(&bytes[..4], b"KVS\x01");
    assert_eq!(bytes.len(), 4 + 18 * 8);
    assert_eq!(StepState::decode(&bytes), Ok(st.clone()));
    // The fresh state of the default profile, byte for byte: the units (5 ms, the profile's
    // 0.03 and 0.04), no samples, an empty system, coefficients of 1 and the starting scale.
    let fresh = StepState::new(&Profile::default()).encode();
    let mut want = b"KVS\x01".to_vec();
    let floats = |v: &[f64], out: &mut Vec<u8>| v.iter().for_each(|x| out.extend(x.to_le_bytes()));
    floats(&[5.0, 0.03, 0.04], &mut want);
    want.extend(0u64.to_le_bytes());
    floats(&[0.0; 10], &mut want);
    floats(&[1.0, 1.0, 1.0, 0.5], &mut want);
    assert_eq!(fresh, want);
}

#[test]
fn the_decoder_refuses_what_it_would_not_write() {
    let good = learn(&Profile::default(), 20, None, 9).encode();
    let at = |i: usize, v: f64| {
        let mut b = good.clone();
        b[i..i + 8].copy_from_slice(&v.to_le_bytes());
        b
    };
    let theta = 4 + 8 * (3 + 1 + 1 + 6 + 3);
    let cases: Vec<(Vec<u8>, CodecError)> = vec![
        (b"KVC\x01".to_vec(), CodecError::Magic),
        ([&b"KVS\x02"[..], &good[4..]].concat(), CodecError::Version(2)),
        (good[..good.len() - 1].to_vec(), CodecError::Truncated),
        ([&good[..], &[0][..]].concat(), CodecError::Trailing),
        (at(4, -1.0), CodecError::Number),
        (at(4 + 8 * 4, f64::NAN), CodecError::Number),
        (at(theta, 0.0), CodecError::Number),
        (at(good.len() - 8, -0.5), CodecError::Number),
    ];
    for (bytes, err) in cases {
        assert_eq!(StepState::decode(&bytes), Err(err));
    }
}

proptest! {
    #[test]
    fn whatever_decodes_encodes_back_to_the_same_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        prefix in any::<bool>(),
    ) {
        let bytes = if prefix { [&b"KVS\x01"[..], &bytes].concat() } else { bytes };
        if let Ok(st) = StepState::decode(&bytes) {
            prop_assert_eq!(st.encode(), bytes);
        }
    }

    #[test]
    fn more_streams_or_context_never_lower_the_models_step(
        seed in 0u64..1000,
        streams in 1.0f64..64.0,
        context in 0.0f64..200_000.0,
    ) {
        let st = learn(&Profile::default(), 40, None, seed);
        let s = StepSample { streams, context_tokens: context, step_ms: 0.0 };
        let more = StepSample { streams: streams + 1.0, context_tokens: context + 1000.0, step_ms: 0.0 };
        prop_assert!(st.model_ms(&more) >= st.model_ms(&s));
    }
}

#[test]
fn samples_all_alike_fit_their_step_and_leave_the_rest_near_the_prior() {
    let cfg = CalibrationConfig::default();
    let prior = Profile::default();
    let mut st = StepState::new(&prior);
    let s = StepSample { streams: 8.0, context_tokens: 8000.0, step_ms: true_step(8.0, 8000.0) };
    for _ in 0..200 {
        assert!(st.observe(&cfg, &s));
    }
    assert!(st.coefficients().iter().all(|c| c.is_finite() && *c > 0.0));
    assert!(close(st.model_ms(&s), s.step_ms, 0.01), "{}", st.model_ms(&s));
}
