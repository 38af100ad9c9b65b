//! kvroute-sim: simulated inference workers with vLLM's observable behaviour.
//!
//! Where to start: [`worker::Worker`] owns one worker's engine ([`engine`]: continuous batching,
//! chunked prefill, paged prefix cache in [`cache`]), its OpenAI HTTP surface ([`api`]), its
//! KV-event publisher and replay socket ([`events`]) and its fault endpoint ([`admin`]).
//! Timing comes from a [`profile`]. The `kvroute-sim` binary runs `--workers N` of them.

pub mod admin;
pub mod api;
pub mod cache;
pub mod engine;
pub mod events;
pub mod metrics;
pub mod profile;
pub mod worker;
