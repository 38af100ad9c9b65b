//! The model-bundle transfer format, as the updater serves it
//! (`GET /v1/bundles/{fingerprint}/{part}`) and the filter keeps it in Envoy shared data,
//! cut into parts of at most [`PART_BYTES`] so no single HTTP answer or shared-data value
//! has to hold a whole 11 MB tokenizer. A bundle travels in one of two forms
//! ([`BundleBlob`]): a Hugging Face bundle's two files ([`BundleFiles`]), or, when the
//! tokenizer has kvroute's exact fast encoder, that encoder compiled ([`CompiledBundle`]: a
//! few MB, and a thread builds it without the `tokenizers` crate's 150 MB detour through the
//! JSON). The decoder never panics (fuzz target `bundle_decode`).
//!
//! Layout (little-endian): `KVRB` magic, format byte, then for format 1 (files) `u32` length +
//! bytes of `tokenizer.json` and of `tokenizer_config.json`; for format 2 (compiled) the
//! bundle's `u64` fingerprint, `u32` length + bytes of the compiled encoder
//! (`ModelBundle::compiled_encoder`) and of `tokenizer_config.json`; then the xxh3-64 of
//! everything before it.

use thiserror::Error;
use xxhash_rust::xxh3::xxh3_64;

use crate::wire::Reader;

const MAGIC: &[u8; 4] = b"KVRB";
/// Format version of a bundle sent as its files.
pub const BUNDLE_FORMAT: u8 = 1;
/// Format version of a bundle sent as its compiled encoder.
pub const COMPILED_BUNDLE_FORMAT: u8 = 2;
/// Largest part the updater serves and the filter stores in one shared-data value.
pub const PART_BYTES: usize = 1 << 20;
/// Largest whole bundle a decoder accepts (a 151 k-token BPE tokenizer is about 11 MB).
pub const MAX_BUNDLE_BYTES: usize = 64 << 20;

/// The two files of a bundle, as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFiles {
    pub tokenizer_json: Vec<u8>,
    pub tokenizer_config_json: Vec<u8>,
}

/// A bundle whose tokenizer travels as its compiled fast encoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledBundle {
    /// The fingerprint of the bundle built from its files (its cache domain).
    pub fingerprint: u64,
    /// `ModelBundle::compiled_encoder` of that bundle.
    pub encoder: Vec<u8>,
    pub tokenizer_config_json: Vec<u8>,
}

/// A bundle in either transfer form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundleBlob {
    Files(BundleFiles),
    Compiled(CompiledBundle),
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BundleError {
    #[error("bundle truncated")]
    Truncated,
    #[error("not a kvroute bundle")]
    Magic,
    #[error(
        "bundle format {0} is not supported (expected {BUNDLE_FORMAT} or {COMPILED_BUNDLE_FORMAT})"
    )]
    Format(u8),
    #[error("bundle of {0} bytes exceeds the bound")]
    TooLarge(usize),
    #[error("bundle checksum does not match")]
    Checksum,
    #[error("trailing bytes after the bundle")]
    Trailing,
}

impl BundleFiles {
    pub fn encode(&self) -> Vec<u8> {
        frame(BUNDLE_FORMAT, None, &[&self.tokenizer_json, &self.tokenizer_config_json])
    }

    /// Decodes a bundle sent as its files (a compiled one is [`BundleError::Format`]).
    pub fn decode(bytes: &[u8]) -> Result<BundleFiles, BundleError> {
        match BundleBlob::decode(bytes)? {
            BundleBlob::Files(f) => Ok(f),
            BundleBlob::Compiled(_) => Err(BundleError::Format(COMPILED_BUNDLE_FORMAT)),
        }
    }
}

impl CompiledBundle {
    pub fn encode(&self) -> Vec<u8> {
        let files: [&[u8]; 2] = [&self.encoder, &self.tokenizer_config_json];
        frame(COMPILED_BUNDLE_FORMAT, Some(self.fingerprint), &files)
    }
}

