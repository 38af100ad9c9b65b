//! Anthropic-style `POST /v1/messages` as vLLM 0.33 serves it: the request is converted to
//! the chat request vLLM builds from it (kvroute-core's request parsing) and the chat answer
//! converted back. The answer: one `text` block (an empty one for empty output), `stop_reason`
//! `"max_tokens"` at the token limit, `"stop_sequence"` with `stop_sequence` on a matched
//! `stop_sequences` entry, `"end_turn"` otherwise. Usage as vLLM derives it from the chat usage:
//! `cache_read_input_tokens` = cached tokens, `cache_creation_input_tokens` = tokens written to
//! the cache, `input_tokens` = the prompt less both.
//!
//! A stream is `event: <type>` + `data: <json>` pairs: `message_start` (usage with the prompt's
//! `input_tokens`), `content_block_start` (an empty text block), `content_block_delta`
//! (`text_delta`)..., `content_block_stop`, `message_delta` (`stop_reason`, `stop_sequence`, the
//! final usage), `message_stop`. Errors use Anthropic's shape.

use kvroute_core::decision::error::ApiError;
use serde_json::{json, Value};

use super::stop::anthropic_reasons;
use super::{Output, StreamShape, Usage};
use crate::engine::Finish;

fn usage(u: &Usage) -> Value {
    json!({"input_tokens": u.prompt.saturating_sub(u.cached + u.created),
           "output_tokens": u.completion,
           "cache_creation_input_tokens": u.created,
           "cache_read_input_tokens": u.cached})
}

/// The whole answer of a request that did not stream (vLLM drops `null` fields).
pub(super) fn full(out: &Output, finish: &Finish, u: &Usage) -> Value {
    let (reason, sequence) = anthropic_reasons(finish);
    let mut v = json!({"id": out.id, "type": "message", "role": "assistant",
        "content": [{"type": "text", "text": out.text.sent_text()}], "model": out.model,
        "stop_reason": reason, "usage": usage(u)});
    if !sequence.is_null() {
        v["stop_sequence"] = sequence;
    }
    v
}

/// A stream's state: whether `message_start` went out and the text block is open.
#[derive(Default)]
pub(super) struct Stream {
    started: bool,
    block: bool,
}

fn event(v: &Value) -> Vec<u8> {
    let kind = v["type"].as_str().unwrap_or("unknown");
    format!("event: {kind}\ndata: {v}\n\n").into_bytes()
}

impl Stream {
    fn start(&mut self, out: &Output) -> Vec<u8> {
        if std::mem::replace(&mut self.started, true) {
            return Vec::new();
        }
        event(&json!({"type": "message_start", "message": {"id": out.id, "type": "message",
            "role": "assistant", "content": [], "model": out.model, "stop_reason": null,
            "stop_sequence": null,
            "usage": {"input_tokens": out.prompt_tokens, "output_tokens": 0}}}))
    }

    fn delta(&mut self, out: &Output, text: &str) -> Vec<u8> {
        let mut b = self.start(out);
        if text.is_empty() {
            return b;
        }
        if !std::mem::replace(&mut self.block, true) {
            b.extend(event(&json!({"type": "content_block_start",
                "content_block": {"type": "text", "text": ""}, "index": 0})));
        }
        b.extend(event(&json!({"type": "content_block_delta",
            "delta": {"type": "text_delta", "text": text}, "index": 0})));
        b
    }
}

impl StreamShape for Stream {
    fn text(&mut self, out: &Output, text: &str) -> Vec<u8> {
        self.delta(out, text)
    }

    fn done(&mut self, out: &Output, rest: &str, finish: &Finish, u: &Usage) -> Vec<u8> {
        let mut b = self.delta(out, rest);
        if self.block {
            b.extend(event(&json!({"type": "content_block_stop", "index": 0})));
        }
        let (reason, sequence) = anthropic_reasons(finish);
        b.extend(event(&json!({"type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage(u)})));
        b.extend(event(&json!({"type": "message_stop"})));
        b
    }

    fn error(&mut self, _out: &Output, e: ApiError) -> Vec<u8> {
        let mut b = Vec::new();
        if std::mem::take(&mut self.block) {
            b.extend(event(&json!({"type": "content_block_stop", "index": 0})));
        }
        let kind = super::anthropic_error_type(e.status);
        b.extend(event(&json!({"type": "error",
            "error": {"type": kind, "message": e.message}})));
        b
    }
}
