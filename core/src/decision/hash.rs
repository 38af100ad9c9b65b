//! The one block-hashing path of kvroute, used by filter, updater and simulator alike.
//!
//! A prompt's tokens are cut into full blocks of `block_size` tokens (a trailing partial block is
//! never hashed, as engines cache only full blocks). Block `i`'s hash is xxh3-64 over the block's
//! token ids as little-endian u32, seeded with block `i-1`'s hash; block 0 is seeded with the
//! [`CacheDomain`] seed, so two domains (model, tokenizer, block size, LoRA, tenant salt) never
//! share a single block hash. Golden vectors pin this in the tests below.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Format version of the hashing scheme; bump when anything below changes.
pub const HASH_SCHEME_VERSION: u8 = 1;

/// Everything that decides whether two equal token blocks are the same cache entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheDomain {
    pub model: String,
    pub tokenizer_fingerprint: u64,
    pub block_size: u32,
    pub lora_name: Option<String>,
    pub tenant_salt: Option<String>,
}

impl CacheDomain {
    /// The chain seed: xxh3-64 of a length-prefixed canonical encoding of every field.
    pub fn seed(&self) -> u64 {
        let mut buf = Vec::with_capacity(64 + self.model.len());
        buf.push(HASH_SCHEME_VERSION);
        push_str(&mut buf, &self.model);
        buf.extend_from_slice(&self.tokenizer_fingerprint.to_le_bytes());
        buf.extend_from_slice(&self.block_size.to_le_bytes());
        push_opt(&mut buf, self.lora_name.as_deref());
        push_opt(&mut buf, self.tenant_salt.as_deref());
        xxh3_64(&buf)
    }
}

fn push_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn push_opt(buf: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => buf.push(0),
        Some(s) => {
            buf.push(1);
            push_str(buf, s);
        }
    }
}

/// Hash of one block given its parent's hash (or the domain seed for block 0).
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    block_hash_in(&mut Vec::new(), parent, tokens)
}

/// [`block_hash`] with the block's bytes written to `buf` (reused: a prompt's blocks cost one
/// allocation, not one each).
fn block_hash_in(buf: &mut Vec<u8>, parent: u64, tokens: &[u32]) -> u64 {
    buf.clear();
    buf.reserve(tokens.len() * 4);
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(buf, parent)
}

/// Chained hashes of every full block of `tokens`.
pub fn block_hashes(seed: u64, block_size: u32, tokens: &[u32]) -> Vec<u64> {
    let bs = block_size.max(1) as usize;
    let mut parent = seed;
    let mut buf = Vec::with_capacity(bs * 4);
    tokens
        .chunks_exact(bs)
        .map(|block| {
            parent = block_hash_in(&mut buf, parent, block);
            parent
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::conformance::golden_domain as domain;

    /// Golden vectors: these values are on the wire between updater and filter (the check is
    /// shared with the 32-bit wasm tests).
    #[test]
    fn golden_vectors() {
        crate::conformance::block_hashes_golden();
    }

    #[test]
    fn only_full_blocks_are_hashed_and_chain_depends_on_parent() {
        let a = block_hashes(7, 4, &[1, 2, 3, 4, 5, 6, 7, 8]);
        let b = block_hashes(7, 4, &[9, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(a.len(), 2);
        assert_ne!(a[1], b[1], "a different first block changes every later hash");
        assert_eq!(block_hashes(7, 4, &[1, 2, 3]).len(), 0);
    }

    #[test]
    fn every_domain_field_changes_the_seed() {
        let base = domain();
        let variants = [
            CacheDomain { model: "other".into(), ..base.clone() },
            CacheDomain { tokenizer_fingerprint: 1, ..base.clone() },
            CacheDomain { block_size: 16, ..base.clone() },
            CacheDomain { lora_name: Some("ad".into()), ..base.clone() },
            CacheDomain { tenant_salt: Some("tenant-a".into()), ..base.clone() },
            CacheDomain { tenant_salt: Some(String::new()), ..base.clone() },
        ];
        for v in &variants {
            assert_ne!(v.seed(), base.seed(), "{v:?}");
        }
    }
}
