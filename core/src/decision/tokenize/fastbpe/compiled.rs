//! The fast encoder's tables as bytes, so a thread can have the encoder without loading the
//! `tokenizers` crate's model from `tokenizer.json`.
//!
//! Building a `Tokenizer` from Qwen3's 11 MB `tokenizer.json` allocates about 150 MB on the way
//! and keeps 25 MB; a wasm VM's memory never shrinks, so every Envoy thread would hold that
//! high-water mark for good. The updater (native, with the crate) builds and probes the encoder
//! once and serves [`FastBpe::write_compiled`]'s bytes; a thread reads them back with
//! [`FastBpe::read_compiled`]: a few MB, no JSON, no vocabulary strings.
//!
//! Layout (little-endian, `u32` counts and lengths): `KVFB` magic, format byte, NFC flag; the
//! split patterns (length + UTF-8 each); the 256 byte ids; the added tokens (id, length +
//! UTF-8, in the automaton's order); the merges (`left`, `right`, `rank`, `merged`, sorted by
//! pair); the `ignore_merges` pieces (a flag, then id, length + bytes each, sorted by bytes);
//! the post-processor templates (parts: tag 0 = the sequence, tag 1 = special ids with their
//! count). Every count is checked against the bytes left before anything is allocated; the
//! decoder never panics (fuzz target `compiled_encoder`).

use std::sync::Mutex;

use thiserror::Error;

use super::{added_automaton, splitter, FastBpe, MergeMap, Part, PieceMap, Splitter, State};
use crate::wire::Reader;

const MAGIC: &[u8; 4] = b"KVFB";
/// Format version of the layout above.
pub const COMPILED_FORMAT: u8 = 1;
/// Most split patterns, post-processor templates, and parts per template.
const MAX_STEPS: usize = 64;
/// Longest split pattern.
const MAX_PATTERN_BYTES: usize = 4096;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CompiledError {
    #[error("compiled encoder truncated")]
    Truncated,
    #[error("not a compiled encoder")]
    Magic,
    #[error("compiled encoder format {0} is not supported (expected {COMPILED_FORMAT})")]
    Format(u8),
    #[error("compiled encoder: {0} out of bounds")]
    Bound(&'static str),
    #[error("compiled encoder: a text is not UTF-8")]
    Utf8,
    #[error("compiled encoder: split pattern: {0}")]
    Pattern(String),
    #[error("compiled encoder: added tokens: {0}")]
    Added(String),
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u32).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len());
    out.extend_from_slice(b);
}

/// The pattern a split step runs (as `tokenizer.json` names it).
fn pattern(s: &Splitter) -> &str {
    match s {
        Splitter::Fancy(re) | Splitter::Known { fancy: re, .. } => re.as_str(),
    }
}

impl FastBpe {
    /// Appends this encoder's tables (see the module documentation). The same encoder always
    /// gives the same bytes.
    pub fn write_compiled(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        out.push(COMPILED_FORMAT);
        out.push(u8::from(self.nfc));
        put_u32(out, self.splits.len());
        for s in &self.splits {
            put_bytes(out, pattern(s).as_bytes());
        }
        for id in self.byte_ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        let ids = self.added.as_ref().map_or(&[][..], |a| &a.1[..]);
        put_u32(out, ids.len());
        for (id, text) in ids.iter().zip(&self.added_text) {
            out.extend_from_slice(&id.to_le_bytes());
            put_bytes(out, text.as_bytes());
        }
        let mut merges: Vec<(u64, u64)> = self.merges.iter().map(|(&k, &v)| (k, v)).collect();
        merges.sort_unstable();
        put_u32(out, merges.len());
        for (key, value) in merges {
            for half in [key >> 32, key, value >> 32, value] {
                out.extend_from_slice(&(half as u32).to_le_bytes());
            }
        }
        match &self.whole {
            None => out.push(0),
            Some(w) => {
                out.push(1);
                let mut pieces: Vec<(&[u8], u32)> = w.iter().map(|(k, &v)| (&k[..], v)).collect();
                pieces.sort_unstable();
                put_u32(out, pieces.len());
                for (bytes, id) in pieces {
                    out.extend_from_slice(&id.to_le_bytes());
                    put_bytes(out, bytes);
                }
            }
        }
        put_u32(out, self.post.len());
        for template in &self.post {
            put_u32(out, template.len());
            for part in template {
                match part {
                    Part::Sequence => out.push(0),
                    Part::Special(ids) => {
                        out.push(1);
                        put_u32(out, ids.len());
                        for id in ids {
                            out.extend_from_slice(&id.to_le_bytes());
                        }
                    }
                }
            }
        }
    }

