//! The seeds of `calib_steps_decode` (written with the others by `seeds.rs`): a fresh decode
//! step, one learned from streams of several batch sizes, and hostile ones (truncated, another
//! version, a NaN, a coefficient of 0, a trailing byte).

use kvroute_core::decision::calib::{CalibrationConfig, StepSample, StepState};
use kvroute_core::decision::cost::Profile;

pub fn calib_steps_decode() -> Vec<(&'static str, Vec<u8>)> {
    let fresh = StepState::new(&Profile::default());
    let mut learned = fresh.clone();
    for i in 0..40u32 {
        let streams = f64::from(1 + i % 16);
        let context_tokens = streams * f64::from(500 + 97 * (i % 7));
        let step_ms = 6.0 + 0.05 * streams + 0.1 * context_tokens / 1000.0;
        learned.observe(
            &CalibrationConfig::default(),
            &StepSample { streams, context_tokens, step_ms },
        );
    }
    let good = learned.encode();
    let at = |i: usize, v: f64| {
        let mut b = good.clone();
        b[i..i + 8].copy_from_slice(&v.to_le_bytes());
        b
    };
    let mut version = good.clone();
    version[3] = 2;
    // prior[3], samples, weight, a[6], b[3]: then theta.
    let theta = 4 + 8 * 14;
    vec![
        ("fresh.bin", fresh.encode()),
        ("learned.bin", good.clone()),
        ("truncated.bin", good[..good.len() * 2 / 3].to_vec()),
        ("version.bin", version),
        ("nan.bin", at(4, f64::NAN)),
        ("zero-coefficient.bin", at(theta, 0.0)),
        ("trailing.bin", [&good[..], &[0][..]].concat()),
    ]
}
