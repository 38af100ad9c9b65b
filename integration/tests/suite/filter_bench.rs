//! `kvroute-filter-bench` (`filter/bench/run.mjs`): the release filter module driven through
//! the proxy-wasm ABI under Node's V8, two threads over one shared-data store. Besides keeping
//! the bench working, this runs the built `.wasm` outside Envoy: every request must be routed,
//! none answered by the filter, each answer must carry the decision header, and the knowledge
//! the threads share (journal, load shards) must move through shared data as it does in Envoy.

use std::process::Command;

use kvroute_stack::paths;

#[test]
fn the_built_filter_routes_every_request_through_the_abi_host() {
    let wasm = paths::wasm_path().expect("the filter module");
    let qwen3 = kvroute_core::decision::tokenize::model::qwen3_dir();
    let script = paths::repo_root().join("filter/bench/run.mjs");
    let out = Command::new("node")
        .args(["--no-liftoff", "--no-warnings"])
        .arg(&script)
        .arg(&wasm)
        .arg(&qwen3)
        .args(["300", "--threads", "2", "--inflight", "8", "--calls", "--phases"])
        .output()
        .expect("node (installed with npm) runs the bench");
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {text}\n{err}");
    assert!(text.contains("300 routed, 0 answered by the filter"), "{text}");
    // Each thread's decisions reach the other: routing credits in the journal, load shards.
    let per_request = |call: &str| -> f64 {
        text.lines()
            .find(|l| l.trim_end().ends_with(call))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(per_request("proxy_set_shared_data kvroute.journal.N") >= 1.0, "{text}");
    assert!(per_request("proxy_get_shared_data kvroute.journal.N (found)") >= 1.0, "{text}");
    assert!(per_request("proxy_set_shared_data kvroute.load.shard.N") >= 1.0, "{text}");
    assert!(per_request("proxy_get_shared_data kvroute.load.shard.N (found)") > 0.0, "{text}");
    // An answer whose first bytes also end it (not streamed) writes the shard twice: when
    // decided, and once for its first byte and its end together (a heartbeat on a tick may
    // add a few).
    let shard_writes = per_request("proxy_set_shared_data kvroute.load.shard.N");
    assert!((2.0..2.5).contains(&shard_writes), "{shard_writes} shard writes: {text}");
    // The decision header's timers were read from every answer: the whole decision and its
    // phases, each with a p50 and a p99.
    for field in ["decision_us", "parse_us", "catchup_us", "journal_us", "decide_us"] {
        let line = text.lines().find(|l| l.trim_start().starts_with(field));
        let values: Vec<u64> = line
            .map(|l| l.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect())
            .unwrap_or_default();
        assert_eq!(values.len(), 2, "no p50 / p99 of {field}: {text}");
    }
    // The per-callback times are printed (their values depend on the machine: not checked).
    for cb in ["request headers", "request body", "response headers", "response body", "log"] {
        assert!(text.lines().any(|l| l.trim_start().starts_with(cb)), "no {cb} line: {text}");
    }
}
