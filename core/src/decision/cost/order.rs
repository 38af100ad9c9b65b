//! Ordered selection: candidates scored, the primary drawn among the ties, the rest by
//! increasing cost.
//!
//! A pool of up to [`MAX_RANKED`] workers is ranked whole. A larger pool is scored whole but
//! only its best [`MAX_RANKED`] are kept, in the order a whole ranking would give them (the
//! primary drawn among every tie of the pool, not only the kept ones). Kept after them, still
//! in cost order, are the workers admission and the look-ahead read beyond the best:
//! - the least promised TTFT and the least promised wait of the pool (admission's deadline
//!   and `max_wait_ms` checks compare against these minimums);
//! - the holder of the longest match with the least TTFT (where the look-ahead would place a
//!   hot prefix from).
//!
//! So the work per decision beyond scoring is bounded: no sort of the whole pool, no full
//! score moved or dropped per worker. The ranking's prefix equals the whole ranking's (a
//! differential test checks it over seeded random pools).

use std::borrow::Borrow;

use super::{estimate, Candidate, Estimate, Prompt, Reach, Score, Weigh};
use crate::decision::cost::Profile;
use crate::decision::worker::WorkerName;

/// How many workers a decision ranks in full: its primary and fallbacks.
pub const MAX_RANKED: usize = 64;

/// Ranks candidates by `cost = ttft + stall_weight · stall`: the primary is drawn (with `pick`,
/// a random number) among those within the tie band of the best cost that add the least
/// prefill work (fewest uncached tokens, within a block); the rest follow by increasing cost.
/// Equal costs are ordered by worker name. Empty in, empty out; a pool larger than
/// [`MAX_RANKED`] keeps its best and the workers the module documentation lists.
pub fn rank<W: Borrow<WorkerName>>(
    profile: &Profile,
    candidates: &[Candidate<W>],
    prompt_tokens: u64,
    block_size: u32,
    weigh: Weigh,
    pick: u64,
) -> Vec<Score> {
    rank_reached(profile, candidates, &[], prompt_tokens, block_size, weigh, pick)
}

/// [`rank`] with each candidate's [`Reach`] (`reaches[i]` for `candidates[i]`; missing ones
/// are zero).
pub fn rank_reached<W: Borrow<WorkerName>>(
    profile: &Profile,
    candidates: &[Candidate<W>],
    reaches: &[Reach],
    prompt_tokens: u64,
    block_size: u32,
    weigh: Weigh,
    pick: u64,
) -> Vec<Score> {
    let sorted = candidates.is_sorted_by(|a, b| a.name() < b.name());
    let prompt = (prompt_tokens, block_size);
    rank_bounded(profile, candidates, reaches, prompt, weigh, pick, (MAX_RANKED, sorted))
}

/// [`rank_reached`] of a pool known to be in name order (the plan's and the updater's pools
/// are): equal costs are ordered by position, so no worker's name is read, only those of the
/// workers kept.
pub(crate) fn rank_pool<W: Borrow<WorkerName>>(
    profile: &Profile,
    candidates: &[Candidate<W>],
    reaches: &[Reach],
    prompt: (u64, u32),
    weigh: Weigh,
    pick: u64,
) -> Vec<Score> {
    debug_assert!(candidates.is_sorted_by(|a, b| a.name() < b.name()), "a pool in name order");
    rank_bounded(profile, candidates, reaches, prompt, weigh, pick, (MAX_RANKED, true))
}

/// One scored candidate as the ordering sees it: 16 bytes, so that a selection over a large
/// pool moves little.
#[derive(Debug, Clone, Copy)]
struct Key {
    /// The cost in [`f64::total_cmp`]'s order as an integer ([`total_order`]): a selection
    /// over a large pool compares integers. [`Key::cost`] gives the cost back.
    ord: u64,
    index: u32,
    /// Uncached tokens (saturated: a prompt is far below 4 G tokens).
    uncached: u32,
}

impl Key {
    fn new(cost: f64, index: usize, uncached: u64) -> Key {
        let (index, uncached) = (index as u32, uncached.min(u64::from(u32::MAX)) as u32);
        Key { ord: total_order(cost), index, uncached }
    }