impl BundleBlob {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            BundleBlob::Files(f) => f.encode(),
            BundleBlob::Compiled(c) => c.encode(),
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<BundleBlob, BundleError> {
        if bytes.len() > MAX_BUNDLE_BYTES {
            return Err(BundleError::TooLarge(bytes.len()));
        }
        let t = || BundleError::Truncated;
        let body_len = bytes.len().checked_sub(8).ok_or_else(t)?;
        let mut r = Reader::new(bytes);
        if r.take(4).ok_or_else(t)? != MAGIC {
            return Err(BundleError::Magic);
        }
        let format = r.u8().ok_or_else(t)?;
        let fingerprint = match format {
            BUNDLE_FORMAT => None,
            COMPILED_BUNDLE_FORMAT => Some(r.u64().ok_or_else(t)?),
            f => return Err(BundleError::Format(f)),
        };
        let file = |r: &mut Reader<'_>| -> Result<Vec<u8>, BundleError> {
            let n = r.u32().ok_or_else(t)? as usize;
            Ok(r.take(n).ok_or_else(t)?.to_vec())
        };
        let first = file(&mut r)?;
        let tokenizer_config_json = file(&mut r)?;
        let sum = r.u64().ok_or_else(t)?;
        if r.remaining() != 0 {
            return Err(BundleError::Trailing);
        }
        if xxh3_64(&bytes[..body_len]) != sum {
            return Err(BundleError::Checksum);
        }
        Ok(match fingerprint {
            None => BundleBlob::Files(BundleFiles { tokenizer_json: first, tokenizer_config_json }),
            Some(fingerprint) => BundleBlob::Compiled(CompiledBundle {
                fingerprint,
                encoder: first,
                tokenizer_config_json,
            }),
        })
    }
}

/// Magic, format, the optional fingerprint, each file with its length, and the checksum.
fn frame(format: u8, fingerprint: Option<u64>, files: &[&[u8]]) -> Vec<u8> {
    let len: usize = files.iter().map(|f| 4 + f.len()).sum();
    let mut out = Vec::with_capacity(21 + len);
    out.extend_from_slice(MAGIC);
    out.push(format);
    if let Some(fp) = fingerprint {
        out.extend_from_slice(&fp.to_le_bytes());
    }
    for file in files {
        out.extend_from_slice(&(file.len() as u32).to_le_bytes());
        out.extend_from_slice(file);
    }
    let sum = xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// How many parts of [`PART_BYTES`] an encoded bundle of `len` bytes has.
pub fn part_count(len: usize) -> usize {
    len.div_ceil(PART_BYTES).max(1)
}

/// Part `i` of an encoded bundle, if it exists.
pub fn part(encoded: &[u8], i: usize) -> Option<&[u8]> {
    if i >= part_count(encoded.len()) {
        return None;
    }
    let start = i * PART_BYTES;
    Some(&encoded[start..(start + PART_BYTES).min(encoded.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::conformance::shared_data::bundle_files_sample as files;

    #[test]
    fn round_trips_and_golden_bytes() {
        crate::conformance::shared_data::bundle_files_golden();
    }

    #[test]
    fn corrupt_bundles_are_errors() {
        let enc = files().encode();
        let mut flipped = enc.clone();
        flipped[10] ^= 1;
        assert_eq!(BundleFiles::decode(&flipped), Err(BundleError::Checksum));
        assert_eq!(BundleFiles::decode(&enc[..enc.len() - 1]), Err(BundleError::Truncated));
        assert_eq!(BundleFiles::decode(b"XXXX\x01\0\0\0\0\0\0\0\0"), Err(BundleError::Magic));
        let mut longer = enc.clone();
        longer.push(0);
        assert!(BundleFiles::decode(&longer).is_err());
    }

    #[test]
    fn parts_cover_the_blob_exactly() {
        let blob: Vec<u8> = (0..(2 * PART_BYTES + 5)).map(|i| i as u8).collect();
        assert_eq!(part_count(blob.len()), 3);
        let joined: Vec<u8> =
            (0..3).flat_map(|i| part(&blob, i).unwrap().iter().copied()).collect();
        assert_eq!(joined, blob);
        assert_eq!(part(&blob, 3), None);
        assert_eq!(part_count(0), 1);
    }
}
