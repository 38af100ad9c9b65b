//! The Qwen3 bundle the benches measure, or a clear exit when `./dev setup` has not fetched it.

use kvroute_core::decision::tokenize::model::{qwen3, ModelBundle};

/// The Qwen3 bundle; prints why and exits 1 when it is missing.
pub fn qwen3_or_exit() -> ModelBundle {
    qwen3().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1);
    })
}
