//! Bounds on everything a worker can make the updater hold, and the counters of how often each
//! bound was reached. Defaults sit well above what a healthy vLLM-class engine produces, so a
//! cap that is hit means drift (missed removals), misconfiguration or a misbehaving peer.

use std::time::Duration;

/// Which bound was reached (the `cap` label of `kvroute_updater_caps_hit_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// Blocks known on one tier of one worker.
    BlocksPerTier,
    /// Engine-hash -> canonical-hash entries of one worker.
    EngineKeys,
    /// Batches taken from one replay.
    ReplayBatches,
    /// Payload bytes taken from one replay.
    ReplayBytes,
    /// Time spent on one replay.
    ReplayTime,
    /// One ZMTP frame longer than the frame cap (refused before the ZMQ codec sees it).
    FrameBytes,
    /// One ZMQ message with more frames than the frame-count cap.
    MessageFrames,
    /// A batch payload larger than the payload cap (refused before msgpack decoding).
    PayloadBytes,
    /// One ZMQ message whose frames together exceed the message cap (the frames past it are
    /// emptied before the ZMQ codec sees them).
    MessageBytes,
    /// A batch holding more msgpack elements than the element cap (refused before decoding).
    BatchElements,
    /// A batch declaring a container, string or binary larger than its bytes can hold
    /// (refused before decoding: the shape of a msgpack bomb).
    DeclaredLength,
    /// A batch nesting containers deeper than a batch needs (refused before decoding).
    DecodeDepth,
    /// An HTTP answer from the worker (`/metrics`, `/tokenize`, `/v1/models`) too large.
    HttpBody,
    /// A worker listed more LoRA adapters than kept (the rest are not published).
    Adapters,
    /// A model or adapter name in `/v1/models` longer than kept (not published).
    AdapterName,
}

impl Cap {
    pub const ALL: [Cap; 15] = [
        Cap::BlocksPerTier,
        Cap::EngineKeys,
        Cap::ReplayBatches,
        Cap::ReplayBytes,
        Cap::ReplayTime,
        Cap::FrameBytes,
        Cap::MessageFrames,
        Cap::PayloadBytes,
        Cap::MessageBytes,
        Cap::BatchElements,
        Cap::DeclaredLength,
        Cap::DecodeDepth,
        Cap::HttpBody,
        Cap::Adapters,
        Cap::AdapterName,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Cap::BlocksPerTier => "blocks_per_tier",
            Cap::EngineKeys => "engine_keys",
            Cap::ReplayBatches => "replay_batches",
            Cap::ReplayBytes => "replay_bytes",
            Cap::ReplayTime => "replay_time",
            Cap::FrameBytes => "frame_bytes",
            Cap::MessageFrames => "message_frames",
            Cap::PayloadBytes => "payload_bytes",
            Cap::MessageBytes => "message_bytes",
            Cap::BatchElements => "batch_elements",
            Cap::DeclaredLength => "declared_length",
            Cap::DecodeDepth => "decode_depth",
            Cap::HttpBody => "http_body",
            Cap::Adapters => "adapters",
            Cap::AdapterName => "adapter_name",
        }
    }
}

/// How often each cap was hit, per worker (`/status` → `stats.caps_hit`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapsHit([u64; Cap::ALL.len()]);

impl CapsHit {
    pub fn hit(&mut self, cap: Cap) {
        self.add(cap, 1);
    }

    pub fn add(&mut self, cap: Cap, n: u64) {
        let slot = &mut self.0[cap as usize];
        *slot = slot.saturating_add(n);
    }

    pub fn get(&self, cap: Cap) -> u64 {
        self.0[cap as usize]
    }
}

impl serde::Serialize for CapsHit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(Cap::ALL.len()))?;
        for cap in Cap::ALL {
            m.serialize_entry(cap.name(), &self.get(cap))?;
        }
        m.end()
    }
}

/// Bounds on one worker's block index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLimits {
    /// Canonical blocks kept per tier.
    pub max_blocks_per_tier: usize,
    /// Engine-hash -> canonical entries kept, all tiers together.
    pub max_engine_keys: usize,
}

