//! Timing and capacity profiles: data files in `sim/profiles/`, each number with its source.

use std::path::Path;

use serde::Deserialize;
use thiserror::Error;

/// Profiles built into the binary, by name.
pub const BUILTIN: [(&str, &str); 2] = [
    ("llama3-8b-h100", include_str!("../profiles/llama3-8b-h100.toml")),
    ("llama3-70b-4xh100", include_str!("../profiles/llama3-70b-4xh100.toml")),
];

/// The default: an 8B-class model on one H100, the most common single-GPU serving setup.
pub const DEFAULT: &str = "llama3-8b-h100";

#[derive(Debug, Error)]
pub enum ProfileError {
    #[error(
        "unknown profile '{0}' (built in: llama3-8b-h100, llama3-70b-4xh100; or a .toml path)"
    )]
    Unknown(String),
    #[error("reading profile {0}: {1}")]
    Io(String, std::io::Error),
    #[error("profile is invalid: {0}")]
    Invalid(String),
}

/// One model-on-hardware profile.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    pub name: String,
    pub step_floor_ms: f64,
    pub prefill_ms_per_token: f64,
    pub prefill_ms_per_token_sq: f64,
    pub decode_ms_per_seq: f64,
    pub kv_ms_per_1k_tokens: f64,
    pub num_gpu_blocks: usize,
    pub block_size: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
}

impl HardwareProfile {
    /// A built-in profile by name, or a TOML file by path.
    pub fn load(name_or_path: &str) -> Result<HardwareProfile, ProfileError> {
        let text = match BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            Some((_, t)) => (*t).to_owned(),
            None if Path::new(name_or_path).exists() => std::fs::read_to_string(name_or_path)
                .map_err(|e| ProfileError::Io(name_or_path.into(), e))?,
            None => return Err(ProfileError::Unknown(name_or_path.into())),
        };
        let p: HardwareProfile =
            toml::from_str(&text).map_err(|e| ProfileError::Invalid(e.to_string()))?;
        p.validate()?;
        Ok(p)
    }

    pub fn validate(&self) -> Result<(), ProfileError> {
        let times = [
            self.step_floor_ms,
            self.prefill_ms_per_token,
            self.prefill_ms_per_token_sq,
            self.decode_ms_per_seq,
            self.kv_ms_per_1k_tokens,
        ];
        if times.iter().any(|t| !t.is_finite() || *t < 0.0) {
            return Err(ProfileError::Invalid("timing values must be finite and >= 0".into()));
        }
        let sizes = [
            self.num_gpu_blocks,
            self.block_size,
            self.max_num_seqs,
            self.max_num_batched_tokens,
            self.max_model_len,
        ];
        if sizes.contains(&0) {
            return Err(ProfileError::Invalid("sizes must be > 0".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_load_and_differ() {
        let small = HardwareProfile::load("llama3-8b-h100").unwrap();
        let big = HardwareProfile::load("llama3-70b-4xh100").unwrap();
        assert!(big.prefill_ms_per_token > small.prefill_ms_per_token);
        assert!(big.step_floor_ms > small.step_floor_ms);
        assert!(HardwareProfile::load("nope").is_err());
    }
}
