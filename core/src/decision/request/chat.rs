//! OpenAI chat requests, turned into what vLLM passes to `apply_chat_template` for a template
//! that reads `message.content` as a string (every template kvroute ships or tests):
//!
//! - messages (`vllm/entrypoints/chat_utils.py`, `_parse_chat_message_content`): a null
//!   content is no parts, a string is one text part; text-like parts (`text`, `input_text`,
//!   `output_text`, `refusal`, `thinking`, `tool_reference`, bare strings) give their text and
//!   the non-empty texts are joined with "\n"; media parts give no text. The new message keeps
//!   only `role` and `content`, plus, for an assistant, `tool_calls` and both `reasoning` and
//!   `reasoning_content` (the request's `reasoning`, else its deprecated `reasoning_content`:
//!   the chat protocol's "before" validator renames it), for a tool `tool_call_id`, and `name`
//!   or `task` when strings;
//! - tool calls (`_postprocess_messages`): an empty list is dropped; string arguments are
//!   parsed with Python's `json.loads` and kept when they give an object, object arguments
//!   are kept, everything else becomes `{}`;
//! - tools (`ChatCompletionToolsParam.model_dump()`): `{"type": "function", "function":
//!   {"name", "description", "parameters", "strict"?, "defer_loading"?}, "defer_loading"?}`,
//!   description and parameters null when absent, strict and defer_loading only when set;
//! - template kwargs (`ChatCompletionRequest.build_chat_params` + `renderers/params.py`
//!   `merge_kwargs`): `chat_template_kwargs`, overridden by the request's
//!   `add_generation_prompt` (default true), `continue_final_message` (default false),
//!   `documents` and `reasoning_effort` when those are not null (or "auto"); a
//!   `reasoning_effort` also sets `enable_thinking = effort != "none"` unless the kwargs have it.

use serde_json::{Map, Value};

use super::{opt_bool, RequestError};
use crate::decision::pyjson;

/// A conversation for the chat template, with everything else the template sees.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatPrompt {
    /// The messages as vLLM hands them to the template (content a string).
    pub messages: Vec<Value>,
    /// Tool definitions in the engine's canonical form, if the request has tools.
    pub tools: Option<Vec<Value>>,
    pub documents: Option<Value>,
    pub add_generation_prompt: bool,
    /// Render the last message open-ended (transformers cuts the text after its content).
    pub continue_final_message: bool,
    /// Other template variables (`chat_template_kwargs`, `reasoning_effort`,
    /// `enable_thinking`), in request order.
    pub kwargs: Map<String, Value>,
    /// Where the first media part (image, audio, video, file) is, if any.
    pub media: Option<MediaCut>,
}

/// The first message carrying media. vLLM's string-content templates get the model's media
/// placeholders at the start of that message's text, so everything rendered before that
/// message's content is the same whatever the media is; after it, the engine's cache keys
/// include the media, which kvroute does not see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaCut {
    /// Index in [`ChatPrompt::messages`] of the first message with a media part.
    pub message: usize,
    /// How many media parts the whole conversation has.
    pub items: usize,
}

impl ChatPrompt {
    /// Already-normalized messages with the defaults of a chat request: generation prompt on,
    /// no tools, no kwargs.
    pub fn new(messages: Vec<Value>) -> ChatPrompt {
        ChatPrompt {
            messages,
            tools: None,
            documents: None,
            add_generation_prompt: true,
            continue_final_message: false,
            kwargs: Map::new(),
            media: None,
        }
    }
}

/// Template variables that are parameters of `apply_chat_template` itself, never taken from
/// `chat_template_kwargs` as template variables.
const NAMED_PARAMS: [&str; 8] = [
    "add_generation_prompt",
    "continue_final_message",
    "documents",
    "tools",
    "messages",
    "conversation",
    "chat_template",
    "tokenize",
];

