//! Publication of the updater's knowledge as versioned snapshots plus sequenced deltas.
//!
//! Every publication that changes something gets the next version and a [`Delta`] from the
//! previous one, kept in a bounded ring. A caller at version `v` gets the composed delta
//! `v -> current` while the ring still reaches back to `v`, a full snapshot otherwise, and
//! nothing (304) when it is current. Versions start at the start time in microseconds, so they
//! keep increasing across an updater restart and a caller never mistakes a new history for
//! its old one.

use std::collections::VecDeque;

use kvroute_core::wire::delta::{Delta, SetChange, WorkerDelta};
use kvroute_core::wire::peers::PeerSection;
use kvroute_core::wire::snapshot::{
    ModelInfo, Snapshot, SnapshotLoad, SnapshotWorker, WorkerPlacement,
};

/// What a caller at some version should receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    NotModified,
    Full(Snapshot),
    Delta(Delta),
}

impl Answer {
    /// The answer for a caller that does not read the list of workers down (`health=1`):
    /// without it, so that the bytes are what such a caller has always been sent.
    pub fn without_health(self) -> Answer {
        match self {
            Answer::Full(mut s) => {
                s.down.clear();
                Answer::Full(s)
            }
            Answer::Delta(mut d) => {
                d.down = None;
                Answer::Delta(d)
            }
            other => other,
        }
    }

    /// The answer for a caller that does not read the workers' placements (`placement=1`):
    /// without them, so that the bytes are what such a caller has always been sent.
    pub fn without_placement(self) -> Answer {
        match self {
            Answer::Full(mut s) => {
                s.placements.clear();
                Answer::Full(s)
            }
            Answer::Delta(mut d) => {
                d.placements = None;
                Answer::Delta(d)
            }
            other => other,
        }
    }

    /// The answer for a caller that does not read other replicas' arrivals (`arrivals=1`):
    /// their peer loads without them, so that the bytes are what such a caller has always
    /// been sent.
    pub fn without_arrivals(self) -> Answer {
        match self {
            Answer::Full(mut s) => {
                s.peers = s.peers.map(PeerSection::without_arrivals);
                Answer::Full(s)
            }
            Answer::Delta(mut d) => {
                d.peers = d.peers.map(PeerSection::without_arrivals);
                Answer::Delta(d)
            }
            other => other,
        }
    }

    /// The answer for a caller that does not read the pool flag or removed workers (snapshot
    /// formats 3/4, delta formats 2/3): no flag, and each removed worker as an incompatible
    /// worker that holds nothing, so that no cache credit stays with it.
    pub fn without_pool(self) -> Answer {
        match self {
            Answer::Full(mut s) => {
                s.pool = false;
                Answer::Full(s)
            }
            Answer::Delta(mut d) => {
                d.pool = false;
                for w in std::mem::take(&mut d.removed) {
                    d.workers.retain(|k| k.worker != w);
                    d.workers.push(WorkerDelta {
                        worker: w,
                        observed_at_ms: 0,
                        compatible: false,
                        load: None,
                        reset: true,
                        model: None,
                        adapters: Some(Vec::new()),
                        gpu: SetChange::default(),
                        offloaded: SetChange::default(),
                    });
                }
                Answer::Delta(d)
            }
            other => other,
        }
    }
}

/// What changed since the last publication ([`Publisher::publish_changes`]).
#[derive(Debug, Clone, Default)]
pub struct Changes {
    /// Workers whose state changed (hash lists sorted), each sent as it is now.
    pub workers: Vec<SnapshotWorker>,
    /// Workers the snapshot lists whose scraped load alone changed: only their head is sent,
    /// and their hash lists are neither rebuilt nor compared. A worker the snapshot does not
    /// list yet is skipped: it belongs in `workers`.
    pub loads: Vec<(String, Option<SnapshotLoad>)>,
    /// Workers that left the pool.
    pub removed: Vec<String>,
}

/// Bounds of the delta ring.
#[derive(Debug, Clone, Copy)]
pub struct RingLimits {
    pub max_deltas: usize,
    /// Total hashes held by the ring's deltas.
    pub max_hashes: usize,
}

impl Default for RingLimits {
    fn default() -> Self {
        RingLimits { max_deltas: 512, max_hashes: 4 << 20 }
    }
}

#[derive(Debug)]
pub struct Publisher {
    current: Snapshot,
    ring: VecDeque<(Delta, usize)>,
    ring_hashes: usize,
    limits: RingLimits,
}

fn hashes_in(d: &Delta) -> usize {
    d.models.as_ref().map_or(0, Vec::len)
        + d.workers
            .iter()
            .map(|w| {
                w.gpu.add.len()
                    + w.gpu.remove.len()
                    + w.offloaded.add.len()
                    + w.offloaded.remove.len()
                    + 1
            })
            .sum::<usize>()
        + d.peers.as_ref().map_or(0, PeerSection::weight)
        + d.placements.as_ref().map_or(0, Vec::len)
}

