//! The evaluation harness behind `kvroute-bench`: a topology, a seeded workload turned once into
//! an open-loop schedule, every policy replayed on it through the same Envoy path, faults on a
//! schedule, per-request records, and a report (Markdown, JSON, SVG).
//!
//! Where to start: [`record`] holds what is measured per request; [`sse`] turns a response
//! stream into token timings; [`mooncake`] replays the Mooncake trace; [`report`] aggregates
//! and writes the results.

pub mod calibration;
pub mod cluster;
pub mod delay;
pub mod health;
pub mod model;
pub mod mooncake;
pub mod net;
pub mod preset;
pub mod prewarm;
pub mod record;
pub mod reference;
pub mod repeat;
pub mod report;
pub mod runner;
pub mod schedule;
pub mod send;
pub mod sse;
pub mod sweep;
pub mod topology;
pub mod transfer;
pub mod warmup;
pub mod whatif;
pub mod workloads;
