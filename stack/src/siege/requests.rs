//! Attacks a single client makes with its requests, and the probe every attack ends with:
//!
//! - [`trailers`]: HTTP/2 requests whose stream ends with trailers (not with the body) must be
//!   routed, shed and counted in flight exactly like the same requests without them;
//! - [`encoded_paths`]: spellings of `/v1/chat/completions` (percent-encoded, `%2F`, dot
//!   segments, doubled or trailing slashes), over HTTP/1.1 and h2c: none may be served by a
//!   worker without kvroute deciding (see `siege::envoy::try_path`);
//! - [`odd_numbers`]: `max_tokens` of 2.0, `"16"` and 2^64-1, `"prompt": [[]]`, `max_tokens`
//!   2.5: each answered (within a bound) with the status vLLM 0.33 gives it;
//! - [`after_probe`]: normal requests after an attack, counted as succeeded and routed with
//!   knowledge (200, a decision with `fallback=none`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::client;
use crate::rawhttp::{self, Proto, RawRequest, RawResponse};
use crate::siege::envoy::{self, EnvoyOutcome, PathOutcome};
use crate::stack::Stack;

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";
/// Longest any one request of these attacks may take to be answered.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(15);
/// The filter's admission header: a time-to-first-token deadline no worker can meet sheds.
const DEADLINE: &str = "x-ttft-deadline-ms";

fn listener(stack: &Stack) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], stack.envoy.listen_port))
}

fn chat_body(model: &str, i: usize, max_tokens: u64, stream: bool) -> String {
    json!({"model": model, "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": format!("siege request {i}: tell me a story")}]})
    .to_string()
}

/// Whether a response is routed with knowledge: a decision naming a worker, `fallback=none`.
fn routed(r: &RawResponse) -> bool {
    let d = r.header("x-kvroute-decision").unwrap_or_default();
    client::decision_field(&d, "worker").is_some()
        && client::decision_field(&d, "fallback") == Some("none")
}

/// The same request with or without trailers.
fn with_trailers(req: RawRequest, trailers: bool) -> RawRequest {
    if trailers {
        req.trailer("x-siege-trailer", "1").trailer("x-checksum", "deadbeef")
    } else {
        req
    }
}

/// What requests ending with trailers got, next to the same requests without.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrailersSide {
    /// Small chat requests sent, and of them those answered 200 and routed with knowledge.
    pub sent: usize,
    pub routed: usize,
    /// A request with an unmeetable TTFT deadline: its status (429 when shed).
    pub shed_status: Option<u16>,
    /// A slow stream: the filter's in-flight gauge rose while it ran and fell back after.
    pub counted: bool,
    /// Requests not answered within [`ANSWER_WITHIN`], or answered 5xx.
    pub errors: usize,
}

/// [`trailers`]' result: with and without.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrailersReport {
    pub with: TrailersSide,
    pub without: TrailersSide,
}

impl TrailersReport {
    /// Routed, shed and counted as without them, and everything routed and shed at all.
    pub fn alike(&self) -> bool {
        let (w, wo) = (&self.with, &self.without);
        w.routed == w.sent
            && wo.routed == wo.sent
            && w.sent > 0
            && w.shed_status == Some(429)
            && w.shed_status == wo.shed_status
            && w.counted
            && wo.counted
    }
}

/// The sum of the filter's per-worker in-flight gauges.
async fn inflight(stack: &Stack) -> Option<f64> {
    let m = stack.envoy.prometheus().await.ok()?;
    Some(
        m.iter()
            .filter(|(k, _)| k.starts_with("kvroute_worker_inflight_requests"))
            .map(|(_, v)| v)
            .sum(),
    )
}

