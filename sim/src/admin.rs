//! Fault injection, on a loopback-only admin port per worker:
//!
//! | request | effect |
//! |---|---|
//! | `POST /admin/crash` | the worker's HTTP, event and replay ports go away |
//! | `POST /admin/restart` | start again with an empty cache; event sequence back to 0 |
//! | `POST /admin/stall?ms=N` | the engine makes no step for N ms |
//! | `POST /admin/slow?factor=F` | every step takes F times its profile time from now on (F = 1 restores; until a restart) |
//! | `POST /admin/evict?percent=P` | evict P % of the free cached blocks (`BlockRemoved`) |
//! | `POST /admin/evict?all=true` | reset the prefix cache (`AllBlocksCleared`; 409 while busy) |
//! | `POST /admin/drop-events?count=N` | the next N event batches are not published (as past PUB's high-water mark); replay still has them |
//! | `POST /admin/mute-events?ms=N` | an event outage: nothing is published on the PUB socket for N ms (0 ends it); replay keeps its most recent batches |
//! | `POST /admin/misconfig` `{"chat_template": "...", "block_size": N}` | serve another template / cache with another block size than announced, from the next restart |
//! | `GET /admin/status` | JSON: up, ports, next event sequence, cached blocks |
//! | `GET /admin/events?from=SEQ` | JSON: the batches still in the replay buffer from SEQ on, as published (`[{"seq", "batch"}]`, the msgpack batch as JSON) |

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::oneshot;

use crate::engine::Command;
use crate::worker::Worker;

pub fn router(w: Arc<Worker>) -> Router {
    Router::new()
        .route("/admin/crash", post(crash))
        .route("/admin/restart", post(restart))
        .route("/admin/stall", post(stall))
        .route("/admin/slow", post(slow))
        .route("/admin/evict", post(evict))
        .route("/admin/drop-events", post(drop_events))
        .route("/admin/mute-events", post(mute_events))
        .route("/admin/misconfig", post(misconfig))
        .route("/admin/status", get(status))
        .route("/admin/events", get(events))
        .with_state(w)
}

fn unavailable() -> Response {
    (StatusCode::CONFLICT, Json(json!({"error": "worker is crashed; POST /admin/restart"})))
        .into_response()
}

async fn crash(State(w): State<Arc<Worker>>) -> Response {
    w.crash().await;
    Json(json!({"crashed": true})).into_response()
}

async fn restart(State(w): State<Arc<Worker>>) -> Response {
    match w.start().await {
        Ok(p) => Json(json!({"restarted": true, "http_port": p.http, "events_port": p.events, "replay_port": p.replay})).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": format!("{e:#}")}))).into_response(),
    }
}

#[derive(Deserialize)]
struct StallQ {
    ms: u64,
}

async fn stall(State(w): State<Arc<Worker>>, Query(q): Query<StallQ>) -> Response {
    let Some((s, _)) = w.current().await else {
        return unavailable();
    };
    s.engine.command(Command::Stall(Duration::from_millis(q.ms)));
    Json(json!({"stalled_ms": q.ms})).into_response()
}

#[derive(Deserialize)]
struct SlowQ {
    factor: f64,
}

async fn slow(State(w): State<Arc<Worker>>, Query(q): Query<SlowQ>) -> Response {
    if !(q.factor.is_finite() && (0.01..=100.0).contains(&q.factor)) {
        let e = json!({"error": "give factor=0.01..100"});
        return (StatusCode::BAD_REQUEST, Json(e)).into_response();
    }
    let Some((s, _)) = w.current().await else {
        return unavailable();
    };
    s.engine.command(Command::SetSpeedup(w.spec.speedup / q.factor));
    Json(json!({"slowed_by": q.factor})).into_response()
}

#[derive(Deserialize)]
struct EvictQ {
    percent: Option<f64>,
    all: Option<bool>,
}

async fn evict(State(w): State<Arc<Worker>>, Query(q): Query<EvictQ>) -> Response {
    let Some((s, _)) = w.current().await else {
        return unavailable();
    };
    if q.all == Some(true) {
        let (tx, rx) = oneshot::channel();
        s.engine.command(Command::Reset { reply: tx });
        return match rx.await {
            Ok(true) => Json(json!({"cleared": true})).into_response(),
            _ => (
                StatusCode::CONFLICT,
                Json(json!({"error": "requests hold blocks; reset refused"})),
            )
                .into_response(),
        };
    }
    let Some(pct) = q.percent.filter(|p| (0.0..=100.0).contains(p)) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "give percent=0..100 or all=true"})),
        )
            .into_response();
    };
    let (tx, rx) = oneshot::channel();
    s.engine.command(Command::Evict { fraction: pct / 100.0, reply: tx });
    Json(json!({"evicted_blocks": rx.await.unwrap_or(0)})).into_response()
}

