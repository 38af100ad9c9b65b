//! The config alignment check: does a worker serve what kvroute hashes for? A canary chat is
//! tokenized by the worker (`/tokenize`) and by kvroute's own template + tokenizer; the model id
//! must be served (`/v1/models`); the announced block size (`vllm:cache_config_info`) must be
//! kvroute's. Any mismatch makes the worker cache-incompatible: no cache credit, load only.

use std::time::Duration;

use kvroute_core::model::ModelBundle;
use kvroute_core::request::Prompt;
use serde_json::{json, Value};

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Compatible,
    Incompatible(String),
    /// The worker could not be asked (down, timeout): the previous verdict stands.
    Unknown(String),
}

/// A fixed conversation that exercises system, user and assistant turns and the generation
/// prompt, so template differences show up in its tokens.
pub fn canary() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are kvroute's alignment canary."}),
        json!({"role": "user", "content": "Route this to the worker that holds its prefix."}),
        json!({"role": "assistant", "content": "Checked."}),
        json!({"role": "user", "content": "And now?"}),
    ]
}

/// The block size in a `vllm:cache_config_info` line of a Prometheus scrape.
pub fn announced_block_size(metrics: &str) -> Option<u32> {
    let line = metrics.lines().find(|l| l.starts_with("vllm:cache_config_info{"))?;
    let rest = line.split("block_size=\"").nth(1)?;
    rest.split('"').next()?.parse().ok()
}

/// How an over-long answer shows in a verdict.
const TOO_LARGE: &str = "answer larger than";

/// Checks one worker (`ip:port`) against the model, tokenizer and block size kvroute uses.
pub async fn check(
    http: &reqwest::Client,
    worker: &str,
    model: &str,
    bundle: &ModelBundle,
    block_size: u32,
    max_body: usize,
) -> Verdict {
    match check_inner(http, worker, model, bundle, block_size, max_body).await {
        Ok(v) => v,
        Err(e) => Verdict::Unknown(format!("{e:#}")),
    }
}

async fn check_inner(
    http: &reqwest::Client,
    worker: &str,
    model: &str,
    bundle: &ModelBundle,
    block_size: u32,
    max_body: usize,
) -> anyhow::Result<Verdict> {
    use crate::http_body::{json as capped_json, text as capped_text};
    let base = format!("http://{worker}");
    let timeout = Duration::from_secs(3);
    let models =
        capped_json(http.get(format!("{base}/v1/models")).timeout(timeout).send().await?, max_body)
            .await?;
    let served = models["data"].as_array().is_some_and(|d| d.iter().any(|m| m["id"] == model));
    if !served {
        return Ok(Verdict::Incompatible(format!("model '{model}' is not in /v1/models")));
    }
    let body = json!({"model": model, "messages": canary(), "add_generation_prompt": true});
    let tok = capped_json(
        http.post(format!("{base}/tokenize")).json(&body).timeout(timeout).send().await?,
        max_body,
    )
    .await?;
    let theirs: Vec<u64> = tok["tokens"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let ours: Vec<u64> =
        bundle.prompt_tokens(&Prompt::Messages(canary()))?.into_iter().map(u64::from).collect();
    if theirs != ours {
        let first = theirs
            .iter()
            .zip(&ours)
            .position(|(a, b)| a != b)
            .unwrap_or(theirs.len().min(ours.len()));
        return Ok(Verdict::Incompatible(format!(
            "canary tokens differ from position {first} ({} vs {} tokens): chat template or tokenizer mismatch",
            theirs.len(),
            ours.len()
        )));
    }
    let metrics =
        capped_text(http.get(format!("{base}/metrics")).timeout(timeout).send().await?, max_body)
            .await?;
    if let Some(bs) = announced_block_size(&metrics) {
        if bs != block_size {
            return Ok(Verdict::Incompatible(format!(
                "announced block size {bs}, kvroute uses {block_size}"
            )));
        }
    }
    Ok(Verdict::Compatible)
}

/// Checks every worker now and then every `interval`, updating their verdicts. Block-size
/// mismatches seen in a worker's events also make it incompatible.
pub async fn run(
    state: std::sync::Arc<crate::state::State>,
    workers: Vec<String>,
    bundle: ModelBundle,
    interval: Duration,
) {
    let http = reqwest::Client::new();
    let model = state.domain.model.clone();
    let block_size = state.domain.block_size;
    loop {
        for w in &workers {
            let max_body = state.limits.max_http_body_bytes;
            let verdict = check(&http, w, &model, &bundle, block_size, max_body).await;
            if matches!(&verdict, Verdict::Unknown(why) if why.contains(TOO_LARGE)) {
                state.cap_hit(w, crate::limits::Cap::HttpBody);
            }
            state.update(w, |e, _| {
                let mismatches = e.knowledge.stats.block_size_mismatches;
                let new_mismatches = mismatches > e.mismatches_seen;
                e.mismatches_seen = mismatches;
                match verdict {
                    _ if new_mismatches => {
                        e.compatible = false;
                        e.alignment = Some("events report a different block size".into());
                    }
                    Verdict::Compatible => {
                        e.compatible = true;
                        e.alignment = None;
                    }
                    Verdict::Incompatible(why) => {
                        e.compatible = false;
                        e.alignment = Some(why);
                    }
                    Verdict::Unknown(why) => e.alignment = Some(format!("check failed: {why}")),
                }
            });
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_block_size_from_cache_config_info() {
        let m = "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"32\",engine=\"0\"} 1.0\n";
        assert_eq!(announced_block_size(m), Some(32));
        assert_eq!(announced_block_size("nothing"), None);
    }
}
