//! The scheduling policy (vLLM's `--scheduling-policy`): the order of the waiting queue and
//! which running request a full KV cache preempts. As vLLM's v1 scheduler:
//!
//! - `fcfs`: the queue is in arrival order; a preempted request goes back to its front; the
//!   victim is the most recently admitted running request (the tail of the running list).
//! - `priority`: the queue is ordered by (`priority`, arrival), lower values first (a heap in
//!   vLLM; a preempted request rejoins it at its own place, not at the front); the victim is
//!   the running request with the largest (`priority`, arrival): the least urgent, and among
//!   equals the latest. It may be one already given tokens in this step (they are given back)
//!   or the request being scheduled itself (then no other running request is scheduled in
//!   this step).
//!
//! Neither policy preempts a running request for a more urgent waiting one: only KV pressure
//! preempts (vLLM v1; SGLang's priority mode does, past a threshold).

use std::collections::VecDeque;

use super::Seq;

/// How the engine orders its waiting queue and picks whom to preempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SchedulingPolicy {
    /// First come, first served (vLLM's default); a request's `priority` must be 0.
    #[default]
    Fcfs,
    /// Lower `priority` values first, then arrival.
    Priority,
}

impl SchedulingPolicy {
    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            SchedulingPolicy::Fcfs => "fcfs",
            SchedulingPolicy::Priority => "priority",
        }
    }
}

/// The order of a sequence in priority mode.
fn key(s: &Seq) -> (i64, tokio::time::Instant, u64) {
    (s.priority, s.arrived, s.order)
}

/// A new request joins the waiting queue.
pub(super) fn enqueue(policy: SchedulingPolicy, waiting: &mut VecDeque<Seq>, seq: Seq) {
    match policy {
        SchedulingPolicy::Fcfs => waiting.push_back(seq),
        SchedulingPolicy::Priority => {
            let k = key(&seq);
            let at = waiting.partition_point(|s| key(s) <= k);
            waiting.insert(at, seq);
        }
    }
}

/// Requests preempted in one step (in running order) go back to the waiting queue.
pub(super) fn requeue(policy: SchedulingPolicy, waiting: &mut VecDeque<Seq>, back: Vec<Seq>) {
    match policy {
        SchedulingPolicy::Fcfs => {
            for seq in back.into_iter().rev() {
                waiting.push_front(seq);
            }
        }
        SchedulingPolicy::Priority => {
            for seq in back {
                enqueue(policy, waiting, seq);
            }
        }
    }
}

/// The running sequence to preempt so that `running[i]` gets its blocks (`i` itself when
/// nobody else may go); `preempted` marks those gone already this step.
pub(super) fn victim(
    policy: SchedulingPolicy,
    running: &[Seq],
    preempted: &[bool],
    i: usize,
) -> usize {
    let mut candidates = (0..running.len()).filter(|&v| !preempted[v]);
    match policy {
        SchedulingPolicy::Fcfs => candidates.next_back(),
        SchedulingPolicy::Priority => candidates.max_by_key(|&v| key(&running[v])),
    }
    .unwrap_or(i)
}

#[cfg(test)]
#[path = "sched_tests.rs"]
mod tests;
