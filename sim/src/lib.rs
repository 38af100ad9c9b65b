//! kvroute-sim: simulated inference workers with vLLM's observable behaviour.
//!
//! Where to start: [`worker::Worker`] owns one worker's engine ([`engine`]: continuous batching,
//! chunked prefill, paged prefix cache in [`cache`]), its OpenAI HTTP surface ([`api`]), its
//! KV-event publisher and replay socket ([`events`]) and its fault endpoint ([`admin`]).
//! Timing comes from a [`profile`]. The `kvroute-sim` binary runs `--workers N` of them.
//!
//! Topology ([`topology`], [`delay`], [`pull`]): a worker may carry a site and node label and a
//! P/D role (`--site`, `--node`, `--role both|prefill|decode`, shown by `GET /sim/topology`);
//! `--client-rtt-ms` delays its HTTP socket (half on the request, every response byte half
//! later: streams shift, TTFT grows by one RTT); `--event-delay-ms` delays its KV-event PUB
//! path. Given `x-kvroute-kv-source: host:port` a worker pulls the prompt's leading blocks it
//! lacks from that holder over real loopback TCP (`--link SITE=RTT_MS:GBPS`,
//! `--kv-bytes-per-token`, `--kv-wire-scale`, `--kv-setup-ms`): they are stored in its cache
//! (`BlockStored`), counted as cached prompt tokens, and in `kvroute_sim:kv_pull_*`. A decode
//! worker given `x-prefiller-host-port` has that prefill worker prefill the prompt
//! (`max_tokens` 1, `kv_transfer_params.do_remote_decode`), pulls its KV, then decodes. Network
//! delays are wall-clock: `--speedup` does not divide them. A failed pull is recomputed.

pub mod admin;
pub mod api;
pub mod cache;
pub mod delay;
pub mod engine;
pub mod events;
pub mod metrics;
pub mod profile;
pub mod pull;
pub mod topology;
pub mod worker;
