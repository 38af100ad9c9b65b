use super::*;
use kvroute_core::decision::hash::block_hashes;

fn domain() -> DomainBase {
    DomainBase { model: "m".into(), tokenizer_fingerprint: 1, block_size: 4, lora_name: None }
}

fn st(hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>, page: usize) -> Stored {
    Stored {
        hashes,
        parent,
        token_ids: tokens,
        block_size: page,
        place: Place::Gpu,
        lora_name: None,
        salt: None,
        group: None,
        kind: None,
        lookahead: false,
        pairs: false,
    }
}

fn batch(events: Vec<EngineEvent>) -> Batch {
    Batch { ts: 0.0, rank: None, events }
}

fn stored(hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>, salt: Option<&str>) -> Batch {
    let mut s = st(hashes, parent, tokens, 4);
    s.salt = salt.map(str::to_owned);
    batch(vec![EngineEvent::stored(s)])
}

fn removed(hashes: Vec<u64>, place: Place, group: Option<u32>) -> EngineEvent {
    EngineEvent::Removed { hashes, place, group }
}

/// kvroute's canonical blocks of `tokens` (salt-free chain from the start), computed with the
/// router's own hashing.
fn want(tokens: &[u32]) -> Vec<u64> {
    let d = domain();
    block_hashes(d.seed(None, None), d.block_size, tokens)
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

#[test]
fn canonical_hashes_equal_the_routers_whatever_the_engine_hashes() {
    let d = domain();
    let tokens: Vec<u32> = (0..12).collect();
    let mut w = WorkerKnowledge::default();
    // The engine publishes the chain in two events with its own (arbitrary) hashes.
    w.apply(0, &stored(vec![900, 901], None, tokens[..8].to_vec(), Some("t")), &d, 1);
    w.apply(1, &stored(vec![902], Some(901), tokens[8..].to_vec(), None), &d, 2);
    let want = block_hashes(d.seed(Some("t"), None), 4, &tokens);
    assert_eq!(w.blocks(Tier::Gpu), sorted(want.clone()));
    // Removal by engine hash.
    w.apply(2, &batch(vec![removed(vec![902], Place::Gpu, None)]), &d, 3);
    assert_eq!(w.blocks(Tier::Gpu).len(), 2);
    assert!(!w.blocks(Tier::Gpu).contains(&want[2]));
}

#[test]
fn orphans_and_mismatches_are_counted_not_indexed() {
    let d = domain();
    let mut w = WorkerKnowledge::default();
    w.apply(0, &stored(vec![5], Some(77), vec![1, 2, 3, 4], None), &d, 1);
    assert_eq!(w.stats.orphans, 1);
    // A page of 6 tokens neither divides kvroute's 4 nor is a multiple of it.
    let b = batch(vec![EngineEvent::stored(st(vec![6], None, (1..=6).collect(), 6))]);
    w.apply(1, &b, &d, 2);
    assert_eq!(w.stats.block_size_mismatches, 1);
    assert!(w.blocks(Tier::Gpu).is_empty());
}

#[test]
fn sequence_checks() {
    let mut w = WorkerKnowledge::default();
    assert_eq!(w.check(0), SeqCheck::InOrder);
    assert_eq!(w.check(5), SeqCheck::Gap { from: 0, to: 5 });
    w.next_seq = Some(6);
    assert_eq!(w.check(6), SeqCheck::InOrder);
    assert_eq!(w.check(9), SeqCheck::Gap { from: 6, to: 9 });
    assert_eq!(w.check(0), SeqCheck::Restart);
    assert_eq!(w.check(3), SeqCheck::Restart);
}

/// vLLM: duplicate blocks of one prefix are stored under one hash; each eviction removes one.
#[test]
fn a_block_stored_twice_survives_one_removal() {
    let d = domain();
    let mut w = WorkerKnowledge::default();
    w.apply(0, &stored(vec![1], None, vec![1, 2, 3, 4], None), &d, 1);
    w.apply(1, &stored(vec![1], None, vec![1, 2, 3, 4], None), &d, 2);
    w.apply(2, &batch(vec![removed(vec![1], Place::Gpu, Some(0))]), &d, 3);
    assert_eq!(w.blocks(Tier::Gpu), want(&[1, 2, 3, 4]));
    w.apply(3, &batch(vec![removed(vec![1], Place::Gpu, None)]), &d, 4);
    assert!(w.blocks(Tier::Gpu).is_empty());
    assert_eq!(w.stats.unknown_removals, 0);
}

/// vLLM's OffloadingConnector (default) announces CPU copies with only the engine hash.
#[test]
fn offloading_placeholders_take_the_known_blocks_to_the_cpu_tier() {
    let d = domain();
    let tokens: Vec<u32> = (10..18).collect();
    let mut w = WorkerKnowledge::default();
    w.apply(0, &stored(vec![41, 42], None, tokens.clone(), None), &d, 1);
    let mut placeholder = st(vec![42, 99], None, vec![], 0);
    placeholder.place = Place::Cpu;
    placeholder.group = Some(0);
    w.apply(1, &batch(vec![EngineEvent::stored(placeholder)]), &d, 2);
    let blocks = want(&tokens);
    assert_eq!(w.blocks(Tier::Cpu), vec![blocks[1]]);
    assert_eq!((w.stats.offload_stores_matched, w.stats.offload_stores_unmatched), (1, 1));
    assert_eq!(w.stats.block_size_mismatches, 0, "the worker stays compatible");
    // The GPU copy is evicted: the CPU copy stays, and a child can still chain from it.
    w.apply(2, &batch(vec![removed(vec![42], Place::Gpu, Some(0))]), &d, 3);
    assert_eq!(w.blocks(Tier::Cpu), vec![blocks[1]]);
    w.apply(3, &stored(vec![43], Some(42), vec![7, 7, 7, 7], None), &d, 4);
    let mut all = tokens.clone();
    all.extend([7, 7, 7, 7]);
    assert!(w.blocks(Tier::Gpu).contains(&want(&all)[2]));
    w.apply(4, &batch(vec![removed(vec![42], Place::Cpu, Some(0))]), &d, 5);
    assert!(w.blocks(Tier::Cpu).is_empty());
}

#[test]
fn a_reset_clears_the_gpu_tier_only_unless_the_host_tier_is_sglangs() {
    let d = domain();
    let tokens: Vec<u32> = (0..4).collect();
    for (host, kept) in [(Place::Cpu, true), (Place::HostPinned, false)] {
        let mut w = WorkerKnowledge::default();
        let gpu = st(vec![1], None, tokens.clone(), 4);
        let mut cpu = gpu.clone();
        cpu.place = host;
        let events = vec![EngineEvent::stored(gpu), EngineEvent::stored(cpu)];
        w.apply(0, &batch(events), &d, 1);
        w.apply(1, &batch(vec![EngineEvent::AllCleared { place: None }]), &d, 2);
        assert!(w.blocks(Tier::Gpu).is_empty());
        assert_eq!(!w.blocks(Tier::Cpu).is_empty(), kept, "{host:?}");
    }
    // A reset naming a medium clears that tier.
    let mut w = WorkerKnowledge::default();
    let mut cpu = st(vec![1], None, tokens.clone(), 4);
    cpu.place = Place::Cpu;
    w.apply(0, &batch(vec![EngineEvent::stored(cpu)]), &d, 1);
    w.apply(1, &batch(vec![EngineEvent::AllCleared { place: Some(Place::Cpu) }]), &d, 2);
    assert!(w.is_empty());
}

/// Hybrid models: the same hashes in a full-attention and a sliding-window group.
#[test]
fn only_full_attention_groups_give_credit() {
    let d = domain();
    let tokens: Vec<u32> = (0..8).collect();
    let in_group = |g: u32, kind: &str| {
        let mut s = st(vec![1, 2], None, tokens.clone(), 4);
        (s.group, s.kind) = (Some(g), Some(kind.to_owned()));
        EngineEvent::stored(s)
    };
    let mut w = WorkerKnowledge::default();
    w.apply(0, &batch(vec![in_group(0, "full_attention"), in_group(1, "sliding_window")]), &d, 1);
    assert_eq!(w.blocks(Tier::Gpu), sorted(want(&tokens)));
    assert_eq!(w.stats.no_credit_group_stores, 1);
    // The sliding-window group evicts its copies: the full-attention group still holds them.
    w.apply(1, &batch(vec![removed(vec![1, 2], Place::Gpu, Some(1))]), &d, 2);
    assert_eq!(w.blocks(Tier::Gpu), sorted(want(&tokens)));
    w.apply(2, &batch(vec![removed(vec![2], Place::Gpu, Some(0))]), &d, 3);
    assert_eq!(w.blocks(Tier::Gpu), vec![want(&tokens)[0]]);
    // A sliding-window-only model gives no credit at all.
    let mut w = WorkerKnowledge::default();
    w.apply(0, &batch(vec![in_group(0, "sliding_window")]), &d, 1);
    assert!(w.is_empty());
    // A group first seen without its kind (an offloading placeholder's removal, an older
    // release) is credited until a store names a kind that gives none.
    let mut w = WorkerKnowledge::default();
    let mut unnamed = st(vec![1, 2], None, tokens.clone(), 4);
    unnamed.group = Some(3);
    w.apply(0, &batch(vec![EngineEvent::stored(unnamed)]), &d, 1);
    assert_eq!(w.blocks(Tier::Gpu).len(), 2);
    w.apply(1, &batch(vec![in_group(3, "mamba")]), &d, 2);
    assert!(w.is_empty());
    assert_eq!(w.group_kinds().get(&3).map(String::as_str), Some("mamba"));
}

/// SGLang's default page size 1 (a node's pages coalesced into one event), with kvroute's
/// blocks of 4: the pages are re-chunked along the parent chain.
#[test]
fn small_pages_are_rechunked_along_the_chain() {
    let d = domain();
    let tokens: Vec<u32> = (100..114).collect();
    let mut w = WorkerKnowledge::default();
    // A node of 6 tokens, then a child of 8 (one hash per token).
    let node = st((0..6).collect(), None, tokens[..6].to_vec(), 1);
    let child = st((6..14).collect(), Some(5), tokens[6..].to_vec(), 1);
    w.apply(0, &batch(vec![EngineEvent::stored(node)]), &d, 1);
    assert_eq!(w.blocks(Tier::Gpu), vec![want(&tokens)[0]]);
    w.apply(1, &batch(vec![EngineEvent::stored(child)]), &d, 2);
    let all = want(&tokens);
    assert_eq!(all.len(), 3);
    assert_eq!(w.blocks(Tier::Gpu), sorted(all.clone()));
    assert_eq!(w.stats.rechunked_stores, 2);
    assert_eq!(w.stats.block_size_mismatches, 0);
    // A sibling branch diverging inside the first block (after token 2) has its own blocks.
    let mut branch = tokens[..3].to_vec();
    branch.extend([7, 7, 7, 7, 7]);
    let sibling = st((20..25).collect(), Some(2), branch[3..].to_vec(), 1);
    w.apply(2, &batch(vec![EngineEvent::stored(sibling)]), &d, 3);
    for b in want(&branch) {
        assert!(w.blocks(Tier::Gpu).contains(&b));
    }
    // Leaf-first eviction: removing the last pages takes the blocks they completed.
    w.apply(3, &batch(vec![removed((10..14).collect(), Place::Gpu, None)]), &d, 4);
    assert!(!w.blocks(Tier::Gpu).contains(&all[2]));
    assert!(w.blocks(Tier::Gpu).contains(&all[1]));
}

/// Pages larger than kvroute's blocks (SGLang page 64 with kvroute's 16; here 8 and 4).
#[test]
fn large_pages_credit_each_block_they_hold() {
    let d = domain();
    let tokens: Vec<u32> = (0..16).collect();
    let mut w = WorkerKnowledge::default();
    w.apply(
        0,
        &batch(vec![EngineEvent::stored(st(vec![1], None, tokens[..8].to_vec(), 8))]),
        &d,
        1,
    );
    w.apply(
        1,
        &batch(vec![EngineEvent::stored(st(vec![2], Some(1), tokens[8..].to_vec(), 8))]),
        &d,
        2,
    );
    assert_eq!(w.blocks(Tier::Gpu), sorted(want(&tokens)));
    w.apply(2, &batch(vec![removed(vec![2], Place::Gpu, None)]), &d, 3);
    assert_eq!(w.blocks(Tier::Gpu), sorted(want(&tokens[..8])));
}

#[test]
fn a_batch_of_refused_events_does_not_move_the_last_event_time() {
    let d = domain();
    let mut w = WorkerKnowledge::default();
    w.apply(0, &stored(vec![1], None, vec![1, 2, 3, 4], None), &d, 10);
    let orphan = stored(vec![2], Some(777), vec![1, 2, 3, 4], None);
    w.apply(1, &orphan, &d, 20);
    let bad = batch(vec![EngineEvent::Bad(crate::decode::DecodeError::Field("token_ids"))]);
    w.apply(2, &bad, &d, 30);
    assert_eq!(w.stats.last_event_ms, 10);
    assert_eq!((w.stats.refused_batches, w.stats.bad_events), (2, 1));
    // One good event among bad ones is a live stream.
    let mut mixed = bad.clone();
    mixed.events.push(removed(vec![1], Place::Gpu, None));
    w.apply(3, &mixed, &d, 40);
    assert_eq!(w.stats.last_event_ms, 40);
    assert!(w.is_empty(), "the removal in a batch with a bad event applied");
}

#[test]
fn remote_and_unknown_media_are_not_the_workers_own() {
    let d = domain();
    let mut w = WorkerKnowledge::default();
    for place in [Place::Remote, Place::Unknown] {
        let mut s = st(vec![1], None, vec![1, 2, 3, 4], 4);
        s.place = place;
        w.apply(0, &batch(vec![EngineEvent::stored(s), removed(vec![1], place, None)]), &d, 1);
    }
    assert!(w.is_empty());
    assert_eq!((w.stats.remote_events, w.stats.unknown_medium_events), (2, 2));
}

/// EAGLE: engine hashes cover a lookahead token, so one block has one engine hash per next
/// token; all name the block's canonical hash, held while any is.
#[test]
fn lookahead_variants_name_one_block() {
    let d = domain();
    let mut w = WorkerKnowledge::default();
    let variant = |k: u64| {
        let mut s = st(vec![k], None, vec![1, 2, 3, 4], 4);
        s.lookahead = true;
        EngineEvent::stored(s)
    };
    w.apply(0, &batch(vec![variant(1), variant(2)]), &d, 1);
    assert_eq!(w.blocks(Tier::Gpu), want(&[1, 2, 3, 4]));
    w.apply(1, &batch(vec![removed(vec![1], Place::Gpu, None)]), &d, 2);
    assert_eq!(w.blocks(Tier::Gpu), want(&[1, 2, 3, 4]));
    assert_eq!(w.stats.lookahead_stores, 2);
}
