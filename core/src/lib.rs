//! kvroute-core: everything kvroute decides, with no I/O and no proxy-wasm.
//!
//! Where to start: [`router::Router`] takes a parsed request ([`request`]), renders and tokenizes it
//! with a [`model::ModelBundle`], hashes full token blocks ([`hash`]), looks them up in the
//! [`index::KnowledgeIndex`], and ranks workers with the cost model in [`cost`]. The filter crate
//! is thin glue around it; host access (clock, randomness, shared load) is passed in as values.
//!
//! Module map:
//! - [`request`]: request parsing (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`,
//!   `/v1/messages`) into the prompt vLLM builds.
//! - [`template`]: chat-template rendering (minijinja in transformers' Jinja environment).
//! - [`model`]: tokenizer + template bundle, fingerprint, the built-in demo bundle.
//! - [`fastbpe`]: an exact, faster byte-level BPE encoder for the tokenizer shapes it supports.
//! - [`tokcache`]: a thread's bounded cache of token ids of chat prompts, cut after added
//!   tokens, so turn k of a conversation tokenizes only what turn k-1 did not have.
//! - [`bundle`]: the checksummed, part-cut transfer format of a model bundle (updater → Envoy).
//! - [`hash`]: the one block-hashing path, seeded by a [`hash::CacheDomain`].
//! - [`index`]: per-worker knowledge with source, age, TTL and LRU bounds.
//! - [`peers`]: other Envoy replicas' routing credits and in-flight load, relayed by the updater.
//! - [`cost`]: the millisecond cost model and ordered selection.
//! - [`calib`]: online calibration of the cost model from observed times to first token.
//! - [`router`]: the decision: an immutable [`router::Plan`] (models, bundles, pools, LoRA
//!   adapters, limits; swapped whole) and the mutable [`router::Knowledge`] of workers.
//! - [`usage`]: streaming scanner for cached tokens in JSON or SSE responses of every endpoint.
//! - [`admission`]: TTFT deadlines, shedding (429) and priority classes after ranking.
//! - [`audit`]: prediction audit classes.
//! - [`config`]: filter configuration with defaults and `validate()`.
//! - [`error`]: OpenAI-style error bodies.
//! - [`shared`]: the protocol over Envoy shared data (journal, load shards with leases,
//!   snapshot head and delta ring), behind a small store trait with an in-memory fake.
//! - `conformance` (tests and the `conformance` feature): golden checks of codecs, hashes,
//!   token ids and cost ranking, run natively and as 32-bit wasm (`core/wasm-tests`).

pub mod admission;
pub mod audit;
pub mod bundle;
pub mod calib;
pub mod config;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod cost;
pub mod delta;
pub mod error;
pub mod fastbpe;
pub mod hash;
pub mod index;
pub mod journal;
pub mod load;
pub mod lookahead;
pub mod misdeploy;
pub mod model;
pub mod peers;
pub mod request;
pub mod router;
pub mod shared;
pub mod snapshot;
pub mod template;
pub mod textgen;
pub mod tokcache;
#[cfg(not(target_arch = "wasm32"))]
pub mod train;
pub mod usage;
mod wire;