/// The chat part of a request body with `messages` (OpenAI chat, and what the other chat-like
/// endpoints are converted to).
pub(super) fn parse_chat(obj: &Map<String, Value>) -> Result<ChatPrompt, RequestError> {
    parse_chat_with(obj, None)
}

/// The messages as vLLM builds them, and where the first media part is.
pub(super) type Messages = Result<(Vec<Value>, Option<MediaCut>), RequestError>;

/// [`parse_chat`] with the messages already read by the body scan (`chat_scan`), if they were
/// (then `obj` has no `messages`).
pub(super) fn parse_chat_with(
    obj: &Map<String, Value>,
    early: Option<Messages>,
) -> Result<ChatPrompt, RequestError> {
    let (messages, media) = match early {
        Some(messages) => messages?,
        None => {
            let list = obj
                .get("messages")
                .and_then(Value::as_array)
                .filter(|l| !l.is_empty())
                .ok_or(RequestError::InvalidMessages)?;
            conversation(list)?
        }
    };
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(tools)) => Some(tools.iter().map(tool).collect::<Result<_, _>>()?),
        Some(_) => return Err(RequestError::InvalidField("tools")),
    };
    let mut kwargs = match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(k)) => k.clone(),
        Some(_) => return Err(RequestError::InvalidField("chat_template_kwargs")),
    };
    let mut documents = kwargs.get("documents").filter(|d| !d.is_null()).cloned();
    if let Some(d) = obj.get("documents").filter(|d| !d.is_null()) {
        documents = Some(d.clone());
    }
    match obj.get("reasoning_effort") {
        None | Some(Value::Null) => {}
        Some(Value::String(e)) if e == "auto" => {}
        Some(Value::String(e)) => {
            if !kwargs.contains_key("enable_thinking") {
                kwargs.insert("enable_thinking".into(), Value::Bool(e != "none"));
            }
            kwargs.insert("reasoning_effort".into(), Value::String(e.clone()));
        }
        Some(_) => return Err(RequestError::InvalidField("reasoning_effort")),
    }
    kwargs.retain(|k, _| !NAMED_PARAMS.contains(&k.as_str()));
    Ok(ChatPrompt {
        messages,
        tools,
        documents,
        add_generation_prompt: opt_bool(obj, "add_generation_prompt")?.unwrap_or(true),
        continue_final_message: opt_bool(obj, "continue_final_message")?.unwrap_or(false),
        kwargs,
        media,
    })
}

/// One tool of the request in the engine's canonical form.
fn tool(t: &Value) -> Result<Value, RequestError> {
    let bad = RequestError::InvalidField("tools");
    let t = t.as_object().ok_or(bad.clone())?;
    if !matches!(t.get("type"), None | Some(Value::Null))
        && t.get("type") != Some(&"function".into())
    {
        return Err(bad);
    }
    let f = t.get("function").and_then(Value::as_object).ok_or(bad.clone())?;
    let name = f.get("name").filter(|n| n.is_string()).ok_or(bad.clone())?;
    let nullable = |key: &str, ok: fn(&Value) -> bool| match f.get(key) {
        None | Some(Value::Null) => Ok(Value::Null),
        Some(v) if ok(v) => Ok(v.clone()),
        Some(_) => Err(RequestError::InvalidField("tools")),
    };
    let mut function = Map::new();
    function.insert("name".into(), name.clone());
    function.insert("description".into(), nullable("description", Value::is_string)?);
    function.insert("parameters".into(), nullable("parameters", is_dict)?);
    let strict = nullable("strict", Value::is_boolean)?;
    if !strict.is_null() {
        function.insert("strict".into(), strict);
    }
    let own_defer = nullable("defer_loading", Value::is_boolean)?;
    let tool_defer = match t.get("defer_loading") {
        None | Some(Value::Null) => Value::Null,
        Some(v @ Value::Bool(_)) => v.clone(),
        Some(_) => return Err(bad),
    };
    let defer = if own_defer.is_null() { tool_defer.clone() } else { own_defer };
    if !defer.is_null() {
        function.insert("defer_loading".into(), defer);
    }
    let mut out = Map::new();
    out.insert("type".into(), "function".into());
    out.insert("function".into(), Value::Object(function));
    if !tool_defer.is_null() {
        out.insert("defer_loading".into(), tool_defer);
    }
    Ok(Value::Object(out))
}

