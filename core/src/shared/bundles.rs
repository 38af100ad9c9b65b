//! Model bundles (tokenizer + chat template) in shared data, from the updater to every thread.
//!
//! The singleton learns which bundles to have from the updater (`GET /v1/bundles`, and the
//! models its snapshots name) and fetches each missing one part by part
//! (`GET /v1/bundles/{fingerprint:016x}/{part}`, one request at a time, so it never blocks):
//!
//! - `kvroute.bundle.<fingerprint:016x>.<part>`: the parts of an encoded bundle
//!   ([`crate::wire::bundle`]), at most [`PART_BYTES`] each; a blanked (empty) value is absent;
//! - `kvroute.bundles`: the [`Manifest`] — which verified bundle each model uses (model →
//!   fingerprint, parts, bytes) and which old ones are still kept for a grace period. It is
//!   written only once every part of a bundle is stored, the whole decodes and the
//!   [`ModelBundle`] built from it has the fingerprint the updater named.
//!
//! [`Fetcher`] is the singleton's side: bounded (a few bundles, a byte budget), retrying a bad
//! or partial download with backoff and never publishing it, blanking old bundles after the
//! grace period. [`BundleFollower`] is a thread's side: on its tick (never on the request path)
//! it reads the small manifest, and builds at most one bundle it does not have yet.
//!
//! Time is passed in as unix milliseconds; nothing here reads a clock.

use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use thiserror::Error;

use crate::decision::config::sync::BundleLimits;
use crate::decision::config::{BundleRef, BundleSource, ModelConfig};
use crate::decision::tokenize::model::ModelBundle;
use crate::wire::bundle::{part_count, BundleBlob, BundleError, MAX_BUNDLE_BYTES, PART_BYTES};
use crate::wire::Reader;

use super::SharedStore;

/// The manifest's shared-data key.
pub const MANIFEST_KEY: &str = "kvroute.bundles";
const MANIFEST_MAGIC: &[u8; 4] = b"KVRM";
/// Format version of the manifest encoding.
pub const MANIFEST_FORMAT: u8 = 1;
/// Most models a manifest or the updater's list may name.
pub const MAX_MODELS: usize = 256;
/// Longest model name accepted.
pub const MAX_NAME_BYTES: usize = 256;
/// Most parts one bundle may have ([`MAX_BUNDLE_BYTES`] / [`PART_BYTES`]).
pub const MAX_PARTS: u32 = (MAX_BUNDLE_BYTES / PART_BYTES) as u32;

/// The shared-data key of part `part` of the bundle `fingerprint`.
pub fn part_key(fingerprint: u64, part: u32) -> String {
    format!("kvroute.bundle.{fingerprint:016x}.{part}")
}

/// The updater's path for part `part` of the bundle `fingerprint`.
pub fn part_path(fingerprint: u64, part: u32) -> String {
    format!("/v1/bundles/{fingerprint:016x}/{part}")
}

/// The updater's list of bundles.
pub const LIST_PATH: &str = "/v1/bundles";
/// The answer header naming how many parts the bundle has.
pub const PARTS_HEADER: &str = "x-kvroute-bundle-parts";

/// A verified bundle a model uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedBundle {
    pub model: String,
    pub fingerprint: u64,
    pub parts: u32,
    pub bytes: u64,
}

/// A bundle no model uses any more, kept until `since_ms + grace_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retired {
    pub fingerprint: u64,
    pub parts: u32,
    pub bytes: u64,
    pub since_ms: u64,
}

