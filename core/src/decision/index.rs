//! The knowledge index: which block hashes each worker is believed to hold, from which source,
//! and since when. Bounded per worker (LRU) and aged (TTL per source).

use std::collections::HashMap;

use foldhash::fast::RandomState as Fast;

use hashlink::LinkedHashMap;

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
    blocks: LinkedHashMap<u64, Observation>,
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
    workers: HashMap<String, WorkerBlocks, Fast>,
}

impl KnowledgeIndex {
    pub fn new(limits: IndexLimits) -> Self {
        Self::with_trust(limits, EventTrust::default())
    }

    pub fn with_trust(limits: IndexLimits, trust: EventTrust) -> Self {
        KnowledgeIndex { limits, trust, events_checked_at_ms: None, workers: HashMap::default() }
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
        let w = self.workers.entry(worker.to_owned()).or_default();
        w.events = Some(EventView {
            blocks: gpu.iter().copied().collect(),
            offloaded: offloaded.iter().copied().collect(),
            observed_at_ms,
        });
    }

    /// Changes `worker`'s event view: optionally empties it, then removes and adds per tier.
    pub fn change_events(&mut self, worker: &str, change: EventChange<'_>, observed_at_ms: u64) {
        let w = self.workers.entry(worker.to_owned()).or_default();
        let view = w.events.get_or_insert_with(EventView::default);
        if change.reset {
            view.blocks.clear();
            view.offloaded.clear();
        }
        for h in change.gpu_remove {
            view.blocks.remove(h);
        }
        view.blocks.extend(change.gpu_add.iter().copied());
        for h in change.offloaded_remove {
            view.offloaded.remove(h);
        }
        view.offloaded.extend(change.offloaded_add.iter().copied());
        view.observed_at_ms = observed_at_ms;
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
        let w = self.workers.entry(worker.to_owned()).or_default();
        for &h in hashes {
            // `insert` replaces a known block's observation and moves it to the back (newest).
            w.blocks.insert(h, Observation { source, at_ms: now_ms });
        }
        while w.blocks.len() > limits.max_blocks_per_worker {
            w.blocks.pop_front();
        }
        Self::purge(&limits, w, now_ms);
    }

    /// Forgets `hashes` on `worker`.
    pub fn remove(&mut self, worker: &str, hashes: &[u64]) {
        if let Some(w) = self.workers.get_mut(worker) {
            for h in hashes {
                w.blocks.remove(h);
            }
        }
    }

    /// Takes back routing credit: forgets those of `hashes` on `worker` that only routing
    /// history vouches for (feedback and events stay).
    pub fn retract_routed(&mut self, worker: &str, hashes: &[u64]) {
        if let Some(w) = self.workers.get_mut(worker) {
            for h in hashes {
                if w.blocks.get(h).is_some_and(|o| o.source == Source::Routed) {
                    w.blocks.remove(h);
                }
            }
        }
    }

    /// Forgets everything about `worker`.
    pub fn clear_worker(&mut self, worker: &str) {
        self.workers.remove(worker);
    }

    /// Number of blocks currently remembered for `worker` (expired ones may still count
    /// until purged).
    pub fn len(&self, worker: &str) -> usize {
        self.workers.get(worker).map_or(0, |w| w.blocks.len())
    }

    pub fn is_empty(&self) -> bool {
        self.workers.values().all(|w| w.blocks.is_empty())
    }

