//! Tokenization with the `tokenizers` crate against the exact fast path (`fastbpe`), for
//! Qwen3 and the demo bundle: a short chat prompt (~25 tokens), an ~8 k-token conversation of
//! synthetic words, and ~8 k tokens of this repository's architecture page
//! (`docs/architecture.md`: prose, tables, code; the README was this input until it became a
//! short first page). The fast path is measured with its piece cache cleared before every call
//! (cold) and kept (warm: the same text again). The crate runs twice; the ratio of its two
//! medians is the noise floor. Also prints the heap the fast encoder adds to a Qwen3 bundle,
//! and what the bundle built from its compiled transfer form (as the updater sends it to the
//! filter) costs: size, build time, peak and kept heap, and its encode time against the
//! bundle built from the files (run twice: the noise floor).
//! Run: `cargo bench -p kvroute-core --bench encode` (needs `./dev setup` for Qwen3).

use std::sync::atomic::Ordering;
use std::time::Instant;

use kvroute_core::decision::tokenize::fastbpe::FastBpe;
use kvroute_core::decision::tokenize::model::{qwen3_dir, ModelBundle};
use kvroute_testkit::textgen::words;
use serde_json::{json, Value};

#[path = "common/alloc.rs"]
mod alloc;
use alloc::{Counting, LIVE, PEAK};

#[global_allocator]
static A: Counting = Counting;

#[path = "common/bundle.rs"]
mod bundle;

const TARGET_TOKENS: usize = 8192;
const PROSE: &str = include_str!("../../docs/architecture.md");

fn main() {
    let qwen = bundle::qwen3_or_exit();
    let demo = ModelBundle::demo().expect("demo bundle");
    memory(&qwen);
    for (name, bundle) in [("Qwen3", &qwen), ("demo", &demo)] {
        let fast = bundle.fast_encoder().expect("fast encoder");
        let short = bundle
            .render_chat(&[json!({"role": "user", "content": "What is the capital of France? Answer in one word."})])
            .expect("render");
        let chat = conversation(bundle);
        let prose = prose(bundle);
        if name == "Qwen3" {
            cache_memory(fast, &[&chat, &prose]);
            compiled(bundle, &chat);
        }
        println!("{name}:");
        for (what, text, runs) in [
            ("short prompt", &short, 3000),
            ("8k conversation", &chat, 100),
            ("8k docs prose", &prose, 100),
        ] {
            compare(bundle, fast, what, text, runs);
        }
    }
}

fn compare(bundle: &ModelBundle, fast: &FastBpe, what: &str, text: &str, runs: usize) {
    let want = bundle.encode_with_crate(text, false).expect("encode");
    assert_eq!(fast.encode(text, false), want, "the fast path must be exact");
    let crate_run = || p50(runs, || drop(bundle.encode_with_crate(text, false)));
    let crate_a = crate_run();
    let cold = p50(runs, || {
        fast.clear_cache();
        drop(fast.encode(text, false))
    });
    let warm = p50(runs, || drop(fast.encode(text, false)));
    let crate_b = crate_run();
    let crate_ = crate_a.min(crate_b);
    let floor = crate_a.max(crate_b) / crate_;
    println!(
        "  {what:>16} ({:>5} tokens): crate {crate_a:>9.1} / {crate_b:>9.1} µs (noise x{floor:.2}), \
         fast cold {cold:>8.1} µs (x{:.1}), fast warm {warm:>8.1} µs (x{:.1}); \
         crate {:.2} M tokens/s, fast cold {:.2} M tokens/s",
        want.len(),
        crate_ / cold,
        crate_ / warm,
        want.len() as f64 / crate_,
        want.len() as f64 / cold,
    );
}

