//! Engine behaviour under tokio's paused clock: durations are the model's, not the machine's.

use std::collections::BTreeSet;

use super::*;

fn config(blocks: usize, batched: usize) -> EngineConfig {
    EngineConfig {
        block_size: 16,
        num_gpu_blocks: blocks,
        max_num_seqs: 64,
        max_num_batched_tokens: batched,
        max_loras: 1,
        policy: SchedulingPolicy::Fcfs,
        timing: Timing {
            step_floor_ms: 5.0,
            prefill_ms_per_token: 0.1,
            prefill_ms_per_token_sq: 0.0,
            decode_ms_per_seq: 0.01,
            kv_ms_per_1k_tokens: 0.0,
            speedup: 1.0,
        },
        output_vocab: Arc::new((100..200).collect()),
    }
}

fn core(cfg: EngineConfig) -> (Core, mpsc::UnboundedReceiver<(f64, Vec<KvEvent>)>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Core::new(cfg, Arc::new(Mutex::new(EngineStats::default())), Some(tx)), rx)
}

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| seed * 100_000 + i).collect()
}

async fn submit(
    core: &mut Core,
    toks: Vec<u32>,
    max_tokens: usize,
) -> mpsc::UnboundedReceiver<TokenEvent> {
    submit_lora(core, toks, max_tokens, None).await
}

async fn submit_lora(
    core: &mut Core,
    toks: Vec<u32>,
    max_tokens: usize,
    lora: Option<&str>,
) -> mpsc::UnboundedReceiver<TokenEvent> {
    let (tx, rx) = mpsc::unbounded_channel();
    core.handle(Command::Submit(Submit {
        tokens: toks,
        salt: None,
        lora: lora.map(str::to_owned),
        max_tokens,
        priority: 0,
        seed: 1,
        stop: Default::default(),
        events: tx,
    }))
    .await;
    rx
}

/// Steps until every request has finished; returns each stream's time to first token.
async fn run(
    core: &mut Core,
    streams: &mut [mpsc::UnboundedReceiver<TokenEvent>],
) -> Vec<Duration> {
    run_collect(core, streams).await.0
}

/// Like `run`, also returning every event each stream received.
async fn run_collect(
    core: &mut Core,
    streams: &mut [mpsc::UnboundedReceiver<TokenEvent>],
) -> (Vec<Duration>, Vec<Vec<TokenEvent>>) {
    let start = Instant::now();
    let mut ttft = vec![None; streams.len()];
    let mut seen = vec![Vec::new(); streams.len()];
    let (_commands, mut rx) = mpsc::unbounded_channel();
    while !core.running.is_empty() || !core.waiting.is_empty() {
        core.step(&mut rx).await;
        core.flush_events();
        for (i, rx) in streams.iter_mut().enumerate() {
            while let Ok(ev) = rx.try_recv() {
                if matches!(ev, TokenEvent::Token { index: 0, .. }) {
                    ttft[i] = Some(start.elapsed());
                }
                seen[i].push(ev);
            }
        }
    }
    (ttft.into_iter().map(|t| t.unwrap_or(Duration::MAX)).collect(), seen)
}

async fn lone_ttft(core: &mut Core, toks: Vec<u32>) -> Duration {
    let mut rx = vec![submit(core, toks, 2).await];
    run(core, &mut rx).await[0]
}

#[tokio::test(start_paused = true)]
async fn ttft_grows_with_uncached_tokens_not_cached_ones() {
    let (mut c, _ev) = core(config(4096, 8192));
    let short = lone_ttft(&mut c, tokens(1, 1000)).await;
    let long = lone_ttft(&mut c, tokens(2, 2000)).await;
    assert!(long > short, "{long:?} <= {short:?}");
    // The same 2000-token prompt again: all but the last block is cached.
    let again = lone_ttft(&mut c, tokens(2, 2000)).await;
    assert!(again < short, "a cached prompt took {again:?}");
    // 2000 cached + 1000 new tokens costs about what 1000 uncached tokens cost.
    let mut extended = tokens(2, 2000);
    extended.extend(tokens(3, 1000));
    let ext = lone_ttft(&mut c, extended).await;
    assert!(ext < long, "{ext:?} >= {long:?}");
    let diff = ext.as_secs_f64() - short.as_secs_f64();
    assert!(diff.abs() < 0.01, "extended {ext:?} vs uncached 1000 {short:?}");
}

