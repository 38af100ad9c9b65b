//! The config alignment check: does a worker serve what kvroute hashes for? Its base model
//! (`/v1/models`, the entry without `parent`) must be a configured model; a canary chat is
//! tokenized by the worker (`/tokenize`) and by that model's template + tokenizer; the block
//! size it announces must be the model's (configured, or learned from the first compatible
//! worker: see [`crate::state::State::apply_check`]). vLLM announces it in
//! `vllm:cache_config_info`; SGLang as `kv_events.block_size` in `/server_info` (its page size
//! times the decode-context-parallel size, the width its KV events use) and as
//! `sglang:page_size` in `/metrics` (the page size alone). Any mismatch makes the worker
//! cache-incompatible: no cache credit, load only.

use std::time::Duration;

use kvroute_core::decision::request::Prompt;
use kvroute_core::decision::tokenize::model::ModelBundle;
use serde_json::{json, Value};

use crate::engine_metrics::EngineMetrics;
use crate::limits::AdapterLimits;
use crate::models::Models;
use crate::worker_check::{AlignmentOutcome, AlignmentVerdict, ServedModels};

/// Reads vLLM's `/v1/models` list: base models have no `parent` (vLLM writes `null`);
/// LoRA adapters have `parent` = the base model and `root` = the adapter's path.
pub fn served(
    models: &Value,
    configured: impl Fn(&str) -> bool,
    limits: &AdapterLimits,
) -> ServedModels {
    let mut out = ServedModels::default();
    let entries = models["data"].as_array().map(Vec::as_slice).unwrap_or_default();
    let parent = |m: &Value| m.get("parent").and_then(Value::as_str).map(str::to_owned);
    let mut fits = |name: &str| {
        let ok = name.len() <= limits.max_name_bytes;
        out.names_too_long += u64::from(!ok);
        ok
    };
    let bases: Vec<&str> = entries
        .iter()
        .filter(|m| parent(m).is_none())
        .filter_map(|m| m["id"].as_str())
        .filter(|id| fits(id))
        .collect();
    let base = bases.iter().find(|b| configured(b)).or(bases.first()).map(|b| b.to_string());
    let mut adapters: Vec<String> = entries
        .iter()
        .filter(|m| parent(m).is_some_and(|p| bases.contains(&p.as_str())))
        .filter_map(|m| m["id"].as_str())
        .filter(|id| fits(id))
        .map(str::to_owned)
        .collect();
    adapters.sort_unstable();
    adapters.dedup();
    if adapters.len() > limits.max_adapters {
        out.adapters_cut = (adapters.len() - limits.max_adapters) as u64;
        adapters.truncate(limits.max_adapters);
    }
    out.base = base;
    out.adapters = adapters;
    out
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

/// The block size a Prometheus scrape announces: vLLM's `vllm:cache_config_info` label, else
/// SGLang's `sglang:page_size` gauge (the page size alone: under decode context parallelism
/// the events' width is larger, see [`sglang_block_size`]).
pub fn announced_block_size(metrics: &str) -> Option<u32> {
    EngineMetrics::parse(metrics).block_size()
}

/// `sglang:page_size` (a gauge, one sample per scheduler; all equal).
pub fn sglang_page_size(metrics: &str) -> Option<u32> {
    EngineMetrics::parse(metrics).sglang_page_size()
}

/// The block size SGLang's `/server_info` announces: `kv_events.block_size` (page size times
/// the decode-context-parallel size, what its KV events and subscribers use), else
/// `page_size` times `dcp_size` from its server arguments (when KV events are off,
/// `kv_events` is null).
pub fn sglang_block_size(server_info: &Value) -> Option<u32> {
    let positive = |v: &Value| v.as_u64().filter(|n| *n > 0).and_then(|n| u32::try_from(n).ok());
    if let Some(b) =
        server_info.get("kv_events").and_then(|k| k.get("block_size")).and_then(positive)
    {
        return Some(b);
    }
    let page = server_info.get("page_size").and_then(positive)?;
    let dcp = server_info.get("dcp_size").and_then(positive).unwrap_or(1);
    page.checked_mul(dcp)
}

/// A `/tokenize` that refused the canary: what the worker said, in a verdict. SGLang answers
/// 400 "add_generation_prompt is supported only with a Jinja chat template." when its chat
/// template is a built-in one rather than Jinja.
pub fn tokenize_refused(status: u16, body: &str) -> String {
    let message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            let m = v.get("message").or_else(|| v.get("error").and_then(|e| e.get("message")));
            m.or(v.get("detail")).or(v.get("error")).and_then(Value::as_str).map(str::to_owned)
        })
        .unwrap_or_else(|| body.trim().to_owned());
    let message: String = message.chars().take(200).collect();
    let why = if message.to_ascii_lowercase().contains("jinja") {
        "the worker's chat template is not a Jinja template, so its rendering cannot be compared"
    } else {
        "the worker would not tokenize the canary chat"
    };
    format!("/tokenize answered HTTP {status}: {why} ({message})")
}