/// Live heap of the fast encoder of Qwen3's tokenizer (built again on its own).
fn memory(qwen: &ModelBundle) {
    let json = std::fs::read_to_string(qwen3_dir().join("tokenizer.json")).expect("tokenizer.json");
    let before = LIVE.load(Ordering::Relaxed);
    let t = Instant::now();
    let fast =
        FastBpe::new(qwen.tokenizer().expect("tokenizers model"), &json).expect("fast encoder");
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    let after = LIVE.load(Ordering::Relaxed);
    fast.clear_cache();
    let cleared = LIVE.load(Ordering::Relaxed);
    println!(
        "Qwen3 fast encoder: built in {build_ms:.0} ms, {:.2} MB live after build ({:.2} MB without the probe's cache entries; merge table {:.2} MB)",
        after.saturating_sub(before) as f64 / 1e6,
        cleared.saturating_sub(before) as f64 / 1e6,
        fast.table_bytes() as f64 / 1e6,
    );
    let t = Instant::now();
    let b = ModelBundle::from_dir(&qwen3_dir()).expect("bundle");
    println!(
        "Qwen3 bundle (crate + template + fast encoder): loaded in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    drop(b);
}

/// The Qwen3 bundle built from its compiled form, against the one built from the files.
fn compiled(qwen: &ModelBundle, text: &str) {
    let blob = qwen.compiled_encoder().expect("compiled encoder");
    let config = std::fs::read_to_string(qwen3_dir().join("tokenizer_config.json"))
        .expect("tokenizer_config.json");
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let t = Instant::now();
    let b = ModelBundle::from_compiled(qwen.fingerprint(), &blob, &config).expect("compiled");
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    let kept = LIVE.load(Ordering::Relaxed).saturating_sub(before);
    let (from_files, from_blob) =
        (qwen.fast_encoder().expect("fast"), b.fast_encoder().expect("fast"));
    assert_eq!(from_blob.encode(text, false), from_files.encode(text, false));
    let cold = |f: &FastBpe| {
        p50(100, || {
            f.clear_cache();
            drop(f.encode(text, false))
        })
    };
    let (files_a, blob_us, files_b) = (cold(from_files), cold(from_blob), cold(from_files));
    let files = files_a.min(files_b);
    println!(
        "Qwen3 compiled bundle: {:.2} MB; built in {build_ms:.0} ms, heap peak {:.2} MB, kept {:.2} MB; \
         8k conversation cold {blob_us:.1} µs vs {files_a:.1} / {files_b:.1} µs from the files (x{:.2}, noise x{:.2})",
        blob.len() as f64 / 1e6,
        peak as f64 / 1e6,
        kept as f64 / 1e6,
        blob_us / files,
        files_a.max(files_b) / files,
    );
}

/// Live heap of the piece cache once it has seen many distinct pieces (it is cleared when full).
fn cache_memory(fast: &FastBpe, texts: &[&str]) {
    fast.clear_cache();
    let before = LIVE.load(Ordering::Relaxed);
    let mut peak = 0;
    for seed in 0..40 {
        for t in texts {
            // Shifting every letter makes new pieces.
            let shifted: String = t
                .chars()
                .map(|c| match c {
                    'a'..='y' => char::from_u32(((c as u32 - 97 + seed) % 25) + 97).unwrap_or(c),
                    c => c,
                })
                .collect();
            drop(fast.encode(&shifted, false));
            peak = peak.max(LIVE.load(Ordering::Relaxed).saturating_sub(before));
        }
    }
    fast.clear_cache();
    println!(
        "Qwen3 piece cache: at most {:.2} MB live while filling and clearing",
        peak as f64 / 1e6
    );
}

/// A Qwen3-style conversation rendered until it passes the target (as the tokcache bench).
fn conversation(bundle: &ModelBundle) -> String {
    let mut messages: Vec<Value> = vec![json!({"role": "system", "content": words(1, 120)})];
    for i in 0u64.. {
        messages.push(json!({"role": "user", "content": words(100 + i, 120)}));
        let text = bundle.render_chat(&messages).expect("render");
        if bundle.encode_with_crate(&text, false).expect("encode").len() >= TARGET_TOKENS {
            return text;
        }
        messages.push(json!({"role": "assistant", "content": words(1000 + i, 250)}));
    }
    unreachable!()
}

/// The architecture page's first lines (repeated if need be), about the target in tokens.
fn prose(bundle: &ModelBundle) -> String {
    let mut text = String::new();
    for line in PROSE.lines().cycle() {
        text.push_str(line);
        text.push('\n');
        if text.len() % 16 == 0
            && bundle.encode_with_crate(&text, false).expect("encode").len() >= TARGET_TOKENS
        {
            break;
        }
    }
    text
}

fn p50(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<u64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as u64
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2] as f64 / 1000.0
}