/// What `kvroute.bundles` holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Bumped by every publication.
    pub generation: u64,
    /// One entry per model, sorted by name.
    pub models: Vec<PublishedBundle>,
    pub retired: Vec<Retired>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("manifest truncated")]
    Truncated,
    #[error("not a kvroute bundle manifest")]
    Magic,
    #[error("manifest format {0} is not supported (expected {MANIFEST_FORMAT})")]
    Format(u8),
    #[error("manifest count or size {0} exceeds its bound")]
    TooLarge(usize),
    #[error("manifest model name is not UTF-8")]
    Utf8,
    #[error("trailing bytes after the manifest")]
    Trailing,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(32 + 40 * (self.models.len() + self.retired.len()));
        b.extend_from_slice(MANIFEST_MAGIC);
        b.push(MANIFEST_FORMAT);
        b.extend_from_slice(&self.generation.to_le_bytes());
        let models = &self.models[..self.models.len().min(MAX_MODELS)];
        b.extend_from_slice(&(models.len() as u16).to_le_bytes());
        for m in models {
            let name = &m.model.as_bytes()[..m.model.len().min(MAX_NAME_BYTES)];
            b.extend_from_slice(&(name.len() as u16).to_le_bytes());
            b.extend_from_slice(name);
            b.extend_from_slice(&m.fingerprint.to_le_bytes());
            b.extend_from_slice(&m.parts.to_le_bytes());
            b.extend_from_slice(&m.bytes.to_le_bytes());
        }
        let retired = &self.retired[..self.retired.len().min(MAX_MODELS)];
        b.extend_from_slice(&(retired.len() as u16).to_le_bytes());
        for r in retired {
            b.extend_from_slice(&r.fingerprint.to_le_bytes());
            b.extend_from_slice(&r.parts.to_le_bytes());
            b.extend_from_slice(&r.bytes.to_le_bytes());
            b.extend_from_slice(&r.since_ms.to_le_bytes());
        }
        b
    }

    /// Decodes a manifest; an error for anything malformed (never panics).
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let t = || ManifestError::Truncated;
        let mut r = Reader::new(bytes);
        if r.take(4).ok_or_else(t)? != MANIFEST_MAGIC {
            return Err(ManifestError::Magic);
        }
        let format = r.u8().ok_or_else(t)?;
        if format != MANIFEST_FORMAT {
            return Err(ManifestError::Format(format));
        }
        let generation = r.u64().ok_or_else(t)?;
        let n = r.u16().ok_or_else(t)? as usize;
        if n > MAX_MODELS {
            return Err(ManifestError::TooLarge(n));
        }
        let mut models = Vec::with_capacity(n);
        for _ in 0..n {
            let len = r.u16().ok_or_else(t)? as usize;
            if len > MAX_NAME_BYTES {
                return Err(ManifestError::TooLarge(len));
            }
            let model = String::from_utf8(r.take(len).ok_or_else(t)?.to_vec())
                .map_err(|_| ManifestError::Utf8)?;
            let fingerprint = r.u64().ok_or_else(t)?;
            let parts = r.u32().ok_or_else(t)?;
            let bytes = r.u64().ok_or_else(t)?;
            check_size(parts, bytes).map_err(|_| ManifestError::TooLarge(parts as usize))?;
            models.push(PublishedBundle { model, fingerprint, parts, bytes });
        }
        let n = r.u16().ok_or_else(t)? as usize;
        if n > MAX_MODELS {
            return Err(ManifestError::TooLarge(n));
        }
        let mut retired = Vec::with_capacity(n);
        for _ in 0..n {
            let (fingerprint, parts) = (r.u64().ok_or_else(t)?, r.u32().ok_or_else(t)?);
            let (bytes, since_ms) = (r.u64().ok_or_else(t)?, r.u64().ok_or_else(t)?);
            check_size(parts, bytes).map_err(|_| ManifestError::TooLarge(parts as usize))?;
            retired.push(Retired { fingerprint, parts, bytes, since_ms });
        }
        if r.remaining() != 0 {
            return Err(ManifestError::Trailing);
        }
        Ok(Manifest { generation, models, retired })
    }

    /// The bundle `model` uses.
    pub fn model(&self, model: &str) -> Option<&PublishedBundle> {
        self.models.iter().find(|m| m.model == model)
    }

    /// Every bundle kept (in use or retired), once each: fingerprint → (parts, bytes).
    pub fn stored(&self) -> HashMap<u64, (u32, u64)> {
        let used = self.models.iter().map(|m| (m.fingerprint, (m.parts, m.bytes)));
        let old = self.retired.iter().map(|r| (r.fingerprint, (r.parts, r.bytes)));
        used.chain(old).collect()
    }

    /// Bytes of every bundle kept.
    pub fn stored_bytes(&self) -> u64 {
        self.stored().values().map(|(_, b)| b).sum()
    }
}

