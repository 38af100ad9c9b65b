//! The OpenAI-compatible HTTP surface of one simulated worker (vLLM's routes and shapes):
//! `/v1/chat/completions`, `/v1/completions`, `/v1/responses` ([`responses`]) and
//! Anthropic-style `/v1/messages` ([`messages`]), each streamed or not, each reporting cached
//! prompt tokens in its own usage fields and ending on its stop conditions ([`stop`]); and
//! vLLM's LoRA adapter API: `/v1/models` lists the base model (`parent: null`) and each
//! loaded adapter (`parent` = the base, `root` = its path); `POST /v1/load_lora_adapter`
//! `{"lora_name", "lora_path"}` and `POST /v1/unload_lora_adapter` `{"lora_name"}` answer as
//! vLLM does (plain-text success, `{"error": {...}}` with vLLM's types and codes otherwise); a
//! request whose `model` names a loaded adapter is served in that adapter's cache domain.
//!
//! Two more routes: `POST /reset_prefix_cache` (vLLM's dev-mode endpoint: drops the prefix
//! cache; 200 with an empty body whether or not the engine could reset, as vLLM, which does
//! not check; the engine refuses while requests hold blocks) and `POST /sim/what_if`
//! (`{"endpoint", "request"}`: the TTFT the request would get if it arrived now, from a forward
//! simulation on a copy of the engine's state; see [`crate::engine::WhatIf`]).
//!
//! Topology ([`kv`], [`crate::pull`]): `GET /sim/topology` (labels, role, network settings),
//! `POST /kv/pull` (a peer pulling this worker's KV), and on the generation routes the
//! `x-kvroute-kv-source` (pull the prefix first) and `x-prefiller-host-port` (P/D, on a decode
//! worker) request headers.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use kvroute_core::decision::error::ApiError;
use kvroute_core::decision::request::{self, Endpoint, ParsedRequest, Prompt};
use kvroute_core::decision::tokenize::model::ModelBundle;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::engine::{Command, Engine, Finish, SchedulingPolicy, Submit, TokenEvent, WhatIfAnswer};
use crate::metrics;

mod kv;
mod limits;
mod messages;
mod priority;
mod responses;
pub mod stop;

use stop::{Stops, TextOut};

/// Response header naming the worker that served a request (`ip:port`).
pub const WORKER_HEADER: &str = "x-worker-id";
const DEFAULT_MAX_TOKENS: u64 = 16;

/// What one running worker serves with.
pub struct Serving {
    pub id: String,
    pub model: String,
    /// Tokenizer and the template actually served (may differ from the announced one).
    pub bundle: ModelBundle,
    pub engine: Engine,
    /// The block size announced in `/metrics` (the engine may cache with another).
    pub announced_block_size: usize,
    pub num_gpu_blocks: usize,
    pub max_model_len: usize,
    /// `root` of the base model in `/v1/models` (vLLM: the model's path).
    pub root: String,
    /// Loaded LoRA adapters, in load order.
    pub adapters: Mutex<Vec<Adapter>>,
    /// How long loading an adapter takes (a sim option; 0 by default).
    pub lora_load_ms: u64,
    /// The engine's `--scheduling-policy` (whether a non-zero `priority` is taken).
    pub scheduling_policy: SchedulingPolicy,
    /// Labels, links and KV pulls ([`crate::pull`]).
    pub net: crate::pull::KvNet,
}

/// A loaded LoRA adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adapter {
    pub name: String,
    pub path: String,
}

impl Serving {
    /// Whether `name` is a loaded adapter.
    pub fn has_adapter(&self, name: &str) -> bool {
        self.adapters.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|a| a.name == name)
    }
}

type Worker = Serving;

pub fn router(w: Arc<Worker>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses_route))
        .route("/v1/messages", post(messages_route))
        .route("/v1/models", get(models))
        .route("/version", get(version))
        .route("/v1/load_lora_adapter", post(load_lora_adapter))
        .route("/v1/unload_lora_adapter", post(unload_lora_adapter))
        .route("/tokenize", post(tokenize))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/sim/what_if", post(what_if))
        .route("/sim/topology", get(kv::topology))
        .route("/kv/pull", post(kv::pull))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics_text))
        // Long prompts: accept bodies as large as any proxy in front would forward.
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
        .with_state(w)
}

fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    (status, [(header::CONTENT_TYPE, "application/json")], e.body()).into_response()
}

/// An error in vLLM's own shape: `{"error": {"message", "type", "param", "code": <status>}}`.
fn vllm_error(status: StatusCode, kind: &str, param: Option<&str>, message: String) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": param,
        "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

/// vLLM's answer to a `model` that is neither the base model nor a loaded adapter.
fn model_not_found(model: &str) -> Response {
    vllm_error(
        StatusCode::NOT_FOUND,
        "NotFoundError",
        Some("model"),
        format!("The model `{model}` does not exist."),
    )
}

/// Which adapter (none: the base model) serves `model`; `None` when nothing does.
fn resolve(w: &Worker, model: &str) -> Option<Option<String>> {
    if model == w.model {
        Some(None)
    } else if w.has_adapter(model) {
        Some(Some(model.to_owned()))
    } else {
        None
    }
}

async fn chat(State(w): State<Arc<Worker>>, headers: HeaderMap, body: Bytes) -> Response {
    generate(w, Endpoint::Chat, &headers, &body).await
}

async fn completions(State(w): State<Arc<Worker>>, headers: HeaderMap, body: Bytes) -> Response {
    generate(w, Endpoint::Completions, &headers, &body).await
}

async fn responses_route(
    State(w): State<Arc<Worker>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    generate(w, Endpoint::Responses, &headers, &body).await
}

