//! KV-cache events in vLLM's wire format: ZMQ PUB messages of three frames (topic, 8-byte
//! big-endian sequence number, msgpack batch `[ts, events, dp_rank]`), a replay buffer served on
//! a ZMQ ROUTER socket, and both event encodings (positional arrays, or maps with `"type"`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rmpv::Value;
use tokio::sync::mpsc;
use zeromq::{SocketRecv, SocketSend, ZmqMessage};

use crate::cache::EngineHash;

/// How each event is encoded inside a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EventEncoding {
    /// Older releases: `[tag, field, ...]`, defaulted fields written as nil.
    Array,
    /// Newer releases: `{"type": tag, field: value, ...}`, defaulted fields omitted.
    Map,
}

/// How the replay socket frames its replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReplyShape {
    /// `(seq, payload)`, ending with `(END, b"")`.
    Pair,
    /// `(topic, seq, payload)`, ending with `(b"", END, b"")`.
    Triple,
}

/// The end marker of a replay: a sequence number of all 0xFF bytes.
pub const END_SEQ: [u8; 8] = [0xFF; 8];

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    BlockStored {
        block_hashes: Vec<EngineHash>,
        parent_block_hash: Option<EngineHash>,
        token_ids: Vec<u32>,
        block_size: usize,
        medium: &'static str,
        lora_name: Option<String>,
        /// The request's `cache_salt`, carried in the first block's extra keys (as vLLM does)
        /// when these blocks start at block 0.
        salt: Option<String>,
    },
    BlockRemoved {
        block_hashes: Vec<EngineHash>,
        medium: &'static str,
    },
    AllBlocksCleared,
}

fn uints<I: IntoIterator<Item = u64>>(it: I) -> Value {
    Value::Array(it.into_iter().map(Value::from).collect())
}

/// One entry per block, in vLLM's order: the LoRA adapter's name (every block), then the
/// salt (first block of a salted chain only); nil for a block without either, and nil for
/// the whole list when no block has any.
fn extra_keys(blocks: usize, lora: Option<&str>, salt: Option<&str>) -> Value {
    if lora.is_none() && salt.is_none() {
        return Value::Nil;
    }
    Value::Array(
        (0..blocks)
            .map(|i| {
                let keys: Vec<Value> =
                    lora.into_iter().chain(salt.filter(|_| i == 0)).map(Value::from).collect();
                if keys.is_empty() {
                    Value::Nil
                } else {
                    Value::Array(keys)
                }
            })
            .collect(),
    )
}

fn opt_u64(v: Option<u64>) -> Value {
    v.map_or(Value::Nil, Value::from)
}

/// Engine shapes the simulator can publish beyond its default (vLLM, one full-attention
/// group, one store per block): the default publishes exactly as before. Set on a running
/// worker's [`EventLog`], or for every worker of a process with `KVROUTE_SIM_EVENT_SHAPE`
/// (see [`EventShape::parse`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventShape {
    /// vLLM KV cache groups (hybrid and sliding-window models): every store and removal is
    /// published once per group, with `group_idx` i and, on stores, `kv_cache_spec_kind`
    /// `groups[i]` ("full_attention", "sliding_window", ...).
    pub groups: Vec<String>,
    /// vLLM's OffloadingConnector (default, not self-describing): each GPU store is followed
    /// by one CPU store per block carrying only its hash (`token_ids=[]`, `block_size=0`).
    pub offload_placeholders: bool,
    /// Every store and removal is published twice (duplicate blocks of one prefix, as vLLM
    /// caches them): a consumer must count them.
    pub repeat: bool,
    /// SGLang's pages of this many tokens (dividing the block size): each block is published
    /// as its pages, one hash each (the last page keeps the block's hash), and removed so.
    pub page_size: Option<usize>,
    /// SGLang under EAGLE/EAGLE3/MTP: token ids as `[t_i, t_i+1]` pairs.
    pub token_pairs: bool,
}

