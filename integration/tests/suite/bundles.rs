//! Model bundles reach Envoy from the updater, not through the plugin configuration: a new
//! bundle for a model (the updater restarted with it, so a new fingerprint) reaches every Envoy
//! thread without restarting Envoy, and the plugin configuration stays small even with Qwen3's
//! 11 MB tokenizer configured.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvroute_stack::client::{self, Reply};
use kvroute_stack::stack::{
    pools_filter_config, write_config, BundleFrom, Pool, Stack, StackOptions, StackPorts, MODEL,
    UPDATER_TOKEN,
};
use kvroute_stack::workload::Conversation;
use kvroute_stack::{envoy, eventually, paths};
use serde_json::{json, Value};

/// A copy of the demo bundle in `dir`, its chat template marked with `mark` (a Jinja comment:
/// same rendering, another fingerprint).
fn demo_bundle(dir: &Path, mark: &str) -> PathBuf {
    let out = dir.join(format!("demo-{mark}"));
    std::fs::create_dir_all(&out).unwrap();
    let repo = paths::repo_root().join("assets/demo-model");
    std::fs::copy(repo.join("tokenizer.json"), out.join("tokenizer.json")).unwrap();
    let text = std::fs::read_to_string(repo.join("tokenizer_config.json")).unwrap();
    let mut cfg: Value = serde_json::from_str(&text).unwrap();
    let template = cfg["chat_template"].as_str().unwrap().to_string();
    cfg["chat_template"] = json!(format!("{template}{{# {mark} #}}"));
    std::fs::write(out.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    out
}

/// The updater's bundle list: model -> fingerprint.
async fn updater_bundles(stack: &Stack) -> Vec<(String, String)> {
    let port = stack.updater.as_ref().unwrap().port;
    let http = reqwest::Client::new();
    let v: Value = http
        .get(format!("http://127.0.0.1:{port}/v1/bundles"))
        .header("x-kvroute-token", UPDATER_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["bundles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["model"].as_str().unwrap().into(), b["fingerprint"].as_str().unwrap().into()))
        .collect()
}

async fn metric(stack: &Stack, name: &str) -> f64 {
    let m = stack.envoy.prometheus().await.unwrap_or_default();
    m.get(name).copied().unwrap_or(0.0)
}

async fn stats(stack: &Stack) -> String {
    let m = stack.envoy.prometheus().await.unwrap_or_default();
    let mut v: Vec<String> = m
        .iter()
        .filter(|(k, _)| k.starts_with("kvroute_bundle") || k.starts_with("kvroute_fallback"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    v.sort();
    format!("{v:?} (logs in {})", stack.dir.display())
}

/// The Envoy threads (ids from its log) that logged building bundle `fingerprint`.
fn builders(stack: &Stack, fingerprint: &str) -> BTreeSet<String> {
    let log = std::fs::read_to_string(&stack.envoy.log).unwrap_or_default();
    let needle = format!("built bundle {fingerprint} ");
    log.lines()
        .filter(|l| l.contains(&needle))
        .filter_map(|l| Some(l.split('[').nth(2)?.split(']').next()?.to_owned()))
        .collect()
}

/// Waits until the threads that logged building `fingerprint` include `threads` and number at
/// least `at_least`; returns them.
async fn built_by(
    stack: &Stack,
    fingerprint: &str,
    threads: &BTreeSet<String>,
    at_least: usize,
) -> BTreeSet<String> {
    // A worker thread builds bundles once it serves requests (the main thread's copy of the
    // filter never does): keep requests coming, each on a new connection so that Envoy spreads
    // them over its threads.
    let done = eventually("bundle built in every thread", Duration::from_secs(60), || async {
        let probe = json!({"model": MODEL, "max_tokens": 1,
            "messages": [{"role": "user", "content": "which thread are you"}]});
        let _ = client::chat(&reqwest::Client::new(), &stack.base_url(), &probe).await;
        let b = builders(stack, fingerprint);
        (b.len() >= at_least && b.is_superset(threads)).then_some(b)
    })
    .await;
    match done {
        Ok(b) => b,
        Err(e) => panic!("{e} ({fingerprint}, before: {threads:?})\n{}", stats(stack).await),
    }
}

fn field(r: &Reply, k: &str) -> u64 {
    r.decision_field(k).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Sends turn `turn` of `c` until a decision credits blocks from the updater's events (its
/// canonical hashes and the filter's agree, so both use the same bundle fingerprint).
async fn events_credited(stack: &Stack, c: &Conversation, turn: usize) -> Reply {
    let http = reqwest::Client::new();
    let r = eventually("event credit in decisions", Duration::from_secs(40), || async {
        let r =
            client::chat(&http, &stack.base_url(), &c.body(MODEL, turn, 2, false)).await.ok()?;
        assert_eq!(r.status, 200, "{}", r.body);
        (field(&r, "blocks_from_events") > 0).then_some(r)
    })
    .await;
    match r {
        Ok(r) => r,
        Err(e) => panic!("{e}\n{}", stats(stack).await),
    }
}

#[tokio::test]
async fn a_new_bundle_reaches_every_thread_without_restarting_envoy() {
    let tmp = paths::scratch_dir("bundles").unwrap();
    let (v1, v2) = (demo_bundle(&tmp, "v1"), demo_bundle(&tmp, "v2"));
    let pool = Pool { dir: Some(v1.clone()), ..Pool::demo(2) };
    let opts = StackOptions {
        pools: vec![pool.clone()],
        updater: true,
        filter: json!({"knowledge": {"max_event_age_ms": 2000, "event_grace_ms": 300}}),
        ..Default::default()
    };
    let mut stack = Stack::start(opts).await.unwrap();
    let envoy_pid = stack.envoy.guard.pid();
    let before = updater_bundles(&stack).await;
    assert_eq!(before.len(), 1);
    // Envoy runs 2 worker threads: both build the bundle once they serve requests.
    let threads = built_by(&stack, &before[0].1, &BTreeSet::new(), 2).await;
    let no_bundle = "kvroute_fallback_requests{kvroute_fallback=\"no_bundle\"}";
    // Requests a thread served before its first build were routed load-only.
    let load_only_at_start = metric(&stack, no_bundle).await;
    let c = Conversation::new(11, 0, 200, 15, 6);
    let http = reqwest::Client::new();
    client::chat(&http, &stack.base_url(), &c.body(MODEL, 0, 2, false)).await.unwrap();
    events_credited(&stack, &c, 1).await;

    // The updater comes back with another bundle for the model: a new fingerprint.
    let next = Pool { dir: Some(v2), ..pool };
    let u = stack.updater.as_mut().unwrap();
    u.restart_with_models(&[next.updater_model()]).await.unwrap();
    let after = updater_bundles(&stack).await;
    assert_eq!(after.len(), 1);
    assert_ne!(before[0].1, after[0].1, "the updater did not change the fingerprint");
    // Every thread that had the old bundle builds the new one.
    let threads = built_by(&stack, &after[0].1, &threads, 2).await;
    eprintln!("bundle {} built by threads {threads:?}", after[0].1);
    assert_eq!(metric(&stack, "kvroute_bundles_published").await, 2.0);
    // Both bundles are kept while the old one's grace period runs.
    let kept = metric(&stack, "kvroute_bundles_stored_bytes").await;
    assert!(kept > 0.0, "{}", stats(&stack).await);
    // Decisions credit the updater's events again: the filter hashes with the new fingerprint.
    events_credited(&stack, &c, 2).await;
    let r = events_credited(&stack, &c, 3).await;
    assert_eq!(r.decision_field("fallback").as_deref(), Some("none"));
    assert_eq!(stack.envoy.guard.pid(), envoy_pid, "Envoy was restarted");
    assert_eq!(stack.envoy.guard.try_exit(), None);
    assert_eq!(metric(&stack, "kvroute_bundles_build_failures").await, 0.0);
    let load_only = metric(&stack, no_bundle).await;
    assert_eq!(
        load_only,
        load_only_at_start,
        "a thread lost its bundle during the change\n{}",
        stats(&stack).await
    );
}

#[tokio::test]
async fn the_plugin_config_stays_small_with_qwen3() {
    let dir = paths::scratch_dir("small-config").unwrap();
    let ports = StackPorts { admin: 19911, listen: 19010, updater: 19110 };
    let pools = [Pool::demo(2), Pool::qwen3(2)];
    let addrs: Vec<Vec<String>> = vec![
        vec!["127.0.0.1:18001".into(), "127.0.0.1:18002".into()],
        vec!["127.0.0.1:18003".into(), "127.0.0.1:18004".into()],
    ];
    let all: Vec<String> = addrs.concat();
    let cfg = pools_filter_config(&pools, &addrs, &StackOptions::default()).unwrap();
    let path = write_config("kvroute.yaml", &dir, ports, &all, &cfg).unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size < 64 << 10, "the rendered bootstrap is {size} bytes");
    let (ok, out) = envoy::validate(&path).await.unwrap();
    assert!(ok, "the two-model bootstrap does not validate:\n{out}");
    assert!(out.contains("kvroute: configured, pools"), "{out}");
    // What it replaces: Qwen3's bundle inline would not fit a Kubernetes object (~1.5 MB).
    let inline = [Pool { bundle: BundleFrom::Inline, ..Pool::qwen3(2) }];
    let inline = pools_filter_config(&inline, &addrs[1..], &StackOptions::default()).unwrap();
    assert!(inline.to_string().len() > 1_500_000);
}

/// Envoy hands each new connection to the worker thread with the fewest: one connection per
/// thread, opened one after the other, pins one client to each thread.
fn one_connection_per_thread() -> (String, String) {
    let at = "    per_connection_buffer_limit_bytes: 8388608\n";
    (at.into(), format!("{at}    connection_balance_config: {{ exact_balance: {{}} }}\n"))
}

/// Sends one chat request on each pinned client; returns the deciding threads. None of them
/// may route without the bundle.
async fn one_on_each(stack: &Stack, clients: &[reqwest::Client], round: usize) -> BTreeSet<String> {
    let mut threads = BTreeSet::new();
    for (i, http) in clients.iter().enumerate() {
        let body = json!({"model": MODEL, "max_tokens": 1,
            "messages": [{"role": "user", "content": format!("round {round} client {i}")}]});
        let r = client::chat(http, &stack.base_url(), &body).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        let fallback = r.decision_field("fallback").unwrap_or_default();
        assert_ne!(fallback, "no_bundle", "client {i}, round {round}: {}", stats(stack).await);
        threads.insert(r.decision_field("thread").unwrap_or_default());
    }
    threads
}

#[tokio::test]
async fn from_ready_on_every_thread_routes_with_its_bundle_also_across_a_bundle_change() {
    let tmp = paths::scratch_dir("ready").unwrap();
    let (v1, v2) = (demo_bundle(&tmp, "v1"), demo_bundle(&tmp, "v2"));
    let pool = Pool { dir: Some(v1), ..Pool::demo(2) };
    let threads = 3;
    let opts = StackOptions {
        pools: vec![pool.clone()],
        updater: true,
        envoy_concurrency: threads,
        envoy_edits: vec![one_connection_per_thread()],
        ..Default::default()
    };
    let mut stack = Stack::start(opts).await.unwrap();
    // "ready": every worker thread counts itself, before any request was sent.
    stack.envoy.wait_threads_ready(true, Duration::from_secs(120)).await.unwrap();
    assert_eq!(metric(&stack, "kvroute_threads_ready").await, f64::from(threads));
    let before = updater_bundles(&stack).await;
    let built = builders(&stack, &before[0].1);
    assert_eq!(built.len(), threads as usize, "built before serving by {built:?}");
    let clients: Vec<reqwest::Client> = (0..threads)
        .map(|_| reqwest::Client::builder().http1_only().pool_max_idle_per_host(1).build().unwrap())
        .collect();
    let seen = one_on_each(&stack, &clients, 0).await;
    assert_eq!(seen.len(), threads as usize, "one client per thread: {seen:?}");

    // The updater comes back with another bundle: every thread swaps without a gap.
    let next = Pool { dir: Some(v2), ..pool };
    let u = stack.updater.as_mut().unwrap();
    u.restart_with_models(&[next.updater_model()]).await.unwrap();
    let after = updater_bundles(&stack).await;
    assert_ne!(before[0].1, after[0].1);
    let mut round = 1;
    let swapped = eventually("every thread built the new bundle", Duration::from_secs(60), || {
        round += 1;
        let (stack, clients, fp) = (&stack, &clients, after[0].1.clone());
        async move {
            assert_eq!(one_on_each(stack, clients, round).await.len(), threads as usize);
            (builders(stack, &fp).len() >= threads as usize).then_some(())
        }
    })
    .await;
    swapped.unwrap_or_else(|e| panic!("{e}"));
    one_on_each(&stack, &clients, 999).await;
    let no_bundle = "kvroute_fallback_requests{kvroute_fallback=\"no_bundle\"}";
    assert_eq!(metric(&stack, no_bundle).await, 0.0, "{}", stats(&stack).await);
    assert_eq!(metric(&stack, "kvroute_threads_ready").await, f64::from(threads));
}
