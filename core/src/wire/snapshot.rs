//! Knowledge snapshots from the updater to Envoy: which models the updater serves bundles for,
//! which canonical block hashes each worker holds (from its KV events), how old that knowledge
//! is, which model and LoRA adapters each worker serves, and whether the worker's announced
//! config matches kvroute's. A compact little-endian binary format with a version byte; the
//! decoder never panics (fuzz target `snapshot_decode`).
//!
//! Layout (format 3): `KVRS`, format byte, `version` u64, `generated_at_ms` u64, models (u16
//! count; each: u16-length name, `fingerprint` u64, `block_size` u32), workers (u32 count; each:
//! u16-length name, `observed_at_ms` u64, `compatible` u8, load flag u8 [`running` u32,
//! `waiting` u32, `observed_at_ms` u64], u16-length model, adapters (u16 count; each u16-length
//! name), GPU hashes and offloaded hashes (u32 count; each u64)). Strings are UTF-8.
//! Format 4 is format 3 followed by a [`PeerSection`] (other replicas' routing, see
//! [`crate::wire::peers`]); the updater sends it only to callers that ask (`peers=1`), so a decoder
//! that knows format 3 only keeps working.
//! Format 5 is format 3 followed by a sections byte: bit 1 the worker list is the updater's
//! whole pool ([`Snapshot::pool`]), bit 2 a [`PeerSection`] follows; other bits are an error.
//! The updater sends it only to callers that ask (`pool=1`), and only when it says it has the
//! pool (membership discovered); otherwise formats 3 and 4 are written byte for byte as before.
//! Sections bit 4: the workers Envoy's health checking or outlier detection dropped follow
//! (u16 count; each u16-length name; after the peer section), see [`Snapshot::down`]; sent only
//! to callers that ask (`health=1`) and only while a worker is down, so a snapshot with no
//! worker down is written as before.
//! Sections bit 8: the workers' placements follow (after the workers down): u16 count; each:
//! u16-length worker, `observed_at_ms` u64, then u16-length site, zone, rack and node (empty:
//! unknown), see [`Snapshot::placements`]; sent only to callers that ask (`placement=1`) and
//! only while some placement is known, so a snapshot without one is written as before.
//! Sections bit 16: the peer section's load entries carry each replica's arrivals (see
//! [`crate::wire::peers`]); sent only to callers that ask (`arrivals=1`) and only while some
//! peer load has arrivals; set without bit 2 it is an error.

use crate::wire::peers::PeerSection;
use crate::wire::{hashes, put_hashes, put_str, read_str, DecodeLimits, Reader, SnapshotError};

/// Format version of the encoding below.
pub const SNAPSHOT_FORMAT: u8 = 3;
/// Format of a snapshot with a trailing peer section.
pub const SNAPSHOT_FORMAT_PEERS: u8 = 4;
/// Format of a snapshot with a trailing sections byte (pool flag, peers).
pub const SNAPSHOT_FORMAT_SECTIONS: u8 = 5;
/// Sections byte: the worker list is the whole pool.
pub(crate) const SECTION_POOL: u8 = 1;
/// Sections byte: a peer section follows.
pub(crate) const SECTION_PEERS: u8 = 2;
/// Sections byte: the list of workers down follows.
pub(crate) const SECTION_DOWN: u8 = 4;
/// Sections byte: the workers' placements follow.
pub(crate) const SECTION_PLACEMENT: u8 = 8;
/// Sections byte: the peer section's load entries carry arrivals.
const SECTION_ARRIVALS: u8 = 16;
const MAGIC: &[u8; 4] = b"KVRS";

/// A model the updater serves a tokenizer bundle for (`GET /v1/bundles/{fingerprint}/{part}`):
/// what Envoy should have to hash that model's prompts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelInfo {
    /// The model id clients send (the workers' base model in `/v1/models`).
    pub name: String,
    /// `ModelBundle::fingerprint()` of its bundle: part of the cache domain.
    pub fingerprint: u64,
    /// The workers' KV block size in tokens; 0 while not known yet (no worker announced one
    /// and none was configured).
    pub block_size: u32,
}

