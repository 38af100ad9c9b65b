//! The shipped templates (the demo bundle's and Qwen3's): `ChatTemplate::render_after` equals a
//! full render at every split point of random conversations, both pass the battery, and a
//! growing chat is answered from its window.

use proptest::prelude::*;
use serde_json::{json, Map, Value as Json};

use crate::decision::template::{ChatTemplate, RenderInput};
use crate::decision::tokenize::model::shared_for_tests::{demo, qwen};

/// What a conversation's requests look like: the messages, the tools, the kwargs.
#[derive(Debug, Clone)]
struct Case {
    messages: Vec<Json>,
    tools: Option<Vec<Json>>,
    kwargs: Map<String, Json>,
}

impl Case {
    fn input(&self, n: usize, agp: bool) -> RenderInput<'_> {
        RenderInput {
            messages: &self.messages[..n],
            tools: self.tools.as_deref(),
            documents: None,
            add_generation_prompt: agp,
            kwargs: &self.kwargs,
        }
    }
}

/// Every split point `k < n` of every prefix `n` that ends in a user or tool message, from a
/// base with and without the generation prompt: each answer of `render_after` equals the full
/// render. Returns how many answered (the rest declined).
fn check_every_split(t: &ChatTemplate, case: &Case) -> usize {
    let mut answered = 0;
    let len = case.messages.len();
    for n in 2..=len {
        let Ok(want) = t.render(&case.input(n, true)) else { continue };
        for k in 1..n {
            for agp in [false, true] {
                let Ok(base) = t.render(&case.input(k, agp)) else { continue };
                if let Some(got) = t.render_after(&case.input(n, true), k, &base, agp) {
                    if got != want {
                        let at = got.bytes().zip(want.bytes()).take_while(|(a, b)| a == b).count();
                        panic!(
                            "n={n} k={k} base_agp={agp} differ at {at}: got {:?} want {:?}",
                            &got[at.saturating_sub(80)..(at + 80).min(got.len())],
                            &want[at.saturating_sub(80)..(at + 80).min(want.len())]
                        );
                    }
                    answered += 1;
                }
            }
        }
    }
    answered
}

fn content() -> impl Strategy<Value = String> {
    let long = "[a-z \n]{120,260}";
    prop_oneof![
        "[a-z ]{0,12}",
        long,
        long.prop_map(|s| format!("<tool_response>\n{s}\n</tool_response>")),
        (long, long).prop_map(|(a, b)| format!("{a}</think>\n\n{b}")),
        (long, long).prop_map(|(a, b)| format!("<think>{a}</think>{b}")),
        Just("<tool_response>\nr\n</tool_response>".to_owned()),
        Just("<think>\nhm\n</think>\n\nso".to_owned()),
        Just("  padded \n\n".to_owned()),
        Just(String::new()),
    ]
}

/// An assistant's answer: plain, with reasoning, or a tool call with one or two results and a
/// final answer.
fn answer() -> impl Strategy<Value = Vec<Json>> {
    let call = json!({"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get", "arguments": {"q": "x"}}}]});
    prop_oneof![
        content().prop_map(|c| vec![json!({"role": "assistant", "content": c})]),
        (content(), "[a-z]{1,6}").prop_map(|(c, r)| vec![
            json!({"role": "assistant", "content": c, "reasoning_content": r})
        ]),
        (content(), 1..3usize, content()).prop_map(move |(r, tools, c)| {
            let mut v = vec![call.clone()];
            v.extend(
                (0..tools)
                    .map(|_| json!({"role": "tool", "content": r.clone(), "tool_call_id": "c"})),
            );
            v.push(json!({"role": "assistant", "content": c}));
            v
        }),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let system = proptest::option::of(content());
    let turns = proptest::collection::vec((content(), answer()), 1..5);
    let tools = proptest::option::of(Just(vec![json!({"type": "function", "function": {
        "name": "get", "description": "d", "parameters": {"type": "object", "properties": {}}}})]));
    let thinking = proptest::option::of(any::<bool>());
    (system, turns, content(), tools, thinking).prop_map(
        |(system, turns, last, tools, thinking)| {
            let mut messages = Vec::new();
            if let Some(s) = system {
                messages.push(json!({"role": "system", "content": s}));
            }
            for (user, answer) in turns {
                messages.push(json!({"role": "user", "content": user}));
                messages.extend(answer);
            }
            messages.push(json!({"role": "user", "content": last}));
            let mut kwargs = Map::new();
            if let Some(t) = thinking {
                kwargs.insert("enable_thinking".into(), json!(t));
            }
            Case { messages, tools, kwargs }
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn qwen3_render_after_equals_a_full_render(case in case()) {
        check_every_split(qwen().template(), &case);
    }

    #[test]
    fn demo_render_after_equals_a_full_render(case in case()) {
        check_every_split(demo().template(), &case);
    }
}

#[test]
fn the_shipped_templates_pass_the_battery() {
    assert!(demo().template().incremental());
    assert!(qwen().template().incremental());
}

/// The next turn of a plain chat (the previous request's messages, the answer, a new user
/// message) is answered from the window, with and without thinking, with and without tools.
#[test]
fn a_growing_chat_is_rendered_from_its_window() {
    for t in [demo().template(), qwen().template()] {
        for (tools, thinking) in [(false, None), (true, Some(false)), (false, Some(true))] {
            let mut messages = vec![json!({"role": "system", "content": "s"})];
            for i in 0..6 {
                messages.push(json!({"role": "user", "content": format!("q{i}")}));
                messages.push(json!({"role": "assistant", "content": format!("a{i}")}));
            }
            messages.push(json!({"role": "user", "content": "last"}));
            let mut kwargs = Map::new();
            if let Some(th) = thinking {
                kwargs.insert("enable_thinking".into(), json!(th));
            }
            let tools = tools.then(|| vec![json!({"type": "function", "function": {"name": "f"}})]);
            let case = Case { messages, tools, kwargs };
            let n = case.messages.len();
            let base = t.render(&case.input(n - 2, true)).unwrap();
            let got = t.render_after(&case.input(n, true), n - 2, &base, true);
            assert_eq!(got.as_deref(), Some(t.render(&case.input(n, true)).unwrap().as_str()));
            assert!(check_every_split(t, &case) > 0);
        }
    }
}
