//! The receiving side of KV moved between workers, over real loopback TCP.
//!
//! **Pull** (`x-kvroute-kv-source: host:port`, LMCache/llm-d peer-to-peer style): the receiver
//! asks the holder (`POST /kv/pull` with the engine hashes of the prompt's blocks and how many
//! it already holds); the holder answers with how many more leading blocks it has and streams
//! `bytes / --kv-wire-scale` real bytes for them. The receiver waits the link's round trip
//! plus `--kv-setup-ms`, then reads the bytes paced at `gbps / scale` on the link's clock
//! ([`LinkClocks`]: concurrent pulls over one link share it), so the transfer takes
//! `rtt + setup + size / bandwidth` of wall time for the full-size KV. The holder's cache is
//! only read.
//!
//! **P/D** (`x-prefiller-host-port`, vLLM NixlConnector + llm-d routing-sidecar style): a
//! decode worker sends the request to the prefiller with `max_tokens` 1 and
//! `kv_transfer_params.do_remote_decode`, then pulls the prompt's blocks from it as above.
//!
//! Worker-to-worker requests carry [`PEER_HEADER`], so the holder's client delay line leaves
//! them alone; they pay the link instead.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kvroute_core::decision::request::Endpoint;
use serde_json::{json, Value};
use thiserror::Error;
use tokio::time::Instant;

use crate::cache::EngineHash;
use crate::delay::PEER_HEADER;
use crate::engine::Histogram;
use crate::topology::{LinkClocks, PeerPlace, SimLink, SimTopology};

/// Request header naming the worker to pull the prompt's prefix from.
pub const KV_SOURCE_HEADER: &str = "x-kvroute-kv-source";
/// Request header naming the prefill worker of a P/D request (llm-d's routing sidecar).
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";
/// `/kv/pull` response header: how many blocks the body carries.
pub const BLOCKS_HEADER: &str = "x-kvroute-sim-blocks";

/// Longest a worker-to-worker request may take before the pull counts as failed.
const PEER_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Error)]
pub enum KvPullError {
    #[error("peer {peer}: {source}")]
    Http { peer: String, source: reqwest::Error },
    #[error("peer {peer} answered {status}")]
    Status { peer: String, status: u16 },
    #[error("peer {peer} sent {got} of {want} bytes")]
    Short { peer: String, got: u64, want: u64 },
}

/// Counters behind the `kvroute_sim:kv_pull_*` metrics.
#[derive(Debug, Default, Clone)]
pub struct PullStats {
    pub blocks: u64,
    /// Full-size KV bytes (not the scaled bytes on the wire).
    pub bytes: u64,
    pub seconds: Histogram,
    pub failures: u64,
}

/// What a finished pull moved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pulled {
    pub blocks: usize,
    pub link: SimLink,
    pub took: Duration,
}

/// A worker's network side: its topology, its links in use, its pull counters.
#[derive(Debug)]
pub struct KvNet {
    pub topology: SimTopology,
    links: LinkClocks,
    pub stats: Mutex<PullStats>,
    http: reqwest::Client,
    /// Labels of the peers asked so far.
    places: Mutex<HashMap<String, PeerPlace>>,
}