#[tokio::test(start_paused = true)]
async fn queueing_delays_the_second_of_two_long_prompts() {
    let (mut c, _ev) = core(config(4096, 2048));
    let mut rx =
        vec![submit(&mut c, tokens(1, 4000), 2).await, submit(&mut c, tokens(2, 4000), 2).await];
    let t = run(&mut c, &mut rx).await;
    assert!(t[1] > t[0], "second {:?} not after first {:?}", t[1], t[0]);
    let alone = lone_ttft(&mut core(config(4096, 2048)).0, tokens(1, 4000)).await;
    assert!(t[1] > alone + Duration::from_millis(100), "{:?} vs alone {alone:?}", t[1]);
}

/// Applies a worker's events from sequence 0: the result is exactly its cache contents.
#[tokio::test(start_paused = true)]
async fn replaying_events_reproduces_the_cache() {
    let (mut c, mut ev) = core(config(96, 512));
    let mut model = BTreeSet::new();
    let mut apply = |ev: &mut mpsc::UnboundedReceiver<(f64, Vec<KvEvent>)>| {
        while let Ok((_, batch)) = ev.try_recv() {
            for e in batch {
                match e {
                    KvEvent::BlockStored { block_hashes, .. } => model.extend(block_hashes),
                    KvEvent::BlockRemoved { block_hashes, .. } => {
                        for h in block_hashes {
                            model.remove(&h);
                        }
                    }
                    KvEvent::AllBlocksCleared => model.clear(),
                }
            }
        }
        model.clone()
    };
    for round in 0..6u32 {
        let mut streams = Vec::new();
        for r in 0..5u32 {
            // Shared prefixes (seed r % 3) plus unique tails force reuse and eviction.
            let mut t = tokens(r % 3, 160);
            t.extend(tokens(10 + round * 10 + r, 100 + 37 * r as usize));
            streams.push(submit(&mut c, t, 20).await);
        }
        run(&mut c, &mut streams).await;
        if round == 3 {
            let (tx, rx) = oneshot::channel();
            c.handle(Command::Evict { fraction: 0.5, reply: tx }).await;
            assert!(rx.await.unwrap() > 0);
        }
        assert_eq!(apply(&mut ev), c.cache.cached_set(), "round {round}");
    }
    let (tx, rx) = oneshot::channel();
    c.handle(Command::Reset { reply: tx }).await;
    assert!(rx.await.unwrap());
    assert!(apply(&mut ev).is_empty() && c.cache.cached_set().is_empty());
}