async fn messages_route(State(w): State<Arc<Worker>>, headers: HeaderMap, body: Bytes) -> Response {
    generate(w, Endpoint::Messages, &headers, &body).await
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A request as the engine receives it, after the endpoint's checks.
struct Prepared {
    req: ParsedRequest,
    tokens: Vec<u32>,
    lora: Option<String>,
    max_tokens: usize,
    /// Its `priority` ([`priority`]).
    priority: i64,
}

/// An error as `endpoint` answers it: Anthropic's shape (`{"type": "error", "error": {"type",
/// "message"}}`, the type from the status as vLLM picks it) on `/v1/messages`, OpenAI's
/// elsewhere.
fn refuse(endpoint: Endpoint, e: ApiError) -> Response {
    if endpoint != Endpoint::Messages {
        return error(e);
    }
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    let kind = anthropic_error_type(e.status);
    let body = json!({"type": "error", "error": {"type": kind, "message": e.message}});
    (status, axum::Json(body)).into_response()
}

/// Anthropic's `error.type` for an HTTP status, as vLLM translates it.
fn anthropic_error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// Parses, resolves the model and renders and tokenizes a request exactly as `endpoint` does,
/// and sets its output budget ([`limits`]); the error response is the endpoint's own.
/// `streamable`: a streamed request refused by the engine gets its error in a stream.
fn prepare(
    w: &Worker,
    endpoint: Endpoint,
    body: &[u8],
    streamable: bool,
) -> Result<Prepared, Box<Response>> {
    let req = request::parse(endpoint, body).map_err(|e| Box::new(refuse(endpoint, e.into())))?;
    let priority =
        priority::read(endpoint, body).map_err(|r| Box::new(r.response(endpoint, false)))?;
    let Some(lora) = resolve(w, &req.model) else {
        if endpoint == Endpoint::Messages {
            let msg = format!("The model `{}` does not exist.", req.model);
            let e = ApiError {
                status: 404,
                kind: "NotFoundError",
                code: "model_not_found",
                param: Some("model"),
                message: msg,
            };
            return Err(Box::new(refuse(endpoint, e)));
        }
        return Err(Box::new(model_not_found(&req.model)));
    };
    // Media parts and batch prompts are simulated by their text alone (joined for a batch):
    // the prefill work is of the right order, the media encoder is not modelled.
    let tokens = w.bundle.prompt_tokens(&req.prompt).map_err(|e| {
        Box::new(refuse(endpoint, ApiError::bad_request("invalid_value", None, e.to_string())))
    })?;
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let ask = limits::Ask {
        endpoint,
        req: &req,
        body: &body,
        prompt_tokens: tokens.len(),
        default_max_tokens: DEFAULT_MAX_TOKENS,
        max_model_len: w.max_model_len,
    };
    let max_tokens = match limits::budget(&ask) {
        Ok(n) => n,
        Err(Some(refusal)) => {
            let stream = streamable && req.stream;
            return Err(Box::new(refusal.response(endpoint, stream)));
        }
        Err(None) => {
            let msg = format!(
                "This model's maximum context length is {} tokens. However, your prompt \
                 contains {} input tokens, which exceeds this limit even without any output \
                 tokens. Please reduce the length of the input prompt.",
                w.max_model_len,
                tokens.len()
            );
            let e = ApiError::bad_request("context_length_exceeded", Some("messages"), msg);
            return Err(Box::new(refuse(endpoint, e)));
        }
    };
    if let Some(refusal) = priority::check(w.scheduling_policy, priority) {
        return Err(Box::new(refusal.response(endpoint, streamable && req.stream)));
    }
    Ok(Prepared { req, tokens, lora, max_tokens, priority })
}

fn engine_stopped_error() -> ApiError {
    ApiError {
        status: 503,
        kind: "server_error",
        code: "engine_stopped",
        param: None,
        message: "engine stopped".into(),
    }
}

fn engine_stopped() -> Response {
    error(engine_stopped_error())
}

fn too_big_error(needed_blocks: usize) -> ApiError {
    ApiError::bad_request(
        "context_length_exceeded",
        None,
        format!("request needs {needed_blocks} KV blocks, more than the cache holds"),
    )
}

/// The engine's refusal of a request that can never fit in the KV cache.
fn too_big(needed_blocks: usize) -> Response {
    error(too_big_error(needed_blocks))
}

async fn generate(
    w: Arc<Worker>,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let Prepared { req, tokens, lora, max_tokens, priority } =
        match prepare(&w, endpoint, body, true) {
            Ok(p) => p,
            Err(resp) => return *resp,
        };
    let stops = match Stops::parse(endpoint, body) {
        Ok(s) => s,
        Err(msg) => {
            return refuse(endpoint, ApiError::bad_request("invalid_value", Some("stop"), msg))
        }
    };
    let prompt =
        kv::Prompt { tokens: &tokens, salt: req.cache_salt.as_deref(), lora: lora.as_deref() };
    kv::before_prefill(&w, headers, endpoint, body, &prompt).await;
    let (tx, rx) = mpsc::unbounded_channel();
    let seed = xxhash_rust::xxh3::xxh3_64(body);
    let prompt_tokens = tokens.len();
    if !w.engine.submit(Submit {
        tokens,
        salt: req.cache_salt.clone(),
        lora,
        max_tokens,
        priority,
        seed,
        stop: stops.rule(&w.bundle),
        events: tx,
    }) {
        return refuse(endpoint, engine_stopped_error());
    }
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
        Endpoint::Responses => "resp",
        // vLLM's Messages answer carries the id of the chat completion it ran.
        Endpoint::Messages => "chatcmpl",
    };
    let sep = if endpoint == Endpoint::Responses { "_" } else { "-" };
    let out = Output {
        endpoint,
        id: format!("{prefix}{sep}{seed:016x}"),
        model: req.model.clone(),
        created: now_s(),
        include_usage: req.include_usage,
        bundle: w.bundle.clone(),
        prompt_tokens,
        max_tokens,
        text: TextOut::new(stops),
        body: serde_json::from_slice(body).unwrap_or(Value::Null),
        kv_transfer: kv::transfer_params(&w.id, body),
    };
    let mut resp = if req.stream { stream_response(out, rx) } else { full_response(out, rx).await };
    if let Ok(v) = HeaderValue::from_str(&w.id) {
        resp.headers_mut().insert(WORKER_HEADER, v);
    }
    resp
}

/// What a finished request reports.
pub(crate) struct Usage {
    pub prompt: usize,
    pub completion: usize,
    pub cached: usize,
    pub created: usize,
}

pub(crate) struct Output {
    pub endpoint: Endpoint,
    pub id: String,
    pub model: String,
    pub created: u64,
    pub include_usage: bool,
    pub bundle: ModelBundle,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    pub text: TextOut,
    /// The request body as JSON (the Responses answer echoes some of its fields).
    pub body: Value,
    /// `kv_transfer_params` of a P/D prefill answer ([`kv::transfer_params`]).
    pub kv_transfer: Option<Value>,
}

