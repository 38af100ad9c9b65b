//! Topology over real sockets: a prefix pulled from a peer worker is served from the
//! receiver's cache and takes at least its transfer time; a failed pull is recomputed; a
//! decode worker has its prompt prefilled on a prefill worker and pulls the KV; the client
//! round trip delays the first streamed byte; `GET /sim/topology` names the labels.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_sim::topology::{SimLink, SimRole, SimTopology};
use kvroute_sim::worker::{Ports, Worker, WorkerSpec};
use serde_json::{json, Value};

use crate::common;

async fn worker(topology: SimTopology) -> (Arc<Worker>, String) {
    let base = common::demo_worker();
    let spec = WorkerSpec { topology, ..base.spec.clone() };
    let w = Worker::new(spec, ModelBundle::demo().unwrap(), Ports::default());
    let port = w.start().await.unwrap().http;
    (w, format!("127.0.0.1:{port}"))
}

fn prompt(seed: u64) -> String {
    kvroute_testkit::textgen::words(seed, 600)
}

async fn complete(addr: &str, headers: &[(&str, &str)], max_tokens: u32) -> Value {
    complete_seed(addr, 11, headers, max_tokens).await
}

async fn complete_seed(addr: &str, seed: u64, headers: &[(&str, &str)], max_tokens: u32) -> Value {
    let body = json!({"model": common::MODEL, "prompt": prompt(seed), "max_tokens": max_tokens});
    let mut req = reqwest::Client::new().post(format!("http://{addr}/v1/completions")).json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
}

