use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::estimator::{prior_coefficients, DIM};
use super::*;

const WORKERS: [&str; 4] = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"];

fn truth() -> Profile {
    Profile::default()
}

fn scaled(p: &Profile, k: f64) -> Profile {
    Profile {
        prefill_base_ms: p.prefill_base_ms * k,
        prefill_ms_per_token: p.prefill_ms_per_token * k,
        prefill_ms_per_token_sq: p.prefill_ms_per_token_sq * k,
        decode_interference_ms: p.decode_interference_ms * k,
        ..*p
    }
}

/// A request with features drawn like a mixed workload: prompts of 16 to 16 k uncached tokens
/// (log-uniform), 0-3 queued prefills, 0-47 decoding requests.
fn features(rng: &mut StdRng, worker: &str) -> Sample {
    let uncached = (16.0 * 1024f64.powf(rng.random::<f64>())) as u64;
    // Half the requests reuse a prefix of up to 8 k tokens.
    let cached = if rng.random::<bool>() { rng.random_range(0..8192u64) } else { 0 };
    let prefilling = rng.random_range(0..4u32);
    let decoding = rng.random_range(0..48u32);
    let queued: Vec<u64> = (0..prefilling).map(|_| rng.random_range(0..2048u64)).collect();
    sample(worker, uncached, cached, &queued, decoding)
}

/// A sample (not yet observed) of a request behind prompts of `queued` tokens still in
/// prefill, on a worker decoding `decoding` requests.
fn sample(worker: &str, uncached: u64, cached: u64, queued: &[u64], decoding: u32) -> Sample {
    let prefilling = queued.len() as u32;
    Sample {
        worker: worker.into(),
        uncached_tokens: uncached,
        cached_tokens: cached,
        load: WorkerLoad {
            inflight_requests: prefilling + decoding,
            prefilling_requests: prefilling,
            prefill_tokens: queued.iter().sum(),
            prefill_elapsed_ms: 0,
            prefill_sq_tokens: queued.iter().map(|n| n * n).sum(),
            arriving_tokens_per_s: 0,
            behind_tokens: 0,
            passing_tokens_per_s: 0,
        },
        fixed_ms: 0.0,
        observed_ms: 0.0,
        priority: 0,
        passed: false,
        fill_ms: 0.0,
        wait_factor: 1.0,
    }
}

fn true_ms(p: &Profile, s: &Sample) -> f64 {
    p.wait_ms(&s.load) + p.prefill_with_context_ms(s.uncached_tokens, s.cached_tokens)
}

/// Multiplicative noise of about ±10 % (log-normal-like, from a sum of uniforms).
fn noise(rng: &mut StdRng) -> f64 {
    let z: f64 = (0..4).map(|_| rng.random::<f64>() - 0.5).sum::<f64>() * 1.73;
    (0.1 * z).exp()
}

/// Feeds `n` samples from `truth` with `slow[i]` the true factor of worker i; returns the
/// relative errors of the estimate each sample met (deviation × model), in order.
fn feed(
    st: &mut ModelState,
    cfg: &CalibrationConfig,
    rng: &mut StdRng,
    n: usize,
    slow: [f64; 4],
) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let w = rng.random_range(0..WORKERS.len());
            let mut s = features(rng, WORKERS[w]);
            s.observed_ms = true_ms(&truth(), &s) * slow[w] * noise(rng);
            let predicted = st.deviation(WORKERS[w]) * st.model_ms(&s);
            let err = (predicted - s.observed_ms).abs() / s.observed_ms;
            assert!(matches!(st.observe(cfg, &s), CalibOutcome::Used { .. }));
            err
        })
        .collect()
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn assert_near(what: &str, got: f64, want: f64, tol: f64) {
    assert!((got / want - 1.0).abs() <= tol, "{what}: got {got}, want {want} ± {}%", tol * 100.0);
}

