//! Tokenizing the k-th turn of an 8 k-token Qwen3 conversation: cold (the whole rendered prompt)
//! against warm (a thread's token cache already holds turn k-1, so only the new turn is
//! encoded). The cold measurement runs twice; the ratio of its two medians is the noise floor.
//! Run: `cargo bench -p kvroute-core --bench tokcache` (needs `./dev setup` for Qwen3).

use std::time::Instant;

use kvroute_core::decision::tokenize::model::{qwen3, ModelBundle};
use kvroute_core::decision::tokenize::tokcache::{TokenCache, TokenCacheLimits};
use kvroute_testkit::textgen::words;
use serde_json::{json, Value};

const TARGET_TOKENS: usize = 8192;
const RUNS: usize = 200;

fn main() {
    let bundle = match qwen3() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let (prev, last, turns) = conversation(&bundle);
    let cuts = bundle.cuts().clone();
    let cold_ids = bundle.encode(&last, false).expect("encode");
    let mut seeded = TokenCache::new(TokenCacheLimits::default());
    seeded.encode(&bundle, &cuts, &prev).expect("seed");
    assert_eq!(seeded.clone().encode(&bundle, &cuts, &last).expect("warm"), cold_ids);

    let cold = || {
        time(|| {
            bundle.encode(&last, false).expect("encode");
        })
    };
    let cold_a = cold();
    let warm = sample(|| {
        let mut cache = seeded.clone();
        let t = Instant::now();
        cache.encode(&bundle, &cuts, &last).expect("warm");
        t.elapsed().as_nanos() as u64
    });
    let cold_b = cold();
    let new_tokens = cold_ids.len() - bundle.encode(&prev, false).expect("encode").len();
    println!(
        "Qwen3 conversation of {turns} messages, {} tokens; turn k adds {new_tokens} tokens to turn k-1",
        cold_ids.len()
    );
    for (name, t) in
        [("cold (1st run)", &cold_a), ("cold (2nd run)", &cold_b), ("warm turn k", &warm)]
    {
        println!("{name:>15}: p50 {:>8.1} µs, p99 {:>8.1} µs", q(t, 0.5), q(t, 0.99));
    }
    let floor = q(&cold_a, 0.5) / q(&cold_b, 0.5);
    println!(
        "cold / warm at p50: x{:.1} (noise floor: cold runs differ by x{:.2})",
        q(&cold_a, 0.5).min(q(&cold_b, 0.5)) / q(&warm, 0.5),
        floor.max(1.0 / floor)
    );
}

/// Messages alternating user / assistant until the rendered prompt passes the target; returns
/// the prompts of the last two user turns and the number of messages.
fn conversation(bundle: &ModelBundle) -> (String, String, usize) {
    let mut messages: Vec<Value> = vec![json!({"role": "system", "content": words(1, 120)})];
    let mut prompts = Vec::new();
    for i in 0u64.. {
        messages.push(json!({"role": "user", "content": words(100 + i, 120)}));
        let text = bundle.render_chat(&messages).expect("render");
        let n = bundle.encode(&text, false).expect("encode").len();
        prompts.push(text);
        if n >= TARGET_TOKENS {
            break;
        }
        messages.push(json!({"role": "assistant", "content": words(1000 + i, 250)}));
    }
    let last = prompts.pop().unwrap_or_default();
    (prompts.pop().unwrap_or_default(), last, messages.len())
}

fn time(f: impl Fn()) -> Vec<u64> {
    sample(|| {
        let t = Instant::now();
        f();
        t.elapsed().as_nanos() as u64
    })
}

fn sample(mut f: impl FnMut() -> u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..RUNS).map(|_| f()).collect();
    v.sort_unstable();
    v
}

fn q(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize] as f64 / 1000.0
}
