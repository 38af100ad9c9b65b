//! Disaggregated pools: decode workers ranked by load (the prefix arrives with the hand-off,
//! so each is credited with all of it), then, for each of the least loaded, the prefill worker
//! by cache, queue and the cost of handing the KV that decode worker lacks over their link;
//! the pair with the lowest estimate wins.

use crate::decision::cost::{rank_pool, reusable_blocks, Candidate, Score};
use crate::decision::load::LoadSource;

use crate::decision::topology::TopologyConfig;
use crate::decision::worker::WorkerName;

use super::reach::reaches;
use super::{Router, Target};

/// Decode workers (the least loaded first) each paired with its best prefill worker.
const MAX_DECODE_CANDIDATES: usize = 8;

impl Router {
    /// `(decode ranking, prefill ranking)` of a P/D pool whose decode workers are `decode`.
    /// The decode primary's estimate is the whole request's: its prefill on the prefill
    /// primary, the hand-off and its own first step.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rank_pd(
        &self,
        t: &Target,
        decode: &[Candidate<&WorkerName>],
        hashes: &[u64],
        prompt_tokens: u64,
        load: &dyn LoadSource,
        now_ms: u64,
        pick: u64,
        cache_read: bool,
    ) -> (Vec<Score>, Vec<Score>) {
        let m = &t.model;
        let profile = self.calibration.profile_or(&m.name, load.priority(), &m.profile);
        let topo = self.topology.as_deref();
        let all = reusable_blocks(prompt_tokens, m.block_size) as usize;
        let handed: Vec<Candidate<&WorkerName>> = decode
            .iter()
            .map(|c| Candidate { cached_blocks: all, offloaded_blocks: 0, ..c.clone() })
            .collect();
        let near = reaches(topo, &handed, true, &|_| 0.0);
        // Both pools are in name order (the plan's and the updater's are), so the ranking
        // reads no name but those it keeps.
        let prompt = (prompt_tokens, m.block_size);
        // The decode worker runs the stream: its growth of the decode batch is priced there,
        // not on the prefill worker (which hands the request over after its first token).
        let mut ranked = rank_pool(&profile, &handed, &near, prompt, self.weigh(t), pick);
        let (cands, _) = self.candidates(t, &m.prefill_workers, hashes, load, now_ms, cache_read);
        // Without a topology the hand-off still crosses a link: the default one within a site.
        let fallback = TopologyConfig::default();
        let net = topo.unwrap_or(&fallback);
        // What a decode worker lacks of the prompt: a connector moves only the blocks its own
        // prefix cache does not hold.
        let bs = u64::from(m.block_size);
        let lacks = |w: &WorkerName| {
            let held = decode.iter().find(|c| c.name() == w).map_or(0, |c| c.cached_blocks);
            prompt_tokens - (held.min(all) as u64) * bs
        };
        // Each of the least loaded decode workers with its best prefill worker; the pair with
        // the lowest estimate wins.
        let mut best: Option<(usize, Vec<Score>)> = None;
        for (i, d) in ranked.iter().enumerate().take(MAX_DECODE_CANDIDATES) {
            let lacking = lacks(&d.worker);
            let handoff = |p: &str| net.handoff_ms(p, &d.worker, lacking) + d.ttft_ms;
            // No pulls among prefill workers: the P/D proxy forwards the request's headers to
            // the prefill worker, and a pull header meant for it would reach the decode engine
            // too.
            let mut near = reaches(topo, &cands, false, &handoff);
            near.iter_mut().for_each(|r| r.pulls.clear());
            let prefill = rank_pool(&profile, &cands, &near, prompt, self.plan.weigh, pick);
            let total = prefill.first().map_or(f64::INFINITY, |p| p.ttft_ms);
            if best
                .as_ref()
                .is_none_or(|(_, b)| total < b.first().map_or(f64::INFINITY, |p| p.ttft_ms))
            {
                best = Some((i, prefill));
            }
        }
        let Some((i, prefill)) = best else { return (ranked, Vec::new()) };
        let chosen = ranked.remove(i);
        ranked.insert(0, chosen);
        if let (Some(first), Some(p)) = (ranked.first_mut(), prefill.first()) {
            first.ttft_ms = p.ttft_ms;
        }
        (ranked, prefill)
    }
}
