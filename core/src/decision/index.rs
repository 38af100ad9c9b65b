//! The knowledge index: which block hashes each worker is believed to hold, from which source,
//! and since when. Bounded per worker (LRU) and aged (TTL per source).
//!
//! Start at [`KnowledgeIndex`]. Each worker's knowledge lives in its own slot; [`holders`]
//! keeps the same knowledge inside out (hash -> workers) so that a decision
//! ([`KnowledgeIndex::prefix_matches`], in `batch.rs`) looks each prompt block up once for the
//! whole pool. [`KnowledgeIndex::prefix_match`] walks one worker's slot: the reference the
//! batch lookup is tested against.

mod batch;
pub mod holders;
pub mod room;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use foldhash::fast::RandomState as Fast;

use hashlink::LinkedHashMap;

use holders::{Holders, GPU, MAX_WORKERS, OBSERVED, OFFLOADED};
use room::Room;

use crate::decision::load::worker_key;
use crate::wire::journal::Source;

/// One observation of a block on a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub source: Source,
    pub at_ms: u64,
}

/// Limits of the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexLimits {
    /// Most blocks remembered per worker; the least recently observed go first.
    pub max_blocks_per_worker: usize,
    /// Age after which a routed (predicted) observation no longer counts.
    pub routed_ttl_ms: u64,
    /// Age after which a feedback-confirmed observation no longer counts.
    pub feedback_ttl_ms: u64,
    /// Age after which a KV-event observation no longer counts (0: never, events say removal).
    pub event_ttl_ms: u64,
    /// Age after which another replica's routing credit no longer counts.
    pub peer_ttl_ms: u64,
}

impl IndexLimits {
    fn ttl(&self, source: Source) -> u64 {
        match source {
            Source::KvEvent => self.event_ttl_ms,
            Source::Routed => self.routed_ttl_ms,
            Source::Feedback => self.feedback_ttl_ms,
            Source::Peer => self.peer_ttl_ms,
        }
    }

    fn alive(&self, obs: &Observation, now_ms: u64) -> bool {
        let ttl = self.ttl(obs.source);
        ttl == 0 || now_ms.saturating_sub(obs.at_ms) < ttl
    }
}

/// Result of a prefix lookup on one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Consecutive leading blocks believed present.
    pub blocks: usize,
    /// Age of the oldest observation among them (0 when none matched).
    pub oldest_age_ms: u64,
    /// How many of the matched blocks come from the KV event stream.
    pub from_events: usize,
    /// How many of the matched blocks sit only in a lower tier (CPU, storage): they must be
    /// transferred back before use.
    pub offloaded: usize,
    /// Age of the youngest routing credit (this replica's or another's) among the matched
    /// blocks: a prefix kvroute sent there this recently may still be in prefill.
    pub routed_age_ms: Option<u64>,
    /// How many of the matched blocks only another replica's routing vouches for.
    pub from_peers: usize,
}

#[derive(Debug, Default)]
struct WorkerBlocks {
    /// This worker's number in [`Holders`].
    id: u32,
    blocks: LinkedHashMap<u64, Observation>,
    /// `blocks`' room (see [`room`]).
    room: Room,
    events: Option<EventView>,
}

/// A worker's blocks as its KV-event stream reports them (from snapshots and their deltas).
#[derive(Debug, Default)]
struct EventView {
    blocks: std::collections::HashSet<u64, Fast>,
    /// Blocks on lower tiers (CPU, storage).
    offloaded: std::collections::HashSet<u64, Fast>,
    /// When the updater last heard from this worker's stream (unix ms).
    observed_at_ms: u64,
    /// The room of `blocks` and of `offloaded` (see [`room`]).
    room: [Room; 2],
}

/// A change to one worker's event view (see [`KnowledgeIndex::change_events`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct EventChange<'a> {
    pub reset: bool,
    pub gpu_add: &'a [u64],
    pub gpu_remove: &'a [u64],
    pub offloaded_add: &'a [u64],
    pub offloaded_remove: &'a [u64],
}