/// How an over-long answer shows in a verdict.
const TOO_LARGE: &str = "answer larger than";

/// A name from a worker, cut for a log line or a verdict.
fn shown(name: &str) -> String {
    name.chars().take(64).collect()
}

/// Fetches a worker's `/v1/models` (at most `max_body` bytes) and reads it.
pub async fn fetch_served(
    http: &reqwest::Client,
    worker: &str,
    models: &Models,
    max_body: usize,
    limits: &AdapterLimits,
) -> Result<ServedModels, crate::http_body::BodyError> {
    let resp = http
        .get(format!("http://{worker}/v1/models"))
        .timeout(Duration::from_secs(3))
        .send()
        .await?;
    let v = crate::http_body::json(resp, max_body).await?;
    Ok(served(&v, |n| models.get(n).is_some(), limits))
}

/// Checks one worker (`ip:port`) against the configured models.
pub async fn check(
    http: &reqwest::Client,
    worker: &str,
    models: &Models,
    max_body: usize,
    limits: &AdapterLimits,
) -> AlignmentOutcome {
    let served = match fetch_served(http, worker, models, max_body, limits).await {
        Ok(s) => s,
        Err(e) => {
            return AlignmentOutcome {
                verdict: AlignmentVerdict::Unknown(format!("/v1/models: {e}")),
                served: None,
                announced_block_size: None,
            }
        }
    };
    let (verdict, announced_block_size) = match &served.base {
        None => (AlignmentVerdict::Incompatible("/v1/models lists no base model".into()), None),
        Some(base) => match models.get(base) {
            None => (
                AlignmentVerdict::Incompatible(format!(
                    "serves model '{}', which is not configured (--model)",
                    shown(base)
                )),
                None,
            ),
            Some(m) => match check_model(http, worker, base, &m.bundle, max_body).await {
                Ok(v) => v,
                Err(e) => (AlignmentVerdict::Unknown(format!("{e:#}")), None),
            },
        },
    };
    AlignmentOutcome { verdict, served: Some(served), announced_block_size }
}