impl Output {
    fn piece(&self, id: u32) -> String {
        self.bundle.decode(&[id]).unwrap_or_default()
    }

    fn usage(u: &Usage) -> Value {
        json!({"prompt_tokens": u.prompt, "completion_tokens": u.completion,
               "total_tokens": u.prompt + u.completion,
               "prompt_tokens_details": {"cached_tokens": u.cached,
                                         "created_cache_tokens": u.created}})
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            _ => "chat.completion.chunk",
        };
        let mut v = json!({"id": self.id, "object": object, "created": self.created,
                           "model": self.model, "choices": choices});
        if self.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        v
    }

    fn token_choice(&self, text: &str, first: bool, finish: Option<&Finish>) -> Value {
        let (reason, stop_reason) = match finish {
            Some(f) => {
                let (r, s) = stop::openai_reasons(f);
                (Value::from(r), s)
            }
            None => (Value::Null, Value::Null),
        };
        match self.endpoint {
            e if e.is_chat() => {
                let mut delta = json!({"content": text});
                if first {
                    delta["role"] = json!("assistant");
                }
                json!([{"index": 0, "delta": delta, "logprobs": null,
                        "finish_reason": reason, "stop_reason": stop_reason}])
            }
            _ => json!([{"index": 0, "text": text, "logprobs": null,
                         "finish_reason": reason, "stop_reason": stop_reason}]),
        }
    }
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// How one endpoint writes a stream: its opening events, a piece of text, the end.
pub(crate) trait StreamShape: Send {
    /// Sent before the first token (nothing for chat and completions).
    fn open(&mut self, _out: &Output) -> Vec<u8> {
        Vec::new()
    }
    fn text(&mut self, out: &Output, text: &str) -> Vec<u8>;
    fn done(&mut self, out: &Output, rest: &str, finish: &Finish, usage: &Usage) -> Vec<u8>;
    fn error(&mut self, out: &Output, e: ApiError) -> Vec<u8>;
}

/// Chat and completions chunks (`data: {...}`, then `data: [DONE]`).
struct OpenAiChunks {
    first: bool,
}

impl StreamShape for OpenAiChunks {
    fn text(&mut self, out: &Output, text: &str) -> Vec<u8> {
        if text.is_empty() {
            return Vec::new();
        }
        let first = std::mem::take(&mut self.first);
        sse(&out.chunk(out.token_choice(text, first, None), None)).to_vec()
    }

    fn done(&mut self, out: &Output, rest: &str, finish: &Finish, usage: &Usage) -> Vec<u8> {
        let first = std::mem::take(&mut self.first);
        let mut b = sse(&out.chunk(out.token_choice(rest, first, Some(finish)), None)).to_vec();
        if out.include_usage {
            b.extend_from_slice(&sse(&out.chunk(json!([]), Some(Output::usage(usage)))));
        }
        b.extend_from_slice(b"data: [DONE]\n\n");
        b
    }

    fn error(&mut self, _out: &Output, e: ApiError) -> Vec<u8> {
        let e = json!({"error": {"message": e.message, "type": e.kind, "code": e.code}});
        format!("data: {e}\n\ndata: [DONE]\n\n").into_bytes()
    }
}

