//! `POST /v1/responses` as vLLM 0.33 serves a text answer without a reasoning or tool parser:
//! the input items are rendered as the chat messages vLLM builds from them (kvroute-core's
//! request parsing); the answer is one assistant `message` item with one `output_text` part.
//! `status` is `"incomplete"` with `incomplete_details.reason = "max_output_tokens"` when the
//! request ran to its token limit, `"completed"` otherwise. Usage:
//! `usage.input_tokens_details.cached_tokens` (and `cache_write_tokens`).
//!
//! A stream is `event: <type>` + `data: <json>` pairs with a `sequence_number` from 0:
//! `response.created`, `response.in_progress`, then for the text `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`..., `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, and last `response.completed`
//! (or `response.incomplete`) with the whole response and its usage. No `[DONE]`.

use kvroute_core::decision::error::ApiError;
use serde_json::{json, Value};

use super::{Output, StreamShape, Usage};
use crate::engine::Finish;

fn status(finish: &Finish) -> &'static str {
    match finish {
        Finish::Length => "incomplete",
        Finish::Stop(_) => "completed",
    }
}

fn item_id(out: &Output) -> String {
    format!("msg_{}", out.id.trim_start_matches("resp_"))
}

fn usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt,
        "input_tokens_details": {"cached_tokens": u.cached, "cache_write_tokens": u.created,
            "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
        "output_tokens": u.completion,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
            "output_tokens_per_turn": [], "tool_output_tokens_per_turn": []},
        "total_tokens": u.prompt + u.completion,
    })
}

fn text_part(text: &str, logprobs: Value) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
}

fn message_item(out: &Output, text: &str, status: &str) -> Value {
    let content = if text.is_empty() { json!([]) } else { json!([text_part(text, Value::Null)]) };
    json!({"id": item_id(out), "type": "message", "role": "assistant", "content": content,
           "status": status})
}

/// The response object: `status` "in_progress" (no output, no usage) while streaming, else the
/// final one.
fn response(out: &Output, status: &str, output: Value, usage: Value) -> Value {
    let field = |k: &str| out.body.get(k).cloned().unwrap_or(Value::Null);
    let or = |k: &str, d: Value| out.body.get(k).filter(|v| !v.is_null()).cloned().unwrap_or(d);
    let incomplete =
        if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null };
    json!({
        "id": out.id,
        "created_at": out.created,
        "incomplete_details": incomplete,
        "instructions": field("instructions"),
        "metadata": field("metadata"),
        "model": out.model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": or("parallel_tool_calls", json!(true)),
        "temperature": or("temperature", json!(1.0)),
        "tool_choice": or("tool_choice", json!("auto")),
        "tools": or("tools", json!([])),
        "top_p": or("top_p", json!(1.0)),
        "background": or("background", json!(false)),
        "max_output_tokens": out.max_tokens,
        "max_tool_calls": field("max_tool_calls"),
        "previous_response_id": field("previous_response_id"),
        "prompt": field("prompt"),
        "prompt_cache_options": null,
        "prompt_cache_key": field("prompt_cache_key"),
        "prompt_cache_retention": field("prompt_cache_retention"),
        "reasoning": field("reasoning"),
        "safety_identifier": field("safety_identifier"),
        "service_tier": or("service_tier", json!("auto")),
        "status": status,
        "text": field("text"),
        "top_logprobs": null,
        "truncation": or("truncation", json!("disabled")),
        "usage": usage,
        "user": field("user"),
        "presence_penalty": or("presence_penalty", json!(0.0)),
        "frequency_penalty": or("frequency_penalty", json!(0.0)),
        "kv_transfer_params": null,
        "ec_transfer_params": null,
        "input_messages": null,
        "output_messages": null,
    })
}

/// The whole answer of a request that did not stream.
pub(super) fn full(out: &Output, finish: &Finish, u: &Usage) -> Value {
    let st = status(finish);
    let item = message_item(out, out.text.sent_text(), super::stop::item_status(finish));
    response(out, st, json!([item]), usage(u))
}

/// A stream's state: the next sequence number, whether the message item is open.
#[derive(Default)]
pub(super) struct Stream {
    seq: u64,
    open: bool,
}

impl Stream {
    fn event(&mut self, mut v: Value) -> Vec<u8> {
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let kind = v["type"].as_str().unwrap_or("unknown").to_owned();
        format!("event: {kind}\ndata: {v}\n\n").into_bytes()
    }

    fn delta(&mut self, out: &Output, text: &str) -> Vec<u8> {
        let mut b = Vec::new();
        if text.is_empty() {
            return b;
        }
        let id = item_id(out);
        if !self.open {
            self.open = true;
            b.extend(self.event(json!({"type": "response.output_item.added", "output_index": 0,
                "item": {"id": id, "type": "message", "role": "assistant", "content": [],
                         "status": "in_progress"}})));
            b.extend(self.event(json!({"type": "response.content_part.added", "output_index": 0,
                "item_id": id, "content_index": 0, "part": text_part("", json!([]))})));
        }
        b.extend(self.event(json!({"type": "response.output_text.delta", "content_index": 0,
            "output_index": 0, "item_id": id, "delta": text, "logprobs": []})));
        b
    }
}

impl StreamShape for Stream {
    fn open(&mut self, out: &Output) -> Vec<u8> {
        let initial = response(out, "in_progress", json!([]), Value::Null);
        let mut b = self.event(json!({"type": "response.created", "response": initial}));
        b.extend(self.event(json!({"type": "response.in_progress", "response": initial})));
        b
    }

    fn text(&mut self, out: &Output, text: &str) -> Vec<u8> {
        self.delta(out, text)
    }

    fn done(&mut self, out: &Output, rest: &str, finish: &Finish, u: &Usage) -> Vec<u8> {
        let mut b = self.delta(out, rest);
        let mut output = Vec::new();
        if self.open {
            let id = item_id(out);
            let text = out.text.sent_text();
            let part = text_part(text, Value::Null);
            b.extend(self.event(json!({"type": "response.output_text.done", "output_index": 0,
                "content_index": 0, "text": text, "logprobs": [], "item_id": id})));
            b.extend(self.event(json!({"type": "response.content_part.done", "item_id": id,
                "output_index": 0, "content_index": 0, "part": part})));
            let item = message_item(out, text, super::stop::item_status(finish));
            b.extend(self.event(json!({"type": "response.output_item.done", "output_index": 0,
                "item": item})));
            output.push(item);
        }
        let st = status(finish);
        let last = response(out, st, Value::Array(output), usage(u));
        let kind = if st == "incomplete" { "response.incomplete" } else { "response.completed" };
        b.extend(self.event(json!({"type": kind, "response": last})));
        b
    }

    fn error(&mut self, _out: &Output, e: ApiError) -> Vec<u8> {
        self.event(json!({"type": "error", "code": e.code, "message": e.message, "param": e.param}))
    }
}
