//! An OpenAI client that records what a routing study needs: status, serving worker, the
//! filter's decision header, time to first token, every chunk's arrival, and usage.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use kvroute_core::decision::usage::UsageScanner;
use serde_json::Value;

/// One finished request.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    /// The sim's `x-worker-id`: who actually served.
    pub worker: Option<String>,
    /// The filter's `x-kvroute-decision`, if exposed.
    pub decision: Option<String>,
    /// Time to the first body chunk (the first token when streaming).
    pub ttft: Duration,
    pub total: Duration,
    /// Arrival time of each body chunk, from the start of the request.
    pub chunks: Vec<Duration>,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// The body when it was not streamed (errors, JSON responses).
    pub body: String,
}

impl Reply {
    /// A field of the decision header, e.g. `predicted_cached_tokens`.
    pub fn decision_field(&self, key: &str) -> Option<String> {
        decision_field(self.decision.as_ref()?, key).map(str::to_owned)
    }

    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }
}

/// A field of an `x-kvroute-decision` header value (`key=value; key=value; ...`).
pub fn decision_field<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    header.split("; ").find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then_some(v)
    })
}

/// Sends `body` to `url` + `path` with extra `headers`, reading the response to the end.
pub async fn send(
    http: &reqwest::Client,
    url: &str,
    path: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> anyhow::Result<Reply> {
    let start = Instant::now();
    let mut req =
        http.post(format!("{url}{path}")).header("content-type", "application/json").body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.context("sending request")?;
    let status = resp.status().as_u16();
    let header =
        |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let worker = header("x-worker-id");
    let decision = header("x-kvroute-decision");
    let streaming = header("content-type").is_some_and(|c| c.starts_with("text/event-stream"));
    let mut scanner = UsageScanner::default();
    let mut chunks = Vec::new();
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("reading response body")?;
        chunks.push(start.elapsed());
        scanner.push(&chunk);
        if !streaming {
            body.extend_from_slice(&chunk);
        }
    }
    let usage = scanner.usage();
    Ok(Reply {
        status,
        worker,
        decision,
        ttft: chunks.first().copied().unwrap_or_else(|| start.elapsed()),
        total: start.elapsed(),
        chunks,
        prompt_tokens: usage.prompt_tokens,
        cached_tokens: usage.cached_tokens,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// `send` to `/v1/chat/completions` with a JSON body.
pub async fn chat(http: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<Reply> {
    send(http, url, "/v1/chat/completions", body.to_string().into_bytes(), &[]).await
}
