//! Checks that pin kvroute's wire formats, token ids and cost estimates, written once and run
//! twice: by this crate's unit tests on the host, and compiled to 32-bit wasm
//! (`wasm32-unknown-unknown`, a 4-byte `usize`, wasm's integer and float semantics: what the
//! filter runs on in Envoy) by `core/wasm-tests` under Node. Each check panics with what
//! differs. Built for tests and with the `conformance` feature only (never in the filter).
//!
//! - [`block_hashes_golden`]: golden vectors of the block-hash chain (here).
//! - [`codecs`]: golden bytes of the knowledge codecs (journal entry, snapshot, delta, peer
//!   report) and refusals of counts a 32-bit decoder cannot hold.
//! - [`shared_data`]: golden bytes and round trips of what Envoy threads share (bundle files,
//!   bundle manifest, calibration state, the snapshot head).
//! - [`oracle`]: the oracle corpus through parsing, template rendering and tokenization,
//!   compared token for token with the ids vLLM computes (`core/tests/golden/<model>.jsonl`).
//! - [`ranking`]: a [`crate::decision::router::Router`] ranking a fixed scenario, estimates bit for bit.

// Golden checks panic with what differs, by design (test code built for the wasm test runner).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod codecs;
pub mod oracle;
pub mod ranking;
pub mod shared_data;

use crate::decision::hash::{block_hash, block_hashes, CacheDomain};

/// The cache domain of the golden vectors.
pub fn golden_domain() -> CacheDomain {
    CacheDomain {
        model: "kvroute-demo".into(),
        tokenizer_fingerprint: 0x0123_4567_89ab_cdef,
        block_size: 4,
        lora_name: None,
        tenant_salt: None,
    }
}

// Cross-checked with the independent `xxhash` Python package (xxh3_64_intdigest).
const GOLDEN_SEED: u64 = 0xe735_d620_3948_18ce;
const GOLDEN_CHAIN: [u64; 2] = [0x72dd_b231_0eae_29a2, 0xbb7c_3e79_6b14_36c3];
const GOLDEN_EMPTY: u64 = 0x2d06_8005_38d3_94c2;
const GOLDEN_1337: u64 = 0x7ee2_cbed_c694_ab46;

/// Golden vectors: these values are on the wire between updater and filter. If this check
/// fails, the hashing scheme changed: bump `HASH_SCHEME_VERSION` and update every peer.
pub fn block_hashes_golden() {
    assert_eq!(golden_domain().seed(), GOLDEN_SEED);
    let hashes = block_hashes(golden_domain().seed(), 4, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(hashes, GOLDEN_CHAIN);
    assert_eq!(block_hash(0, &[]), GOLDEN_EMPTY);
    assert_eq!(block_hash(1337, &[0, 1, 2, 3]), GOLDEN_1337);
}
