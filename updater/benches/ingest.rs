//! Updater ingest rate on one core: msgpack batches of `BlockStored` events (vLLM's array
//! form, as the simulator publishes them) decoded, re-hashed canonically and applied.
//! Run: `cargo bench -p kvroute-updater --bench ingest`.

use std::time::Instant;

use kvroute_sim::events::{encode_batch, EventEncoding, KvEvent};
use kvroute_updater::decode::decode_batch;
use kvroute_updater::ingest::{DomainBase, WorkerKnowledge};

fn main() {
    let bs = 16usize;
    let domain = DomainBase {
        model: "kvroute-demo".into(),
        tokenizer_fingerprint: 1,
        block_size: bs as u32,
        lora_name: None,
    };
    // 2000 batches x 32 events x 4 blocks: chains of 4-block extensions, like decode steps.
    let mut payloads = Vec::new();
    let mut next_hash = 1u64;
    for b in 0..2000u64 {
        let events: Vec<KvEvent> = (0..32u64)
            .map(|e| {
                let parent = (e > 0).then(|| next_hash - 1);
                let hashes: Vec<u64> = (0..4)
                    .map(|_| {
                        next_hash += 1;
                        next_hash - 1
                    })
                    .collect();
                KvEvent::BlockStored {
                    block_hashes: hashes,
                    parent_block_hash: parent,
                    token_ids: (0..4 * bs as u32).map(|t| t + (b * 32 + e) as u32).collect(),
                    block_size: bs,
                    medium: "GPU",
                    lora_name: None,
                    salt: None,
                }
            })
            .collect();
        payloads.push(encode_batch(1.0, &events, Some(0), EventEncoding::Array));
    }
    let blocks = 2000 * 32 * 4;
    let mut w = WorkerKnowledge::default();
    let t = Instant::now();
    for (seq, p) in payloads.iter().enumerate() {
        let batch = decode_batch(p).expect("decode");
        w.apply(seq as u64, &batch, &domain, 0);
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(w.stats.orphans, 0);
    println!(
        "updater ingest: {blocks} stored blocks ({} batches, {:.1} MiB msgpack) in {:.3} s = {:.2} M block events/s on one core",
        payloads.len(),
        payloads.iter().map(Vec::len).sum::<usize>() as f64 / 1048576.0,
        secs,
        blocks as f64 / secs / 1e6
    );
}
