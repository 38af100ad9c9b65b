//! Rendering only what a conversation's new turn adds.
//!
//! Turn `n` of a chat repeats the messages of an earlier request, `m[..k]`, and appends a few.
//! For the usual chat template, `render(m[..n])` is `render(m[..k])` (without the generation
//! prompt) followed by what the appended messages add, and what they add depends on the
//! earlier messages only through the first one (a system prompt, a tools header), the current
//! turn (the messages from the last user query on: tool-call grouping, where the last query
//! is) and the parity of positions (templates that check that roles alternate).
//! [`ChatTemplate::render_after`] therefore renders a *window*: the first message, the current
//! turn of `m[..k]` (their long texts cut to their two ends and the markup tags between: the
//! history's text itself comes from the stored render) and the new messages, and keeps what follows the window's own
//! history. It
//! checks on the window that the history's text is a prefix of the whole and that a stored
//! text ends with the generation prompt it is said to carry, and declines (`None`: render in
//! full) when either does not hold. The window has a handful of messages, so the cost follows
//! the new messages, not the conversation.
//!
//! That the window stands for the whole history is a property of the template, not of
//! Jinja: [`ChatTemplate::incremental`] runs a battery of conversations (system prompts, tool
//! calls and results, reasoning, contents that look like markers, every split point) once per
//! template and allows the shortcut only when every answer equals a full render. The property
//! tests in `tokenize/rendercache/shipped_tests.rs` check the shipped templates over random
//! conversations.

use serde_json::{json, Value as Json};

use super::{ChatTemplate, RenderInput};

/// A history this short is rendered whole in the window.
const WHOLE_HISTORY: usize = 4;

/// Where the window's history resumes after the first message: at the last user message of
/// `history` that does not open with markup (templates that look for "the last query" skip
/// user messages carrying tool results as `<tool_response>`), or one earlier, so that the
/// window's history has `history`'s parity.
fn window_start(history: &[Json]) -> usize {
    let k = history.len();
    if k <= WHOLE_HISTORY {
        return 1;
    }
    let is_query = |m: &Json| {
        m.get("role").and_then(Json::as_str) == Some("user")
            && !m.get("content").and_then(Json::as_str).is_some_and(|c| c.starts_with('<'))
    };
    let u = (1..k).rev().find(|&i| is_query(&history[i])).unwrap_or(1);
    // The window's history is `1 + (k - u)` long: the same parity as `k` when `u` is odd.
    if u % 2 == 0 {
        u - 1
    } else {
        u
    }
}

/// Texts longer than this are cut in the window's history.
const KEEP_WHOLE: usize = 128;
/// Bytes kept from each end of a longer text (what templates test with `startswith`,
/// `endswith`: tool-response tags, thinking tags).
const KEEP_END: usize = 48;
/// The longest `<...>` kept from the middle of a longer text.
const KEEP_TAG: usize = 40;

/// A history message as the window has it: its long texts (`content`, `reasoning_content`)
/// cut to their two ends and the markup tags between them (what templates test with `in`
/// and `split`: `</think>`), since the history's own text is taken from the stored render.
fn stand_in(m: &Json) -> Json {
    let Json::Object(fields) = m else { return m.clone() };
    let fields = fields
        .iter()
        .map(|(k, v)| match (k.as_str(), v) {
            ("content" | "reasoning_content", Json::String(s)) if s.len() > KEEP_WHOLE => {
                (k.clone(), Json::String(cut(s)))
            }
            _ => (k.clone(), v.clone()),
        })
        .collect();
    Json::Object(fields)
}