#[test]
fn from_a_prior_three_times_off_the_error_converges_within_100_samples_and_the_coefficients_within_400(
) {
    let cfg = CalibrationConfig::default();
    for prior_scale in [3.0, 1.0 / 3.0] {
        let prior = scaled(&truth(), prior_scale);
        let mut st = ModelState::new(&prior);
        let mut rng = StdRng::seed_from_u64(7);
        let errors = feed(&mut st, &cfg, &mut rng, 400, [1.0; 4]);
        assert!(errors[0] > 0.6, "the prior starts far off");
        let late = median(&errors[300..]);
        eprintln!(
            "scale {prior_scale}: {:?} errors {} {} {}",
            st.coefficients(),
            median(&errors[100..200]),
            median(&errors[200..300]),
            late
        );
        eprintln!("devs {:?}", WORKERS.iter().map(|w| st.deviation(w)).collect::<Vec<_>>());
        assert!(late < 0.12, "median relative error after warm-up: {late}");
        let [base, per_token, sq, interference, queue_base, queue_per_token, queue_sq, _] =
            st.coefficients();
        let t = truth();
        // The truth's queue costs what its own prefill does: learned apart, alike.
        assert_near("queue per_token", queue_per_token, t.prefill_ms_per_token, 0.1);
        assert_near("queue per_token_sq", queue_sq, t.prefill_ms_per_token_sq, 0.1);
        // The queue's step floors are nearly collinear with the batch fill of a busy worker.
        assert_near("queue base", queue_base, t.prefill_base_ms, 0.6);
        assert_near("per_token", per_token, t.prefill_ms_per_token, 0.1);
        // Learned as one prefill speed with the per-token term: as close as that one.
        assert_near("per_token_sq", sq, t.prefill_ms_per_token_sq, 0.1);
        assert!(
            (sq / per_token - t.prefill_ms_per_token_sq / t.prefill_ms_per_token).abs() < 1e-12
        );
        assert_near("interference", interference, t.decode_interference_ms, 0.2);
        assert_near("base", base, t.prefill_base_ms, 0.25);
        let view = st.view(&prior, &cfg).expect("enough samples");
        assert_eq!(view.profile.adapter_load_ms, prior.adapter_load_ms, "not learned: kept");
        for w in WORKERS {
            assert_near("deviation of an ordinary worker", st.deviation(w), 1.0, 0.15);
        }
    }
}

#[test]
fn a_worker_slowed_twice_mid_stream_gets_a_deviation_near_two_within_40_of_its_samples() {
    let cfg = CalibrationConfig::default();
    let mut st = ModelState::new(&scaled(&truth(), 3.0));
    let mut rng = StdRng::seed_from_u64(11);
    feed(&mut st, &cfg, &mut rng, 400, [1.0; 4]);
    let before = st.coefficients();
    // 160 samples over 4 workers: about 40 of the slowed worker's own.
    let errors = feed(&mut st, &cfg, &mut rng, 160, [1.0, 1.0, 2.0, 1.0]);
    assert_near("slowed worker", st.deviation(WORKERS[2]), 2.0, 0.2);
    for w in [0, 1, 3] {
        assert_near("other workers", st.deviation(WORKERS[w]), 1.0, 0.15);
    }
    let after = st.coefficients();
    for i in 0..DIM {
        assert_near("the model stays the typical worker's", after[i], before[i], 0.2);
    }
    assert!(median(&errors[120..]) < 0.15);
}

#[test]
fn outliers_do_not_move_the_estimates_much() {
    let cfg = CalibrationConfig::default();
    let prior = truth();
    let mut clean = ModelState::new(&prior);
    let mut dirty = ModelState::new(&prior);
    let mut rng = StdRng::seed_from_u64(3);
    feed(&mut clean, &cfg, &mut rng, 300, [1.0; 4]);
    dirty.clone_from(&clean);
    // One sample in ten stalled 20x (a paused engine, a GC, a slow network).
    for i in 0..300 {
        let w = i % WORKERS.len();
        let mut s = features(&mut rng, WORKERS[w]);
        let stall = if i % 10 == 0 { 20.0 } else { 1.0 };
        s.observed_ms = true_ms(&truth(), &s) * noise(&mut rng) * stall;
        dirty.observe(&cfg, &s);
    }
    let (c, d) = (clean.coefficients(), dirty.coefficients());
    assert_near("per_token", d[1], c[1], 0.25);
    for w in WORKERS {
        assert_near("deviation", dirty.deviation(w), 1.0, 0.3);
    }
}

#[test]
fn unusable_samples_are_rejected_and_change_nothing() {
    let cfg = CalibrationConfig::default();
    let mut st = ModelState::new(&truth());
    let mut rng = StdRng::seed_from_u64(1);
    let base = features(&mut rng, WORKERS[0]);
    let bad = [
        Sample { observed_ms: 0.0, ..base.clone() },
        Sample { observed_ms: -5.0, ..base.clone() },
        Sample { observed_ms: f64::NAN, ..base.clone() },
        Sample { observed_ms: f64::INFINITY, ..base.clone() },
        Sample { observed_ms: 10.0, fixed_ms: 12.0, ..base.clone() },
    ];
    let before = st.clone();
    for s in &bad {
        assert_eq!(st.observe(&cfg, s), CalibOutcome::Rejected);
    }
    assert_eq!(st, before);
    let zero = Profile { prefill_base_ms: 0.0, ..truth() };
    let mut st = ModelState::new(&zero);
    let empty =
        Sample { uncached_tokens: 0, load: WorkerLoad::default(), observed_ms: 5.0, ..base };
    assert_eq!(st.observe(&cfg, &empty), CalibOutcome::Rejected, "no feature: nothing to learn");
}