/// The canary (with the worker's model's bundle) and the announced block size.
async fn check_model(
    http: &reqwest::Client,
    worker: &str,
    model: &str,
    bundle: &ModelBundle,
    max_body: usize,
) -> anyhow::Result<(AlignmentVerdict, Option<u32>)> {
    use crate::http_body::{json as capped_json, text as capped_text};
    let base = format!("http://{worker}");
    let timeout = Duration::from_secs(3);
    let body = json!({"model": model, "messages": canary(), "add_generation_prompt": true});
    let resp = http.post(format!("{base}/tokenize")).json(&body).timeout(timeout).send().await?;
    let status = resp.status();
    if matches!(status.as_u16(), 400 | 422) {
        let text = capped_text(resp, max_body).await.unwrap_or_default();
        return Ok((
            AlignmentVerdict::Incompatible(tokenize_refused(status.as_u16(), &text)),
            None,
        ));
    }
    let tok = capped_json(resp, max_body).await?;
    let theirs: Vec<u64> = tok["tokens"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let ours: Vec<u64> =
        bundle.prompt_tokens(&Prompt::messages(canary()))?.into_iter().map(u64::from).collect();
    if theirs != ours {
        let first = theirs
            .iter()
            .zip(&ours)
            .position(|(a, b)| a != b)
            .unwrap_or(theirs.len().min(ours.len()));
        return Ok((
            AlignmentVerdict::Incompatible(format!(
                "canary tokens differ from position {first} ({} vs {} tokens): chat template or tokenizer mismatch",
                theirs.len(),
                ours.len()
            )),
            None,
        ));
    }
    let metrics =
        capped_text(http.get(format!("{base}/metrics")).timeout(timeout).send().await?, max_body)
            .await?;
    let metrics = EngineMetrics::parse(&metrics);
    if let Some(b) = metrics.vllm_block_size() {
        return Ok((AlignmentVerdict::Compatible, Some(b)));
    }
    // SGLang: /server_info has the events' width (page size x DCP size); /metrics the page
    // size alone, used when /server_info does not answer.
    let info = match http.get(format!("{base}/server_info")).timeout(timeout).send().await {
        Ok(r) if r.status().is_success() => capped_json(r, max_body).await.ok(),
        _ => None,
    };
    let announced =
        info.as_ref().and_then(sglang_block_size).or_else(|| metrics.sglang_page_size());
    Ok((AlignmentVerdict::Compatible, announced))
}

/// Counts the caps a reading of `/v1/models` hit.
pub fn count_caps(state: &crate::state::State, worker: &str, served: &ServedModels) {
    use crate::limits::Cap;
    for (cap, n) in
        [(Cap::Adapters, served.adapters_cut), (Cap::AdapterName, served.names_too_long)]
    {
        if n > 0 {
            state.cap_hits(worker, cap, n);
        }
    }
}

/// Checks every worker of `workers` now and then every `interval` (or sooner when the state
/// asks for it: a worker's base model changed), updating their verdicts; one
/// [`run_worker`] each.
pub async fn run(
    state: std::sync::Arc<crate::state::State>,
    workers: Vec<String>,
    interval: Duration,
) {
    let each = workers.into_iter().map(|w| run_worker(std::sync::Arc::clone(&state), w, interval));
    futures::future::join_all(each).await;
}

/// Checks one worker now and then every `interval`, or sooner when its base model changed
/// ([`crate::state::State::align_signal`]); ends when the worker is no longer known.
pub async fn run_worker(
    state: std::sync::Arc<crate::state::State>,
    worker: String,
    interval: Duration,
) {
    let http = reqwest::Client::new();
    let models = std::sync::Arc::clone(state.models());
    let Some(align_now) = state.align_signal(&worker) else { return };
    loop {
        let max_body = state.limits.max_http_body_bytes;
        let outcome = check(&http, &worker, &models, max_body, &state.limits.adapters).await;
        if matches!(&outcome.verdict, AlignmentVerdict::Unknown(why) if why.contains(TOO_LARGE)) {
            state.cap_hit(&worker, crate::limits::Cap::HttpBody);
        }
        if let Some(s) = &outcome.served {
            count_caps(&state, &worker, s);
        }
        state.apply_check(&worker, outcome);
        if !state.knows(&worker) {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = align_now.notified() => {}
        }
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

    /// SGLang 0.5.23: `sglang:page_size` (observability/metrics_collector.py) and
    /// `/server_info`'s `kv_events.block_size` = page size x dcp size
    /// (runtime_context.py `describe_kv_events_publisher`).
    #[test]
    fn reads_sglangs_page_size_and_server_info() {
        let m = "# HELP sglang:page_size KV cache page size in tokens.\n# TYPE sglang:page_size gauge\nsglang:page_size{engine_type=\"unified\",model_name=\"m\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"} 64.0\n";
        assert_eq!(announced_block_size(m), Some(64));
        assert_eq!(sglang_page_size("sglang:page_size 1.0\n"), Some(1));
        assert_eq!(sglang_page_size("sglang:page_size_other 8\nsglang:page_size 0\n"), None);
        let vllm_first = format!("vllm:cache_config_info{{block_size=\"16\"}} 1\n{m}");
        assert_eq!(announced_block_size(&vllm_first), Some(16));
        let info = json!({"page_size": 16, "dcp_size": 4, "kv_events": {"publisher": "zmq", "block_size": 64, "dp_size": 1}});
        assert_eq!(sglang_block_size(&info), Some(64));
        // Events off: kv_events is null; the page size times the DCP size.
        let off = json!({"page_size": 16, "dcp_size": 2, "kv_events": null});
        assert_eq!(sglang_block_size(&off), Some(32));
        assert_eq!(sglang_block_size(&json!({"page_size": 1})), Some(1));
        assert_eq!(sglang_block_size(&json!({"kv_events": {"block_size": 0}})), None);
    }

    /// SGLang's 400 for a built-in (non-Jinja) chat template is named as such.
    #[test]
    fn a_refused_canary_says_why() {
        let body = r#"{"object":"error","message":"add_generation_prompt is supported only with a Jinja chat template.","type":"BadRequestError","param":null,"code":400}"#;
        let v = tokenize_refused(400, body);
        assert!(v.contains("HTTP 400") && v.contains("not a Jinja template"), "{v}");
        assert!(!v.contains("canary tokens differ"));
        let other = tokenize_refused(404, "Not Found");
        assert!(other.contains("HTTP 404") && other.contains("Not Found"), "{other}");
    }

    #[test]
    fn reads_base_model_and_adapters_as_vllm_lists_them() {
        // vLLM's shape: the base has `parent: null` and `root` = its path; each LoRA adapter
        // has `parent` = the base model and `root` = the adapter's path.
        let v = json!({"object": "list", "data": [
            {"id": "Qwen/Qwen3-8B", "object": "model", "root": "/models/qwen3", "parent": null, "max_model_len": 4096},
            {"id": "sql-lora", "object": "model", "root": "/adapters/sql", "parent": "Qwen/Qwen3-8B", "max_model_len": null},
            {"id": "chat-lora", "object": "model", "root": "/adapters/chat", "parent": "Qwen/Qwen3-8B"},
            {"id": "stray", "object": "model", "parent": "other-model"},
        ]});
        let limits = AdapterLimits::default();
        let s = served(&v, |n| n == "Qwen/Qwen3-8B", &limits);
        assert_eq!(s.base.as_deref(), Some("Qwen/Qwen3-8B"));
        assert_eq!(s.adapters, vec!["chat-lora".to_string(), "sql-lora".to_string()]);
        assert_eq!((s.adapters_cut, s.names_too_long), (0, 0));
        // An unconfigured base is still named (for the verdict).
        assert_eq!(served(&v, |_| false, &limits).base.as_deref(), Some("Qwen/Qwen3-8B"));
        // Several names served (`--served-model-name a b`): the configured one is the base.
        let two = json!({"data": [{"id": "a"}, {"id": "b"}, {"id": "l", "parent": "b"}]});
        let s = served(&two, |n| n == "b", &limits);
        assert_eq!((s.base.as_deref(), s.adapters.len()), (Some("b"), 1));
        assert_eq!(served(&json!({"data": []}), |_| true, &limits), ServedModels::default());
        assert_eq!(served(&json!("garbage"), |_| true, &limits), ServedModels::default());
    }

    #[test]
    fn adapter_lists_are_bounded_in_count_and_name_length() {
        let mut data = vec![json!({"id": "m"})];
        for i in 0..10 {
            data.push(json!({"id": format!("lora-{i}"), "parent": "m"}));
        }
        data.push(json!({"id": "x".repeat(40), "parent": "m"}));
        let limits = AdapterLimits { max_adapters: 4, max_name_bytes: 16 };
        let s = served(&json!({ "data": data }), |_| true, &limits);
        assert_eq!(s.adapters, vec!["lora-0", "lora-1", "lora-2", "lora-3"]);
        assert_eq!((s.adapters_cut, s.names_too_long), (6, 1));
    }
}
