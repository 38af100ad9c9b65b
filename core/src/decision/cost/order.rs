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

use super::{score_reached, Candidate, Reach, Score, Weigh};
use crate::decision::cost::Profile;

/// How many workers a decision ranks in full: its primary and fallbacks.
pub const MAX_RANKED: usize = 64;

/// Ranks candidates by `cost = ttft + stall_weight · stall`: the primary is drawn (with `pick`,
/// a random number) among those within the tie band of the best cost that add the least
/// prefill work (fewest uncached tokens, within a block); the rest follow by increasing cost.
/// Equal costs are ordered by worker name. Empty in, empty out; a pool larger than
/// [`MAX_RANKED`] keeps its best and the workers the module documentation lists.
pub fn rank(
    profile: &Profile,
    candidates: &[Candidate],
    prompt_tokens: u64,
    block_size: u32,
    weigh: Weigh,
    pick: u64,
) -> Vec<Score> {
    rank_reached(profile, candidates, &[], prompt_tokens, block_size, weigh, pick)
}

/// [`rank`] with each candidate's [`Reach`] (`reaches[i]` for `candidates[i]`; missing ones
/// are zero).
pub fn rank_reached(
    profile: &Profile,
    candidates: &[Candidate],
    reaches: &[Reach],
    prompt_tokens: u64,
    block_size: u32,
    weigh: Weigh,
    pick: u64,
) -> Vec<Score> {
    rank_bounded(profile, candidates, reaches, (prompt_tokens, block_size), weigh, pick, MAX_RANKED)
}

/// One scored candidate as the ordering sees it.
#[derive(Debug, Clone, Copy)]
struct Key {
    cost: f64,
    index: usize,
    uncached: u64,
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

/// [`rank_reached`] keeping at most `keep` workers in full (`keep` >= 1).
pub(super) fn rank_bounded(
    profile: &Profile,
    candidates: &[Candidate],
    reaches: &[Reach],
    (prompt_tokens, block_size): (u64, u32),
    weigh: Weigh,
    pick: u64,
    keep: usize,
) -> Vec<Score> {
    let none = Reach::default();
    let w = if weigh.stall_weight.is_finite() { weigh.stall_weight.max(0.0) } else { 0.0 };
    let score_of = |i: usize| {
        let c = &candidates[i];
        let mut s =
            score_reached(profile, c, reaches.get(i).unwrap_or(&none), prompt_tokens, block_size);
        s.cost_ms = if w > 0.0 { s.ttft_ms + w * s.stall_ms } else { s.ttft_ms };
        s
    };
    let whole = candidates.len() <= keep;
    let mut scores = Vec::with_capacity(if whole { candidates.len() } else { 0 });
    let mut keys = Vec::with_capacity(candidates.len());
    let (mut ttft, mut wait, mut holder) = (Least::default(), Least::default(), Least::default());
    let mut longest = 0;
    for i in 0..candidates.len() {
        let s = score_of(i);
        let key = Key { cost: s.cost_ms, index: i, uncached: s.uncached_tokens };
        keys.push(key);
        if whole {
            scores.push(s);
            continue;
        }
        ttft.offer(s.promise_ttft_ms(), key);
        wait.offer(s.promise_wait_ms(), key);
        if s.cached_tokens > longest {
            longest = s.cached_tokens;
            holder = Least::default();
        }
        if s.cached_tokens == longest && longest > 0 {
            holder.offer(s.ttft_ms, key);
        }
    }
    // Pools come sorted by name: then the index orders equal costs as the name would.
    let by_name = !candidates.is_sorted_by(|a, b| a.worker < b.worker);
    let cmp = |a: &Key, b: &Key| {
        let by_cost = a.cost.total_cmp(&b.cost);
        if by_name {
            by_cost.then_with(|| candidates[a.index].worker.cmp(&candidates[b.index].worker))
        } else {
            by_cost.then(a.index.cmp(&b.index))
        }
    };
    let order = order(&mut keys, &cmp, block_size, weigh, pick, keep);
    if whole {
        let mut slots: Vec<Option<Score>> = scores.into_iter().map(Some).collect();
        return order.iter().filter_map(|&i| slots.get_mut(i).and_then(Option::take)).collect();
    }
    let mut chosen = order;
    let mut extra: Vec<Key> = [ttft, wait, holder]
        .iter()
        .filter_map(|l| l.0.map(|(_, k)| k))
        .filter(|k| !chosen.contains(&k.index))
        .collect();
    extra.sort_by(&cmp);
    extra.dedup_by_key(|k| k.index);
    chosen.extend(extra.iter().map(|k| k.index));
    chosen.into_iter().map(score_of).collect()
}

/// The indices of the first `keep` keys in ranking order (all of them when there are no more
/// than `keep`): the primary, drawn among the least-work ties of the best cost, then by
/// increasing cost. Sorts only the ties and the first `keep`.
fn order(
    keys: &mut [Key],
    cmp: &dyn Fn(&Key, &Key) -> std::cmp::Ordering,
    block_size: u32,
    weigh: Weigh,
    pick: u64,
    keep: usize,
) -> Vec<usize> {
    let Some(best) = keys.iter().map(|k| k.cost).min_by(f64::total_cmp) else {
        return Vec::new();
    };
    let tie = weigh.tie;
    let band = best + tie.abs_ms.max(tie.rel * best);
    let ties = keys.iter().filter(|k| k.cost <= band).count().max(1);
    // Only the ties and the first `keep` need their order.
    let sorted = ties.max(keep).min(keys.len());
    if sorted < keys.len() {
        keys.select_nth_unstable_by(sorted - 1, cmp);
    }
    let head = &mut keys[..sorted];
    head.sort_unstable_by(cmp);
    // Among ties, the least work added: a worker that shares more of the prompt (cached, or in
    // flight there) leaves the others free; equal work is drawn at random.
    let least = head[..ties].iter().map(|k| k.uncached).min().unwrap_or(0);
    let near = u64::from(block_size.max(1));
    let lightest: Vec<usize> = (0..ties).filter(|&i| head[i].uncached < least + near).collect();
    let drawn = (pick % lightest.len().max(1) as u64) as usize;
    let chosen = lightest.get(drawn).copied().unwrap_or(0);
    let mut out: Vec<usize> = head.iter().map(|k| k.index).collect();
    if chosen < out.len() {
        let primary = out.remove(chosen);
        out.insert(0, primary);
    }
    out.truncate(keep.max(1));
    out
}

#[cfg(test)]
mod tests;
