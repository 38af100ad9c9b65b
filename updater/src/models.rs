//! The models the updater knows: for each, its tokenizer bundle (the canary's rendering and
//! tokenization, and the bytes served at `GET /v1/bundles/{fingerprint}/{part}`) and the block
//! size configured for it, if any.
//!
//! A model is given as `NAME=DIR` (a Hugging Face style directory with `tokenizer.json` and
//! `tokenizer_config.json`) or as a bare `NAME`, which means the built-in demo bundle.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use kvroute_core::decision::tokenize::model::{
    ModelBundle, ModelError, DEMO_TOKENIZER_CONFIG, DEMO_TOKENIZER_JSON,
};
use kvroute_core::wire::bundle::{part_count, BundleFiles, CompiledBundle};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelsError {
    #[error("'{0}' is not NAME or NAME=DIR")]
    Spec(String),
    #[error("'{0}' is not NAME=BLOCK_SIZE with a block size > 0")]
    BlockSize(String),
    #[error("model '{0}' is given twice")]
    Duplicate(String),
    #[error("a block size is given for '{0}', which is not a configured model")]
    Unknown(String),
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("files of {path} are not UTF-8")]
    Utf8 { path: String },
    #[error("loading model '{name}': {source}")]
    Bundle { name: String, source: ModelError },
}

/// Where a model's bundle comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// The project's demo bundle.
    Demo,
    /// A Hugging Face style directory.
    Dir(PathBuf),
}

/// One `--model` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    pub name: String,
    pub source: ModelSource,
}

impl std::str::FromStr for ModelSpec {
    type Err = ModelsError;

    /// `NAME` (the demo bundle) or `NAME=DIR`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, source) = match s.split_once('=') {
            None => (s, ModelSource::Demo),
            Some((name, dir)) if !dir.is_empty() => (name, ModelSource::Dir(PathBuf::from(dir))),
            Some(_) => return Err(ModelsError::Spec(s.into())),
        };
        if name.is_empty() {
            return Err(ModelsError::Spec(s.into()));
        }
        Ok(ModelSpec { name: name.into(), source })
    }
}

/// `NAME=BLOCK_SIZE` (`--model-block-size`).
pub fn parse_block_size(s: &str) -> Result<(String, u32), ModelsError> {
    let bad = || ModelsError::BlockSize(s.into());
    let (name, n) = s.split_once('=').ok_or_else(bad)?;
    let n: u32 = n.parse().map_err(|_| bad())?;
    if name.is_empty() || n == 0 {
        return Err(bad());
    }
    Ok((name.into(), n))
}

/// A loaded model.
#[derive(Debug, Clone)]
pub struct Model {
    pub name: String,
    pub bundle: ModelBundle,
    /// Its transfer form (`kvroute_core::wire::bundle::BundleBlob`), encoded: the compiled
    /// fast encoder when the tokenizer has one (what a filter thread builds in a few MB),
    /// else `BundleFiles { tokenizer_json, tokenizer_config_json }`.
    pub encoded: Arc<Vec<u8>>,
    /// The block size its workers must use, when configured (else learned from them).
    pub block_size: Option<u32>,
}

impl Model {
    /// Builds a model from the bytes of its two files; the bundle's fingerprint is computed
    /// from exactly the bytes served.
    pub fn from_files(
        name: &str,
        files: BundleFiles,
        block_size: Option<u32>,
    ) -> Result<Model, ModelsError> {
        let utf8 = |b: &[u8]| {
            std::str::from_utf8(b)
                .map(str::to_owned)
                .map_err(|_| ModelsError::Utf8 { path: name.into() })
        };
        let bundle = ModelBundle::from_hf(
            &utf8(&files.tokenizer_json)?,
            &utf8(&files.tokenizer_config_json)?,
        )
        .map_err(|source| ModelsError::Bundle { name: name.into(), source })?;
        let encoded = match bundle.compiled_encoder() {
            Some(encoder) => CompiledBundle {
                fingerprint: bundle.fingerprint(),
                encoder,
                tokenizer_config_json: files.tokenizer_config_json,
            }
            .encode(),
            None => files.encode(),
        };
        Ok(Model { name: name.into(), bundle, encoded: Arc::new(encoded), block_size })
    }

    pub fn fingerprint(&self) -> u64 {
        self.bundle.fingerprint()
    }

    /// Parts of [`kvroute_core::wire::bundle::PART_BYTES`] the encoded bundle is cut into.
    pub fn parts(&self) -> usize {
        part_count(self.encoded.len())
    }
}

/// Every configured model, by name.
#[derive(Debug, Clone, Default)]
pub struct Models {
    by_name: BTreeMap<String, Model>,
}