/// How event knowledge is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTrust {
    /// Event knowledge not confirmed by the updater for this long is ignored.
    pub max_age_ms: u64,
    /// Routed and feedback observations older than a worker's last event by more than this
    /// are superseded by the event view (events say what really happened since).
    pub grace_ms: u64,
}

impl Default for EventTrust {
    fn default() -> Self {
        EventTrust { max_age_ms: 5_000, grace_ms: 2_000 }
    }
}

/// Per-worker block knowledge.
#[derive(Debug)]
pub struct KnowledgeIndex {
    limits: IndexLimits,
    trust: EventTrust,
    /// When the updater last confirmed its snapshot (unix ms); `None`: no event knowledge.
    events_checked_at_ms: Option<u64>,
    /// Worker key ([`worker_key`] of its name) -> its slot in `slots` (its id).
    ids: HashMap<u64, u32, crate::decision::worker::ByKey>,
    slots: Vec<Option<WorkerBlocks>>,
    /// Ids of emptied slots, reused first.
    free_ids: Vec<u32>,
    /// Every slot's blocks, by hash.
    holders: Holders,
    /// `holders`' room (see [`room`]).
    holders_room: Room,
    /// Each slot's event view's `observed_at_ms` (`None`: no view), kept beside the slots so
    /// that a decision starts a worker's match without reading its slot.
    events_at: Vec<Option<u64>>,
}

impl KnowledgeIndex {
    pub fn new(limits: IndexLimits) -> Self {
        Self::with_trust(limits, EventTrust::default())
    }

    pub fn with_trust(limits: IndexLimits, trust: EventTrust) -> Self {
        KnowledgeIndex {
            limits,
            trust,
            events_checked_at_ms: None,
            ids: HashMap::default(),
            slots: Vec::new(),
            free_ids: Vec::new(),
            holders: Holders::default(),
            holders_room: Room::default(),
            events_at: Vec::new(),
        }
    }

    /// Makes room ahead in every large table of the index (each worker's observations and
    /// event views, the holders; see [`room`]). For the tick. Returns how many tables it
    /// reserved in.
    pub fn make_room(&mut self) -> usize {
        let mut grown = 0;
        for w in self.slots.iter_mut().flatten() {
            grown += usize::from(w.room.make(&mut w.blocks));
            if let Some(e) = w.events.as_mut() {
                grown += usize::from(e.room[0].make(&mut e.blocks));
                grown += usize::from(e.room[1].make(&mut e.offloaded));
            }
        }
        grown + usize::from(self.holders_room.make(&mut self.holders))
    }

    fn slot(&self, worker: &str) -> Option<&WorkerBlocks> {
        self.slot_of(worker_key(worker))
    }

    /// The slot of the worker whose [`worker_key`] is `key`.
    fn slot_of(&self, key: u64) -> Option<&WorkerBlocks> {
        let id = *self.ids.get(&key)?;
        self.slots.get(id as usize)?.as_ref()
    }

    /// `worker`'s slot, created empty if it has none, and the holders to keep in step with it;
    /// `None` past [`MAX_WORKERS`] workers (nothing is then remembered about the newcomer).
    fn slot_mut(&mut self, worker: &str) -> Option<(&mut WorkerBlocks, &mut Holders)> {
        let key = worker_key(worker);
        let id = match self.ids.get(&key) {
            Some(&id) => id,
            None => {
                let id = self.free_ids.pop().unwrap_or(self.slots.len() as u32);
                if id > MAX_WORKERS {
                    return None;
                }
                self.ids.insert(key, id);
                id
            }
        };
        let at = id as usize;
        if self.slots.len() <= at {
            self.slots.resize_with(at + 1, || None);
        }
        let slot = self.slots.get_mut(at)?;
        let slot = slot.get_or_insert_with(|| WorkerBlocks { id, ..Default::default() });
        Some((slot, &mut self.holders))
    }

