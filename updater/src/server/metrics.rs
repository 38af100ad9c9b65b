//! `/metrics`: the updater's counters and gauges in the Prometheus text format (0.0.4),
//! encoded by `prometheus-client` (HELP and TYPE lines, label values escaped). At each scrape
//! a registry is filled from the typed state ([`State::observe`]: every worker's
//! [`IngestStats`], block counts and reported load; the pool and peer counters) and from the
//! connection counters ([`ConnStats::register`]).
//!
//! Every name starts with `kvroute_updater_`; counters end in `_total`. Per worker (label
//! `worker`): one counter per [`IngestStats`] field (`kvroute_updater_batches_total`, ...),
//! `caps_hit_total` (with `cap`), gauges `engine_keys`, `blocks` (with `tier`), `connected`,
//! `last_event_age_seconds`, `reported_running`, `reported_waiting`, `reported_kv_usage`,
//! `reported_load_age_seconds` (the last five only where known).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::Registry;

use crate::conns::ConnStats;
use crate::families::{clamp, Families};
use crate::ingest::IngestStats;
use crate::limits::Cap;
use crate::state::{now_ms, Observed, State};

/// `Content-Type` of the exposition.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Prefix of every metric name.
pub const PREFIX: &str = "kvroute_updater";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabels {
    pub worker: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapLabels {
    pub worker: String,
    pub cap: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabels {
    pub worker: String,
    pub tier: &'static str,
}

/// A [`IngestStats`] counter: its name (without prefix and `_total`), help, and field.
type StatCounter = (&'static str, &'static str, fn(&IngestStats) -> u64);

/// The per-worker counters of [`IngestStats`].
const WORKER_COUNTERS: [StatCounter; 22] = [
    ("batches", "KV-event batches received", |s| s.batches),
    ("events", "KV events received", |s| s.events),
    ("gaps", "Gaps in the batch sequence", |s| s.gaps),
    ("replays", "Replays fetched from the worker's replay buffer", |s| s.replays),
    ("resyncs", "Resyncs (the worker's blocks rebuilt from replay)", |s| s.resyncs),
    ("resubscribes", "Live subscriptions renewed after silence", |s| s.resubscribes),
    ("orphans", "Stored blocks whose parent was unknown (not indexed)", |s| s.orphans),
    ("block_size_mismatches", "Stores of an unusable block size", |s| s.block_size_mismatches),
    ("rollovers", "Replays that started later than asked", |s| s.rollovers),
    ("replays_cut", "Replays cut short by a replay cap", |s| s.replays_cut),
    ("bad_batches", "Batches refused or undecodable", |s| s.bad_batches),
    ("malformed_messages", "ZMQ messages that are not a batch", |s| s.malformed_messages),
    ("bad_events", "Events whose fields could not be read", |s| s.bad_events),
    ("refused_batches", "Batches all of whose events were refused", |s| s.refused_batches),
    ("rechunked_stores", "Stores re-chunked into kvroute blocks", |s| s.rechunked_stores),
    ("offload_stores_matched", "Offloading placeholders matched", |s| s.offload_stores_matched),
    ("offload_stores_unmatched", "Offloading placeholders ignored", |s| s.offload_stores_unmatched),
    ("no_credit_group_stores", "Stores in cache groups that give no credit", |s| {
        s.no_credit_group_stores
    }),
    ("lookahead_stores", "Stores whose hashes cover lookahead tokens", |s| s.lookahead_stores),
    ("remote_events", "Events of blocks held elsewhere (ignored)", |s| s.remote_events),
    ("unknown_medium_events", "Events of an undocumented medium (ignored)", |s| {
        s.unknown_medium_events
    }),
    ("unknown_removals", "Removals of a block not known", |s| s.unknown_removals),
];

/// The exposition: the state's metrics, then the connections' (when served by `conns`).
pub fn render(state: &State, conns: Option<&ConnStats>) -> String {
    let mut reg = Registry::with_prefix(PREFIX);
    state.observe(|o| fill(&mut Families(&mut reg), o, now_ms()));
    if let Some(conns) = conns {
        conns.register(&mut Families(&mut reg));
    }
    let mut text = String::new();
    // Writing to a String cannot fail; the encoder fails only on a writer's error.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &reg);
    text
}

/// The state's metrics as of `now` (Unix ms).
fn fill(f: &mut Families<'_>, o: &Observed<'_>, now: u64) {
    f.level("snapshot_version", "The published snapshot version", o.version);
    f.level("pool_workers", "Workers in the pool", o.workers.len() as u64);
    f.count("pool_joined", "Workers that joined the pool", o.joined);
    f.count("pool_left", "Workers that left the pool", o.left);
    let worker = |w: &str| WorkerLabels { worker: w.to_owned() };
    for (name, help, field) in WORKER_COUNTERS {
        let family = f.counter::<WorkerLabels>(name, help);
        for (w, e) in o.workers {
            family.get_or_create(&worker(w)).inc_by(field(&e.knowledge.stats));
        }
    }
    let caps = f.counter::<CapLabels>("caps_hit", "Times a bound was reached");
    let keys = f.gauge::<WorkerLabels>("engine_keys", "Engine hashes known, all tiers");
    let blocks = f.gauge::<TierLabels>("blocks", "Canonical blocks known, per tier");
    let connected = f.gauge::<WorkerLabels>("connected", "1 while the event stream is up");
    for (w, e) in o.workers {
        for cap in Cap::ALL {
            let labels = CapLabels { worker: w.clone(), cap: cap.name() };
            caps.get_or_create(&labels).inc_by(e.knowledge.stats.caps_hit.get(cap));
        }
        keys.get_or_create(&worker(w)).set(clamp(e.knowledge.engine_keys() as u64));
        for (tier, n) in e.knowledge.counts() {
            let labels = TierLabels { worker: w.clone(), tier };
            blocks.get_or_create(&labels).set(clamp(n as u64));
        }
        connected.get_or_create(&worker(w)).set(i64::from(e.connected));
    }
    fill_ages_and_load(f, o, now);
    let p = &o.peers.stats;
    for (name, help, n) in [
        ("peer_reports", "Envoy replicas' reports taken", p.reports),
        ("peer_refused", "Replica reports refused", p.refused),
        ("peer_stale_loads", "Reported loads older than one applied", p.stale_loads),
        ("peer_credits", "Replica decisions credited", p.credits),
        ("peer_dropped_hashes", "Credited hashes dropped to stay bounded", p.dropped_hashes),
        ("peer_expired_credits", "Replica credits expired", p.expired_credits),
        ("peer_expired_loads", "Replica loads expired", p.expired_loads),
    ] {
        f.count(name, help, n);
    }
    f.level("peer_replicas", "Envoy replicas known", o.peers.replicas() as u64);
    f.level("peer_hashes", "Credited hashes held", o.peers.hashes() as u64);
}

/// Per worker, where known: the age of its last KV event and what it last reported about
/// its load.
fn fill_ages_and_load(f: &mut Families<'_>, o: &Observed<'_>, now: u64) {
    let age = |at: u64| now.saturating_sub(at) as f64 * 1e-3;
    let event_age =
        f.float_gauge::<WorkerLabels>("last_event_age_seconds", "Time since the last KV event");
    let running = f.float_gauge::<WorkerLabels>("reported_running", "Requests running");
    let waiting = f.float_gauge::<WorkerLabels>("reported_waiting", "Requests waiting");
    let usage = f.float_gauge::<WorkerLabels>("reported_kv_usage", "KV-cache usage, 0 to 1");
    let load_age =
        f.float_gauge::<WorkerLabels>("reported_load_age_seconds", "Time since the load scrape");
    for (w, e) in o.workers {
        let labels = WorkerLabels { worker: w.clone() };
        let last = e.knowledge.stats.last_event_ms;
        if last > 0 {
            event_age.get_or_create(&labels).set(age(last));
        }
        let Some(load) = &e.load else { continue };
        for (gauge, v) in
            [(&running, load.running), (&waiting, load.waiting), (&usage, load.kv_usage)]
        {
            if let Some(v) = v {
                gauge.get_or_create(&labels).set(v);
            }
        }
        load_age.get_or_create(&labels).set(age(load.observed_at_ms));
    }
}

#[cfg(test)]
mod tests;
