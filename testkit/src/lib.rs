//! kvroute-testkit: host-only helpers the filter never uses, shared by the tests, the
//! simulator, the harness and the benches.
//!
//! - [`textgen`]: deterministic synthetic text (prompts, the simulator's output, the demo
//!   tokenizer's training corpus), regenerated from a seed.
//! - [`train`]: trains the demo bundle's tokenizer that `kvroute-core` embeds from
//!   `assets/demo-model/`.

pub mod textgen;
pub mod train;
