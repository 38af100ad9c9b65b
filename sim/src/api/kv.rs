//! KV moved between workers, on the HTTP surface: `GET /sim/topology` (this worker's labels
//! and network settings), `POST /kv/pull` (the holder's side of a pull) and the receiver's
//! steps before a request is prefilled ([`before_prefill`]: a pull from
//! `x-kvroute-kv-source`, or a P/D prefill on `x-prefiller-host-port`). See [`crate::pull`].

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use kvroute_core::decision::request::Endpoint;
use serde_json::json;
use tokio::sync::oneshot;

use super::Serving;
use crate::cache::EngineHash;
use crate::engine::{Command, KvLookup, KvOp};
use crate::pull::{BLOCKS_HEADER, KV_SOURCE_HEADER, PREFILLER_HEADER};
use crate::topology::SimRole;

/// Largest piece of a pull's body.
const CHUNK: usize = 64 * 1024;

/// `GET /sim/topology`: `{"site", "node", "role", "client_rtt_ms", "event_delay_ms",
/// "links": {site: {"rtt_ms", "gbps"}}, "kv_bytes_per_token", "kv_wire_scale"}`.
pub(super) async fn topology(State(w): State<Arc<Serving>>) -> Response {
    let t = &w.net.topology;
    let links: serde_json::Map<String, serde_json::Value> = t
        .links
        .iter()
        .map(|(s, l)| (s.clone(), json!({"rtt_ms": l.rtt_ms, "gbps": l.gbps})))
        .collect();
    axum::Json(json!({"site": t.site, "node": t.node, "role": t.role.name(),
        "client_rtt_ms": t.client_rtt_ms, "event_delay_ms": t.event_delay_ms, "links": links,
        "kv_bytes_per_token": t.kv_bytes_per_token, "kv_wire_scale": t.kv_wire_scale,
        "kv_setup_ms": t.kv_setup_ms}))
    .into_response()
}

#[derive(serde::Deserialize)]
struct PullBody {
    hashes: Vec<EngineHash>,
    from: usize,
    wire_bytes_per_block: u64,
}

/// `POST /kv/pull` `{"hashes", "from", "wire_bytes_per_block"}`: the holder's side of a pull.
/// Answers with [`BLOCKS_HEADER`] = the leading blocks of `hashes` it holds beyond `from`,
/// and a body of that many times `wire_bytes_per_block` bytes (pacing is the receiver's).
pub(super) async fn pull(State(w): State<Arc<Serving>>, body: Bytes) -> Response {
    let Ok(q) = serde_json::from_slice::<PullBody>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            "expected {\"hashes\", \"from\", \"wire_bytes_per_block\"}",
        )
            .into_response();
    };
    let (reply, rx) = oneshot::channel();
    if !w.engine.command(Command::Kv(KvOp::Held { hashes: q.hashes, reply })) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let Ok(held) = rx.await else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let blocks = held.saturating_sub(q.from);
    let total = blocks as u64 * q.wire_bytes_per_block.min(1 << 30);
    let piece = Bytes::from(vec![0u8; CHUNK]);
    let chunks = (0..total.div_ceil(CHUNK as u64)).map(move |i| {
        let n = (total - i * CHUNK as u64).min(CHUNK as u64) as usize;
        Ok::<Bytes, std::io::Error>(piece.slice(..n))
    });
    Response::builder()
        .header(BLOCKS_HEADER, blocks)
        .header(axum::http::header::CONTENT_LENGTH, total)
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn lookup(
    w: &Serving,
    tokens: &[u32],
    salt: Option<&str>,
    lora: Option<&str>,
) -> Option<KvLookup> {
    let (reply, rx) = oneshot::channel();
    let op = KvOp::Lookup {
        tokens: tokens.to_vec(),
        salt: salt.map(str::to_owned),
        lora: lora.map(str::to_owned),
        reply,
    };
    if !w.engine.command(Command::Kv(op)) {
        return None;
    }
    rx.await.ok()
}

/// A request's identity in the cache: its tokens, salt and adapter.
pub(super) struct Prompt<'a> {
    pub tokens: &'a [u32],
    pub salt: Option<&'a str>,
    pub lora: Option<&'a str>,
}

/// Pulls from `holder` the prompt's leading blocks this worker lacks (all but the one vLLM
/// would recompute anyway) and stores them in the engine. A failure is counted and the
/// request is recomputed.
async fn pull_from(w: &Serving, holder: &str, p: &Prompt<'_>) {
    let Some(l) = lookup(w, p.tokens, p.salt, p.lora).await else {
        return;
    };
    // vLLM recomputes at least the last prompt token, so the block holding it is never reused.
    let useful = (p.tokens.len().saturating_sub(1) / l.block_size.max(1)).min(l.hashes.len());
    if l.held >= useful {
        return;
    }
    match w.net.pull(holder, &l.hashes[..useful], l.held, l.block_size).await {
        Ok(got) if got.blocks > 0 => {
            let (reply, rx) = oneshot::channel();
            let op = KvOp::Insert {
                tokens: p.tokens.to_vec(),
                salt: p.salt.map(str::to_owned),
                lora: p.lora.map(str::to_owned),
                from: l.held,
                n: got.blocks,
                reply,
            };
            if w.engine.command(Command::Kv(op)) {
                let _ = rx.await;
            }
        }
        Ok(_) => {}
        Err(_) => w.net.failed(),
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

/// What happens before a request is handed to the engine: on a decode worker given
/// [`PREFILLER_HEADER`], the prefiller prefills it and its KV is pulled from there; else,
/// given [`KV_SOURCE_HEADER`], the prefix is pulled from that holder. Neither header (or one
/// naming this worker): nothing. A failure falls back to computing the prompt here.
pub(super) async fn before_prefill(
    w: &Serving,
    headers: &HeaderMap,
    endpoint: Endpoint,
    body: &[u8],
    p: &Prompt<'_>,
) {
    let prefiller = header(headers, PREFILLER_HEADER).filter(|h| *h != w.id);
    if let (SimRole::Decode, Some(prefiller)) = (w.net.topology.role, prefiller) {
        match w.net.prefill_remote(prefiller, endpoint, body).await {
            Ok(()) => pull_from(w, prefiller, p).await,
            Err(_) => w.net.failed(),
        }
        return;
    }
    if let Some(holder) = header(headers, KV_SOURCE_HEADER).filter(|h| *h != w.id) {
        pull_from(w, holder, p).await;
    }
}

/// What a prefill worker answers a request with `kv_transfer_params.do_remote_decode` (vLLM's
/// NixlConnector: where the decode side fetches the KV): this worker's address. No block ids:
/// the simulator's pull matches blocks by content. `None` for any other request.
pub(super) fn transfer_params(id: &str, body: &[u8]) -> Option<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    if v["kv_transfer_params"]["do_remote_decode"] != true {
        return None;
    }
    let (host, port) = id.rsplit_once(':')?;
    Some(json!({"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": id,
        "remote_host": host, "remote_port": port.parse::<u16>().ok()}))
}