fn stream_response(out: Output, rx: mpsc::UnboundedReceiver<TokenEvent>) -> Response {
    let shape: Box<dyn StreamShape> = match out.endpoint {
        Endpoint::Responses => Box::new(responses::Stream::default()),
        Endpoint::Messages => Box::new(messages::Stream::default()),
        _ => Box::new(OpenAiChunks { first: true }),
    };
    let state = (out, rx, shape, false, true);
    let stream =
        futures::stream::unfold(state, |(mut out, mut rx, mut shape, done, opening)| async move {
            if done {
                return None;
            }
            if opening {
                let b = shape.open(&out);
                if !b.is_empty() {
                    return Some((Ok(Bytes::from(b)), (out, rx, shape, false, false)));
                }
            }
            let (bytes, done) = match rx.recv().await {
                Some(TokenEvent::Token { id, .. }) => {
                    let piece = out.piece(id);
                    let text = out.text.push(&piece);
                    (shape.text(&out, &text), false)
                }
                Some(TokenEvent::Done {
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                    created_cache_tokens,
                    finish,
                }) => {
                    let rest = out.text.finish(&finish);
                    let usage = Usage {
                        prompt: prompt_tokens,
                        completion: completion_tokens,
                        cached: cached_tokens,
                        created: created_cache_tokens,
                    };
                    (shape.done(&out, &rest, &finish, &usage), true)
                }
                Some(TokenEvent::Rejected { needed_blocks }) => {
                    (shape.error(&out, too_big_error(needed_blocks)), true)
                }
                None => (shape.error(&out, engine_stopped_error()), true),
            };
            Some((Ok::<Bytes, std::io::Error>(Bytes::from(bytes)), (out, rx, shape, done, false)))
        });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn full_response(mut out: Output, mut rx: mpsc::UnboundedReceiver<TokenEvent>) -> Response {
    while let Some(ev) = rx.recv().await {
        match ev {
            TokenEvent::Token { id, .. } => {
                let piece = out.piece(id);
                out.text.push(&piece);
            }
            TokenEvent::Done {
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                created_cache_tokens,
                finish,
            } => {
                out.text.finish(&finish);
                let usage = Usage {
                    prompt: prompt_tokens,
                    completion: completion_tokens,
                    cached: cached_tokens,
                    created: created_cache_tokens,
                };
                let body = match out.endpoint {
                    Endpoint::Responses => responses::full(&out, &finish, &usage),
                    Endpoint::Messages => messages::full(&out, &finish, &usage),
                    _ => openai_full(&out, &finish, &usage),
                };
                return axum::Json(body).into_response();
            }
            TokenEvent::Rejected { needed_blocks } => {
                return refuse(out.endpoint, too_big_error(needed_blocks))
            }
        }
    }
    refuse(out.endpoint, engine_stopped_error())
}

/// A chat completion or a text completion, whole.
fn openai_full(out: &Output, finish: &Finish, usage: &Usage) -> Value {
    let text = out.text.sent_text();
    let (reason, stop_reason) = stop::openai_reasons(finish);
    let choice = if out.endpoint.is_chat() {
        json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null,
               "finish_reason": reason, "stop_reason": stop_reason})
    } else {
        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason,
               "stop_reason": stop_reason})
    };
    let object = if out.endpoint.is_chat() { "chat.completion" } else { "text_completion" };
    let mut v = json!({"id": out.id, "object": object, "created": out.created,
        "model": out.model, "choices": [choice], "usage": Output::usage(usage)});
    if let Some(t) = &out.kv_transfer {
        v["kv_transfer_params"] = t.clone();
    }
    v
}

/// `POST /reset_prefix_cache`, vLLM's dev-mode endpoint: asks the engine to drop its prefix
/// cache (`AllBlocksCleared`). Like vLLM, it answers 200 with an empty body either way: vLLM's
/// server does not check the result, and its engine refuses (logging "Failed to reset prefix
/// cache because some blocks are not freed yet") while requests hold blocks, as this one does.
/// 503 only when the engine has stopped.
async fn reset_prefix_cache(State(w): State<Arc<Worker>>) -> Response {
    let (reply, rx) = tokio::sync::oneshot::channel();
    if !w.engine.command(Command::Reset { reply }) {
        return engine_stopped();
    }
    match rx.await {
        Ok(_) => StatusCode::OK.into_response(),
        Err(_) => engine_stopped(),
    }
}

#[derive(serde::Deserialize)]
struct WhatIfBody {
    endpoint: String,
    request: Value,
}

