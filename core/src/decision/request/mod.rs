//! Request parsing for the endpoints kvroute routes: OpenAI `/v1/chat/completions`,
//! `/v1/completions` and `/v1/responses`, and Anthropic-style `/v1/messages`, each turned into
//! the prompt vLLM builds from it (one file per endpoint family).
//!
//! Only the fields kvroute needs are read; the body itself is forwarded unchanged. Chat-like
//! endpoints all end in a [`ChatPrompt`]: the conversation exactly as vLLM hands it to the chat
//! template, plus the tools and template options. The same conversation sent to any of them
//! renders, and so hashes, the same.

mod anthropic;
mod chat;
mod chat_scan;
mod completions;
mod id_array;
pub mod path;
pub mod pyint;
mod responses;
mod scan;
#[cfg(test)]
mod scan_bench;
#[cfg(test)]
mod scan_tests;
#[cfg(test)]
mod tests;

use serde_json::{Map, Value};
use thiserror::Error;

use crate::decision::pyjson;

pub use chat::{ChatPrompt, MediaCut};

/// Which endpoint a request targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// OpenAI `/v1/chat/completions`.
    Chat,
    /// OpenAI `/v1/completions`.
    Completions,
    /// Anthropic-style `/v1/messages` (vLLM converts it to a chat request).
    Messages,
    /// OpenAI `/v1/responses` (vLLM renders its input items as chat messages).
    Responses,
}

impl Endpoint {
    /// Maps a request path, as the raw bytes Envoy holds (HTTP/2 lets any byte through), to an
    /// endpoint kvroute routes: every path vLLM's server would serve as that endpoint (see
    /// [`path`]: the query and fragment ignored whatever their bytes, percent-escapes decoded
    /// once as uvicorn decodes them, `/v1/chat/%63ompletions` included, trailing slashes
    /// dropped as Starlette's redirect drops them). Anything else, a path with non-UTF-8 bytes
    /// or `//v1/...` (which vLLM answers 404) included, is not ours.
    pub fn from_path(target: &[u8]) -> Option<Endpoint> {
        let decoded = path::server_path(target);
        match path::route_path(&decoded) {
            b"/v1/chat/completions" => Some(Endpoint::Chat),
            b"/v1/completions" => Some(Endpoint::Completions),
            b"/v1/messages" => Some(Endpoint::Messages),
            b"/v1/responses" => Some(Endpoint::Responses),
            _ => None,
        }
    }

    /// Whether the prompt is a conversation rendered with the chat template.
    pub fn is_chat(self) -> bool {
        !matches!(self, Endpoint::Completions)
    }
}

/// The prompt of a request, as the engine will see it before tokenization.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A conversation for the chat template, with its tools and options.
    Chat(ChatPrompt),
    /// A completion prompt given as text.
    Text(String),
    /// A completion prompt given as token ids (used as is).
    Tokens(Vec<u32>),
}

impl Prompt {
    /// A chat prompt of already-normalized messages with default options (see
    /// [`ChatPrompt::new`]).
    pub fn messages(messages: Vec<Value>) -> Prompt {
        Prompt::Chat(ChatPrompt::new(messages))
    }
}

/// A valid request whose prompt kvroute does not hash: it is routed on load alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadOnly {
    /// A completion with several prompts: the engine caches each one on its own.
    Batch,
    /// A body nested deeper than kvroute keeps (`pyjson::MAX_DEPTH`): what the engine renders
    /// from it is not known, so the engine is left to serve or refuse it.
    TooDeep,
}

/// The routing-relevant view of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    pub endpoint: Endpoint,
    pub model: String,
    /// For a [`LoadOnly`] request: the prompts joined, for size only.
    pub prompt: Prompt,
    /// Set when the prompt must not be hashed (see [`LoadOnly`]).
    pub load_only: Option<LoadOnly>,
    pub stream: bool,
    /// Whether the answer will carry usage (and so cached tokens) when streamed.
    pub include_usage: bool,
    pub cache_salt: Option<String>,
    pub user: Option<String>,
    pub max_tokens: Option<u64>,
    /// The engine will not read its prefix cache for this request, so nothing is reused
    /// whatever a worker holds: vLLM skips the lookup when prompt logprobs are asked for
    /// (`prompt_logprobs`, or `echo` with chat's `top_logprobs` / completions' `logprobs`:
    /// `SamplingParams.skip_reading_prefix_cache`). The blocks are still computed and stored.
    pub skips_cache_read: bool,
}

/// Why a request body could not be used.
#[derive(Debug, Clone, Error, PartialEq)]
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
    #[error("'input' must be a string or an array of input items")]
    InvalidInput,
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
            RequestError::InvalidInput => Some("input"),
            RequestError::InvalidField(f) => Some(f),
            _ => None,
        }
    }
}

/// Parses a request body for `endpoint`.
///
/// Completions and chat bodies are read by the body scan (`scan`: one pass, no DOM of the
/// whole body); a body the scan gives up on, and every other endpoint's, take the general
/// path ([`parse_general`]). Both give the same result, errors included.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<ParsedRequest, RequestError> {
    match endpoint {
        Endpoint::Completions => {
            if let Some((obj, prompt)) = completions::split_prompt(body) {
                return parse_object(endpoint, &obj, Early::Prompt(prompt));
            }
        }
        Endpoint::Chat => {
            if let Some((obj, messages)) = chat_scan::split_messages(body) {
                return parse_object(endpoint, &obj, Early::Messages(messages));
            }
        }
        Endpoint::Messages | Endpoint::Responses => {}
    }
    parse_general(endpoint, body)
}

