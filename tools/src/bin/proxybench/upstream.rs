//! The instant upstream: loopback servers that answer every chat request at once with a fixed
//! small OpenAI response, and the few other calls routers make of a worker, so the router in
//! front is the bottleneck, not an engine. A benchmark fixture; it stands in for nothing in the
//! product.
//!
//! Besides chat it answers what the routers probe or call (found by running them against a
//! logging server): `GET /health`, `/v1/models` (the model id), `/get_model_info`,
//! `/get_server_info`, `/metrics` (idle vLLM gauges), and `POST /tokenize` (vLLM's shape, with
//! made-up ids: one per 4 bytes of the request body, so a longer prompt gives more tokens and
//! two bodies differing early differ early). Like the simulated worker, it has no
//! `/v1/chat/completions/render` (404). Other `GET`s (`/version`, `/server_info`, `/loads`:
//! SMG's engine detection and load polls) get 404; the peers' launcher registers SMG's workers
//! as vLLM engines itself. Every call is counted by kind, so the bench reports what each router
//! asks of its workers per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

const RESPONSE: &str = r#"{"id":"cmpl-bench","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}"#;

/// The kinds of upstream call counted.
pub const KINDS: [&str; 5] = ["chat", "tokenize", "render", "probe", "other"];

/// Calls counted by kind (index into [`KINDS`]), over all upstreams.
#[derive(Debug, Default)]
pub struct UpstreamCalls([AtomicU64; 5]);

impl UpstreamCalls {
    fn add(&self, kind: usize) {
        self.0[kind].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now, in [`KINDS`] order.
    pub fn snapshot(&self) -> [u64; 5] {
        std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed))
    }
}

/// Calls per client request between two snapshots, the kinds seen only.
pub fn per_request(before: [u64; 5], after: [u64; 5], requests: u64) -> Vec<(String, f64)> {
    KINDS
        .iter()
        .enumerate()
        .filter(|(i, _)| after[*i] > before[*i])
        .map(|(i, k)| (k.to_string(), (after[i] - before[i]) as f64 / requests.max(1) as f64))
        .collect()
}

/// Made-up token ids for `body`: one per 4 bytes, from those bytes.
pub fn fake_tokens(body: &[u8]) -> Vec<u32> {
    body.chunks(4)
        .map(|c| {
            c.iter().fold(0u32, |h, b| h.wrapping_mul(257).wrapping_add(u32::from(*b))) % 151_000
        })
        .collect()
}

struct Upstream {
    model: String,
    calls: Arc<UpstreamCalls>,
}

async fn answer(State(u): State<Arc<Upstream>>, method: Method, uri: Uri, body: Bytes) -> Response {
    let path = uri.path();
    let json = |v: serde_json::Value| axum::Json(v).into_response();
    if method == Method::GET {
        u.calls.add(3);
        return match path {
            "/health" => "ok".into_response(),
            "/v1/models" => {
                json(json!({"object": "list", "data": [{"id": u.model, "object": "model",
                "created": 0, "owned_by": "proxybench", "root": u.model, "max_model_len": 40960}]}))
            }
            "/get_model_info" => json(json!({"model_path": u.model, "tokenizer_path": u.model,
                "is_generation": true})),
            "/get_server_info" => json(json!({"model_path": u.model, "tokenizer_path": u.model})),
            "/metrics" => {
                let m = &u.model;
                format!("vllm:num_requests_running{{model_name=\"{m}\"}} 0\nvllm:num_requests_waiting{{model_name=\"{m}\"}} 0\nvllm:kv_cache_usage_perc{{model_name=\"{m}\"}} 0\n").into_response()
            }
            _ => StatusCode::NOT_FOUND.into_response(),
        };
    }
    // The body is read whole before any answer, as an engine does (an answer before the body
    // is read makes the server close the connection under the proxy's feet).
    if path == "/tokenize" {
        u.calls.add(1);
        let tokens = fake_tokens(&body);
        return json(json!({"count": tokens.len(), "max_model_len": 40960, "tokens": tokens}));
    }
    if path.ends_with("/render") {
        u.calls.add(2);
        return StatusCode::NOT_FOUND.into_response();
    }
    u.calls.add(if path.ends_with("/completions") { 0 } else { 4 });
    ([("content-type", "application/json")], RESPONSE).into_response()
}

/// Starts `n` upstreams serving `model` on loopback; their `ip:port` addresses and the shared
/// call counts.
pub async fn start(n: usize, model: &str) -> anyhow::Result<(Vec<String>, Arc<UpstreamCalls>)> {
    let calls = Arc::new(UpstreamCalls::default());
    let state = Arc::new(Upstream { model: model.to_owned(), calls: calls.clone() });
    let mut addrs = Vec::new();
    for _ in 0..n {
        let app = axum::Router::new().fallback(answer).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        addrs.push(listener.local_addr()?.to_string());
        tokio::spawn(async move { axum::serve(listener, app).await });
    }
    Ok((addrs, calls))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_tokens_scale_with_the_body_and_differ_where_it_does() {
        let a = fake_tokens(b"{\"messages\":[{\"content\":\"1 word word\"}]}");
        let b = fake_tokens(b"{\"messages\":[{\"content\":\"2 word word\"}]}");
        // 40 bytes, the number at byte 25: 10 tokens, the first 6 equal, the 7th not.
        assert_eq!(a.len(), 10);
        assert_eq!(a[..6], b[..6]);
        assert_ne!(a[6], b[6]);
        assert!(a.iter().all(|t| *t < 151_000));
    }

    #[tokio::test]
    async fn answers_what_the_routers_ask_and_counts_it() {
        let (addrs, calls) = start(2, "qwen3").await.expect("upstreams");
        let http = reqwest::Client::new();
        let url = |p: &str| format!("http://{}{p}", addrs[1]);
        let models: serde_json::Value =
            http.get(url("/v1/models")).send().await.unwrap().json().await.unwrap();
        assert_eq!(models["data"][0]["id"], "qwen3");
        for p in ["/health", "/get_model_info", "/get_server_info", "/metrics"] {
            assert!(http.get(url(p)).send().await.unwrap().status().is_success(), "{p}");
        }
        assert_eq!(http.get(url("/version")).send().await.unwrap().status(), 404);
        let r = http.post(url("/v1/chat/completions/render")).body("{}").send().await.unwrap();
        assert_eq!(r.status(), 404);
        let body = r#"{"model":"qwen3","messages":[{"role":"user","content":"hi"}]}"#;
        let tok: serde_json::Value =
            http.post(url("/tokenize")).body(body).send().await.unwrap().json().await.unwrap();
        assert_eq!(tok["count"], body.len().div_ceil(4));
        let chat: serde_json::Value = http
            .post(url("/v1/chat/completions"))
            .body(body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(chat["choices"][0]["finish_reason"], "stop");
        // chat, tokenize, render, GETs, other.
        assert_eq!(calls.snapshot(), [1, 1, 1, 6, 0]);
    }

    #[test]
    fn calls_per_request_name_the_kinds_seen() {
        let before = [10, 0, 0, 5, 0];
        let after = [20, 20, 20, 5, 0];
        let got = per_request(before, after, 10);
        assert_eq!(
            got,
            vec![
                ("chat".to_string(), 1.0),
                ("tokenize".to_string(), 2.0),
                ("render".to_string(), 2.0)
            ]
        );
        assert!(per_request(before, before, 0).is_empty());
    }
}
