use serde_json::{json, Value};

use super::*;
use crate::decision::request::MediaCut;
use crate::decision::tokenize::model::shared_for_tests::{demo, qwen};

fn chat(messages: &[Value]) -> ChatPrompt {
    ChatPrompt::new(messages.to_vec())
}

/// A conversation of `MIN_MESSAGES` messages ending with `last`.
fn long_enough(last: &str) -> Vec<Value> {
    let mut m: Vec<Value> = (1..MIN_MESSAGES)
        .map(|i| {
            let role = if i % 2 == 1 { "user" } else { "assistant" };
            json!({"role": role, "content": format!("m{i}")})
        })
        .collect();
    m.push(json!({"role": "user", "content": last}));
    m
}

/// A conversation growing turn by turn through one cache renders each turn as a full render
/// would, and every turn after the first starts from the previous one.
#[test]
fn each_turn_equals_a_full_render_and_reuses_the_last() {
    for bundle in [demo(), qwen()] {
        let mut cache = RenderCache::default();
        let mut messages = vec![json!({"role": "system", "content": "be brief"})];
        for turn in 0..8 {
            messages.push(json!({"role": "user", "content": format!("question {turn}")}));
            let c = chat(&messages);
            assert_eq!(cache.render(bundle, &c).unwrap(), bundle.render(&c).unwrap());
            messages.push(json!({"role": "assistant", "content": format!("answer {turn}")}));
        }
        // Turns 1 and 2 (2 and 4 messages) are short: rendered in full, not stored.
        let s = cache.stats();
        assert_eq!((s.hits, s.misses, s.declined, s.bypassed), (5, 1, 0, 2));
        assert_eq!(s.entries, 6);
    }
}

/// Tools, kwargs and the bundle are part of the key: a prompt that differs only there is not
/// taken from the cache, and is still rendered right.
#[test]
fn context_is_part_of_the_key() {
    let bundle = qwen();
    let mut cache = RenderCache::default();
    let messages = long_enough("hi");
    let plain = chat(&messages);
    let mut thinking = chat(&messages);
    thinking.kwargs.insert("enable_thinking".into(), json!(false));
    let mut tools = chat(&messages);
    tools.tools = Some(vec![json!({"type": "function", "function": {"name": "f"}})]);
    for c in [&plain, &thinking, &tools] {
        assert_eq!(cache.render(bundle, c).unwrap(), bundle.render(c).unwrap());
    }
    assert_eq!(cache.render(demo(), &plain).unwrap(), demo().render(&plain).unwrap());
    assert_eq!(cache.stats().hits, 0);
    // The same prompt again is a copy of the entry.
    assert_eq!(cache.render(bundle, &thinking).unwrap(), bundle.render(&thinking).unwrap());
    assert_eq!(cache.stats().hits, 1);
}

/// A retry without the generation prompt, a branch that edits an earlier message, and a
/// prompt with media or `continue_final_message` all come out as a full render.
#[test]
fn branches_and_ineligible_prompts_render_in_full() {
    let bundle = qwen();
    let mut cache = RenderCache::default();
    let base: Vec<Value> = (0..7)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": format!("m{i}")})
        })
        .collect();
    cache.render(bundle, &chat(&base)).unwrap();
    let mut no_gen = chat(&base);
    no_gen.add_generation_prompt = false;
    let mut edited = base.clone();
    edited[2] = json!({"role": "user", "content": "changed"});
    edited.push(json!({"role": "assistant", "content": "a"}));
    edited.push(json!({"role": "user", "content": "u"}));
    let mut media = chat(&base);
    media.media = Some(MediaCut { message: 0, items: 1 });
    let mut cont = chat(&base);
    cont.add_generation_prompt = false;
    cont.continue_final_message = true;
    for c in [no_gen, chat(&edited), media, cont] {
        assert_eq!(cache.render(bundle, &c).unwrap(), bundle.render(&c).unwrap());
    }
    assert_eq!(cache.stats().bypassed, 2);
}

#[test]
fn bytes_stay_within_the_bound_and_zero_turns_it_off() {
    let bundle = demo();
    let mut cache = RenderCache::new(RenderCacheLimits { max_bytes: 2_000 });
    for i in 0..50 {
        let c = chat(&long_enough(&format!("conversation {i}")));
        assert_eq!(cache.render(bundle, &c).unwrap(), bundle.render(&c).unwrap());
        assert!(cache.stats().bytes <= 2_000);
    }
    assert!(cache.stats().evictions > 0);
    // A prompt over the whole bound is rendered, not stored, and evicts nothing.
    let (entries, evictions) = (cache.stats().entries, cache.stats().evictions);
    let huge = chat(&long_enough(&"x".repeat(3_000)));
    assert_eq!(cache.render(bundle, &huge).unwrap(), bundle.render(&huge).unwrap());
    assert_eq!((cache.stats().entries, cache.stats().evictions), (entries, evictions));
    let mut off = RenderCache::new(RenderCacheLimits { max_bytes: 0 });
    let c = chat(&long_enough("x"));
    assert_eq!(off.render(bundle, &c).unwrap(), bundle.render(&c).unwrap());
    assert_eq!((off.stats().bypassed, off.stats().entries), (1, 0));
    // A short prompt is not stored either.
    let mut on = RenderCache::default();
    on.render(bundle, &chat(&[json!({"role": "user", "content": "x"})])).unwrap();
    assert_eq!((on.stats().bypassed, on.stats().entries), (1, 0));
}

#[test]
fn a_render_error_is_returned_and_nothing_is_stored() {
    let bundle = demo().with_chat_template("{{ raise_exception('no') }}").unwrap();
    let mut cache = RenderCache::default();
    let c = chat(&long_enough("x"));
    assert!(cache.render(&bundle, &c).is_err());
    assert_eq!(cache.stats().entries, 0);
}
