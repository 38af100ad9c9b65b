//! The updater's HTTP surface (loopback by default): `/status` (JSON), `/metrics`
//! (Prometheus), `/v1/snapshot?since=V` (binary: a `kvroute_core::wire::delta` from V, or a full
//! `kvroute_core::wire::snapshot`; with `wait_ms=W` a long poll that answers as soon as a newer
//! version exists, or 304 after W ms; with `peers=1&replica=R` including other replicas'
//! decisions but R's own; with `pool=1` the pool flag and removed workers of a discovered pool,
//! snapshot format 5 / delta format 4; with `health=1` the workers down; with `placement=1` the
//! workers' discovered placements with their age; with `arrivals=1` other replicas' loads carry
//! their arrival rates), `POST /v1/peers` (a `kvroute_core::wire::peers::PeerReport` from an Envoy
//! replica; 204), and the models' tokenizer bundles: `/v1/bundles` (JSON list) and
//! `/v1/bundles/{fingerprint}/{part}` (binary: part `part` of
//! `kvroute_core::wire::bundle::BundleBlob::encode()`, header `x-kvroute-bundle-parts`). Snapshots
//! and bundles require the shared token in `x-kvroute-token`, so that knowledge only ever comes
//! from the updater.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State as AxState};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::conns::{same, ConnStats, TOKEN_HEADER};
use crate::publish::Answer;
use crate::state::State;

pub mod metrics;

/// Longest long poll a caller may ask for (`wait_ms`).
pub const MAX_WAIT_MS: u64 = 30_000;
/// Response header of a bundle part: how many parts the whole bundle has.
pub const BUNDLE_PARTS_HEADER: &str = "x-kvroute-bundle-parts";

#[derive(Clone)]
struct Ctx {
    state: Arc<State>,
    token: Arc<str>,
    /// The connection counters, when served by [`crate::conns::serve`].
    conns: Option<Arc<ConnStats>>,
}

pub fn router(state: Arc<State>, token: &str) -> Router {
    router_with(state, token, None)
}

/// [`router`] whose `/status` (`http`) and `/metrics` also show the connection counters.
pub fn router_with(state: Arc<State>, token: &str, conns: Option<Arc<ConnStats>>) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/v1/snapshot", get(snapshot))
        .route("/v1/peers", post(peers))
        .route("/v1/bundles", get(bundles))
        .route("/v1/bundles/{fingerprint}/{part}", get(bundle_part))
        .with_state(Ctx { state, token: token.into(), conns })
}

async fn status(AxState(c): AxState<Ctx>) -> Response {
    let mut status = c.state.status();
    if let (Some(conns), Some(o)) = (&c.conns, status.as_object_mut()) {
        o.insert("http".into(), conns.status());
    }
    Json(status).into_response()
}

/// The 401 answer when the token is missing or wrong.
fn unauthorized(c: &Ctx, headers: &HeaderMap) -> Option<Response> {
    let given = headers.get(TOKEN_HEADER).map(|v| v.as_bytes()).unwrap_or_default();
    (!same(given, c.token.as_bytes()))
        .then(|| (StatusCode::UNAUTHORIZED, "missing or wrong x-kvroute-token\n").into_response())
}

/// `{"bundles": [{"model", "fingerprint" (16 lowercase hex), "parts", "bytes"}]}`, one entry
/// per configured model, sorted by model name.
async fn bundles(AxState(c): AxState<Ctx>, headers: HeaderMap) -> Response {
    if let Some(r) = unauthorized(&c, &headers) {
        return r;
    }
    let list: Vec<serde_json::Value> = c
        .state
        .models()
        .iter()
        .map(|m| {
            serde_json::json!({
                "model": m.name,
                "fingerprint": format!("{:016x}", m.fingerprint()),
                "parts": m.parts(),
                "bytes": m.encoded.len(),
            })
        })
        .collect();
    Json(serde_json::json!({ "bundles": list })).into_response()
}

/// The fingerprint in a bundle path: exactly 16 lowercase hex digits.
fn fingerprint(s: &str) -> Option<u64> {
    let hex = s.len() == 16 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    hex.then(|| u64::from_str_radix(s, 16).ok()).flatten()
}

