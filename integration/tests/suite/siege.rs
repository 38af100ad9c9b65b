//! A single client's attacks through real Envoy, the filter and simulated workers,
//! the request-level rows of the `kvroute-siege` bench (`kvroute_stack::siege::requests`,
//! judged by `siege::table`'s checks): requests ending with HTTP/2 trailers are routed, shed
//! and counted in flight like the same without; every spelling of `/v1/chat/completions`
//! that vLLM's server would serve is routed by the filter's own matching (Envoy's path
//! normalisation off), none is served unrouted; odd numbers are answered as vLLM answers
//! them, and service goes on.

use std::net::SocketAddr;
use std::time::Duration;

use kvroute_stack::rawhttp::Proto;
use kvroute_stack::siege::envoy::{self, PathOutcome};
use kvroute_stack::siege::requests::{self, PathTry};
use kvroute_stack::siege::table::{self, Check};
use kvroute_stack::stack::{Stack, StackOptions, MODEL};

fn unmet(checks: &[Check]) -> Vec<&str> {
    checks.iter().filter(|c| !c.met).map(|c| c.what.as_str()).collect()
}

async fn after_all_routed(stack: &Stack) {
    let after =
        requests::after_probe(&stack.base_url(), MODEL, 10, Duration::from_secs(10)).await.unwrap();
    assert_eq!(after.ok_routed, after.sent, "after the attack: {after:?}");
}

#[tokio::test]
async fn requests_ending_with_trailers_are_routed_shed_and_counted_as_without() {
    // 20 ms a step: a 40-token stream is in flight for most of a second.
    let opts = StackOptions {
        sim_args: ["--step-floor-ms", "20"].map(String::from).to_vec(),
        ..Default::default()
    };
    let stack = Stack::start(opts).await.unwrap();
    let r = requests::trailers(&stack, MODEL, 5, 40).await;
    assert!(
        unmet(&table::trailers_checks(&r)).is_empty(),
        "{:?}: {r:?}",
        unmet(&table::trailers_checks(&r))
    );
    assert_eq!((r.with.errors, r.without.errors), (0, 0), "{r:?}");
    after_all_routed(&stack).await;
}

/// Spellings of `/v1/chat/completions` that vLLM 0.33's server (uvicorn, then Starlette)
/// serves as a chat completion: it percent-decodes the path once, `%2F` included.
const SERVED_AS_CHAT: [&str; 6] = [
    "/v1/chat/%63ompletions",
    "/v1/chat/completion%73",
    "/%761/chat/completions",
    "/v1%2Fchat%2Fcompletions",
    "/v1/chat%2fcompletions",
    "/v1/chat/%63ompletions?stream=%66alse",
];

#[tokio::test]
async fn every_path_vllm_serves_as_a_chat_completion_is_routed_by_the_filter_itself() {
    // Envoy's own normalisation off: what reaches the filter is the path as the client sent it.
    let edits = [
        ("normalize_path: true", "normalize_path: false"),
        ("merge_slashes: true", "merge_slashes: false"),
        (
            "path_with_escaped_slashes_action: REJECT_REQUEST",
            "path_with_escaped_slashes_action: KEEP_UNCHANGED",
        ),
    ];
    let opts = StackOptions {
        envoy_edits: edits.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(),
        ..Default::default()
    };
    let stack = Stack::start(opts).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], stack.envoy.listen_port));
    for proto in [Proto::Http1, Proto::H2c] {
        for path in SERVED_AS_CHAT {
            let got = envoy::try_path(addr, proto, path, MODEL).await;
            assert_eq!(got, PathOutcome::Routed(200), "{} {path}", proto.name());
        }
    }
    // The rest of the odd spellings: vLLM does not serve them (no slash merging or dot
    // segments in Starlette), and no worker serves them unrouted.
    let tries = requests::encoded_paths(&stack, MODEL).await;
    assert!(unmet(&table::path_checks(&tries)).is_empty(), "{tries:?}");
    let served: Vec<&PathTry> =
        tries.iter().filter(|t| matches!(t.outcome, PathOutcome::Routed(200))).collect();
    assert!(served.len() >= 2 * 5, "the encoded spellings were not all routed: {tries:?}");
    after_all_routed(&stack).await;
}

#[tokio::test]
async fn odd_numbers_are_answered_as_vllm_answers_them() {
    let stack = Stack::start(StackOptions::default()).await.unwrap();
    let tries = requests::odd_numbers(&stack, MODEL).await;
    let checks = table::odd_checks(&tries);
    assert!(unmet(&checks).is_empty(), "{:?}", unmet(&checks));
    for t in &tries {
        assert!(t.took < requests::ANSWER_WITHIN, "{t:?}");
    }
    after_all_routed(&stack).await;
}
