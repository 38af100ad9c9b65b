//! Attacks on a running stack, shared by the siege integration tests
//! (`integration/tests/suite/siege*.rs`, `health.rs`) and the `kvroute-siege` bench
//! (`tools/src/bin/siege.rs`; its results in `docs/results/2026-12-01-siege.md`): each attack
//! does one harmful thing a client, a worker or a neighbour can do, then measures what still
//! works.
//!
//! Where to start: [`table`] is one row per attack as the bench prints it; the attacks are
//! grouped by what they hit: [`workers`] (killed and frozen workers), [`updater`] (msgpack
//! bombs, oversized frames, idle connections, ZMQ garbage), [`envoy`] (idle connections, a
//! trapped VM), [`requests`] (trailers, encoded paths, odd numbers).

pub mod envoy;
pub mod requests;
pub mod table;
pub mod updater;
pub mod workers;
