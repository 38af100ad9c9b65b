//! From a rendered prompt to token ids: the tokenizer + template [`model`] bundle, an exact
//! faster byte-level BPE encoder ([`fastbpe`]), and a thread's cache of chat prompts' token
//! ids ([`tokcache`]).

pub mod fastbpe;
pub mod model;
pub mod tokcache;
