//! The updater as a process and as a library: bundles, capabilities, `check`, DNS and Kubernetes
//! discovery, engine event shapes, following a replica, long polls, models and rollover.
//!
//! One test binary per crate (each binary links every dependency again, so separate files
//! cost CI minutes and gigabytes of disk). Run one module with
//! `cargo test -p kvroute-updater --test suite <module>::`.

mod bundles;
mod caps;
mod check;
mod common;
mod discovery_dns;
mod discovery_kube;
mod engine_shapes;
mod follow;
mod longpoll;
mod models;
mod rollover;