/// One worker's knowledge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotWorker {
    /// `ip:port`, as in the filter's pool.
    pub worker: String,
    /// When the updater last heard from this worker's event stream (unix ms).
    pub observed_at_ms: u64,
    /// False when the worker's config does not match kvroute's: no cache credit.
    pub compatible: bool,
    /// Canonical block hashes on the GPU tier.
    pub gpu: Vec<u64>,
    /// Canonical block hashes on lower tiers (CPU, storage).
    pub offloaded: Vec<u64>,
    /// What the worker last reported about its load, if scraped.
    pub load: Option<SnapshotLoad>,
    /// Its base model (the `/v1/models` entry without `parent`); empty while not known.
    pub model: String,
    /// The LoRA adapters it has loaded (`/v1/models` entries whose `parent` is the base).
    pub adapters: Vec<String>,
}

/// Worker-reported load (`vllm:num_requests_running` / `_waiting` or SGLang's), with its age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLoad {
    pub running: u32,
    pub waiting: u32,
    /// Unix ms of the scrape.
    pub observed_at_ms: u64,
}

/// A full snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Increases with every change the updater publishes.
    pub version: u64,
    pub generated_at_ms: u64,
    /// The models whose bundles the updater serves, sorted by name.
    pub models: Vec<ModelInfo>,
    pub workers: Vec<SnapshotWorker>,
    /// Other replicas' recent routing (format 4), when the caller asked for it.
    pub peers: Option<PeerSection>,
    /// The updater discovers the pool (format 5): `workers` is every member, a worker not
    /// listed is not one, and a worker's `model` says whose pool it is in. False: a partial
    /// view (the filter's configured pools stay the pools).
    pub pool: bool,
    /// Workers Envoy's health checking or outlier detection dropped (the updater's
    /// non-members), sorted: decisions leave them out. Their knowledge, if any, stays listed.
    pub down: Vec<String>,
    /// The workers' placements the updater discovered, sorted by worker (sections bit 8);
    /// empty when none is known or the caller did not ask (`placement=1`).
    pub placements: Vec<WorkerPlacement>,
}

/// Where a worker runs, as the updater discovered it (a Kubernetes EndpointSlice's `zone`
/// and `nodeName`, a pod's `spec.nodeName`, the discovery source's `site`, or labels
/// configured with a static worker), with the time it last saw them: placement is an
/// observation with an age like any other. `None`: not known.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerPlacement {
    /// `ip:port`, as in the filter's pool.
    pub worker: String,
    pub site: Option<String>,
    pub zone: Option<String>,
    pub rack: Option<String>,
    pub node: Option<String>,
    /// When the updater last saw these labels (unix ms).
    pub observed_at_ms: u64,
}

impl WorkerPlacement {
    fn encoded_len(&self) -> usize {
        18 + self.worker.len()
            + [&self.site, &self.zone, &self.rack, &self.node]
                .iter()
                .map(|l| l.as_ref().map_or(0, String::len))
                .sum::<usize>()
    }
}

/// Bytes [`put_placements`] writes.
pub(crate) fn placements_len(list: &[WorkerPlacement]) -> usize {
    2 + list.iter().map(WorkerPlacement::encoded_len).sum::<usize>()
}

/// Writes a u16-counted list of placements (at most `u16::MAX` of them).
pub(crate) fn put_placements(out: &mut Vec<u8>, list: &[WorkerPlacement]) {
    let list = &list[..list.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(list.len() as u16).to_le_bytes());
    for p in list {
        put_str(out, &p.worker);
        out.extend_from_slice(&p.observed_at_ms.to_le_bytes());
        for label in [&p.site, &p.zone, &p.rack, &p.node] {
            put_str(out, label.as_deref().unwrap_or(""));
        }
    }
}

