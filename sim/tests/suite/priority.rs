//! `--scheduling-policy` over real HTTP: with one request running at a time and a queue behind
//! it, `priority` mode serves a later request with a lower `priority` value first; `fcfs`
//! serves arrival order and refuses a non-zero `priority` as vLLM does (a 400, or the error
//! event of a stream that already has its 200); an invalid value is a 400 in both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_sim::engine::SchedulingPolicy;
use kvroute_sim::worker::{Ports, Worker, WorkerSpec};
use serde_json::{json, Value};

use crate::common::{self, MODEL};

/// Bound on every wait here (a hang fails the test, the order is what is checked).
const WITHIN: Duration = Duration::from_secs(30);

/// One running request at a time, so a queue forms behind it.
async fn worker(policy: SchedulingPolicy) -> (Arc<Worker>, u16) {
    let base = common::demo_worker();
    let mut spec = WorkerSpec { scheduling_policy: policy, ..base.spec.clone() };
    spec.profile.max_num_seqs = 1;
    let w = Worker::new(spec, ModelBundle::demo().unwrap(), Ports::default());
    let port = w.start().await.unwrap().http;
    (w, port)
}

fn chat(text: &str, max_tokens: u32, priority: Option<Value>) -> Value {
    let mut b = json!({"model": MODEL, "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens, "stream": true});
    if let Some(p) = priority {
        b["priority"] = p;
    }
    b
}

async fn send(port: u16, body: &Value) -> reqwest::Response {
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .json(body)
        .send();
    tokio::time::timeout(WITHIN, r).await.expect("no answer").unwrap()
}

/// Reads a stream until its first content chunk: when its first token came.
async fn first_token(mut r: reqwest::Response) -> Instant {
    let read = async {
        let mut seen = String::new();
        while let Some(chunk) = r.chunk().await.unwrap() {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("\"content\"") {
                return Instant::now();
            }
        }
        panic!("stream ended without a token: {seen}");
    };
    tokio::time::timeout(WITHIN, read).await.expect("no first token")
}

async fn waiting(port: u16) -> u64 {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = text.lines().find(|l| l.starts_with("vllm:num_requests_waiting{")).unwrap();
    line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
}

/// Polls until the engine's queue holds `n` requests.
async fn until_waiting(port: u16, n: u64) {
    for _ in 0..3000 {
        if waiting(port).await >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the queue never reached {n}");
}

/// A blocker runs; three requests queue behind it in order (priorities as given); the blocker's
/// client leaves. Returns the queued ones' indices in the order their first tokens came.
async fn queue_order(port: u16, priorities: [Option<i64>; 3]) -> Vec<usize> {
    let blocker = send(port, &chat("block the engine", 4000, None)).await;
    let mut blocker = Some(blocker);
    if let Some(b) = blocker.as_mut() {
        // Running: its first token came.
        let read = async {
            let mut seen = String::new();
            while !seen.contains("\"content\"") {
                let chunk = b.chunk().await.unwrap().expect("blocker ended");
                seen.push_str(&String::from_utf8_lossy(&chunk));
            }
        };
        tokio::time::timeout(WITHIN, read).await.expect("blocker never ran");
    }
    let mut tasks = Vec::new();
    for (i, p) in priorities.iter().enumerate() {
        let body = chat(&format!("queued request {i}"), 2, p.map(|p| json!(p)));
        tasks.push(tokio::spawn(async move { first_token(send(port, &body).await).await }));
        until_waiting(port, i as u64 + 1).await;
    }
    drop(blocker.take());
    let mut firsts = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        firsts.push((t.await.unwrap(), i));
    }
    firsts.sort();
    firsts.into_iter().map(|(_, i)| i).collect()
}

#[tokio::test]
async fn priority_mode_serves_a_later_urgent_request_first_and_fcfs_keeps_arrival_order() {
    let (_w, port) = worker(SchedulingPolicy::Priority).await;
    assert_eq!(queue_order(port, [Some(5), Some(5), Some(-1)]).await, vec![2, 0, 1]);
    // Equal values keep arrival order; absent is 0.
    assert_eq!(queue_order(port, [Some(1), None, Some(1)]).await, vec![1, 0, 2]);
    let (_w, port) = worker(SchedulingPolicy::Fcfs).await;
    assert_eq!(queue_order(port, [None, Some(0), None]).await, vec![0, 1, 2]);
}

#[tokio::test]
async fn fcfs_refuses_a_non_zero_priority_and_both_refuse_a_non_integer() {
    let error = |text: &str| serde_json::from_str::<Value>(text).unwrap()["error"].clone();
    let (_w, fcfs) = worker(SchedulingPolicy::Fcfs).await;
    let mut body = chat("hi", 2, Some(json!(3)));
    body["stream"] = json!(false);
    let r = send(fcfs, &body).await;
    assert_eq!(r.status().as_u16(), 400);
    let want = "Got priority 3 but Priority scheduling is not enabled.";
    assert_eq!(
        error(&r.text().await.unwrap()),
        json!({"message": want, "type": "BadRequestError", "param": null, "code": 400})
    );
    // Streamed: refused by the engine once the stream has begun.
    let r = send(fcfs, &chat("hi", 2, Some(json!(3)))).await;
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains(want) && text.ends_with("data: [DONE]\n\n"), "{text}");
    let (_w, prio) = worker(SchedulingPolicy::Priority).await;
    for port in [fcfs, prio] {
        for bad in [json!("high"), json!(1.5), Value::Null] {
            let r = send(port, &chat("hi", 2, Some(bad.clone()))).await;
            assert_eq!(r.status().as_u16(), 400, "{bad}");
            let e = error(&r.text().await.unwrap());
            assert_eq!((e["param"].as_str(), e["code"].as_u64()), (Some("priority"), Some(400)));
        }
    }
    // Integral spellings pydantic accepts are taken.
    let mut ok = chat("hi", 2, Some(json!("-2")));
    ok["stream"] = json!(false);
    assert_eq!(send(prio, &ok).await.status().as_u16(), 200);
}
