//! OpenAI request parsing for `/v1/chat/completions` and `/v1/completions`.
//!
//! Only the fields kvroute needs are read; the body itself is forwarded unchanged.

use serde_json::{Map, Value};
use thiserror::Error;

/// Which OpenAI endpoint a request targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    /// Maps a request path, as the raw bytes Envoy holds (HTTP/2 lets any byte through), to an
    /// endpoint kvroute routes. The query string is ignored whatever its bytes; a path that is
    /// not exactly one of the endpoints (including one with non-UTF-8 bytes) is not ours.
    pub fn from_path(path: &[u8]) -> Option<Endpoint> {
        let path = path.split(|b| *b == b'?').next().unwrap_or(path);
        let mut end = path.len();
        while end > 1 && path[end - 1] == b'/' {
            end -= 1;
        }
        match &path[..end] {
            b"/v1/chat/completions" => Some(Endpoint::Chat),
            b"/v1/completions" => Some(Endpoint::Completions),
            _ => None,
        }
    }
}

/// The prompt of a request, as the engine will see it before tokenization.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Chat messages, each a JSON object whose `content` has been normalized to a string.
    Messages(Vec<Value>),
    /// A completion prompt given as text.
    Text(String),
    /// A completion prompt given as token ids (used as is).
    Tokens(Vec<u32>),
}

/// A valid request whose prompt kvroute does not hash: it is routed on load alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadOnly {
    /// Messages with non-text content parts (images, audio, files): the engine's cache keys
    /// include the media, which kvroute does not see, so any credit would be a guess.
    Multimodal,
    /// A completion with several prompts: the engine caches each one on its own.
    Batch,
}

/// The routing-relevant view of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    pub endpoint: Endpoint,
    pub model: String,
    /// For a [`LoadOnly`] request: the text parts (or the prompts joined), for size only.
    pub prompt: Prompt,
    /// Set when the prompt must not be hashed (see [`LoadOnly`]).
    pub load_only: Option<LoadOnly>,
    pub stream: bool,
    pub include_usage: bool,
    pub cache_salt: Option<String>,
    pub user: Option<String>,
    pub max_tokens: Option<u64>,
}

/// Why a request body could not be used.
#[derive(Debug, Error, PartialEq)]
pub enum RequestError {
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("request body must be a JSON object")]
    NotAnObject,
    #[error("you must provide a model parameter")]
    MissingModel,
    #[error("'messages' must be a non-empty array of message objects")]
    InvalidMessages,
    #[error("'prompt' must be a string, an array of strings, or token ids")]
    InvalidPrompt,
    #[error("'{0}' has the wrong type")]
    InvalidField(&'static str),
}

impl RequestError {
    /// The OpenAI `param` this error refers to, if any.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            RequestError::MissingModel => Some("model"),
            RequestError::InvalidMessages => Some("messages"),
            RequestError::InvalidPrompt => Some("prompt"),
            RequestError::InvalidField(f) => Some(f),
            _ => None,
        }
    }
}

/// Parses a request body for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<ParsedRequest, RequestError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| RequestError::InvalidJson(e.to_string()))?;
    let obj = value.as_object().ok_or(RequestError::NotAnObject)?;
    let model = match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(RequestError::MissingModel)
        }
        Some(_) => return Err(RequestError::InvalidField("model")),
    };
    let (prompt, load_only) = match endpoint {
        Endpoint::Chat => {
            let (messages, media) = parse_messages(obj.get("messages"))?;
            (Prompt::Messages(messages), media.then_some(LoadOnly::Multimodal))
        }
        Endpoint::Completions => parse_prompt(obj.get("prompt"))?,
    };
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => opt_bool(o, "include_usage")?.unwrap_or(false),
        Some(_) => return Err(RequestError::InvalidField("stream_options")),
    };
    let cache_salt = opt_string(obj, "cache_salt")?.filter(|s| !s.is_empty());
    let user = opt_string(obj, "user")?;
    let max_tokens = match obj.get("max_completion_tokens").or_else(|| obj.get("max_tokens")) {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or(RequestError::InvalidField("max_tokens"))?),
    };
    Ok(ParsedRequest {
        endpoint,
        model,
        prompt,
        load_only,
        stream,
        include_usage,
        cache_salt,
        user,
        max_tokens,
    })
}