/// Reads a list of placements, refusing counts past `max_workers` or past the end of the
/// payload; an empty label is an unknown one.
pub(crate) fn read_placements(
    r: &mut Reader<'_>,
    limits: &DecodeLimits,
) -> Result<Vec<WorkerPlacement>, SnapshotError> {
    let t = || SnapshotError::Truncated;
    let n = r.u16().ok_or_else(t)? as usize;
    if n > limits.max_workers {
        return Err(SnapshotError::TooLarge(n));
    }
    // Each entry is at least 18 bytes: five lengths and the time.
    if r.remaining() / 18 < n {
        return Err(t());
    }
    let label = |r: &mut Reader<'_>| read_str(r).map(|s| if s.is_empty() { None } else { Some(s) });
    (0..n)
        .map(|_| {
            let worker = read_str(r)?;
            let observed_at_ms = r.u64().ok_or_else(t)?;
            Ok(WorkerPlacement {
                worker,
                observed_at_ms,
                site: label(r)?,
                zone: label(r)?,
                rack: label(r)?,
                node: label(r)?,
            })
        })
        .collect()
}

/// The per-worker fields that full snapshots and deltas share.
pub(crate) struct WorkerHead {
    pub worker: String,
    pub observed_at_ms: u64,
    pub compatible: bool,
    pub load: Option<SnapshotLoad>,
}

pub(crate) fn put_head(
    out: &mut Vec<u8>,
    worker: &str,
    observed_at_ms: u64,
    compatible: bool,
    load: Option<&SnapshotLoad>,
) {
    put_str(out, worker);
    out.extend_from_slice(&observed_at_ms.to_le_bytes());
    out.push(u8::from(compatible));
    match load {
        None => out.push(0),
        Some(l) => {
            out.push(1);
            out.extend_from_slice(&l.running.to_le_bytes());
            out.extend_from_slice(&l.waiting.to_le_bytes());
            out.extend_from_slice(&l.observed_at_ms.to_le_bytes());
        }
    }
}

pub(crate) fn read_head(r: &mut Reader<'_>) -> Result<WorkerHead, SnapshotError> {
    let t = || SnapshotError::Truncated;
    let worker = read_str(r)?;
    let observed_at_ms = r.u64().ok_or_else(t)?;
    let compatible = r.u8().ok_or_else(t)? != 0;
    let load = match r.u8().ok_or_else(t)? {
        0 => None,
        _ => Some(SnapshotLoad {
            running: r.u32().ok_or_else(t)?,
            waiting: r.u32().ok_or_else(t)?,
            observed_at_ms: r.u64().ok_or_else(t)?,
        }),
    };
    Ok(WorkerHead { worker, observed_at_ms, compatible, load })
}

/// Writes a u16-counted list of strings (at most `u16::MAX` of them).
pub(crate) fn put_names(out: &mut Vec<u8>, names: &[String]) {
    let names = &names[..names.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(names.len() as u16).to_le_bytes());
    for n in names {
        put_str(out, n);
    }
}

/// Reads a list of strings, refusing counts past `max` or past the end of the payload.
pub(crate) fn read_names(r: &mut Reader<'_>, max: usize) -> Result<Vec<String>, SnapshotError> {
    let n = r.u16().ok_or(SnapshotError::Truncated)? as usize;
    if n > max {
        return Err(SnapshotError::TooLarge(n));
    }
    if r.remaining() < n * 2 {
        return Err(SnapshotError::Truncated);
    }
    (0..n).map(|_| read_str(r)).collect()
}

pub(crate) fn put_models(out: &mut Vec<u8>, models: &[ModelInfo]) {
    let models = &models[..models.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(models.len() as u16).to_le_bytes());
    for m in models {
        put_str(out, &m.name);
        out.extend_from_slice(&m.fingerprint.to_le_bytes());
        out.extend_from_slice(&m.block_size.to_le_bytes());
    }
}

