//! A streamed answer's first token leaves the worker when the engine makes it: the server
//! writes it at once (TCP_NODELAY, as vLLM's asyncio server does) instead of holding the small
//! write until the client acknowledges the response headers. With Nagle's algorithm on, every
//! short streamed request on a kept-alive connection reached the client ~40 ms late (Linux's
//! delayed ACK), and the router's online calibration learned that delay as prefill cost.
//!
//! The one time bound compares the kernel's fixed 40 ms delayed ACK with a step of well under
//! a millisecond (the 8B profile at 10x), on the median of several requests.

mod common;

use std::time::{Duration, Instant};

use futures::StreamExt;
use kvroute_core::model::ModelBundle;
use kvroute_sim::worker::{Ports, Worker, WorkerSpec};
use serde_json::json;

/// Sequential streamed requests on one kept-alive connection.
const REQUESTS: usize = 12;

/// Time from the response headers to the first body chunk of one streamed request.
async fn headers_to_first_chunk(http: &reqwest::Client, port: u16, seed: u64) -> Duration {
    let body = json!({"model": common::MODEL, "max_tokens": 4, "stream": true,
        "messages": [{"role": "user", "content": kvroute_core::textgen::words(seed, 20)}]});
    let resp = http
        .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    let headers = Instant::now();
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.expect("a first chunk").unwrap();
    let gap = headers.elapsed();
    assert!(first.starts_with(b"data: "), "an SSE event: {:?}", String::from_utf8_lossy(&first));
    while let Some(chunk) = stream.next().await {
        chunk.unwrap();
    }
    gap
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_streamed_token_is_not_held_back_by_nagle() {
    let base = common::demo_worker();
    let spec = WorkerSpec { speedup: 10.0, ..base.spec.clone() };
    let w = Worker::new(spec, ModelBundle::demo().unwrap(), Ports::default());
    let ports = w.start().await.unwrap();
    let http = reqwest::Client::builder().pool_max_idle_per_host(1).build().unwrap();
    let mut gaps = Vec::new();
    for seed in 0..REQUESTS as u64 {
        gaps.push(headers_to_first_chunk(&http, ports.http, seed).await);
    }
    w.crash().await;
    gaps.sort();
    let median = gaps[REQUESTS / 2];
    assert!(
        median < Duration::from_millis(25),
        "median headers-to-first-token gap {median:?} (all: {gaps:?}): small writes are delayed"
    );
}