impl EventShape {
    /// `groups=full_attention,sliding_window;offload;repeat;page=1;pairs` (any subset, in any
    /// order; empty: the default).
    pub fn parse(s: &str) -> Result<EventShape, String> {
        let mut shape = EventShape::default();
        for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some(("groups", g)) => {
                    shape.groups = g.split(',').map(|k| k.trim().to_owned()).collect();
                }
                Some(("page", n)) => {
                    let n: usize = n.parse().map_err(|_| format!("page size '{n}'"))?;
                    shape.page_size = Some(n.max(1));
                }
                None if part == "offload" => shape.offload_placeholders = true,
                None if part == "repeat" => shape.repeat = true,
                None if part == "pairs" => shape.token_pairs = true,
                _ => return Err(format!("unknown event shape option '{part}'")),
            }
        }
        Ok(shape)
    }

    /// From `KVROUTE_SIM_EVENT_SHAPE` (the default when unset or invalid).
    pub fn from_env() -> EventShape {
        match std::env::var("KVROUTE_SIM_EVENT_SHAPE") {
            Ok(s) => EventShape::parse(&s).unwrap_or_else(|e| {
                eprintln!("KVROUTE_SIM_EVENT_SHAPE ignored: {e}");
                EventShape::default()
            }),
            Err(_) => EventShape::default(),
        }
    }
}

/// The hash of page `j` of a block hashed `h` (the last page keeps `h`).
fn page_hash(h: EngineHash, j: usize, last: bool) -> EngineHash {
    if last {
        return h;
    }
    let mut x = h ^ (j as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// What one event becomes on the wire under a shape: the event, its group and kind.
#[derive(Debug, Clone)]
struct Shaped {
    event: KvEvent,
    group: Option<(u64, Option<String>)>,
    pairs: bool,
}

/// `e` as pages of `page` tokens, for blocks of `block_size` (known from the stores).
fn paged(e: KvEvent, page: usize, block_size: usize) -> KvEvent {
    if page == 0 || page >= block_size || block_size % page != 0 {
        return e;
    }
    let per = block_size / page;
    let pages = |hashes: &[EngineHash]| -> Vec<EngineHash> {
        hashes.iter().flat_map(|&h| (0..per).map(move |j| page_hash(h, j, j + 1 == per))).collect()
    };
    match e {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            medium,
            lora_name,
            salt,
            ..
        } => KvEvent::BlockStored {
            block_hashes: pages(&block_hashes),
            parent_block_hash,
            token_ids,
            block_size: page,
            medium,
            lora_name,
            salt,
        },
        KvEvent::BlockRemoved { block_hashes, medium } => {
            KvEvent::BlockRemoved { block_hashes: pages(&block_hashes), medium }
        }
        other => other,
    }
}

/// The events of one batch as `shape` publishes them; `block_size` is the engine's (pages
/// are cut from it).
fn shape_events(events: &[KvEvent], shape: &EventShape, block_size: usize) -> Vec<Shaped> {
    let mut out = Vec::new();
    let groups: Vec<Option<(u64, Option<String>)>> = if shape.groups.is_empty() {
        vec![None]
    } else {
        shape.groups.iter().enumerate().map(|(i, k)| Some((i as u64, Some(k.clone())))).collect()
    };
    let copies = if shape.repeat { 2 } else { 1 };
    for e in events {
        if matches!(e, KvEvent::AllBlocksCleared) {
            out.push(Shaped { event: e.clone(), group: None, pairs: false });
            continue;
        }
        let e = match shape.page_size {
            Some(p) => paged(e.clone(), p, block_size),
            None => e.clone(),
        };
        for g in &groups {
            let group = match (&e, g) {
                // Removals name only the group.
                (KvEvent::BlockRemoved { .. }, Some((i, _))) => Some((*i, None)),
                (_, g) => g.clone(),
            };
            for _ in 0..copies {
                out.push(Shaped {
                    event: e.clone(),
                    group: group.clone(),
                    pairs: shape.token_pairs,
                });
            }
            let KvEvent::BlockStored { block_hashes, medium: "GPU", .. } = &e else {
                continue;
            };
            if !shape.offload_placeholders {
                continue;
            }
            for &h in block_hashes {
                let placeholder = KvEvent::BlockStored {
                    block_hashes: vec![h],
                    parent_block_hash: None,
                    token_ids: Vec::new(),
                    block_size: 0,
                    medium: "CPU",
                    lora_name: None,
                    salt: None,
                };
                let group = Some((g.as_ref().map_or(0, |(i, _)| *i), None));
                out.push(Shaped { event: placeholder, group, pairs: false });
            }
        }
    }
    out
}

/// Encodes one batch as `shape` publishes it (see [`EventShape`]); `block_size` is the
/// engine's.
pub fn encode_batch_shaped(
    ts: f64,
    events: &[KvEvent],
    dp_rank: Option<u64>,
    enc: EventEncoding,
    shape: &EventShape,
    block_size: usize,
) -> Vec<u8> {
    if *shape == EventShape::default() {
        return encode_batch(ts, events, dp_rank, enc);
    }
    let batch = Value::Array(vec![
        Value::F64(ts),
        Value::Array(
            shape_events(events, shape, block_size).iter().map(|e| e.to_value(enc)).collect(),
        ),
        opt_u64(dp_rank),
    ]);
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &batch);
    out
}

