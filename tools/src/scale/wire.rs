//! The knowledge on the wire: snapshot and delta bytes from the real encoders
//! (`kvroute_core::wire`), the deltas composed by the updater's own publisher, and the time a
//! filter thread spends decoding them and taking them in.

use std::hint::black_box;
use std::time::Instant;

use kvroute_core::decision::router::Router;
use kvroute_core::wire::delta::Delta;
use kvroute_core::wire::snapshot::Snapshot;
use kvroute_updater::publish::Answer;

use crate::fleet::{mix, Fleet};

/// The median of `reps` runs of `f`, in microseconds.
fn median_us(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A full snapshot's size and costs.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotCost {
    pub bytes: usize,
    pub encode_us: f64,
    pub decode_us: f64,
    /// `Router::apply_snapshot` of the decoded snapshot (a thread taking it in).
    pub apply_us: f64,
}

pub fn snapshot(snap: &Snapshot, router: &mut Router, reps: usize) -> anyhow::Result<SnapshotCost> {
    let bytes = snap.encode();
    let encode_us = median_us(reps, || {
        black_box(snap.encode());
    });
    let decoded = Snapshot::decode(&bytes)?;
    anyhow::ensure!(&decoded == snap, "snapshot did not round-trip");
    let decode_us = median_us(reps, || {
        black_box(Snapshot::decode(&bytes).ok());
    });
    let apply_us = median_us(reps, || router.apply_snapshot(&decoded));
    Ok(SnapshotCost { bytes: bytes.len(), encode_us, decode_us, apply_us })
}

/// One long-poll answer after `events` KV events, as the updater composes it.
#[derive(Debug, Clone, Copy)]
pub struct DeltaCost {
    /// False: the updater answered with a full snapshot (the change outgrew its delta ring).
    pub delta: bool,
    pub bytes: usize,
    pub decode_us: f64,
    pub apply_us: f64,
}

/// Applies `events` steady-state events (each: one chain stored, the oldest evicted) on
/// workers spread over the fleet, then measures the answer to a caller at the version before.
pub fn delta(
    fleet: &mut Fleet,
    router: &mut Router,
    events: usize,
    reps: usize,
) -> anyhow::Result<DeltaCost> {
    let since = fleet.state.version();
    let n = fleet.workers.len() as u64;
    for e in 0..events {
        fleet.churn((mix(e as u64 ^ since) % n) as usize);
    }
    let (bytes, delta, decode_us, apply_us) = match fleet.state.answer(Some(since)) {
        Answer::Delta(d) => {
            let bytes = d.encode();
            let decoded = Delta::decode(&bytes)?;
            let decode_us = median_us(reps, || {
                black_box(Delta::decode(&bytes).ok());
            });
            let apply_us = median_us(reps, || router.apply_delta(&decoded));
            (bytes.len(), true, decode_us, apply_us)
        }
        Answer::Full(s) => {
            let c = snapshot(&s, router, reps)?;
            (c.bytes, false, c.decode_us, c.apply_us)
        }
        Answer::NotModified => anyhow::bail!("{events} events changed nothing"),
    };
    Ok(DeltaCost { delta, bytes, decode_us, apply_us })
}