#[test]
fn too_few_samples_or_another_prior_give_no_view() {
    let cfg = CalibrationConfig { min_samples: 10, ..Default::default() };
    let mut st = ModelState::new(&truth());
    let mut rng = StdRng::seed_from_u64(5);
    feed(&mut st, &cfg, &mut rng, 9, [1.0; 4]);
    assert!(st.view(&truth(), &cfg).is_none());
    feed(&mut st, &cfg, &mut rng, 1, [1.0; 4]);
    assert!(st.view(&truth(), &cfg).is_some());
    assert!(st.view(&scaled(&truth(), 2.0), &cfg).is_none());
    assert!(st.view(&truth(), &CalibrationConfig { enabled: false, ..cfg }).is_none());
    let mut view = Calibrated::default();
    view.set("m", &st, &truth(), &cfg);
    assert!(view.profile_for("m").is_some() && view.profile_for("other").is_none());
    assert_eq!(view.deviation("m", "unknown:1"), 1.0);
}

#[test]
fn golden_bytes() {
    crate::conformance::shared_data::calibration_state_golden();
}

#[test]
fn the_decoder_rejects_garbage_without_panicking() {
    let st = ModelState::new(&truth());
    let good = st.encode();
    assert_eq!(ModelState::decode(&good[..good.len() - 1]), Err(codec::CodecError::Truncated));
    assert_eq!(ModelState::decode(b"XYZ\x01"), Err(codec::CodecError::Magic));
    // Version 1 (four coefficients, no queue of its own) is another layout: not decoded.
    let mut v1 = good.clone();
    v1[3] = 1;
    assert_eq!(ModelState::decode(&v1), Err(codec::CodecError::Version(1)));
    let mut nan = good.clone();
    nan[4..12].copy_from_slice(&f64::NAN.to_le_bytes());
    assert_eq!(ModelState::decode(&nan), Err(codec::CodecError::Number));
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(ModelState::decode(&trailing), Err(codec::CodecError::Trailing));
    let mut unsorted = st.clone();
    for name in ["b:1", "a:1"] {
        unsorted.workers.push(WorkerDev { worker: name.into(), log_dev: 0.0, samples: 1 });
    }
    assert_eq!(ModelState::decode(&unsorted.encode()), Err(codec::CodecError::Worker));
}