/// `POST /sim/what_if` `{"endpoint": "/v1/chat/completions" | "/v1/completions" |
/// "/v1/responses" | "/v1/messages", "request": <the body a client would send there>}`: renders and tokenizes the request as that endpoint
/// does, without running it, and answers `{"ttft_ms", "cached_tokens", "prompt_tokens",
/// "running", "waiting"}` (`ttft_ms` in engine time, not divided by `--speedup`). A request the
/// endpoint would refuse gets the endpoint's error; a stopped engine, or no first token within
/// [`crate::engine::WHAT_IF_MAX_STEPS`] simulated steps, 503.
async fn what_if(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
    let q: WhatIfBody = match serde_json::from_slice(&body) {
        Ok(q) => q,
        Err(e) => {
            let msg = format!("expected {{\"endpoint\": ..., \"request\": {{...}}}}: {e}");
            return error(ApiError::bad_request("invalid_json", None, msg));
        }
    };
    let Some(endpoint) = Endpoint::from_path(q.endpoint.as_bytes()) else {
        let msg = format!(
            "endpoint must be /v1/chat/completions, /v1/completions, /v1/responses or \
             /v1/messages, not {:?}",
            q.endpoint
        );
        return error(ApiError::bad_request("invalid_value", Some("endpoint"), msg));
    };
    let raw = q.request.to_string();
    let p = match prepare(&w, endpoint, raw.as_bytes(), false) {
        Ok(p) => p,
        Err(resp) => return *resp,
    };
    let salt = p.req.cache_salt.clone();
    let answer = w.engine.what_if(p.tokens, salt, p.lora, p.max_tokens, p.priority).await;
    match answer {
        Some(WhatIfAnswer::Ttft { ttft_ms, cached_tokens, prompt_tokens, running, waiting }) => {
            axum::Json(json!({"ttft_ms": ttft_ms, "cached_tokens": cached_tokens,
                "prompt_tokens": prompt_tokens, "running": running, "waiting": waiting}))
            .into_response()
        }
        Some(WhatIfAnswer::Rejected { needed_blocks }) => too_big(needed_blocks),
        Some(WhatIfAnswer::TooLong) => error(ApiError {
            status: 503,
            kind: "server_error",
            code: "what_if_too_long",
            param: None,
            message: format!(
                "no first token within {} simulated steps",
                crate::engine::WHAT_IF_MAX_STEPS
            ),
        }),
        None => engine_stopped(),
    }
}

/// The vLLM release whose observable behaviour the simulator follows, as `GET /version` says
/// it (gateways such as SMG tell a vLLM engine by it, or by `owned_by` in `/v1/models`).
pub const VLLM_VERSION: &str = "0.33.0";

async fn version() -> Response {
    axum::Json(json!({ "version": VLLM_VERSION })).into_response()
}

/// vLLM's model list (`owned_by: "vllm"`, as vLLM writes it): the base model (`parent: null`, `root` = its path), then each loaded
/// adapter (`parent` = the base model, `root` = the adapter's path).
async fn models(State(w): State<Arc<Worker>>) -> Response {
    let created = now_s();
    let card = |id: &str, root: &str, parent: Option<&str>, max_len: Option<usize>| {
        json!({"id": id, "object": "model", "created": created, "owned_by": "vllm",
            "root": root, "parent": parent, "max_model_len": max_len,
            "permission": [{"id": format!("modelperm-{id}"), "object": "model_permission",
                "created": created, "allow_create_engine": false, "allow_sampling": true,
                "allow_logprobs": true, "allow_search_indices": false, "allow_view": true,
                "allow_fine_tuning": false, "organization": "*", "group": null,
                "is_blocking": false}]})
    };
    let mut data = vec![card(&w.model, &w.root, None, Some(w.max_model_len))];
    let adapters = w.adapters.lock().unwrap_or_else(|e| e.into_inner()).clone();
    data.extend(adapters.iter().map(|a| card(&a.name, &a.path, Some(&w.model), None)));
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

#[derive(serde::Deserialize)]
struct LoadLora {
    #[serde(default)]
    lora_name: String,
    #[serde(default)]
    lora_path: String,
    #[serde(default)]
    load_inplace: bool,
}

/// `POST /v1/load_lora_adapter`: 200 `Success: LoRA adapter '<name>' added successfully.`;
/// 400 `InvalidUserInput` without a name or path, for a name already loaded (unless
/// `load_inplace`) or one that is the base model's.
async fn load_lora_adapter(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
    let bad = |msg: String| vllm_error(StatusCode::BAD_REQUEST, "InvalidUserInput", None, msg);
    let req: LoadLora = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad(format!("invalid request body: {e}")),
    };
    if req.lora_name.is_empty() || req.lora_path.is_empty() {
        return bad("Both 'lora_name' and 'lora_path' must be provided.".into());
    }
    if req.lora_name == w.model {
        return bad(format!(
            "The lora adapter name '{}' conflicts with a served base model.",
            req.lora_name
        ));
    }
    if w.has_adapter(&req.lora_name) && !req.load_inplace {
        return bad(format!(
            "The lora adapter '{}' has already been loaded. If you want to load the adapter in \
             place, set 'load_inplace' to True.",
            req.lora_name
        ));
    }
    if w.lora_load_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(w.lora_load_ms)).await;
    }
    let mut adapters = w.adapters.lock().unwrap_or_else(|e| e.into_inner());
    let adapter = Adapter { name: req.lora_name.clone(), path: req.lora_path };
    match adapters.iter_mut().find(|a| a.name == adapter.name) {
        Some(a) => *a = adapter,
        None => adapters.push(adapter),
    }
    format!("Success: LoRA adapter '{}' added successfully.", req.lora_name).into_response()
}

