//! How many tokens a request may generate, and the requests refused for their numbers, as vLLM
//! 0.33 decides (in its order):
//!
//! 1. the output budget the client asked for above the model's length: `TokenizeParams`
//!    refuses `max_tokens` (chat's `max_completion_tokens`, Responses' `max_output_tokens`)
//!    greater than `max_model_len` (`"<param>=<n> cannot be greater than max_model_len=<m>.
//!    Please request fewer output tokens."`, 400 `BadRequestError`, `param` the field);
//! 2. a prompt longer than `max_model_len` (the renderer; one of exactly `max_model_len`
//!    leaves a budget of 0, refused by 4.);
//! 3. otherwise the budget is clamped to what the context has left (`get_max_tokens`: no error
//!    for a prompt plus `max_tokens` over the length);
//! 4. a budget below 1 (`SamplingParams`: `"max_tokens must be at least 1, got 0."`);
//! 5. an empty prompt (the input processor: `"The decoder prompt cannot be empty"`): a
//!    completion of `[]` token ids or a batch with an empty one (`[[]]`). vLLM raises it when
//!    the engine takes the request: a streamed request already has its 200 and gets the error
//!    as its one event.
//!
//! Client numbers never overflow here: every sum saturates and a budget is bounded by the
//! model's length before it becomes a `usize`.

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use kvroute_core::decision::request::{Endpoint, LoadOnly, ParsedRequest};
use serde_json::{json, Value};

/// A refusal in vLLM's shape: `{"error": {"message", "type", "param", "code": <status>}}`,
/// the message as `str(VLLMValidationError)` prints it (with `(parameter=..., value=...)`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    pub param: Option<&'static str>,
    pub message: String,
    /// Raised by the engine (after a streamed answer started) rather than before.
    pub in_engine: bool,
}

impl Refusal {
    fn validation(message: String, param: &'static str, value: impl std::fmt::Display) -> Self {
        let message = format!("{message} (parameter={param}, value={value})");
        Refusal { param: Some(param), message, in_engine: false }
    }

    fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": "BadRequestError",
            "param": self.param, "code": 400}})
    }

    /// The answer: a 400, or for a streamed request refused by the engine, a 200 stream whose
    /// one event is the error (vLLM's chat and completions streams).
    pub fn response(&self, endpoint: Endpoint, stream: bool) -> Response {
        let body = self.body();
        if stream && self.in_engine && matches!(endpoint, Endpoint::Chat | Endpoint::Completions) {
            let text = format!("data: {body}\n\ndata: [DONE]\n\n");
            return Response::builder()
                .header(header::CONTENT_TYPE, "text/event-stream")
                .body(Body::from(text))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
        }
        (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
    }
}

/// The name of the field that set the budget (chat prefers `max_completion_tokens`).
fn budget_param(endpoint: Endpoint, body: &Value) -> &'static str {
    let set = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    match endpoint {
        Endpoint::Chat if set("max_completion_tokens") => "max_completion_tokens",
        Endpoint::Responses => "max_output_tokens",
        _ => "max_tokens",
    }
}

/// What the checks need to know about one request.
pub(crate) struct Ask<'a> {
    pub endpoint: Endpoint,
    pub req: &'a ParsedRequest,
    /// The body as JSON (which field set the budget, the items of a batch).
    pub body: &'a Value,
    pub prompt_tokens: usize,
    /// The budget when the request names none.
    pub default_max_tokens: u64,
    pub max_model_len: usize,
}

/// The number of tokens the request may generate, or why vLLM refuses it (`Err(None)`: a
/// prompt too long for the model, which the caller answers in its own shape).
pub(crate) fn budget(ask: &Ask) -> Result<usize, Option<Refusal>> {
    let max_len = ask.max_model_len as u64;
    if let Some(n) = ask.req.max_tokens.filter(|n| *n > max_len) {
        let param = budget_param(ask.endpoint, ask.body);
        let msg = format!(
            "{param}={n} cannot be greater than max_model_len={max_len}. Please request fewer \
             output tokens."
        );
        return Err(Some(Refusal::validation(msg, param, n)));
    }
    if ask.prompt_tokens > ask.max_model_len {
        return Err(None);
    }
    let left = (ask.max_model_len - ask.prompt_tokens) as u64;
    let asked = ask.req.max_tokens.unwrap_or(ask.default_max_tokens);
    let budget = asked.min(left);
    if budget < 1 {
        let msg = format!("max_tokens must be at least 1, got {budget}.");
        return Err(Some(Refusal::validation(msg, "max_tokens", budget)));
    }
    if ask.prompt_tokens == 0 || has_empty_item(ask) {
        let message = "The decoder prompt cannot be empty".to_owned();
        return Err(Some(Refusal { param: None, message, in_engine: true }));
    }
    // At most `max_model_len`, which is a `usize`.
    Ok(usize::try_from(budget).unwrap_or(ask.max_model_len))
}

