//! Decoding engines' KV-event batches (vLLM, SGLang, TensorRT-LLM share the format): msgpack
//! `[ts, [event...], rank]` with events as positional arrays or maps with `"type"`. Untrusted
//! bytes: the decoder returns an error, never panics (fuzz target `event_decode`). A batch that
//! decodes is taken event by event: an unreadable event becomes [`EngineEvent::Bad`] and the
//! rest of the batch still applies. Before anything is decoded, a pre-pass over the bytes
//! ([`bounds`]) refuses a payload whose declared sizes its bytes cannot hold, or that holds more
//! elements or nesting than [`Bounds`] allow, so what decoding allocates is bounded by the
//! payload's length and the caps.

mod bounds;

pub use bounds::{
    check, BoundError, Bounds, PayloadShape, DEFAULT_MAX_DEPTH, DEFAULT_MAX_ELEMENTS,
};

use rmpv::Value;
use thiserror::Error;

/// An engine's block identity: an integer or bytes, normalized to a map key.
pub type EngineKey = u64;

/// Memory tier of stored blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    Gpu,
    Cpu,
    Storage,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Gpu => "GPU",
            Tier::Cpu => "CPU",
            Tier::Storage => "STORAGE",
        }
    }
}

/// Where an event says its blocks are, from its `medium` and `locality`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The worker's own device memory ("GPU", or no medium: older releases).
    Gpu,
    /// The worker's own host memory: vLLM's offloading tier ("CPU").
    Cpu,
    /// SGLang's HiCache host tier ("CPU_PINNED"): a cache flush clears it with the GPU tier.
    HostPinned,
    /// The worker's own disk / storage tier ("STORAGE", "DISK").
    Storage,
    /// Held elsewhere (`locality: "REMOTE"`, SGLang's "EXTERNAL" pool): not the worker's own.
    Remote,
    /// A medium string no engine documents (connectors such as LMCache pass their own).
    Unknown,
}

impl Place {
    fn parse(medium: Option<&Value>, locality: Option<&Value>) -> Place {
        let upper = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_ascii_uppercase);
        if upper(locality).as_deref() == Some("REMOTE") {
            return Place::Remote;
        }
        match medium {
            None => Place::Gpu,
            Some(m) => match upper(Some(m)).as_deref() {
                Some("GPU") => Place::Gpu,
                Some("CPU") => Place::Cpu,
                Some("CPU_PINNED") => Place::HostPinned,
                Some("STORAGE") | Some("DISK") => Place::Storage,
                Some("EXTERNAL") => Place::Remote,
                _ => Place::Unknown,
            },
        }
    }

    /// The worker's own tier this place is, if it is one.
    pub fn tier(self) -> Option<Tier> {
        match self {
            Place::Gpu => Some(Tier::Gpu),
            Place::Cpu | Place::HostPinned => Some(Tier::Cpu),
            Place::Storage => Some(Tier::Storage),
            Place::Remote | Place::Unknown => None,
        }
    }
}

/// One stored event.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub hashes: Vec<EngineKey>,
    pub parent: Option<EngineKey>,
    /// The blocks' tokens, concatenated (SGLang's speculative-decoding pairs reduced to the
    /// tokens they start with). Empty in vLLM's offloading placeholders.
    pub token_ids: Vec<u32>,
    /// Tokens per engine block (page); 0 in vLLM's offloading placeholders.
    pub block_size: usize,
    pub place: Place,
    pub lora_name: Option<String>,
    /// `cache_salt` of the chain, when these blocks start it.
    pub salt: Option<String>,
    /// vLLM's KV cache group (`group_idx`; absent in older releases and SGLang).
    pub group: Option<u32>,
    /// vLLM's `kv_cache_spec_kind` of that group ("full_attention", "sliding_window", ...).
    pub kind: Option<String>,
    /// Each block's hash also covers tokens after it (vLLM's `lookahead_token_ids`, SGLang's
    /// `[t_i, t_i+1]` pairs under EAGLE/MTP).
    pub lookahead: bool,
    /// The token ids came as SGLang's `[t_i, t_i+1]` pairs.
    pub pairs: bool,
}

/// One decoded event. Boxed stores keep the enum small: a batch of one-byte events (nils,
/// empty tags) costs tens of bytes per event, not the size of a store.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    Stored(Box<Stored>),
    Removed {
        hashes: Vec<EngineKey>,
        place: Place,
        group: Option<u32>,
    },
    /// A cache reset; `place` when the event names a medium (vLLM 0.33 and SGLang send none).
    AllCleared {
        place: Option<Place>,
    },
    /// A tag this decoder does not know (ignored, counted).
    Unknown(String),
    /// An event whose fields could not be read (ignored, counted; the rest of its batch is
    /// applied).
    Bad(DecodeError),
}