impl Publisher {
    pub fn new(start_ms: u64, limits: RingLimits) -> Publisher {
        Publisher {
            current: Snapshot {
                version: start_ms.saturating_mul(1000),
                generated_at_ms: start_ms,
                ..Snapshot::default()
            },
            ring: VecDeque::new(),
            ring_hashes: 0,
            limits,
        }
    }

    pub fn version(&self) -> u64 {
        self.current.version
    }

    /// Marks the snapshot as the whole pool (or not); true when that changed, which is a
    /// version of its own.
    pub fn set_pool(&mut self, pool: bool) -> bool {
        if self.current.pool == pool {
            return false;
        }
        self.current.pool = pool;
        // Receivers holding the other kind of snapshot must start over from a full one.
        self.ring.clear();
        self.ring_hashes = 0;
        self.current.version += 1;
        true
    }

    /// Sets the workers down (Envoy's health checking dropped them; sorted): a version of its
    /// own when the list changed. True when it did.
    pub fn set_down(&mut self, down: Vec<String>, now_ms: u64) -> bool {
        if self.current.down == down {
            return false;
        }
        self.current.down.clone_from(&down);
        self.push_section(now_ms, Delta { down: Some(down), ..Delta::default() });
        true
    }

    /// A version of its own for a changed section of the snapshot: `section` is the delta
    /// carrying it; its versions, time and pool flag are filled in here.
    fn push_section(&mut self, now_ms: u64, section: Delta) {
        self.current.generated_at_ms = now_ms;
        let from = self.current.version;
        self.current.version += 1;
        let delta = Delta {
            from_version: from,
            to_version: self.current.version,
            generated_at_ms: now_ms,
            pool: self.current.pool,
            ..section
        };
        self.push(delta);
    }

    /// Sets the workers' placements (sorted by worker): a version of its own when the list
    /// changed (a label or its age). True when it did.
    pub fn set_placements(&mut self, placements: Vec<WorkerPlacement>, now_ms: u64) -> bool {
        if self.current.placements == placements {
            return false;
        }
        self.current.placements.clone_from(&placements);
        self.push_section(now_ms, Delta { placements: Some(placements), ..Delta::default() });
        true
    }

    fn push(&mut self, delta: Delta) {
        let n = hashes_in(&delta);
        self.ring.push_back((delta, n));
        self.ring_hashes += n;
        while self.ring.len() > self.limits.max_deltas || self.ring_hashes > self.limits.max_hashes
        {
            match self.ring.pop_front() {
                Some((_, n)) => self.ring_hashes -= n,
                None => break,
            }
        }
    }

    /// The current full snapshot.
    pub fn full(&self) -> &Snapshot {
        &self.current
    }

    /// Publishes the new state of `changed` workers (hash lists sorted) and, when given, the
    /// new model list; a new version only when something differs.
    pub fn publish(
        &mut self,
        changed: Vec<SnapshotWorker>,
        models: Option<Vec<ModelInfo>>,
        now_ms: u64,
    ) -> bool {
        self.publish_with_peers(changed, models, None, now_ms)
    }

    /// [`Publisher::publish`] with other replicas' changes (`peers`), which alone also make a
    /// new version. The full snapshot does not hold peers: the caller adds its live view.
    pub fn publish_with_peers(
        &mut self,
        changed: Vec<SnapshotWorker>,
        models: Option<Vec<ModelInfo>>,
        peers: Option<PeerSection>,
        now_ms: u64,
    ) -> bool {
        self.publish_changes(
            Changes { workers: changed, ..Changes::default() },
            models,
            peers,
            now_ms,
        )
    }

    /// Whether the snapshot lists `worker` (its hash lists are there to keep).
    pub fn lists(&self, worker: &str) -> bool {
        self.position(worker).is_ok()
    }

    /// Where `worker` is in the snapshot's workers (kept in name order), or where it would go.
    fn position(&self, worker: &str) -> Result<usize, usize> {
        self.current.workers.binary_search_by(|k| k.worker.as_str().cmp(worker))
    }

