//! Tokenizing the k-th turn of an 8 k-token Qwen3 conversation: cold (the whole rendered prompt)
//! against warm (a thread's token cache already holds turn k-1, so only the new turn is
//! encoded). The cold measurement runs twice; the ratio of its two medians is the noise floor.
//! Run: `cargo bench -p kvroute-core --bench tokcache` (needs `./dev setup` for Qwen3).

use std::time::Instant;

use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_core::decision::tokenize::tokcache::{TokenCache, TokenCacheLimits};
use kvroute_testkit::textgen::words;
use serde_json::{json, Value};

#[path = "common/bundle.rs"]
mod bundle;
#[path = "common/timing.rs"]
mod timing;

use timing::{report, sample, time};

const TARGET_TOKENS: usize = 8192;

fn main() {
    let bundle = bundle::qwen3_or_exit();
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
    report("cold", "warm", &cold_a, &cold_b, &warm);
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
