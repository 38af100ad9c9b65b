//! kvroute-core's golden checks as 32-bit wasm under Node: each test calls the check that
//! kvroute-core's native unit tests call (`kvroute_core::conformance`), so a difference between
//! the host and wasm (a 4-byte `usize`, float or integer semantics, a dependency's wasm build)
//! fails here with the same message. Run with `./dev test`, or
//! `CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner cargo test -p
//! kvroute-core-wasm-tests --target wasm32-unknown-unknown`.
#![cfg(target_arch = "wasm32")]

use kvroute_core::conformance::{self, codecs, oracle, ranking, shared_data};
use kvroute_core::decision::tokenize::model::ModelBundle;
use wasm_bindgen::prelude::*;
use wasm_bindgen_test::wasm_bindgen_test;

// What the filter runs on; a 64-bit wasm target would not test it.
const _: () = assert!(usize::BITS == 32, "these tests are for 32-bit wasm");

#[wasm_bindgen_test]
fn block_hashes() {
    conformance::block_hashes_golden();
}

#[wasm_bindgen_test]
fn journal_entry_codec() {
    codecs::journal_golden();
}

#[wasm_bindgen_test]
fn snapshot_codec() {
    codecs::snapshot_golden();
    codecs::snapshot_pool_golden();
    codecs::snapshot_down_golden();
}

#[wasm_bindgen_test]
fn delta_codec() {
    codecs::delta_golden();
    codecs::delta_golden_with_models_and_a_new_worker();
    codecs::delta_golden_removing_workers();
    codecs::delta_golden_with_workers_down();
}

#[wasm_bindgen_test]
fn peer_report_codec() {
    codecs::peer_report_golden();
}

#[wasm_bindgen_test]
fn hash_counts_past_the_32_bit_address_space_are_refused() {
    codecs::hash_counts_past_the_32_bit_address_space_are_refused();
}

#[wasm_bindgen_test]
fn bundle_files_codec() {
    shared_data::bundle_files_golden();
}

#[wasm_bindgen_test]
fn bundle_manifest_codec() {
    shared_data::manifest_round_trips_and_rejects_garbage();
}

#[wasm_bindgen_test]
fn bundle_sizes_past_4_gib_are_refused() {
    shared_data::bundle_sizes_past_4_gib_are_refused();
}

#[wasm_bindgen_test]
fn calibration_state_codec() {
    shared_data::calibration_state_golden();
}

#[wasm_bindgen_test]
fn snapshot_head_codec() {
    shared_data::head_round_trips_and_rejects_truncation();
}

#[wasm_bindgen_test]
fn cost_ranking_equals_the_host_bit_for_bit() {
    ranking::ranking_golden();
}

#[wasm_bindgen_test]
fn demo_bundle_equals_the_oracle() {
    let bundle = ModelBundle::demo().unwrap_or_else(|e| panic!("demo bundle: {e}"));
    oracle::check("demo", &bundle, oracle::CORPUS, oracle::GOLDEN_DEMO);
    // As a filter thread builds it from the updater: from the compiled encoder.
    let compiled =
        oracle::recompiled(&bundle, kvroute_core::decision::tokenize::model::DEMO_TOKENIZER_CONFIG);
    oracle::check("demo (compiled)", &compiled, oracle::CORPUS, oracle::GOLDEN_DEMO);
    oracle::growing_conversation("demo (compiled)", &compiled);
}

// Node's `fs`: the Qwen3 bundle (11 MB, not committed) is read at run time, not compiled in.
#[wasm_bindgen(module = "fs")]
extern "C" {
    #[wasm_bindgen(js_name = readFileSync, catch)]
    fn read_file_sync(path: &str, encoding: &str) -> Result<String, JsValue>;
}

/// `./dev setup` puts the bundle there (`KVROUTE_QWEN3_DIR` at build time overrides it, as it
/// does `kvroute_core::decision::tokenize::model::qwen3_dir` on the host).
fn qwen3_dir() -> String {
    option_env!("KVROUTE_QWEN3_DIR")
        .map(String::from)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../.cache/models/qwen3").into())
}

#[wasm_bindgen_test]
fn qwen3_equals_the_oracle() {
    let dir = qwen3_dir();
    let read = |name: &str| {
        read_file_sync(&format!("{dir}/{name}"), "utf8").unwrap_or_else(|e| {
            panic!("Qwen3 bundle missing at {dir} (run ./dev setup): {name}: {e:?}")
        })
    };
    let config = read("tokenizer_config.json");
    let bundle = ModelBundle::from_hf(&read("tokenizer.json"), &config)
        .unwrap_or_else(|e| panic!("Qwen3 bundle at {dir}: {e}"));
    oracle::check("qwen3", &bundle, oracle::CORPUS, oracle::GOLDEN_QWEN3);
    let compiled = oracle::recompiled(&bundle, &config);
    drop(bundle);
    oracle::check("qwen3 (compiled)", &compiled, oracle::CORPUS, oracle::GOLDEN_QWEN3);
    oracle::growing_conversation("qwen3 (compiled)", &compiled);
}