/// Content part types that carry media (and the keys vLLM accepts for a part without a type).
const MEDIA_PARTS: [&str; 10] = [
    "image_url",
    "input_image",
    "image_embeds",
    "image_pil",
    "input_audio",
    "audio_url",
    "audio_embeds",
    "video_url",
    "file",
    "input_file",
];

/// The key holding the text of a text-like part.
fn text_key(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "text" | "input_text" | "output_text" => "text",
        "refusal" => "refusal",
        "thinking" => "thinking",
        "tool_reference" => "name",
        _ => return None,
    })
}

/// The text of one content part (None for a part without text), counting media parts.
fn part_text<'a>(part: &'a Value, media: &mut usize) -> Result<Option<&'a str>, RequestError> {
    let p = match part {
        Value::String(s) => return Ok(Some(s)),
        Value::Object(p) => p,
        _ => return Err(RequestError::InvalidMessages),
    };
    match p.get("type") {
        Some(Value::String(kind)) => {
            if let Some(key) = text_key(kind) {
                return match p.get(key) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(t)) => Ok(Some(t)),
                    Some(_) => Err(RequestError::InvalidMessages),
                };
            }
            if MEDIA_PARTS.contains(&kind.as_str()) {
                *media += 1;
                return Ok(None);
            }
            Err(RequestError::InvalidMessages)
        }
        None | Some(Value::Null) if MEDIA_PARTS.iter().any(|k| p.contains_key(*k)) => {
            *media += 1;
            Ok(None)
        }
        _ => Err(RequestError::InvalidMessages),
    }
}

/// A message's content, as the general path or the body scan (`chat_scan`) holds it.
pub(super) enum Content<'a> {
    /// Content parts (a string content is one part; a null or absent content none).
    Parts(&'a [Value]),
    /// A string content the caller owns: it becomes the message's text without a copy.
    Text(String),
}

impl<'a> Content<'a> {
    /// The content of a message object (the general path).
    fn of(content: Option<&'a Value>) -> Result<Content<'a>, RequestError> {
        Ok(Content::Parts(match content {
            None | Some(Value::Null) => &[],
            Some(s @ Value::String(_)) => std::slice::from_ref(s),
            Some(Value::Array(parts)) => parts,
            Some(_) => return Err(RequestError::InvalidMessages),
        }))
    }
}

/// The conversation vLLM builds from request messages, and where its first media part is.
pub(super) fn conversation(raw: &[Value]) -> Result<(Vec<Value>, Option<MediaCut>), RequestError> {
    let mut conv = Conversation::with_capacity(raw.len());
    for msg in raw {
        let obj = msg.as_object().ok_or(RequestError::InvalidMessages)?;
        conv.push(|key| obj.get(key), Content::of(obj.get("content"))?)?;
    }
    Ok(conv.finish())
}

/// A conversation built message by message (see [`conversation`]).
#[derive(Default)]
pub(super) struct Conversation {
    out: Vec<Value>,
    first_media: Option<usize>,
    items: usize,
}

impl Conversation {
    pub(super) fn with_capacity(n: usize) -> Conversation {
        Conversation { out: Vec::with_capacity(n), ..Conversation::default() }
    }