/// Reads the manifest (absent, blank or unreadable: `None`).
pub fn read_manifest<S: SharedStore + ?Sized>(store: &S) -> Option<Manifest> {
    Manifest::decode(&store.get(MANIFEST_KEY).0?).ok()
}

/// `parts` must be what [`part_count`] gives for `bytes`, within the bounds.
fn check_size(parts: u32, bytes: u64) -> Result<(), String> {
    if bytes == 0 || bytes > MAX_BUNDLE_BYTES as u64 {
        return Err(format!("bundle of {bytes} bytes is outside 1..={MAX_BUNDLE_BYTES}"));
    }
    if parts as usize != part_count(bytes as usize) {
        return Err(format!("{parts} parts do not fit {bytes} bytes"));
    }
    Ok(())
}

/// One bundle the updater offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub model: String,
    pub fingerprint: u64,
    pub parts: u32,
    pub bytes: u64,
}

#[derive(Deserialize)]
struct ListJson {
    bundles: Vec<ListedJson>,
}

#[derive(Deserialize)]
struct ListedJson {
    model: String,
    fingerprint: String,
    parts: u32,
    bytes: u64,
}

/// Why the updater's list was not taken.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ListError {
    #[error("bundle list is not valid JSON: {0}")]
    Json(String),
    #[error("bundle list names {0} models, more than {MAX_MODELS}")]
    TooMany(usize),
}

/// Parses `GET /v1/bundles`: `{"bundles":[{"model","fingerprint":"<16 hex>","parts","bytes"}]}`.
/// Entries that are malformed (bad fingerprint, sizes that do not fit, repeated model) are left
/// out and counted in the second value; unknown fields are ignored (the updater may add some).
pub fn parse_list(bytes: &[u8]) -> Result<(Vec<Listed>, usize), ListError> {
    let list: ListJson =
        serde_json::from_slice(bytes).map_err(|e| ListError::Json(e.to_string()))?;
    if list.bundles.len() > MAX_MODELS {
        return Err(ListError::TooMany(list.bundles.len()));
    }
    let mut out: Vec<Listed> = Vec::with_capacity(list.bundles.len());
    let mut bad = 0;
    for e in list.bundles {
        let fingerprint = match BundleRef::try_from(e.fingerprint) {
            Ok(BundleRef::Pinned(fp)) => fp,
            _ => {
                bad += 1;
                continue;
            }
        };
        let name_ok = !e.model.is_empty() && e.model.len() <= MAX_NAME_BYTES;
        if !name_ok
            || check_size(e.parts, e.bytes).is_err()
            || out.iter().any(|o| o.model == e.model)
        {
            bad += 1;
            continue;
        }
        out.push(Listed { model: e.model, fingerprint, parts: e.parts, bytes: e.bytes });
    }
    out.sort_by(|a, b| a.model.cmp(&b.model));
    Ok((out, bad))
}

/// Builds the bundle from its transfer form and returns it, for its fingerprint to be checked
/// (a compiled bundle carries the fingerprint it was built with from its files).
pub fn build(blob: &BundleBlob) -> Result<ModelBundle, String> {
    match blob {
        BundleBlob::Files(files) => {
            let tokenizer = utf8(&files.tokenizer_json, "tokenizer.json")?;
            let config = utf8(&files.tokenizer_config_json, "tokenizer_config.json")?;
            ModelBundle::from_hf(tokenizer, config)
        }
        BundleBlob::Compiled(c) => {
            let config = utf8(&c.tokenizer_config_json, "tokenizer_config.json")?;
            ModelBundle::from_compiled(c.fingerprint, &c.encoder, config)
        }
    }
    .map_err(|e| e.to_string())
}

