//! Anthropic-style `/v1/messages`, converted to the chat request vLLM builds from it
//! (`vllm/entrypoints/anthropic/serving.py`, `_convert_anthropic_to_openai_request`), which
//! then goes through the chat path like any other:
//!
//! - `system` (a string, or text blocks) and the text of system-role messages are concatenated,
//!   without separator, into one leading system message; empty texts and Claude Code's
//!   per-request `x-anthropic-billing-header` block are skipped;
//! - in a message, non-empty `text` blocks become text parts (a lone one becomes the string
//!   content), `image` blocks media parts, `thinking` blocks join into `reasoning`, `tool_use`
//!   blocks become tool calls with `input` as arguments; a user's `tool_result` becomes a tool
//!   message placed before what remains of that user message (its images a user message of
//!   their own), an assistant's a text part "Tool result: ..."; a user message left without
//!   content is dropped;
//! - `tools` become chat tools with `input_schema` as parameters (`"type": "object"` added at
//!   its end when missing); `output_config.effort` becomes `reasoning_effort`;
//!   `chat_template_kwargs` and `cache_salt` pass through to that chat request.

use serde_json::{json, Map, Value};

use super::chat::{parse_chat, ChatPrompt};
use super::RequestError;

const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// The chat prompt of a Messages request body.
pub(super) fn parse_messages(obj: &Map<String, Value>) -> Result<ChatPrompt, RequestError> {
    let msgs =
        obj.get("messages").and_then(Value::as_array).ok_or(RequestError::InvalidMessages)?;
    let mut system = Vec::new();
    match obj.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => system.push(s.clone()),
        Some(Value::Array(blocks)) => system.extend(system_texts(blocks)?),
        Some(_) => return Err(RequestError::InvalidField("system")),
    }
    let mut roles = Vec::with_capacity(msgs.len());
    for m in msgs {
        let role = match m.get("role").and_then(Value::as_str) {
            Some("ctx" | "msg") => "user",
            Some(r @ ("user" | "assistant" | "system")) => r,
            _ => return Err(RequestError::InvalidMessages),
        };
        roles.push(role);
        if role == "system" {
            match m.get("content") {
                Some(Value::String(s)) => system.push(s.clone()),
                Some(Value::Array(blocks)) => system.extend(system_texts(blocks)?),
                _ => return Err(RequestError::InvalidMessages),
            }
        }
    }
    let mut out = Vec::new();
    let system: String = system.concat();
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system}));
    }
    for (m, role) in msgs.iter().zip(roles) {
        if role != "system" {
            convert_message(m, role, &mut out)?;
        }
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(out));
    if let Some(k) = obj.get("chat_template_kwargs") {
        chat.insert("chat_template_kwargs".into(), k.clone());
    }
    if let Some(effort) = obj.get("output_config").and_then(|c| c.get("effort")) {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    match obj.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            let tools = tools.iter().map(tool).collect::<Result<Vec<_>, _>>()?;
            chat.insert("tools".into(), Value::Array(tools));
        }
        Some(_) => return Err(RequestError::InvalidField("tools")),
    }
    parse_chat(&chat)
}

/// Non-empty text of text blocks, without the billing header.
fn system_texts(blocks: &[Value]) -> Result<Vec<String>, RequestError> {
    let mut out = Vec::new();
    for b in blocks {
        let kind = block_type(b)?;
        if let (true, Some(t)) = (kind == "text", b.get("text").and_then(Value::as_str)) {
            if !t.is_empty() && !t.starts_with(BILLING_HEADER) {
                out.push(t.to_owned());
            }
        }
    }
    Ok(out)
}

fn block_type(b: &Value) -> Result<&str, RequestError> {
    match b.get("type").and_then(Value::as_str) {
        Some(
            t @ ("text" | "image" | "tool_use" | "tool_result" | "tool_reference" | "thinking"
            | "redacted_thinking"),
        ) => Ok(t),
        _ => Err(RequestError::InvalidMessages),
    }
}

