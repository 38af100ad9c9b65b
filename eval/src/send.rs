//! Sends one scheduled request through Envoy and measures it: token timings from the stream,
//! the serving worker, kvroute's prediction, and the SLO verdict.

use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::cluster::Policy;
use crate::record::{RequestRecord, Slo};
use crate::schedule::Scheduled;
use crate::sse::SseTimer;

/// The most bytes of a non-stream (error) body kept to find its message.
const MAX_ERROR_BODY: usize = 64 * 1024;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A numeric field of kvroute's `x-kvroute-decision` header.
pub fn decision_number(header: &str, key: &str) -> Option<u64> {
    kvroute_integration::client::decision_field(header, key)?.parse().ok()
}

/// What a request is sent with besides its schedule entry.
#[derive(Debug, Clone)]
pub struct SendCtx {
    pub policy: Policy,
    /// Worker addresses (`ip:port`), topology order: what-if questions go to each.
    pub workers: Vec<String>,
    /// Share of requests (0..=1) whose what-if TTFT is asked of every worker for regret.
    pub whatif_sample: f64,
    /// Time compression of the workers: wall durations are multiplied by it.
    pub speedup: f64,
    pub slo: Slo,
    pub timeout: Duration,
}

/// Sends `s` to `url` (an Envoy listener) and records what happened; never fails.
pub async fn send(
    http: &reqwest::Client,
    url: &str,
    id: usize,
    s: &Scheduled,
    ctx: &SendCtx,
) -> RequestRecord {
    let (slo, timeout) = (&ctx.slo, ctx.timeout);
    let mut rec = RequestRecord {
        id,
        at_ms: ms(s.at),
        status: 0,
        error: None,
        worker: None,
        ttft_ms: None,
        gaps_ms: Vec::new(),
        max_gap_ms: 0.0,
        stalls: 0,
        e2e_ms: 0.0,
        output_tokens: 0,
        prompt_tokens: None,
        cached_tokens: None,
        predicted_cached_tokens: None,
        predicted_ttft_ms: None,
        send_lag_ms: 0.0,
        whatif_ms: Vec::new(),
        within_slo: false,
        cohorts: s.cohorts.clone(),
    };
    let start = Instant::now();
    let outcome = tokio::time::timeout(timeout, exchange(http, url, s, start, &mut rec)).await;
    rec.e2e_ms = ms(start.elapsed());
    match outcome {
        Err(_) => rec.error = Some(format!("no complete answer within {timeout:?}")),
        Ok(Err(e)) => rec.error = Some(e),
        Ok(Ok(())) => {}
    }
    rec.stalls = rec.gaps_ms.iter().filter(|g| **g > slo.stall_ms).count() as u32;
    let mean_gap = rec.gaps_ms.iter().sum::<f64>() / rec.gaps_ms.len().max(1) as f64;
    rec.within_slo = rec.ok()
        && rec.output_tokens >= s.output_tokens
        && rec.ttft_ms.is_some_and(|t| t <= slo.ttft_ms)
        && mean_gap <= slo.mean_gap_ms;
    rec
}

async fn exchange(
    http: &reqwest::Client,
    url: &str,
    s: &Scheduled,
    start: Instant,
    rec: &mut RequestRecord,
) -> Result<(), String> {
    let resp = http
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(s.body.to_string())
        .send()
        .await
        .map_err(|e| format!("sending: {e}"))?;
    rec.status = resp.status().as_u16();
    let header =
        |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    rec.worker = header("x-worker-id");
    let decision = header("x-kvroute-decision");
    rec.predicted_cached_tokens =
        decision.as_deref().and_then(|d| decision_number(d, "predicted_cached_tokens"));
    rec.predicted_ttft_ms = decision
        .as_deref()
        .and_then(|d| kvroute_integration::client::decision_field(d, "predicted_ttft_ms"))
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| *v >= 0.0);
    let mut stream = resp.bytes_stream();
    if rec.status != 200 {
        let mut body = Vec::new();
        while let Some(Ok(chunk)) = stream.next().await {
            body.extend_from_slice(
                &chunk[..chunk.len().min(MAX_ERROR_BODY - body.len().min(MAX_ERROR_BODY))],
            );
        }
        let msg = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "no OpenAI error body".into());
        return Err(format!("HTTP {}: {msg}", rec.status));
    }
    let mut timer = SseTimer::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("reading the stream: {e}"))?;
        timer.push(&chunk, start.elapsed());
    }
    let m = timer.finish(start.elapsed());
    rec.ttft_ms = m.ttft.map(ms);
    rec.gaps_ms = m.gaps.iter().copied().map(ms).collect();
    rec.max_gap_ms = ms(m.max_gap);
    rec.output_tokens = m.completion_tokens.unwrap_or(m.token_times.len() as u64);
    rec.prompt_tokens = m.prompt_tokens;
    rec.cached_tokens = m.cached_tokens;
    if let Some(e) = m.error {
        return Err(format!("error in stream: {e}"));
    }
    if !m.done {
        return Err("stream ended without [DONE]".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_fields() {
        let h = "worker=127.0.0.1:8001; predicted_cached_tokens=128; blocks_from_events=8";
        assert_eq!(decision_number(h, "predicted_cached_tokens"), Some(128));
        assert_eq!(decision_number(h, "blocks_from_events"), Some(8));
        assert_eq!(decision_number(h, "nope"), None);
    }
}
