//! kvroute tokenizes every request of the oracle's corpus exactly as vLLM does: the token ids
//! of `core/tests/golden/<model>.jsonl` were computed by `oracle/golden.py` with transformers
//! (see `oracle/README.md`); [`check`] runs the same requests through kvroute's own path
//! (request parsing, minijinja rendering, the tokenizers crate) and wants the same ids, token
//! for token. A request the template refuses must fail to render here too. The corpus and the
//! golden ids are compiled in (a wasm test has no filesystem); the Qwen3 bundle is not (11 MB,
//! fetched by `./dev setup` into the ignored `.cache/`): each runner loads it its own way.

use serde_json::Value;

use crate::decision::request::{self, Endpoint};
use crate::decision::tokenize::model::{ModelBundle, ModelError};

/// The oracle's request corpus.
pub const CORPUS: &str = include_str!("../../../oracle/corpus.jsonl");
/// vLLM's token ids of [`CORPUS`] with the demo bundle (`assets/demo-model/`).
pub const GOLDEN_DEMO: &str = include_str!("../../tests/golden/demo.jsonl");
/// vLLM's token ids of [`CORPUS`] with Qwen3's tokenizer.
pub const GOLDEN_QWEN3: &str = include_str!("../../tests/golden/qwen3.jsonl");

fn read_jsonl(what: &str, text: &str) -> Vec<Value> {
    let parse = |(i, l): (usize, &str)| {
        serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}, line {}: {e}", i + 1))
    };
    text.lines().enumerate().map(parse).collect()
}

/// A few decoded tokens around `at` (never the whole prompt).
fn around(bundle: &ModelBundle, ids: &[u32], at: usize) -> String {
    let lo = at.saturating_sub(3);
    let hi = (at + 4).min(ids.len());
    let pieces: Vec<String> = ids[lo..hi]
        .iter()
        .map(|id| format!("{id}:{:?}", bundle.decode(&[*id]).unwrap_or_default()))
        .collect();
    format!("[{lo}..{hi}] {}", pieces.join(" "))
}

/// The ids kvroute computes for one corpus case, or the render error.
fn kvroute_ids(bundle: &ModelBundle, case: &Value) -> Result<Vec<u32>, String> {
    let path = case["endpoint"].as_str().unwrap_or_default();
    let endpoint = Endpoint::from_path(path.as_bytes())
        .unwrap_or_else(|| panic!("{}: unknown endpoint {path:?}", case["id"]));
    // `raw`: the body's exact text (numbers spelled as a client may, a BOM), else `body`.
    let body = match case.get("raw") {
        Some(raw) => raw.as_str().unwrap_or_default().to_owned(),
        None => case["body"].to_string(),
    };
    let parsed = request::parse(endpoint, body.as_bytes()).map_err(|e| format!("parse: {e}"))?;
    let full = bundle.prompt_tokens(&parsed.prompt);
    let routed = bundle.routing_tokens(&parsed.prompt);
    match (full, routed) {
        (Ok(full), Ok(routed)) => {
            assert_eq!(routed.hashable, full, "{}: routing ids differ from prompt ids", case["id"]);
            assert_eq!(routed.prompt_tokens, full.len() as u64);
            Ok(full)
        }
        (Err(ModelError::Template(e)), Err(ModelError::Template(_))) => Err(format!("render: {e}")),
        (Err(e), _) | (_, Err(e)) => Err(format!("{e}")),
    }
}

/// Every case of `corpus` through `bundle` against the ids of `golden`; returns how many cases
/// both refuse, and panics listing every case that differs.
pub fn check(model: &str, bundle: &ModelBundle, corpus: &str, golden: &str) -> usize {
    let corpus = read_jsonl("oracle/corpus.jsonl", corpus);
    let golden = read_jsonl(&format!("golden/{model}.jsonl"), golden);
    let stale = "corpus and golden file are out of step: rerun the oracle";
    assert_eq!(corpus.len(), golden.len(), "{stale}");
    let mut failures = Vec::new();
    let mut errors = 0;
    for (case, want) in corpus.iter().zip(&golden) {
        let id = case["id"].as_str().unwrap_or_default();
        assert_eq!(want["id"], id, "{stale}");
        let got = kvroute_ids(bundle, case);
        match (want.get("ids"), got) {
            (Some(ids), Ok(got)) => {
                let want: Vec<u32> = serde_json::from_value(ids.clone())
                    .unwrap_or_else(|e| panic!("{id}: golden ids: {e}"));
                if want != got {
                    let at = want.iter().zip(&got).position(|(a, b)| a != b);
                    let at = at.unwrap_or(want.len().min(got.len()));
                    failures.push(format!(
                        "{id}: {} tokens vs {} expected, first difference at {at}\n    kvroute: {}\n    vLLM:    {}",
                        got.len(),
                        want.len(),
                        around(bundle, &got, at),
                        around(bundle, &want, at)
                    ));
                }
            }
            (Some(_), Err(e)) => failures.push(format!("{id}: kvroute failed ({e}), vLLM did not")),
            (None, Ok(got)) => failures.push(format!(
                "{id}: vLLM refuses it ({}), kvroute gave {} tokens",
                want["error"],
                got.len()
            )),
            (None, Err(_)) => errors += 1,
        }
    }
    assert!(
        failures.is_empty(),
        "{model}: {} of {} cases differ:\n{}",
        failures.len(),
        corpus.len(),
        failures.join("\n")
    );
    errors
}

