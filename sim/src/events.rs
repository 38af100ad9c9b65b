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

impl KvEvent {
    fn to_value(&self, enc: EventEncoding) -> Value {
        // (name, value, defaulted): positional order follows vLLM's field order.
        let (tag, fields): (&str, Vec<(&str, Value, bool)>) = match self {
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
                    ("parent_block_hash", opt_u64(*parent_block_hash), parent_block_hash.is_none()),
                    ("token_ids", uints(token_ids.iter().map(|&t| u64::from(t))), false),
                    ("block_size", Value::from(*block_size as u64), false),
                    ("lora_id", Value::Nil, true),
                    ("medium", Value::from(*medium), false),
                    (
                        "lora_name",
                        lora_name.clone().map_or(Value::Nil, Value::from),
                        lora_name.is_none(),
                    ),
                    (
                        "extra_keys",
                        extra_keys(block_hashes.len(), lora_name.as_deref(), salt.as_deref()),
                        lora_name.is_none() && salt.is_none(),
                    ),
                    ("group_idx", Value::from(0u64), true),
                ],
            ),
            KvEvent::BlockRemoved { block_hashes, medium } => (
                "BlockRemoved",
                vec![
                    ("block_hashes", uints(block_hashes.iter().copied()), false),
                    ("medium", Value::from(*medium), false),
                    ("group_idx", Value::from(0u64), true),
                ],
            ),
            KvEvent::AllBlocksCleared => ("AllBlocksCleared", vec![]),
        };
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
#[derive(Debug, Default)]
pub struct EventLog {
    /// `(seq, payload)` of the most recent batches.
    buffer: Mutex<VecDeque<(u64, Bytes)>>,
    next_seq: AtomicU64,
    /// Batches still to be dropped on the PUB socket (they stay in the replay buffer).
    pub drop_remaining: AtomicU64,
}

impl EventLog {
    pub fn next_seq(&self) -> u64 {
        self.next_seq.load(Ordering::SeqCst)
    }

    fn replay_from(&self, start: u64) -> Vec<(u64, Bytes)> {
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
    while let Some((ts, events)) = batches.recv().await {
        let payload = Bytes::from(encode_batch(ts, &events, Some(0), cfg.encoding));
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
        if dropped {
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
        let mut want = vec![0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x92, 0x85];
        for (k, v) in [
            ("type", &b"\xabBlockStored"[..]),
            ("block_hashes", b"\x91\x07"),
            ("token_ids", b"\x94\x01\x02\x03\x04"),
            ("block_size", b"\x04"),
            ("medium", b"\xa3GPU"),
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
