//! Several models behind one Envoy, their bundles distributed by the updater (none inline in
//! the plugin configuration): each model routes only within its own pool, and Qwen3
//! conversations (a real 151 k-token tokenizer, built inside every Envoy thread from shared
//! data) get real cache hits that the prediction audit agrees with. A model whose bundle is not
//! available is routed load-only (`no_bundle`), never refused.

use std::collections::HashMap;
use std::time::Duration;

use kvroute_core::decision::audit::{classify, AuditClass};
use kvroute_stack::client::{self, Reply};
use kvroute_stack::eventually;
use kvroute_stack::stack::{BundleFrom, Pool, Stack, StackOptions, MODEL, QWEN3_MODEL};
use kvroute_stack::workload::Conversation;
use serde_json::{json, Value};

fn two_models() -> StackOptions {
    StackOptions {
        pools: vec![Pool::demo(2), Pool::qwen3(2)],
        updater: true,
        filter: json!({"knowledge": {"max_event_age_ms": 2000, "event_grace_ms": 300}}),
        ..Default::default()
    }
}

fn field(r: &Reply, k: &str) -> u64 {
    r.decision_field(k).and_then(|v| v.parse().ok()).unwrap_or(0)
}

async fn chat(stack: &Stack, body: &Value) -> Reply {
    let http = reqwest::Client::new();
    let r = client::chat(&http, &stack.base_url(), body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    r
}

/// Envoy's samples whose name starts with `prefix`, for failure messages.
async fn stats(stack: &Stack, prefix: &str) -> String {
    let m = stack.envoy.prometheus().await.unwrap_or_default();
    let mut v: Vec<String> =
        m.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, v)| format!("{k}={v}")).collect();
    v.sort();
    format!("{v:?} (logs in {})", stack.dir.display())
}

/// The bundle lines Envoy logged (build times and VM memory, no prompt text).
fn bundle_log(stack: &Stack) -> Vec<String> {
    let log = std::fs::read_to_string(&stack.envoy.log).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("kvroute: b") && l.contains("bundle"))
        .map(str::to_owned)
        .collect()
}

/// Envoy's resident memory (kB).
fn envoy_rss_kb(stack: &Stack) -> u64 {
    stack.envoy.guard.rss_kb().unwrap_or(0)
}

/// Waits until the singleton published `bundles` bundles and every one of Envoy's `threads`
/// threads built each of them. A worker thread builds bundles once it serves requests, so
/// requests keep coming meanwhile, each on a new connection so that Envoy spreads them over
/// its threads.
async fn bundles_built(stack: &Stack, bundles: f64, threads: f64) {
    let done =
        eventually("bundles built in every Envoy thread", Duration::from_secs(180), || async {
            let probe = json!({"model": MODEL, "max_tokens": 1,
                "messages": [{"role": "user", "content": "which thread are you"}]});
            let _ = client::chat(&reqwest::Client::new(), &stack.base_url(), &probe).await;
            let m = stack.envoy.prometheus().await.ok()?;
            let published = m.get("kvroute_bundles_published").copied().unwrap_or(0.0);
            let builds = m.get("kvroute_bundles_builds").copied().unwrap_or(0.0);
            (published >= bundles && builds >= bundles * threads).then_some(())
        })
        .await;
    if let Err(e) = done {
        panic!("{e}\n{}\n{:#?}", stats(stack, "kvroute_bundle").await, bundle_log(stack));
    }
}