#[derive(serde::Deserialize)]
struct UnloadLora {
    #[serde(default)]
    lora_name: String,
}

/// `POST /v1/unload_lora_adapter`: 200 `Success: LoRA adapter '<name>' removed successfully.`;
/// 404 `NotFoundError` for an adapter that is not loaded; 400 without a name.
async fn unload_lora_adapter(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
    let req: UnloadLora = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return vllm_error(
                StatusCode::BAD_REQUEST,
                "InvalidUserInput",
                None,
                format!("invalid request body: {e}"),
            )
        }
    };
    if req.lora_name.is_empty() {
        return vllm_error(
            StatusCode::BAD_REQUEST,
            "InvalidUserInput",
            None,
            "either 'lora_name' and 'lora_int_id' needs to be provided.".into(),
        );
    }
    let mut adapters = w.adapters.lock().unwrap_or_else(|e| e.into_inner());
    let before = adapters.len();
    adapters.retain(|a| a.name != req.lora_name);
    if adapters.len() == before {
        return vllm_error(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            None,
            format!("The lora adapter '{}' cannot be found.", req.lora_name),
        );
    }
    format!("Success: LoRA adapter '{}' removed successfully.", req.lora_name).into_response()
}

async fn tokenize(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(ApiError::bad_request("invalid_json", None, e.to_string())),
    };
    if let Some(model) = v.get("model").and_then(Value::as_str) {
        if resolve(&w, model).is_none() {
            return model_not_found(model);
        }
    }
    let tokens = if v.get("messages").is_some() {
        // The chat prompt with its options (`add_generation_prompt`, tools, kwargs), rendered
        // and tokenized as a chat completion would be.
        match request::parse(Endpoint::Chat, &body) {
            Ok(ParsedRequest { prompt: chat @ Prompt::Chat(_), .. }) => {
                w.bundle.prompt_tokens(&chat)
            }
            Ok(_) => {
                return error(ApiError::bad_request("invalid_value", None, "bad messages".into()))
            }
            Err(e) => return error(e.into()),
        }
    } else {
        let add_special = v.get("add_special_tokens").and_then(Value::as_bool).unwrap_or(true);
        match v.get("prompt").and_then(Value::as_str) {
            Some(p) => w.bundle.encode(p, add_special),
            None => {
                return error(ApiError::bad_request(
                    "invalid_value",
                    Some("prompt"),
                    "'prompt' or 'messages' is required".into(),
                ))
            }
        }
    };
    match tokens {
        Ok(t) => {
            axum::Json(json!({"count": t.len(), "max_model_len": w.max_model_len, "tokens": t}))
                .into_response()
        }
        Err(e) => error(ApiError::bad_request("invalid_value", None, e.to_string())),
    }
}

async fn metrics_text(State(w): State<Arc<Worker>>) -> Response {
    let st = w.engine.stats.lock().map(|s| s.clone()).unwrap_or_default();
    let mut text = metrics::render(&w.model, w.announced_block_size, w.num_gpu_blocks, &st);
    if w.net.shows_metrics() {
        let pulls = w.net.stats.lock().map(|s| s.clone()).unwrap_or_default();
        text.push_str(&crate::pull::render_metrics(&w.model, &pulls));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
