//! Envoy under siege: a filter VM that aborts comes back and routes with knowledge
//! within seconds without a 503; an idle-connection flood of twice Envoy's file-descriptor
//! limit does not stop service; odd spellings of a kvroute path are routed or refused, never
//! passed through unrouted. The attacks are `kvroute_stack::siege::envoy`'s, shared with
//! the `kvroute-siege` bench.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use kvroute_stack::rawhttp::Proto;
use kvroute_stack::siege::envoy::{
    self as siege, EnvoyOutcome, IdleFlood, PathOutcome, TrapReport, ODD_PATHS,
};
use kvroute_stack::stack::{Pool, Stack, StackOptions, MODEL};
use kvroute_stack::{client, eventually};
use serde_json::json;

const TRAP: &str = "/kvroute/trap";
const THREADS: u32 = 3;

/// Envoy hands each new connection to the worker thread with the fewest: pinned clients opened
/// one after the other land one on each thread.
fn exact_balance() -> (String, String) {
    let at = "    per_connection_buffer_limit_bytes: 8388608\n";
    (at.into(), format!("{at}    connection_balance_config: {{ exact_balance: {{}} }}\n"))
}

/// The shipped bootstrap's failure policy, as written there.
const SHIPPED_POLICY: &str =
    "failure_policy: FAIL_RELOAD\n                reload_config:\n                  backoff: { base_interval: 0.01s }\n";

/// A stack whose bundle and knowledge come from the updater (the hard case for a fresh VM),
/// `THREADS` Envoy worker threads, the filter's trap path on, and `policy` in place of the
/// shipped failure policy.
async fn trap_stack(policy: &str) -> Stack {
    let mut edits = vec![exact_balance()];
    if policy != SHIPPED_POLICY {
        edits.push((SHIPPED_POLICY.into(), format!("{policy}\n")));
    }
    let opts = StackOptions {
        pools: vec![Pool::demo(2)],
        updater: true,
        envoy_concurrency: THREADS,
        envoy_edits: edits,
        filter: json!({"fault_injection": {"trap_path": TRAP}}),
        ..Default::default()
    };
    let stack = Stack::start(opts).await.unwrap();
    stack.envoy.wait_threads_ready(true, Duration::from_secs(120)).await.unwrap();
    stack
}

/// One routed request per pinned client; returns the deciding threads.
async fn every_thread_routes(stack: &Stack, clients: &[reqwest::Client]) -> BTreeSet<String> {
    let mut threads = BTreeSet::new();
    for (i, http) in clients.iter().enumerate() {
        let r = client::chat(http, &stack.base_url(), &siege::chat_body(MODEL, 90_000 + i)).await;
        let outcome = EnvoyOutcome::of(&r);
        assert_eq!(outcome, EnvoyOutcome::Routed, "client {i} before the trap: {r:?}");
        threads.insert(r.unwrap().decision_field("thread").unwrap_or_default());
    }
    threads
}

/// Envoy's wasm reload counters (`wasm.kvroute.vm_reload_*`) and kvroute's thread gauges, by
/// name.
async fn reloads(stack: &Stack) -> HashMap<String, f64> {
    let m = stack.envoy.prometheus().await.unwrap_or_default();
    let shown = |k: &str| k.contains("kvroute_vm_reload") || k.starts_with("kvroute_threads_");
    m.into_iter().filter(|(k, _)| shown(k)).collect()
}

fn show(r: &TrapReport) -> String {
    format!(
        "trap answered {}; after it {} sent: {} routed, {} load-only, {} passed through, {} \
         failed {:?}; routed with knowledge on every thread again after {:?}",
        r.trap_answer,
        r.sent,
        r.routed,
        r.load_only,
        r.passed_through,
        r.failed,
        r.failures,
        r.recovered_after
    )
}

/// Traps one thread's VM once per entry of `windows`, measuring that long after each.
async fn trap_rounds(policy: &str, windows: &[Duration]) -> Vec<TrapReport> {
    let stack = trap_stack(policy).await;
    let clients = siege::pinned_clients(THREADS as usize).unwrap();
    let threads = every_thread_routes(&stack, &clients).await;
    assert_eq!(threads.len(), THREADS as usize, "one client per thread: {threads:?}");
    let mut out = Vec::new();
    for (t, window) in windows.iter().enumerate() {
        let r = siege::trap_and_measure(&stack.base_url(), TRAP, MODEL, &clients, *window)
            .await
            .unwrap();
        let counts = reloads(&stack).await;
        eprintln!("{policy:?} trap {}: {}; {counts:?}", t + 1, show(&r));
        if policy == SHIPPED_POLICY {
            // Envoy replaced the VM (once per trap), it did not just pass requests around it.
            let ok = counts.get("envoy_wasm_kvroute_vm_reload_success").copied();
            assert_eq!(ok, Some((t + 1) as f64), "{counts:?}");
            // The readiness gauges count the live VMs only: the dead one's mark went stale
            // (the measuring window is longer than its freshness), the new one's counts.
            for g in ["kvroute_threads_bundled", "kvroute_threads_ready"] {
                assert_eq!(counts.get(g).copied(), Some(f64::from(THREADS)), "{g}: {counts:?}");
            }
        }
        out.push(r);
    }
    out
}