    /// Adds the next message: `get` reads its fields other than `content`.
    pub(super) fn push<'v>(
        &mut self,
        get: impl Fn(&str) -> Option<&'v Value>,
        content: Content<'_>,
    ) -> Result<(), RequestError> {
        let role = match get("role") {
            Some(Value::String(r)) => r.as_str(),
            _ => return Err(RequestError::InvalidMessages),
        };
        let before = self.items;
        let text = match content {
            Content::Text(t) => t,
            Content::Parts(parts) => {
                let mut texts = Vec::with_capacity(parts.len());
                for p in parts {
                    if let Some(t) = part_text(p, &mut self.items)?.filter(|t| !t.is_empty()) {
                        texts.push(t);
                    }
                }
                texts.join("\n")
            }
        };
        if self.items > before && self.first_media.is_none() {
            self.first_media = Some(self.out.len());
        }
        let mut m = Map::new();
        m.insert("role".into(), Value::String(role.to_owned()));
        m.insert("content".into(), Value::String(text));
        match role {
            "assistant" => {
                match get("tool_calls") {
                    None | Some(Value::Null) => {}
                    Some(Value::Array(calls)) if calls.is_empty() => {}
                    Some(Value::Array(calls)) => {
                        let calls = calls.iter().map(tool_call).collect::<Result<_, _>>()?;
                        m.insert("tool_calls".into(), Value::Array(calls));
                    }
                    Some(_) => return Err(RequestError::InvalidMessages),
                }
                let reasoning = match (get("reasoning"), get("reasoning_content")) {
                    (Some(r), _) if !r.is_null() => Some(r),
                    (_, Some(r)) if !r.is_null() => Some(r),
                    _ => None,
                };
                if let Some(r) = reasoning {
                    if !r.is_string() {
                        return Err(RequestError::InvalidMessages);
                    }
                    m.insert("reasoning".into(), r.clone());
                    m.insert("reasoning_content".into(), r.clone());
                }
            }
            "tool" => {
                if let Some(id) = get("tool_call_id") {
                    m.insert("tool_call_id".into(), id.clone());
                }
            }
            _ => {}
        }
        for key in ["name", "task"] {
            if let Some(v @ Value::String(_)) = get(key) {
                m.insert(key.into(), v.clone());
            }
        }
        if role == "developer" {
            m.insert("tools".into(), get("tools").cloned().unwrap_or(Value::Null));
        }
        self.out.push(Value::Object(m));
        Ok(())
    }

    /// The messages and where the first media part is.
    pub(super) fn finish(self) -> (Vec<Value>, Option<MediaCut>) {
        let items = self.items;
        (self.out, self.first_media.map(|message| MediaCut { message, items }))
    }
}

/// The message fields [`Conversation::push`] reads besides `content` (the body scan keeps
/// these and skips the rest).
pub(super) const MESSAGE_FIELDS: [&str; 8] = [
    "role",
    "tool_calls",
    "reasoning",
    "reasoning_content",
    "tool_call_id",
    "name",
    "task",
    "tools",
];

/// Whether `v` is a Python dict (not a number `pyjson` holds as an object).
fn is_dict(v: &Value) -> bool {
    v.is_object() && pyjson::special_number(v).is_none()
}

/// A tool call with its arguments as the template sees them (vLLM 0.33
/// `_postprocess_messages`): an object kept; a string parsed with Python's `json.loads` and
/// kept when it gives an object; anything else (an invalid or empty string, an array, a
/// number, `NaN`, null) `{}`.
fn tool_call(call: &Value) -> Result<Value, RequestError> {
    let mut call = call.as_object().cloned().ok_or(RequestError::InvalidMessages)?;
    let Some(Value::Object(function)) = call.get_mut("function") else {
        return Err(RequestError::InvalidMessages);
    };
    let args = match function.get("arguments") {
        // Arguments nested deeper than kvroute keeps render with `null` there (a misprediction
        // at worst, never an error).
        Some(Value::String(s)) => pyjson::from_str(s).ok().map(|p| p.value).filter(is_dict),
        Some(v) if is_dict(v) => Some(v.clone()),
        _ => None,
    };
    let args = args.unwrap_or_else(|| Value::Object(Map::new()));
    function.insert("arguments".into(), args);
    Ok(Value::Object(call))
}
