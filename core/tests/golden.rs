//! kvroute tokenizes every request of the oracle's corpus exactly as vLLM does: the token ids
//! of `core/tests/golden/<model>.jsonl` were computed by `oracle/golden.py` with transformers
//! (see `oracle/README.md`); here the same requests go through kvroute's own path (request
//! parsing, minijinja rendering, the tokenizers crate) and must give the same ids, token for
//! token. A request the template refuses must fail to render here too.

use std::path::{Path, PathBuf};

use kvroute_core::model::{qwen3, ModelBundle, ModelError};
use kvroute_core::request::{self, Endpoint};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
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
    let path = case["endpoint"].as_str().unwrap();
    let endpoint = Endpoint::from_path(path.as_bytes()).unwrap();
    let body = case["body"].to_string();
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

fn check(model: &str, bundle: &ModelBundle) {
    let corpus = read_jsonl(&root().join("oracle/corpus.jsonl"));
    let golden = read_jsonl(&root().join(format!("core/tests/golden/{model}.jsonl")));
    assert_eq!(
        corpus.len(),
        golden.len(),
        "corpus and golden file are out of step: rerun the oracle"
    );
    let mut failures = Vec::new();
    let mut errors = 0;
    for (case, want) in corpus.iter().zip(&golden) {
        let id = case["id"].as_str().unwrap();
        assert_eq!(want["id"], id, "corpus and golden file are out of step: rerun the oracle");
        let got = kvroute_ids(bundle, case);
        match (want.get("ids"), got) {
            (Some(ids), Ok(got)) => {
                let want: Vec<u32> = serde_json::from_value(ids.clone()).unwrap();
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
    eprintln!(
        "{model}: {} of {} cases equal to the oracle ({errors} refused by both)",
        corpus.len() - failures.len(),
        corpus.len()
    );
    assert!(
        failures.is_empty(),
        "{model}: {} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn demo_bundle_equals_the_oracle() {
    check("demo", &ModelBundle::demo().unwrap());
}

#[test]
fn qwen3_equals_the_oracle() {
    check("qwen3", &qwen3().unwrap());
}
