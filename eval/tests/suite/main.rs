//! The evaluation harness end to end on real Envoy and simulated workers (run by the integration
//! stage of `./dev test`, one test at a time).
//!
//! One test binary per crate (each binary links every dependency again, so separate files
//! cost CI minutes and gigabytes of disk). Run one module with
//! `cargo test -p kvroute-eval --test suite <module>::`.

mod bench;
mod external;
mod oracle;
mod qwen3;
mod reference;