fn opt_bool(obj: &Map<String, Value>, key: &'static str) -> Result<Option<bool>, RequestError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(RequestError::InvalidField(key)),
    }
}

fn opt_string(obj: &Map<String, Value>, key: &'static str) -> Result<Option<String>, RequestError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(RequestError::InvalidField(key)),
    }
}

/// The messages with their content normalized, and whether any had a non-text part.
fn parse_messages(messages: Option<&Value>) -> Result<(Vec<Value>, bool), RequestError> {
    let list = messages
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
        .ok_or(RequestError::InvalidMessages)?;
    let mut media = false;
    let out =
        list.iter().map(|m| normalize_message(m, &mut media)).collect::<Result<Vec<_>, _>>()?;
    Ok((out, media))
}

/// Content part types of the OpenAI chat API that carry something other than text.
const MEDIA_PARTS: [&str; 5] = ["image_url", "input_audio", "file", "video_url", "audio_url"];

/// Turns content-part arrays into one string, as vLLM does for string-content templates:
/// text parts joined by a newline. Media parts are valid but not hashable: they set `media`
/// and contribute no text.
fn normalize_message(msg: &Value, media: &mut bool) -> Result<Value, RequestError> {
    let obj = msg.as_object().ok_or(RequestError::InvalidMessages)?;
    if !matches!(obj.get("role"), Some(Value::String(_))) {
        return Err(RequestError::InvalidMessages);
    }
    let mut out = obj.clone();
    let content = match obj.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for part in parts {
                let p = part.as_object().ok_or(RequestError::InvalidMessages)?;
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
                    (Some(kind), _) if MEDIA_PARTS.contains(&kind) => *media = true,
                    _ => return Err(RequestError::InvalidMessages),
                }
            }
            texts.join("\n")
        }
        Some(_) => return Err(RequestError::InvalidMessages),
    };
    out.insert("content".into(), Value::String(content));
    Ok(Value::Object(out))
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect()
}