/// The thread's render cache on a growing conversation (a system prompt, tools, a tool call
/// and its result, then plain turns): the template passes its battery, every turn after the
/// first starts from the one before, and each equals a full render.
pub fn growing_conversation(model: &str, bundle: &ModelBundle) {
    use crate::decision::request::ChatPrompt;
    use crate::decision::tokenize::rendercache::RenderCache;
    use serde_json::json;

    assert!(bundle.template().incremental(), "{model}: the template fails its battery");
    let mut cache = RenderCache::default();
    let mut messages = vec![
        json!({"role": "system", "content": "Answer briefly. ".repeat(20)}),
        json!({"role": "user", "content": "What is the weather?"}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "weather", "arguments": {"city": "Paris"}}}]}),
        json!({"role": "tool", "content": "sunny", "tool_call_id": "c1"}),
    ];
    let tools = vec![json!({"type": "function", "function": {"name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})];
    let turns = 6;
    for turn in 0..turns {
        let mut chat = ChatPrompt::new(messages.clone());
        chat.tools = Some(tools.clone());
        chat.kwargs.insert("enable_thinking".into(), json!(false));
        let full = bundle.render(&chat).unwrap_or_else(|e| panic!("{model}: {e}"));
        let cached = cache.render(bundle, &chat).unwrap_or_else(|e| panic!("{model}: {e}"));
        assert_eq!(cached, full, "{model}: turn {turn} differs from a full render");
        messages.push(json!({"role": "assistant", "content": format!("It is sunny ({turn}).")}));
        messages.push(json!({"role": "user", "content": format!("And tomorrow {turn}?")}));
    }
    // The first turn has 4 messages: short, rendered in full and not stored.
    assert_eq!(cache.stats().hits, turns - 2, "{model}: {:?}", cache.stats());
}

/// `bundle` read back from its compiled encoder: the form a filter thread builds from what
/// the updater serves (no `tokenizers` model), to be [`check`]ed like the bundle itself.
pub fn recompiled(bundle: &ModelBundle, tokenizer_config_json: &str) -> ModelBundle {
    let encoder = bundle.compiled_encoder().expect("the bundle has a fast encoder");
    ModelBundle::from_compiled(bundle.fingerprint(), &encoder, tokenizer_config_json)
        .unwrap_or_else(|e| panic!("compiled bundle: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::tokenize::model::{qwen3_dir, shared_for_tests, DEMO_TOKENIZER_CONFIG};

    #[test]
    fn compiled_bundles_equal_the_oracle() {
        let demo = recompiled(shared_for_tests::demo(), DEMO_TOKENIZER_CONFIG);
        check("demo", &demo, CORPUS, GOLDEN_DEMO);
        let cfg = std::fs::read_to_string(qwen3_dir().join("tokenizer_config.json")).unwrap();
        check("qwen3", &recompiled(shared_for_tests::qwen(), &cfg), CORPUS, GOLDEN_QWEN3);
    }

    #[test]
    fn demo_bundle_equals_the_oracle() {
        let refused = check("demo", shared_for_tests::demo(), CORPUS, GOLDEN_DEMO);
        assert!(refused > 0, "the corpus has cases the template refuses");
    }

    #[test]
    fn qwen3_equals_the_oracle() {
        check("qwen3", shared_for_tests::qwen(), CORPUS, GOLDEN_QWEN3);
    }

    #[test]
    fn growing_conversations_render_from_the_cache() {
        growing_conversation("demo", shared_for_tests::demo());
        growing_conversation("qwen3", shared_for_tests::qwen());
    }
}
