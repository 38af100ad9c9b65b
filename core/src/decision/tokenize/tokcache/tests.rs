//! The cached path equals cold `ModelBundle::encode(text, false)`, for the demo bundle and for
//! Qwen3 (NFC normalizer, regex pre-tokenizer, special and non-special added tokens), on random
//! multi-turn conversations that branch and caches that evict.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::decision::tokenize::model::shared_for_tests::{demo, qwen};
use crate::decision::tokenize::model::ModelBundle;

/// Pieces of message content: words, unicode (combining marks that NFC composes, including
/// with a token's closing `>`), whitespace runs, and the special tokens of both bundles.
fn piece() -> impl Strategy<Value = String> {
    let fixed = prop::sample::select(vec![
        "hello",
        "world",
        " the",
        "route",
        "42",
        "3.14",
        "don't",
        "naïve",
        "e\u{301}",
        "\u{338}",
        ">\u{338}",
        "日本語",
        "🦀",
        "\u{a0}",
        " ",
        "  ",
        "\n",
        "\n\n",
        "\t",
        "\r\n",
        " \n ",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "<|eot_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|begin_of_text|>",
        "<|im_",
        "|>",
        "<",
        ">",
        "Ω",
        "ﬁ",
    ])
    .prop_map(str::to_owned);
    prop_oneof![4 => fixed, 1 => "\\PC{0,6}"]
}

fn content() -> impl Strategy<Value = String> {
    prop::collection::vec(piece(), 0..12).prop_map(|p| p.concat())
}

/// A conversation (user, assistant, user, ...) and a second continuation branching off it.
fn conversation() -> impl Strategy<Value = (Vec<String>, usize, Vec<String>)> {
    (
        prop::collection::vec(content(), 1..8),
        any::<prop::sample::Index>(),
        prop::collection::vec(content(), 1..4),
    )
        .prop_map(|(turns, at, branch)| {
            let at = at.index(turns.len());
            (turns, at, branch)
        })
}

fn messages(turns: &[String]) -> Vec<Value> {
    let role = |i: usize| if i % 2 == 0 { "user" } else { "assistant" };
    turns.iter().enumerate().map(|(i, c)| json!({"role": role(i), "content": c})).collect()
}

/// Every prompt of the conversation, turn by turn, then the branch's turns.
fn prompts(b: &ModelBundle, turns: &[String], at: usize, branch: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for k in (1..=turns.len()).step_by(2) {
        out.push(b.render_chat(&messages(&turns[..k])).unwrap());
    }
    let mut other = turns[..at].to_vec();
    other.extend_from_slice(branch);
    for k in at + 1..=other.len() {
        out.push(b.render_chat(&messages(&other[..k])).unwrap());
    }
    out
}

fn check(
    b: &ModelBundle,
    max_bytes: usize,
    texts: &[String],
) -> Result<TokenCacheStats, TestCaseError> {
    let cuts = b.cuts().clone();
    let mut cache = TokenCache::new(TokenCacheLimits { max_bytes });
    for t in texts {
        let cold = b.encode(t, false).unwrap();
        prop_assert_eq!(cache.encode(b, &cuts, t).unwrap(), cold, "text {:?}", t);
        prop_assert!(cache.stats().bytes <= max_bytes);
    }
    Ok(cache.stats())
}

