//! KV moved between workers, on the engine's side: what it holds of a prompt (for a pull, on
//! the holder and on the receiver), and blocks pulled from a holder stored in its cache.
//!
//! As with LMCache's peer-to-peer sharing, the receiver asks for the leading blocks it lacks
//! and the holder has, by content (the engine hash chain is the same on every worker of one
//! binary and block size); the holder's cache is only read. Pulled blocks become cached free
//! blocks of the receiver, published as `BlockStored`, so the request that follows reuses them
//! like any cached prefix.

use tokio::sync::oneshot;

use super::Core;
use crate::cache::{engine_hashes, EngineHash};
use crate::events::KvEvent;

/// A prompt's block hashes on this engine and how many leading ones it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLookup {
    pub hashes: Vec<EngineHash>,
    pub held: usize,
    pub block_size: usize,
}

/// A KV-transfer request to the engine.
pub enum KvOp {
    /// The engine's hashes of a prompt's full blocks, and how many leading ones are cached.
    Lookup {
        tokens: Vec<u32>,
        salt: Option<String>,
        lora: Option<String>,
        reply: oneshot::Sender<KvLookup>,
    },
    /// How many leading blocks of `hashes` are cached (a holder answering a pull).
    Held { hashes: Vec<EngineHash>, reply: oneshot::Sender<usize> },
    /// Blocks `from..from + n` of the prompt arrived from a peer: store them as cached free
    /// blocks (evicting as needed) with their `BlockStored` event. Replies with the leading
    /// blocks of the prompt cached afterwards. Nothing is stored when a block before `from`
    /// is no longer cached (the chain would not be reachable) or when the cache has no room.
    Insert {
        tokens: Vec<u32>,
        salt: Option<String>,
        lora: Option<String>,
        from: usize,
        n: usize,
        reply: oneshot::Sender<usize>,
    },
}

impl Core {
    pub(super) fn kv(&mut self, op: KvOp) {
        match op {
            KvOp::Lookup { tokens, salt, lora, reply } => {
                let bs = self.cfg.block_size;
                let hashes = engine_hashes(&tokens, bs, salt.as_deref(), lora.as_deref());
                let held = self.cache.longest_prefix(&hashes);
                let _ = reply.send(KvLookup { hashes, held, block_size: bs });
            }
            KvOp::Held { hashes, reply } => {
                let _ = reply.send(self.cache.longest_prefix(&hashes));
            }
            KvOp::Insert { tokens, salt, lora, from, n, reply } => {
                let held = self.insert(&tokens, salt, lora, from, n);
                let _ = reply.send(held);
            }
        }
    }

