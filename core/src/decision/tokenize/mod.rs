//! From a rendered prompt to token ids: the tokenizer + template [`model`] bundle, an exact
//! faster byte-level BPE encoder ([`fastbpe`]), a thread's cache of rendered chat prompts
//! ([`rendercache`]: the next turn renders only its new messages) and of their token ids
//! ([`tokcache`]).

pub mod fastbpe;
pub mod model;
pub mod rendercache;
pub mod tokcache;