impl Models {
    /// Loads every model in `specs`, with the block sizes given per model.
    pub fn load(specs: &[ModelSpec], block_sizes: &[(String, u32)]) -> Result<Models, ModelsError> {
        let mut by_name = BTreeMap::new();
        for spec in specs {
            let block_size = block_sizes.iter().rev().find(|(n, _)| *n == spec.name).map(|b| b.1);
            let files = match &spec.source {
                ModelSource::Demo => BundleFiles {
                    tokenizer_json: DEMO_TOKENIZER_JSON.as_bytes().to_vec(),
                    tokenizer_config_json: DEMO_TOKENIZER_CONFIG.as_bytes().to_vec(),
                },
                ModelSource::Dir(dir) => {
                    let read = |file: &str| {
                        let path = dir.join(file);
                        std::fs::read(&path).map_err(|source| ModelsError::Read {
                            path: path.display().to_string(),
                            source,
                        })
                    };
                    BundleFiles {
                        tokenizer_json: read("tokenizer.json")?,
                        tokenizer_config_json: read("tokenizer_config.json")?,
                    }
                }
            };
            let model = Model::from_files(&spec.name, files, block_size)?;
            if by_name.insert(spec.name.clone(), model).is_some() {
                return Err(ModelsError::Duplicate(spec.name.clone()));
            }
        }
        if let Some((n, _)) = block_sizes.iter().find(|(n, _)| !by_name.contains_key(n)) {
            return Err(ModelsError::Unknown(n.clone()));
        }
        Ok(Models { by_name })
    }

    /// A registry of already loaded models.
    pub fn of(models: impl IntoIterator<Item = Model>) -> Models {
        Models { by_name: models.into_iter().map(|m| (m.name.clone(), m)).collect() }
    }

    pub fn get(&self, name: &str) -> Option<&Model> {
        self.by_name.get(name)
    }

    /// Models sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = &Model> {
        self.by_name.values()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The model whose bundle has this fingerprint (the first by name, when several share it).
    pub fn by_fingerprint(&self, fingerprint: u64) -> Option<&Model> {
        self.by_name.values().find(|m| m.fingerprint() == fingerprint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_core::wire::bundle::BundleBlob;

    #[test]
    fn model_arguments() {
        let demo: ModelSpec = "kvroute-demo".parse().unwrap();
        assert_eq!(demo, ModelSpec { name: "kvroute-demo".into(), source: ModelSource::Demo });
        let dir: ModelSpec = "Qwen/Qwen3-8B=/models/qwen3".parse().unwrap();
        assert_eq!(dir.source, ModelSource::Dir("/models/qwen3".into()));
        assert_eq!(dir.name, "Qwen/Qwen3-8B");
        for bad in ["", "=dir", "name="] {
            assert!(bad.parse::<ModelSpec>().is_err(), "{bad}");
        }
        assert_eq!(parse_block_size("m=32").unwrap(), ("m".into(), 32));
        for bad in ["m", "m=0", "=16", "m=x"] {
            assert!(parse_block_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn loads_bundles_and_checks_names() {
        let specs = vec!["a".parse().unwrap(), "b".parse().unwrap()];
        let m = Models::load(&specs, &[("b".into(), 32)]).unwrap();
        let demo = ModelBundle::demo().unwrap();
        assert_eq!(m.get("a").unwrap().fingerprint(), demo.fingerprint());
        assert_eq!(m.get("a").unwrap().block_size, None);
        assert_eq!(m.get("b").unwrap().block_size, Some(32));
        // The demo tokenizer has the fast encoder: it is served compiled, naming its
        // fingerprint, and builds a bundle that tokenizes as the one from the files.
        let served = BundleBlob::decode(&m.get("a").unwrap().encoded).unwrap();
        let BundleBlob::Compiled(c) = served else { panic!("served as files: {served:?}") };
        assert_eq!(c.fingerprint, demo.fingerprint());
        assert_eq!(c.tokenizer_config_json, DEMO_TOKENIZER_CONFIG.as_bytes());
        let config = std::str::from_utf8(&c.tokenizer_config_json).unwrap();
        let built = ModelBundle::from_compiled(c.fingerprint, &c.encoder, config).unwrap();
        let text = "Compiled, then served: the same ids?";
        assert_eq!(built.encode(text, false).unwrap(), demo.encode(text, false).unwrap());
        assert_eq!(m.by_fingerprint(demo.fingerprint()).unwrap().name, "a");
        assert!(matches!(
            Models::load(&[specs[0].clone(), specs[0].clone()], &[]),
            Err(ModelsError::Duplicate(_))
        ));
        assert!(matches!(Models::load(&specs, &[("c".into(), 16)]), Err(ModelsError::Unknown(_))));
        let missing: ModelSpec = "x=/nonexistent/kvroute".parse().unwrap();
        assert!(matches!(Models::load(&[missing], &[]), Err(ModelsError::Read { .. })));
    }
}
