//! Rendering the k-th turn of an 8 k-token Qwen3 conversation: in full (the whole
//! conversation through the chat template) against from the render cache (turn k-1 is cached,
//! so only the window and the new messages are rendered), and the template's battery (run
//! once per template per thread). The full render runs twice; the ratio of its two medians is
//! the noise floor. Run: `cargo bench -p kvroute-core --bench render` (needs `./dev setup`).

use std::time::Instant;

use kvroute_core::decision::request::ChatPrompt;
use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_core::decision::tokenize::rendercache::RenderCache;
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
    let t = Instant::now();
    let allowed = bundle.template().incremental();
    let battery = t.elapsed();
    for (shape, user_words, answer_words) in [("long questions", 750, 2), ("long answers", 60, 400)]
    {
        let (prev, last) = conversation(&bundle, user_words, answer_words);
        let full_text = bundle.render(&last).expect("render");
        let mut seeded = RenderCache::default();
        seeded.render(&bundle, &prev).expect("seed");
        let full = || {
            time(|| {
                bundle.render(&last).expect("render");
            })
        };
        let full_a = full();
        let cached = sample(|| {
            let mut cache = RenderCache::default();
            cache.render(&bundle, &prev).expect("seed");
            let t = Instant::now();
            let text = cache.render(&bundle, &last).expect("cached");
            let ns = t.elapsed().as_nanos() as u64;
            assert_eq!(text, full_text);
            assert_eq!(cache.stats().hits, 1);
            ns
        });
        let full_b = full();
        println!(
            "Qwen3, {shape}: {} messages, {} bytes rendered",
            last.messages.len(),
            full_text.len()
        );
        report("full", "cached", &full_a, &full_b, &cached);
    }
    println!(
        "template battery: {allowed} in {:.1} ms (once per template per thread)",
        battery.as_secs_f64() * 1e3
    );
}

/// A system prompt, then user / assistant turns until the rendered prompt passes the target;
/// returns the chats of the last two user turns.
fn conversation(
    bundle: &ModelBundle,
    user_words: usize,
    answer_words: usize,
) -> (ChatPrompt, ChatPrompt) {
    let mut messages: Vec<Value> = vec![json!({"role": "system", "content": words(1, 120)})];
    let mut chats = Vec::new();
    for i in 0u64.. {
        messages.push(json!({"role": "user", "content": words(100 + i, user_words)}));
        let chat = ChatPrompt::new(messages.clone());
        let n = bundle.encode(&bundle.render(&chat).expect("render"), false).expect("encode").len();
        chats.push(chat);
        if n >= TARGET_TOKENS {
            break;
        }
        messages.push(json!({"role": "assistant", "content": words(1000 + i, answer_words)}));
    }
    let last = chats.pop().expect("a turn");
    (chats.pop().expect("two turns"), last)
}
