//! The updater's HTTP surface (loopback by default): `/status` (JSON), `/metrics`
//! (Prometheus), `/v1/snapshot?since=V` (binary: a `kvroute_core::delta` from V, or a full
//! `kvroute_core::snapshot`), and the models' tokenizer bundles: `/v1/bundles` (JSON list) and
//! `/v1/bundles/{fingerprint}/{part}` (binary: part `part` of
//! `kvroute_core::bundle::BundleFiles::encode()`, header `x-kvroute-bundle-parts`). Snapshots
//! and bundles require the shared token in `x-kvroute-token`, so that knowledge only ever comes
//! from the updater.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Path, Query, State as AxState};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::publish::Answer;
use crate::state::State;

/// Header carrying the shared token.
pub const TOKEN_HEADER: &str = "x-kvroute-token";
/// Response header of a bundle part: how many parts the whole bundle has.
pub const BUNDLE_PARTS_HEADER: &str = "x-kvroute-bundle-parts";

#[derive(Clone)]
struct Ctx {
    state: Arc<State>,
    token: Arc<str>,
}

pub fn router(state: Arc<State>, token: &str) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/v1/snapshot", get(snapshot))
        .route("/v1/bundles", get(bundles))
        .route("/v1/bundles/{fingerprint}/{part}", get(bundle_part))
        .with_state(Ctx { state, token: token.into() })
}

async fn status(AxState(c): AxState<Ctx>) -> Response {
    Json(c.state.status()).into_response()
}

/// Constant-time comparison, so the token cannot be guessed byte by byte from timings.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
        kvroute_core::bundle::part(&m.encoded, i).map(|p| (m.parts(), p.to_vec()))
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
}

/// 304 when the caller already has the current version, else the delta from its version
/// (`since`) when the updater still has it, else the full snapshot.
async fn snapshot(
    AxState(c): AxState<Ctx>,
    Query(q): Query<Since>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = unauthorized(&c, &headers) {
        return r;
    }
    let (kind, version, body) = match c.state.answer(q.since) {
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
    let status = c.state.status();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# TYPE kvroute_updater_snapshot_version gauge\nkvroute_updater_snapshot_version {}",
        c.state.version()
    );
    let empty = serde_json::Map::new();
    let workers = status["workers"].as_object().unwrap_or(&empty);
    for name in [
        "batches",
        "events",
        "gaps",
        "replays",
        "resyncs",
        "resubscribes",
        "orphans",
        "block_size_mismatches",
        "rollovers",
        "replays_cut",
        "bad_batches",
    ] {
        let _ = writeln!(o, "# TYPE kvroute_updater_{name}_total counter");
        for (w, v) in workers {
            let _ = writeln!(
                o,
                "kvroute_updater_{name}_total{{worker=\"{w}\"}} {}",
                v["stats"][name].as_u64().unwrap_or(0)
            );
        }
    }
    let _ = writeln!(o, "# TYPE kvroute_updater_caps_hit_total counter");
    for (w, v) in workers {
        for cap in crate::limits::Cap::ALL {
            let name = cap.name();
            let _ = writeln!(
                o,
                "kvroute_updater_caps_hit_total{{worker=\"{w}\",cap=\"{name}\"}} {}",
                v["stats"]["caps_hit"][name].as_u64().unwrap_or(0)
            );
        }
    }
    let _ = writeln!(o, "# TYPE kvroute_updater_engine_keys gauge");
    for (w, v) in workers {
        let n = v["engine_keys"].as_u64().unwrap_or(0);
        let _ = writeln!(o, "kvroute_updater_engine_keys{{worker=\"{w}\"}} {n}");
    }
    let _ = writeln!(o, "# TYPE kvroute_updater_blocks gauge");
    for (w, v) in workers {
        if let Some(tiers) = v["blocks"].as_object() {
            for (tier, n) in tiers {
                let _ = writeln!(
                    o,
                    "kvroute_updater_blocks{{worker=\"{w}\",tier=\"{tier}\"}} {}",
                    n.as_u64().unwrap_or(0)
                );
            }
        }
    }
    let _ = writeln!(o, "# TYPE kvroute_updater_connected gauge");
    for (w, v) in workers {
        let _ = writeln!(
            o,
            "kvroute_updater_connected{{worker=\"{w}\"}} {}",
            u8::from(v["connected"].as_bool().unwrap_or(false))
        );
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], o).into_response()
}