impl Default for BlockLimits {
    fn default() -> Self {
        // An 8B model on one H200 holds ~60 k GPU blocks of 16 tokens; offload tiers can be
        // ten times larger. 1 M blocks per tier is ~40 MB of index at most per tier and worker.
        BlockLimits { max_blocks_per_tier: 1 << 20, max_engine_keys: 3 << 20 }
    }
}

/// Bounds on one replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayLimits {
    pub max_batches: usize,
    pub max_bytes: usize,
    pub max_time: Duration,
    /// After a replay was cut, no new replay for this worker before this much time passed.
    pub retry_after: Duration,
}

impl Default for ReplayLimits {
    fn default() -> Self {
        // vLLM buffers 10 000 batches by default.
        ReplayLimits {
            max_batches: 20_000,
            max_bytes: 256 << 20,
            max_time: Duration::from_secs(10),
            retry_after: Duration::from_secs(5),
        }
    }
}

/// Bounds on what one ZMQ connection may deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireLimits {
    /// Longest ZMTP frame (and batch payload) accepted.
    pub max_frame_bytes: usize,
    /// Most frames in one message (PUB sends 3, a replay reply at most 5 with its envelope).
    pub max_message_frames: usize,
    /// Most bytes of all frames of one message together: the ZMQ codec holds a whole message
    /// before the updater sees it, so this bounds what one message costs.
    pub max_message_bytes: usize,
    /// Most msgpack elements in one batch (see [`crate::decode::Bounds`]).
    pub max_batch_elements: usize,
}

impl WireLimits {
    /// The pre-decoding bounds of one batch.
    pub fn decode_bounds(&self) -> crate::decode::Bounds {
        crate::decode::Bounds { max_elements: self.max_batch_elements, ..Default::default() }
    }
}

impl Default for WireLimits {
    fn default() -> Self {
        WireLimits {
            max_frame_bytes: 64 << 20,
            max_message_frames: 16,
            max_message_bytes: 64 << 20,
            max_batch_elements: crate::decode::DEFAULT_MAX_ELEMENTS,
        }
    }
}

/// Bounds on what a worker's `/v1/models` may make the updater keep and publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdapterLimits {
    /// LoRA adapters kept per worker (the first ones by name).
    pub max_adapters: usize,
    /// Longest model or adapter name kept, in bytes.
    pub max_name_bytes: usize,
}

impl Default for AdapterLimits {
    fn default() -> Self {
        // vLLM keeps `--max-cpu-loras` adapters in memory; a few dozen is a large deployment.
        AdapterLimits { max_adapters: 256, max_name_bytes: 256 }
    }
}

/// How often scraped loads alone are published by default (ms): a fifth of the default scrape
/// interval, so a load reaches the filters at most that much after its scrape (its age counts
/// from the scrape), and a pool's scrapes wake the long polls ten times a second, not once per
/// worker scraped.
pub const LOAD_PUBLISH_MS: u64 = 100;

/// Every bound of the updater.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub blocks: BlockLimits,
    pub replay: ReplayLimits,
    pub wire: WireLimits,
    /// Largest HTTP answer read from a worker.
    pub max_http_body_bytes: usize,
    pub adapters: AdapterLimits,
    /// Other Envoy replicas' decisions (see [`crate::peers`]).
    pub peers: crate::peers::PeerLimits,
    /// Scraped loads are published at most this often (ms): each scrape changes a worker's
    /// load, and every change wakes every long poll. Other changes go out at once. 0: each
    /// scrape is published at once.
    pub load_publish_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        // A vLLM `/metrics` answer is ~100 KB.
        Limits {
            blocks: BlockLimits::default(),
            replay: ReplayLimits::default(),
            wire: WireLimits::default(),
            max_http_body_bytes: 4 << 20,
            adapters: AdapterLimits::default(),
            peers: crate::peers::PeerLimits::default(),
            load_publish_ms: LOAD_PUBLISH_MS,
        }
    }
}