impl KvEvent {
    fn to_value(&self, enc: EventEncoding) -> Value {
        Shaped { event: self.clone(), group: None, pairs: false }.to_value(enc)
    }
}

impl Shaped {
    fn to_value(&self, enc: EventEncoding) -> Value {
        let group_idx = self.group.as_ref().map_or(0, |(g, _)| *g);
        let kind = self.group.as_ref().and_then(|(_, k)| k.clone());
        let tokens = |t: &[u32]| -> Value {
            if !self.pairs {
                return uints(t.iter().map(|&t| u64::from(t)));
            }
            Value::Array(
                (0..t.len())
                    .map(|i| uints([t[i], t[(i + 1).min(t.len() - 1)]].map(u64::from)))
                    .collect(),
            )
        };
        // (name, value, defaulted): positional order follows vLLM's field order. `defaulted`
        // marks a field that has a default in vLLM and holds it (msgspec's `omit_defaults`
        // leaves it out of a map); a field declared without a default is always written, nil
        // included.
        let (tag, mut fields): (&str, Vec<(&str, Value, bool)>) = match &self.event {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                medium,
                lora_name,
                salt,
            } => (
                "BlockStored",
                vec![
                    ("block_hashes", uints(block_hashes.iter().copied()), false),
                    ("parent_block_hash", opt_u64(*parent_block_hash), false),
                    ("token_ids", tokens(token_ids), false),
                    ("block_size", Value::from(*block_size as u64), false),
                    ("lora_id", Value::Nil, false),
                    ("medium", Value::from(*medium), false),
                    ("lora_name", lora_name.clone().map_or(Value::Nil, Value::from), false),
                    (
                        "extra_keys",
                        extra_keys(block_hashes.len(), lora_name.as_deref(), salt.as_deref()),
                        lora_name.is_none() && salt.is_none(),
                    ),
                    ("group_idx", Value::from(group_idx), self.group.is_none()),
                ],
            ),
            KvEvent::BlockRemoved { block_hashes, medium } => (
                "BlockRemoved",
                vec![
                    ("block_hashes", uints(block_hashes.iter().copied()), false),
                    ("medium", Value::from(*medium), false),
                    ("group_idx", Value::from(group_idx), self.group.is_none()),
                ],
            ),
            KvEvent::AllBlocksCleared => ("AllBlocksCleared", vec![]),
        };
        if let (Some(kind), "BlockStored") = (kind, tag) {
            fields.push(("kv_cache_spec_kind", Value::from(kind), false));
        }
        match enc {
            EventEncoding::Array => {
                let mut items = vec![Value::from(tag)];
                items.extend(fields.into_iter().map(|(_, v, _)| v));
                Value::Array(items)
            }
            EventEncoding::Map => {
                let mut entries = vec![(Value::from("type"), Value::from(tag))];
                entries.extend(
                    fields.into_iter().filter(|(_, _, d)| !d).map(|(k, v, _)| (Value::from(k), v)),
                );
                Value::Map(entries)
            }
        }
    }
}

/// Encodes one batch `[ts, [events...], dp_rank]` as msgpack.
pub fn encode_batch(
    ts: f64,
    events: &[KvEvent],
    dp_rank: Option<u64>,
    enc: EventEncoding,
) -> Vec<u8> {
    let batch = Value::Array(vec![
        Value::F64(ts),
        Value::Array(events.iter().map(|e| e.to_value(enc)).collect()),
        opt_u64(dp_rank),
    ]);
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &batch);
    out
}

/// Publisher settings.
#[derive(Debug, Clone)]
pub struct EventConfig {
    pub topic: String,
    pub encoding: EventEncoding,
    pub reply_shape: ReplyShape,
    /// Batches kept for replay (vLLM's `buffer_steps`).
    pub buffer_steps: usize,
}

