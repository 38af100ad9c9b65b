//! The engine recomputes the last prompt token, so a prompt that is an exact multiple of the
//! block size reuses one block less than the worker holds (vLLM: at most `floor((n-1)/block)`
//! blocks). Through real Envoy, the filter and simulated workers: what kvroute predicts is
//! what the worker reports, and the audit finds no error.

use kvroute_core::decision::audit::{classify, prediction_error, AuditClass};
use kvroute_stack::client::{self, Reply};
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use serde_json::json;

const BLOCK: u64 = 16;

async fn complete(stack: &Stack, ids: &[u32]) -> Reply {
    let http = reqwest::Client::new();
    let body = json!({"model": MODEL, "prompt": ids, "max_tokens": 2});
    let r = client::send(&http, &stack.base_url(), "/v1/completions", body.to_string().into(), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    r
}

fn predicted(r: &Reply) -> u64 {
    r.decision_field("predicted_cached_tokens").and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn exact_multiples_of_the_block_size_are_predicted_as_the_worker_reuses_them() {
    let stack = Stack::start(StackOptions::default()).await.unwrap();
    let mut audited = 0;
    for (i, n) in [64u32, 65, 96, 160, 17, 16].into_iter().enumerate() {
        // A prompt of its own (token ids, no template) of exactly `n` tokens.
        let ids: Vec<u32> = (0..n).map(|t| 100 + 170 * i as u32 + t % 160).collect();
        let first = complete(&stack, &ids).await;
        assert_eq!(first.prompt_tokens, Some(u64::from(n)));
        let again = complete(&stack, &ids).await;
        let reusable = (u64::from(n) - 1) / BLOCK * BLOCK;
        if reusable > 0 {
            assert_eq!(again.worker, first.worker, "{n} tokens: the repeat left the holder");
        }
        let actual = again.cached_tokens.unwrap_or(0);
        assert_eq!(actual, reusable, "{n} tokens: the worker reports the engine's rule");
        assert_eq!(predicted(&again), reusable, "{n} tokens: {:?}", again.decision);
        assert_eq!(prediction_error(predicted(&again), actual, u64::from(n), 16), 0);
        let class = classify(predicted(&again), actual, u64::from(n), 16);
        let want =
            if reusable == 0 { AuditClass::OrdinaryMiss } else { AuditClass::HitAsPredicted };
        assert_eq!(class, want, "{n} tokens");
        audited += usize::from(reusable > 0);
    }
    // The filter's own audit agrees: every repeat a hit as predicted, no false hit.
    let hits =
        kvroute_stack::eventually("audit metric", std::time::Duration::from_secs(10), || async {
            let m = stack.envoy.prometheus().await.ok()?;
            let v = m.get("kvroute_audit_requests{kvroute_audit=\"hit_as_predicted\"}").copied()?;
            (v >= audited as f64).then_some(m)
        })
        .await
        .unwrap();
    let count = |class: &str| {
        hits.get(&format!("kvroute_audit_requests{{kvroute_audit=\"{class}\"}}")).copied()
    };
    assert_eq!(count("hit_as_predicted"), Some(audited as f64));
    assert_eq!(count("false_hit").unwrap_or(0.0), 0.0);
    assert_eq!(count("false_miss").unwrap_or(0.0), 0.0);
}