#[test]
fn configuration_defaults_and_validation() {
    let cfg = CalibrationConfig::default();
    assert!(cfg.validate().is_ok());
    assert!((cfg.forgetting().powf(cfg.half_life_samples) - 0.5).abs() < 1e-9);
    let bad = [
        CalibrationConfig { half_life_samples: 0.0, ..cfg },
        CalibrationConfig { prior_weight: f64::NAN, ..cfg },
        CalibrationConfig { coefficient_bound: 0.5, ..cfg },
        CalibrationConfig { deviation_min: 1.5, ..cfg },
        CalibrationConfig { deviation_max: 0.5, ..cfg },
        CalibrationConfig { max_workers: codec::MAX_WORKERS + 1, ..cfg },
        CalibrationConfig { flush_samples: 0, ..cfg },
    ];
    for b in bad {
        assert!(b.validate().is_err(), "{b:?}");
    }
    let parsed: CalibrationConfig =
        serde_json::from_str(r#"{"min_samples": 5, "deviation_max": 8}"#).unwrap();
    assert_eq!(parsed, CalibrationConfig { min_samples: 5, deviation_max: 8.0, ..cfg });
    assert!(serde_json::from_str::<CalibrationConfig>(r#"{"nope": 1}"#).is_err());
}

fn arb_sample() -> impl Strategy<Value = Sample> {
    (0usize..4, 0u64..200_000, 0u32..64, 0u32..64, 0u64..1_000_000, -10.0f64..1e6, -5.0f64..100.0)
        .prop_map(|(w, n, p, d, q, obs, fixed)| Sample {
            worker: WORKERS[w].into(),
            uncached_tokens: n,
            cached_tokens: 0,
            load: WorkerLoad {
                inflight_requests: p + d,
                prefilling_requests: p,
                prefill_tokens: q,
                prefill_elapsed_ms: 0,
                prefill_sq_tokens: 0,
                arriving_tokens_per_s: 0,
                behind_tokens: 0,
                passing_tokens_per_s: 0,
            },
            fixed_ms: fixed,
            observed_ms: obs,
            // Some at their own engine priorities: the state carries their quantiles too.
            priority: [0, 0, 10, -3][w],
            passed: n % 7 == 0,
            fill_ms: 0.0,
            // Factors up to the cap, and a few that are not numbers.
            wait_factor: [1.0, 1.0 + q as f64 / 100_000.0, f64::NAN, 0.0][(n % 4) as usize],
        })
}

proptest! {
    #[test]
    fn coefficients_stay_non_negative_bounded_and_round_trip(
        samples in proptest::collection::vec(arb_sample(), 1..200),
        scale in 0.05f64..20.0,
    ) {
        let cfg = CalibrationConfig::default();
        let prior = scaled(&truth(), scale);
        let mut st = ModelState::new(&prior);
        for s in &samples {
            st.observe(&cfg, s);
        }
        let p = prior_coefficients(&prior);
        for (i, c) in st.coefficients().iter().enumerate() {
            prop_assert!(c.is_finite() && *c >= 0.0);
            let (lo, hi) = super::estimator::theta_bounds(&cfg, i);
            prop_assert!(*c >= p[i] * lo * (1.0 - 1e-9));
            prop_assert!(*c <= p[i] * hi * (1.0 + 1e-9));
        }
        for w in WORKERS {
            let d = st.deviation(w);
            prop_assert!(d >= cfg.deviation_min * (1.0 - 1e-9) && d <= cfg.deviation_max * (1.0 + 1e-9));
        }
        if let Some(v) = st.view(&prior, &CalibrationConfig { min_samples: 0, ..cfg }) {
            prop_assert!(v.profile.validate().is_ok());
        }
        // The busy count is kept under its own key, not in the encoding.
        prop_assert_eq!(ModelState::decode(&st.encode()), Ok(ModelState { busy_samples: 0, ..st }));
    }
}

#[test]
fn the_router_decides_with_the_calibrated_profile_and_each_workers_deviation() {
    use crate::decision::config::FilterConfig;
    use crate::decision::request::{parse, Endpoint};
    use crate::decision::router::Router;
    use std::sync::Arc;
    let cfg = FilterConfig::from_json(
        serde_json::json!({"models":[{"name":"m","workers":[WORKERS[0], WORKERS[1]]}],
               "tie_band":{"abs_ms":0.0,"rel":0.0}, "calibration": {"min_samples": 50}})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let mut router = Router::new(&cfg).unwrap();
    let body = serde_json::json!({"model":"m","messages":[{"role":"user","content":"hello ".repeat(400)}]});
    let q = parse(Endpoint::Chat, body.to_string().as_bytes()).unwrap();
    let idle = |_: &str| WorkerLoad::default();
    let configured = router.decide(&q, 0, &idle, 0, 0).unwrap();
    // The pool is 3x faster than configured, and worker 0 2x slower than worker 1.
    let prior = cfg.models[0].profile;
    let mut st = ModelState::new(&prior);
    let mut rng = StdRng::seed_from_u64(9);
    for i in 0..200 {
        let w = i % 2;
        let mut s = features(&mut rng, WORKERS[w]);
        s.observed_ms = true_ms(&scaled(&prior, 1.0 / 3.0), &s) * [2.0, 1.0][w] * noise(&mut rng);
        st.observe(&cfg.calibration, &s);
    }
    let mut view = Calibrated::default();
    view.set("m", &st, &prior, &cfg.calibration);
    router.set_calibration(Arc::new(view));
    let calibrated = router.decide(&q, 0, &idle, 0, 0).unwrap();
    assert_eq!(calibrated.primary().unwrap().worker, WORKERS[1], "the faster worker");
    let by_worker = |d: &crate::decision::router::Decision, w: &str| {
        d.ranked.iter().find(|s| s.worker == w).map(|s| s.ttft_ms).unwrap()
    };
    let fast = by_worker(&calibrated, WORKERS[1]) / by_worker(&configured, WORKERS[1]);
    let slow = by_worker(&calibrated, WORKERS[0]) / by_worker(&configured, WORKERS[0]);
    // The median worker is the model: one of the two deviates (by a factor of ~2) from it.
    assert!((slow / fast - 2.0).abs() < 0.4, "slow/fast = {}", slow / fast);
    assert!(fast > 0.2 && slow < 1.0, "the pool is faster than configured: {fast} {slow}");
    assert!((calibrated.primary().unwrap().deviation - st.deviation(WORKERS[1])).abs() < 1e-12);
}

/// The dashboard's regime: short chat turns on a prefix-cached worker (30-70 uncached tokens,
/// little queued), so the base and per-token features are almost collinear; what is observed
/// is a simulator-like truth plus a constant overhead the model has no term for (1 ms: HTTP,
/// Envoy) and ±10 % noise. The overhead goes to the base, the per-token cost stays put, and
/// the estimate reaches the noise floor.
#[test]
fn short_prompts_with_a_constant_overhead_move_the_base_not_the_cost_per_token() {
    let cfg = CalibrationConfig::default();
    let sim = Profile {
        prefill_base_ms: 4.8,
        prefill_ms_per_token: 0.033,
        prefill_ms_per_token_sq: 4.21e-7,
        decode_interference_ms: 0.03,
        ..truth()
    };
    const OVERHEAD_MS: f64 = 1.0;
    for seed in 0..4 {
        let mut st = ModelState::new(&truth());
        let mut rng = StdRng::seed_from_u64(seed);
        let mut errors = Vec::new();
        for _ in 0..400 {
            let w = WORKERS[rng.random_range(0..3)];
            let prefilling = rng.random_range(0..2u32);
            let decoding = rng.random_range(0..3u32);
            let mut s = Sample {
                worker: w.into(),
                uncached_tokens: rng.random_range(30..70),
                cached_tokens: 0,
                load: WorkerLoad {
                    inflight_requests: prefilling + decoding,
                    prefilling_requests: prefilling,
                    prefill_tokens: u64::from(prefilling) * rng.random_range(0..200u64),
                    prefill_elapsed_ms: 0,
                    prefill_sq_tokens: 0,
                    arriving_tokens_per_s: 0,
                    behind_tokens: 0,
                    passing_tokens_per_s: 0,
                },
                fixed_ms: 0.0,
                observed_ms: 0.0,
                priority: 0,
                passed: false,
                fill_ms: 0.0,
                wait_factor: 1.0,
            };
            s.observed_ms = (true_ms(&sim, &s) + OVERHEAD_MS) * noise(&mut rng);
            let predicted = st.deviation(w) * st.model_ms(&s);
            errors.push((predicted - s.observed_ms).abs() / s.observed_ms);
            assert!(matches!(st.observe(&cfg, &s), CalibOutcome::Used { .. }));
        }
        let [base, per_token, ..] = st.coefficients();
        let late = median(&errors[300..]);
        assert!(late < 0.12, "seed {seed}: median relative error after warm-up: {late}");
        assert_near("per_token", per_token, sim.prefill_ms_per_token, 0.2);
        assert_near("base", base, sim.prefill_base_ms + OVERHEAD_MS, 0.15);
    }
}

/// An overload on engines that batch prefills: behind a busy worker every request also waits
/// for the prompts that arrive after it and share its last step (a random share of the step's
/// token budget, half a step on average). Before it, 60 requests on an idle pool; after it,
/// idle again. The batch fill and the queue's coefficients take the queueing; the request's own
/// coefficients keep the workers' speed, so the first idle request after the overload is
/// estimated right, and the queued ones during it within the noise of the fill.
#[test]
fn an_overload_moves_the_queue_and_batch_fill_and_the_idle_estimate_stays_right() {
    let cfg = CalibrationConfig::default();
    let sim = scaled(&truth(), 4.0);
    let step_ms = sim.step_token_budget as f64 * sim.prefill_ms_per_token;
    let observe = |st: &mut ModelState, rng: &mut StdRng, queued: u32| -> f64 {
        let w = WORKERS[rng.random_range(0..3)];
        let uncached = rng.random_range(1800..2200u64);
        let tokens: Vec<u64> = (0..queued).map(|_| rng.random_range(1800..2200u64)).collect();
        let mut s = sample(w, uncached, 0, &tokens, 0);
        let queue = Profile { queue: None, step_token_budget: 0, ..sim }.wait_ms(&s.load);
        let fill = if queued > 0 { rng.random::<f64>() * step_ms } else { 0.0 };
        s.observed_ms = (sim.prefill_ms(uncached) + queue + fill) * noise(rng);
        let predicted = st.deviation(w) * st.model_ms(&s);
        assert!(matches!(st.observe(&cfg, &s), CalibOutcome::Used { .. }));
        (predicted - s.observed_ms) / s.observed_ms
    };
    for seed in 0..4 {
        let mut st = ModelState::new(&truth());
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..60 {
            observe(&mut st, &mut rng, 0);
        }
        let overload: Vec<f64> = (0..300)
            .map(|_| {
                let queued = rng.random_range(1..6);
                observe(&mut st, &mut rng, queued)
            })
            .collect();
        let c = st.coefficients();
        // The first idle request after the overload, without noise: the deviation times the
        // model against the workers' true time.
        let idle = sample(WORKERS[0], 2000, 0, &[], 0);
        let model_err = st.model_ms(&idle) / sim.prefill_ms(2000) - 1.0;
        let idle_err = st.deviation(WORKERS[0]) * (1.0 + model_err) - 1.0;
        let late = median(&overload[200..].iter().map(|e| e.abs()).collect::<Vec<_>>());
        // The model alone is within 8 %; the worker's deviation, an average over its last ~20
        // samples, carries the fill's noise (one in 4 seeds 9 % off).
        assert!(model_err.abs() < 0.12, "seed {seed}: idle model after the overload {model_err}");
        assert!(idle_err.abs() < 0.2, "seed {seed}: idle estimate after the overload {idle_err}");
        // From 2 % of a step at the prior's (4x too fast) speed to most of its true mean, half
        // a step (60-75 %: at one prompt length the fill and the per-token terms are nearly
        // collinear, and the latter take the rest).
        // Admission promises behind a queue with the observed spread of the fill: the 95th
        // percentile of observed over estimated.
        let margin = st.view(&truth(), &cfg).map(|v| v.profile.queue_terms().promise_margin);
        assert!(margin.is_some_and(|m| m > 1.15 && m < 2.0), "seed {seed}: margin {margin:?}");
        let fill = c[7] / (step_ms / 2.0);
        assert!((0.5..1.5).contains(&fill), "seed {seed}: batch fill {fill} of its true mean");
        assert!(c[3] < sim.decode_interference_ms * 2.0, "interference {}", c[3]);
        assert!(late < 0.2, "seed {seed}: median error late in the overload {late}");
    }
}

/// A request behind one queued prompt, sent at `priority`, its first byte `late` times what the
/// truth says (with noise).
fn busy(rng: &mut StdRng, priority: i32, late: f64) -> Sample {
    let mut s = sample(WORKERS[rng.random_range(0..3)], 1000, 0, &[1000], 0);
    s.observed_ms = true_ms(&truth(), &s) * late * noise(rng);
    Sample { priority, ..s }
}

#[test]
fn each_engine_priority_promises_by_its_own_quantile() {
    let cfg = CalibrationConfig::default();
    let mut rng = StdRng::seed_from_u64(3);
    let mut st = ModelState::new(&truth());
    // Only priority 0: nothing tracked apart, and the state keeps its earlier format (the busy
    // count is not in it).
    for _ in 0..50 {
        st.observe(&cfg, &busy(&mut rng, 0, 1.0));
    }
    assert!(st.priorities.is_empty());
    assert_eq!((st.busy_samples, st.encode()[3]), (50, codec::VERSION_POOL));
    // Then the urgent requests (0) land as estimated, the batch ones (10) twice as late.
    for i in 0..400 {
        let (priority, late) = if i % 2 == 0 { (0, 1.0) } else { (10, 2.0) };
        st.observe(&cfg, &busy(&mut rng, priority, late));
        if i == 30 {
            // 15 samples at 10: too few for a margin of its own yet.
            assert_eq!(st.promise_margin_at(10), st.promise_log.exp());
        }
    }
    let (urgent, batch, pool) =
        (st.promise_margin_at(0), st.promise_margin_at(10), st.promise_log.exp());
    assert!(urgent < 1.1 && batch > 1.25 && pool > 1.25, "{urgent} {batch} {pool}");
    // A priority never seen is promised by the pool-wide margin.
    assert_eq!(st.promise_margin_at(5), pool);
    assert_eq!(st.encode()[3], codec::VERSION);
    assert_eq!(ModelState::decode(&st.encode()), Ok(ModelState { busy_samples: 0, ..st.clone() }));
    // The router's profile for a request at each priority.
    let mut view = Calibrated::default();
    view.set("m", &st, &truth(), &cfg);
    let margin = |p: i32| view.profile_at("m", p).unwrap().queue_terms().promise_margin;
    assert_eq!((margin(0), margin(10), margin(5)), (urgent, batch, pool));
    assert_eq!(view.profile_for("m").unwrap().queue_terms().promise_margin, pool);
}

#[test]
fn a_request_passed_over_teaches_only_its_own_priority_margin() {
    let cfg = CalibrationConfig { min_samples: 10, ..Default::default() };
    let mut rng = StdRng::seed_from_u64(9);
    let mut st = ModelState::new(&truth());
    // Requests behind a queued prompt at priorities 0 and 10, landing as the truth says.
    for i in 0..100 {
        st.observe(&cfg, &busy(&mut rng, [0, 10][i % 2], 1.0));
    }
    let before = st.clone();
    // Batch requests passed over by urgent ones, three times as late as their features say.
    for _ in 0..200 {
        let s = Sample { passed: true, ..busy(&mut rng, 10, 3.0) };
        assert_eq!(st.observe(&cfg, &s), CalibOutcome::MarginOnly);
    }
    // The coefficients, the deviations, the pool-wide and priority 0's margins are as they
    // were; priority 10 promises by what it met, and the busy samples counted.
    assert_eq!((st.coefficients(), &st.workers), (before.coefficients(), &before.workers));
    assert_eq!(st.samples, before.samples);
    assert_eq!(st.promise_log, before.promise_log);
    assert_eq!(st.promise_margin_at(0), before.promise_margin_at(0));
    let (was, now) = (before.promise_margin_at(10), st.promise_margin_at(10));
    assert!(was < 1.3 && now > 2.0, "priority 10's margin {was} -> {now}");
    assert_eq!(st.busy_samples, before.busy_samples + 200);
    // The same samples not marked: the workers look three times slower.
    let mut unmarked = before.clone();
    for _ in 0..200 {
        unmarked.observe(&cfg, &busy(&mut rng, 10, 3.0));
    }
    let busy_ms = |st: &ModelState| {
        let p = st.view(&truth(), &cfg).unwrap().profile;
        let s = sample(WORKERS[0], 1000, 0, &[1000], 0);
        p.wait_ms(&s.load) + p.prefill_ms(1000)
    };
    let (slower, was) = (busy_ms(&unmarked), busy_ms(&before));
    assert!(slower > 1.5 * was, "{slower} ms against {was} ms");
    assert_eq!(busy_ms(&st), was);
    // One passed over with nothing queued ahead (as at an idle worker) teaches nothing.
    let idle = st.clone();
    let mut s = sample(WORKERS[0], 1000, 0, &[], 0);
    s.observed_ms = 3.0 * true_ms(&truth(), &s);
    assert_eq!(
        st.observe(&cfg, &Sample { passed: true, priority: 10, ..s }),
        CalibOutcome::MarginOnly
    );
    assert_eq!(st, idle);
}

#[test]
fn a_busy_promise_counts_a_whole_step_until_the_margin_is_known() {
    let cfg = CalibrationConfig { min_samples: 10, ..Default::default() };
    let mut rng = StdRng::seed_from_u64(5);
    let mut st = ModelState::new(&truth());
    // A pool that ran idle: its speed is known, its margin behind a queue is not.
    for _ in 0..40 {
        let mut s = sample(WORKERS[rng.random_range(0..3)], 1000, 0, &[], 0);
        s.observed_ms = true_ms(&truth(), &s) * noise(&mut rng);
        st.observe(&cfg, &s);
    }
    assert_eq!(st.busy_samples, 0);
    let queue = |st: &ModelState| st.view(&truth(), &cfg).unwrap().profile.queue_terms();
    let q = queue(&st);
    let step = truth().step_token_budget as f64 * q.ms_per_token;
    assert!(q.promise_fill_ms > 0.9 * step && q.promise_fill_ms < step, "{q:?}");
    assert!((q.promise_fill_ms + q.batch_fill_ms - step).abs() < 1e-9 * step);
    // A busy worker's promise holds it, an idle one's does not; the estimates do not.
    let profile = st.view(&truth(), &cfg).unwrap().profile;
    let worker =
        |queued: u32| crate::decision::cost::Candidate::<crate::decision::worker::WorkerName> {
            worker: "10.0.0.1:8000".into(),
            cached_blocks: 0,
            offloaded_blocks: 0,
            load: WorkerLoad {
                inflight_requests: queued,
                prefilling_requests: queued,
                prefill_tokens: u64::from(queued) * 1000,
                ..Default::default()
            },
            adapter_missing: false,
            deviation: 1.0,
        };
    let busy = crate::decision::cost::score(&profile, &worker(1), 1000, 16);
    let idle = crate::decision::cost::score(&profile, &worker(0), 1000, 16);
    assert_eq!((busy.promise_extra_ms, idle.promise_extra_ms), (q.promise_fill_ms, 0.0));
    assert!((busy.promise_ttft_ms() - (busy.ttft_ms + q.promise_fill_ms)).abs() < 1e-9);
    assert_eq!(idle.promise_ttft_ms(), idle.ttft_ms);
    // Requests behind a queue that land as estimated: each one takes a share of the step
    // off; once there are enough of them, the margin they teach is the promise.
    let busy_sample = |rng: &mut StdRng| {
        let mut s = sample(WORKERS[rng.random_range(0..3)], 1000, 0, &[1000], 0);
        s.observed_ms = true_ms(&truth(), &s) * noise(rng);
        s
    };
    for seen in 1..PROMISE_FILL_SAMPLES {
        st.observe(&cfg, &busy_sample(&mut rng));
        let q = queue(&st);
        let whole = truth().step_token_budget as f64 * q.ms_per_token - q.batch_fill_ms;
        let left = f64::from(PROMISE_FILL_SAMPLES - seen) / f64::from(PROMISE_FILL_SAMPLES);
        assert!((q.promise_fill_ms - whole * left).abs() < 1e-9 * whole, "{seen}: {q:?}");
        assert!(q.promise_fill_ms > 0.0, "{seen}: {q:?}");
    }
    st.observe(&cfg, &busy_sample(&mut rng));
    assert_eq!(queue(&st).promise_fill_ms, 0.0);
    // As many as the margin's tracker needs to climb from 1 to its largest value.
    use super::estimator::{PROMISE_MARGIN_MAX, PROMISE_QUANTILE, PROMISE_STEP};
    let climb = PROMISE_MARGIN_MAX.ln() / (PROMISE_STEP * PROMISE_QUANTILE);
    assert_eq!(PROMISE_FILL_SAMPLES, climb.ceil() as u32);
    // A configured profile (no calibration) promises as it estimates.
    assert_eq!(truth().queue_terms().promise_fill_ms, 0.0);
}

#[test]
fn the_margin_is_learned_against_the_promise_with_the_fill_it_foresaw() {
    let cfg = CalibrationConfig { min_samples: 10, ..Default::default() };
    let margin = |foreseen: bool| {
        let mut rng = StdRng::seed_from_u64(5);
        let mut st = ModelState::new(&truth());
        for _ in 0..400 {
            let s = busy(&mut rng, 0, 1.0);
            // The step the request ends in fills with later arrivals, up to three times its
            // own estimate's worth; its decision foresaw them beyond the learned batch fill.
            let fill = true_ms(&truth(), &s) * rng.random_range(0.0..3.0);
            let beyond = (fill - st.coefficients()[7]).max(0.0);
            let fill_ms = if foreseen { beyond } else { 0.0 };
            st.observe(&cfg, &Sample { observed_ms: s.observed_ms + fill, fill_ms, ..s });
        }
        st.promise_margin_at(0)
    };
    let (with, without) = (margin(true), margin(false));
    assert!(with < 1.15 && without > 1.35, "margin {with} with the fill, {without} without");
}

/// Urgent requests (0) behind 1-4 queued prompts that wait for the work ahead, and batch ones
/// (10) whose decisions foresaw urgent prompts passing them (a factor from 1.2 to 3 on their
/// queued prefill): `passed` of them were passed and waited that factor longer; the others
/// were not passed and waited for the work ahead. `given`: the samples carry the factor.
/// Without `skip_passed` the filter does not say which were passed.
fn stretched(cfg: &CalibrationConfig, given: bool, passed: bool, seed: u64) -> ModelState {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut st = ModelState::new(&truth());
    for i in 0..400 {
        let tokens: Vec<u64> =
            (0..rng.random_range(1..5)).map(|_| rng.random_range(1500..2500u64)).collect();
        let mut s = sample(WORKERS[i % 3], rng.random_range(1500..2500u64), 0, &tokens, 0);
        let f = if i % 2 == 0 { 1.0 } else { rng.random_range(1.2..3.0) };
        let stretch = if passed { f } else { 1.0 };
        let (t, q) = (truth(), truth().queue_terms());
        let queued = s.load.prefill_tokens as f64 * q.ms_per_token
            + s.load.prefill_sq_tokens as f64 * q.ms_per_token_sq
            + f64::from(s.load.prefilling_requests) * q.step_ms;
        s.observed_ms =
            (queued * stretch + q.batch_fill_ms + t.prefill_with_context_ms(s.uncached_tokens, 0))
                * noise(&mut rng);
        s.priority = if f > 1.0 { 10 } else { 0 };
        // The filter marks a sample passed only where it tells them apart.
        s.passed = passed && f > 1.0 && cfg.skip_passed;
        s.wait_factor = if given { f } else { 1.0 };
        st.observe(cfg, &s);
    }
    st
}

#[test]
fn a_wait_stretched_by_urgent_arrivals_is_promised_with_them_and_learned_as_the_work_ahead() {
    // An urgent request behind three 2 000-token prompts, as the model estimates it.
    let probe = sample(WORKERS[0], 2_000, 0, &[2_000, 2_000, 2_000], 0);
    let truth_ms = true_ms(&truth(), &probe);
    let err = |st: &ModelState| st.deviation(WORKERS[0]) * st.model_ms(&probe) / truth_ms - 1.0;
    let learning = CalibrationConfig { skip_passed: false, ..CalibrationConfig::default() };
    for seed in 0..3 {
        // Passed requests teach only their margin (the default): with the factor their
        // promise held it, and the batch margin stays near the urgent one's.
        let cfg = CalibrationConfig::default();
        let (given, withheld) =
            (stretched(&cfg, true, true, seed), stretched(&cfg, false, true, seed));
        let (g, w) = (given.promise_margin_at(10), withheld.promise_margin_at(10));
        assert!(g < 1.3 && w > 1.6, "seed {seed}: batch margin {g} with the factor, {w} without");
        assert!(err(&given).abs() < 0.1, "seed {seed}: {}", err(&given));
        // Learned from (`skip_passed` off): with the factor the queue is the work ahead;
        // without it the batch requests' long waits read as a slow queue, and the urgent
        // request's estimate is too long.
        let (given, withheld) =
            (stretched(&learning, true, true, seed), stretched(&learning, false, true, seed));
        assert!(err(&given).abs() < 0.1, "seed {seed}: factor given, error {}", err(&given));
        assert!(err(&withheld) > 0.2, "seed {seed}: factor withheld, error {}", err(&withheld));
        // Requests the factor foresaw passed but that nobody passed waited for the work ahead:
        // where the filter tells them apart, learned from as such, not as a queue faster than
        // it is.
        let unpassed = stretched(&cfg, true, false, seed);
        assert!(err(&unpassed).abs() < 0.1, "seed {seed}: not passed, error {}", err(&unpassed));
    }
}
