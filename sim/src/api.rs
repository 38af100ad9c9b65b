//! The OpenAI-compatible HTTP surface of one simulated worker (vLLM's routes and shapes).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use kvroute_core::error::ApiError;
use kvroute_core::model::ModelBundle;
use kvroute_core::request::{self, Endpoint, ParsedRequest, Prompt};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::engine::{Engine, Submit, TokenEvent};
use crate::metrics;

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
}

type Worker = Serving;

pub fn router(w: Arc<Worker>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
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

async fn chat(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
    generate(w, Endpoint::Chat, &body).await
}

async fn completions(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
    generate(w, Endpoint::Completions, &body).await
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn generate(w: Arc<Worker>, endpoint: Endpoint, body: &[u8]) -> Response {
    let req = match request::parse(endpoint, body) {
        Ok(r) => r,
        Err(e) => return error(e.into()),
    };
    if req.model != w.model {
        return error(ApiError::model_not_found(&req.model));
    }
    // Media parts and batch prompts are simulated by their text alone (joined for a batch):
    // the prefill work is of the right order, the media encoder is not modelled.
    let tokens = match w.bundle.prompt_tokens(&req.prompt) {
        Ok(t) => t,
        Err(e) => return error(ApiError::bad_request("invalid_value", None, e.to_string())),
    };
    let max_tokens = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS) as usize;
    if tokens.len() + max_tokens > w.max_model_len {
        let msg = format!(
            "This model's maximum context length is {} tokens; the request has {} prompt tokens \
             and {max_tokens} output tokens.",
            w.max_model_len,
            tokens.len()
        );
        return error(ApiError::bad_request("context_length_exceeded", Some("messages"), msg));
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let seed = xxhash_rust::xxh3::xxh3_64(body);
    if !w.engine.submit(Submit {
        tokens,
        salt: req.cache_salt.clone(),
        max_tokens,
        seed,
        events: tx,
    }) {
        return error(ApiError {
            status: 503,
            kind: "server_error",
            code: "engine_stopped",
            param: None,
            message: "engine stopped".into(),
        });
    }
    let id =
        format!("{}-{seed:016x}", if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" });
    let out = Output {
        endpoint,
        id,
        model: w.model.clone(),
        created: now_s(),
        include_usage: req.include_usage,
        bundle: w.bundle.clone(),
    };
    let mut resp =
        if req.stream { stream_response(out, rx) } else { full_response(out, rx, &req).await };
    if let Ok(v) = HeaderValue::from_str(&w.id) {
        resp.headers_mut().insert(WORKER_HEADER, v);
    }
    resp
}

struct Output {
    endpoint: Endpoint,
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    bundle: ModelBundle,
}

impl Output {
    fn piece(&self, id: u32) -> String {
        self.bundle.decode(&[id]).unwrap_or_default()
    }

    fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
        json!({"prompt_tokens": prompt, "completion_tokens": completion,
               "total_tokens": prompt + completion,
               "prompt_tokens_details": {"cached_tokens": cached}})
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        let mut v = json!({"id": self.id, "object": object, "created": self.created,
                           "model": self.model, "choices": choices});
        if self.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        v
    }

    fn token_choice(&self, text: &str, first: bool, finish: Option<&str>) -> Value {
        match self.endpoint {
            Endpoint::Chat => {
                let mut delta = json!({"content": text});
                if first {
                    delta["role"] = json!("assistant");
                }
                json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}])
            }
            Endpoint::Completions => {
                json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}])
            }
        }
    }
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn stream_response(out: Output, rx: mpsc::UnboundedReceiver<TokenEvent>) -> Response {
    let state = (out, rx, false);
    let stream = futures::stream::unfold(state, |(out, mut rx, done)| async move {
        if done {
            return None;
        }
        let bytes = match rx.recv().await {
            Some(TokenEvent::Token { index, id }) => {
                sse(&out.chunk(out.token_choice(&out.piece(id), index == 0, None), None))
            }
            Some(TokenEvent::Done { prompt_tokens, completion_tokens, cached_tokens }) => {
                let mut b =
                    sse(&out.chunk(out.token_choice("", false, Some("length")), None)).to_vec();
                if out.include_usage {
                    let u = Output::usage(prompt_tokens, completion_tokens, cached_tokens);
                    b.extend_from_slice(&sse(&out.chunk(json!([]), Some(u))));
                }
                b.extend_from_slice(b"data: [DONE]\n\n");
                return Some((Ok::<Bytes, std::io::Error>(Bytes::from(b)), (out, rx, true)));
            }
            Some(TokenEvent::Rejected { needed_blocks }) => {
                let e = json!({"error": {"message": format!("request needs {needed_blocks} KV blocks, more than the cache holds"), "type": "invalid_request_error", "code": "context_length_exceeded"}});
                return Some((
                    Ok(Bytes::from(format!("data: {e}\n\ndata: [DONE]\n\n"))),
                    (out, rx, true),
                ));
            }
            None => return None,
        };
        Some((Ok(bytes), (out, rx, false)))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn full_response(
    out: Output,
    mut rx: mpsc::UnboundedReceiver<TokenEvent>,
    req: &ParsedRequest,
) -> Response {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            TokenEvent::Token { id, .. } => text.push_str(&out.piece(id)),
            TokenEvent::Done { prompt_tokens, completion_tokens, cached_tokens } => {
                let choice = match req.endpoint {
                    Endpoint::Chat => {
                        json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": "length"})
                    }
                    Endpoint::Completions => {
                        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"})
                    }
                };
                let object = if req.endpoint == Endpoint::Chat {
                    "chat.completion"
                } else {
                    "text_completion"
                };
                let body = json!({"id": out.id, "object": object, "created": out.created, "model": out.model,
                    "choices": [choice], "usage": Output::usage(prompt_tokens, completion_tokens, cached_tokens)});
                return axum::Json(body).into_response();
            }
            TokenEvent::Rejected { needed_blocks } => {
                return error(ApiError::bad_request(
                    "context_length_exceeded",
                    None,
                    format!("request needs {needed_blocks} KV blocks, more than the cache holds"),
                ));
            }
        }
    }
    error(ApiError {
        status: 503,
        kind: "server_error",
        code: "engine_stopped",
        param: None,
        message: "engine stopped".into(),
    })
}

async fn models(State(w): State<Arc<Worker>>) -> Response {
    axum::Json(json!({"object": "list", "data": [{"id": w.model, "object": "model",
        "created": now_s(), "owned_by": "kvroute-sim", "max_model_len": w.max_model_len}]}))
    .into_response()
}

async fn tokenize(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(ApiError::bad_request("invalid_json", None, e.to_string())),
    };
    let tokens = if v.get("messages").is_some() {
        let add_gen = v.get("add_generation_prompt").and_then(Value::as_bool).unwrap_or(true);
        match request::parse(Endpoint::Chat, &body) {
            Ok(ParsedRequest { prompt: Prompt::Messages(m), .. }) => {
                w.bundle.render_chat_with(&m, add_gen).and_then(|t| w.bundle.encode(&t, false))
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
    let text = metrics::render(&w.model, w.announced_block_size, w.num_gpu_blocks, &st);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
