//! kvroute-core: everything kvroute decides, with no I/O and no proxy-wasm (it compiles to
//! wasm32). The filter crate is thin glue around it; host access (clock, randomness, shared
//! data) is passed in as values or through a small store trait.
//!
//! Where to start: [`decision::router::Router`] (its module docs lead through a decision:
//! parse, render, tokenize, hash, look up, rank), then [`shared`] for how Envoy's threads and
//! replicas share what they know, and [`wire`] for the bytes the updater sends.
//!
//! Module map, bottom up (each home uses only the ones above it in this list):
//! - [`wire`]: the byte formats, encode/decode only: snapshot, delta, peers, journal entry,
//!   bundle transfer format, and the bounds-checked reader they share.
//! - [`decision`]: the decision logic over values: request parsing, template, tokenization,
//!   hashing, knowledge index, load, cost, calibration, lookahead, router, admission, audit,
//!   usage, misdeployment watch, configuration and error bodies.
//! - [`shared`]: the protocol over Envoy shared data (keys, leases, CAS, journal ring, load
//!   shards, health, readiness, snapshot head and delta ring, bundles, calibration), behind a
//!   small store trait with an in-memory fake.
//! - [`flow`]: the filter's request lifecycle and sync state machines.
//! - `conformance` (tests and the `conformance` feature): golden checks of codecs, hashes,
//!   token ids and cost ranking, run natively and as 32-bit wasm (`core/wasm-tests`).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod decision;
pub mod flow;
pub mod shared;
pub mod wire;
