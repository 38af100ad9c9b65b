//! LoRA adapters end to end: an adapter loaded on one worker at run time (vLLM's
//! `/v1/load_lora_adapter`) is learned by the updater from that worker's `/v1/models`, reaches
//! the filter through the snapshot, and requests naming it go to the worker that has it (the
//! others would pay the adapter-load cost); when it moves to another worker, so do they. An
//! adapter nobody serves gets a 404, never a blind route.

use std::time::Duration;

use kvroute_stack::client::{self, Reply};
use kvroute_stack::eventually;
use kvroute_stack::stack::{Pool, Stack, StackOptions, MODEL};
use kvroute_stack::workload::Conversation;
use serde_json::json;

const ADAPTER: &str = "sql-lora";

async fn adapter_api(worker: &str, verb: &str) {
    let url = format!("http://{worker}/v1/{verb}_lora_adapter");
    let body = json!({"lora_name": ADAPTER, "lora_path": "/adapters/sql"});
    let r = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200, "{verb}: {}", r.text().await.unwrap_or_default());
}

/// Sends turn `turn` of `c` to the adapter until it is served by `worker`.
async fn served_by(stack: &Stack, c: &Conversation, turn: usize, worker: &str) -> Reply {
    let http = reqwest::Client::new();
    let r = eventually("adapter requests reach its worker", Duration::from_secs(30), || async {
        let r =
            client::chat(&http, &stack.base_url(), &c.body(ADAPTER, turn, 2, false)).await.ok()?;
        (r.status == 200 && r.worker.as_deref() == Some(worker)).then_some(r)
    })
    .await;
    r.unwrap_or_else(|e| panic!("{e} (logs in {})", stack.dir.display()))
}

#[tokio::test]
async fn adapter_requests_follow_the_worker_that_has_the_adapter_loaded() {
    let opts = StackOptions { pools: vec![Pool::demo(3)], updater: true, ..Default::default() };
    let stack = Stack::start(opts).await.unwrap();
    let workers = stack.pool(MODEL).to_vec();
    let http = reqwest::Client::new();
    let c = Conversation::new(23, 0, 120, 10, 8);

    // Unknown to every worker: refused by the filter like any unknown model.
    let r = client::chat(&http, &stack.base_url(), &c.body(ADAPTER, 0, 2, false)).await.unwrap();
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("model_not_found"), "{}", r.body);

    adapter_api(&workers[1], "load").await;
    served_by(&stack, &c, 0, &workers[1]).await;
    for turn in 1..4 {
        let r =
            client::chat(&http, &stack.base_url(), &c.body(ADAPTER, turn, 2, false)).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.worker.as_deref(), Some(workers[1].as_str()), "turn {turn}");
    }
    // The base model still routes over the whole pool.
    let base = client::chat(&http, &stack.base_url(), &c.body(MODEL, 0, 2, false)).await.unwrap();
    assert_eq!(base.status, 200, "{}", base.body);

    // The adapter moves: requests follow it once the updater has seen both workers' lists.
    adapter_api(&workers[1], "unload").await;
    adapter_api(&workers[2], "load").await;
    served_by(&stack, &c, 4, &workers[2]).await;
    let r = client::chat(&http, &stack.base_url(), &c.body(ADAPTER, 5, 2, false)).await.unwrap();
    assert_eq!(r.worker.as_deref(), Some(workers[2].as_str()));
}
