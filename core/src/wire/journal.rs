//! The knowledge journal shared by all Envoy threads: every routing credit and response
//! confirmation is appended as a small entry, and each thread applies the entries it has not
//! seen to its own index. This module is the entry codec; the decoder never panics.

use thiserror::Error;

use crate::wire::Reader;

const VERSION: u8 = 1;
/// Most hashes one entry carries (a 128 k-token prompt at block size 16 is 8192 blocks).
pub const MAX_HASHES: usize = 16_384;

/// Where an observation came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The engine's KV-cache event stream (precise).
    KvEvent,
    /// kvroute's own routing decision (predicted: the worker will compute these blocks).
    Routed,
    /// Confirmed by the worker's `cached_tokens` in a response.
    Feedback,
    /// Another Envoy replica's routing decision, relayed by the updater (predicted, short TTL).
    Peer,
}

/// One observation batch: `worker` holds `hashes` since `at_ms`, according to `source`; or,
/// with `retract`, a routing credit taken back (the worker failed, or another one served).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    pub seq: u64,
    pub at_ms: u64,
    pub source: Source,
    pub worker: String,
    pub hashes: Vec<u64>,
    pub retract: bool,
}

/// Flag in the source byte marking a retraction.
const RETRACT: u8 = 0x80;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum JournalError {
    #[error("journal entry truncated")]
    Truncated,
    #[error("journal entry has unknown version {0}")]
    Version(u8),
    #[error("journal entry has unknown source {0}")]
    Source(u8),
    #[error("journal entry worker is not UTF-8")]
    Worker,
    #[error("journal entry has {0} hashes, more than allowed")]
    TooMany(usize),
    #[error("journal entry has trailing bytes")]
    Trailing,
}

fn source_byte(s: Source) -> u8 {
    match s {
        Source::KvEvent => 0,
        Source::Routed => 1,
        Source::Feedback => 2,
        Source::Peer => 3,
    }
}

impl JournalEntry {
    pub fn encode(&self) -> Vec<u8> {
        let n = self.hashes.len().min(MAX_HASHES);
        let mut out = Vec::with_capacity(24 + self.worker.len() + 8 * n);
        out.push(VERSION);
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.at_ms.to_le_bytes());
        out.push(source_byte(self.source) | if self.retract { RETRACT } else { 0 });
        let w = &self.worker.as_bytes()[..self.worker.len().min(255)];
        out.push(w.len() as u8);
        out.extend_from_slice(w);
        out.extend_from_slice(&(n as u32).to_le_bytes());
        for h in &self.hashes[..n] {
            out.extend_from_slice(&h.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, JournalError> {
        let mut r = Reader::new(bytes);
        let t = || JournalError::Truncated;
        let version = r.u8().ok_or_else(t)?;
        if version != VERSION {
            return Err(JournalError::Version(version));
        }
        let seq = r.u64().ok_or_else(t)?;
        let at_ms = r.u64().ok_or_else(t)?;
        let byte = r.u8().ok_or_else(t)?;
        let retract = byte & RETRACT != 0;
        let source = match byte & !RETRACT {
            0 => Source::KvEvent,
            1 => Source::Routed,
            2 => Source::Feedback,
            3 => Source::Peer,
            s => return Err(JournalError::Source(s)),
        };
        let wlen = r.u8().ok_or_else(t)? as usize;
        let worker = String::from_utf8(r.take(wlen).ok_or_else(t)?.to_vec())
            .map_err(|_| JournalError::Worker)?;
        let n = r.u32().ok_or_else(t)? as usize;
        if n > MAX_HASHES {
            return Err(JournalError::TooMany(n));
        }
        let hashes = (0..n).map(|_| r.u64().ok_or_else(t)).collect::<Result<Vec<_>, _>>()?;
        if r.remaining() != 0 {
            return Err(JournalError::Trailing);
        }
        Ok(JournalEntry { seq, at_ms, source, worker, hashes, retract })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::conformance::codecs::journal_sample as entry;

    #[test]
    fn golden_bytes() {
        crate::conformance::codecs::journal_golden();
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = entry().encode();
        for n in 0..bytes.len() {
            assert!(JournalEntry::decode(&bytes[..n]).is_err(), "{n}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(JournalEntry::decode(&long), Err(JournalError::Trailing));
    }

    proptest! {
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = JournalEntry::decode(&bytes);
        }

        #[test]
        fn round_trips(seq: u64, at: u64, w in "[0-9.:]{0,40}", hashes in proptest::collection::vec(any::<u64>(), 0..50), retract: bool) {
            let e = JournalEntry { seq, at_ms: at, source: Source::Feedback, worker: w, hashes, retract };
            prop_assert_eq!(JournalEntry::decode(&e.encode()), Ok(e));
        }
    }
}