/// Whether a completions batch holds an empty token-id list (vLLM runs each prompt of a batch
/// on its own; the simulator runs them joined).
fn has_empty_item(ask: &Ask) -> bool {
    if ask.endpoint != Endpoint::Completions || ask.req.load_only != Some(LoadOnly::Batch) {
        return false;
    }
    let items = ask.body.get("prompt").and_then(Value::as_array);
    items.is_some_and(|items| items.iter().any(|i| i.as_array().is_some_and(Vec::is_empty)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_core::decision::request::parse;

    fn check(
        endpoint: Endpoint,
        body: Value,
        prompt_tokens: usize,
    ) -> Result<usize, Option<Refusal>> {
        let req = parse(endpoint, body.to_string().as_bytes()).unwrap();
        let ask = Ask {
            endpoint,
            req: &req,
            body: &body,
            prompt_tokens,
            default_max_tokens: 16,
            max_model_len: 4096,
        };
        budget(&ask)
    }

    fn message(r: Result<usize, Option<Refusal>>) -> (Option<&'static str>, String) {
        let r = r.unwrap_err().unwrap();
        (r.param, r.message)
    }

    #[test]
    fn budgets_past_the_context_are_refused_as_vllm_refuses_them() {
        let chat = |extra: Value| {
            let mut b = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
            b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            b
        };
        assert_eq!(
            message(check(Endpoint::Chat, chat(json!({"max_tokens": u64::MAX})), 10)),
            (
                Some("max_tokens"),
                "max_tokens=18446744073709551615 cannot be greater than max_model_len=4096. \
                 Please request fewer output tokens. (parameter=max_tokens, \
                 value=18446744073709551615)"
                    .to_owned()
            )
        );
        let both = chat(json!({"max_tokens": 5, "max_completion_tokens": 5000}));
        assert_eq!(message(check(Endpoint::Chat, both, 10)).0, Some("max_completion_tokens"));
        let resp = json!({"model": "m", "input": "x", "max_output_tokens": 4097});
        assert_eq!(message(check(Endpoint::Responses, resp, 10)).0, Some("max_output_tokens"));
        // Exactly the length: allowed, then clamped to what the prompt leaves.
        assert_eq!(check(Endpoint::Chat, chat(json!({"max_tokens": 4096})), 10), Ok(4086));
        assert_eq!(check(Endpoint::Chat, chat(json!({"max_tokens": 2.0})), 10), Ok(2));
        assert_eq!(check(Endpoint::Chat, chat(json!({})), 10), Ok(16));
        assert_eq!(check(Endpoint::Chat, chat(json!({})), 4090), Ok(6));
        assert_eq!(
            message(check(Endpoint::Chat, chat(json!({"max_tokens": 0})), 10)),
            (
                Some("max_tokens"),
                "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)".into()
            )
        );
        // A prompt that fills the model leaves no budget; a longer one is the caller's refusal.
        let full = message(check(Endpoint::Chat, chat(json!({})), 4096)).1;
        assert!(full.starts_with("max_tokens must be at least 1, got 0."), "{full}");
        assert_eq!(check(Endpoint::Chat, chat(json!({})), 4097), Err(None));
    }

    #[test]
    fn empty_prompts_are_refused_by_the_engine() {
        let empty = |prompt: Value, n| {
            let body = json!({"model": "m", "prompt": prompt, "max_tokens": 2});
            check(Endpoint::Completions, body, n).unwrap_err().unwrap()
        };
        for (prompt, n) in [(json!([[]]), 0), (json!([[], [1, 2]]), 2), (json!([[1], []]), 1)] {
            let r = empty(prompt.clone(), n);
            assert_eq!(r.message, "The decoder prompt cannot be empty", "{prompt}");
            assert!(r.in_engine && r.param.is_none());
        }
        let body = json!({"model": "m", "prompt": [[1], [2]], "max_tokens": 2});
        assert_eq!(check(Endpoint::Completions, body, 2), Ok(2));
    }
}
