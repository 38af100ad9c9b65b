//! Router-tracked load in shared data, built so that no failure leaks it for long.
//!
//! Each Envoy thread owns one shard (`kvroute.load.shard.<id>`): the requests it sent and has
//! not seen end, each with its start time. Only the owner writes its shard, so no
//! compare-and-swap can be lost on the request path; readers sum every live shard listed in
//! the registry (`kvroute.load.shards`). Three mechanisms bound any leak:
//! - **Leases**: an entry older than `lease_ms` stops counting and is purged (an end that
//!   never came: a reset the host did not report, a context torn down).
//! - **Heartbeats**: a shard not rewritten for `shard_timeout_ms` belongs to a thread whose VM
//!   died; readers ignore it and the first to notice unlists it.
//! - **Reconciliation**: when a worker reports fewer running + waiting requests than the
//!   router tracks as started well before that report, the excess (oldest first) is removed.
//!   Under-counts need no correction here: the decision already takes, per count, the larger
//!   of the router's view and the worker's report.

use std::cell::Cell;
use std::collections::HashMap;

use crate::decision::worker::ByKey;

use super::{update, Counter, Counters, SharedStore};
use crate::decision::config::sync::LoadLimits;
use crate::decision::load::{worker_key, WorkerLoad};
use crate::wire::snapshot::SnapshotLoad;
use crate::wire::Reader;

mod done;
pub mod limits;
mod passed;
pub use done::{done_key, PrefillsDone};
pub use passed::{pass_key, passed_key};

pub const REGISTRY_KEY: &str = "kvroute.load.shards";
/// Entries without an engine priority of their own (every one 0): the format before
/// priorities, still written for them, so that a filter of either version reads the other's.
const SHARD_VERSION: u8 = 1;
/// Entries with their engine priority.
const SHARD_VERSION_PRIORITY: u8 = 2;
const ENTRY_LEN: usize = 33;
const ENTRY_LEN_PRIORITY: usize = ENTRY_LEN + 4;
/// Most shards the registry lists (threads of all Envoy VMs sharing this `vm_id`).
pub const MAX_SHARDS: usize = 1024;

pub fn shard_key(id: u32) -> String {
    format!("kvroute.load.shard.{id}")
}

/// The key of shard `id`'s thread mark ([`super::readiness`]), emptied with a dead shard.
pub fn mark_key(id: u32) -> String {
    format!("kvroute.thread.{id}")
}

/// One request in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InflightEntry {
    pub id: u64,
    pub worker: u64,
    pub started_ms: u64,
    pub prefill_tokens: u64,
    pub prefilling: bool,
    /// The `priority` the engine was sent (lower first, as vLLM's `--scheduling-policy
    /// priority`; 0: none, the engines' default).
    pub priority: i32,
}

/// A shard as stored.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardData {
    pub heartbeat_ms: u64,
    pub entries: Vec<InflightEntry>,
}