    /// [`Publisher::publish_with_peers`] of `changes`: workers whose state changed, workers
    /// whose load alone changed, and workers that left the pool (they leave the snapshot, and
    /// the delta names them).
    pub fn publish_changes(
        &mut self,
        changes: Changes,
        models: Option<Vec<ModelInfo>>,
        peers: Option<PeerSection>,
        now_ms: u64,
    ) -> bool {
        let mut gone: Vec<String> = Vec::new();
        for w in changes.removed {
            if let Ok(i) = self.position(&w) {
                self.current.workers.remove(i);
                gone.push(w);
            }
        }
        gone.sort();
        let models = models.filter(|m| *m != self.current.models);
        if let Some(m) = &models {
            self.current.models.clone_from(m);
        }
        let mut workers = Vec::new();
        for w in changes.workers {
            let i = self.position(&w.worker);
            if let Some(d) = WorkerDelta::between(i.ok().map(|i| &self.current.workers[i]), &w) {
                workers.push(d);
            }
            match i {
                Ok(i) => self.current.workers[i] = w,
                Err(i) => self.current.workers.insert(i, w),
            }
        }
        for (name, load) in changes.loads {
            let Ok(i) = self.position(&name) else { continue };
            let w = &mut self.current.workers[i];
            if w.load == load {
                continue;
            }
            w.load = load;
            // What `WorkerDelta::between` makes of a change of the load alone, without
            // reading the hash lists.
            workers.push(WorkerDelta {
                worker: name,
                observed_at_ms: w.observed_at_ms,
                compatible: w.compatible,
                load,
                reset: false,
                model: None,
                adapters: None,
                gpu: SetChange::default(),
                offloaded: SetChange::default(),
            });
        }
        self.current.generated_at_ms = now_ms;
        if workers.is_empty() && models.is_none() && peers.is_none() && gone.is_empty() {
            return false;
        }
        let from = self.current.version;
        self.current.version += 1;
        let delta = Delta {
            from_version: from,
            to_version: self.current.version,
            generated_at_ms: now_ms,
            models,
            workers,
            peers,
            pool: self.current.pool,
            removed: gone,
            down: None,
            placements: None,
        };
        self.push(delta);
        true
    }