    /// Longest run of leading `hashes` that `worker` is believed to hold, ignoring expired
    /// observations.
    pub fn prefix_match(&self, worker: &str, hashes: &[u64], now_ms: u64) -> PrefixMatch {
        let mut m = PrefixMatch::default();
        let Some(w) = self.workers.get(worker) else {
            return m;
        };
        let events = w.events.as_ref().filter(|_| self.event_state(now_ms).1);
        // With fresh events, older guesses are superseded by what the engine reported.
        let superseded_before =
            events.map_or(0, |e| e.observed_at_ms.saturating_sub(self.trust.grace_ms));
        for h in hashes {
            if let Some(e) = events.filter(|e| e.blocks.contains(h)) {
                m.blocks += 1;
                m.from_events += 1;
                m.oldest_age_ms = m.oldest_age_ms.max(now_ms.saturating_sub(e.observed_at_ms));
                continue;
            }
            match w
                .blocks
                .get(h)
                .filter(|o| self.limits.alive(o, now_ms) && o.at_ms >= superseded_before)
            {
                Some(o) => {
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
                }
                None => match events.filter(|e| e.offloaded.contains(h)) {
                    Some(e) => {
                        m.blocks += 1;
                        m.from_events += 1;
                        m.offloaded += 1;
                        m.oldest_age_ms =
                            m.oldest_age_ms.max(now_ms.saturating_sub(e.observed_at_ms));
                    }
                    None => break,
                },
            }
        }
        // Credit from events fades over the second half of their allowed age.
        let w = self.event_weight(now_ms);
        if m.from_events > 0 && w < 1.0 {
            let kept = (m.from_events as f64 * w) as usize;
            m.blocks -= m.from_events - kept;
            m.from_events = kept;
            m.offloaded = m.offloaded.min(kept);
        }
        m
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
    fn purge(limits: &IndexLimits, w: &mut WorkerBlocks, now_ms: u64) {
        while let Some((_, o)) = w.blocks.front() {
            if limits.alive(o, now_ms) {
                break;
            }
            w.blocks.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    const LIMITS: IndexLimits = IndexLimits {
        max_blocks_per_worker: 8,
        routed_ttl_ms: 1000,
        feedback_ttl_ms: 5000,
        event_ttl_ms: 0,
        peer_ttl_ms: 1000,
    };

    #[test]
    fn prefix_stops_at_first_gap_and_reports_age() {
        let mut ix = KnowledgeIndex::new(LIMITS);
        ix.insert("a", &[1, 2, 3], Source::Routed, 100);
        ix.insert("a", &[5], Source::KvEvent, 200);
        let m = ix.prefix_match("a", &[1, 2, 3, 4, 5], 300);
        let want = PrefixMatch {
            blocks: 3,
            oldest_age_ms: 200,
            from_events: 0,
            offloaded: 0,
            routed_age_ms: Some(200),
            from_peers: 0,
        };
        assert_eq!(m, want);
        assert_eq!(ix.prefix_match("b", &[1], 300).blocks, 0);
    }

    #[test]
    fn a_retraction_takes_back_routing_credit_only() {
        let mut ix = KnowledgeIndex::new(LIMITS);
        ix.insert("a", &[1, 2], Source::Feedback, 0);
        ix.insert("a", &[3, 4], Source::Routed, 0);
        ix.insert("b", &[1, 2, 3, 4], Source::Routed, 0);
        ix.retract_routed("a", &[1, 2, 3, 4]);
        assert_eq!(ix.prefix_match("a", &[1, 2, 3, 4], 10).blocks, 2, "feedback stays");
        assert_eq!(ix.prefix_match("b", &[1, 2, 3, 4], 10).blocks, 4, "other workers untouched");
        ix.retract_routed("nobody", &[1]);
    }

    #[test]
    fn routed_knowledge_expires_events_do_not() {
        let mut ix = KnowledgeIndex::new(LIMITS);
        ix.insert("a", &[1], Source::Routed, 0);
        ix.insert("a", &[2], Source::KvEvent, 0);
        assert_eq!(ix.prefix_match("a", &[1], 999).blocks, 1);
        assert_eq!(ix.prefix_match("a", &[1], 1000).blocks, 0);
        assert_eq!(ix.prefix_match("a", &[2], 1_000_000).blocks, 1);
    }

    #[test]
    fn memory_is_bounded_per_worker() {
        let mut ix = KnowledgeIndex::new(LIMITS);
        let hashes: Vec<u64> = (0..100).collect();
        ix.insert("a", &hashes, Source::KvEvent, 0);
        assert_eq!(ix.len("a"), 8);
        assert_eq!(ix.prefix_match("a", &[92, 93], 0).blocks, 2);
        ix.clear_worker("a");
        assert!(ix.is_empty());
    }

    #[test]
    fn fresh_events_supersede_older_guesses_and_stale_events_are_ignored() {
        let trust = EventTrust { max_age_ms: 1000, grace_ms: 100 };
        let mut ix = KnowledgeIndex::with_trust(LIMITS_LONG, trust);
        ix.insert("a", &[1, 2, 3], Source::Feedback, 0);
        assert_eq!(ix.prefix_match("a", &[1, 2, 3], 50).blocks, 3);
        // Events at t=500 report only block 1: the older guesses about 2 and 3 give way.
        ix.set_events("a", &[1], &[], 500);
        ix.events_checked(500);
        assert_eq!(ix.event_state(600), (true, true));
        let m = ix.prefix_match("a", &[1, 2, 3], 600);
        assert_eq!((m.blocks, m.from_events), (1, 1));
        // A prediction made after the last event still counts.
        ix.insert("a", &[1, 2], Source::Routed, 700);
        assert_eq!(ix.prefix_match("a", &[1, 2, 3], 750).blocks, 2);
        // Three quarters of the allowed age: event credit is halved.
        ix.set_events("a", &[1, 2, 3, 4], &[], 500);
        assert_eq!(ix.prefix_match("a", &[1, 2, 3, 4], 500 + 750).from_events, 2);
        ix.set_events("a", &[1], &[], 500);
        // Unconfirmed for longer than max_age: events are ignored, history counts again.
        assert_eq!(ix.event_state(2000), (true, false));
        assert_eq!(ix.prefix_match("a", &[1, 2, 3], 2000).from_events, 0);
        assert_eq!(ix.prefix_match("a", &[1, 2, 3], 2000).blocks, 3);
    }

    const LIMITS_LONG: IndexLimits = IndexLimits {
        max_blocks_per_worker: 64,
        routed_ttl_ms: 100_000,
        feedback_ttl_ms: 100_000,
        event_ttl_ms: 0,
        peer_ttl_ms: 1000,
    };

    /// The obviously-correct reference: a recency-ordered list per worker.
    #[derive(Default)]
    struct Naive {
        workers: HashMap<String, Vec<(u64, Observation)>>,
    }

    impl Naive {
        fn insert(&mut self, w: &str, hashes: &[u64], source: Source, now: u64) {
            let list = self.workers.entry(w.into()).or_default();
            for &h in hashes {
                list.retain(|(x, _)| *x != h);
                list.push((h, Observation { source, at_ms: now }));
            }
            while list.len() > LIMITS.max_blocks_per_worker {
                list.remove(0);
            }
            while list.first().is_some_and(|(_, o)| !LIMITS.alive(o, now)) {
                list.remove(0);
            }
        }
        fn remove(&mut self, w: &str, hashes: &[u64]) {
            if let Some(list) = self.workers.get_mut(w) {
                list.retain(|(x, _)| !hashes.contains(x));
            }
        }
        fn prefix(&self, w: &str, hashes: &[u64], now: u64) -> usize {
            let Some(list) = self.workers.get(w) else {
                return 0;
            };
            hashes
                .iter()
                .take_while(|h| list.iter().any(|(x, o)| x == *h && LIMITS.alive(o, now)))
                .count()
        }
    }

    #[test]
    fn differential_against_naive_reference() {
        for seed in 0..20u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut ix = KnowledgeIndex::new(LIMITS);
            let mut naive = Naive::default();
            let mut now = 0u64;
            for _ in 0..400 {
                now += rng.random_range(0..300);
                let w = ["a", "b", "c"][rng.random_range(0..3)];
                let hashes: Vec<u64> =
                    (0..rng.random_range(1..6)).map(|_| rng.random_range(0..16)).collect();
                match rng.random_range(0..10) {
                    0..=4 => {
                        let src = [Source::Routed, Source::KvEvent, Source::Feedback]
                            [rng.random_range(0..3)];
                        ix.insert(w, &hashes, src, now);
                        naive.insert(w, &hashes, src, now);
                    }
                    5 => {
                        ix.remove(w, &hashes);
                        naive.remove(w, &hashes);
                    }
                    _ => assert_eq!(
                        ix.prefix_match(w, &hashes, now).blocks,
                        naive.prefix(w, &hashes, now),
                        "seed {seed}"
                    ),
                }
            }
        }
    }
}