/// The claim the cache rests on, directly: cutting a text at any of its cuts and encoding
/// both sides alone gives the ids of the whole.
fn cut_anywhere(b: &ModelBundle, text: &str) -> Result<(), TestCaseError> {
    let cuts = b.cuts().clone();
    let whole = b.encode(text, false).unwrap();
    for q in cuts.find(text) {
        let mut ids = b.encode(&text[..q], false).unwrap();
        ids.extend(b.encode(&text[q..], false).unwrap());
        prop_assert_eq!(&ids, &whole, "cut at {} of {:?}", q, text);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn demo_cached_equals_cold((turns, at, branch) in conversation(), max_bytes in prop_oneof![Just(4 << 20), 0usize..3000]) {
        check(demo(), max_bytes, &prompts(demo(), &turns, at, &branch))?;
    }

    #[test]
    fn qwen3_cached_equals_cold((turns, at, branch) in conversation(), max_bytes in prop_oneof![Just(4 << 20), 0usize..3000]) {
        check(qwen(), max_bytes, &prompts(qwen(), &turns, at, &branch))?;
    }

    #[test]
    fn cuts_are_stable_in_any_text(text in content()) {
        cut_anywhere(demo(), &text)?;
        cut_anywhere(qwen(), &text)?;
    }
}

#[test]
fn qwen3_cuts_at_every_added_token() {
    let cuts = qwen().cuts().clone();
    for t in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>"] {
        assert!(cuts.tokens().iter().any(|c| c == t), "{t} is not a cut: {:?}", cuts.tokens());
    }
}

#[test]
fn later_turns_reuse_earlier_ones_and_branches_share_their_prefix() {
    let b = qwen();
    let turns: Vec<String> = (0..9).map(|i| format!("turn {i}: {}", "word ".repeat(40))).collect();
    let texts = prompts(b, &turns, 4, &["a different question".to_string()]);
    let stats = check(b, 4 << 20, &texts).unwrap();
    assert_eq!(stats.misses, 1, "only the first turn is cold: {stats:?}");
    assert_eq!(stats.hits as usize, texts.len() - 1);
    assert!(stats.saved_tokens > stats.encoded_tokens, "{stats:?}");
}

#[test]
fn the_bound_holds_and_evicted_segments_are_recomputed() {
    let b = demo();
    let turns: Vec<String> =
        (0..7).map(|i| format!("message {i} {}", "text ".repeat(30))).collect();
    let texts = prompts(b, &turns, 2, &["x".to_string()]);
    let tight = check(b, 600, &texts).unwrap();
    assert!(tight.evictions > 0 && tight.bytes <= 600, "{tight:?}");
    let off = check(b, 0, &texts).unwrap();
    assert_eq!((off.hits, off.misses, off.bypassed as usize), (0, 0, texts.len()));
    let mut cache = TokenCache::default();
    let cuts = b.cuts().clone();
    for t in &texts {
        cache.encode(b, &cuts, t).unwrap();
    }
    let before = cache.stats().entries;
    cache.set_limits(TokenCacheLimits { max_bytes: 1000 });
    assert!(cache.stats().entries < before && cache.stats().bytes <= 1000);
}

/// Tokens taken from the cache by one encode of `text`.
fn saved_by(cache: &mut TokenCache, b: &ModelBundle, text: &str) -> u64 {
    let before = cache.stats().saved_tokens;
    assert_eq!(cache.encode(b, &b.cuts().clone(), text).unwrap(), b.encode(text, false).unwrap());
    cache.stats().saved_tokens - before
}

/// A conversation's prompts: `prompt(k)` has its first `k` messages (5 at most).
fn flooded_conversation(b: &ModelBundle) -> impl Fn(usize) -> String + '_ {
    let turns: Vec<String> = (0..5).map(|i| format!("turn {i}: {}", "word ".repeat(60))).collect();
    move |k| b.render_chat(&messages(&turns[..k])).unwrap()
}

/// About 12 kB of one-shot prompts: three times the 4 000-byte bound of the tests below.
fn one_shots(b: &ModelBundle) -> Vec<String> {
    (0..40)
        .map(|i| {
            b.render_chat(&messages(&[format!("one-shot {i} {}", "text ".repeat(50))])).unwrap()
        })
        .collect()
}