impl ShardData {
    pub fn encode(&self) -> Vec<u8> {
        let with_priority = self.entries.iter().any(|e| e.priority != 0);
        let (version, len) = if with_priority {
            (SHARD_VERSION_PRIORITY, ENTRY_LEN_PRIORITY)
        } else {
            (SHARD_VERSION, ENTRY_LEN)
        };
        let mut b = Vec::with_capacity(13 + len * self.entries.len());
        b.push(version);
        b.extend_from_slice(&self.heartbeat_ms.to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for e in &self.entries {
            for v in [e.id, e.worker, e.started_ms, e.prefill_tokens] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.push(u8::from(e.prefilling));
            if with_priority {
                b.extend_from_slice(&e.priority.to_le_bytes());
            }
        }
        b
    }

    /// Decodes a shard of either version; `None` for anything malformed (never panics).
    pub fn decode(bytes: &[u8]) -> Option<ShardData> {
        let mut r = Reader::new(bytes);
        let with_priority = match r.u8()? {
            SHARD_VERSION => false,
            SHARD_VERSION_PRIORITY => true,
            _ => return None,
        };
        let len = if with_priority { ENTRY_LEN_PRIORITY } else { ENTRY_LEN };
        let heartbeat_ms = r.u64()?;
        let n = r.u32()? as usize;
        if r.remaining() != n.checked_mul(len)? {
            return None;
        }
        let entries = (0..n)
            .map(|_| {
                Some(InflightEntry {
                    id: r.u64()?,
                    worker: r.u64()?,
                    started_ms: r.u64()?,
                    prefill_tokens: r.u64()?,
                    prefilling: r.u8()? != 0,
                    priority: if with_priority { r.u32()? as i32 } else { 0 },
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(ShardData { heartbeat_ms, entries })
    }
}

/// Decodes the registry: the ids of the listed shards.
pub fn decode_registry(bytes: &[u8]) -> Option<Vec<u32>> {
    let mut r = Reader::new(bytes);
    let n = r.u32()? as usize;
    if n > MAX_SHARDS || r.remaining() != n * 4 {
        return None;
    }
    (0..n).map(|_| r.u32()).collect()
}

pub fn encode_registry(ids: &[u32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + 4 * ids.len());
    b.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    for id in ids {
        b.extend_from_slice(&id.to_le_bytes());
    }
    b
}

fn registry<S: SharedStore + ?Sized>(store: &S, counters: &dyn Counters) -> Vec<u32> {
    match store.get(REGISTRY_KEY).0 {
        None => Vec::new(),
        Some(b) => decode_registry(&b).unwrap_or_else(|| {
            counters.count(Counter::Corrupt, 1);
            Vec::new()
        }),
    }
}

/// The ids of the listed shards (none when the registry is absent or unreadable).
pub fn listed<S: SharedStore + ?Sized>(store: &S) -> Vec<u32> {
    store.get(REGISTRY_KEY).0.as_deref().and_then(decode_registry).unwrap_or_default()
}

/// Changes the registry under compare-and-swap; a corrupt registry starts over.
fn edit_registry<S: SharedStore + ?Sized>(
    store: &S,
    f: impl Fn(&mut Vec<u32>),
) -> Result<Vec<u32>, super::StoreError> {
    update(store, REGISTRY_KEY, |b| {
        let mut ids = b.and_then(decode_registry).unwrap_or_default();
        f(&mut ids);
        ids.truncate(MAX_SHARDS);
        (encode_registry(&ids), ids)
    })
}

/// The shard of one thread: the only writer of its key.
#[derive(Debug)]
pub struct Shard {
    id: u32,
    data: ShardData,
    next_request: u64,
    limits: LoadLimits,
    /// Per worker, the time of the last worker report already reconciled.
    reconciled: HashMap<u64, u64>,
    /// When each worker's last prefill this thread saw ended ([`PrefillsDone`]).
    done: PrefillsDone,
    /// Whether `done` changed since it was last written.
    done_dirty: Cell<bool>,
    /// Per worker and engine priority, the latest send among the requests whose first token
    /// this thread saw (see `passed`), recorded below the priority `passes_below`.
    passes: PrefillsDone,
    passes_dirty: Cell<bool>,
    passes_below: Option<i32>,
    /// The prompt tokens of this thread's requests in flight, by entry id, where noted
    /// ([`Shard::note_context`]): not in the shard's encoding, so other threads do not see them.
    contexts: HashMap<u64, u64>,
}

/// What one request holds in a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

impl Shard {
    /// Claims a new shard id and lists it in the registry.
    ///
    /// `nonce` is a random draw of the calling thread. Ids come from a shared counter; the
    /// thread that creates the counter cannot know whether another created it at the same
    /// instant (shared data has no compare-and-swap on an absent key), so it takes an id
    /// from its nonce instead, in a range the counter does not reach.
    pub fn register<S: SharedStore + ?Sized>(
        store: &S,
        counters: &dyn Counters,
        limits: LoadLimits,
        now_ms: u64,
        nonce: u64,
    ) -> Shard {
        let claimed = update(store, "kvroute.load.next_shard", |b| {
            let id = super::read_u64(b);
            ((id + 1).to_le_bytes().to_vec(), (id as u32, b.is_none()))
        });
        let unlikely = |seed: u64| (seed as u32) | 0x8000_0000;
        let id = match claimed {
            Ok((id, false)) => id,
            Ok((_, true)) => unlikely(nonce),
            Err(_) => {
                counters.count(Counter::LostUpdate, 1);
                // A shard that is not listed still counts for this thread, and the next
                // heartbeat lists it.
                unlikely(nonce ^ now_ms)
            }
        };
        let shard = Shard {
            id,
            data: ShardData { heartbeat_ms: now_ms, entries: Vec::new() },
            next_request: 0,
            limits,
            reconciled: HashMap::new(),
            done: PrefillsDone::default(),
            done_dirty: Cell::new(false),
            passes: PrefillsDone::default(),
            passes_dirty: Cell::new(false),
            passes_below: None,
            contexts: HashMap::new(),
        };
        limits::publish(store, &limits);
        shard.flush(store, counters, now_ms);
        shard.ensure_listed(store, counters);
        shard
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn entries(&self) -> &[InflightEntry] {
        &self.data.entries
    }

    fn ensure_listed<S: SharedStore + ?Sized>(&self, store: &S, counters: &dyn Counters) {
        if registry(store, counters).contains(&self.id) {
            return;
        }
        let id = self.id;
        let listed = edit_registry(store, |ids| {
            if !ids.contains(&id) {
                ids.push(id);
            }
        });
        if listed.is_err() {
            counters.count(Counter::LostUpdate, 1);
        }
    }

    /// Writes the shard with a fresh heartbeat, and the prefill ends it saw (and the sends
    /// whose prefills ended, see `passed`) where they changed.
    pub fn flush<S: SharedStore + ?Sized>(&self, store: &S, counters: &dyn Counters, now_ms: u64) {
        let data = ShardData { heartbeat_ms: now_ms, entries: self.data.entries.clone() };
        if store.set(&shard_key(self.id), &data.encode(), None).is_err() {
            counters.count(Counter::LostUpdate, 1);
        }
        let id = self.id;
        write_table(store, counters, &self.done_dirty, || done_key(id), &self.done);
        write_table(store, counters, &self.passes_dirty, || passed_key(id), &self.passes);
    }

    /// A request was sent to `worker` with this many uncached prompt tokens and no engine
    /// priority of its own.
    pub fn start(
        &mut self,
        counters: &dyn Counters,
        worker: &str,
        tokens: u64,
        now: u64,
    ) -> Ticket {
        self.start_at(counters, worker, (tokens, 0), now)
    }

    /// A request was sent to `worker` with `(uncached prompt tokens, engine priority)`.
    pub fn start_at(
        &mut self,
        counters: &dyn Counters,
        worker: &str,
        (tokens, priority): (u64, i32),
        now: u64,
    ) -> Ticket {
        let id = self.next_request;
        self.next_request += 1;
        if self.data.entries.len() >= self.limits.max_inflight_per_thread {
            let cut = self.data.entries.len() + 1 - self.limits.max_inflight_per_thread;
            self.data.entries.drain(..cut);
            counters.count(Counter::InflightCapped, cut as u64);
        }
        self.data.entries.push(InflightEntry {
            id,
            worker: worker_key(worker),
            started_ms: now,
            prefill_tokens: tokens,
            prefilling: true,
            priority,
        });
        Ticket(id)
    }

    fn entry(&mut self, t: Ticket) -> Option<&mut InflightEntry> {
        self.data.entries.iter_mut().find(|e| e.id == t.0)
    }

    /// The first response byte arrived: the prefill is done.
    pub fn first_byte(&mut self, t: Ticket) {
        if let Some(e) = self.entry(t) {
            e.prefilling = false;
        }
    }

    /// The first token arrived at `now_ms`: the prefill is done, and ended then, so its
    /// worker's next prefill started no earlier ([`PrefillsDone`]).
    pub fn prefill_ended(&mut self, t: Ticket, now_ms: u64) {
        let Some(e) = self.entry(t) else { return };
        if !e.prefilling {
            return;
        }
        e.prefilling = false;
        let (worker, priority, sent) = (e.worker, e.priority, e.started_ms);
        self.done.record(worker, now_ms);
        self.done_dirty.set(true);
        self.record_pass(worker, priority, sent);
    }

    /// The request is being served by `worker` (a retry moved it from the planned one).
    pub fn served_by(&mut self, t: Ticket, worker: &str) {
        if let Some(e) = self.entry(t) {
            e.worker = worker_key(worker);
        }
    }

    /// The request ended, however it ended. Unknown tickets (already expired) are ignored.
    pub fn end(&mut self, t: Ticket) {
        self.data.entries.retain(|e| e.id != t.0);
        self.contexts.remove(&t.0);
    }

    /// Notes the request's prompt tokens (its context once it decodes), for
    /// [`Shard::mean_context`]. Only while it is in flight.
    pub fn note_context(&mut self, t: Ticket, tokens: u64) {
        if self.data.entries.iter().any(|e| e.id == t.0) {
            self.contexts.insert(t.0, tokens);
        }
    }

    /// The mean prompt tokens of this thread's requests in flight on the worker of key `key`
    /// whose context was noted (`None`: none was): what each stream there is taken to hold
    /// when its decode steps are timed (see `decision::calib::steps`).
    pub fn mean_context(&self, key: u64) -> Option<f64> {
        let (sum, n) = (self.data.entries.iter())
            .filter(|e| e.worker == key)
            .filter_map(|e| self.contexts.get(&e.id))
            .fold((0u64, 0u64), |(sum, n), c| (sum.saturating_add(*c), n + 1));
        (n > 0).then(|| sum as f64 / n as f64)
    }

    /// Purges entries whose lease ran out; returns how many.
    pub fn expire(&mut self, counters: &dyn Counters, now_ms: u64) -> usize {
        let lease = self.limits.lease_ms;
        let before = self.data.entries.len();
        self.data.entries.retain(|e| now_ms.saturating_sub(e.started_ms) < lease);
        if self.done.expire(now_ms, lease) {
            self.done_dirty.set(true);
        }
        if self.passes.expire(now_ms, lease) {
            self.passes_dirty.set(true);
        }
        let n = before - self.data.entries.len();
        counters.count(Counter::LeaseExpired, n as u64);
        // Entries also leave by expiry, reconciliation and the per-thread cap: a noted
        // context outlives its entry until the notes outnumber the entries.
        if self.contexts.len() > self.data.entries.len() {
            let live: std::collections::HashSet<u64> =
                self.data.entries.iter().map(|e| e.id).collect();
            self.contexts.retain(|id, _| live.contains(id));
        }
        n
    }

    /// Trims over-counts against `worker`'s report: `tracked_before` is what all shards track
    /// for it as started at least the slack before the report. This shard removes its share
    /// of the excess, oldest first, once per report. Returns how many entries it removed.
    pub fn reconcile(
        &mut self,
        counters: &dyn Counters,
        worker: &str,
        report: &SnapshotLoad,
        tracked_before: u64,
    ) -> usize {
        let key = worker_key(worker);
        if self.reconciled.get(&key).is_some_and(|at| *at >= report.observed_at_ms) {
            return 0;
        }
        self.reconciled.insert(key, report.observed_at_ms);
        let reported = u64::from(report.running) + u64::from(report.waiting);
        let excess = tracked_before.saturating_sub(reported);
        let cutoff = report.observed_at_ms.saturating_sub(self.limits.reconcile_slack_ms);
        let mut mine: Vec<(u64, u64)> = self
            .data
            .entries
            .iter()
            .filter(|e| e.worker == key && e.started_ms <= cutoff)
            .map(|e| (e.started_ms, e.id))
            .collect();
        if excess == 0 || mine.is_empty() || tracked_before == 0 {
            return 0;
        }
        // This shard's share of the excess, rounded up.
        let share = (excess * mine.len() as u64).div_ceil(tracked_before) as usize;
        mine.sort_unstable();
        let drop: Vec<u64> = mine.iter().take(share).map(|(_, id)| *id).collect();
        self.data.entries.retain(|e| !drop.contains(&e.id));
        counters.count(Counter::Reconciled, drop.len() as u64);
        drop.len()
    }

    /// A heartbeat: purges expired entries, rewrites the shard, re-lists it if a lost write
    /// or a sweep unlisted it.
    pub fn tick<S: SharedStore + ?Sized>(&mut self, store: &S, counters: &dyn Counters, now: u64) {
        self.expire(counters, now);
        self.flush(store, counters, now);
        self.ensure_listed(store, counters);
    }
}

/// A tracked request as the view keeps it, by worker.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    started_ms: u64,
    prefill_tokens: u64,
    priority: i32,
    prefilling: bool,
}

/// Everything the live shards hold, by worker key.
#[derive(Debug, Default, Clone)]
pub struct LoadView {
    /// Keyed by worker key (already a hash: it is its own, see [`ByKey`]); a decision probes it
    /// once per worker of the pool, so the loads sit apart from the requests.
    by_worker: HashMap<u64, WorkerLoad, ByKey>,
    /// Each tracked request, by worker key.
    tracked: HashMap<u64, Vec<Tracked>, ByKey>,
    /// The largest (least urgent) engine priority of a request still in prefill.
    least_urgent: Option<i32>,
    /// When each worker's last prefill seen by any live thread ended (ms), by worker key.
    last_done: HashMap<u64, u64, ByKey>,
    /// When the view was read (ms).
    read_at_ms: u64,
    /// The window over which arrivals are counted (ms; 0: none).
    arrival_window_ms: u64,
    /// The smallest (most urgent) engine priority of a request sent within that window.
    most_urgent_arriving: Option<i32>,
}

impl LoadView {
    /// Reads every listed shard (this thread's own from memory), leaving out dead shards and
    /// expired entries; unlists dead shards and counts their entries as dropped.
    pub fn read<S: SharedStore + ?Sized>(
        store: &S,
        counters: &dyn Counters,
        own: &Shard,
        now_ms: u64,
    ) -> LoadView {
        Self::read_shards(store, counters, own.limits, Some(own), now_ms)
    }

    /// Reads every listed shard from shared data, for a reader without a shard of its own
    /// (the singleton, which reports this replica's load to the updater). It leaves dead
    /// shards out but listed: the threads unlist them and count what they held (the
    /// singleton, reading every few milliseconds, would otherwise always come first).
    pub fn read_all<S: SharedStore + ?Sized>(
        store: &S,
        counters: &dyn Counters,
        limits: LoadLimits,
        now_ms: u64,
    ) -> LoadView {
        Self::read_shards(store, counters, limits, None, now_ms)
    }

    fn read_shards<S: SharedStore + ?Sized>(
        store: &S,
        counters: &dyn Counters,
        limits: LoadLimits,
        own: Option<&Shard>,
        now_ms: u64,
    ) -> LoadView {
        let mut view = LoadView {
            read_at_ms: now_ms,
            arrival_window_ms: limits.arrival_window_ms,
            ..LoadView::default()
        };
        let mut dead = Vec::new();
        let mut ends: Vec<Vec<u8>> = Vec::new();
        for id in registry(store, counters) {
            if own.is_some_and(|o| o.id == id) {
                continue;
            }
            let Some(bytes) = store.get(&shard_key(id)).0 else {
                dead.push((id, 0));
                continue;
            };
            let Some(shard) = ShardData::decode(&bytes) else {
                counters.count(Counter::Corrupt, 1);
                dead.push((id, 0));
                continue;
            };
            if now_ms.saturating_sub(shard.heartbeat_ms) > limits.shard_timeout_ms {
                dead.push((id, shard.entries.len()));
                continue;
            }
            view.add(&shard.entries, &limits, now_ms);
            match store.get(&done_key(id)).0.filter(|b| !b.is_empty()) {
                None => {}
                Some(b) if PrefillsDone::read(&b).is_some() => ends.push(b),
                Some(_) => counters.count(Counter::Corrupt, 1),
            }
        }
        if let Some(own) = own {
            view.add(&own.data.entries, &limits, now_ms);
        }
        view.arrival_rates(limits.arrival_window_ms);
        let theirs = ends.iter().filter_map(|b| PrefillsDone::read(b)).flatten();
        view.credit_done(theirs.chain(own.into_iter().flat_map(|o| o.done.iter())));
        if own.is_some() && !dead.is_empty() {
            sweep(store, counters, &dead);
        }
        view
    }

    fn add(&mut self, entries: &[InflightEntry], limits: &LoadLimits, now_ms: u64) {
        let window = limits.arrival_window_ms;
        for e in entries.iter().filter(|e| now_ms.saturating_sub(e.started_ms) < limits.lease_ms) {
            let load = self.by_worker.entry(e.worker).or_default();
            load.inflight_requests = load.inflight_requests.saturating_add(1);
            // The tokens, made a rate once every shard is in (`arrival_rates`).
            if window > 0 && now_ms.saturating_sub(e.started_ms) < window {
                load.arriving_tokens_per_s =
                    load.arriving_tokens_per_s.saturating_add(e.prefill_tokens);
                self.most_urgent_arriving =
                    Some(self.most_urgent_arriving.map_or(e.priority, |p| p.min(e.priority)));
            }
            if e.prefilling {
                load.prefilling_requests = load.prefilling_requests.saturating_add(1);
                load.prefill_tokens = load.prefill_tokens.saturating_add(e.prefill_tokens);
                let sq = e.prefill_tokens.saturating_mul(e.prefill_tokens);
                load.prefill_sq_tokens = load.prefill_sq_tokens.saturating_add(sq);
                let elapsed = now_ms.saturating_sub(e.started_ms);
                load.prefill_elapsed_ms = load.prefill_elapsed_ms.max(elapsed);
                self.least_urgent =
                    Some(self.least_urgent.map_or(e.priority, |p| p.max(e.priority)));
            }
            self.tracked.entry(e.worker).or_default().push(Tracked {
                started_ms: e.started_ms,
                prefill_tokens: e.prefill_tokens,
                priority: e.priority,
                prefilling: e.prefilling,
            });
        }
    }

    /// Makes each worker's arriving tokens, summed over the `window` (ms), a rate per second.
    fn arrival_rates(&mut self, window: u64) {
        if window == 0 {
            return;
        }
        for load in self.by_worker.values_mut().filter(|l| l.arriving_tokens_per_s > 0) {
            load.arriving_tokens_per_s = load.arriving_tokens_per_s.saturating_mul(1000) / window;
        }
    }

    /// Bounds each worker's work done on its queue by the time since its last prefill ended,
    /// the latest of the threads' `ends` (see [`PrefillsDone`]): `prefill_elapsed_ms` is then
    /// the time since the later of the oldest request still in prefill was sent and the last
    /// prefill there ended. Only workers with a prefill queued keep their end.
    fn credit_done(&mut self, ends: impl Iterator<Item = (u64, u64)>) {
        for (w, at) in ends {
            let Some(load) = self.by_worker.get_mut(&w) else { continue };
            if load.prefilling_requests == 0 {
                continue;
            }
            let since = self.read_at_ms.saturating_sub(at);
            load.prefill_elapsed_ms = load.prefill_elapsed_ms.min(since);
            let e = self.last_done.entry(w).or_default();
            *e = (*e).max(at);
        }
    }

    /// When `key`'s last prefill seen here ended (ms), if one did and a prefill is queued
    /// there now.
    pub fn last_prefill_done(&self, key: u64) -> Option<u64> {
        self.last_done.get(&key).copied()
    }

    /// The router-tracked load of `worker` across all live threads.
    pub fn load(&self, worker: &str) -> WorkerLoad {
        self.load_key(worker_key(worker))
    }

    /// [`LoadView::load`] of the worker whose [`worker_key`] is `key`.
    pub fn load_key(&self, key: u64) -> WorkerLoad {
        self.by_worker.get(&key).copied().unwrap_or_default()
    }

    /// Every worker with tracked load, by worker key ([`worker_key`]).
    pub fn loads(&self) -> impl Iterator<Item = (u64, WorkerLoad)> + '_ {
        self.by_worker.iter().map(|(k, l)| (*k, *l))
    }

    /// How many tracked requests to `worker` started at or before `at_ms`.
    pub fn started_before(&self, worker: &str, at_ms: u64) -> u64 {
        self.tracked
            .get(&worker_key(worker))
            .map_or(0, |s| s.iter().filter(|t| t.started_ms <= at_ms).count() as u64)
    }

    /// Whether some request still in prefill was sent with a priority less urgent than
    /// `priority` (a larger value): only then can [`LoadView::behind`] find anything.
    pub fn defers_to(&self, priority: i32) -> bool {
        self.least_urgent.is_some_and(|p| p > priority)
    }

    /// The part of `worker`'s tracked prefill queue (the worker of key `key`) that a request
    /// sent with engine priority `priority` does not wait for, on an engine that schedules by
    /// priority (vLLM's `--scheduling-policy priority`): the requests still in prefill with a
    /// less urgent priority that the engine cannot have started yet. Such an engine takes its
    /// waiting queue in priority order, but never preempts a prefill it started for a more
    /// urgent arrival, and starts at most `step_budget` prompt tokens (its
    /// `max_num_batched_tokens`) per step. So the tracked requests are taken in the order they
    /// were sent: one whose predecessors still in prefill hold less than a step's budget may
    /// be running and counts in full; a less urgent one behind a step's budget or more waits
    /// for this request (the oldest is always counted, as with a budget of 0: one at a time).
    ///
    /// Where something is behind, the returned `prefill_elapsed_ms` is how long ago the
    /// youngest request still counted was sent: the work the worker did on the counted queue
    /// since then, at most (see [`WorkerLoad::less`]). The oldest request's age, which the
    /// full load carries, is no measure of it on such an engine: the less urgent requests it
    /// passed over wait there while more urgent ones come and go.
    pub fn behind(&self, key: u64, priority: i32, step_budget: u64) -> WorkerLoad {
        let mut out = WorkerLoad::default();
        let Some(tracked) = self.tracked.get(&key) else { return out };
        let mut queue: Vec<&Tracked> = tracked.iter().filter(|t| t.prefilling).collect();
        if !queue.iter().any(|t| t.priority > priority) {
            return out;
        }
        queue.sort_by_key(|t| t.started_ms);
        let (mut before, mut youngest_counted) = (0u64, 0u64);
        for t in queue {
            if t.priority > priority && before >= step_budget.max(1) {
                out.inflight_requests += 1;
                out.prefilling_requests += 1;
                out.prefill_tokens = out.prefill_tokens.saturating_add(t.prefill_tokens);
                let sq = t.prefill_tokens.saturating_mul(t.prefill_tokens);
                out.prefill_sq_tokens = out.prefill_sq_tokens.saturating_add(sq);
            } else {
                youngest_counted = t.started_ms;
            }
            before = before.saturating_add(t.prefill_tokens);
        }
        if out.prefilling_requests > 0 {
            let from = youngest_counted.max(self.last_prefill_done(key).unwrap_or(0));
            out.prefill_elapsed_ms = self.read_at_ms.saturating_sub(from);
        }
        out
    }

    /// Whether a request of engine priority `priority` may be passed: some request sent within
    /// the arrival window was more urgent.
    pub fn passes(&self, priority: i32) -> bool {
        self.arrival_window_ms > 0 && self.most_urgent_arriving.is_some_and(|p| p < priority)
    }

    /// The uncached prompt tokens per second sent to the worker of key `key` within the
    /// arrival window with an engine priority more urgent than `priority` (a smaller value),
    /// by the requests still tracked (those already ended drop out, as for
    /// [`WorkerLoad::arriving_tokens_per_s`]). On an engine that schedules by priority they
    /// pass a waiting request of `priority` (see [`WorkerLoad::passing_tokens_per_s`]).
    pub fn passing(&self, key: u64, priority: i32) -> u64 {
        let window = self.arrival_window_ms;
        if !self.passes(priority) {
            return 0;
        }
        let Some(tracked) = self.tracked.get(&key) else { return 0 };
        let tokens = tracked
            .iter()
            .filter(|t| {
                t.priority < priority && self.read_at_ms.saturating_sub(t.started_ms) < window
            })
            .fold(0u64, |sum, t| sum.saturating_add(t.prefill_tokens));
        tokens.saturating_mul(1000) / window
    }
}

/// A [`LoadView`] as a request sent with engine priority `priority` sees it: the queued work
/// it does not wait for is [`LoadSource::behind`] (see [`LoadView::behind`]).
#[derive(Debug, Clone, Copy)]
pub struct AtPriority<'v> {
    pub view: &'v LoadView,
    pub priority: i32,
}

/// Writes `table` under `key` if it changed since it was last written (`dirty`).
fn write_table<S: SharedStore + ?Sized>(
    store: &S,
    counters: &dyn Counters,
    dirty: &Cell<bool>,
    key: impl FnOnce() -> String,
    table: &PrefillsDone,
) {
    if !dirty.get() {
        return;
    }
    if store.set(&key(), &table.encode(), None).is_ok() {
        dirty.set(false);
    } else {
        counters.count(Counter::LostUpdate, 1);
    }
}

/// Unlists dead shards and empties their keys; only the reader whose write unlisted a shard
/// counts the entries it held.
fn sweep<S: SharedStore + ?Sized>(store: &S, counters: &dyn Counters, dead: &[(u32, usize)]) {
    let swept = update(store, REGISTRY_KEY, |b| {
        let mut ids = b.and_then(decode_registry).unwrap_or_default();
        let removed: Vec<(u32, usize)> =
            dead.iter().copied().filter(|(d, _)| ids.contains(d)).collect();
        ids.retain(|id| !dead.iter().any(|(d, _)| d == id));
        (encode_registry(&ids), removed)
    });
    let Ok(removed) = swept else { return };
    for (id, _) in &removed {
        let _ = store.set(&shard_key(*id), &[], None);
        let _ = store.set(&done_key(*id), &[], None);
        let _ = store.set(&passed_key(*id), &[], None);
        let _ = store.set(&mark_key(*id), &[], None);
    }
    let lost: usize = removed.iter().map(|(_, n)| n).sum();
    counters.count(Counter::ShardDropped, lost as u64);
}

/// A decision reads the view by key: no worker name is read.
impl crate::decision::load::LoadSource for LoadView {
    fn load(&self, worker: &crate::decision::worker::WorkerName) -> WorkerLoad {
        self.load_key(worker.key())
    }

    fn started_within(
        &self,
        worker: &crate::decision::worker::WorkerName,
        from_ms: u64,
        to_ms: u64,
    ) -> usize {
        self.tracked
            .get(&worker.key())
            .map_or(0, |s| s.iter().filter(|t| (from_ms..=to_ms).contains(&t.started_ms)).count())
    }
}

impl crate::decision::load::LoadSource for AtPriority<'_> {
    fn load(&self, worker: &crate::decision::worker::WorkerName) -> WorkerLoad {
        self.view.load_key(worker.key())
    }

    fn started_within(
        &self,
        worker: &crate::decision::worker::WorkerName,
        from_ms: u64,
        to_ms: u64,
    ) -> usize {
        crate::decision::load::LoadSource::started_within(self.view, worker, from_ms, to_ms)
    }

    fn priority(&self) -> i32 {
        self.priority
    }

    fn defers(&self) -> bool {
        self.view.defers_to(self.priority)
    }

    fn behind(&self, worker: &crate::decision::worker::WorkerName, step_budget: u64) -> WorkerLoad {
        self.view.behind(worker.key(), self.priority, step_budget)
    }

    fn passed(&self) -> bool {
        self.view.passes(self.priority)
    }

    fn passing(&self, worker: &crate::decision::worker::WorkerName) -> u64 {
        self.view.passing(worker.key(), self.priority)
    }
}

#[cfg(test)]
mod tests;
