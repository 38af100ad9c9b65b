//! Sends one scheduled request through Envoy and measures it: token timings from the stream,
//! the serving worker, kvroute's prediction, and the SLO verdict. Every duration recorded is
//! engine time (wall time multiplied by the workers' speedup).
//!
//! What-if TTFTs: the oracle asks every worker before sending and names the best one in
//! [`ORACLE_HEADER`]; every other policy asks, for a deterministic sample of requests, at the
//! same instant as it sends (so the request is not delayed), for regret.

use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::cluster::Policy;
use crate::record::{RequestRecord, Slo};
use crate::schedule::Scheduled;
use crate::sse::SseTimer;
use crate::whatif;

/// The most bytes of a non-stream (error) body kept to find its message.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The request header the bench-only oracle Envoy (`envoy/bench-oracle.yaml`) routes on.
pub const ORACLE_HEADER: &str = "x-bench-oracle-destination";

/// Seed of the regret sample: the same requests are sampled in every policy's run.
const SAMPLE_SEED: u64 = 0x6b76_726f_7574_6521;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A numeric field of kvroute's `x-kvroute-decision` header.
pub fn decision_number(header: &str, key: &str) -> Option<u64> {
    kvroute_stack::client::decision_field(header, key)?.parse().ok()
}

/// Whether kvroute's decision header says the look-ahead replicated the request's hot prefix
/// (`replicated=1`); any other value, or no such field, is false.
pub fn decision_replicated(header: &str) -> bool {
    decision_number(header, "replicated") == Some(1)
}

/// Whether request `id` is in the regret sample of share `share` (0..=1): decided by a seeded
/// hash of the id alone, so every policy samples the same requests.
pub fn sampled(id: usize, share: f64) -> bool {
    if share <= 0.0 || share.is_nan() {
        return false;
    }
    if share >= 1.0 {
        return true;
    }
    let h = xxhash_rust::xxh3::xxh3_64_with_seed(&(id as u64).to_le_bytes(), SAMPLE_SEED);
    // The top 53 bits as a uniform number in [0, 1).
    ((h >> 11) as f64 / (1u64 << 53) as f64) < share
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
///
/// `send_lag_ms` is left at 0 and `at_ms` is the schedule's time: the caller knows when the
/// send was due and sets both.
///
/// What-if questions: a simulated worker answers at its next step boundary, its TTFT counting
/// from the question. The oracle sends once every worker answered; its TTFT counts from when the
/// chosen worker answered minus that worker's wait (what the request would have waited there),
/// so it matches the answer it routed on; a request no worker could answer fails. A sampled
/// request's questions leave with it; one that reaches its worker after the request counts the
/// request in that worker's queue (the chosen worker's answer is then overstated).
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
        predicted_wait_ms: None,
        send_lag_ms: 0.0,
        whatif_ms: Vec::new(),
        replicated: false,
        decision_us: None,
        envoy: None,
        topo: None,
        within_slo: false,
        cohorts: s.cohorts.clone(),
    };
    let endpoint = s.endpoint;
    let mut destination = None;
    let mut start = Instant::now();
    if ctx.policy == Policy::Oracle {
        let answers = whatif::ask_all_timed(http, &ctx.workers, endpoint, &s.body).await;
        rec.whatif_ms = answers.iter().map(|(a, _)| a.map(|a| a.ttft_ms)).collect();
        let Some(b) = whatif::best(&rec.whatif_ms) else {
            rec.error = Some(
                "oracle: no worker answered /sim/what_if (the oracle needs simulated workers)"
                    .into(),
            );
            return rec;
        };
        destination = Some(ctx.workers[b].as_str());
        // The request is charged what it would have waited at the chosen worker had it gone
        // there at once: that worker's answer arrived at its next step boundary. The others'
        // answers, possibly later, are the oracle's own cost and not charged.
        let now = Instant::now();
        start = now.checked_sub(answers[b].1).unwrap_or(now);
    }
    let sample = ctx.policy != Policy::Oracle && sampled(id, ctx.whatif_sample);
    // The questions are dispatched first, so they usually reach the workers before the
    // request (which also crosses Envoy) and do not count it in the chosen worker's queue.
    let asked = async {
        if sample {
            whatif::ttfts(http, &ctx.workers, endpoint, &s.body).await
        } else {
            Vec::new()
        }
    };
    let request = tokio::time::timeout(
        timeout,
        exchange(http, url, endpoint, destination, s, start, &mut rec),
    );
    let (answers, outcome) = tokio::join!(asked, request);
    rec.e2e_ms = ms(start.elapsed());
    if sample {
        rec.whatif_ms = answers;
    }
    match outcome {
        Err(_) => rec.error = Some(format!("no complete answer within {timeout:?}")),
        Ok(Err(e)) => rec.error = Some(e),
        Ok(Ok(())) => {}
    }
    to_engine_time(&mut rec, ctx.speedup);
    rec.stalls = rec.gaps_ms.iter().filter(|g| **g > slo.stall_ms).count() as u32;
    rec.within_slo = rec.ok()
        && rec.output_tokens >= s.output_tokens
        && rec.ttft_ms.is_some_and(|t| t <= slo.ttft_ms)
        && rec.mean_gap_ms() <= slo.mean_gap_ms;
    rec
}