/// Reads the model list, refusing counts past the bound or past the end of the payload.
pub(crate) fn read_models(
    r: &mut Reader<'_>,
    limits: &DecodeLimits,
) -> Result<Vec<ModelInfo>, SnapshotError> {
    let t = || SnapshotError::Truncated;
    let n = r.u16().ok_or_else(t)? as usize;
    if n > limits.max_models {
        return Err(SnapshotError::TooLarge(n));
    }
    if r.remaining() < n * 14 {
        return Err(SnapshotError::Truncated);
    }
    (0..n)
        .map(|_| {
            Ok(ModelInfo {
                name: read_str(r)?,
                fingerprint: r.u64().ok_or_else(t)?,
                block_size: r.u32().ok_or_else(t)?,
            })
        })
        .collect()
}

impl Snapshot {
    pub fn encode(&self) -> Vec<u8> {
        let size: usize = self
            .workers
            .iter()
            .map(|w| {
                36 + w.worker.len()
                    + w.model.len()
                    + w.adapters.iter().map(|a| 2 + a.len()).sum::<usize>()
                    + 8 * (w.gpu.len() + w.offloaded.len())
            })
            .sum::<usize>()
            + self.models.iter().map(|m| 14 + m.name.len()).sum::<usize>()
            + self.peers.as_ref().map_or(0, PeerSection::encoded_len);
        let size = size + self.down.iter().map(|w| 2 + w.len()).sum::<usize>();
        let placed = !self.placements.is_empty();
        let size = size + if placed { placements_len(&self.placements) } else { 0 };
        let mut out = Vec::with_capacity(26 + size);
        out.extend_from_slice(MAGIC);
        let arrivals = self.peers.as_ref().is_some_and(PeerSection::has_arrivals);
        let sections = self.pool || !self.down.is_empty() || placed || arrivals;
        out.push(match (sections, self.peers.is_some()) {
            (true, _) => SNAPSHOT_FORMAT_SECTIONS,
            (false, true) => SNAPSHOT_FORMAT_PEERS,
            (false, false) => SNAPSHOT_FORMAT,
        });
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.generated_at_ms.to_le_bytes());
        put_models(&mut out, &self.models);
        out.extend_from_slice(&(self.workers.len() as u32).to_le_bytes());
        for w in &self.workers {
            put_head(&mut out, &w.worker, w.observed_at_ms, w.compatible, w.load.as_ref());
            put_str(&mut out, &w.model);
            put_names(&mut out, &w.adapters);
            put_hashes(&mut out, &w.gpu);
            put_hashes(&mut out, &w.offloaded);
        }
        if sections {
            out.push(
                if self.pool { SECTION_POOL } else { 0 }
                    | if self.peers.is_some() { SECTION_PEERS } else { 0 }
                    | if self.down.is_empty() { 0 } else { SECTION_DOWN }
                    | if placed { SECTION_PLACEMENT } else { 0 }
                    | if arrivals { SECTION_ARRIVALS } else { 0 },
            );
        }
        if let Some(p) = &self.peers {
            p.encode_into(&mut out);
        }
        if !self.down.is_empty() {
            put_names(&mut out, &self.down);
        }
        if placed {
            put_placements(&mut out, &self.placements);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        Self::decode_with(bytes, &DecodeLimits::default())
    }

