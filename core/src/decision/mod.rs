//! Everything a routing decision needs, as pure functions and state over values (no I/O, no
//! shared data).
//!
//! Where to start: [`router::Router`] takes a parsed request ([`request`]), renders and
//! tokenizes it with a [`tokenize::model::ModelBundle`], hashes full token blocks ([`hash`]),
//! looks them up in the [`index::KnowledgeIndex`], and ranks workers with the cost model in
//! [`cost`].
//!
//! - [`request`]: request parsing (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`,
//!   `/v1/messages`) into the prompt vLLM builds; [`pyjson`]: JSON values as Python's `json`
//!   reads them (shared with the template).
//! - [`template`]: chat-template rendering (minijinja in transformers' Jinja environment).
//! - [`tokenize`]: tokenizer bundles, the fast BPE encoder, the token-id cache.
//! - [`hash`]: the one block-hashing path, seeded by a [`hash::CacheDomain`].
//! - [`index`]: per-worker knowledge with source, age, TTL and LRU bounds.
//! - [`load`]: router-tracked load of a worker; [`peers`]: other replicas' load as a thread
//!   sees it.
//! - [`topology`]: worker placement, link costs, KV pulls between workers;
//! - [`cost`]: the millisecond cost model and ordered selection; [`calib`]: its online
//!   calibration from observed times to first token; [`lookahead`]: hot prefixes held.
//! - [`router`]: the decision: an immutable [`router::Plan`] and the mutable
//!   [`router::Knowledge`] of workers.
//! - [`admission`]: TTFT deadlines, shedding (429) and priority classes after ranking.
//! - [`audit`]: prediction audit classes; [`usage`]: cached tokens in responses.
//! - [`misdeploy`]: the misdeployment watch.
//! - [`config`]: the filter configuration with defaults and `validate()`; [`error`]:
//!   OpenAI-style error bodies.

pub mod admission;
pub mod audit;
pub mod calib;
pub mod config;
pub mod cost;
pub mod error;
pub mod hash;
pub mod index;
pub mod load;
pub mod lookahead;
pub mod misdeploy;
pub mod peers;
pub mod pyjson;
pub mod request;
pub mod router;
pub mod template;
pub mod tokenize;
pub mod topology;
pub mod usage;
pub mod worker;
