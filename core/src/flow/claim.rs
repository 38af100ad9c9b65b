//! A decision's claim on its worker: the new request written into this thread's load shard,
//! ordered against the decisions the other threads of this Envoy made at the same instant
//! (see [`crate::shared::epoch`]). A decision whose view missed another thread's is ranked
//! again on a fresh view before anything is sent.

use crate::decision::router::Decision;
use crate::shared::epoch::{Advance, Epoch};
use crate::shared::load::{LoadView, Shard, Ticket};
use crate::shared::{Counters, SharedStore};

/// The tickets of a decision's new request in this thread's load shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The primary's.
    pub ticket: Ticket,
    /// A P/D pool's prefill worker's.
    pub prefill: Option<Ticket>,
}

/// What ordering the decision did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ordered {
    /// Another thread decided between this decision's view and its claim: ranked again.
    pub reranked: bool,
    /// The ranking again changed the primary.
    pub moved: bool,
}

/// Writes `decision`'s request into `shard` (and the shard into the store), then orders it
/// against the other threads' decisions since `epoch` was read (before the decision's load
/// view): when one came in between, takes the request back out, ranks again with `rerank`
/// (the decision so far, a fresh view; `None` keeps the decision), claims the new primary and advances the epoch
/// once more. `epoch: None` claims without ordering. `priority`: the engine priority the
/// request is sent with (0: none). Returns no claim when the decision has no primary.
#[allow(clippy::too_many_arguments)]
pub fn claim<S: SharedStore + ?Sized>(
    store: &S,
    counters: &dyn Counters,
    shard: &mut Shard,
    epoch: Option<Epoch>,
    decision: &mut Decision,
    priority: i32,
    now_ms: u64,
    rerank: impl FnOnce(&Decision, &LoadView) -> Option<Decision>,
) -> (Option<Claim>, Ordered) {
    let mut claimed = start(counters, shard, decision, priority, now_ms);
    shard.flush(store, counters, now_ms);
    let mut ordered = Ordered::default();
    if epoch.is_none_or(|e| e.advance(store) != Advance::Raced) {
        return (claimed, ordered);
    }
    if let Some(c) = claimed {
        end(shard, c);
    }
    let again = Epoch::read(store);
    let view = LoadView::read(store, counters, shard, now_ms);
    if let Some(d) = rerank(decision, &view) {
        let before = decision.primary().map(|s| s.worker.key());
        ordered.moved = d.primary().map(|s| s.worker.key()) != before;
        *decision = d;
    }
    ordered.reranked = true;
    claimed = start(counters, shard, decision, priority, now_ms);
    shard.flush(store, counters, now_ms);
    again.advance(store);
    (claimed, ordered)
}

/// Takes a claim back (the request was refused or not sent after all); the caller writes the
/// shard.
pub fn end(shard: &mut Shard, c: Claim) {
    shard.end(c.ticket);
    if let Some(t) = c.prefill {
        shard.end(t);
    }
}

fn start(
    counters: &dyn Counters,
    shard: &mut Shard,
    d: &Decision,
    priority: i32,
    now_ms: u64,
) -> Option<Claim> {
    let primary = d.primary()?;
    let ticket = shard.start_at(counters, &primary.worker, (d.uncached_tokens(), priority), now_ms);
    let prefill = d
        .prefill
        .first()
        .map(|p| shard.start_at(counters, &p.worker, (p.uncached_tokens, priority), now_ms));
    Some(Claim { ticket, prefill })
}