impl EngineEvent {
    /// A store event.
    pub fn stored(s: Stored) -> EngineEvent {
        EngineEvent::Stored(Box::new(s))
    }
}

/// One decoded batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub ts: f64,
    pub events: Vec<EngineEvent>,
    pub rank: Option<u64>,
}

#[derive(Debug, Clone, Error, PartialEq)]
pub enum DecodeError {
    #[error("payload is not msgpack: {0}")]
    Msgpack(String),
    #[error("batch is not [ts, events, rank]")]
    PayloadShape,
    #[error("event field '{0}' is missing or has the wrong type")]
    Field(&'static str),
    #[error("refused before decoding: {0}")]
    Bounds(#[from] BoundError),
}

fn key(v: &Value) -> Option<EngineKey> {
    match v {
        Value::Integer(i) => i.as_u64().or_else(|| i.as_i64().map(|x| x as u64)),
        Value::Binary(b) => Some(xxhash_rust::xxh3::xxh3_64(b)),
        Value::String(s) => s.as_str().map(|s| xxhash_rust::xxh3::xxh3_64(s.as_bytes())),
        _ => None,
    }
}

fn keys(v: Option<&Value>, name: &'static str) -> Result<Vec<EngineKey>, DecodeError> {
    match v {
        Some(Value::Array(a)) => a.iter().map(|x| key(x).ok_or(DecodeError::Field(name))).collect(),
        // Single-hash form (one event per page in SGLang).
        Some(v) => key(v).map(|k| vec![k]).ok_or(DecodeError::Field(name)),
        None => Err(DecodeError::Field(name)),
    }
}

/// Named access to an event's fields, whichever encoding it came in.
struct Fields<'a> {
    tag: &'a str,
    positional: Option<&'a [Value]>,
    named: Option<&'a [(Value, Value)]>,
}

impl<'a> Fields<'a> {
    fn of(v: &'a Value) -> Result<Fields<'a>, DecodeError> {
        match v {
            Value::Array(a) => {
                let tag = a.first().and_then(Value::as_str).ok_or(DecodeError::Field("tag"))?;
                Ok(Fields { tag, positional: Some(&a[1..]), named: None })
            }
            Value::Map(m) => {
                let tag = m
                    .iter()
                    .find(|(k, _)| k.as_str() == Some("type"))
                    .and_then(|(_, v)| v.as_str())
                    .ok_or(DecodeError::Field("type"))?;
                Ok(Fields { tag, positional: None, named: Some(m) })
            }
            _ => Err(DecodeError::Field("event")),
        }
    }

    /// Field `name`, at position `pos` in the array form. Nil reads as absent.
    fn get(&self, name: &str, pos: usize) -> Option<&'a Value> {
        let v = match (self.positional, self.named) {
            (Some(p), _) => p.get(pos),
            (_, Some(m)) => m.iter().find(|(k, _)| k.as_str() == Some(name)).map(|(_, v)| v),
            _ => None,
        };
        v.filter(|v| !v.is_nil())
    }