/// Multiplies every wall-clock duration of `rec` by `speedup`. The filter's prediction is wall
/// clock too: it estimates the first byte it will see (its calibration learns from what it
/// observes), so it is scaled with the observation it is judged against; a prior taken from
/// engine figures is then off by the speedup until calibration corrects it, as it would be on
/// a pool that is that much faster than the prior says. What-if answers are engine time
/// already.
fn to_engine_time(rec: &mut RequestRecord, speedup: f64) {
    let k = if speedup.is_finite() && speedup > 0.0 { speedup } else { 1.0 };
    rec.ttft_ms = rec.ttft_ms.map(|t| t * k);
    rec.predicted_ttft_ms = rec.predicted_ttft_ms.map(|t| t * k);
    rec.predicted_wait_ms = rec.predicted_wait_ms.map(|t| t * k);
    rec.gaps_ms.iter_mut().for_each(|g| *g *= k);
    rec.max_gap_ms *= k;
    rec.e2e_ms *= k;
    rec.send_lag_ms *= k;
}

async fn exchange(
    http: &reqwest::Client,
    url: &str,
    endpoint: &str,
    destination: Option<&str>,
    s: &Scheduled,
    start: Instant,
    rec: &mut RequestRecord,
) -> Result<(), String> {
    let mut req = http
        .post(format!("{url}{endpoint}"))
        .header("content-type", "application/json")
        .body(s.body.to_string());
    if let Some(d) = destination {
        req = req.header(ORACLE_HEADER, d);
    }
    let resp = req.send().await.map_err(|e| format!("sending: {e}"))?;
    rec.status = resp.status().as_u16();
    let header =
        |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    rec.worker = header("x-worker-id");
    let decision = header("x-kvroute-decision");
    rec.predicted_cached_tokens =
        decision.as_deref().and_then(|d| decision_number(d, "predicted_cached_tokens"));
    rec.predicted_ttft_ms = decision
        .as_deref()
        .and_then(|d| kvroute_stack::client::decision_field(d, "predicted_ttft_ms"))
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| *v >= 0.0);
    rec.predicted_wait_ms = decision
        .as_deref()
        .and_then(|d| kvroute_stack::client::decision_field(d, "predicted_wait_ms"))
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| *v >= 0.0);
    rec.replicated = decision.as_deref().is_some_and(decision_replicated);
    rec.decision_us = decision.as_deref().and_then(|d| decision_number(d, "decision_us"));
    rec.topo = decision.as_deref().and_then(crate::record::TopoDecision::parse);
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

    #[test]
    fn replicated_flag_of_the_decision_header() {
        // The filter's header as it writes it (filter/src/http.rs), with and without replication.
        let h = |r: &str| {
            format!(
                "worker=127.0.0.1:8001; predicted_cached_tokens=0; predicted_ttft_ms=812.5; \
                 prompt_tokens=9000; blocks_from_events=0; knowledge_age_ms=3; fallback=0; \
                 replicated={r}; decision_us=41; parse_us=12; catchup_us=0; tokenize_us=80"
            )
        };
        assert!(decision_replicated(&h("1")));
        assert!(!decision_replicated(&h("0")));
        assert!(!decision_replicated(&h("yes")));
        assert!(!decision_replicated(&h("2")));
        // An older filter's header has no such field.
        assert!(!decision_replicated("worker=127.0.0.1:8001; predicted_cached_tokens=128"));
        assert!(!decision_replicated(""));
        // A record written before the field existed reads back as not replicated.
        let old = r#"{"id": 0, "at_ms": 0.0, "status": 200, "error": null, "worker": "w0",
            "ttft_ms": 10.0, "gaps_ms": [], "max_gap_ms": 0.0, "stalls": 0, "e2e_ms": 20.0,
            "output_tokens": 1, "prompt_tokens": 10, "cached_tokens": 0,
            "predicted_cached_tokens": null, "within_slo": true, "cohorts": []}"#;
        let r: RequestRecord = serde_json::from_str(old).expect("an older record");
        assert!(!r.replicated);
        let back: RequestRecord = serde_json::from_str(
            &serde_json::to_string(&RequestRecord { replicated: true, ..r }).expect("json"),
        )
        .expect("round trip");
        assert!(back.replicated);
    }

    #[test]
    fn the_regret_sample_is_deterministic_and_of_the_share_asked() {
        let picked = |share| (0..10_000).filter(|&i| sampled(i, share)).count();
        assert_eq!(picked(0.0), 0);
        assert_eq!(picked(1.0), 10_000);
        let quarter = picked(0.25);
        assert!((2300..2700).contains(&quarter), "{quarter} of 10000 at 25 %");
        let a: Vec<usize> = (0..1000).filter(|&i| sampled(i, 0.25)).collect();
        let b: Vec<usize> = (0..1000).filter(|&i| sampled(i, 0.25)).collect();
        assert_eq!(a, b);
        // A smaller share samples a subset of a larger one.
        assert!((0..1000).filter(|&i| sampled(i, 0.1)).all(|i| sampled(i, 0.5)));
    }

    #[test]
    fn records_are_scaled_to_engine_time() {
        let mut r = RequestRecord {
            ttft_ms: Some(2.0),
            gaps_ms: vec![1.0, 3.0],
            max_gap_ms: 3.0,
            e2e_ms: 10.0,
            send_lag_ms: 0.5,
            whatif_ms: vec![Some(7.0)],
            predicted_ttft_ms: Some(9.0),
            predicted_wait_ms: Some(2.0),
            ..Default::default()
        };
        to_engine_time(&mut r, 4.0);
        assert_eq!(r.ttft_ms, Some(8.0));
        assert_eq!(r.gaps_ms, [4.0, 12.0]);
        assert_eq!((r.max_gap_ms, r.e2e_ms, r.send_lag_ms), (12.0, 40.0, 2.0));
        assert_eq!(r.whatif_ms, [Some(7.0)], "what-if answers are engine time already");
        assert_eq!(r.predicted_ttft_ms, Some(36.0), "the filter predicts the wall clock it sees");
        assert_eq!(r.predicted_wait_ms, Some(8.0));
    }
}
