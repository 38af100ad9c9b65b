//! Bundle serving over real HTTP: `GET /v1/bundles` lists every configured model's bundle,
//! `GET /v1/bundles/{fingerprint}/{part}` serves it in parts that join into its transfer
//! form (`BundleBlob`: the compiled encoder when the tokenizer has one), both only with the
//! token.

use crate::common;

use std::sync::Arc;

use common::*;
use kvroute_core::decision::tokenize::model::{qwen3_dir, ModelBundle};
use kvroute_core::wire::bundle::{BundleBlob, PART_BYTES};
use kvroute_updater::limits::Limits;
use kvroute_updater::models::{ModelSource, ModelSpec, Models};
use kvroute_updater::state::State;
use serde_json::Value;

async fn get(url: &str, token: Option<&str>) -> reqwest::Response {
    let mut r = reqwest::Client::new().get(url);
    if let Some(t) = token {
        r = r.header("x-kvroute-token", t);
    }
    r.send().await.unwrap()
}

#[tokio::test]
async fn bundles_are_listed_and_served_in_parts_with_the_token_only() {
    let qwen = ModelSpec { name: "Qwen/Qwen3-8B".into(), source: ModelSource::Dir(qwen3_dir()) };
    let models = Models::load(&[qwen, "kvroute-demo".parse().unwrap()], &[]).unwrap();
    let state = Arc::new(State::for_models(Arc::new(models), Vec::new(), Limits::default()));
    let (port, _server) = serve(Arc::clone(&state)).await;
    let base = format!("http://127.0.0.1:{port}/v1/bundles");

    assert_eq!(get(&base, None).await.status(), 401);
    assert_eq!(get(&base, Some("wrong")).await.status(), 401);
    let list: Value = get(&base, Some(TOKEN)).await.json().await.unwrap();
    let bundles = list["bundles"].as_array().unwrap();
    let names: Vec<&str> = bundles.iter().map(|b| b["model"].as_str().unwrap()).collect();
    assert_eq!(names, ["Qwen/Qwen3-8B", "kvroute-demo"]);

    let expected = [ModelBundle::from_dir(&qwen3_dir()).unwrap(), ModelBundle::demo().unwrap()];
    let snapshot_models = state.snapshot().models;
    let text = "<|im_start|>user\nHello, world! naïve café 日本語 🦀 x=1+2;<|im_end|>\n";
    for (b, want) in bundles.iter().zip(&expected) {
        let fp = b["fingerprint"].as_str().unwrap();
        assert_eq!(fp.len(), 16);
        let parts = b["parts"].as_u64().unwrap() as usize;
        let bytes = b["bytes"].as_u64().unwrap() as usize;
        assert_eq!(parts, bytes.div_ceil(PART_BYTES).max(1));
        let mut joined = Vec::new();
        for i in 0..parts {
            let url = format!("{base}/{fp}/{i}");
            assert_eq!(get(&url, None).await.status(), 401);
            let r = get(&url, Some(TOKEN)).await;
            assert_eq!(r.status(), 200);
            assert_eq!(r.headers()["x-kvroute-bundle-parts"], parts.to_string().as_str());
            assert_eq!(r.headers()["content-type"], "application/octet-stream");
            joined.extend_from_slice(&r.bytes().await.unwrap());
        }
        assert_eq!(joined.len(), bytes);
        // Both tokenizers have the exact fast encoder: they travel compiled, and what a
        // thread builds from that encodes as the bundle built from the files.
        let decoded = BundleBlob::decode(&joined).unwrap();
        assert!(matches!(decoded, BundleBlob::Compiled(_)), "{fp} travels compiled");
        let bundle = kvroute_core::shared::bundles::build(&decoded).unwrap();
        assert!(bundle.tokenizer().is_none(), "no tokenizers model is built from it");
        assert_eq!(format!("{:016x}", want.fingerprint()), fp);
        assert_eq!(bundle.fingerprint(), want.fingerprint());
        for special in [false, true] {
            assert_eq!(bundle.encode(text, special).unwrap(), want.encode(text, special).unwrap());
        }
        assert_eq!(bundle.cuts(), want.cuts());
        let info = snapshot_models.iter().find(|m| m.name == b["model"]).unwrap();
        assert_eq!(info.fingerprint, bundle.fingerprint(), "the snapshot names the same bundle");
        // Past the last part, and parts that are not numbers.
        for bad in [parts.to_string(), "x".into(), "-1".into(), "+0".into()] {
            assert_eq!(get(&format!("{base}/{fp}/{bad}"), Some(TOKEN)).await.status(), 404);
        }
        let upper = fp.to_uppercase();
        if upper != fp {
            assert_eq!(get(&format!("{base}/{upper}/0"), Some(TOKEN)).await.status(), 404);
        }
    }
    assert!(bundles[0]["parts"].as_u64().unwrap() > 1, "Qwen3's bundle spans several parts");
    for unknown in ["0000000000000000", "123", "zzzzzzzzzzzzzzzz"] {
        assert_eq!(get(&format!("{base}/{unknown}/0"), Some(TOKEN)).await.status(), 404);
    }
}
