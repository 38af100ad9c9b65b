//! kvroute's byte formats, encode and decode only: the knowledge [`snapshot`] and [`delta`] the
//! updater publishes, other replicas' [`peers`] sections and reports, the knowledge [`journal`]
//! entry, and the model [`bundle`] transfer format. Decoders of untrusted bytes never panic.
//!
//! [`Reader`] below does the bounds-checked little-endian reading for all of them: every read
//! returns `None` past the end.

pub mod bundle;
pub mod delta;
pub mod journal;
pub mod peers;
pub mod snapshot;

use thiserror::Error;

pub(crate) struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader(bytes)
    }

    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    pub fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }

    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.array()?))
    }

    pub fn remaining(&self) -> usize {
        self.0.len()
    }
}

/// Bounds that keep a hostile or corrupt payload from allocating without limit.
pub const MAX_WORKERS: usize = 4096;
/// Default bound on the models a snapshot lists.
pub const MAX_MODELS: usize = 256;
/// Default bound on one worker's adapter list.
pub const MAX_ADAPTERS_PER_WORKER: usize = 1024;

/// Bounds a decoder of snapshots and deltas enforces before allocating; configurable in the
/// filter (`knowledge.decode_limits`) so an operator can size them to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct DecodeLimits {
    /// Workers listed in one snapshot or delta.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_workers: usize,
    /// Per worker and per list (GPU, offloaded, and each side of a delta).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_hashes_per_worker: usize,
    /// Models listed at the top of a snapshot or delta.
    pub max_models: usize,
    /// LoRA adapters listed for one worker.
    pub max_adapters_per_worker: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_workers: MAX_WORKERS,
            max_hashes_per_worker: MAX_HASHES_PER_WORKER,
            max_models: MAX_MODELS,
            max_adapters_per_worker: MAX_ADAPTERS_PER_WORKER,
        }
    }
}
pub const MAX_HASHES_PER_WORKER: usize = 1 << 22;

/// Why a snapshot, a delta or a peer section in them could not be decoded.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("snapshot truncated")]
    Truncated,
    #[error("not a kvroute snapshot")]
    Magic,
    #[error("snapshot format {0} is not supported (expected 3 to 5)")]
    Format(u8),
    #[error("snapshot count {0} exceeds its bound")]
    TooLarge(usize),
    #[error("a name is not UTF-8")]
    Utf8,
    #[error("trailing bytes after the snapshot")]
    Trailing,
    #[error("unknown worker flags {0:#04x}")]
    Flags(u8),
}

/// Writes a u16-length-prefixed string, cut at a character boundary to fit.
pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

pub(crate) fn read_str(r: &mut Reader<'_>) -> Result<String, SnapshotError> {
    let t = || SnapshotError::Truncated;
    let len = r.u16().ok_or_else(t)? as usize;
    String::from_utf8(r.take(len).ok_or_else(t)?.to_vec()).map_err(|_| SnapshotError::Utf8)
}

pub(crate) fn put_hashes(out: &mut Vec<u8>, hashes: &[u64]) {
    out.extend_from_slice(&(hashes.len() as u32).to_le_bytes());
    for h in hashes {
        out.extend_from_slice(&h.to_le_bytes());
    }
}

/// Reads a hash list, refusing counts past the bound or past the end of the payload.
pub(crate) fn hashes(r: &mut Reader<'_>, limits: &DecodeLimits) -> Result<Vec<u64>, SnapshotError> {
    let n = r.u32().ok_or(SnapshotError::Truncated)? as usize;
    if n > limits.max_hashes_per_worker {
        return Err(SnapshotError::TooLarge(n));
    }
    // Divided, not multiplied: `n * 8` overflows a 32-bit `usize` under a large limit.
    if r.remaining() / 8 < n {
        return Err(SnapshotError::Truncated);
    }
    (0..n).map(|_| r.u64().ok_or(SnapshotError::Truncated)).collect()
}