    fn cost(&self) -> f64 {
        from_total_order(self.ord)
    }

    fn index(&self) -> usize {
        self.index as usize
    }
}

/// `x`'s position in [`f64::total_cmp`]'s order, as an unsigned integer: `total_order(a) <
/// total_order(b)` exactly when `a.total_cmp(&b)` is `Less`.
fn total_order(x: f64) -> u64 {
    let bits = x.to_bits() as i64;
    // As `total_cmp` does: negative values' magnitude bits flipped, then compared signed...
    let signed = bits ^ ((((bits >> 63) as u64) >> 1) as i64);
    // ...and a signed order is the unsigned one with the sign bit flipped.
    (signed as u64) ^ (1 << 63)
}

/// The value whose [`total_order`] is `ord`.
fn from_total_order(ord: u64) -> f64 {
    let signed = (ord ^ (1 << 63)) as i64;
    // The sign bit is the same before and after `total_order`'s flip: flip back the same bits.
    f64::from_bits((signed ^ ((((signed >> 63) as u64) >> 1) as i64)) as u64)
}

/// What ranking a large pool reads of a worker's [`Estimate`].
#[derive(Debug, Clone, Copy)]
struct Brief {
    cost: f64,
    uncached: u64,
    cached: u64,
    ttft: f64,
    promise_ttft: f64,
    promise_wait: f64,
}

impl Brief {
    fn of(e: &Estimate, stall_weight: f64) -> Brief {
        Brief {
            cost: e.cost_ms(stall_weight),
            uncached: e.uncached_tokens,
            cached: e.cached_tokens,
            ttft: e.ttft_ms,
            promise_ttft: e.promise_ttft_ms(),
            promise_wait: e.promise_wait_ms(),
        }
    }
}

/// Whether two candidates have the same estimate inputs (all but their names).
fn same_inputs<W>(a: &Candidate<W>, b: &Candidate<W>) -> bool {
    // The load first: in a busy pool it is what differs.
    a.load.inflight_requests == b.load.inflight_requests
        && a.load == b.load
        && a.cached_blocks == b.cached_blocks
        && a.offloaded_blocks == b.offloaded_blocks
        && a.adapter_missing == b.adapter_missing
        && a.deviation.to_bits() == b.deviation.to_bits()
}

/// The key of the least value offered so far (the first one among equals).
#[derive(Debug, Clone, Copy, Default)]
struct Least(Option<(f64, Key)>);

impl Least {
    fn offer(&mut self, value: f64, key: Key) {
        if self.0.is_none_or(|(v, _)| value.total_cmp(&v).is_lt()) {
            self.0 = Some((value, key));
        }
    }
}

