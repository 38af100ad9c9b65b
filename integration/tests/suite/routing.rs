//! Routing behaviour through real Envoy + the kvroute filter + simulated workers:
//! prefix locality, spill-over under load, and client headers that try to steer.

use kvroute_stack::client::{self, Reply};
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use kvroute_stack::workload::Conversation;
use serde_json::json;

fn conversation(id: usize, turns: usize) -> Conversation {
    Conversation::new(42, id, 300, 20, turns)
}

async fn turn(http: &reqwest::Client, stack: &Stack, c: &Conversation, t: usize) -> Reply {
    let r = client::chat(http, &stack.base_url(), &c.body(MODEL, t, 4, false)).await.unwrap();
    assert_eq!(r.status, 200, "turn {t}: {}", r.body);
    r
}

fn predicted(r: &Reply) -> u64 {
    r.decision_field("predicted_cached_tokens").and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn later_turns_land_on_the_worker_that_served_turn_one() {
    let stack = Stack::start(StackOptions::default()).await.unwrap();
    let http = reqwest::Client::new();
    let c = conversation(1, 4);
    let first = turn(&http, &stack, &c, 0).await;
    let a = first.worker.clone().unwrap();
    assert_eq!(first.cached_tokens, Some(0));
    for t in 1..4 {
        let r = turn(&http, &stack, &c, t).await;
        assert_eq!(
            r.worker.as_deref(),
            Some(a.as_str()),
            "turn {t} left the worker holding its prefix"
        );
        assert!(r.cached_tokens.unwrap_or(0) > 0, "turn {t} reused nothing: {r:?}");
        assert!(predicted(&r) > 0, "turn {t} predicted nothing: {r:?}");
    }
    // The audit counted predictions that the worker confirmed.
    let hits =
        kvroute_stack::eventually("audit metric", std::time::Duration::from_secs(10), || async {
            let m = stack.envoy.prometheus().await.ok()?;
            let v = m.get("kvroute_audit_requests{kvroute_audit=\"hit_as_predicted\"}").copied()?;
            (v >= 3.0).then_some(v)
        })
        .await
        .unwrap();
    assert!(hits >= 3.0);
}

#[tokio::test]
async fn a_saturated_holder_loses_the_next_turn() {
    // Recomputing ~400 prompt tokens costs ~80 ms; each request the holder is decoding adds
    // 20 ms of waiting. Held streams make the holder busy until the filter spills.
    let opts = StackOptions {
        sim_args: ["--step-floor-ms", "20", "--prefill-ms-per-token", "0.2"]
            .map(String::from)
            .to_vec(),
        model_overrides: json!({"profile": {"prefill_base_ms": 1.0, "prefill_ms_per_token": 0.2,
            "prefill_ms_per_token_sq": 0.0, "decode_interference_ms": 20.0}}),
        ..Default::default()
    };
    let stack = Stack::start(opts).await.unwrap();
    let http = reqwest::Client::new();
    let c = conversation(2, 3);
    let a = turn(&http, &stack, &c, 0).await.worker.unwrap();
    // Hold long streams that extend the conversation, each until its first token arrives.
    let mut held = Vec::new();
    let mut on_a = 0;
    let mut spilled_to = None;
    for i in 0..10 {
        let mut body = c.body(MODEL, 1, 500, true);
        body["messages"][3]["content"] = json!(format!("holder {i}: {}", c.users[1]));
        let resp = http
            .post(format!("{}/v1/chat/completions", stack.base_url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let worker = resp.headers()["x-worker-id"].to_str().unwrap().to_owned();
        let mut resp = resp;
        let first = resp.chunk().await.unwrap();
        assert!(first.is_some(), "holder {i} got no first token");
        held.push(resp);
        if worker == a {
            on_a += 1;
        } else {
            spilled_to = Some(worker);
            break;
        }
    }
    let spilled_to = spilled_to.expect("the filter never spilled off the busy holder");
    assert!(
        on_a >= 2,
        "the holder got only {on_a} requests before spilling: locality was not preferred"
    );
    let probe = turn(&http, &stack, &c, 2).await;
    assert_ne!(
        probe.worker.as_deref(),
        Some(a.as_str()),
        "the next turn still went to the saturated holder"
    );
    eprintln!(
        "holder {a} took {on_a} streams, spilled to {spilled_to}, next turn went to {:?}",
        probe.worker
    );
    drop(held);
}

#[tokio::test]
async fn client_sent_destination_header_is_ignored() {
    let stack = Stack::start(StackOptions::default()).await.unwrap();
    let http = reqwest::Client::new();
    let c = conversation(3, 3);
    let a = turn(&http, &stack, &c, 0).await.worker.unwrap();
    let other = stack.addrs().into_iter().find(|w| *w != a).unwrap();
    for (t, steer) in [(1, other.as_str()), (2, "127.0.0.1:1")] {
        let body = c.body(MODEL, t, 4, false).to_string().into_bytes();
        let headers = [("x-gateway-destination-endpoint", steer)];
        let r = client::send(&http, &stack.base_url(), "/v1/chat/completions", body, &headers)
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(
            r.worker.as_deref(),
            Some(a.as_str()),
            "a client header steered the request to {steer}"
        );
    }
}