/// `bytes` as text, borrowed (no copy of an 11 MB `tokenizer.json` in the VM).
fn utf8<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str, String> {
    std::str::from_utf8(bytes).map_err(|_| format!("{what} is not UTF-8"))
}

/// What the singleton checks a downloaded bundle against the `listed` fingerprint with,
/// without building it: a compiled bundle states its fingerprint; files are only checked
/// when a thread builds them (so `listed` is returned).
pub fn stated_fingerprint(blob: &BundleBlob, listed: u64) -> u64 {
    match blob {
        BundleBlob::Compiled(c) => c.fingerprint,
        BundleBlob::Files(_) => listed,
    }
}

/// Reads and joins the `parts` parts of bundle `fingerprint`; `None` if one is missing or the
/// total is not `bytes`.
pub fn read_parts<S: SharedStore + ?Sized>(
    store: &S,
    fingerprint: u64,
    parts: u32,
    bytes: u64,
) -> Option<Vec<u8>> {
    check_size(parts, bytes).ok()?;
    let mut out = Vec::with_capacity(bytes as usize);
    for i in 0..parts {
        let part = store.get(&part_key(fingerprint, i)).0.filter(|p| !p.is_empty())?;
        out.extend_from_slice(&part);
        if out.len() as u64 > bytes {
            return None;
        }
    }
    (out.len() as u64 == bytes).then_some(out)
}

/// Why a download was abandoned (it is retried later, with backoff, and never published).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FetchError {
    #[error("updater answered status {0}")]
    Status(u16),
    #[error("no answer (timeout or connection failure)")]
    NoAnswer,
    #[error("x-kvroute-bundle-parts is missing or disagrees with the list")]
    PartsHeader,
    #[error("part {part} has {got} bytes, expected {expected}")]
    PartSize { part: u32, got: usize, expected: usize },
    #[error("shared data refused a part")]
    Store,
    #[error("stored parts could not be read back")]
    ReadBack,
    #[error("bundle does not decode: {0}")]
    Decode(#[from] BundleError),
    #[error("bundle does not build: {0}")]
    Build(String),
    #[error("bundle fingerprint is {got:016x}, the updater named {expected:016x}")]
    Fingerprint { expected: u64, got: u64 },
}

/// A part to ask the updater for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartRequest {
    pub fingerprint: u64,
    pub part: u32,
}

impl PartRequest {
    pub fn path(&self) -> String {
        part_path(self.fingerprint, self.part)
    }
}

/// What a received part led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Stored; more parts to go.
    Stored,
    /// The answer was not for the download in progress (late, or the download was dropped).
    Ignored,
    /// The last part: the bundle was verified and the manifest now names it for `models`.
    Published { fingerprint: u64, models: Vec<String>, bytes: u64 },
}

/// What the singleton's housekeeping and list handling did, for counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Housekeeping {
    /// Retired bundles whose parts were blanked.
    pub removed: usize,
    /// Wanted bundles left out by `max_bundles` / `max_total_bytes`.
    pub capped: usize,
}

#[derive(Debug, Clone)]
struct Download {
    fingerprint: u64,
    parts: u32,
    bytes: u64,
    /// Next part to ask for.
    next: u32,
    in_flight: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Backoff {
    failures: u32,
    retry_at_ms: u64,
}

/// The singleton's side.
#[derive(Debug)]
pub struct Fetcher {
    limits: BundleLimits,
    manifest: Manifest,
    wanted: Vec<Listed>,
    download: Option<Download>,
    backoff: HashMap<u64, Backoff>,
    /// Fingerprints already reported as capped (counted once each).
    capped: HashSet<u64>,
}

impl Fetcher {
    /// Starts from the manifest already in shared data, if any (a singleton that was
    /// reconfigured keeps what its predecessor published).
    pub fn new<S: SharedStore + ?Sized>(limits: BundleLimits, store: &S) -> Self {
        Fetcher {
            limits,
            manifest: read_manifest(store).unwrap_or_default(),
            wanted: Vec::new(),
            download: None,
            backoff: HashMap::new(),
            capped: HashSet::new(),
        }
    }

