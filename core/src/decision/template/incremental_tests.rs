//! The window's own rules and templates the battery refuses. The shipped templates are
//! checked against full renders in `tokenize/rendercache/shipped_tests.rs` (they need the
//! bundles).

use serde_json::{json, Map, Value as Json};

use super::*;

fn specials() -> Map<String, Json> {
    json!({"bos_token": "<s>", "eos_token": "</s>"}).as_object().cloned().unwrap_or_default()
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