#[tokio::test(start_paused = true)]
async fn generated_blocks_are_cached_and_a_follow_up_reuses_them() {
    let (mut c, _ev) = core(config(4096, 8192));
    let prompt = tokens(4, 64);
    let mut rx = submit(&mut c, prompt.clone(), 40).await;
    let (_, seen) = run_collect(&mut c, std::slice::from_mut(&mut rx)).await;
    let out: Vec<u32> = seen[0]
        .iter()
        .filter_map(|ev| match ev {
            TokenEvent::Token { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(out.len(), 40);
    // The next turn's prompt is the conversation so far: prompt + generated tokens.
    let mut next = prompt;
    next.extend(&out);
    next.extend(tokens(5, 20));
    let mut rx2 = submit(&mut c, next, 1).await;
    let (_, seen) = run_collect(&mut c, std::slice::from_mut(&mut rx2)).await;
    let cached = seen[0]
        .iter()
        .find_map(|ev| match ev {
            TokenEvent::Done { cached_tokens, .. } => Some(*cached_tokens),
            _ => None,
        })
        .unwrap_or(0);
    // 64 prompt + 39 generated tokens have KV: 6 full blocks.
    assert_eq!(cached, 96);
}

#[tokio::test(start_paused = true)]
async fn a_full_cache_preempts_and_every_request_still_finishes() {
    // 40 blocks; each request needs (200 + 100) / 16 = 19 blocks by its end.
    let (mut c, _ev) = core(config(40, 4096));
    let mut streams = Vec::new();
    for r in 0..4 {
        streams.push(submit(&mut c, tokens(20 + r, 200), 100).await);
    }
    let (_, seen) = run_collect(&mut c, &mut streams).await;
    for (i, evs) in seen.iter().enumerate() {
        let tokens = evs.iter().filter(|e| matches!(e, TokenEvent::Token { .. })).count();
        assert_eq!(tokens, 100, "request {i} got {tokens} tokens");
        assert!(evs.iter().any(|e| matches!(e, TokenEvent::Done { .. })));
    }
    let st = c.stats.lock().unwrap().clone();
    assert!(st.preemptions_total > 0, "no preemption happened");
    assert_eq!(c.cache.used(), 0, "blocks leaked");
    assert_eq!(c.cache.ref_total(), 0);
}

/// Seeded random workloads: `cached_tokens` is the longest cached block-aligned prefix (short
/// of the last token), never more than the prompt, and an idle engine holds no references.
#[tokio::test(start_paused = true)]
async fn random_workloads_keep_the_block_manager_invariants() {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    for seed in 0..8u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut c, _ev) = core(config(rng.random_range(40..200), rng.random_range(64..1024)));
        for _ in 0..12 {
            // One request alone: its reuse must equal what the cache held before it.
            let mut t = tokens(rng.random_range(0..3), rng.random_range(0..120));
            t.extend(tokens(100 + rng.random_range(0..1000), rng.random_range(1..100)));
            let len = t.len();
            let expected =
                c.cache.longest_prefix(&engine_hashes(&t, 16, None, None)).min((len - 1) / 16) * 16;
            let mut rx = vec![submit(&mut c, t, rng.random_range(1..40)).await];
            let (_, seen) = run_collect(&mut c, &mut rx).await;
            let cached = seen[0].iter().find_map(|e| match e {
                TokenEvent::Done { cached_tokens, prompt_tokens, .. } => {
                    Some((*cached_tokens, *prompt_tokens))
                }
                _ => None,
            });
            if let Some((cached, prompt)) = cached {
                assert!(cached <= prompt && cached % 16 == 0);
                assert_eq!(cached, expected, "seed {seed}");
            }
            // Then a concurrent burst, to exercise eviction and preemption.
            let mut burst = Vec::new();
            for _ in 0..rng.random_range(1..6) {
                let t = tokens(rng.random_range(0..5), rng.random_range(1..300));
                burst.push(submit(&mut c, t, rng.random_range(1..60)).await);
            }
            run(&mut c, &mut burst).await;
            assert!(c.cache.cached_set().len() <= c.cache.capacity());
            assert_eq!(c.cache.used(), 0, "seed {seed}: blocks held by an idle engine");
            assert_eq!(c.cache.ref_total(), 0);
        }
    }
}

/// The number of cached tokens each stream's `Done` reported.
fn cached(seen: &[Vec<TokenEvent>]) -> Vec<usize> {
    seen.iter()
        .map(|evs| {
            evs.iter()
                .find_map(|e| match e {
                    TokenEvent::Done { cached_tokens, .. } => Some(*cached_tokens),
                    _ => None,
                })
                .unwrap_or(usize::MAX)
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_adapter_caches_in_its_own_domain_and_its_events_name_it() {
    let (mut c, mut ev) = core(config(4096, 8192));
    let mut rx = vec![submit(&mut c, tokens(1, 320), 1).await];
    run(&mut c, &mut rx).await;
    // The same prompt for an adapter reuses nothing of the base model's blocks...
    let mut rx = vec![submit_lora(&mut c, tokens(1, 320), 1, Some("sql")).await];
    let (_, seen) = run_collect(&mut c, &mut rx).await;
    assert_eq!(cached(&seen), vec![0]);
    // ...nor another adapter's, but its own again.
    let mut rx = vec![
        submit_lora(&mut c, tokens(1, 320), 1, Some("chat")).await,
        submit_lora(&mut c, tokens(1, 320), 1, Some("sql")).await,
        submit(&mut c, tokens(1, 320), 1).await,
    ];
    let (_, seen) = run_collect(&mut c, &mut rx).await;
    assert_eq!(cached(&seen), vec![0, 304, 304]);
    let mut names = BTreeSet::new();
    while let Ok((_, batch)) = ev.try_recv() {
        for e in batch {
            if let KvEvent::BlockStored { lora_name, .. } = e {
                names.insert(lora_name);
            }
        }
    }
    let want: BTreeSet<Option<String>> =
        [None, Some("sql".into()), Some("chat".into())].into_iter().collect();
    assert_eq!(names, want);
}

#[tokio::test(start_paused = true)]
async fn no_more_adapters_run_at_once_than_max_loras() {
    let (mut c, _ev) = core(EngineConfig { max_loras: 1, ..config(4096, 8192) });
    // Two adapters' requests and a base request queued behind them: the second adapter waits
    // for the first to finish, the base request does not.
    let mut rx = vec![
        submit_lora(&mut c, tokens(1, 64), 20, Some("a")).await,
        submit_lora(&mut c, tokens(2, 64), 20, Some("b")).await,
        submit(&mut c, tokens(3, 64), 20).await,
    ];
    let (ttft, _) = run_collect(&mut c, &mut rx).await;
    assert!(ttft[2] < ttft[1], "the base request waited behind a skipped adapter: {ttft:?}");
    assert!(ttft[1] > ttft[0] + Duration::from_millis(50), "adapters ran together: {ttft:?}");
    let (mut c, _ev) = core(EngineConfig { max_loras: 2, ..config(4096, 8192) });
    let mut rx = vec![
        submit_lora(&mut c, tokens(1, 64), 20, Some("a")).await,
        submit_lora(&mut c, tokens(2, 64), 20, Some("b")).await,
    ];
    let ttft = run(&mut c, &mut rx).await;
    assert_eq!(ttft[0], ttft[1], "two adapters within max_loras=2 were not batched together");
}

/// A timing with every term switched on, for the quadratic and what-if tests.
fn full_timing() -> Timing {
    Timing {
        step_floor_ms: 5.0,
        prefill_ms_per_token: 0.05,
        prefill_ms_per_token_sq: 1e-6,
        decode_ms_per_seq: 0.02,
        kv_ms_per_1k_tokens: 0.01,
        speedup: 1.0,
    }
}

/// The prefill part of a step's time: what it costs beyond the floor.
fn prefill_cost(t: &Timing, chunks: &[Chunk]) -> f64 {
    t.step_ms(chunks, 0, 0) - t.step_floor_ms
}

#[test]
fn a_prompt_costs_the_same_however_it_is_chunked() {
    let t = full_timing();
    let n = 12_000;
    let whole = prefill_cost(&t, &[Chunk { cached: 0, new: n }]);
    let sq = t.prefill_ms_per_token_sq * (n * n) as f64;
    assert!((whole - (t.prefill_ms_per_token * n as f64 + sq)).abs() < 1e-9);
    for size in [1, 7, 512, 2048, 5000, 8192] {
        let mut done = 0;
        let mut sum = 0.0;
        while done < n {
            let new = size.min(n - done);
            sum += prefill_cost(&t, &[Chunk { cached: done, new }]);
            done += new;
        }
        assert!((sum - whole).abs() < 1e-6 * whole, "chunks of {size}: {sum} vs {whole}");
    }
}

#[test]
fn new_tokens_pay_attention_over_a_cached_prefix() {
    let t = full_timing();
    let alone = prefill_cost(&t, &[Chunk { cached: 0, new: 4096 }]);
    let on_prefix = prefill_cost(&t, &[Chunk { cached: 12_288, new: 4096 }]);
    assert!(on_prefix > alone, "{on_prefix} <= {alone}");
    // Exactly the attention of 4k new tokens over 12k cached ones more.
    let extra =
        t.prefill_ms_per_token_sq * (16_384f64.powi(2) - 12_288f64.powi(2) - 4096f64.powi(2));
    assert!((on_prefix - alone - extra).abs() < 1e-9);
}

#[test]
fn two_sequences_in_a_step_cost_the_sum_of_their_own_terms() {
    let t = full_timing();
    let a = Chunk { cached: 0, new: 3000 };
    let b = Chunk { cached: 1000, new: 2000 };
    let both = prefill_cost(&t, &[a, b]);
    let sum = prefill_cost(&t, &[a]) + prefill_cost(&t, &[b]);
    assert!((both - sum).abs() < 1e-9, "{both} vs {sum}");
    let square_of_sum = prefill_cost(&t, &[Chunk { cached: 0, new: 5000 }]);
    assert!(both < square_of_sum);
}

fn engine(cfg: EngineConfig) -> Engine {
    Engine::start(cfg, None).0
}

fn ttft_ms(a: &WhatIfAnswer) -> f64 {
    match a {
        WhatIfAnswer::Ttft { ttft_ms, .. } => *ttft_ms,
        other => panic!("no TTFT: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_idle_engine_answers_the_modelled_prefill() {
    let cfg = EngineConfig { timing: full_timing(), ..config(4096, 8192) };
    let t = cfg.timing;
    let e = engine(cfg);
    let a = e.what_if(tokens(1, 1000), None, None, 5, 0).await.unwrap();
    let want = t.step_ms(&[Chunk { cached: 0, new: 1000 }], 0, 0);
    assert_eq!(
        a,
        WhatIfAnswer::Ttft {
            ttft_ms: want,
            cached_tokens: 0,
            prompt_tokens: 1000,
            running: 0,
            waiting: 0
        }
    );
    // Nothing ran: no stats moved.
    let st = e.stats.lock().unwrap().clone();
    assert_eq!((st.steps, st.prefix_queries_tokens, st.prompt_tokens_total), (0, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_cached_prefix_lowers_the_answer() {
    let cfg = EngineConfig { timing: full_timing(), ..config(4096, 8192) };
    let e = engine(cfg);
    let prompt = tokens(2, 3000);
    let before = e.what_if(prompt.clone(), None, None, 1, 0).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    e.submit(Submit {
        tokens: prompt.clone(),
        salt: None,
        lora: None,
        max_tokens: 1,
        priority: 0,
        seed: 1,
        stop: Default::default(),
        events: tx,
    });
    while rx.recv().await.is_some() {}
    // Past the end of the last step, so no part of a step is left to wait for.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let after = e.what_if(prompt.clone(), None, None, 1, 0).await.unwrap();
    assert!(ttft_ms(&after) < ttft_ms(&before), "{after:?} vs {before:?}");
    assert!(matches!(after, WhatIfAnswer::Ttft { cached_tokens: 2992, .. }), "{after:?}");
    // Another tenant's salt reuses nothing.
    let salted = e.what_if(prompt, Some("t".into()), None, 1, 0).await.unwrap();
    assert_eq!(ttft_ms(&salted), ttft_ms(&before));
}

#[tokio::test(start_paused = true)]
async fn a_request_too_big_for_the_cache_is_rejected_by_the_what_if_too() {
    let e = engine(config(10, 512));
    let a = e.what_if(tokens(1, 400), None, None, 1, 0).await.unwrap();
    assert_eq!(a, WhatIfAnswer::Rejected { needed_blocks: 26 });
}

/// Differential test: from seeded random engine states (running and waiting requests of random
/// lengths, shared prefixes, adapters, a cache small enough to evict and preempt), the what-if
/// answer equals the TTFT the real engine then gives the same request submitted at the same
/// instant, within one timer tick, and the cached tokens are the ones it reports.
#[tokio::test(start_paused = true)]
async fn the_what_if_predicts_the_real_ttft() {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let (mut preempting, mut queued) = (0, 0);
    for seed in 0..40u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let cfg = EngineConfig {
            timing: full_timing(),
            max_num_seqs: rng.random_range(2..16),
            max_loras: rng.random_range(1..3),
            ..config(rng.random_range(50..250), rng.random_range(64..2048))
        };
        let e = engine(cfg);
        let prompt = |rng: &mut StdRng| {
            let mut t = tokens(rng.random_range(0..3), rng.random_range(0..300));
            t.extend(tokens(10 + rng.random_range(0..40_000), rng.random_range(1..400)));
            t
        };
        let lora = |rng: &mut StdRng| match rng.random_range(0..4) {
            0 => Some("a".to_owned()),
            1 => Some("b".to_owned()),
            _ => None,
        };
        let mut streams = Vec::new();
        for _ in 0..rng.random_range(0..12) {
            let (tx, rx) = mpsc::unbounded_channel();
            let s = Submit {
                tokens: prompt(&mut rng),
                salt: None,
                lora: lora(&mut rng),
                max_tokens: rng.random_range(1..200),
                priority: 0,
                seed: rng.random(),
                stop: Default::default(),
                events: tx,
            };
            e.submit(s);
            streams.push(rx);
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
        let (toks, l, max_tokens) = (prompt(&mut rng), lora(&mut rng), rng.random_range(1..30));
        let t0 = Instant::now();
        let (reply, answer) = oneshot::channel();
        let q = WhatIf {
            tokens: toks.clone(),
            salt: None,
            lora: l.clone(),
            max_tokens,
            priority: 0,
            asked: t0,
            reply,
        };
        assert!(e.command(Command::WhatIf(q)));
        let (tx, mut rx) = mpsc::unbounded_channel();
        e.submit(Submit {
            tokens: toks,
            salt: None,
            lora: l,
            max_tokens,
            priority: 0,
            seed: 7,
            stop: Default::default(),
            events: tx,
        });
        let mut real = None;
        let mut cached = None;
        while let Some(ev) = rx.recv().await {
            match ev {
                TokenEvent::Token { index: 0, .. } => real = Some(t0.elapsed()),
                TokenEvent::Done { cached_tokens, .. } => cached = Some(cached_tokens),
                _ => {}
            }
        }
        let answer = answer.await.unwrap();
        let real = real.expect("no first token").as_secs_f64() * 1000.0;
        let WhatIfAnswer::Ttft { ttft_ms, cached_tokens, running, waiting, .. } = answer else {
            panic!("seed {seed}: {answer:?}");
        };
        let tick = TIMER_TICK.as_secs_f64() * 1000.0;
        assert!(
            (ttft_ms - real).abs() <= tick + 1e-6,
            "seed {seed}: what-if {ttft_ms} ms, real {real} ms ({running} running, {waiting} waiting)"
        );
        assert_eq!(Some(cached_tokens), cached, "seed {seed}");
        if e.stats.lock().unwrap().preemptions_total > 0 {
            preempting += 1;
        }
        queued += usize::from(waiting > 0);
        drop(streams);
    }
    assert!(preempting > 0 && queued > 0, "{preempting} preempting, {queued} queued");
}

/// vLLM caches a scheduled chunk's full blocks when it allocates them, before the forward pass:
/// a request with the same prefix scheduled in the same step, or while the first is still in
/// prefill, reuses the blocks in flight instead of computing them again.
#[tokio::test(start_paused = true)]
async fn a_prefix_in_flight_is_shared_not_recomputed() {
    // Budget for both in one step: the second is admitted in the first's step.
    let (mut c, _ev) = core(config(4096, 8192));
    let shared = tokens(6, 1600);
    let mut second = shared.clone();
    second.extend(tokens(7, 32));
    let mut rx = vec![submit(&mut c, shared.clone(), 2).await, submit(&mut c, second, 2).await];
    let (_, seen) = run_collect(&mut c, &mut rx).await;
    assert_eq!(cached(&seen), vec![0, 1600]);
    // Chunked: the first takes several steps; the second, queued behind it, shares all of it.
    let (mut c, _ev) = core(config(4096, 512));
    let mut third = tokens(8, 1600);
    let mut rx = vec![submit(&mut c, third.clone(), 2).await];
    third.extend(tokens(9, 32));
    rx.push(submit(&mut c, third, 2).await);
    let (_, seen) = run_collect(&mut c, &mut rx).await;
    assert_eq!(cached(&seen), vec![0, 1600]);
}

/// A holder answers a peer's pull lookup while it is busy with a step (serving a pull reads
/// its cache, never waits for its GPU); other commands wait for the step's end.
#[tokio::test(start_paused = true)]
async fn a_pull_lookup_is_answered_during_a_step() {
    let (mut core, _events) = core(config(4096, 8192));
    let prompt = tokens(1, 64);
    let mut first = [submit(&mut core, prompt.clone(), 1).await];
    run(&mut core, &mut first).await;
    let hashes = crate::cache::engine_hashes(&prompt, 16, None, None);
    // A long prefill: one step of 8000 tokens at 0.1 ms each.
    let _busy = submit(&mut core, tokens(2, 8000), 1).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (reply, answer) = tokio::sync::oneshot::channel();
    tx.send(Command::Kv(KvOp::Held { hashes: hashes.clone(), reply })).unwrap();
    tx.send(Command::Stall(Duration::from_millis(1))).unwrap();
    let started = Instant::now();
    {
        let step = core.step(&mut rx);
        tokio::pin!(step);
        tokio::select! {
            biased;
            held = answer => {
                assert_eq!(held.unwrap(), hashes.len());
                assert_eq!(Instant::now(), started, "the clock moved: the step ended first");
            }
            () = &mut step => panic!("the lookup waited for the step"),
        }
        step.await;
    }
    assert_eq!(core.deferred.len(), 1, "the stall waits for the step's end");
}