    pub fn limits(&self) -> &BundleLimits {
        &self.limits
    }

    /// What is published.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Whether `fingerprint` is wanted or stored (a snapshot naming anything else means the
    /// list should be polled again).
    pub fn knows(&self, fingerprint: u64) -> bool {
        self.wanted.iter().any(|w| w.fingerprint == fingerprint)
            || self.manifest.stored().contains_key(&fingerprint)
    }

    /// Takes the updater's current list. A download of a bundle no longer listed is dropped.
    /// Models missing from the list keep their last verified bundle.
    pub fn set_wanted<S: SharedStore + ?Sized>(&mut self, store: &S, wanted: Vec<Listed>) {
        self.wanted = wanted;
        if let Some(d) = &self.download {
            if !self.wanted.iter().any(|w| w.fingerprint == d.fingerprint) {
                let d = d.clone();
                blank(store, d.fingerprint, d.next.saturating_add(1).min(d.parts));
                self.download = None;
            }
        }
    }

    /// Housekeeping and the next part to ask for (`None`: nothing to do, or a part is in
    /// flight). Call on every tick and after every answer.
    pub fn next<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        now_ms: u64,
    ) -> (Option<PartRequest>, Housekeeping) {
        let mut hk = Housekeeping { removed: self.expire(store, now_ms), ..Default::default() };
        self.relink(store, now_ms);
        if self.download.is_none() {
            self.download = self.choose(store, now_ms, &mut hk);
        }
        let req = match &mut self.download {
            Some(d) if !d.in_flight => {
                d.in_flight = true;
                Some(PartRequest { fingerprint: d.fingerprint, part: d.next })
            }
            _ => None,
        };
        (req, hk)
    }

    /// Blanks retired bundles past the grace period.
    fn expire<S: SharedStore + ?Sized>(&mut self, store: &S, now_ms: u64) -> usize {
        let grace = self.limits.grace_ms;
        let (gone, kept): (Vec<Retired>, Vec<Retired>) =
            self.manifest.retired.iter().partition(|r| now_ms.saturating_sub(r.since_ms) >= grace);
        if gone.is_empty() {
            return 0;
        }
        self.manifest.retired = kept;
        self.write(store);
        for r in &gone {
            blank(store, r.fingerprint, r.parts);
        }
        gone.len()
    }

    /// Points listed models at bundles already stored (another model's, or a retired one)
    /// without downloading anything.
    fn relink<S: SharedStore + ?Sized>(&mut self, store: &S, now_ms: u64) {
        let stored = self.manifest.stored();
        let mut changed = false;
        for w in self.wanted.clone() {
            if self.manifest.model(&w.model).is_some_and(|m| m.fingerprint == w.fingerprint) {
                continue;
            }
            if let Some(&(parts, bytes)) = stored.get(&w.fingerprint) {
                let p = PublishedBundle {
                    model: w.model.clone(),
                    fingerprint: w.fingerprint,
                    parts,
                    bytes,
                };
                self.assign(p, now_ms);
                changed = true;
            }
        }
        if changed {
            self.write(store);
        }
    }

