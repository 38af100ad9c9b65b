//! A thread's view of other replicas' in-flight load: what the updater's peer sections said,
//! less this replica's own entries, each load counting until its `load_ttl_ms` runs out.

use std::collections::HashMap;

use crate::decision::load::WorkerLoad;
use crate::wire::peers::{PeerCredit, PeerLoad, PeerSection};

/// Peer loads by worker key, and which replica this thread belongs to.
#[derive(Debug, Default)]
pub struct PeerView {
    replica: u64,
    load_ttl_ms: u64,
    loads: HashMap<u64, Vec<PeerLoad>, crate::decision::worker::ByKey>,
}

impl PeerView {
    /// This replica's id: its own entries coming back are ignored (0: none known yet).
    pub fn set_replica(&mut self, replica: u64) {
        self.replica = replica;
        for list in self.loads.values_mut() {
            list.retain(|l| l.replica != replica);
        }
    }

    pub fn replica(&self) -> u64 {
        self.replica
    }

    /// Takes in a section (`full`: a snapshot's whole view, which replaces every load; else a
    /// delta's changes) and returns the credits of other replicas, for the index.
    pub fn apply<'a>(
        &mut self,
        section: &'a PeerSection,
        full: bool,
    ) -> impl Iterator<Item = &'a PeerCredit> + 'a {
        if full {
            self.loads.clear();
        }
        self.load_ttl_ms = section.load_ttl_ms;
        for l in section.loads.iter().filter(|l| l.replica != self.replica) {
            let list = self.loads.entry(l.worker_key).or_default();
            list.retain(|x| x.replica != l.replica);
            if !l.is_zero() {
                list.push(*l);
            }
        }
        self.loads.retain(|_, list| !list.is_empty());
        let own = self.replica;
        section.credits.iter().filter(move |c| c.replica != own)
    }

    /// The in-flight work other replicas sent to the worker whose
    /// [`worker_key`](crate::decision::load::worker_key) is `worker` and still hold, per their
    /// last live report.
    pub fn load(&self, worker: u64, now_ms: u64) -> WorkerLoad {
        if self.loads.is_empty() {
            return WorkerLoad::default();
        }
        let Some(list) = self.loads.get(&worker) else {
            return WorkerLoad::default();
        };
        list.iter()
            .filter(|l| now_ms.saturating_sub(l.at_ms) < self.load_ttl_ms)
            .fold(WorkerLoad::default(), |acc, l| acc.plus(as_load(l)))
    }
}

/// A peer's reported load as a decision counts it.
fn as_load(l: &PeerLoad) -> WorkerLoad {
    WorkerLoad {
        inflight_requests: l.inflight.max(l.prefilling),
        prefilling_requests: l.prefilling,
        prefill_tokens: l.prefill_tokens,
        prefill_elapsed_ms: 0,
        // Reports carry totals only: the tokens taken as evenly split (a lower bound).
        prefill_sq_tokens: WorkerLoad::even_sq_tokens(l.prefill_tokens, l.prefilling),
        arriving_tokens_per_s: u64::from(l.arriving_tokens_per_s),
        behind_tokens: 0,
        passing_tokens_per_s: 0,
    }
}
