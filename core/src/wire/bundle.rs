//! The model-bundle transfer format: a Hugging Face bundle's two files (`tokenizer.json`,
//! `tokenizer_config.json`) in one checksummed blob, as the updater serves it
//! (`GET /v1/bundles/{fingerprint}/{part}`) and the filter keeps it in Envoy shared data,
//! cut into parts of at most [`PART_BYTES`] so no single HTTP answer or shared-data value
//! has to hold a whole 11 MB tokenizer. The decoder never panics (fuzz target `bundle_decode`).
//!
//! Layout (little-endian): `KVRB` magic, format byte, `u32` length + bytes of
//! `tokenizer.json`, `u32` length + bytes of `tokenizer_config.json`, then the xxh3-64 of
//! everything before it.

use thiserror::Error;
use xxhash_rust::xxh3::xxh3_64;

use crate::wire::Reader;

const MAGIC: &[u8; 4] = b"KVRB";
/// Format version of the encoding above.
pub const BUNDLE_FORMAT: u8 = 1;
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

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BundleError {
    #[error("bundle truncated")]
    Truncated,
    #[error("not a kvroute bundle")]
    Magic,
    #[error("bundle format {0} is not supported (expected {BUNDLE_FORMAT})")]
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
        let mut out =
            Vec::with_capacity(21 + self.tokenizer_json.len() + self.tokenizer_config_json.len());
        out.extend_from_slice(MAGIC);
        out.push(BUNDLE_FORMAT);
        for file in [&self.tokenizer_json, &self.tokenizer_config_json] {
            out.extend_from_slice(&(file.len() as u32).to_le_bytes());
            out.extend_from_slice(file);
        }
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<BundleFiles, BundleError> {
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
        if format != BUNDLE_FORMAT {
            return Err(BundleError::Format(format));
        }
        let file = |r: &mut Reader<'_>| -> Result<Vec<u8>, BundleError> {
            let n = r.u32().ok_or_else(t)? as usize;
            Ok(r.take(n).ok_or_else(t)?.to_vec())
        };
        let tokenizer_json = file(&mut r)?;
        let tokenizer_config_json = file(&mut r)?;
        let sum = r.u64().ok_or_else(t)?;
        if r.remaining() != 0 {
            return Err(BundleError::Trailing);
        }
        if xxh3_64(&bytes[..body_len]) != sum {
            return Err(BundleError::Checksum);
        }
        Ok(BundleFiles { tokenizer_json, tokenizer_config_json })
    }
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