    /// The next bundle to download: the first listed one not stored, not backing off, that
    /// fits the bounds (retired bundles are dropped early to make room).
    fn choose<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        now_ms: u64,
        hk: &mut Housekeeping,
    ) -> Option<Download> {
        let stored = self.manifest.stored();
        let candidates: Vec<Listed> = self
            .wanted
            .iter()
            .filter(|w| !stored.contains_key(&w.fingerprint))
            .filter(|w| self.backoff.get(&w.fingerprint).is_none_or(|b| now_ms >= b.retry_at_ms))
            .cloned()
            .collect();
        for w in candidates {
            if !self.make_room(store, w.bytes) {
                if self.capped.insert(w.fingerprint) {
                    hk.capped += 1;
                }
                continue;
            }
            return Some(Download {
                fingerprint: w.fingerprint,
                parts: w.parts,
                bytes: w.bytes,
                next: 0,
                in_flight: false,
            });
        }
        None
    }

    /// Whether a bundle of `bytes` fits beside what is kept, after dropping retired bundles
    /// (oldest first) if needed.
    fn make_room<S: SharedStore + ?Sized>(&mut self, store: &S, bytes: u64) -> bool {
        let fits = |m: &Manifest, l: &BundleLimits| {
            m.stored().len() < l.max_bundles && m.stored_bytes() + bytes <= l.max_total_bytes
        };
        if fits(&self.manifest, &self.limits) {
            return true;
        }
        let mut retired = self.manifest.retired.clone();
        retired.sort_by_key(|r| r.since_ms);
        let mut dropped = Vec::new();
        let mut trial = self.manifest.clone();
        for r in retired {
            if fits(&trial, &self.limits) {
                break;
            }
            trial.retired.retain(|x| x.fingerprint != r.fingerprint);
            dropped.push(r);
        }
        if !fits(&trial, &self.limits) {
            return false;
        }
        self.manifest.retired = trial.retired;
        self.write(store);
        for r in dropped {
            blank(store, r.fingerprint, r.parts);
        }
        true
    }

    /// The answer to `req`: `status` (0: no answer), the parts header, the body. Stores the
    /// part; after the last one verifies the whole (`verify` builds it and returns its
    /// fingerprint) and publishes it.
    #[allow(clippy::too_many_arguments)]
    pub fn received<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        req: PartRequest,
        status: u16,
        parts_header: Option<&[u8]>,
        body: &[u8],
        now_ms: u64,
        verify: &mut dyn FnMut(&BundleBlob) -> Result<u64, String>,
    ) -> Result<Progress, FetchError> {
        let current = self
            .download
            .as_ref()
            .is_some_and(|d| d.in_flight && d.fingerprint == req.fingerprint && d.next == req.part);
        if !current {
            return Ok(Progress::Ignored);
        }
        let r = self.store_part(store, status, parts_header, body, now_ms, verify);
        if r.is_err() {
            self.abandon(store, now_ms);
        }
        r
    }

    /// No answer came for `req` (dispatch failed, timeout): the download is abandoned.
    pub fn failed<S: SharedStore + ?Sized>(&mut self, store: &S, req: PartRequest, now_ms: u64) {
        if self.download.as_ref().is_some_and(|d| d.fingerprint == req.fingerprint) {
            self.abandon(store, now_ms);
        }
    }

    fn store_part<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        status: u16,
        parts_header: Option<&[u8]>,
        body: &[u8],
        now_ms: u64,
        verify: &mut dyn FnMut(&BundleBlob) -> Result<u64, String>,
    ) -> Result<Progress, FetchError> {
        let Some(d) = self.download.as_mut() else { return Ok(Progress::Ignored) };
        match status {
            200 => {}
            0 => return Err(FetchError::NoAnswer),
            s => return Err(FetchError::Status(s)),
        }
        let parts = parts_header
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| h.trim().parse::<u32>().ok());
        if parts != Some(d.parts) {
            return Err(FetchError::PartsHeader);
        }
        let start = u64::from(d.next) * PART_BYTES as u64;
        let expected = (d.bytes - start).min(PART_BYTES as u64) as usize;
        if body.len() != expected {
            return Err(FetchError::PartSize { part: d.next, got: body.len(), expected });
        }
        store.set(&part_key(d.fingerprint, d.next), body, None).map_err(|_| FetchError::Store)?;
        d.in_flight = false;
        d.next += 1;
        if d.next < d.parts {
            return Ok(Progress::Stored);
        }
        let (fingerprint, parts, bytes) = (d.fingerprint, d.parts, d.bytes);
        let whole = read_parts(store, fingerprint, parts, bytes).ok_or(FetchError::ReadBack)?;
        let blob = BundleBlob::decode(&whole)?;
        drop(whole);
        let got = verify(&blob).map_err(FetchError::Build)?;
        if got != fingerprint {
            return Err(FetchError::Fingerprint { expected: fingerprint, got });
        }
        self.download = None;
        self.backoff.remove(&fingerprint);
        let models: Vec<String> = self
            .wanted
            .iter()
            .filter(|w| w.fingerprint == fingerprint)
            .map(|w| w.model.clone())
            .collect();
        for m in &models {
            let p = PublishedBundle { model: m.clone(), fingerprint, parts, bytes };
            self.assign(p, now_ms);
        }
        if models.is_empty() {
            // No longer listed by the time it arrived: kept as retired, then removed.
            self.manifest.retired.push(Retired { fingerprint, parts, bytes, since_ms: now_ms });
        }
        self.write(store);
        Ok(Progress::Published { fingerprint, models, bytes })
    }

    /// Makes `p` the model's bundle; the bundle it replaces is retired if no model uses it.
    fn assign(&mut self, p: PublishedBundle, now_ms: u64) {
        self.manifest.retired.retain(|r| r.fingerprint != p.fingerprint);
        let old = match self.manifest.models.iter_mut().find(|m| m.model == p.model) {
            Some(slot) => Some(std::mem::replace(slot, p)),
            None => {
                self.manifest.models.push(p);
                self.manifest.models.sort_by(|a, b| a.model.cmp(&b.model));
                None
            }
        };
        if let Some(old) = old {
            let used = self.manifest.models.iter().any(|m| m.fingerprint == old.fingerprint);
            if !used {
                self.manifest.retired.push(Retired {
                    fingerprint: old.fingerprint,
                    parts: old.parts,
                    bytes: old.bytes,
                    since_ms: now_ms,
                });
            }
        }
    }

    fn abandon<S: SharedStore + ?Sized>(&mut self, store: &S, now_ms: u64) {
        let Some(d) = self.download.take() else { return };
        blank(store, d.fingerprint, d.next.saturating_add(1).min(d.parts));
        let b = self.backoff.entry(d.fingerprint).or_default();
        b.failures = b.failures.saturating_add(1);
        let shift = (b.failures - 1).min(20);
        let wait =
            self.limits.retry_min_ms.saturating_mul(1 << shift).min(self.limits.retry_max_ms);
        b.retry_at_ms = now_ms.saturating_add(wait);
    }

    fn write<S: SharedStore + ?Sized>(&mut self, store: &S) {
        self.manifest.generation = self.manifest.generation.wrapping_add(1);
        // A lost write is repaired by the next publication; threads keep what they built.
        let _ = store.set(MANIFEST_KEY, &self.manifest.encode(), None);
    }
}