#[derive(Deserialize)]
struct MuteQ {
    ms: u64,
}

async fn mute_events(State(w): State<Arc<Worker>>, Query(q): Query<MuteQ>) -> Response {
    let Some((_, log)) = w.current().await else {
        return unavailable();
    };
    log.mute_for(Duration::from_millis(q.ms));
    Json(json!({"muted_ms": q.ms, "next_seq": log.next_seq()})).into_response()
}

#[derive(Deserialize)]
struct DropQ {
    count: u64,
}

async fn drop_events(State(w): State<Arc<Worker>>, Query(q): Query<DropQ>) -> Response {
    let Some((_, log)) = w.current().await else {
        return unavailable();
    };
    log.drop_remaining.store(q.count, std::sync::atomic::Ordering::SeqCst);
    Json(json!({"dropping_batches": q.count, "next_seq": log.next_seq()})).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MisconfigBody {
    chat_template: Option<String>,
    block_size: Option<usize>,
}

async fn misconfig(State(w): State<Arc<Worker>>, Json(b): Json<MisconfigBody>) -> Response {
    if b.block_size == Some(0) {
        return (StatusCode::BAD_REQUEST, Json(json!({"error": "block_size must be > 0"})))
            .into_response();
    }
    let mut m = w.misconfig.lock().unwrap_or_else(|e| e.into_inner());
    m.chat_template = b.chat_template;
    m.block_size = b.block_size;
    Json(json!({"applies": "at the next POST /admin/restart"})).into_response()
}

async fn status(State(w): State<Arc<Worker>>) -> Response {
    let ports = *w.ports.lock().unwrap_or_else(|e| e.into_inner());
    let cur = w.current().await;
    let (up, next_seq, cached) = match &cur {
        Some((s, log)) => {
            let cached = s.engine.stats.lock().map(|st| st.cached_blocks).unwrap_or(0);
            (true, log.next_seq(), cached)
        }
        None => (false, 0, 0),
    };
    Json(json!({"up": up, "http_port": ports.http, "events_port": ports.events,
        "replay_port": ports.replay, "next_seq": next_seq, "cached_blocks": cached}))
    .into_response()
}

#[derive(Deserialize)]
struct EventsQ {
    #[serde(default)]
    from: u64,
}

/// A msgpack value as JSON (binary as an array of bytes, map keys as strings).
fn to_json(v: &rmpv::Value) -> serde_json::Value {
    use rmpv::Value as M;
    match v {
        M::Nil => serde_json::Value::Null,
        M::Boolean(b) => json!(b),
        M::Integer(i) => i.as_u64().map_or_else(|| json!(i.as_i64()), |u| json!(u)),
        M::F32(f) => json!(f),
        M::F64(f) => json!(f),
        M::String(s) => json!(s.as_str()),
        M::Binary(b) => json!(b),
        M::Array(a) => serde_json::Value::Array(a.iter().map(to_json).collect()),
        M::Map(m) => serde_json::Value::Object(
            m.iter()
                .map(|(k, v)| (k.as_str().map_or_else(|| k.to_string(), str::to_owned), to_json(v)))
                .collect(),
        ),
        M::Ext(_, b) => json!(b),
    }
}

async fn events(State(w): State<Arc<Worker>>, Query(q): Query<EventsQ>) -> Response {
    let Some((_, log)) = w.current().await else {
        return unavailable();
    };
    let batches: Vec<serde_json::Value> = log
        .replay_from(q.from)
        .iter()
        .map(|(seq, payload)| {
            let batch = rmpv::decode::read_value(&mut &payload[..]).map(|v| to_json(&v));
            json!({"seq": seq, "batch": batch.unwrap_or(serde_json::Value::Null)})
        })
        .collect();
    Json(json!(batches)).into_response()
}