/// [`parse`] by the general path: the whole body read as Python's `json` reads it (see
/// `pyjson`), then its fields. The body scan must give the same result (the differential
/// tests and the fuzz target `request_scan` check it).
pub fn parse_general(endpoint: Endpoint, body: &[u8]) -> Result<ParsedRequest, RequestError> {
    let parsed = pyjson::from_body(body).map_err(|e| RequestError::InvalidJson(e.to_string()))?;
    let mut req = parse_value(endpoint, &parsed.value)?;
    if parsed.truncated && req.load_only.is_none() {
        req.load_only = Some(LoadOnly::TooDeep);
    }
    Ok(req)
}

/// [`parse`] for a body already parsed as JSON (the general path).
pub fn parse_value(endpoint: Endpoint, value: &Value) -> Result<ParsedRequest, RequestError> {
    let obj = value.as_object().ok_or(RequestError::NotAnObject)?;
    parse_object(endpoint, obj, Early::None)
}

/// A completion prompt parsed ahead of the rest of its body (see
/// [`completions::split_prompt`]).
type EarlyPrompt = Result<(Prompt, Option<LoadOnly>), RequestError>;

/// The big field of a body, when the body scan read it ahead of the rest (then the object
/// does not have it).
enum Early {
    None,
    Prompt(EarlyPrompt),
    Messages(chat::Messages),
}

/// The fields of a parsed body, with its big field if the body scan read it ahead.
fn parse_object(
    endpoint: Endpoint,
    obj: &Map<String, Value>,
    early: Early,
) -> Result<ParsedRequest, RequestError> {
    let (prompt, messages) = match early {
        Early::None => (None, None),
        Early::Prompt(p) => (Some(p), None),
        Early::Messages(m) => (None, Some(m)),
    };
    let model = match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(RequestError::MissingModel)
        }
        Some(_) => return Err(RequestError::InvalidField("model")),
    };
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let stream_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => opt_bool(o, "include_usage")?.unwrap_or(false),
        Some(_) => return Err(RequestError::InvalidField("stream_options")),
    };
    let salt = || Ok::<_, RequestError>(opt_string(obj, "cache_salt")?.filter(|s| !s.is_empty()));
    let (prompt, load_only, include_usage, cache_salt, max_keys): (_, _, _, _, &[&str]) =
        match endpoint {
            Endpoint::Chat => {
                let chat = chat::parse_chat_with(obj, messages)?;
                (
                    Prompt::Chat(chat),
                    None,
                    stream_usage,
                    salt()?,
                    &["max_completion_tokens", "max_tokens"],
                )
            }
            Endpoint::Completions => {
                let (p, l) = match prompt {
                    Some(early) => early?,
                    None => completions::parse_prompt(obj.get("prompt"))?,
                };
                (p, l, stream_usage, salt()?, &["max_completion_tokens", "max_tokens"])
            }
            // vLLM's Messages endpoint streams usage in its last event; it passes `cache_salt`
            // on to the chat request it builds (vLLM 0.33).
            Endpoint::Messages => {
                let chat = anthropic::parse_messages(obj)?;
                (Prompt::Chat(chat), None, true, salt()?, &["max_tokens"])
            }
            // A Responses stream always ends with `response.completed`, which has the usage.
            Endpoint::Responses => {
                let chat = responses::parse_responses(obj)?;
                (Prompt::Chat(chat), None, true, salt()?, &["max_output_tokens"])
            }
        };
    let user = opt_string(obj, "user")?;
    let max_tokens = match max_keys.iter().find_map(|k| obj.get(*k).filter(|v| !v.is_null())) {
        None => None,
        Some(v) => Some(max_tokens_value(v)?),
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
        skips_cache_read: skips_cache_read(endpoint, obj),
    })
}

/// Whether vLLM will skip its prefix-cache lookup: it asks for prompt logprobs when
/// `prompt_logprobs` is not null, or, when that is null and `echo` is true, when chat's
/// `top_logprobs` (default 0) or completions' `logprobs` (default null) is not null.
fn skips_cache_read(endpoint: Endpoint, obj: &Map<String, Value>) -> bool {
    let set = |key: &str| obj.get(key).is_some_and(|v| !v.is_null());
    let echo = obj.get("echo").is_some_and(|v| v == &Value::Bool(true));
    let echoed = match endpoint {
        Endpoint::Chat => obj.get("top_logprobs").is_none_or(|v| !v.is_null()),
        Endpoint::Completions => set("logprobs"),
        Endpoint::Messages | Endpoint::Responses => return false,
    };
    set("prompt_logprobs") || (echo && echoed)
}

/// A `max_tokens`-like field as vLLM's `int` field reads it ([`pyint::lax_int`]: `2.0`, `"2"`
/// and `true` are integers, `2.5` is not). A negative value, which vLLM refuses too (its
/// sampling parameters want at least 1), is refused here; one beyond 64 bits is kept as
/// `u64::MAX`, which is past any context length and so refused by the engine as vLLM does.
fn max_tokens_value(v: &Value) -> Result<u64, RequestError> {
    let n = pyint::lax_int(v).ok_or(RequestError::InvalidField("max_tokens"))?;
    if n < 0 {
        return Err(RequestError::InvalidField("max_tokens"));
    }
    Ok(u64::try_from(n).unwrap_or(u64::MAX))
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
