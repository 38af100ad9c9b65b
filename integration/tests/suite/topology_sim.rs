//! The simulator moves state for real (issue 25): simulated workers in processes of their own,
//! over real loopback sockets. A prefix computed on worker A and requested on worker B with
//! `x-kvroute-kv-source: A` is pulled over B's link (its bytes paced on a real TCP connection):
//! B serves it from cache, publishes `BlockStored` for the pulled blocks, counts them in its
//! pull metrics, and the pull takes at least its round trip plus size / bandwidth. A worker's
//! client round trip (`--client-rtt-ms`) raises time to first token by at least the RTT. A
//! decode worker given `x-prefiller-host-port` has the prefill worker compute the prompt and
//! answers with the prompt cached. Bounds are lower bounds only: a busy machine is slower, never
//! faster.

use std::path::Path;
use std::time::{Duration, Instant};

use kvroute_stack::paths;
use kvroute_stack::sim::SimWorker;
use serde_json::{json, Value};

const MODEL: &str = "kvroute-demo";

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

async fn sim(index: usize, args: &[&str], dir: &Path) -> SimWorker {
    let mut all = strings(&["--model", MODEL, "--block-size", "16"]);
    all.extend(strings(args));
    SimWorker::start(index, &all, dir).await.unwrap()
}

fn prompt() -> String {
    kvroute_testkit::textgen::words(25, 800)
}

/// A completion of [`prompt`] on `addr` with `headers`; the body and the time to the first
/// streamed byte of the answer.
async fn complete(addr: &str, headers: &[(&str, &str)], max_tokens: u32) -> (Value, Duration) {
    let body = json!({"model": MODEL, "prompt": prompt(), "max_tokens": max_tokens,
        "stream": true, "stream_options": {"include_usage": true}});
    let mut req = reqwest::Client::new().post(format!("http://{addr}/v1/completions")).json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let t = Instant::now();
    let mut resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut first = None;
    let mut text = Vec::new();
    while let Some(c) = resp.chunk().await.unwrap() {
        if first.is_none() && !c.is_empty() {
            first = Some(t.elapsed());
        }
        text.extend_from_slice(&c);
    }
    let text = String::from_utf8(text).unwrap();
    let usage = text
        .split("\n\n")
        .filter_map(|b| b.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["usage"].is_object())
        .unwrap_or_else(|| panic!("no usage in {text}"));
    (usage, first.unwrap())
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
}

async fn metric(w: &SimWorker, name: &str) -> f64 {
    w.metric(name).await.unwrap().unwrap_or(0.0)
}

/// Block hashes of the `BlockStored` events in a worker's published batches (array encoding:
/// `["BlockStored", hashes, parent, tokens, ...]`).
fn stored_hashes(batches: &Value) -> Vec<u64> {
    let mut out = Vec::new();
    for b in batches.as_array().unwrap() {
        for e in b["batch"][1].as_array().unwrap() {
            if e[0] == "BlockStored" {
                out.extend(e[1].as_array().unwrap().iter().filter_map(Value::as_u64));
            }
        }
    }
    out
}