/// A completion prompt: a string, token ids, or a batch (several strings or token-id lists),
/// which is routed load-only with the prompts joined for its size.
fn parse_prompt(prompt: Option<&Value>) -> Result<(Prompt, Option<LoadOnly>), RequestError> {
    let items = match prompt {
        Some(Value::String(s)) => return Ok((Prompt::Text(s.clone()), None)),
        Some(Value::Array(items)) if !items.is_empty() => items,
        _ => return Err(RequestError::InvalidPrompt),
    };
    if let [Value::String(s)] = items.as_slice() {
        return Ok((Prompt::Text(s.clone()), None));
    }
    if let Some(ids) = token_ids(items) {
        return Ok((Prompt::Tokens(ids), None));
    }
    let batch = Some(LoadOnly::Batch);
    if let Some(texts) = items.iter().map(Value::as_str).collect::<Option<Vec<&str>>>() {
        return Ok((Prompt::Text(texts.join("\n")), batch));
    }
    let lists = items.iter().map(|i| i.as_array().and_then(|l| token_ids(l)));
    let ids = lists.collect::<Option<Vec<Vec<u32>>>>().ok_or(RequestError::InvalidPrompt)?;
    Ok((Prompt::Tokens(ids.concat()), batch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(v: Value) -> Result<ParsedRequest, RequestError> {
        parse(Endpoint::Chat, v.to_string().as_bytes())
    }

    #[test]
    fn endpoints_from_paths() {
        assert_eq!(Endpoint::from_path(b"/v1/chat/completions"), Some(Endpoint::Chat));
        assert_eq!(Endpoint::from_path(b"/v1/completions?x=1"), Some(Endpoint::Completions));
        assert_eq!(Endpoint::from_path(b"/v1/completions//"), Some(Endpoint::Completions));
        assert_eq!(Endpoint::from_path(b"/v1/models"), None);
        assert_eq!(Endpoint::from_path(b"/v1/chat/completions?\xff\xfe"), Some(Endpoint::Chat));
        assert_eq!(Endpoint::from_path(b"/v1/chat/\xffcompletions"), None);
        assert_eq!(Endpoint::from_path(b""), None);
        assert_eq!(Endpoint::from_path(b"/"), None);
    }

    #[test]
    fn parses_chat_with_all_fields() {
        let r = chat(json!({"model":"m","messages":[{"role":"user","content":"hi"}],
            "stream":true,"stream_options":{"include_usage":true},"cache_salt":"t1","user":"u",
            "max_tokens":7}))
        .unwrap();
        assert_eq!(r.model, "m");
        assert!(r.stream && r.include_usage);
        assert_eq!(r.cache_salt.as_deref(), Some("t1"));
        assert_eq!(r.user.as_deref(), Some("u"));
        assert_eq!(r.max_tokens, Some(7));
    }

    #[test]
    fn content_parts_are_joined_with_newlines() {
        let r = chat(json!({"model":"m","messages":[{"role":"user","content":[
            {"type":"text","text":"a"},{"type":"text","text":"b"}]}]}))
        .unwrap();
        let Prompt::Messages(m) = r.prompt else { panic!("not messages") };
        assert_eq!(m[0]["content"], "a\nb");
    }

    #[test]
    fn errors_name_the_problem() {
        assert!(matches!(parse(Endpoint::Chat, b"{not json"), Err(RequestError::InvalidJson(_))));
        assert_eq!(chat(json!([1])), Err(RequestError::NotAnObject));
        assert_eq!(chat(json!({"messages":[]})), Err(RequestError::MissingModel));
        assert_eq!(chat(json!({"model":"m"})), Err(RequestError::InvalidMessages));
        assert_eq!(
            chat(json!({"model":3,"messages":[]})),
            Err(RequestError::InvalidField("model"))
        );
        assert_eq!(
            chat(json!({"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"})),
            Err(RequestError::InvalidField("stream"))
        );
    }

    #[test]
    fn completion_prompts() {
        let p = |v: Value| parse(Endpoint::Completions, v.to_string().as_bytes()).map(|r| r.prompt);
        assert_eq!(p(json!({"model":"m","prompt":"hi"})), Ok(Prompt::Text("hi".into())));
        assert_eq!(p(json!({"model":"m","prompt":["hi"]})), Ok(Prompt::Text("hi".into())));
        assert_eq!(p(json!({"model":"m","prompt":[1,2,3]})), Ok(Prompt::Tokens(vec![1, 2, 3])));
        assert_eq!(p(json!({"model":"m","prompt":[1,-2]})), Err(RequestError::InvalidPrompt));
        assert_eq!(p(json!({"model":"m"})), Err(RequestError::InvalidPrompt));
        assert_eq!(p(json!({"model":"m","prompt":["a",[1]]})), Err(RequestError::InvalidPrompt));
    }

    #[test]
    fn media_parts_and_batches_are_valid_but_load_only() {
        let r = chat(json!({"model":"m","messages":[{"role":"user","content":[
            {"type":"text","text":"what is this"},
            {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}))
        .unwrap();
        assert_eq!(r.load_only, Some(LoadOnly::Multimodal));
        let Prompt::Messages(m) = r.prompt else { panic!("not messages") };
        assert_eq!(m[0]["content"], "what is this");
        let unknown = json!({"model":"m","messages":[{"role":"user","content":[{"type":"x"}]}]});
        assert_eq!(chat(unknown), Err(RequestError::InvalidMessages));
        let c = |v: Value| parse(Endpoint::Completions, v.to_string().as_bytes()).unwrap();
        let texts = c(json!({"model":"m","prompt":["a","b"]}));
        assert_eq!(
            (texts.prompt, texts.load_only),
            (Prompt::Text("a\nb".into()), Some(LoadOnly::Batch))
        );
        let ids = c(json!({"model":"m","prompt":[[1,2],[3]]}));
        assert_eq!(
            (ids.prompt, ids.load_only),
            (Prompt::Tokens(vec![1, 2, 3]), Some(LoadOnly::Batch))
        );
        assert_eq!(c(json!({"model":"m","prompt":"a"})).load_only, None);
    }
}