    /// Decodes within `limits`.
    pub fn decode_with(bytes: &[u8], limits: &DecodeLimits) -> Result<Snapshot, SnapshotError> {
        let mut r = Reader::new(bytes);
        let t = || SnapshotError::Truncated;
        if r.take(4).ok_or_else(t)? != MAGIC {
            return Err(SnapshotError::Magic);
        }
        let format = r.u8().ok_or_else(t)?;
        if !(SNAPSHOT_FORMAT..=SNAPSHOT_FORMAT_SECTIONS).contains(&format) {
            return Err(SnapshotError::Format(format));
        }
        let version = r.u64().ok_or_else(t)?;
        let generated_at_ms = r.u64().ok_or_else(t)?;
        let models = read_models(&mut r, limits)?;
        let n = r.u32().ok_or_else(t)? as usize;
        if n > limits.max_workers {
            return Err(SnapshotError::TooLarge(n));
        }
        let mut workers = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let WorkerHead { worker, observed_at_ms, compatible, load } = read_head(&mut r)?;
            let model = read_str(&mut r)?;
            let adapters = read_names(&mut r, limits.max_adapters_per_worker)?;
            let gpu = hashes(&mut r, limits)?;
            let offloaded = hashes(&mut r, limits)?;
            workers.push(SnapshotWorker {
                worker,
                observed_at_ms,
                compatible,
                gpu,
                offloaded,
                load,
                model,
                adapters,
            });
        }
        let sections = match format {
            SNAPSHOT_FORMAT_PEERS => SECTION_PEERS,
            SNAPSHOT_FORMAT_SECTIONS => {
                let known = SECTION_POOL
                    | SECTION_PEERS
                    | SECTION_DOWN
                    | SECTION_PLACEMENT
                    | SECTION_ARRIVALS;
                read_peer_sections(&mut r, known, SECTION_ARRIVALS)?
            }
            _ => 0,
        };
        let peers = match sections & SECTION_PEERS {
            0 => None,
            _ => Some(PeerSection::decode_from(&mut r, limits, sections & SECTION_ARRIVALS != 0)?),
        };
        let down = match sections & SECTION_DOWN {
            0 => Vec::new(),
            _ => read_names(&mut r, limits.max_workers)?,
        };
        let placements = match sections & SECTION_PLACEMENT {
            0 => Vec::new(),
            _ => read_placements(&mut r, limits)?,
        };
        if r.remaining() != 0 {
            return Err(SnapshotError::Trailing);
        }
        let pool = sections & SECTION_POOL != 0;
        Ok(Snapshot { version, generated_at_ms, models, workers, peers, pool, down, placements })
    }
}

/// [`read_sections`], also refusing the bit `arrivals` (the peer loads carry arrivals) without
/// the peer section's bit.
pub(crate) fn read_peer_sections(
    r: &mut Reader<'_>,
    known: u8,
    arrivals: u8,
) -> Result<u8, SnapshotError> {
    let s = read_sections(r, known)?;
    if s & arrivals != 0 && s & SECTION_PEERS == 0 {
        return Err(SnapshotError::Flags(s));
    }
    Ok(s)
}