    /// Replaces `worker`'s event view with `gpu` and `offloaded` hashes, as last heard at
    /// `observed_at_ms`.
    pub fn set_events(
        &mut self,
        worker: &str,
        gpu: &[u64],
        offloaded: &[u64],
        observed_at_ms: u64,
    ) {
        let Some((w, holders)) = self.slot_mut(worker) else { return };
        let view = EventView {
            blocks: gpu.iter().copied().collect(),
            offloaded: offloaded.iter().copied().collect(),
            observed_at_ms,
            room: [Room::default(); 2],
        };
        // Only what changed moves in the holders (a snapshot mostly repeats the views).
        let old = w.events.take().unwrap_or_default();
        for (was, now, flag) in
            [(&old.blocks, &view.blocks, GPU), (&old.offloaded, &view.offloaded, OFFLOADED)]
        {
            was.iter().filter(|h| !now.contains(*h)).for_each(|&h| holders.clear(h, w.id, flag));
            now.iter().filter(|h| !was.contains(*h)).for_each(|&h| holders.set(h, w.id, flag));
        }
        w.events = Some(view);
        let id = w.id;
        self.note_events(id, Some(observed_at_ms));
    }

    /// Records slot `id`'s event view time in [`KnowledgeIndex::events_at`].
    fn note_events(&mut self, id: u32, at_ms: Option<u64>) {
        let at = id as usize;
        if self.events_at.len() <= at {
            self.events_at.resize(at + 1, None);
        }
        if let Some(e) = self.events_at.get_mut(at) {
            *e = at_ms;
        }
    }

    /// Changes `worker`'s event view: optionally empties it, then removes and adds per tier.
    pub fn change_events(&mut self, worker: &str, change: EventChange<'_>, observed_at_ms: u64) {
        let Some((w, holders)) = self.slot_mut(worker) else { return };
        let id = w.id;
        let view = w.events.get_or_insert_with(EventView::default);
        if change.reset {
            unlist_view(holders, id, view);
            view.blocks.clear();
            view.offloaded.clear();
        }
        let tiers = [
            (&mut view.blocks, change.gpu_remove, change.gpu_add, GPU),
            (&mut view.offloaded, change.offloaded_remove, change.offloaded_add, OFFLOADED),
        ];
        for (set, remove, add, flag) in tiers {
            for h in remove {
                if set.remove(h) {
                    holders.clear(*h, id, flag);
                }
            }
            for &h in add {
                if set.insert(h) {
                    holders.set(h, id, flag);
                }
            }
        }
        view.observed_at_ms = observed_at_ms;
        self.note_events(id, Some(observed_at_ms));
    }

    /// Records that the updater confirmed its knowledge at `at_ms`.
    pub fn events_checked(&mut self, at_ms: u64) {
        self.events_checked_at_ms = Some(at_ms);
    }

    /// Whether event knowledge exists, and whether it is fresh at `now_ms`.
    pub fn event_state(&self, now_ms: u64) -> (bool, bool) {
        match self.events_checked_at_ms {
            None => (false, false),
            Some(at) => (true, now_ms.saturating_sub(at) <= self.trust.max_age_ms),
        }
    }

    /// Records that `worker` holds `hashes` (refreshing their recency), evicting the least
    /// recently observed blocks past the per-worker bound.
    pub fn insert(&mut self, worker: &str, hashes: &[u64], source: Source, now_ms: u64) {
        let limits = self.limits;
        let Some((w, holders)) = self.slot_mut(worker) else { return };
        for &h in hashes {
            // `insert` replaces a known block's observation and moves it to the back (newest).
            if w.blocks.insert(h, Observation { source, at_ms: now_ms }).is_none() {
                holders.set(h, w.id, OBSERVED);
            }
        }
        while w.blocks.len() > limits.max_blocks_per_worker {
            if let Some((h, _)) = w.blocks.pop_front() {
                holders.clear(h, w.id, OBSERVED);
            }
        }
        Self::purge(&limits, w, holders, now_ms);
    }

