//! OpenAI `/v1/responses`, rendered as the chat messages vLLM builds from it
//! (`vllm/entrypoints/openai/responses/utils.py`, `construct_input_messages`, and
//! `ResponsesRequest.build_chat_params`), which then go through the chat path:
//!
//! - `instructions` become a leading system message; a string `input` one user message;
//! - input items, in order: a `function_call` joins the tool calls of the assistant message
//!   just before it (or starts one); a `reasoning` item sets that message's reasoning when it
//!   has none (or starts one), from its first content text, else its first summary text; an
//!   assistant `message` sets that message's content when it has none (or starts one), from its
//!   first content part; a `function_call_output` becomes a tool message; other messages
//!   (user, system, developer) pass through with their content parts (`input_text`, ...);
//! - function tools (`{"type": "function", "name", "description", "parameters", "strict"}`)
//!   become chat tools, other tool types are not rendered;
//! - the generation prompt is added unless the last item is an unfinished message or reasoning
//!   item (`status` "in_progress" or "incomplete"), which is continued instead;
//!   `reasoning.effort` is passed to the template as `reasoning_effort`.

use serde_json::{json, Map, Value};

use super::chat::{parse_chat, ChatPrompt};
use super::RequestError;

/// The chat prompt of a Responses request body.
pub(super) fn parse_responses(obj: &Map<String, Value>) -> Result<ChatPrompt, RequestError> {
    let mut msgs: Vec<Value> = Vec::new();
    match obj.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => msgs.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(RequestError::InvalidField("instructions")),
    }
    let mut partial = false;
    match obj.get("input") {
        Some(Value::String(s)) => msgs.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for item in items {
                add_item(item, &mut msgs)?;
            }
            partial = items.last().is_some_and(|last| {
                let kind = last.get("type").and_then(Value::as_str).unwrap_or("message");
                let status = last.get("status").and_then(Value::as_str);
                matches!(kind, "message" | "reasoning")
                    && matches!(status, Some("in_progress" | "incomplete"))
            });
        }
        _ => return Err(RequestError::InvalidInput),
    }
    if msgs.is_empty() {
        return Err(RequestError::InvalidInput);
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(msgs));
    chat.insert("add_generation_prompt".into(), Value::Bool(!partial));
    chat.insert("continue_final_message".into(), Value::Bool(partial));
    match obj.get("reasoning").and_then(|r| r.get("effort")) {
        None | Some(Value::Null) => {}
        Some(effort) => {
            chat.insert("chat_template_kwargs".into(), json!({"reasoning_effort": effort}));
        }
    }
    match obj.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            let mut out = Vec::new();
            for t in tools {
                let t = t.as_object().ok_or(RequestError::InvalidField("tools"))?;
                if t.get("type").and_then(Value::as_str) == Some("function") {
                    let function: Map<String, Value> = t
                        .iter()
                        .filter(|(k, _)| *k != "type")
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    out.push(json!({"type": "function", "function": function}));
                }
            }
            if !out.is_empty() {
                chat.insert("tools".into(), Value::Array(out));
            }
        }
        Some(_) => return Err(RequestError::InvalidField("tools")),
    }
    parse_chat(&chat)
}

/// The last message, if it is an assistant's.
fn prev_assistant(msgs: &mut [Value]) -> Option<&mut Map<String, Value>> {
    msgs.last_mut()
        .and_then(Value::as_object_mut)
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
}

fn add_item(item: &Value, msgs: &mut Vec<Value>) -> Result<(), RequestError> {
    let obj = item.as_object().ok_or(RequestError::InvalidInput)?;
    let text_of = |v: Option<&Value>| -> String {
        match v {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Object(o)) => {
                o.get("text").and_then(Value::as_str).unwrap_or("").to_owned()
            }
            _ => String::new(),
        }
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("function_call") => {
            let call = json!({
                "id": obj.get("call_id").cloned().unwrap_or(Value::Null),
                "function": {
                    "name": obj.get("name").cloned().unwrap_or(Value::Null),
                    "arguments": obj.get("arguments").cloned().unwrap_or(Value::Null),
                },
                "type": "function",
            });
            match prev_assistant(msgs) {
                Some(prev) => match prev.get_mut("tool_calls") {
                    Some(Value::Array(calls)) => calls.push(call),
                    _ => {
                        prev.insert("tool_calls".into(), json!([call]));
                    }
                },
                None => msgs.push(json!({"role": "assistant", "tool_calls": [call]})),
            }
        }
        Some("function_call_output") => msgs.push(json!({
            "role": "tool",
            "content": obj.get("output").cloned().unwrap_or(Value::Null),
            "tool_call_id": obj.get("call_id").cloned().unwrap_or(Value::Null),
        })),
        Some("reasoning") => {
            let first = |key: &str| obj.get(key).and_then(Value::as_array).and_then(|l| l.first());
            let text = match (first("content"), first("summary")) {
                (Some(c), _) => text_of(Some(c)),
                (None, Some(s)) => text_of(Some(s)),
                _ => String::new(),
            };
            match prev_assistant(msgs).filter(|p| p.get("reasoning").is_none_or(Value::is_null)) {
                Some(prev) => {
                    prev.insert("reasoning".into(), text.into());
                }
                None => msgs.push(json!({"role": "assistant", "reasoning": text})),
            }
        }
        Some("message") | None => {
            let role = obj.get("role").and_then(Value::as_str).ok_or(RequestError::InvalidInput)?;
            if role == "assistant" {
                let text = match obj.get("content") {
                    Some(Value::Array(parts)) => text_of(parts.first()),
                    other => text_of(other),
                };
                match prev_assistant(msgs).filter(|p| p.get("content").is_none_or(Value::is_null)) {
                    Some(prev) => {
                        prev.insert("content".into(), text.into());
                    }
                    None => msgs.push(json!({"role": "assistant", "content": text})),
                }
            } else {
                let mut m = obj.clone();
                m.remove("type");
                msgs.push(Value::Object(m));
            }
        }
        Some(_) => return Err(RequestError::InvalidInput),
    }
    Ok(())
}
