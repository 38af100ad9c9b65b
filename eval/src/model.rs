//! The model a comparison serves: the built-in demo bundle (the default) or Qwen3 (a real
//! 151 k-token tokenizer, fetched by `./dev setup`). It decides the `model` of every request,
//! the bundle the simulated workers and the updater load, how the filter gets the bundle (from
//! the updater for `kvroute`, inline for `kvroute-no-events`, which runs without one), and how
//! synthesized text is sized in tokens.

use std::path::PathBuf;

use anyhow::Context;
use kvroute_core::decision::tokenize::model::ModelBundle;
use serde::{Deserialize, Serialize};

use kvroute_stack::stack::{BundleFrom, Pool, MODEL, QWEN3_MODEL};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BenchModel {
    /// The project's demo bundle (`assets/demo-model/`), served as `kvroute-demo`.
    #[default]
    Demo,
    /// Qwen3's tokenizer and chat template (`.cache/models/qwen3/`), served as `qwen3`.
    Qwen3,
}

impl BenchModel {
    pub fn parse(s: &str) -> anyhow::Result<BenchModel> {
        match s {
            "demo" | "kvroute-demo" => Ok(BenchModel::Demo),
            "qwen3" => Ok(BenchModel::Qwen3),
            _ => anyhow::bail!("unknown model {s} (demo or qwen3)"),
        }
    }

    /// The `model` clients send and the workers serve.
    pub fn name(self) -> &'static str {
        match self {
            BenchModel::Demo => MODEL,
            BenchModel::Qwen3 => QWEN3_MODEL,
        }
    }

    /// The bundle's directory (`None`: built in).
    pub fn dir(self) -> Option<PathBuf> {
        match self {
            BenchModel::Demo => None,
            BenchModel::Qwen3 => Some(kvroute_core::decision::tokenize::model::qwen3_dir()),
        }
    }

    /// The bundle, to tokenize schedules as the engine will.
    pub fn bundle(self) -> anyhow::Result<ModelBundle> {
        Ok(match self {
            BenchModel::Demo => ModelBundle::demo()?,
            BenchModel::Qwen3 => {
                kvroute_core::decision::tokenize::model::qwen3().context("--model qwen3")?
            }
        })
    }

    /// Words of `kvroute_testkit::textgen::words` per token of this bundle, each chunk preceded by
    /// a space (measured by the calibration tests of `eval::mooncake`).
    pub fn words_per_token(self) -> f64 {
        match self {
            BenchModel::Demo => crate::mooncake::WORDS_PER_TOKEN,
            BenchModel::Qwen3 => crate::mooncake::QWEN3_WORDS_PER_TOKEN,
        }
    }

    /// The pool of `workers` serving this model, its bundle reaching the filter as `bundle`.
    pub fn pool(self, workers: usize, bundle: BundleFrom) -> Pool {
        Pool { model: self.name().into(), dir: self.dir(), workers, bundle }
    }
}
