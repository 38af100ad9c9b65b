//! The official OpenAI (3.57) and Anthropic (2.15) Python SDKs, end to end through real Envoy +
//! the kvroute filter + the updater + simulated workers: chat (plain, with a stop string,
//! streamed with usage), completions, responses (plain and streamed), messages (plain, with a
//! stop sequence, streamed through the SDK's stream helper). Each call runs twice with one
//! prompt: every call succeeds, carries the filter's decision, and the repeat reports cached
//! prompt tokens in its endpoint's own usage field, as read by the SDK.
//!
//! The client is `integration/python/sdk_check.py`, run with `.venv/bin/python` (`./dev setup`
//! installs the pinned SDKs from `integration/python/requirements.txt`).

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use kvroute_stack::paths;
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use serde_json::Value;
use tokio::process::Command;

/// The SDK script's output, or why it failed.
async fn run_sdk_check(base_url: &str) -> anyhow::Result<Value> {
    let python = paths::repo_root().join(".venv/bin/python");
    anyhow::ensure!(python.exists(), "{} not found: run ./dev setup", python.display());
    let script = paths::repo_root().join("integration/python/sdk_check.py");
    let child = Command::new(&python)
        .arg(&script)
        .args([base_url, MODEL])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting sdk_check.py")?;
    let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
        .await
        .context("sdk_check.py did not finish within 180 s")??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(out.status.success(), "sdk_check.py failed ({}): {stderr}", out.status);
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("sdk_check.py's output is not JSON; stderr: {stderr}"))
}

/// What each call's runs must report as the reason they ended.
fn expected_finish(name: &str) -> &'static [&'static str] {
    match name {
        "chat" | "chat_stream" | "completions" => &["length"],
        "chat_stop" => &["stop"],
        "responses" => &["incomplete:max_output_tokens"],
        "responses_stream" => &["incomplete"],
        "messages" | "messages_stream" => &["max_tokens"],
        "messages_stop" => &["stop_sequence"],
        _ => &[],
    }
}

#[tokio::test]
async fn official_sdks_work_end_to_end_with_cached_tokens_and_decisions() {
    let opts = StackOptions { updater: true, ..Default::default() };
    let stack = Stack::start(opts).await.unwrap();
    let report = run_sdk_check(&stack.base_url()).await.unwrap();
    let results = report["results"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = results.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "chat",
            "chat_stop",
            "chat_stream",
            "completions",
            "responses",
            "responses_stream",
            "messages",
            "messages_stop",
            "messages_stream"
        ],
        "{report}"
    );
    let mut failures = Vec::new();
    for r in &results {
        let name = r["name"].as_str().unwrap_or("?");
        if r["ok"] != Value::Bool(true) {
            failures.push(format!("{name}: {}", r["error"]));
            continue;
        }
        let runs = r["runs"].as_array().cloned().unwrap_or_default();
        if runs.len() != 2 {
            failures.push(format!("{name}: {} runs", runs.len()));
            continue;
        }
        for (i, run) in runs.iter().enumerate() {
            if run["decision"].as_str().is_none_or(str::is_empty) {
                failures.push(format!("{name} run {i}: no x-kvroute-decision: {run}"));
            }
            let finish = run["finish"].as_str().unwrap_or("");
            if !expected_finish(name).contains(&finish) {
                failures.push(format!("{name} run {i}: ended with {finish:?}"));
            }
            if run["cached"].as_u64().is_none() {
                failures.push(format!("{name} run {i}: no cached-token count: {run}"));
            }
        }
        if runs[1]["cached"].as_u64().unwrap_or(0) == 0 {
            failures.push(format!("{name}: the repeat reused nothing: {}", runs[1]));
        }
        if runs[0]["worker"] != runs[1]["worker"] {
            failures.push(format!("{name}: the repeat left the worker holding its prefix"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}\n{report}");

    // The filter read the cached tokens back from every answer, whatever its endpoint or
    // streaming: each call was audited.
    let calls = 2.0 * results.len() as f64;
    let classes = ["hit_as_predicted", "false_hit", "false_miss", "ordinary_miss"];
    let audited =
        kvroute_stack::eventually("every call audited", Duration::from_secs(10), || async {
            let m = stack.envoy.prometheus().await.ok()?;
            let counts: Vec<(&str, f64)> = classes
                .iter()
                .map(|c| {
                    (
                        *c,
                        m.get(&format!("kvroute_audit_requests{{kvroute_audit=\"{c}\"}}"))
                            .copied()
                            .unwrap_or(0.0),
                    )
                })
                .collect();
            (counts.iter().map(|(_, v)| v).sum::<f64>() >= calls).then_some(counts)
        })
        .await;
    match audited {
        Ok(counts) => eprintln!("audit of the {calls} SDK calls: {counts:?}"),
        Err(_) => {
            let m = stack.envoy.prometheus().await.unwrap_or_default();
            let seen: Vec<_> = m.iter().filter(|(k, _)| k.starts_with("kvroute_audit")).collect();
            panic!("not every one of the {calls} SDK calls was audited: {seen:?}");
        }
    }
}
