//! Router-tracked load of one worker, as a decision sees it: summed over every Envoy thread's
//! in-flight requests by the load shards in shared data.

pub use crate::decision::worker::worker_key;
use crate::decision::worker::WorkerName;

/// Where a decision reads each worker's router-tracked load. A closure over the name serves
/// (it reads the name's bytes); the filter's load view reads [`WorkerName::key`] only.
pub trait LoadSource {
    fn load(&self, worker: &WorkerName) -> WorkerLoad;

    /// How many requests still tracked on `worker` were sent from `from_ms` to `to_ms`
    /// (inclusive), over every thread (0 where the source keeps no start times).
    fn started_within(&self, _worker: &WorkerName, _from_ms: u64, _to_ms: u64) -> usize {
        0
    }

    /// The engine priority of the request this load is read for (0: none; see
    /// `shared::load::AtPriority`).
    fn priority(&self) -> i32 {
        0
    }

    /// Whether [`LoadSource::behind`] may find anything for this decision's request (asked once
    /// per decision; `false` where the source knows no priorities).
    fn defers(&self) -> bool {
        false
    }

    /// The part of `worker`'s load that this decision's request does not wait for: queued
    /// requests of a less urgent engine priority the engine has not started (see
    /// `shared::load::LoadView::behind`). `step_budget`: the prompt tokens the engine starts
    /// per step.
    fn behind(&self, _worker: &WorkerName, _step_budget: u64) -> WorkerLoad {
        WorkerLoad::default()
    }

    /// Whether [`LoadSource::passing`] may find anything for this decision's request (asked
    /// once per decision; `false` where the source knows no priorities).
    fn passed(&self) -> bool {
        false
    }

    /// The uncached prompt tokens per second lately sent to `worker` with a more urgent engine
    /// priority than this decision's request: work that passes it in the engine's queue while
    /// it waits (see [`WorkerLoad::passing_tokens_per_s`]). 0 where the source knows no
    /// priorities.
    fn passing(&self, _worker: &WorkerName) -> u64 {
        0
    }
}

impl<F: Fn(&str) -> WorkerLoad> LoadSource for F {
    fn load(&self, worker: &WorkerName) -> WorkerLoad {
        self(worker.as_str())
    }
}

/// What kvroute itself has sent to a worker and not yet seen finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerLoad {
    /// Requests sent and not yet ended (finished, failed or reset).
    pub inflight_requests: u32,
    /// Requests still in prefill (no response byte yet).
    pub prefilling_requests: u32,
    /// Uncached prompt tokens of requests still in prefill.
    pub prefill_tokens: u64,
    /// How long ago the oldest request still in prefill was sent (ms; 0: not known). A worker
    /// busy with its queue since then has done that much of the queued prefill already (see
    /// [`crate::decision::cost::Profile::remaining`]).
    pub prefill_elapsed_ms: u64,
    /// The sum over requests still in prefill of their uncached tokens squared: the attention
    /// part of their prefill grows with the square of a prompt's length, so one 8 k-token
    /// prompt queued costs more than eight 1 k-token ones (see [`crate::decision::cost::Profile::wait_ms`]).
    pub prefill_sq_tokens: u64,
    /// The uncached prompt tokens sent to the worker per second, over the last
    /// `load.arrival_window_ms` (0: off), by the requests still tracked (a lower bound: those
    /// already ended drop out, which matters only when requests are short, so the worker is
    /// seldom busy). A busy worker's next step fills with what arrives while it waits for it
    /// (see [`crate::decision::cost::Score::fill_forecast_ms`]).
    pub arriving_tokens_per_s: u64,
    /// Queued prompt tokens taken out of this load as waiting behind the request it is read
    /// for (a less urgent engine priority not started, see [`WorkerLoad::less`]): the engine
    /// fills the request's step with them after it.
    pub behind_tokens: u64,
    /// Of [`WorkerLoad::arriving_tokens_per_s`], this replica's arrivals with a more urgent
    /// engine priority than the request the load is read for (0 for the most urgent class,
    /// or without priorities). On an engine that schedules by priority they pass the request
    /// in the queue while it waits, so its wait is longer than the work queued ahead of it
    /// (see [`crate::decision::cost::passed_factor`]).
    pub passing_tokens_per_s: u64,
}

impl WorkerLoad {
    /// Requests past prefill, now decoding.
    pub fn decoding_requests(&self) -> u32 {
        self.inflight_requests.saturating_sub(self.prefilling_requests)
    }
}

impl WorkerLoad {
    /// `prefill_sq_tokens` for `tokens` split evenly over `requests` (the least it can be), for
    /// loads known only by their totals (other replicas' reports, unseen requests).
    pub fn even_sq_tokens(tokens: u64, requests: u32) -> u64 {
        if requests == 0 {
            return 0;
        }
        let t = u128::from(tokens);
        u64::try_from(t * t / u128::from(requests)).unwrap_or(u64::MAX)
    }

    /// This load without `part` of it (saturating): the queued work a request does not wait
    /// for taken out (see `shared::load::LoadView::behind`), its tokens kept as
    /// [`WorkerLoad::behind_tokens`]. A `part` with requests in it
    /// also bounds the work done on what is left: its `prefill_elapsed_ms` is how long ago
    /// the youngest request left was sent, and the smaller of the two ages stays.
    pub fn less(self, part: WorkerLoad) -> WorkerLoad {
        let prefill_elapsed_ms = if part.prefilling_requests > 0 {
            self.prefill_elapsed_ms.min(part.prefill_elapsed_ms)
        } else {
            self.prefill_elapsed_ms
        };
        WorkerLoad {
            inflight_requests: self.inflight_requests.saturating_sub(part.inflight_requests),
            prefilling_requests: self.prefilling_requests.saturating_sub(part.prefilling_requests),
            prefill_tokens: self.prefill_tokens.saturating_sub(part.prefill_tokens),
            prefill_elapsed_ms,
            prefill_sq_tokens: self.prefill_sq_tokens.saturating_sub(part.prefill_sq_tokens),
            arriving_tokens_per_s: self.arriving_tokens_per_s,
            behind_tokens: self.behind_tokens.saturating_add(part.prefill_tokens),
            passing_tokens_per_s: self.passing_tokens_per_s,
        }
    }

    /// Both loads together (saturating): this replica's and other replicas' in-flight work.
    pub fn plus(self, other: WorkerLoad) -> WorkerLoad {
        WorkerLoad {
            inflight_requests: self.inflight_requests.saturating_add(other.inflight_requests),
            prefilling_requests: self.prefilling_requests.saturating_add(other.prefilling_requests),
            prefill_tokens: self.prefill_tokens.saturating_add(other.prefill_tokens),
            prefill_elapsed_ms: self.prefill_elapsed_ms.max(other.prefill_elapsed_ms),
            prefill_sq_tokens: self.prefill_sq_tokens.saturating_add(other.prefill_sq_tokens),
            arriving_tokens_per_s: self
                .arriving_tokens_per_s
                .saturating_add(other.arriving_tokens_per_s),
            behind_tokens: self.behind_tokens.saturating_add(other.behind_tokens),
            passing_tokens_per_s: self
                .passing_tokens_per_s
                .saturating_add(other.passing_tokens_per_s),
        }
    }
}