    fn slot_and_holders(&mut self, worker: &str) -> Option<(&mut WorkerBlocks, &mut Holders)> {
        let id = *self.ids.get(&worker_key(worker))?;
        let slot = self.slots.get_mut(id as usize)?.as_mut()?;
        Some((slot, &mut self.holders))
    }

    /// Forgets `hashes` on `worker`.
    pub fn remove(&mut self, worker: &str, hashes: &[u64]) {
        if let Some((w, holders)) = self.slot_and_holders(worker) {
            for &h in hashes {
                if w.blocks.remove(&h).is_some() {
                    holders.clear(h, w.id, OBSERVED);
                }
            }
        }
    }

    /// Takes back routing credit: forgets those of `hashes` on `worker` that only routing
    /// history vouches for (feedback and events stay).
    pub fn retract_routed(&mut self, worker: &str, hashes: &[u64]) {
        if let Some((w, holders)) = self.slot_and_holders(worker) {
            for &h in hashes {
                if w.blocks.get(&h).is_some_and(|o| o.source == Source::Routed) {
                    w.blocks.remove(&h);
                    holders.clear(h, w.id, OBSERVED);
                }
            }
        }
    }

    /// Forgets everything about `worker`.
    pub fn clear_worker(&mut self, worker: &str) {
        let Some(id) = self.ids.remove(&worker_key(worker)) else { return };
        let Some(w) = self.slots.get_mut(id as usize).and_then(Option::take) else { return };
        for &h in w.blocks.keys() {
            self.holders.clear(h, id, OBSERVED);
        }
        if let Some(view) = &w.events {
            unlist_view(&mut self.holders, id, view);
        }
        self.note_events(id, None);
        self.free_ids.push(id);
    }

    /// Number of blocks currently remembered for `worker` (expired ones may still count
    /// until purged).
    pub fn len(&self, worker: &str) -> usize {
        self.slot(worker).map_or(0, |w| w.blocks.len())
    }

    pub fn is_empty(&self) -> bool {
        self.slots.iter().flatten().all(|w| w.blocks.is_empty())
    }

    /// Longest run of leading `hashes` that `worker` is believed to hold, ignoring expired
    /// observations.
    pub fn prefix_match(&self, worker: &str, hashes: &[u64], now_ms: u64) -> PrefixMatch {
        self.prefix_match_of(worker_key(worker), hashes, now_ms)
    }

    /// [`KnowledgeIndex::prefix_match`] of the worker whose [`worker_key`] is `key`.
    pub(crate) fn prefix_match_of(&self, key: u64, hashes: &[u64], now_ms: u64) -> PrefixMatch {
        let mut m = PrefixMatch::default();
        let Some(w) = self.slot_of(key) else {
            return m;
        };
        let walk = Walk::new(self, w, now_ms);
        for &h in hashes {
            let flag = |held: bool, f: u32| if held { f } else { 0 };
            let view = walk.w.events.as_ref();
            let flags = flag(view.is_some_and(|e| e.blocks.contains(&h)), GPU)
                | flag(view.is_some_and(|e| e.offloaded.contains(&h)), OFFLOADED)
                | flag(w.blocks.contains_key(&h), OBSERVED);
            if !walk.credit(h, flags, &mut m) {
                break;
            }
        }
        self.fade(&mut m, now_ms);
        m
    }

    /// Credit from events fades over the second half of their allowed age.
    fn fade(&self, m: &mut PrefixMatch, now_ms: u64) {
        fade(m, self.event_weight(now_ms));
    }

    /// Weight of event knowledge at `now_ms`: 1 while younger than half the allowed age, then
    /// falling linearly to 0 at the limit.
    pub fn event_weight(&self, now_ms: u64) -> f64 {
        let Some(at) = self.events_checked_at_ms else { return 1.0 };
        let age = now_ms.saturating_sub(at) as f64;
        let max = self.trust.max_age_ms.max(1) as f64;
        if age <= max / 2.0 {
            1.0
        } else {
            ((max - age) / (max / 2.0)).clamp(0.0, 1.0)
        }
    }