/// State shared by the publisher, the replay server and the fault endpoint.
#[derive(Debug)]
pub struct EventLog {
    /// `(seq, payload)` of the most recent batches.
    buffer: Mutex<VecDeque<(u64, Bytes)>>,
    next_seq: AtomicU64,
    /// Batches still to be dropped on the PUB socket (they stay in the replay buffer).
    pub drop_remaining: AtomicU64,
    /// Until then, no batch is published on the PUB socket (an event outage: the batches stay
    /// in the replay buffer, which keeps only the most recent ones).
    pub muted_until: Mutex<Option<std::time::Instant>>,
    /// The shape batches are published in (default: as vLLM with one full-attention group;
    /// `KVROUTE_SIM_EVENT_SHAPE` sets it for every worker of the process).
    shape: Mutex<EventShape>,
}

impl Default for EventLog {
    fn default() -> EventLog {
        EventLog {
            buffer: Mutex::default(),
            next_seq: AtomicU64::new(0),
            drop_remaining: AtomicU64::new(0),
            muted_until: Mutex::new(None),
            shape: Mutex::new(EventShape::from_env()),
        }
    }
}

impl EventLog {
    pub fn next_seq(&self) -> u64 {
        self.next_seq.load(Ordering::SeqCst)
    }

    /// Publishes nothing on the PUB socket for `d` from now (zero ends an outage).
    pub fn mute_for(&self, d: std::time::Duration) {
        let until = (!d.is_zero()).then(|| std::time::Instant::now() + d);
        *self.muted_until.lock().unwrap_or_else(|e| e.into_inner()) = until;
    }

    /// Whether an event outage is on now.
    pub fn muted(&self) -> bool {
        self.muted_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| std::time::Instant::now() < t)
    }

    /// Publishes the following batches in `shape`.
    pub fn set_shape(&self, shape: EventShape) {
        *self.shape.lock().unwrap_or_else(|e| e.into_inner()) = shape;
    }

    pub fn shape(&self) -> EventShape {
        self.shape.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The batches still in the replay buffer from sequence `start` on, as published.
    pub fn replay_from(&self, start: u64) -> Vec<(u64, Bytes)> {
        let buf = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        buf.iter().filter(|(s, _)| *s >= start).cloned().collect()
    }
}

fn seq_frame(seq: u64) -> Bytes {
    Bytes::copy_from_slice(&seq.to_be_bytes())
}

fn message(frames: Vec<Bytes>) -> Option<ZmqMessage> {
    ZmqMessage::try_from(frames).ok()
}

/// Sends batches from `batches` on `socket` forever (until the channel closes).
pub async fn run_publisher(
    mut socket: zeromq::PubSocket,
    cfg: EventConfig,
    log: Arc<EventLog>,
    mut batches: mpsc::UnboundedReceiver<(f64, Vec<KvEvent>)>,
) {
    // The engine's block size, from its stores: pages are cut from it.
    let mut block_size = 0;
    while let Some((ts, events)) = batches.recv().await {
        for e in &events {
            if let KvEvent::BlockStored { block_size: b, .. } = e {
                block_size = *b;
            }
        }
        let shape = log.shape();
        let payload = Bytes::from(encode_batch_shaped(
            ts,
            &events,
            Some(0),
            cfg.encoding,
            &shape,
            block_size,
        ));
        let seq = log.next_seq.fetch_add(1, Ordering::SeqCst);
        {
            let mut buf = log.buffer.lock().unwrap_or_else(|e| e.into_inner());
            buf.push_back((seq, payload.clone()));
            while buf.len() > cfg.buffer_steps {
                buf.pop_front();
            }
        }
        let dropped = log
            .drop_remaining
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if dropped || log.muted() {
            continue;
        }
        let frames = vec![Bytes::from(cfg.topic.clone().into_bytes()), seq_frame(seq), payload];
        if let Some(m) = message(frames) {
            let _ = socket.send(m).await;
        }
    }
}