#[test]
fn prompts_seen_once_do_not_push_out_a_conversation_that_came_back() {
    let b = qwen();
    let (prompt, flood) = (flooded_conversation(b), one_shots(b));
    let limits = TokenCacheLimits { max_bytes: 4_000 };

    // The conversation's second turn reuses its first: those segments are protected, and
    // its third turn after the flood still finds them.
    let mut cache = TokenCache::new(limits);
    saved_by(&mut cache, b, &prompt(1));
    assert!(saved_by(&mut cache, b, &prompt(3)) > 60);
    for f in &flood {
        saved_by(&mut cache, b, f);
    }
    assert!(saved_by(&mut cache, b, &prompt(5)) > 60, "{:?}", cache.stats());
    assert!(cache.stats().bytes <= 4_000);

    // Control: a first turn never reused is on probation, and the same flood evicts it.
    let mut cache = TokenCache::new(limits);
    saved_by(&mut cache, b, &prompt(1));
    for f in &flood {
        saved_by(&mut cache, b, f);
    }
    assert!(saved_by(&mut cache, b, &prompt(3)) < 5, "{:?}", cache.stats());
}

#[test]
fn a_conversation_under_way_keeps_its_turns_through_floods_between_each() {
    let b = qwen();
    let (prompt, flood) = (flooded_conversation(b), one_shots(b));
    let limits = TokenCacheLimits { max_bytes: 4_000 };
    let cuts = b.cuts().clone();
    for continued in [true, false] {
        let mut cache = TokenCache::new(limits);
        let mut saved = 0;
        for k in [1, 3, 5] {
            let before = cache.stats().saved_tokens;
            let ids = if continued && k > 1 {
                cache.encode_continued(b, &cuts, &prompt(k)).unwrap()
            } else {
                cache.encode(b, &cuts, &prompt(k)).unwrap()
            };
            assert_eq!(ids, b.encode(&prompt(k), false).unwrap());
            saved = cache.stats().saved_tokens - before;
            for f in &flood {
                saved_by(&mut cache, b, f);
            }
        }
        // The third turn finds the second (protected when it was stored as continued); on
        // probation the flood took it.
        assert_eq!(saved > 100, continued, "continued {continued}: {:?}", cache.stats());
        assert!(cache.stats().bytes <= limits.max_bytes);
    }
}

#[test]
fn a_protected_segment_unused_for_long_goes_back_on_probation() {
    let b = qwen();
    let limits = TokenCacheLimits { max_bytes: 4_000 };
    let mut cache = TokenCache::new(limits);
    // Conversations that each come back once: more reused segments than the protected share
    // holds, so the earliest go back on probation and are evicted under the bound.
    for c in 0..30 {
        let turns: Vec<String> =
            (0..3).map(|i| format!("conversation {c} turn {i} {}", "x ".repeat(20))).collect();
        saved_by(&mut cache, b, &b.render_chat(&messages(&turns[..1])).unwrap());
        saved_by(&mut cache, b, &b.render_chat(&messages(&turns[..3])).unwrap());
        let (num, den) = PROTECTED_SHARE;
        assert!(cache.protected_bytes <= limits.max_bytes / den * num);
        assert!(cache.stats().bytes <= limits.max_bytes);
    }
    assert!(cache.stats().evictions > 0);
}

/// The old byte-by-byte scan, as the reference of the memchr one.
fn find_naive(tokens: &[String], text: &str) -> Vec<usize> {
    let (mut out, bytes, mut i) = (Vec::new(), text.as_bytes(), 0);
    while i < bytes.len() {
        match tokens.iter().find(|t| bytes[i..].starts_with(t.as_bytes())) {
            Some(t) => {
                i += t.len();
                out.push(i);
            }
            None => i += 1,
        }
    }
    out
}

proptest! {
    #[test]
    fn find_equals_the_byte_by_byte_scan(
        tokens in prop::collection::vec("[<\\[{(|][a-z|/]{0,4}[>\\]}|]", 1..6),
        text in "([a-z<>\\[\\]{}()|/ ]{0,6}){0,30}",
    ) {
        let mut sorted = tokens.clone();
        sorted.sort();
        let cuts = Cuts::from_tokens(tokens);
        prop_assert_eq!(cuts.find(&text), find_naive(&sorted, &text));
    }
}
