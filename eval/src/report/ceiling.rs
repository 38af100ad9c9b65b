//! The hit-rate ceiling per request: what one unbounded cache that saw every request of the
//! schedule in order would reuse of each (whole blocks of a common prefix, tenants apart by
//! their `cache_salt`), the same rule as [`crate::workloads::reuse_ceiling_with`]. Summed
//! over a cohort's requests it gives the cohort's ceiling.

use std::collections::HashSet;

use kvroute_core::decision::tokenize::model::ModelBundle;

use crate::schedule::Scheduled;

/// `[reused, prompt]` tokens of every request of `schedule`, in schedule order.
pub fn per_request(
    bundle: &ModelBundle,
    schedule: &[Scheduled],
    block_size: u32,
) -> anyhow::Result<Vec<[u64; 2]>> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(schedule.len());
    for s in schedule {
        let req = crate::workloads::parsed(s)?;
        let tokens = bundle.prompt_tokens(&req.prompt)?;
        let seed =
            req.cache_salt.as_deref().map_or(0, |t| xxhash_rust::xxh3::xxh3_64(t.as_bytes()));
        let mut reused = 0u64;
        let mut hit = true;
        for h in kvroute_core::decision::hash::block_hashes(seed, block_size, &tokens) {
            hit &= !seen.insert(h);
            if hit {
                reused += u64::from(block_size);
            }
        }
        out.push([reused, tokens.len() as u64]);
    }
    Ok(out)
}

/// Reused over prompt tokens of the requests `ids` (schedule indices); `None` when they have
/// no prompt tokens or an id is out of range.
pub fn of(reuse: &[[u64; 2]], ids: impl IntoIterator<Item = usize>) -> Option<f64> {
    let (mut r, mut t) = (0u64, 0u64);
    for id in ids {
        let [a, b] = reuse.get(id)?;
        r += a;
        t += b;
    }
    (t > 0).then(|| r as f64 / t as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_to_the_workload_ceiling() {
        let plan = crate::preset::preset("selfcheck", 3).expect("preset");
        let w = &plan.scenarios[0].workload;
        let sched = w.schedule().expect("schedule");
        let bundle = ModelBundle::demo().expect("bundle");
        let per = per_request(&bundle, &sched, 16).expect("per request");
        assert_eq!(per.len(), sched.len());
        let whole = crate::workloads::reuse_ceiling_with(&bundle, &sched, 16).expect("ceiling");
        let sum = of(&per, 0..sched.len()).expect("some tokens");
        assert!((sum - whole).abs() < 1e-12, "{sum} vs {whole}");
        assert!(whole > 0.0);
        assert_eq!(of(&per, [sched.len()]), None);
        assert_eq!(of(&[[0, 0]], [0]), None);
    }
}