/// [`rank_reached`] keeping at most `keep` workers in full (`keep` >= 1); `sorted`: the
/// candidates are in name order.
pub(super) fn rank_bounded<W: Borrow<WorkerName>>(
    profile: &Profile,
    candidates: &[Candidate<W>],
    reaches: &[Reach],
    (prompt_tokens, block_size): (u64, u32),
    weigh: Weigh,
    pick: u64,
    (keep, sorted): (usize, bool),
) -> Vec<Score> {
    let none = Reach::default();
    let w = if weigh.stall_weight.is_finite() { weigh.stall_weight.max(0.0) } else { 0.0 };
    let prompt = Prompt::new(profile, prompt_tokens, block_size, &weigh);
    let estimate_of = |i: usize| {
        let reach = reaches.get(i).unwrap_or(&none);
        estimate(profile, &prompt, &candidates[i], reach)
    };
    let score_of = |i: usize, e: Estimate| {
        let cost = e.cost_ms(w);
        let mut s = e.named(candidates[i].name().clone());
        s.cost_ms = cost;
        s
    };
    let whole = candidates.len() <= keep;
    let mut estimates = Vec::with_capacity(if whole { candidates.len() } else { 0 });
    let mut keys = Vec::with_capacity(candidates.len());
    let (mut ttft, mut wait, mut holder) = (Least::default(), Least::default(), Least::default());
    let mut longest = 0;
    if whole {
        for i in 0..candidates.len() {
            let e = estimate_of(i);
            keys.push(Key::new(e.cost_ms(w), i, e.uncached_tokens));
            estimates.push(e);
        }
    }
    // A large pool's workers whose inputs equal the previous worker's (idle workers holding
    // nothing of the prompt, most of a quiet pool) share its estimate: it is a function of
    // them. Reaches differ per worker, so a pool with reaches estimates every worker.
    let mut last: Option<(usize, Brief)> = None;
    let bulk = if whole { 0..0 } else { 0..candidates.len() };
    for i in bulk {
        let b = match last {
            Some((j, b)) if reaches.is_empty() && same_inputs(&candidates[j], &candidates[i]) => b,
            _ => Brief::of(&estimate_of(i), w),
        };
        last = Some((i, b));
        let key = Key::new(b.cost, i, b.uncached);
        keys.push(key);
        ttft.offer(b.promise_ttft, key);
        wait.offer(b.promise_wait, key);
        if b.cached > longest {
            longest = b.cached;
            holder = Least::default();
        }
        if b.cached == longest && longest > 0 {
            holder.offer(b.ttft, key);
        }
    }
    // Pools come sorted by name: then the index orders equal costs as the name would.
    let by_name = !sorted;
    let cmp = |a: &Key, b: &Key| {
        if by_name {
            let by_cost = a.ord.cmp(&b.ord);
            by_cost.then_with(|| candidates[a.index()].name().cmp(candidates[b.index()].name()))
        } else {
            (a.ord, a.index).cmp(&(b.ord, b.index))
        }
    };
    let order = order(&mut keys, &cmp, block_size, weigh, pick, keep);
    if whole {
        let mut slots: Vec<Option<Estimate>> = estimates.into_iter().map(Some).collect();
        return order
            .iter()
            .filter_map(|&i| Some(score_of(i, slots.get_mut(i)?.take()?)))
            .collect();
    }
    let mut chosen = order;
    let mut extra: Vec<Key> = [ttft, wait, holder]
        .iter()
        .filter_map(|l| l.0.map(|(_, k)| k))
        .filter(|k| !chosen.contains(&k.index()))
        .collect();
    extra.sort_by(&cmp);
    extra.dedup_by_key(|k| k.index);
    chosen.extend(extra.iter().map(Key::index));
    chosen.into_iter().map(|i| score_of(i, estimate_of(i))).collect()
}

/// The indices of the first `keep` keys in ranking order (all of them when there are no more
/// than `keep`): the primary, drawn among the least-work ties of the best cost, then by
/// increasing cost. Sorts only the ties and the first `keep`.
fn order<F: Fn(&Key, &Key) -> std::cmp::Ordering>(
    keys: &mut [Key],
    cmp: &F,
    block_size: u32,
    weigh: Weigh,
    pick: u64,
    keep: usize,
) -> Vec<usize> {
    let Some(best) = keys.iter().map(|k| k.ord).min().map(from_total_order) else {
        return Vec::new();
    };
    let tie = weigh.tie;
    let band = best + tie.abs_ms.max(tie.rel * best);
    let ties = keys.iter().filter(|k| k.cost() <= band).count().max(1);
    // Only the ties and the first `keep` need their order.
    let sorted = ties.max(keep).min(keys.len());
    if sorted < keys.len() {
        keys.select_nth_unstable_by(sorted - 1, cmp);
    }
    let head = &mut keys[..sorted];
    head.sort_unstable_by(cmp);
    // Among ties, the least work added: a worker that shares more of the prompt (cached, or in
    // flight there) leaves the others free; equal work is drawn at random.
    let least = head[..ties].iter().map(|k| u64::from(k.uncached)).min().unwrap_or(0);
    let near = u64::from(block_size.max(1));
    let lightest: Vec<usize> =
        (0..ties).filter(|&i| u64::from(head[i].uncached) < least + near).collect();
    let drawn = (pick % lightest.len().max(1) as u64) as usize;
    let chosen = lightest.get(drawn).copied().unwrap_or(0);
    let mut out: Vec<usize> = head.iter().map(Key::index).collect();
    if chosen < out.len() {
        let primary = out.remove(chosen);
        out.insert(0, primary);
    }
    out.truncate(keep.max(1));
    out
}

#[cfg(test)]
mod tests;
