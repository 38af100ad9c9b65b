//! The simulator over its real sockets: admin and fault endpoints, the OpenAI endpoints, limits,
//! LoRA, scheduling policies, speed profiles, topology (KV pulls, link delays, P/D), what-if and
//! its KV event wire.
//!
//! One test binary per crate (each binary links every dependency again, so separate files
//! cost CI minutes and gigabytes of disk). Run one module with
//! `cargo test -p kvroute-sim --test suite <module>::`.

mod admin;
mod common;
mod endpoints;
mod limits;
mod lora;
mod priority;
mod profiles;
mod topology;
mod what_if;
mod wire;