#[tokio::test]
async fn a_pulled_prefix_is_served_from_cache_on_the_receiver() {
    let dir = paths::scratch_dir("topology-sim-pull").unwrap();
    let a = sim(0, &["--site", "a", "--node", "n1"], &dir).await;
    let rtt_ms = 30.0;
    let gbps = 5.0;
    let link = format!("a={rtt_ms}:{gbps}");
    let b = sim(1, &["--site", "b", "--link", &link], &dir).await;
    let topo: Value = reqwest::get(format!("http://{}/sim/topology", a.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!((topo["site"].as_str(), topo["node"].as_str()), (Some("a"), Some("n1")));
    let (first, _) = complete(&a.addr, &[], 2).await;
    assert_eq!(cached(&first), 0);
    let a_stored = stored_hashes(&a.kv_events(0).await.unwrap());
    let before = b.kv_events(0).await.unwrap().as_array().unwrap().len() as u64;

    let (got, ttft) = complete(&b.addr, &[("x-kvroute-kv-source", &a.addr)], 2).await;
    let blocks = metric(&b, "kvroute_sim:kv_pull_blocks_total").await;
    let bytes = metric(&b, "kvroute_sim:kv_pull_bytes_total").await;
    let secs = metric(&b, "kvroute_sim:kv_pull_seconds_sum").await;
    let prompt_tokens = got["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(blocks > 0.0, "nothing pulled: {got}");
    // All full blocks but the one of the last prompt token (vLLM recomputes it) came over.
    assert_eq!(blocks as u64, (prompt_tokens - 1) / 16, "{got}");
    assert_eq!(cached(&got), blocks as u64 * 16, "{got}");
    assert_eq!(bytes, blocks * 16.0 * 131_072.0);
    assert_eq!(metric(&b, "kvroute_sim:kv_pull_failures_total").await, 0.0);
    // B published the pulled blocks, with the holder's block identity.
    let b_stored = stored_hashes(&b.kv_events(before).await.unwrap());
    assert!(b_stored.len() as f64 >= blocks, "B stored {} blocks", b_stored.len());
    assert_eq!(&b_stored[..blocks as usize], &a_stored[..blocks as usize]);
    // The transfer took at least rtt + size / bandwidth, on the socket and in TTFT.
    let floor = rtt_ms / 1000.0 + bytes * 8.0 / (gbps * 1e9);
    assert!(secs >= floor, "pull took {secs:.4} s, floor {floor:.4} s");
    assert!(ttft.as_secs_f64() >= floor, "TTFT {ttft:?}, pull floor {floor:.4} s");
    eprintln!(
        "pulled {blocks} blocks, {bytes} B in {secs:.4} s (floor {floor:.4} s), TTFT {ttft:?}"
    );
}

#[tokio::test]
async fn the_client_round_trip_raises_time_to_first_token() {
    let dir = paths::scratch_dir("topology-sim-rtt").unwrap();
    let rtt = Duration::from_millis(150);
    let far = sim(0, &["--client-rtt-ms", "150"], &dir).await;
    let (_, ttft) = complete(&far.addr, &[], 2).await;
    assert!(ttft >= rtt, "TTFT {ttft:?} with a client RTT of {rtt:?}");
    // Again with the prefix cached: the round trip is paid all the same.
    let (v, ttft) = complete(&far.addr, &[], 2).await;
    assert!(cached(&v) > 0);
    assert!(ttft >= rtt, "cached TTFT {ttft:?} with a client RTT of {rtt:?}");
}

#[tokio::test]
async fn a_decode_worker_answers_with_the_prefill_workers_kv() {
    let dir = paths::scratch_dir("topology-sim-pd").unwrap();
    let p = sim(0, &["--role", "prefill"], &dir).await;
    let d = sim(1, &["--role", "decode"], &dir).await;
    let (got, _) = complete(&d.addr, &[("x-prefiller-host-port", &p.addr)], 5).await;
    assert_eq!(got["usage"]["completion_tokens"], 5, "{got}");
    let prompt_tokens = got["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(cached(&got), (prompt_tokens - 1) / 16 * 16, "{got}");
    assert!(metric(&p, "vllm:prompt_tokens_total").await >= prompt_tokens as f64);
    assert_eq!(metric(&p, "vllm:generation_tokens_total").await, 1.0, "prefill: one token");
    assert!(metric(&d, "kvroute_sim:kv_pull_blocks_total").await > 0.0);
    // Without the header a decode worker prefills by itself (vLLM's behaviour).
    let alone = sim(2, &["--role", "decode"], &dir).await;
    let (v, _) = complete(&alone.addr, &[], 2).await;
    assert_eq!(cached(&v), 0);
}