/// Sends `n` small chat requests, an unmeetable-deadline one and a slow stream over h2c, with
/// trailers or not. `stream_tokens`: the slow stream's length (its workers must take long
/// enough per token for the gauge to be read while it runs).
async fn trailers_side(
    stack: &Stack,
    model: &str,
    n: usize,
    stream_tokens: u64,
    trailers: bool,
) -> TrailersSide {
    let addr = listener(stack);
    let mut side = TrailersSide::default();
    let offset = if trailers { 0 } else { 10_000 };
    for i in 0..n {
        let req =
            with_trailers(RawRequest::post(CHAT, chat_body(model, offset + i, 2, false)), trailers);
        side.sent += 1;
        match rawhttp::send(addr, Proto::H2c, &req, ANSWER_WITHIN).await {
            Ok(r) if r.status < 500 => side.routed += usize::from(r.status == 200 && routed(&r)),
            _ => side.errors += 1,
        }
    }
    let shed = RawRequest::post(CHAT, chat_body(model, offset + n, 2, false)).header(DEADLINE, "1");
    match rawhttp::send(addr, Proto::H2c, &with_trailers(shed, trailers), ANSWER_WITHIN).await {
        Ok(r) => side.shed_status = Some(r.status),
        Err(_) => side.errors += 1,
    }
    // The stream runs in its own task; the gauge is read while it does.
    let slow = with_trailers(
        RawRequest::post(CHAT, chat_body(model, offset + n + 1, stream_tokens, true)),
        trailers,
    );
    let running =
        tokio::spawn(async move { rawhttp::send(addr, Proto::H2c, &slow, ANSWER_WITHIN).await });
    let mut rose = false;
    while !running.is_finished() {
        if inflight(stack).await.is_some_and(|v| v >= 1.0) {
            rose = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let finished = running.await.ok().and_then(Result::ok);
    if finished.as_ref().is_none_or(|r| r.status != 200) {
        side.errors += 1;
    }
    let fell = crate::eventually("in-flight back to 0", Duration::from_secs(5), || async {
        inflight(stack).await.filter(|v| *v == 0.0)
    })
    .await
    .is_ok();
    side.counted = rose && fell;
    side
}

/// Requests ending with trailers against the same without (see the module doc). The stack's
/// workers should take some milliseconds per token (`--step-floor-ms`) so that a
/// `stream_tokens`-token stream is seen in flight.
pub async fn trailers(stack: &Stack, model: &str, n: usize, stream_tokens: u64) -> TrailersReport {
    let without = trailers_side(stack, model, n, stream_tokens, false).await;
    let with = trailers_side(stack, model, n, stream_tokens, true).await;
    TrailersReport { with, without }
}

/// One odd path over one protocol, and what it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTry {
    pub path: &'static str,
    pub proto: Proto,
    pub outcome: PathOutcome,
}

impl PathTry {
    /// A worker served it (2xx) though kvroute did not decide: the bypass the attack looks for.
    pub fn bypassed(&self) -> bool {
        matches!(self.outcome, PathOutcome::PassedThrough(s) if (200..300).contains(&s))
    }
}

/// Every spelling of `siege::envoy::ODD_PATHS` over HTTP/1.1 and h2c.
pub async fn encoded_paths(stack: &Stack, model: &str) -> Vec<PathTry> {
    let mut out = Vec::new();
    for path in envoy::ODD_PATHS {
        for proto in [Proto::Http1, Proto::H2c] {
            let outcome = envoy::try_path(listener(stack), proto, path, model).await;
            out.push(PathTry { path, proto, outcome });
        }
    }
    out
}

/// One odd-number request: what vLLM answers it, and what it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OddTry {
    pub name: &'static str,
    /// vLLM 0.33's status for it.
    pub want: u16,
    /// The status, `None` when not answered within [`ANSWER_WITHIN`].
    pub got: Option<u16>,
    /// Whether the filter routed it with knowledge (only asked of the accepted ones).
    pub routed: bool,
    pub took: Duration,
}

impl OddTry {
    /// Answered in time with vLLM's status, and routed with knowledge when it is served.
    pub fn as_vllm(&self) -> bool {
        self.got == Some(self.want) && (self.want != 200 || self.routed)
    }
}

/// The odd numbers below (`max_tokens` as 2.0, "16", 1e1, 2^64-1, ...), each sent once over
/// HTTP/1.1.
pub async fn odd_numbers(stack: &Stack, model: &str) -> Vec<OddTry> {
    let chat = |max_tokens: Value| {
        json!({"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "siege: odd numbers"}]})
    };
    let cases: [(&'static str, &'static str, Value, u16); 7] = [
        ("max_tokens 2.0", CHAT, chat(json!(2.0)), 200),
        ("max_tokens \"16\"", CHAT, chat(json!("16")), 200),
        ("max_tokens 1e1", CHAT, chat(json!(1e1)), 200),
        ("max_tokens 2^64-1", CHAT, chat(json!(u64::MAX)), 400),
        ("max_tokens 2.5", CHAT, chat(json!(2.5)), 400),
        ("prompt [[]]", COMPLETIONS, json!({"model": model, "prompt": [[]], "max_tokens": 2}), 400),
        (
            "prompt [[], [1, 2]]",
            COMPLETIONS,
            json!({"model": model, "prompt": [[], [1, 2]], "max_tokens": 2}),
            400,
        ),
    ];
    let mut out = Vec::new();
    for (name, path, body, want) in cases {
        let req = RawRequest::post(path, body.to_string());
        let t0 = Instant::now();
        let r = rawhttp::send(listener(stack), Proto::Http1, &req, ANSWER_WITHIN).await.ok();
        out.push(OddTry {
            name,
            want,
            got: r.as_ref().map(|r| r.status),
            routed: r.as_ref().is_some_and(routed),
            took: t0.elapsed(),
        });
    }
    out
}

/// Normal requests after an attack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct After {
    pub sent: usize,
    /// Answered 200 and routed with knowledge.
    pub ok_routed: usize,
    /// Not answered, or answered with an error status.
    pub failed: usize,
}

/// Sends `n` small chat requests one after the other (each bounded by `try_timeout`) and
/// classifies them (`siege::envoy::EnvoyOutcome`).
pub async fn after_probe(
    base_url: &str,
    model: &str,
    n: usize,
    try_timeout: Duration,
) -> anyhow::Result<After> {
    let http = reqwest::Client::builder().timeout(try_timeout).build()?;
    let mut after = After::default();
    for i in 0..n {
        let r = client::chat(&http, base_url, &envoy::chat_body(model, 2_000_000 + i)).await;
        after.sent += 1;
        match EnvoyOutcome::of(&r) {
            EnvoyOutcome::Routed => after.ok_routed += 1,
            EnvoyOutcome::Failed(_) => after.failed += 1,
            EnvoyOutcome::LoadOnly(_) | EnvoyOutcome::PassedThrough => {}
        }
    }
    Ok(after)
}