impl KvNet {
    pub fn new(topology: SimTopology) -> KvNet {
        // One connection per request: a pull is its own transfer.
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(PEER_TIMEOUT)
            .build()
            .unwrap_or_default();
        KvNet {
            topology,
            links: LinkClocks::default(),
            stats: Mutex::default(),
            http,
            places: Mutex::default(),
        }
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, PullStats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a pull (or P/D hand-over) that failed: the request is recomputed.
    pub fn failed(&self) {
        self.stats().failures += 1;
    }

    /// Whether `/metrics` shows the pull metrics: with any topology flag, or once a pull ran.
    pub fn shows_metrics(&self) -> bool {
        let st = self.stats();
        !self.topology.is_default() || st.seconds.count > 0 || st.failures > 0
    }

    /// The labels of worker `peer` (`GET /sim/topology`, asked once).
    async fn place_of(&self, peer: &str) -> Result<PeerPlace, KvPullError> {
        if let Some(s) = self.places.lock().unwrap_or_else(|e| e.into_inner()).get(peer) {
            return Ok(s.clone());
        }
        let url = format!("http://{peer}/sim/topology");
        let err = |source| KvPullError::Http { peer: peer.to_owned(), source };
        let resp = self.http.get(url).header(PEER_HEADER, "1").send().await.map_err(err)?;
        let status = resp.status();
        if !status.is_success() {
            return Err(KvPullError::Status { peer: peer.to_owned(), status: status.as_u16() });
        }
        let v: Value = resp.json().await.map_err(err)?;
        let label = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let place = PeerPlace { site: label("site"), node: label("node") };
        self.places.lock().unwrap_or_else(|e| e.into_inner()).insert(peer.into(), place.clone());
        Ok(place)
    }

    /// The link to worker `peer`, by its node or site.
    async fn link_to(&self, peer: &str) -> Result<(String, SimLink), KvPullError> {
        let place = self.place_of(peer).await?;
        Ok(self.topology.link_to(&place))
    }

    /// Pulls from `holder` the blocks of `hashes` after the first `from` (which this worker
    /// holds) that the holder has, paced on the link; returns how many arrived. The caller
    /// stores them in the engine.
    pub async fn pull(
        &self,
        holder: &str,
        hashes: &[EngineHash],
        from: usize,
        block_size: usize,
    ) -> Result<Pulled, KvPullError> {
        let t0 = Instant::now();
        let (name, link) = self.link_to(holder).await?;
        let wire_per_block = self.topology.wire_bytes_per_block(block_size);
        let err = |source| KvPullError::Http { peer: holder.to_owned(), source };
        let body = json!({"hashes": hashes, "from": from, "wire_bytes_per_block": wire_per_block});
        let mut resp = self
            .http
            .post(format!("http://{holder}/kv/pull"))
            .header(PEER_HEADER, "1")
            .json(&body)
            .send()
            .await
            .map_err(err)?;
        let status = resp.status();
        if !status.is_success() {
            return Err(KvPullError::Status { peer: holder.to_owned(), status: status.as_u16() });
        }
        let blocks: usize = resp
            .headers()
            .get(BLOCKS_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if blocks == 0 {
            return Ok(Pulled { blocks: 0, link, took: t0.elapsed() });
        }
        // Handshake and first byte: the link's round trip plus the pull's setup.
        tokio::time::sleep(link.rtt() + crate::topology::ms(self.topology.kv_setup_ms)).await;
        let scale = self.topology.kv_wire_scale.max(1);
        let want = blocks as u64 * wire_per_block;
        let mut got = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(err)? {
            got += chunk.len() as u64;
            let end = self.links.reserve(&name, link.wire_time(chunk.len() as u64 * scale));
            tokio::time::sleep_until(end).await;
        }
        if got != want {
            return Err(KvPullError::Short { peer: holder.to_owned(), got, want });
        }
        let took = t0.elapsed();
        let mut st = self.stats();
        st.blocks += blocks as u64;
        st.bytes += blocks as u64 * block_size as u64 * self.topology.kv_bytes_per_token;
        st.seconds.observe(took.as_secs_f64());
        Ok(Pulled { blocks, link, took })
    }

    /// Has `prefiller` prefill the request (`body` as sent to `endpoint`) with `max_tokens` 1
    /// and `kv_transfer_params.do_remote_decode`, as a P/D proxy does; the link's round trip
    /// is paid on the way.
    pub async fn prefill_remote(
        &self,
        prefiller: &str,
        endpoint: Endpoint,
        body: &[u8],
    ) -> Result<(), KvPullError> {
        let (_, link) = self.link_to(prefiller).await?;
        let mut v: Value = serde_json::from_slice(body).unwrap_or_else(|_| json!({}));
        prefill_body(endpoint, &mut v);
        tokio::time::sleep(link.rtt()).await;
        let err = |source| KvPullError::Http { peer: prefiller.to_owned(), source };
        let resp = self
            .http
            .post(format!("http://{prefiller}{}", path(endpoint)))
            .header(PEER_HEADER, "1")
            .json(&v)
            .send()
            .await
            .map_err(err)?;
        let status = resp.status();
        if !status.is_success() {
            return Err(KvPullError::Status {
                peer: prefiller.to_owned(),
                status: status.as_u16(),
            });
        }
        resp.bytes().await.map_err(err)?;
        Ok(())
    }
}

/// The path an endpoint is served on.
fn path(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat => "/v1/chat/completions",
        Endpoint::Completions => "/v1/completions",
        Endpoint::Messages => "/v1/messages",
        Endpoint::Responses => "/v1/responses",
    }
}

/// The prefill-only request a P/D proxy sends the prefiller: one output token, not streamed,
/// `kv_transfer_params: {"do_remote_decode": true}` (vLLM's NixlConnector convention).
pub fn prefill_body(endpoint: Endpoint, v: &mut Value) {
    let Some(o) = v.as_object_mut() else {
        return;
    };
    let budget = if endpoint == Endpoint::Responses { "max_output_tokens" } else { "max_tokens" };
    o.insert(budget.into(), json!(1));
    if o.contains_key("max_completion_tokens") {
        o.insert("max_completion_tokens".into(), json!(1));
    }
    for k in ["stream_options", "min_tokens"] {
        o.remove(k);
    }
    o.insert("stream".into(), json!(false));
    o.insert(
        "kv_transfer_params".into(),
        json!({"do_remote_decode": true, "do_remote_prefill": false}),
    );
}

/// The `kvroute_sim:kv_pull_*` metrics in Prometheus text format.
pub fn render_metrics(model: &str, st: &PullStats) -> String {
    use std::fmt::Write;
    let l = format!("engine=\"0\",model_name=\"{model}\"");
    let mut o = String::new();
    for (name, help, v) in [
        ("kvroute_sim:kv_pull_blocks_total", "KV blocks pulled from peer workers.", st.blocks),
        ("kvroute_sim:kv_pull_bytes_total", "KV bytes pulled (full size).", st.bytes),
        ("kvroute_sim:kv_pull_failures_total", "Pulls that failed (recomputed).", st.failures),
    ] {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{l}}} {v}");
    }
    let name = "kvroute_sim:kv_pull_seconds";
    let _ = writeln!(o, "# HELP {name} Wall time of KV pulls.\n# TYPE {name} histogram");
    let mut cum = 0;
    for (b, n) in crate::engine::BUCKETS.iter().zip(&st.seconds.counts) {
        cum += n;
        let _ = writeln!(o, "{name}_bucket{{{l},le=\"{b}\"}} {cum}");
    }
    let h = &st.seconds;
    let _ = writeln!(o, "{name}_bucket{{{l},le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(o, "{name}_sum{{{l}}} {}\n{name}_count{{{l}}} {}", h.sum, h.count);
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefill_request_asks_for_one_token_and_remote_decode() {
        let mut v = json!({"model": "m", "messages": [], "stream": true, "max_tokens": 50,
            "max_completion_tokens": 60, "stream_options": {"include_usage": true}});
        prefill_body(Endpoint::Chat, &mut v);
        assert_eq!(v["max_tokens"], 1);
        assert_eq!(v["max_completion_tokens"], 1);
        assert_eq!(v["stream"], false);
        assert!(v.get("stream_options").is_none());
        assert_eq!(v["kv_transfer_params"]["do_remote_decode"], true);
        let mut r = json!({"model": "m", "input": "x"});
        prefill_body(Endpoint::Responses, &mut r);
        assert_eq!(r["max_output_tokens"], 1);
    }

    #[test]
    fn metrics_render() {
        let mut st = PullStats { blocks: 3, bytes: 6 << 20, failures: 1, ..PullStats::default() };
        st.seconds.observe(0.2);
        let text = render_metrics("m", &st);
        assert!(text.contains("kvroute_sim:kv_pull_blocks_total{engine=\"0\",model_name=\"m\"} 3"));
        assert!(text.contains("kvroute_sim:kv_pull_seconds_count{engine=\"0\",model_name=\"m\"} 1"));
        assert!(text.contains("kvroute_sim:kv_pull_failures_total"));
    }
}