/// `s`'s first and last [`KEEP_END`] bytes (at character boundaries) with the tags found
/// between them, each followed by a space.
fn cut(s: &str) -> String {
    let head = (0..=KEEP_END).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
    let tail = (s.len() - KEEP_END..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
    let mut out = String::with_capacity(2 * KEEP_END + KEEP_TAG);
    out.push_str(&s[..head]);
    let middle = &s[head..tail];
    let mut rest = middle;
    while let Some(open) = rest.find('<') {
        let after = &rest[open..];
        let close = after.get(1..).and_then(|a| a.find(['<', '>'])).map(|i| i + 1);
        match close {
            Some(c) if after.as_bytes()[c] == b'>' && c < KEEP_TAG => {
                out.push_str(&after[..=c]);
                out.push(' ');
                rest = &after[c + 1..];
            }
            Some(c) => rest = &after[c..],
            None => break,
        }
    }
    out.push_str(&s[tail..]);
    out
}

impl ChatTemplate {
    /// `input` rendered in full, given `base`: the render of its first `k` messages with the
    /// same tools, documents and kwargs, with the generation prompt when `base_agp`. `None`
    /// when the window's checks fail or the window does not render (render in full then).
    /// Only meaningful for a template that [`ChatTemplate::incremental`] allows.
    pub fn render_after(
        &self,
        input: &RenderInput<'_>,
        k: usize,
        base: &str,
        base_agp: bool,
    ) -> Option<String> {
        let messages = input.messages;
        if k == 0 || k > messages.len() {
            return None;
        }
        let u = window_start(&messages[..k]);
        let mut window = Vec::with_capacity(1 + messages.len() - u);
        window.push(stand_in(&messages[0]));
        window.extend(messages[u..k].iter().map(stand_in));
        window.extend_from_slice(&messages[k..]);
        let history = 1 + k - u;
        let render = |msgs: &[Json], agp: bool| {
            self.render(&RenderInput { messages: msgs, add_generation_prompt: agp, ..*input }).ok()
        };
        let b0 = render(&window[..history], false)?;
        let base = if base_agp {
            let b1 = render(&window[..history], true)?;
            base.strip_suffix(b1.strip_prefix(b0.as_str())?)?
        } else {
            base
        };
        let whole = render(&window, input.add_generation_prompt)?;
        let tail = whole.strip_prefix(b0.as_str())?;
        let mut out = String::with_capacity(base.len() + tail.len());
        out.push_str(base);
        out.push_str(tail);
        Some(out)
    }

    /// Whether [`ChatTemplate::render_after`] may stand for a full render with this template:
    /// it gave a full render's text on every conversation and split point of the battery
    /// (computed once, on first use).
    pub fn incremental(&self) -> bool {
        *self.incremental.get_or_init(|| self_check(self))
    }
}

/// Runs the battery; see the module documentation.
fn self_check(t: &ChatTemplate) -> bool {
    let kwargs = serde_json::Map::new();
    let mut answered = 0;
    for messages in battery() {
        let input = |n: usize, agp: bool| RenderInput {
            messages: &messages[..n],
            tools: None,
            documents: None,
            add_generation_prompt: agp,
            kwargs: &kwargs,
        };
        // The full renders of every prefix, with and without the generation prompt.
        let full: Vec<[Option<String>; 2]> = (0..=messages.len())
            .map(|n| [t.render(&input(n, false)).ok(), t.render(&input(n, true)).ok()])
            .collect();
        // Requests end with a user or tool message and repeat the previous request's messages
        // plus a few.
        let ends_a_request = |n: usize| {
            let role = messages[n - 1].get("role").and_then(Json::as_str);
            n == messages.len() || matches!(role, Some("user" | "tool"))
        };
        for n in (2..=messages.len()).filter(|&n| ends_a_request(n)) {
            let Some(want) = &full[n][1] else { continue };
            let first = n.saturating_sub(4).max(1);
            for (k, bases) in full.iter().enumerate().take(n).skip(first) {
                for agp in [false, true] {
                    let Some(base) = &bases[usize::from(agp)] else { continue };
                    match t.render_after(&input(n, true), k, base, agp) {
                        Some(got) if &got == want => answered += 1,
                        Some(_) => return false,
                        None => {}
                    }
                }
            }
        }
    }
    answered > 0
}

/// The battery's conversations: system prompts or none, plain turns, tool calls with one or
/// two results, reasoning (as a field and inline), and contents that look like the markers
/// templates test for (tool responses, thinking tags, surrounding whitespace).
pub(crate) fn battery() -> Vec<Vec<Json>> {
    // Longer than the window keeps whole, with markers at the ends and in the middle.
    let long = |s: &str| format!("{s} {}\n{s}", "lorem ipsum ".repeat(20));
    let sys = json!({"role": "system", "content": long("  You are terse.\n")});
    let user = |c: &str| json!({"role": "user", "content": c});
    let asst = |c: &str| json!({"role": "assistant", "content": c});
    let call = json!({"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]});
    let tool = |c: &str| json!({"role": "tool", "content": c, "tool_call_id": "c1"});
    let reasoned = json!({"role": "assistant", "content": "ok", "reasoning_content": "why"});
    let plain = vec![
        user("hi"),
        asst("hello"),
        user(&long(" two \n")),
        asst(&format!("<think>\n{}\n</think>\n\nyes", long("r"))),
        user("three"),
        asst("x"),
        user("four"),
    ];
    let tools = vec![
        user("use f"),
        call.clone(),
        tool("r1"),
        reasoned.clone(),
        user(&format!("<tool_response>\n{}\n</tool_response>", long("not one"))),
        call.clone(),
        tool("r2"),
        tool("r3"),
        asst("done"),
        user("again"),
        call,
        tool("r4"),
    ];
    let mixed = vec![
        user(&long("a <think>b</think> c")),
        reasoned,
        user("b"),
        asst(""),
        user("c"),
        asst("  spaced  "),
        user("d"),
    ];
    let mut out = Vec::new();
    for conv in [plain, tools, mixed] {
        out.push(conv.clone());
        out.push(std::iter::once(sys.clone()).chain(conv).collect());
    }
    out
}

#[cfg(test)]
#[path = "incremental_tests.rs"]
mod tests;