    fn insert(
        &mut self,
        tokens: &[u32],
        salt: Option<String>,
        lora: Option<String>,
        from: usize,
        n: usize,
    ) -> usize {
        let bs = self.cfg.block_size;
        let hashes = engine_hashes(tokens, bs, salt.as_deref(), lora.as_deref());
        let end = (from + n).min(hashes.len());
        let have = self.cache.longest_prefix(&hashes[..end]);
        if have >= end || have < from {
            return have;
        }
        // A reference on the prefix keeps it from being evicted to make room for the rest.
        let Ok(evicted) = self.cache.acquire(&hashes[..have], end - have) else {
            return have;
        };
        if !evicted.is_empty() {
            self.pending.push(KvEvent::BlockRemoved { block_hashes: evicted, medium: "GPU" });
        }
        let stored: Vec<usize> = (have..end).filter(|&b| self.cache.fill(hashes[b])).collect();
        self.cache.release(&hashes[..end], 0);
        // One event per run of consecutive newly stored blocks.
        for run in stored.chunk_by(|a, b| b == &(a + 1)) {
            let (b0, b1) = (run[0], run[run.len() - 1]);
            self.pending.push(KvEvent::BlockStored {
                block_hashes: hashes[b0..=b1].to_vec(),
                parent_block_hash: b0.checked_sub(1).map(|p| hashes[p]),
                token_ids: tokens[b0 * bs..(b1 + 1) * bs].to_vec(),
                block_size: bs,
                medium: "GPU",
                lora_name: lora.clone(),
                salt: salt.clone().filter(|_| b0 == 0),
            });
        }
        self.flush_events();
        self.publish_stats();
        self.cache.longest_prefix(&hashes)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::{mpsc, oneshot};

    use super::*;
    use crate::engine::{Command, Engine, EngineConfig, Timing};

    type Events = mpsc::UnboundedReceiver<(f64, Vec<KvEvent>)>;

    fn engine(blocks: usize) -> (Engine, Events, tokio::task::JoinHandle<()>) {
        let cfg = EngineConfig {
            block_size: 4,
            num_gpu_blocks: blocks,
            max_num_seqs: 4,
            max_num_batched_tokens: 64,
            max_loras: 1,
            policy: crate::engine::SchedulingPolicy::Fcfs,
            timing: Timing {
                step_floor_ms: 1.0,
                prefill_ms_per_token: 0.0,
                prefill_ms_per_token_sq: 0.0,
                decode_ms_per_seq: 0.0,
                kv_ms_per_1k_tokens: 0.0,
                speedup: 1.0,
            },
            output_vocab: Arc::new(vec![7]),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let (e, h) = Engine::start(cfg, Some(tx));
        (e, rx, h)
    }

    async fn insert(e: &Engine, tokens: &[u32], from: usize, n: usize) -> usize {
        let (reply, rx) = oneshot::channel();
        let op = KvOp::Insert { tokens: tokens.to_vec(), salt: None, lora: None, from, n, reply };
        assert!(e.command(Command::Kv(op)));
        rx.await.unwrap()
    }

    async fn lookup(e: &Engine, tokens: &[u32]) -> KvLookup {
        let (reply, rx) = oneshot::channel();
        let op = KvOp::Lookup { tokens: tokens.to_vec(), salt: None, lora: None, reply };
        assert!(e.command(Command::Kv(op)));
        rx.await.unwrap()
    }

    #[tokio::test]
    async fn pulled_blocks_are_cached_and_published() {
        let (e, mut events, task) = engine(8);
        let prompt: Vec<u32> = (0..18).collect();
        assert_eq!(lookup(&e, &prompt).await.held, 0);
        assert_eq!(insert(&e, &prompt, 0, 3).await, 3);
        let l = lookup(&e, &prompt).await;
        assert_eq!((l.held, l.hashes.len(), l.block_size), (3, 4, 4));
        let (_, batch) = events.recv().await.unwrap();
        let KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, .. } = &batch[0]
        else {
            panic!("{batch:?}")
        };
        assert_eq!(block_hashes, &l.hashes[..3]);
        assert_eq!(*parent_block_hash, None);
        assert_eq!(token_ids, &prompt[..12]);
        // The next block, pulled on top: its parent is the last one held.
        assert_eq!(insert(&e, &prompt, 3, 1).await, 4);
        let (_, batch) = events.recv().await.unwrap();
        assert!(matches!(&batch[0], KvEvent::BlockStored { parent_block_hash: Some(p), .. }
            if *p == l.hashes[2]));
        // Blocks that would not hang off a cached prefix are not stored.
        let other: Vec<u32> = (100..112).collect();
        assert_eq!(insert(&e, &other, 1, 2).await, 0);
        task.abort();
    }

    #[tokio::test]
    async fn a_full_cache_stores_what_fits_or_nothing() {
        let (e, _events, task) = engine(2);
        let prompt: Vec<u32> = (0..16).collect();
        assert_eq!(insert(&e, &prompt, 0, 4).await, 0, "4 blocks never fit in 2");
        assert_eq!(insert(&e, &prompt, 0, 2).await, 2);
        task.abort();
    }
}