    /// What a caller at `since` (none: it has nothing) should receive.
    pub fn answer(&self, since: Option<u64>) -> Answer {
        let Some(since) = since.filter(|v| *v > 0) else {
            return Answer::Full(self.current.clone());
        };
        if since == self.current.version {
            return Answer::NotModified;
        }
        let start = self.ring.iter().position(|(d, _)| d.from_version == since);
        let composed = start.and_then(|i| {
            let tail: Vec<Delta> = self.ring.iter().skip(i).map(|(d, _)| d.clone()).collect();
            Delta::compose(&tail)
        });
        match composed {
            Some(mut d) => {
                d.generated_at_ms = self.current.generated_at_ms;
                Answer::Delta(d)
            }
            None => Answer::Full(self.current.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn w(name: &str, gpu: &[u64]) -> SnapshotWorker {
        SnapshotWorker {
            worker: name.into(),
            observed_at_ms: 1,
            compatible: true,
            gpu: gpu.to_vec(),
            offloaded: vec![],
            load: None,
            ..Default::default()
        }
    }

    #[test]
    fn callers_get_a_delta_a_full_snapshot_or_nothing() {
        let mut p = Publisher::new(5, RingLimits { max_deltas: 2, max_hashes: 1000 });
        let v0 = p.version();
        assert_eq!(v0, 5000);
        assert!(p.publish(vec![w("a", &[1]), w("b", &[2])], None, 10));
        assert!(!p.publish(vec![w("a", &[1])], None, 11), "no change, no version");
        assert!(p.publish(vec![w("a", &[1, 3])], None, 12));
        let v2 = p.version();
        assert_eq!(p.answer(Some(v2)), Answer::NotModified);
        let Answer::Delta(d) = p.answer(Some(v0 + 1)) else { panic!("expected a delta") };
        assert_eq!((d.from_version, d.to_version), (v0 + 1, v2));
        assert_eq!(d.workers.len(), 1);
        let mut s = match p.answer(None) {
            Answer::Full(s) => s,
            other => panic!("{other:?}"),
        };
        assert_eq!(s.version, v2);
        // Older than the ring (bound 2): a full snapshot.
        assert!(p.publish(vec![w("b", &[])], None, 13));
        assert!(matches!(p.answer(Some(v0)), Answer::Full(_)));
        // Unknown versions (another updater's history) also get a full snapshot.
        assert!(matches!(p.answer(Some(42)), Answer::Full(_)));
        let Answer::Delta(d) = p.answer(Some(v2)) else { panic!("expected a delta") };
        s.apply_delta(&d).unwrap();
        assert_eq!(&s, p.full());
    }

    #[test]
    fn a_model_list_change_is_a_version_of_its_own() {
        let mut p = Publisher::new(5, RingLimits::default());
        let v0 = p.version();
        let m = vec![ModelInfo { name: "m".into(), fingerprint: 1, block_size: 0 }];
        assert!(p.publish(vec![], Some(m.clone()), 6));
        assert!(!p.publish(vec![], Some(m.clone()), 7), "the same list again is no change");
        let learned = vec![ModelInfo { block_size: 16, ..m[0].clone() }];
        assert!(p.publish(vec![w("a", &[1])], Some(learned.clone()), 8));
        let Answer::Delta(d) = p.answer(Some(v0)) else { panic!("expected a delta") };
        assert_eq!(d.models, Some(learned.clone()));
        let Answer::Full(s) = p.answer(None) else { panic!("expected a snapshot") };
        assert_eq!(s.models, learned);
    }

    #[test]
    fn workers_down_are_a_version_of_their_own_and_only_for_callers_that_ask() {
        let mut p = Publisher::new(5, RingLimits::default());
        assert!(p.publish(vec![w("a", &[1]), w("b", &[2])], None, 6));
        let v1 = p.version();
        assert!(p.set_down(vec!["b".into()], 7));
        assert!(!p.set_down(vec!["b".into()], 8), "the same list again is no change");
        let Answer::Delta(d) = p.answer(Some(v1)) else { panic!("expected a delta") };
        assert_eq!(d.down, Some(vec!["b".to_string()]));
        let Answer::Delta(old) = p.answer(Some(v1)).without_health() else { panic!() };
        assert_eq!(old.down, None);
        assert_eq!(old.encode()[4], kvroute_core::wire::delta::DELTA_FORMAT, "as before: format 2");
        let Answer::Full(s) = p.answer(None) else { panic!("expected a snapshot") };
        assert_eq!(s.down, vec!["b".to_string()]);
        let Answer::Full(old) = p.answer(None).without_health() else { panic!() };
        assert_eq!(old.encode()[4], kvroute_core::wire::snapshot::SNAPSHOT_FORMAT, "as before");
        assert!(p.set_down(vec![], 9), "b is back");
        let Answer::Delta(d) = p.answer(Some(v1)) else { panic!("expected a delta") };
        assert_eq!(d.down, Some(vec![]), "composed: the latest list");
        let mut at_v1 = s.clone();
        at_v1.version = v1;
        at_v1.down.clear();
        at_v1.apply_delta(&d).unwrap();
        assert_eq!(&at_v1, p.full());
    }

    #[test]
    fn the_ring_is_bounded_by_hashes() {
        let mut p = Publisher::new(1, RingLimits { max_deltas: 100, max_hashes: 50 });
        for i in 0..20u64 {
            p.publish(vec![w("a", &(0..i * 10).collect::<Vec<_>>())], None, i);
        }
        assert!(p.ring_hashes <= 50);
        assert!(p.ring.len() < 20);
    }

    /// A change of the load alone, published as a head (`Changes::loads`), gives the same
    /// deltas and snapshots as the whole worker published again: seeded random histories of
    /// stores, loads, removals and returns, side by side.
    #[test]
    fn a_load_alone_publishes_as_the_whole_worker_would() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        const NAMES: [&str; 5] = ["w3", "w1", "w4", "w0", "w2"];
        for seed in 0..100u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let limits = RingLimits { max_deltas: 8, max_hashes: 200 };
            let (mut whole, mut heads) = (Publisher::new(1, limits), Publisher::new(1, limits));
            let mut state: BTreeMap<&str, SnapshotWorker> = BTreeMap::new();
            for step in 0..60u64 {
                let now = 10 + step;
                let name = NAMES[rng.random_range(0..NAMES.len())];
                let (mut a, mut b) = (Changes::default(), Changes::default());
                match rng.random_range(0..6) {
                    0 | 1 => {
                        let gpu: Vec<u64> =
                            (0..rng.random_range(0..5)).map(|_| rng.random_range(0..9)).collect();
                        let mut sw = w(name, &gpu);
                        sw.gpu.sort_unstable();
                        sw.gpu.dedup();
                        sw.observed_at_ms = now;
                        sw.load = state.get(name).and_then(|s| s.load);
                        state.insert(name, sw.clone());
                        a.workers.push(sw.clone());
                        b.workers.push(sw);
                    }
                    2..=4 => {
                        let load = rng.random_bool(0.8).then(|| SnapshotLoad {
                            running: rng.random_range(0..3),
                            waiting: rng.random_range(0..2),
                            observed_at_ms: now,
                        });
                        let Some(sw) = state.get_mut(name) else { continue };
                        sw.load = load;
                        a.workers.push(sw.clone());
                        b.loads.push((name.to_owned(), load));
                    }
                    _ => {
                        if state.remove(name).is_some() {
                            a.removed.push(name.to_owned());
                            b.removed.push(name.to_owned());
                        }
                    }
                }
                let before = whole.version();
                assert_eq!(
                    whole.publish_changes(a, None, None, now),
                    heads.publish_changes(b, None, None, now),
                    "seed {seed} step {step}"
                );
                assert_eq!(whole.full(), heads.full(), "seed {seed} step {step}");
                for since in [None, Some(before), Some(whole.version()), Some(2000)] {
                    assert_eq!(whole.answer(since), heads.answer(since), "seed {seed} step {step}");
                }
            }
        }
    }
}