/// Serves replay requests `[identity, "", start_seq]` on `socket` forever.
pub async fn run_replay(mut socket: zeromq::RouterSocket, cfg: EventConfig, log: Arc<EventLog>) {
    while let Ok(req) = socket.recv().await {
        let frames = req.into_vec();
        let (Some(identity), Some(start)) = (frames.first(), frames.last()) else {
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
            continue;
        };
        let start = u64::from_be_bytes(start);
        let topic = Bytes::from(cfg.topic.clone().into_bytes());
        let mut replies: Vec<Vec<Bytes>> = log
            .replay_from(start)
            .into_iter()
            .map(|(seq, payload)| match cfg.reply_shape {
                ReplyShape::Pair => vec![seq_frame(seq), payload],
                ReplyShape::Triple => vec![topic.clone(), seq_frame(seq), payload],
            })
            .collect();
        let end = Bytes::copy_from_slice(&END_SEQ);
        replies.push(match cfg.reply_shape {
            ReplyShape::Pair => vec![end, Bytes::new()],
            ReplyShape::Triple => vec![Bytes::new(), end, Bytes::new()],
        });
        for body in replies {
            let mut frames = vec![identity.clone(), Bytes::new()];
            frames.extend(body);
            if let Some(m) = message(frames) {
                if socket.send(m).await.is_err() {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored() -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: vec![7],
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 4,
            medium: "GPU",
            lora_name: None,
            salt: None,
        }
    }

    #[test]
    fn an_event_outage_starts_and_ends() {
        let log = EventLog::default();
        assert!(!log.muted());
        log.mute_for(std::time::Duration::from_secs(3600));
        assert!(log.muted());
        log.mute_for(std::time::Duration::ZERO);
        assert!(!log.muted());
    }

    /// The 42-byte example batch of the reference (older, positional form).
    #[test]
    fn golden_array_encoding() {
        let mut want = vec![0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x91, 0x9a, 0xab];
        want.extend_from_slice(b"BlockStored");
        want.extend_from_slice(&[0x91, 0x07, 0xc0, 0x94, 1, 2, 3, 4, 4, 0xc0, 0xa3]);
        want.extend_from_slice(b"GPU");
        want.extend_from_slice(&[0xc0, 0xc0, 0x00, 0x00]);
        assert_eq!(want.len(), 42);
        assert_eq!(encode_batch(1.5, &[stored()], Some(0), EventEncoding::Array), want);
    }

    #[test]
    fn golden_map_encoding() {
        let got =
            encode_batch(1.5, &[stored(), KvEvent::AllBlocksCleared], None, EventEncoding::Map);
        // vLLM declares parent_block_hash, lora_id and lora_name without a default: msgspec
        // writes them as nil, `omit_defaults` notwithstanding.
        let mut want = vec![0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x92, 0x88];
        for (k, v) in [
            ("type", &b"\xabBlockStored"[..]),
            ("block_hashes", b"\x91\x07"),
            ("parent_block_hash", b"\xc0"),
            ("token_ids", b"\x94\x01\x02\x03\x04"),
            ("block_size", b"\x04"),
            ("lora_id", b"\xc0"),
            ("medium", b"\xa3GPU"),
            ("lora_name", b"\xc0"),
        ] {
            want.push(0xa0 | k.len() as u8);
            want.extend_from_slice(k.as_bytes());
            want.extend_from_slice(v);
        }
        want.extend_from_slice(&[0x81, 0xa4]);
        want.extend_from_slice(b"type");
        want.push(0xb0);
        want.extend_from_slice(b"AllBlocksCleared");
        want.push(0xc0);
        assert_eq!(got, want);
    }

    /// A LoRA adapter's blocks name it in `lora_name` and in every block's extra keys, before
    /// the salt (first block only), as vLLM does.
    #[test]
    fn golden_adapter_extra_keys() {
        let e = KvEvent::BlockStored {
            block_hashes: vec![7, 8],
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
            medium: "GPU",
            lora_name: Some("sql".into()),
            salt: Some("t".into()),
        };
        let got = encode_batch(1.5, &[e], None, EventEncoding::Array);
        let mut tail = vec![0xa3];
        tail.extend_from_slice(b"GPU");
        tail.push(0xa3);
        tail.extend_from_slice(b"sql");
        // [["sql", "t"], ["sql"]], then group_idx 0, then the nil rank.
        tail.extend_from_slice(&[0x92, 0x92, 0xa3]);
        tail.extend_from_slice(b"sql");
        tail.extend_from_slice(&[0xa1, b't', 0x91, 0xa3]);
        tail.extend_from_slice(b"sql");
        tail.extend_from_slice(&[0x00, 0xc0]);
        assert!(got.ends_with(&tail), "{got:x?}");
        let none = extra_keys(2, Some("sql"), None);
        assert_eq!(none, Value::Array(vec![Value::Array(vec!["sql".into()]); 2]));
    }
}