    /// Reads an encoder written by [`FastBpe::write_compiled`] from `r`, leaving `r` after it.
    pub(crate) fn read_compiled(r: &mut Reader<'_>) -> Result<FastBpe, CompiledError> {
        if r.take(4).ok_or(CompiledError::Truncated)? != MAGIC {
            return Err(CompiledError::Magic);
        }
        let format = u8_of(r)?;
        if format != COMPILED_FORMAT {
            return Err(CompiledError::Format(format));
        }
        let nfc = match u8_of(r)? {
            0 => false,
            1 => true,
            _ => return Err(CompiledError::Bound("NFC flag")),
        };
        let n = count(r, MAX_STEPS, 4, "split patterns")?;
        let mut splits = Vec::with_capacity(n);
        for _ in 0..n {
            let p = text(r, MAX_PATTERN_BYTES, "split pattern")?;
            splits.push(splitter(p).map_err(|e| CompiledError::Pattern(e.to_string()))?);
        }
        let mut byte_ids = [0u32; 256];
        for id in &mut byte_ids {
            *id = u32_of(r)?;
        }
        let n = count(r, usize::MAX, 8, "added tokens")?;
        let mut ids = Vec::with_capacity(n);
        let mut added_text = Vec::with_capacity(n);
        for _ in 0..n {
            ids.push(u32_of(r)?);
            added_text.push(text(r, usize::MAX, "added token")?.to_owned());
        }
        let ac = added_automaton(&added_text).map_err(CompiledError::Added)?;
        let added = ac.map(|ac| (ac, ids));
        let n = count(r, usize::MAX, 16, "merges")?;
        let mut merges = MergeMap::with_capacity_and_hasher(n, Default::default());
        for _ in 0..n {
            let [left, right, rank, merged] = [u32_of(r)?, u32_of(r)?, u32_of(r)?, u32_of(r)?];
            let key = (u64::from(left) << 32) | u64::from(right);
            merges.insert(key, (u64::from(rank) << 32) | u64::from(merged));
        }
        let whole = match u8_of(r)? {
            0 => None,
            1 => {
                let n = count(r, usize::MAX, 8, "whole pieces")?;
                let mut w = PieceMap::with_capacity_and_hasher(n, Default::default());
                for _ in 0..n {
                    let id = u32_of(r)?;
                    let len = count(r, usize::MAX, 1, "whole piece")?;
                    let bytes = r.take(len).ok_or(CompiledError::Truncated)?;
                    w.insert(Box::from(bytes), id);
                }
                Some(w)
            }
            _ => return Err(CompiledError::Bound("ignore_merges flag")),
        };
        let n = count(r, MAX_STEPS, 4, "post-processors")?;
        let mut post = Vec::with_capacity(n);
        for _ in 0..n {
            let parts = count(r, MAX_STEPS, 1, "template parts")?;
            let mut template = Vec::with_capacity(parts);
            for _ in 0..parts {
                template.push(match u8_of(r)? {
                    0 => Part::Sequence,
                    1 => {
                        let k = count(r, MAX_STEPS, 4, "special ids")?;
                        Part::Special((0..k).map(|_| u32_of(r)).collect::<Result<_, _>>()?)
                    }
                    _ => return Err(CompiledError::Bound("template part")),
                });
            }
            post.push(template);
        }
        Ok(FastBpe {
            added,
            added_text,
            nfc,
            splits,
            byte_ids,
            merges,
            whole,
            post,
            state: Mutex::new(State::default()),
        })
    }
}

fn u8_of(r: &mut Reader<'_>) -> Result<u8, CompiledError> {
    r.u8().ok_or(CompiledError::Truncated)
}

fn u32_of(r: &mut Reader<'_>) -> Result<u32, CompiledError> {
    r.u32().ok_or(CompiledError::Truncated)
}

/// A count of at most `max` items of at least `min_bytes` each, that the bytes left can hold.
fn count(
    r: &mut Reader<'_>,
    max: usize,
    min_bytes: usize,
    what: &'static str,
) -> Result<usize, CompiledError> {
    let n = u32_of(r)? as usize;
    if n > max {
        return Err(CompiledError::Bound(what));
    }
    if n.saturating_mul(min_bytes) > r.remaining() {
        return Err(CompiledError::Truncated);
    }
    Ok(n)
}

fn text<'a>(r: &mut Reader<'a>, max: usize, what: &'static str) -> Result<&'a str, CompiledError> {
    let len = count(r, max, 1, what)?;
    let bytes = r.take(len).ok_or(CompiledError::Truncated)?;
    std::str::from_utf8(bytes).map_err(|_| CompiledError::Utf8)
}