fn convert_message(m: &Value, role: &str, out: &mut Vec<Value>) -> Result<(), RequestError> {
    let mut msg = Map::new();
    msg.insert("role".into(), role.into());
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            msg.insert("content".into(), s.clone().into());
            out.push(Value::Object(msg));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => return Err(RequestError::InvalidMessages),
    };
    let (mut parts, mut calls, mut reasoning) = (Vec::new(), Vec::new(), Vec::new());
    for b in blocks {
        match block_type(b)? {
            "text" => match b.get("text") {
                Some(Value::String(t)) if !t.is_empty() => {
                    parts.push(json!({"type": "text", "text": t}))
                }
                None | Some(Value::Null) | Some(Value::String(_)) => {}
                Some(_) => return Err(RequestError::InvalidMessages),
            },
            "image"
                if b.get("source")
                    .is_some_and(|s| s.as_object().is_some_and(|o| !o.is_empty())) =>
            {
                parts.push(json!({"type": "image_url", "image_url": {"url": ""}}))
            }
            "thinking" => match b.get("thinking") {
                Some(Value::String(t)) => reasoning.push(t.clone()),
                None | Some(Value::Null) => {}
                Some(_) => return Err(RequestError::InvalidMessages),
            },
            "tool_use" => {
                let input = match b.get("input") {
                    Some(Value::Object(i)) if !i.is_empty() => Value::Object(i.clone()),
                    None | Some(Value::Null) | Some(Value::Object(_)) => json!({}),
                    Some(_) => return Err(RequestError::InvalidMessages),
                };
                let name = b.get("name").and_then(Value::as_str).unwrap_or("");
                let id = b.get("id").and_then(Value::as_str).unwrap_or("");
                calls.push(json!({"id": id, "type": "function",
                                  "function": {"name": name, "arguments": input}}));
            }
            "tool_result" if role == "user" => user_tool_result(b, out)?,
            "tool_result" => {
                let text = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(v) if v.as_array().is_some_and(Vec::is_empty) => String::new(),
                    Some(v) => crate::decision::template::py_str_json(v),
                };
                parts.push(json!({"type": "text", "text": format!("Tool result: {text}")}));
            }
            _ => {} // image without source, tool_reference, redacted_thinking
        }
    }
    if !reasoning.is_empty() {
        msg.insert("reasoning".into(), reasoning.concat().into());
    }
    let has_calls = !calls.is_empty();
    if has_calls {
        msg.insert("tool_calls".into(), Value::Array(calls));
    }
    match parts.as_slice() {
        [] => {}
        [p] if p["type"] == "text" => {
            msg.insert("content".into(), p["text"].clone());
        }
        _ => {
            msg.insert("content".into(), Value::Array(parts));
        }
    }
    if role != "user" || msg.contains_key("content") {
        out.push(Value::Object(msg));
    }
    Ok(())
}

/// A user's tool result: a tool message with its text, then a user message with its images
/// and a tool message with its tool references, when it has any.
fn user_tool_result(b: &Value, out: &mut Vec<Value>) -> Result<(), RequestError> {
    let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or("");
    let (mut texts, mut images, mut refs) = (Vec::new(), 0, Vec::new());
    let text = match b.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => {
            for item in items.iter().filter_map(Value::as_object) {
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        texts.push(item.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some("image") => images += 1,
                    Some("tool_reference") => {
                        let name = item.get("tool_name").or_else(|| item.get("name"));
                        if let Some(n) = name.and_then(Value::as_str).filter(|n| !n.is_empty()) {
                            refs.push(json!({"type": "tool_reference", "name": n}));
                        }
                    }
                    _ => {}
                }
            }
            texts.join("\n")
        }
        None | Some(Value::Null) => String::new(),
        Some(_) => return Err(RequestError::InvalidMessages),
    };
    out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    if images > 0 {
        let parts: Vec<Value> =
            (0..images).map(|_| json!({"type": "image_url", "image_url": {"url": ""}})).collect();
        out.push(json!({"role": "user", "content": parts}));
    }
    if !refs.is_empty() {
        out.push(json!({"role": "tool", "tool_call_id": id, "content": refs}));
    }
    Ok(())
}

/// An Anthropic tool as the chat tool vLLM makes of it.
fn tool(t: &Value) -> Result<Value, RequestError> {
    let bad = || RequestError::InvalidField("tools");
    let name = t.get("name").and_then(Value::as_str).ok_or_else(bad)?;
    let mut schema = t.get("input_schema").and_then(Value::as_object).cloned().ok_or_else(bad)?;
    if !schema.contains_key("type") {
        schema.insert("type".into(), "object".into());
    }
    let mut function = Map::new();
    function.insert("name".into(), name.into());
    function.insert("description".into(), t.get("description").cloned().unwrap_or(Value::Null));
    function.insert("parameters".into(), Value::Object(schema));
    if let Some(d) = t.get("defer_loading").filter(|d| !d.is_null()) {
        function.insert("defer_loading".into(), d.clone());
    }
    Ok(json!({"type": "function", "function": function}))
}
