//! kvroute-decision-bench: the filter's decision time inside Envoy for ~8k-token chat prompts
//! (parse + render + tokenize + hash + score), read from its `kvroute.decision_time_us`
//! histogram.

use std::time::Duration;

use kvroute_integration::client;
use kvroute_integration::stack::{Stack, StackOptions, MODEL};
use serde_json::json;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let stack = Stack::start(StackOptions::default()).await?;
    let http = reqwest::Client::new();
    // ~8k tokens: the demo tokenizer yields about 1.1 tokens per generated word.
    for i in 0..40u64 {
        let text = kvroute_core::textgen::words(0xBE7C4 + i, 7050);
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1});
        let r = client::chat(&http, &stack.base_url(), &body).await?;
        anyhow::ensure!(r.status == 200, "decision bench request failed: {}", r.status);
        if i == 0 {
            println!("decision bench: prompts of {} tokens", r.prompt_tokens.unwrap_or(0));
        }
    }
    tokio::time::sleep(Duration::from_secs(6)).await; // Envoy merges histograms every 5 s.
    let q = stack.envoy.histogram_quantiles("wasmcustom.kvroute.decision_time_us").await?;
    let show = |k: &str| q.get(k).map_or("n/a".to_string(), |v| format!("{v:.0}"));
    println!(
        "decision time (parse + render + tokenize + hash + score), µs: p50 {} p99 {}",
        show("P50"),
        show("P99")
    );
    Ok(())
}