    /// Drops expired observations from the old end of each worker's list.
    fn purge(limits: &IndexLimits, w: &mut WorkerBlocks, holders: &mut Holders, now_ms: u64) {
        while let Some((_, o)) = w.blocks.front() {
            if limits.alive(o, now_ms) {
                break;
            }
            if let Some((h, _)) = w.blocks.pop_front() {
                holders.clear(h, w.id, OBSERVED);
            }
        }
    }
}

/// One worker's prefix lookup at one instant: what each block is credited as.
struct Walk<'a> {
    w: &'a WorkerBlocks,
    /// The worker's event view counts: the updater's confirmation is fresh.
    events: bool,
    /// The event view's `observed_at_ms`, read once.
    events_at_ms: u64,
    /// With fresh events, older guesses are superseded by what the engine reported.
    superseded_before: u64,
    limits: &'a IndexLimits,
    now_ms: u64,
}

impl<'a> Walk<'a> {
    fn new(ix: &'a KnowledgeIndex, w: &'a WorkerBlocks, now_ms: u64) -> Walk<'a> {
        let events = w.events.as_ref().filter(|_| ix.event_state(now_ms).1);
        let events_at_ms = events.map_or(0, |e| e.observed_at_ms);
        let superseded_before =
            events.map_or(0, |_| events_at_ms.saturating_sub(ix.trust.grace_ms));
        let events = events.is_some();
        Walk { w, events, events_at_ms, superseded_before, limits: &ix.limits, now_ms }
    }

    /// Credits block `h` to `m` given where the worker has it (`flags`, see [`holders`]): its
    /// event view's GPU tier first, then a live observation not superseded by events, then
    /// its event view's lower tier. `false`: not credited, the match ends before it.
    fn credit(&self, h: u64, flags: u32, m: &mut PrefixMatch) -> bool {
        let now_ms = self.now_ms;
        let events = self.events;
        let event = |m: &mut PrefixMatch| {
            m.blocks += 1;
            m.from_events += 1;
            m.oldest_age_ms = m.oldest_age_ms.max(now_ms.saturating_sub(self.events_at_ms));
        };
        if events && flags & GPU != 0 {
            event(m);
            return true;
        }
        let observed = (flags & OBSERVED != 0)
            .then(|| self.w.blocks.get(&h))
            .flatten()
            .filter(|o| self.limits.alive(o, now_ms) && o.at_ms >= self.superseded_before);
        if let Some(o) = observed {
            m.blocks += 1;
            m.oldest_age_ms = m.oldest_age_ms.max(now_ms.saturating_sub(o.at_ms));
            if o.source == Source::KvEvent {
                m.from_events += 1;
            }
            if o.source == Source::Peer {
                m.from_peers += 1;
            }
            if matches!(o.source, Source::Routed | Source::Peer) {
                let age = now_ms.saturating_sub(o.at_ms);
                m.routed_age_ms = Some(m.routed_age_ms.map_or(age, |a| a.min(age)));
            }
            return true;
        }
        if events && flags & OFFLOADED != 0 {
            event(m);
            m.offloaded += 1;
            return true;
        }
        false
    }
}

/// Fades `m`'s event credit by the event `weight` ([`KnowledgeIndex::event_weight`]).
fn fade(m: &mut PrefixMatch, weight: f64) {
    if m.from_events > 0 && weight < 1.0 {
        let kept = (m.from_events as f64 * weight) as usize;
        m.blocks -= m.from_events - kept;
        m.from_events = kept;
        m.offloaded = m.offloaded.min(kept);
    }
}

/// Takes every block of an event view off its worker's holder records.
fn unlist_view(holders: &mut Holders, id: u32, view: &EventView) {
    view.blocks.iter().for_each(|&h| holders.clear(h, id, GPU));
    view.offloaded.iter().for_each(|&h| holders.clear(h, id, OFFLOADED));
}