/// A metric's value on `addr` (0 when absent).
async fn metric(addr: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("http://{addr}/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_pulled_prefix_is_served_from_the_receivers_cache() {
    let (_a, a) = worker(SimTopology { site: Some("a".into()), ..SimTopology::default() }).await;
    let link = SimLink { rtt_ms: 20.0, gbps: 10.0 };
    let topo = SimTopology { links: vec![("a".into(), link)], ..SimTopology::default() };
    let (_b, b) = worker(topo.clone()).await;
    let first = complete(&a, &[], 1).await;
    assert_eq!(cached(&first), 0);
    let t = Instant::now();
    let got = complete(&b, &[("x-kvroute-kv-source", &a)], 1).await;
    let took = t.elapsed();
    let prompt_tokens = got["usage"]["prompt_tokens"].as_u64().unwrap();
    let blocks = metric(&b, "kvroute_sim:kv_pull_blocks_total").await;
    assert!(blocks > 0.0, "no blocks pulled");
    // Everything but the block of the last prompt token (vLLM recomputes it) came over.
    let bs = (prompt_tokens - 1) / blocks as u64;
    assert_eq!(cached(&got), blocks as u64 * bs, "{got}");
    let bytes = metric(&b, "kvroute_sim:kv_pull_bytes_total").await;
    assert_eq!(bytes, blocks * bs as f64 * 131_072.0);
    let floor = link.rtt() + link.wire_time(bytes as u64);
    let secs = metric(&b, "kvroute_sim:kv_pull_seconds_sum").await;
    assert!(secs >= floor.as_secs_f64(), "pull took {secs} s, floor {floor:?}");
    assert!(took >= floor, "request took {took:?}, floor {floor:?}");
    eprintln!(
        "pulled {blocks} blocks ({bytes} B) in {secs:.4} s, floor {floor:?}; request {took:?}"
    );
    // A second request on B finds the prefix there: nothing more to pull.
    let again = complete(&b, &[("x-kvroute-kv-source", &a)], 1).await;
    assert_eq!(cached(&again), cached(&got));
    assert_eq!(metric(&b, "kvroute_sim:kv_pull_blocks_total").await, blocks);
}

/// Two pulls at once over one link share it: the later one ends no earlier than the time to
/// send both.
#[tokio::test]
async fn concurrent_pulls_share_the_link() {
    let (_a, a) = worker(SimTopology::default()).await;
    let link = SimLink { rtt_ms: 0.0, gbps: 20.0 };
    let topo = SimTopology { links: vec![("*".into(), link)], ..SimTopology::default() };
    let (_b, b) = worker(topo).await;
    complete_seed(&a, 1, &[], 1).await;
    complete_seed(&a, 2, &[], 1).await;
    let t = Instant::now();
    let src = [("x-kvroute-kv-source", a.as_str())];
    let (x, y) = tokio::join!(complete_seed(&b, 1, &src, 1), complete_seed(&b, 2, &src, 1));
    let took = t.elapsed();
    assert!(cached(&x) > 0 && cached(&y) > 0);
    let bytes = metric(&b, "kvroute_sim:kv_pull_bytes_total").await;
    let both = link.wire_time(bytes as u64);
    assert!(took >= both, "two pulls in {took:?}, the link needs {both:?} for both");
}

#[tokio::test]
async fn a_failed_pull_is_recomputed() {
    let (_b, b) = worker(SimTopology::default()).await;
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let got = complete(&b, &[("x-kvroute-kv-source", &gone)], 1).await;
    assert_eq!(cached(&got), 0);
    assert_eq!(metric(&b, "kvroute_sim:kv_pull_failures_total").await, 1.0);
    // A decode worker whose prefiller is gone prefills by itself.
    let decode = SimTopology { role: SimRole::Decode, ..SimTopology::default() };
    let (_d, d) = worker(decode).await;
    let got = complete(&d, &[("x-prefiller-host-port", &gone)], 3).await;
    assert_eq!((cached(&got), got["usage"]["completion_tokens"].as_u64()), (0, Some(3)));
    assert_eq!(metric(&d, "kvroute_sim:kv_pull_failures_total").await, 1.0);
}

#[tokio::test]
async fn a_decode_worker_pulls_the_prefill_workers_kv() {
    let prefill = SimTopology { role: SimRole::Prefill, ..SimTopology::default() };
    let (_p, p) = worker(prefill).await;
    let decode = SimTopology { role: SimRole::Decode, ..SimTopology::default() };
    let (_d, d) = worker(decode).await;
    let got = complete(&d, &[("x-prefiller-host-port", &p)], 4).await;
    assert_eq!(got["usage"]["completion_tokens"], 4);
    assert!(cached(&got) > 0, "{got}");
    assert!(metric(&p, "vllm:prompt_tokens_total").await > 0.0, "the prefiller computed");
    assert_eq!(metric(&p, "vllm:generation_tokens_total").await, 1.0, "max_tokens 1 there");
    assert!(metric(&d, "kvroute_sim:kv_pull_blocks_total").await > 0.0);
    let topo: Value =
        reqwest::get(format!("http://{p}/sim/topology")).await.unwrap().json().await.unwrap();
    assert_eq!(topo["role"], "prefill");
    // The prefiller names itself in kv_transfer_params, as vLLM's NixlConnector does.
    let body = json!({"model": common::MODEL, "prompt": "x", "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": true}});
    let r: Value = reqwest::Client::new()
        .post(format!("http://{p}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["kv_transfer_params"]["remote_engine_id"], p.as_str(), "{r}");
    assert_eq!(r["kv_transfer_params"]["do_remote_prefill"], true);
}

#[tokio::test]
async fn the_client_round_trip_delays_the_first_byte() {
    let rtt = Duration::from_millis(120);
    let topo = SimTopology { client_rtt_ms: 120.0, ..SimTopology::default() };
    let (_w, addr) = worker(topo).await;
    let body = json!({"model": common::MODEL, "prompt": "hello", "max_tokens": 3, "stream": true});
    let t = Instant::now();
    let mut r = reqwest::Client::new()
        .post(format!("http://{addr}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut first = None;
    while let Some(c) = r.chunk().await.unwrap() {
        if first.is_none() && !c.is_empty() {
            first = Some(t.elapsed());
        }
    }
    let first = first.unwrap();
    assert!(first >= rtt, "first byte after {first:?}, RTT {rtt:?}");
}

/// KV events reach a subscriber no earlier than `--event-delay-ms` after the step that made
/// them (the request that stored the blocks was sent before).
async fn recv(sub: &mut zeromq::SubSocket, d: Duration) -> Option<zeromq::ZmqMessage> {
    use zeromq::SocketRecv;
    tokio::time::timeout(d, sub.recv()).await.ok().and_then(Result::ok)
}

#[tokio::test]
async fn kv_events_arrive_one_event_delay_late() {
    use zeromq::Socket;
    let delay = Duration::from_millis(250);
    let topo = SimTopology { event_delay_ms: 250.0, ..SimTopology::default() };
    let base = common::demo_worker();
    let w = Worker::new(
        WorkerSpec { topology: topo, ..base.spec.clone() },
        ModelBundle::demo().unwrap(),
        Ports::default(),
    );
    let ports = w.start().await.unwrap();
    let addr = format!("127.0.0.1:{}", ports.http);
    let mut sub = zeromq::SubSocket::new();
    sub.connect(&format!("tcp://127.0.0.1:{}", ports.events)).await.unwrap();
    sub.subscribe("").await.unwrap();
    // ZMQ's slow joiner: requests until the subscription sees one, then drain the line.
    let mut joined = false;
    for seed in 100..140 {
        complete_seed(&addr, seed, &[], 1).await;
        if recv(&mut sub, Duration::from_millis(400)).await.is_some() {
            joined = true;
            break;
        }
    }
    assert!(joined, "the subscriber never received an event");
    while recv(&mut sub, delay * 2).await.is_some() {}
    let t = Instant::now();
    complete_seed(&addr, 999, &[], 1).await;
    assert!(recv(&mut sub, Duration::from_secs(5)).await.is_some(), "no event");
    let took = t.elapsed();
    assert!(took >= delay, "event after {took:?}, delay {delay:?}");
}
