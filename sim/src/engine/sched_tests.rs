//! The two policies under tokio's paused clock: queue order and the preemption victim.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::engine::*;

fn config(blocks: usize, max_num_seqs: usize, policy: SchedulingPolicy) -> EngineConfig {
    EngineConfig {
        block_size: 16,
        num_gpu_blocks: blocks,
        max_num_seqs,
        max_num_batched_tokens: 8192,
        max_loras: 1,
        policy,
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

fn core(cfg: EngineConfig) -> Core {
    Core::new(cfg, Arc::new(Mutex::new(EngineStats::default())), None)
}

async fn submit(
    core: &mut Core,
    seed: u32,
    max_tokens: usize,
    priority: i64,
) -> mpsc::UnboundedReceiver<TokenEvent> {
    let (tx, rx) = mpsc::unbounded_channel();
    let tokens = (0..64u32).map(|i| seed * 100_000 + i).collect();
    core.handle(Command::Submit(Submit {
        tokens,
        salt: None,
        lora: None,
        max_tokens,
        priority,
        seed: 1,
        stop: Default::default(),
        events: tx,
    }))
    .await;
    rx
}

/// Steps until all are done; the order in which the streams got their first token, and the
/// priorities of the requests preempted (each time one is).
async fn run(
    core: &mut Core,
    streams: &mut [mpsc::UnboundedReceiver<TokenEvent>],
) -> (Vec<usize>, Vec<i64>) {
    let mut first = Vec::new();
    let mut preempted = Vec::new();
    let mut seen = 0u64;
    let (_commands, mut rx) = mpsc::unbounded_channel();
    for _ in 0..100_000 {
        if core.running.is_empty() && core.waiting.is_empty() {
            break;
        }
        core.step(&mut rx).await;
        let total = core.stats.lock().unwrap().preemptions_total;
        if total > seen {
            // Preempted this step: back in the queue (with any still waiting from before).
            preempted.extend(core.waiting.iter().filter(|s| s.preemptions > 0).map(|s| s.priority));
            seen = total;
        }
        for (i, rx) in streams.iter_mut().enumerate() {
            while let Ok(ev) = rx.try_recv() {
                if matches!(ev, TokenEvent::Token { index: 0, .. }) {
                    first.push(i);
                }
            }
        }
    }
    (first, preempted)
}

#[tokio::test(start_paused = true)]
async fn priority_orders_the_queue_by_value_then_arrival_and_fcfs_by_arrival() {
    let priorities = [5, 5, 0, -1, 5, 0];
    for (policy, want) in [
        (SchedulingPolicy::Fcfs, vec![0, 1, 2, 3, 4, 5]),
        (SchedulingPolicy::Priority, vec![3, 2, 5, 0, 1, 4]),
    ] {
        // One request at a time: the order of first tokens is the queue's.
        let mut c = core(config(4096, 1, policy));
        let mut rx = Vec::new();
        for (i, &p) in priorities.iter().enumerate() {
            let p = if policy == SchedulingPolicy::Fcfs { 0 } else { p };
            rx.push(submit(&mut c, i as u32 + 1, 2, p).await);
        }
        let (first, preempted) = run(&mut c, &mut rx).await;
        assert_eq!(first, want, "{policy:?}");
        assert!(preempted.is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn kv_pressure_preempts_the_least_urgent_in_priority_mode_and_the_latest_in_fcfs() {
    // Two 64-token prompts decoding up to 200 tokens each (17 blocks each) in 24 blocks: one
    // of them must be preempted. The urgent one (0) arrives second, so it is admitted last.
    for (policy, want) in [(SchedulingPolicy::Fcfs, 0), (SchedulingPolicy::Priority, 10)] {
        let mut c = core(config(24, 8, policy));
        let mut rx = vec![submit(&mut c, 1, 200, 10).await, submit(&mut c, 2, 200, 0).await];
        let (first, preempted) = run(&mut c, &mut rx).await;
        assert_eq!(first.len(), 2, "{policy:?}");
        assert!(!preempted.is_empty(), "{policy:?}: nobody preempted");
        assert!(preempted.iter().all(|&p| p == want), "{policy:?}: preempted {preempted:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_later_urgent_request_overtakes_the_queue_but_not_the_running_batch() {
    let mut c = core(config(4096, 1, SchedulingPolicy::Priority));
    let mut rx = vec![submit(&mut c, 1, 20, 5).await];
    // The first one runs; then a queue of three, the most urgent last.
    let (_commands, mut commands) = mpsc::unbounded_channel();
    c.step(&mut commands).await;
    rx.push(submit(&mut c, 2, 2, 5).await);
    rx.push(submit(&mut c, 3, 2, 5).await);
    rx.push(submit(&mut c, 4, 2, -3).await);
    let (first, preempted) = run(&mut c, &mut rx).await;
    assert_eq!(first, vec![0, 3, 1, 2]);
    assert!(preempted.is_empty(), "nobody is preempted for a waiting request: {preempted:?}");
}