    /// SGLang's salted stores carry a trailing `{"cache_salt": ...}` map.
    fn trailing_salt(&self) -> Option<String> {
        let salt_in = |m: &[(Value, Value)]| {
            m.iter()
                .find(|(k, _)| k.as_str() == Some("cache_salt"))
                .and_then(|(_, v)| v.as_str())
                .map(str::to_owned)
        };
        match (self.positional, self.named) {
            (Some(p), _) => p.iter().rev().find_map(|v| v.as_map().and_then(|m| salt_in(m))),
            (_, Some(m)) => salt_in(m).or_else(|| {
                m.iter()
                    .find(|(k, _)| k.as_str() == Some("metadata"))
                    .and_then(|(_, v)| v.as_map())
                    .and_then(|m| salt_in(m))
            }),
            _ => None,
        }
    }
}

/// The salt in the first block's extra keys: the last string of `extra_keys[0]` after the
/// LoRA adapter's name, which vLLM puts first in every block's keys.
fn extra_keys_salt(v: Option<&Value>, lora: Option<&str>) -> Option<String> {
    let first = v?.as_array()?.first()?.as_array()?;
    let skip = usize::from(lora.is_some() && first.first().and_then(Value::as_str) == lora);
    first[skip..].iter().rev().find_map(|x| x.as_str()).map(str::to_owned)
}

/// Token ids: integers, or SGLang's speculative-decoding pairs `[t_i, t_i+1]` (whose token
/// stream is the first of each pair; the second is the next token, a lookahead). The flag says
/// which form came.
fn token_ids(v: Option<&Value>) -> Result<(Vec<u32>, bool), DecodeError> {
    let bad = DecodeError::Field("token_ids");
    let tok = |t: &Value| t.as_u64().and_then(|t| u32::try_from(t).ok());
    let Some(Value::Array(a)) = v else {
        return Err(bad);
    };
    let pairs = matches!(a.first(), Some(Value::Array(_)));
    let ids = a
        .iter()
        .map(|t| match (t, pairs) {
            (Value::Array(p), true) if p.len() == 2 => tok(&p[0]),
            (t, false) => tok(t),
            _ => None,
        })
        .collect::<Option<Vec<u32>>>()
        .ok_or(bad)?;
    Ok((ids, pairs))
}

fn group(v: Option<&Value>) -> Option<u32> {
    v.and_then(Value::as_u64).and_then(|g| u32::try_from(g).ok())
}

fn stored(f: &Fields<'_>) -> Result<Stored, DecodeError> {
    let (token_ids, pairs) = token_ids(f.get("token_ids", 2))?;
    let block_size = f
        .get("block_size", 3)
        .and_then(Value::as_u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or(DecodeError::Field("block_size"))?;
    let lora_name = f.get("lora_name", 6).and_then(Value::as_str).map(str::to_owned);
    let salt =
        extra_keys_salt(f.get("extra_keys", 7), lora_name.as_deref()).or_else(|| f.trailing_salt());
    let lookahead = pairs
        || f.get("lookahead_token_ids", 14)
            .and_then(Value::as_array)
            .is_some_and(|l| l.iter().any(|b| b.as_array().is_some_and(|b| !b.is_empty())));
    Ok(Stored {
        hashes: keys(f.get("block_hashes", 0), "block_hashes")?,
        parent: f.get("parent_block_hash", 1).and_then(key),
        token_ids,
        block_size,
        place: Place::parse(f.get("medium", 5), f.get("locality", 11)),
        lora_name,
        salt,
        group: group(f.get("group_idx", 8)),
        kind: f.get("kv_cache_spec_kind", 9).and_then(Value::as_str).map(str::to_owned),
        lookahead,
        pairs,
    })
}

fn event(v: &Value) -> Result<EngineEvent, DecodeError> {
    let f = Fields::of(v)?;
    match f.tag {
        "BlockStored" | "BlockStoredWithMetadata" => stored(&f).map(EngineEvent::stored),
        "BlockRemoved" => Ok(EngineEvent::Removed {
            hashes: keys(f.get("block_hashes", 0), "block_hashes")?,
            place: Place::parse(f.get("medium", 1), f.get("locality", 3)),
            group: group(f.get("group_idx", 2)),
        }),
        "AllBlocksCleared" => Ok(EngineEvent::AllCleared {
            place: f.get("medium", 0).map(|m| Place::parse(Some(m), None)),
        }),
        other => Ok(EngineEvent::Unknown(other.to_owned())),
    }
}

/// Deepest msgpack nesting read, as rmpv counts it (a container and its contents are two
/// levels). A batch needs about a dozen (batch, events, event, extra keys, one block's keys,
/// a key tuple); rmpv's own default (1024) lets a hostile payload recurse so deep that a debug
/// build overflows a 2 MiB thread stack (fuzz seed `event_decode/deep-nesting.msgpack`).
const MAX_DEPTH: usize = 64;

/// Decodes one batch payload within the default [`Bounds`].
pub fn decode_batch(payload: &[u8]) -> Result<Batch, DecodeError> {
    decode_batch_with(payload, &Bounds::default())
}

/// Decodes one batch payload; refused before anything is allocated for it when its structure
/// exceeds what its bytes can hold or `bounds` ([`check`]).
pub fn decode_batch_with(payload: &[u8], bounds: &Bounds) -> Result<Batch, DecodeError> {
    check(payload, bounds)?;
    let v = rmpv::decode::read_value_with_max_depth(&mut &payload[..], MAX_DEPTH)
        .map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    let a = v.as_array().ok_or(DecodeError::PayloadShape)?;
    let ts = match a.first() {
        Some(Value::F64(f)) => *f,
        Some(Value::F32(f)) => f64::from(*f),
        Some(Value::Integer(i)) => i.as_f64().unwrap_or(0.0),
        _ => return Err(DecodeError::PayloadShape),
    };
    let events = a.get(1).and_then(Value::as_array).ok_or(DecodeError::PayloadShape)?;
    // One unreadable event is counted and skipped: the rest of the batch (removals
    // included) still applies.
    let events = events.iter().map(|e| event(e).unwrap_or_else(EngineEvent::Bad)).collect();
    Ok(Batch { ts, events, rank: a.get(2).and_then(Value::as_u64) })
}

#[cfg(test)]
mod tests;
