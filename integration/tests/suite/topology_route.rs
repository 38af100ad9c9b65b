//! Topology through real Envoy: a worker pulls a prompt's prefix from a far holder that
//! kvroute's topology rules out (`x-kvroute-kv-source`, served by the simulator over real
//! sockets), and clients cannot name a pull source themselves.

use std::time::Duration;

use kvroute_stack::client::{self, Reply};
use kvroute_stack::sim::SimWorker;
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use kvroute_stack::workload::Conversation;
use serde_json::{json, Value};

/// Worker 1 sits in site `b`, 5 s away from this Envoy: never worth routing to, but its KV can
/// be pulled to worker 0 (local) over a fast site link.
fn opts() -> StackOptions {
    StackOptions {
        workers: 2,
        updater: true,
        // A label makes the simulators show their pull counters from the start.
        sim_args: vec!["--site".into(), "lab".into()],
        filter: json!({
            "knowledge": {"max_event_age_ms": 5000},
            "topology": {
                "local_site": "a",
                "workers": {"$worker0": {"site": "a"}, "$worker1": {"site": "b"}},
                "site_links": [{"a": "a", "b": "b", "rtt_ms": 1.0, "gbps": 400.0}],
                "client_rtt_ms": {"b": 5000.0},
                "transfer": {"enabled": true, "max_level": "wan", "setup_ms": 1.0}
            }
        }),
        ..Default::default()
    }
}

/// A long, unique first turn (about 750 tokens of the demo model).
fn probe(i: usize) -> Value {
    Conversation::new(2501, i, 600, 40, 1).body(MODEL, 0, 4, false)
}

async fn chat(base: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
    let http = reqwest::Client::new();
    let bytes = body.to_string().into_bytes();
    let r = client::send(&http, base, "/v1/chat/completions", bytes, headers).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    r
}

/// A counter of `worker`'s `/metrics` (its one series, labels ignored); panics when absent,
/// so a renamed metric cannot make a comparison of two zeros pass.
async fn sim_counter(worker: &SimWorker, name: &str) -> f64 {
    let text = reqwest::get(format!("http://{}/metrics", worker.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once('}')?.1,
                None => rest,
            };
            value.strip_prefix(' ')?.trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("{name} not in {}'s metrics", worker.addr))
}

#[tokio::test]
async fn a_local_worker_pulls_the_prefix_a_far_holder_computed() {
    let stack = Stack::start(opts()).await.unwrap();
    let (near, far) = (&stack.workers[0], &stack.workers[1]);
    let pulled_before = sim_counter(near, "kvroute_sim:kv_pull_blocks_total").await;
    // Each attempt warms a new prompt on the far worker directly (only its KV events can tell
    // kvroute), then sends it through Envoy; the first attempts may beat the events.
    let mut hit = None;
    for i in 0..40 {
        chat(&format!("http://{}", far.addr), &probe(i), &[]).await;
        let r = chat(&stack.base_url(), &probe(i), &[]).await;
        assert_eq!(r.worker.as_deref(), Some(near.addr.as_str()), "{:?}", r.decision);
        if r.decision_field("kv_source").as_deref() == Some(far.addr.as_str()) {
            hit = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = hit.expect("no decision pulled from the far holder; logs in the stack dir");
    assert_eq!(r.decision_field("site").as_deref(), Some("a"));
    assert_eq!(r.decision_field("cross_site").as_deref(), Some("0"));
    let predicted: u64 = r.decision_field("predicted_cached_tokens").unwrap().parse().unwrap();
    let cached = r.cached_tokens.unwrap_or(0);
    assert!(predicted > 500, "{:?}", r.decision);
    // The near worker really pulled: what it reports cached is the pulled prefix.
    assert!(cached + 16 >= predicted && cached <= predicted + 16, "{cached} vs {predicted}");
    assert!(sim_counter(near, "kvroute_sim:kv_pull_blocks_total").await > pulled_before);
    let m = stack.envoy.prometheus().await.unwrap();
    assert!(m.get("kvroute_topology_pulls").copied().unwrap_or(0.0) >= 1.0, "{m:?}");
}

#[tokio::test]
async fn a_client_cannot_name_a_pull_source_or_a_prefill_worker() {
    let stack = Stack::start(opts()).await.unwrap();
    let near = &stack.workers[0];
    let failures = sim_counter(near, "kvroute_sim:kv_pull_failures_total").await;
    let pulled = sim_counter(near, "kvroute_sim:kv_pull_blocks_total").await;
    // A source that does not exist would fail the pull; one that exists would be pulled from.
    for (i, source) in ["127.0.0.1:1", stack.workers[1].addr.as_str()].into_iter().enumerate() {
        let headers = [("x-kvroute-kv-source", source), ("x-prefiller-host-port", source)];
        let r = chat(&stack.base_url(), &probe(100 + i), &headers).await;
        assert_eq!(r.decision_field("kv_source").as_deref(), Some("none"), "{:?}", r.decision);
    }
    assert_eq!(sim_counter(near, "kvroute_sim:kv_pull_failures_total").await, failures);
    assert_eq!(sim_counter(near, "kvroute_sim:kv_pull_blocks_total").await, pulled);
}

/// A P/D pool through Envoy: worker 0 decodes, workers 1 and 2 prefill. The filter names the
/// decode worker as the destination and a prefill worker in `x-prefiller-host-port`; the
/// decode worker (the simulator acting as vLLM with llm-d's routing sidecar) has it prefill
/// the prompt, pulls the KV, and decodes. The next turn's prefill goes where the prefix is.
#[tokio::test]
async fn a_pd_pool_prefills_where_the_prefix_is_and_decodes_on_the_decode_worker() {
    let stack = Stack::start(StackOptions {
        workers: 3,
        // Every simulator acts on `x-prefiller-host-port`; only worker 0 gets it from the filter.
        sim_args: vec!["--role".into(), "decode".into()],
        model_overrides: json!({"workers": ["$worker0"], "prefill_workers": ["$worker1", "$worker2"]}),
        ..Default::default()
    })
    .await
    .unwrap();
    let decode = &stack.workers[0];
    let pulled = sim_counter(decode, "kvroute_sim:kv_pull_blocks_total").await;
    // Three conversations: a prefill placement right by chance would hold for all three turns
    // one time in eight.
    for id in 0..3 {
        let c = Conversation::new(2502, id, 400, 30, 2);
        let first = chat(&stack.base_url(), &c.body(MODEL, 0, 4, false), &[]).await;
        assert_eq!(first.worker.as_deref(), Some(decode.addr.as_str()), "{:?}", first.decision);
        let prefiller = first.decision_field("prefill").unwrap();
        assert!(stack.workers[1..].iter().any(|w| w.addr == prefiller), "{:?}", first.decision);
        // The decode worker computed nothing but the last block: the rest came with the
        // hand-off.
        let prompt = first.prompt_tokens.unwrap();
        assert!(first.cached_tokens.unwrap_or(0) + 16 >= prompt, "{first:?}");
        let next = chat(&stack.base_url(), &c.body(MODEL, 1, 4, false), &[]).await;
        assert_eq!(next.worker.as_deref(), Some(decode.addr.as_str()));
        assert_eq!(next.decision_field("prefill"), Some(prefiller), "{:?}", next.decision);
    }
    assert!(sim_counter(decode, "kvroute_sim:kv_pull_blocks_total").await > pulled);
    let m = stack.envoy.prometheus().await.unwrap();
    assert!(m.get("kvroute_topology_pd").copied().unwrap_or(0.0) >= 6.0, "{m:?}");
}