/// Blanks parts `0..parts` of a bundle (shared data has no delete: an empty value is absent).
fn blank<S: SharedStore + ?Sized>(store: &S, fingerprint: u64, parts: u32) {
    for i in 0..parts.min(MAX_PARTS) {
        let _ = store.set(&part_key(fingerprint, i), &[], None);
    }
}

/// What a thread's tick did with bundles.
#[derive(Debug, Default)]
pub struct BundleTick {
    /// The models whose bundle changed, with the bundle to use now (`None`: none available).
    /// Empty when nothing changed.
    pub changed: Vec<(String, Option<ModelBundle>)>,
    /// A bundle built this tick: fingerprint and encoded bytes (the caller times the tick).
    pub built: Option<(u64, u64)>,
    /// A build that failed this tick: fingerprint and why.
    pub failed: Option<(u64, String)>,
}

/// A thread's side: which bundle each updater-fed model uses, built from shared data.
#[derive(Debug, Default)]
pub struct BundleFollower {
    /// Models fed by the updater, and how.
    models: Vec<(String, BundleRef)>,
    /// Bundles built, by fingerprint.
    built: HashMap<u64, ModelBundle>,
    /// What each model uses now.
    using: HashMap<String, u64>,
    failures: HashMap<u64, Backoff>,
    retry_min_ms: u64,
    retry_max_ms: u64,
}