#[tokio::test]
async fn two_models_route_within_their_pools_and_qwen3_conversations_hit_the_cache() {
    let stack = Stack::start(two_models()).await.unwrap();
    let rss_before = envoy_rss_kb(&stack);
    // Until its bundle is built, a model is routed on load alone: never a refusal.
    let early = Conversation::new(5, 99, 50, 10, 1);
    let r = chat(&stack, &early.body(QWEN3_MODEL, 0, 2, false)).await;
    let fallback = r.decision_field("fallback").unwrap_or_default();
    assert!(fallback == "no_bundle" || fallback == "none", "{fallback}");
    bundles_built(&stack, 2.0, 2.0).await;
    let log = bundle_log(&stack);
    eprintln!(
        "Envoy VmRSS {} MiB before the bundles, {} MiB with both built in 2 threads; bundle log:\n{}",
        rss_before >> 10,
        envoy_rss_kb(&stack) >> 10,
        log.join("\n")
    );
    assert!(
        log.iter().filter(|l| l.contains("built bundle")).count() >= 4,
        "every thread logs each build once: {log:#?}"
    );
    // The plugin configuration carries no tokenizer: the bundles came from the updater.
    let config = std::fs::read_to_string(stack.dir.join("kvroute.yaml")).unwrap();
    assert!(config.len() < 64 << 10 && !config.contains("\"tokenizer\""));

    let convs: Vec<(String, Conversation)> = (0..4)
        .flat_map(|i| {
            [
                (QWEN3_MODEL.to_string(), Conversation::new(41, i, 300, 20, 4)),
                (MODEL.to_string(), Conversation::new(42, i, 200, 15, 4)),
            ]
        })
        .collect();
    let mut served: HashMap<String, Vec<String>> = HashMap::new();
    let (mut qwen_later, mut qwen_hits, mut false_hits, mut agree) = (0, 0, 0, 0);
    for turn in 0..4 {
        for (model, c) in &convs {
            let r = chat(&stack, &c.body(model, turn, 4, false)).await;
            let worker = r.worker.clone().unwrap();
            assert!(
                stack.pool(model).contains(&worker),
                "{model} served by {worker}, outside its pool {:?}",
                stack.pool(model)
            );
            assert_ne!(r.decision_field("fallback").as_deref(), Some("no_bundle"), "{model}");
            served.entry(model.clone()).or_default().push(worker);
            if model != QWEN3_MODEL || turn == 0 {
                continue;
            }
            let predicted = field(&r, "predicted_cached_tokens");
            let actual = r.cached_tokens.unwrap_or(0);
            let class = classify(predicted, actual, r.prompt_tokens.unwrap_or(0), 16);
            qwen_later += 1;
            qwen_hits += usize::from(actual > 0);
            false_hits += usize::from(class == AuditClass::FalseHit);
            agree += usize::from(class == AuditClass::HitAsPredicted);
        }
    }
    for (model, workers) in &served {
        let mut distinct = workers.clone();
        distinct.sort();
        distinct.dedup();
        eprintln!("{model}: {} requests over {distinct:?}", workers.len());
    }
    let diag = stats(&stack, "kvroute_").await;
    assert_eq!(qwen_hits, qwen_later, "every later Qwen3 turn reuses its history\n{diag}");
    assert_eq!(false_hits, 0, "no Qwen3 prediction claims more than the worker reused\n{diag}");
    assert!(agree * 10 >= qwen_later * 9, "{agree}/{qwen_later} hit as predicted\n{diag}");
    let m = stack.envoy.prometheus().await.unwrap();
    let hit = m.get("kvroute_audit_requests{kvroute_audit=\"hit_as_predicted\"}").copied();
    assert!(hit.unwrap_or(0.0) >= agree as f64, "{diag}");
    let no_bundle = "kvroute_fallback_requests{kvroute_fallback=\"no_bundle\"}";
    assert!(m.contains_key(no_bundle), "the no_bundle fallback is exported\n{diag}");
}

#[tokio::test]
async fn a_model_without_its_bundle_is_routed_load_only() {
    // Pinned to a fingerprint the updater never serves: the model never gets a bundle.
    let pool = Pool { bundle: BundleFrom::Pinned(0xff), ..Pool::demo(2) };
    let opts = StackOptions { pools: vec![pool], updater: true, ..Default::default() };
    let stack = Stack::start(opts).await.unwrap();
    let published =
        eventually("the updater's bundle published", Duration::from_secs(60), || async {
            let m = stack.envoy.prometheus().await.ok()?;
            (m.get("kvroute_bundles_published").copied().unwrap_or(0.0) >= 1.0).then_some(())
        })
        .await;
    if let Err(e) = published {
        panic!("{e}\n{}", stats(&stack, "kvroute_bundle").await);
    }
    let c = Conversation::new(7, 0, 100, 10, 6);
    for turn in 0..6 {
        let r = chat(&stack, &c.body(MODEL, turn, 2, false)).await;
        assert_eq!(r.decision_field("fallback").as_deref(), Some("no_bundle"));
        assert_eq!(field(&r, "predicted_cached_tokens"), 0);
        assert!(stack.pool(MODEL).contains(r.worker.as_ref().unwrap()));
    }
    eprintln!("Envoy VmRSS with the demo bundle only: {} MiB", envoy_rss_kb(&stack) >> 10);
    let m = stack.envoy.prometheus().await.unwrap();
    let counted = m.get("kvroute_fallback_requests{kvroute_fallback=\"no_bundle\"}").copied();
    assert!(counted.unwrap_or(0.0) >= 6.0, "{}", stats(&stack, "kvroute_").await);
}