/// Part `part` of the bundle whose fingerprint is `fingerprint`; 404 when either is unknown.
async fn bundle_part(
    AxState(c): AxState<Ctx>,
    Path((fp, part)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = unauthorized(&c, &headers) {
        return r;
    }
    let model = fingerprint(&fp).and_then(|f| c.state.models().by_fingerprint(f));
    let index = part.parse::<usize>().ok().filter(|_| part.bytes().all(|b| b.is_ascii_digit()));
    let found = model.zip(index).and_then(|(m, i)| {
        kvroute_core::wire::bundle::part(&m.encoded, i).map(|p| (m.parts(), p.to_vec()))
    });
    match found {
        Some((parts, body)) => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            [(BUNDLE_PARTS_HEADER, parts.to_string())],
            body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such bundle or part\n").into_response(),
    }
}

#[derive(serde::Deserialize)]
struct Since {
    since: Option<u64>,
    /// Long poll: wait up to this long for a version newer than `since`.
    wait_ms: Option<u64>,
    /// `1`: include other replicas' decisions.
    peers: Option<u8>,
    /// The caller's replica id: its own decisions are left out.
    replica: Option<u64>,
    /// `1`: the caller reads the pool flag and removed workers (snapshot format 5, delta 4).
    pool: Option<u8>,
    /// `1`: the caller reads the list of workers down (Envoy's health checks dropped them).
    health: Option<u8>,
    /// `1`: the caller reads the workers' placements (site, zone, rack, node, with their age).
    placement: Option<u8>,
    /// `1`: the caller reads other replicas' arrival rates in their loads.
    arrivals: Option<u8>,
}

/// A report of an Envoy replica's decisions and load: 204, 400 when malformed, 413 when too
/// large, 429 past the replica bound. Published (and waiting long polls answered) at once.
async fn peers(AxState(c): AxState<Ctx>, headers: HeaderMap, body: Body) -> Response {
    if let Some(r) = unauthorized(&c, &headers) {
        return r;
    }
    let max = c.state.limits.peers.max_report_bytes;
    let Ok(bytes) = axum::body::to_bytes(body, max).await else {
        c.state.peer_refused();
        return (StatusCode::PAYLOAD_TOO_LARGE, "peer report too large\n").into_response();
    };
    let limits = kvroute_core::wire::DecodeLimits::default();
    let report = match kvroute_core::wire::peers::PeerReport::decode_with(&bytes, &limits) {
        Ok(r) => r,
        Err(e) => {
            c.state.peer_refused();
            return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response();
        }
    };
    match c.state.peer_report(report) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => (StatusCode::TOO_MANY_REQUESTS, format!("{e}\n")).into_response(),
    }
}

/// 304 when the caller already has the current version (after waiting up to `wait_ms` for a
/// newer one), else the delta from its version (`since`) when the updater still has it, else
/// the full snapshot.
async fn snapshot(
    AxState(c): AxState<Ctx>,
    Query(q): Query<Since>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = unauthorized(&c, &headers) {
        return r;
    }
    let replica = (q.peers == Some(1)).then_some(q.replica.unwrap_or(0));
    let wait = std::time::Duration::from_millis(q.wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
    let deadline = tokio::time::Instant::now() + wait;
    let answer = loop {
        // Registered before the check: a change published in between still wakes it.
        let changed = c.state.changed();
        let (pool, health, placed) =
            (q.pool == Some(1), q.health == Some(1), q.placement == Some(1));
        let answer = c.state.answer_query(q.since, replica, pool, health, placed);
        let answer = if q.arrivals == Some(1) { answer } else { answer.without_arrivals() };
        match answer {
            Answer::NotModified if tokio::time::Instant::now() < deadline => {
                if tokio::time::timeout_at(deadline, changed).await.is_err() {
                    break Answer::NotModified;
                }
            }
            other => break other,
        }
    };
    let (kind, version, body) = match answer {
        Answer::NotModified => return StatusCode::NOT_MODIFIED.into_response(),
        Answer::Delta(d) => ("delta", d.to_version, d.encode()),
        Answer::Full(s) => ("full", s.version, s.encode()),
    };
    (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        [
            ("x-kvroute-snapshot-version", version.to_string()),
            ("x-kvroute-snapshot-kind", kind.into()),
        ],
        body,
    )
        .into_response()
}

async fn metrics(AxState(c): AxState<Ctx>) -> Response {
    let text = metrics::render(&c.state, c.conns.as_deref());
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response()
}