/// Reads a sections byte, refusing bits outside `known`.
pub(crate) fn read_sections(r: &mut Reader<'_>, known: u8) -> Result<u8, SnapshotError> {
    let s = r.u8().ok_or(SnapshotError::Truncated)?;
    if s & !known != 0 {
        return Err(SnapshotError::Flags(s));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::conformance::codecs::snapshot_sample as sample;

    #[test]
    fn golden_bytes() {
        crate::conformance::codecs::snapshot_golden();
    }

    #[test]
    fn golden_bytes_of_a_pool() {
        crate::conformance::codecs::snapshot_pool_golden();
        crate::conformance::codecs::snapshot_down_golden();
        crate::conformance::codecs::snapshot_placement_golden();
    }

    #[test]
    fn hash_counts_past_the_32_bit_address_space_are_refused() {
        crate::conformance::codecs::hash_counts_past_the_32_bit_address_space_are_refused();
    }

    #[test]
    fn the_format_error_names_the_formats_decoded() {
        let want = format!(
            "snapshot format 9 is not supported (expected {SNAPSHOT_FORMAT} to {SNAPSHOT_FORMAT_SECTIONS})"
        );
        assert_eq!(SnapshotError::Format(9).to_string(), want);
    }

    #[test]
    fn corrupt_input_is_an_error() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            assert!(Snapshot::decode(&bytes[..n]).is_err());
        }
        let mut bad = bytes.clone();
        bad[4] = 9;
        assert_eq!(Snapshot::decode(&bad), Err(SnapshotError::Format(9)));
        // No models, then u32::MAX workers.
        let mut huge = bytes[..21].to_vec();
        huge.extend_from_slice(&0u16.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Snapshot::decode(&huge), Err(SnapshotError::TooLarge(_))));
    }

    #[test]
    fn model_and_adapter_counts_are_bounded_before_allocating() {
        let bytes = sample().encode();
        let tight = DecodeLimits { max_models: 0, ..DecodeLimits::default() };
        assert_eq!(Snapshot::decode_with(&bytes, &tight), Err(SnapshotError::TooLarge(1)));
        let tight = DecodeLimits { max_adapters_per_worker: 0, ..DecodeLimits::default() };
        assert_eq!(Snapshot::decode_with(&bytes, &tight), Err(SnapshotError::TooLarge(1)));
        // A model count the payload cannot hold.
        let mut short = bytes[..21].to_vec();
        short.extend_from_slice(&200u16.to_le_bytes());
        assert_eq!(Snapshot::decode(&short), Err(SnapshotError::Truncated));
    }

    #[test]
    fn placement_counts_are_bounded_by_the_worker_bound() {
        let mut s = sample();
        s.placements = (0..3)
            .map(|i| WorkerPlacement { worker: format!("w{i}"), ..WorkerPlacement::default() })
            .collect();
        let bytes = s.encode();
        let tight = DecodeLimits { max_workers: 2, ..DecodeLimits::default() };
        assert_eq!(Snapshot::decode_with(&bytes, &tight), Err(SnapshotError::TooLarge(3)));
        assert_eq!(Snapshot::decode(&bytes).unwrap().placements.len(), 3);
        // A count the payload cannot hold is refused before reading.
        let mut short = bytes[..bytes.len() - 3 * 18 - 6].to_vec();
        short.extend_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(Snapshot::decode(&short), Err(SnapshotError::Truncated));
        for n in 0..bytes.len() {
            assert!(Snapshot::decode(&bytes[..n]).is_err());
        }
    }

    #[test]
    fn long_names_are_cut_at_a_character_boundary() {
        let mut s = sample();
        s.workers[0].model = "é".repeat(40_000);
        let back = Snapshot::decode(&s.encode()).unwrap();
        assert_eq!(back.workers[0].model.len(), 65_534);
        assert!(s.workers[0].model.starts_with(&back.workers[0].model));
    }

    proptest! {
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Snapshot::decode(&bytes);
            for format in [3u8, 5] {
                let mut with_magic = b"KVRS".to_vec();
                with_magic.push(format);
                with_magic.extend_from_slice(&bytes);
                let _ = Snapshot::decode(&with_magic);
            }
        }

        #[test]
        fn round_trips(v: u64, names in proptest::collection::vec("[0-9.:]{1,21}", 0..4),
                       hashes in proptest::collection::vec(any::<u64>(), 0..40),
                       adapters in proptest::collection::vec("[a-z-]{0,12}", 0..3)) {
            let models = vec![ModelInfo { name: "qwen".into(), fingerprint: v, block_size: v as u32 }];
            let placements = names.iter().map(|w| WorkerPlacement {
                worker: w.clone(), site: Some("a".into()), zone: adapters.first().filter(|z| !z.is_empty()).cloned(),
                rack: None, node: Some(w.clone()), observed_at_ms: v }).collect();
            let s = Snapshot { version: v, generated_at_ms: v / 2, models, down: vec![], placements, workers: names.into_iter().map(|w| SnapshotWorker {
                worker: w, observed_at_ms: 5, compatible: false, gpu: hashes.clone(), offloaded: hashes.clone(),
                load: Some(SnapshotLoad { running: 3, waiting: v as u32, observed_at_ms: v }),
                model: "qwen".into(), adapters: adapters.clone() }).collect(), peers: None, pool: v % 2 == 0 };
            prop_assert_eq!(Snapshot::decode(&s.encode()), Ok(s));
        }
    }
}