impl BundleFollower {
    /// Follows the models of `models` whose bundle comes from the updater.
    pub fn new(models: &[ModelConfig]) -> Self {
        let models = models
            .iter()
            .filter_map(|m| match m.bundle_source() {
                BundleSource::Shared(r) => Some((m.name.clone(), r)),
                _ => None,
            })
            .collect();
        BundleFollower { models, retry_min_ms: 2_000, retry_max_ms: 60_000, ..Default::default() }
    }

    /// Whether any model needs bundles from shared data.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// How many followed models have a bundle.
    pub fn ready(&self) -> usize {
        self.using.len()
    }

    /// Whether every followed model has a bundle (true when none is followed).
    pub fn complete(&self) -> bool {
        self.models.iter().all(|(name, _)| self.using.contains_key(name))
    }

    /// Reads the manifest, builds at most one missing bundle, and says which models changed
    /// bundle.
    pub fn tick<S: SharedStore + ?Sized>(&mut self, store: &S, now_ms: u64) -> BundleTick {
        let mut out = BundleTick::default();
        if self.models.is_empty() {
            return out;
        }
        let Some(manifest) = read_manifest(store) else { return out };
        // The fingerprint each model should use now.
        let targets: Vec<(String, Option<&PublishedBundle>)> = self
            .models
            .iter()
            .map(|(name, r)| {
                let p = manifest.model(name).filter(|p| match r {
                    BundleRef::Updater => true,
                    BundleRef::Pinned(fp) => p.fingerprint == *fp,
                });
                (name.clone(), p)
            })
            .collect();
        // Build one missing bundle (the first model's that is not backing off).
        let missing = targets.iter().filter_map(|(_, p)| *p).find(|p| {
            !self.built.contains_key(&p.fingerprint)
                && self.failures.get(&p.fingerprint).is_none_or(|b| now_ms >= b.retry_at_ms)
        });
        if let Some(p) = missing {
            match read_parts(store, p.fingerprint, p.parts, p.bytes)
                .ok_or_else(|| "parts missing from shared data".to_string())
                .and_then(|whole| BundleBlob::decode(&whole).map_err(|e| e.to_string()))
                .and_then(|blob| build(&blob))
            {
                Ok(b) if b.fingerprint() == p.fingerprint => {
                    self.built.insert(p.fingerprint, b);
                    self.failures.remove(&p.fingerprint);
                    out.built = Some((p.fingerprint, p.bytes));
                }
                Ok(b) => {
                    self.fail(p.fingerprint, now_ms);
                    out.failed = Some((
                        p.fingerprint,
                        format!("built fingerprint {:016x}", b.fingerprint()),
                    ));
                }
                Err(e) => {
                    self.fail(p.fingerprint, now_ms);
                    out.failed = Some((p.fingerprint, e));
                }
            }
        }
        for (name, p) in &targets {
            let want = p.map(|p| p.fingerprint).filter(|fp| self.built.contains_key(fp));
            let have = self.using.get(name).copied();
            if want == have {
                continue;
            }
            // A model keeps its bundle until the new one is built; it loses it only when the
            // manifest names none (or not the pinned one) any more.
            let next = match (want, p) {
                (Some(fp), _) => Some(fp),
                (None, Some(_)) => have,
                (None, None) => None,
            };
            if next == have {
                continue;
            }
            match next {
                Some(fp) => {
                    self.using.insert(name.clone(), fp);
                }
                None => {
                    self.using.remove(name);
                }
            }
            out.changed.push((name.clone(), next.and_then(|fp| self.built.get(&fp).cloned())));
        }
        // Bundles no model uses any more are dropped (their memory is reused).
        let used: HashSet<u64> = self.using.values().copied().collect();
        self.built.retain(|fp, _| used.contains(fp));
        out
    }

    fn fail(&mut self, fingerprint: u64, now_ms: u64) {
        let b = self.failures.entry(fingerprint).or_default();
        b.failures = b.failures.saturating_add(1);
        let wait = self.retry_min_ms.saturating_mul(1 << (b.failures - 1).min(20));
        b.retry_at_ms = now_ms.saturating_add(wait.min(self.retry_max_ms));
    }
}

#[cfg(test)]
mod tests;
