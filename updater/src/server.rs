//! The updater's HTTP surface (loopback by default): `/status` (JSON), `/metrics`
//! (Prometheus), and `/v1/snapshot?since=V` (binary: a `kvroute_core::delta` from V, or a full
//! `kvroute_core::snapshot`), which requires the
//! shared token in `x-kvroute-token` so that knowledge only ever comes from the updater.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Query, State as AxState};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::publish::Answer;
use crate::state::State;

/// Header carrying the shared token.
pub const TOKEN_HEADER: &str = "x-kvroute-token";

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
        .with_state(Ctx { state, token: token.into() })
}

async fn status(AxState(c): AxState<Ctx>) -> Response {
    Json(c.state.status()).into_response()
}

/// Constant-time comparison, so the token cannot be guessed byte by byte from timings.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
    let given = headers.get(TOKEN_HEADER).map(|v| v.as_bytes()).unwrap_or_default();
    if !same(given, c.token.as_bytes()) {
        return (StatusCode::UNAUTHORIZED, "missing or wrong x-kvroute-token\n").into_response();
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
