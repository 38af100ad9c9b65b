use proptest::prelude::*;
use serde_json::{json, Map, Value as Json};

use super::*;
use crate::decision::tokenize::model::shared_for_tests::{demo, qwen};

fn specials() -> Map<String, Json> {
    json!({"bos_token": "<s>", "eos_token": "</s>"}).as_object().cloned().unwrap_or_default()
}

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

/// A template whose new messages depend on more of the history than the window keeps is
/// refused by the battery.
#[test]
fn templates_that_read_the_whole_history_are_not_incremental() {
    for src in [
        // Absolute positions.
        "{% for m in messages %}{{ loop.index }}:{{ m.content }}\n{% endfor %}",
        // The first user message, repeated after every answer.
        "{% for m in messages %}{{ m.content }}{% if m.role == 'assistant' %}\
         [{{ messages[1].content }}]{% endif %}{% endfor %}",
        // The number of messages, in the generation prompt.
        "{% for m in messages %}{{ m.content }}{% endfor %}\
         {% if add_generation_prompt %}<{{ messages|length }}>{% endif %}",
    ] {
        let t = ChatTemplate::new(src, &specials()).unwrap();
        assert!(!t.incremental(), "{src}");
    }
    let plain = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}\
                 {% if add_generation_prompt %}<assistant>{% endif %}";
    assert!(ChatTemplate::new(plain, &specials()).unwrap().incremental());
}

#[test]
fn the_window_keeps_the_first_message_and_the_current_turn_with_the_parity() {
    let m = |role: &str| json!({"role": role, "content": "x"});
    let h = [m("system"), m("user"), m("assistant"), m("user"), m("assistant"), m("tool")];
    // Last user at 3 (odd): window [0, 3, 4, 5], 4 messages for a history of 6.
    assert_eq!(window_start(&h), 3);
    let h = [m("user"), m("assistant"), m("user"), m("assistant"), m("user"), m("assistant")];
    // Last user at 4 (even): one earlier, window [0, 3, 4, 5].
    assert_eq!(window_start(&h), 3);
    assert_eq!(window_start(&h[..4]), 1);
    let h = [m("system"), m("assistant"), m("tool"), m("assistant"), m("tool")];
    assert_eq!(window_start(&h), 1);
}

#[test]
fn a_long_text_keeps_its_ends_and_its_tags() {
    let prose = "word ".repeat(40);
    let s = format!("<tool_response>{prose}<think>a < b{prose}</think>{prose}é</tool_response>");
    let c = cut(&s);
    assert!(c.starts_with("<tool_response>") && c.ends_with("é</tool_response>"), "{c}");
    assert!(c.contains("<think> ") && c.contains("</think> ") && c.len() < 2 * KEEP_END + 40);
    assert!(!c.contains("a < b"));
    // Short texts are kept whole.
    let m = json!({"role": "user", "content": "short", "reasoning_content": s});
    let kept = stand_in(&m);
    assert_eq!(kept["content"], "short");
    assert_eq!(kept["reasoning_content"], json!(c));
}
