//! kvroute-core's tests through its public API: endpoint views of one conversation and Hugging Face
//! bundles.
//!
//! One test binary per crate (each binary links every dependency again, so separate files
//! cost CI minutes and gigabytes of disk). Run one module with
//! `cargo test -p kvroute-core --test suite <module>::`.

mod endpoints;
mod hf_bundle;