#[tokio::test]
async fn a_trapped_vm_is_reloaded_and_routes_with_knowledge_within_5s_without_a_503() {
    let window = Duration::from_secs(8);
    let reports = trap_rounds(SHIPPED_POLICY, &[window, window]).await;
    for (i, r) in reports.iter().enumerate() {
        // The trapping request itself dies with its VM (reset, or a 5xx for its stream); no
        // other request is failed because of it.
        assert!(r.trap_answer == "reset" || r.trap_answer.starts_with('5'), "{}", show(r));
        assert_eq!(r.failed, 0, "trap {}: {}", i + 1, show(r));
        assert_eq!(r.passed_through, 0, "trap {}: {}", i + 1, show(r));
        let back = r.recovered_after.unwrap_or_else(|| panic!("trap {}: {}", i + 1, show(r)));
        assert!(back <= Duration::from_secs(5), "trap {}: {}", i + 1, show(r));
        assert!(r.routed > 0, "{}", show(r));
    }
}

/// The comparison behind the shipped choice (not run by default: about two minutes). Prints,
/// per policy, what followed each of two traps on one thread.
#[tokio::test]
#[ignore = "measurement: FAIL_OPEN vs FAIL_RELOAD backoffs; run with --ignored --nocapture"]
async fn measure_failure_policies() {
    let policies = [
        "failure_policy: FAIL_OPEN",
        "failure_policy: FAIL_RELOAD",
        "failure_policy: FAIL_RELOAD\n                reload_config: { backoff: { base_interval: 0.1s } }",
        "failure_policy: FAIL_RELOAD\n                reload_config: { backoff: { base_interval: 0.01s } }",
    ];
    let window = Duration::from_secs(8);
    for p in policies {
        trap_rounds(p, &[window, window]).await;
    }
    // Back to back: each trap lands right after the previous one's reload, inside its backoff.
    let quick = Duration::from_millis(1);
    for p in &policies[1..] {
        trap_rounds(p, &[quick, quick, window]).await;
    }
}

/// Envoy's open-file limit in the flood test, and the connection cap the bootstrap would be
/// given under it (below the limit, room left for upstream connections and files).
const NOFILE: usize = 512;
const CAP: usize = 400;

#[tokio::test]
async fn an_idle_flood_of_twice_the_fd_limit_does_not_stop_service() {
    let cap = "max_active_downstream_connections: 32768";
    let opts = StackOptions {
        envoy_edits: vec![(cap.into(), format!("max_active_downstream_connections: {CAP}"))],
        ..Default::default()
    };
    // The attacker (this process) holds 2 x NOFILE connections and still makes requests.
    siege::ensure_own_nofile(2 * NOFILE as u64 + 512).unwrap();
    let stack = Stack::start(opts).await.unwrap();
    let pid = stack.envoy.guard.pid().expect("envoy runs");
    siege::limit_nofile(pid, NOFILE as u64).unwrap();
    let first = siege::serve_through(
        &stack.base_url(),
        MODEL,
        1,
        Duration::from_secs(5),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(first.ok, 1, "before the flood: {first:?}");

    // 2 x the fd limit: most idle (connected, nothing sent), some stopped mid request line.
    let addr = stack.base_url().trim_start_matches("http://").to_owned();
    let flood =
        IdleFlood::open(&addr, 2 * NOFILE - 124, 124, Duration::from_secs(2)).await.unwrap();
    eprintln!(
        "flood: {} connections opened ({} partial), {} not",
        flood.opened, flood.partial, flood.not_opened
    );
    assert!(flood.opened >= NOFILE, "the flood opened only {}", flood.opened);
    let served = siege::serve_through(
        &stack.base_url(),
        MODEL,
        10,
        Duration::from_secs(5),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let left = flood.still_open();
    eprintln!("during the flood: {served:?}; flood connections still open {left}");
    assert_eq!(served.ok, 10, "{served:?}");
    flood.close();

    // Service as usual afterwards, and Envoy no longer warns about the missing connection limit.
    let after = siege::serve_through(
        &stack.base_url(),
        MODEL,
        5,
        Duration::from_secs(5),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!((after.ok, after.failed_tries), (5, 0), "{after:?}");
    let log = std::fs::read_to_string(&stack.envoy.log).unwrap();
    assert!(!log.contains("no configured limit"), "Envoy still warns about the connection limit");
    assert!(!log.contains("overload manager is not configured"), "overload manager warning");
}

#[tokio::test]
async fn odd_spellings_of_a_kvroute_path_are_routed_or_refused() {
    let stack = Stack::start(StackOptions::default()).await.unwrap();
    let addr: std::net::SocketAddr =
        stack.base_url().trim_start_matches("http://").parse().unwrap();
    for proto in [Proto::Http1, Proto::H2c] {
        let plain = siege::try_path(addr, proto, "/v1/chat/completions", MODEL).await;
        assert_eq!(plain, PathOutcome::Routed(200), "{}", proto.name());
        for path in ODD_PATHS {
            let got = siege::try_path(addr, proto, path, MODEL).await;
            let fine = matches!(got, PathOutcome::Routed(_) | PathOutcome::Refused(400..=499));
            assert!(fine, "{} {path}: {got:?}", proto.name());
        }
        // What RFC 3986 normalisation makes of them: the unreserved characters decoded and the
        // dot segments and double slashes resolved are the plain path, routed and served.
        for path in &ODD_PATHS[..6] {
            let got = siege::try_path(addr, proto, path, MODEL).await;
            assert_eq!(got, PathOutcome::Routed(200), "{} {path}", proto.name());
        }
        // Encoded slashes are refused outright.
        for path in &ODD_PATHS[7..] {
            let got = siege::try_path(addr, proto, path, MODEL).await;
            assert_eq!(got, PathOutcome::Refused(400), "{} {path}", proto.name());
        }
    }
    eventually("envoy still serves", Duration::from_secs(5), || async {
        let r =
            client::chat(&reqwest::Client::new(), &stack.base_url(), &siege::chat_body(MODEL, 1))
                .await
                .ok()?;
        (r.status == 200).then_some(())
    })
    .await
    .unwrap();
}
