//! Disaggregated pools: the decode worker by load (the prefix arrives with the hand-off, so
//! every decode worker holds all of it), then the prefill worker by cache, queue and the cost
//! of handing its KV to that decode worker.

use crate::decision::cost::{rank_reached, reusable_blocks, Candidate, Score};
use crate::decision::index::PrefixMatch;
use crate::decision::load::WorkerLoad;

use super::reach::reaches;
use super::{Router, Target};

impl Router {
    /// `(decode ranking, prefill ranking)` of a P/D pool whose decode workers are `decode`.
    /// The decode primary's estimate is the whole request's: its prefill on the prefill
    /// primary, the hand-off and its own first step.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rank_pd(
        &self,
        t: &Target,
        decode: &[(Candidate, PrefixMatch)],
        hashes: &[u64],
        prompt_tokens: u64,
        load: &dyn Fn(&str) -> WorkerLoad,
        now_ms: u64,
        pick: u64,
        cache_read: bool,
    ) -> (Vec<Score>, Vec<Score>) {
        let m = &t.model;
        let profile = self.calibration.profile_for(&m.name).unwrap_or(m.profile);
        let topo = self.topology.as_deref();
        let all = reusable_blocks(prompt_tokens, m.block_size) as usize;
        let handed: Vec<(Candidate, PrefixMatch)> = decode
            .iter()
            .map(|(c, pm)| {
                (Candidate { cached_blocks: all, offloaded_blocks: 0, ..c.clone() }, *pm)
            })
            .collect();
        let cands: Vec<Candidate> = handed.iter().map(|(c, _)| c.clone()).collect();
        let near = reaches(topo, &handed, true, &|_| 0.0);
        let mut ranked =
            rank_reached(&profile, &cands, &near, prompt_tokens, m.block_size, self.plan.tie, pick);
        let Some(d) = ranked.first().cloned() else { return (ranked, Vec::new()) };
        let looked = self.candidates(t, &m.prefill_workers, hashes, load, now_ms, cache_read);
        let cands: Vec<Candidate> = looked.iter().map(|(c, _)| c.clone()).collect();
        let handoff =
            |p: &str| topo.map_or(0.0, |t| t.handoff_ms(p, &d.worker, prompt_tokens)) + d.ttft_ms;
        // No pulls among prefill workers: the P/D proxy forwards the request's headers to the
        // prefill worker, and a pull header meant for it would reach the decode engine too.
        let mut near = reaches(topo, &looked, false, &handoff);
        near.iter_mut().for_each(|r| r.pulls.clear());
        let prefill =
            rank_reached(&profile, &cands, &near, prompt_tokens, m.block_size, self.plan.tie, pick);
        if let (Some(first), Some(p)) = (ranked.first_mut(), prefill.first()) {
            first.ttft_ms = p.ttft_ms;
        }
        (ranked, prefill)
    }
}
