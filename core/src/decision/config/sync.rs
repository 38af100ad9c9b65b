//! The sections of the filter configuration that bound the shared-data protocol
//! ([`crate::shared`]): journal, load shards, health, bundles and peer reports. They live here,
//! below the protocol, so the configuration does not depend on it.

use serde::{Deserialize, Serialize};

use crate::wire::journal::MAX_HASHES;

/// Bounds on journal work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct JournalLimits {
    /// Most block hashes one entry carries: the prompt's first blocks (a prefix match needs
    /// the head of the chain; 2048 blocks are 32 k tokens at block size 16).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = MAX_HASHES)))]
    pub max_hashes_per_entry: usize,
    /// Most hashes a thread applies in one poll on the request path.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_hashes_per_poll: usize,
}

impl Default for JournalLimits {
    fn default() -> Self {
        JournalLimits { max_hashes_per_entry: 2048, max_hashes_per_poll: 16_384 }
    }
}

impl JournalLimits {
    pub fn validate(&self) -> Result<(), String> {
        if self.max_hashes_per_entry == 0 || self.max_hashes_per_entry > MAX_HASHES {
            return Err(format!("journal.max_hashes_per_entry must be 1..={}", MAX_HASHES));
        }
        if self.max_hashes_per_poll < self.max_hashes_per_entry {
            return Err("journal.max_hashes_per_poll must be >= max_hashes_per_entry".into());
        }
        Ok(())
    }
}

/// Bounds of the load accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct LoadLimits {
    /// An in-flight entry stops counting this long after its request started. Set it above
    /// the longest request the route allows (its timeout, or the longest stream expected).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub lease_ms: u64,
    /// A shard not rewritten for this long is a dead thread's; each thread rewrites its own
    /// at least every tick.
    pub shard_timeout_ms: u64,
    /// Only requests started this long before a worker's load report are expected in it.
    pub reconcile_slack_ms: u64,
    /// Most in-flight entries one thread tracks; past it the oldest go.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_inflight_per_thread: usize,
    /// Orders the decisions of this Envoy's threads (one shared counter under
    /// compare-and-swap): a decision whose load view missed another thread's decision of the
    /// same instant is ranked again before it is sent. Costs one shared-data read and write
    /// per routed request.
    pub order_decisions: bool,
    /// The window over which a worker's arrival rate of prompt tokens is counted (ms; 0: not
    /// counted). Admission foresees from it how full a busy worker's next step gets before a
    /// request's prefill starts there ([`crate::decision::cost::Score::fill_forecast_ms`]).
    pub arrival_window_ms: u64,
}

impl Default for LoadLimits {
    fn default() -> Self {
        LoadLimits {
            lease_ms: 600_000,
            shard_timeout_ms: 10_000,
            reconcile_slack_ms: 2_000,
            max_inflight_per_thread: 16_384,
            order_decisions: true,
            arrival_window_ms: 2_000,
        }
    }
}

impl LoadLimits {
    pub fn validate(&self, tick_ms: u64) -> Result<(), String> {
        if self.lease_ms == 0 || self.max_inflight_per_thread == 0 {
            return Err("load.lease_ms and load.max_inflight_per_thread must be > 0".into());
        }
        if self.shard_timeout_ms < 3 * tick_ms {
            return Err(format!(
                "load.shard_timeout_ms ({}) must be at least 3 ticks ({tick_ms} ms each)",
                self.shard_timeout_ms
            ));
        }
        Ok(())
    }
}

/// Passive health checking and the first-byte timeout (`health` in the filter config).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Whether failures mark workers down (false: every worker is always eligible).
    pub enabled: bool,
    /// The first backoff of a worker that failed (ms); each further failure in a row doubles it.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub base_backoff_ms: u64,
    /// The longest backoff (ms).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_backoff_ms: u64,
    /// How long a half-open worker picked by one request (the probe) stays out of other
    /// decisions while that request has no outcome (ms).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub probe_hold_ms: u64,
    /// The per-try first-byte timeout kvroute asks Envoy for (see [`FirstByteTimeout`]).
    pub first_byte_timeout: FirstByteTimeout,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            enabled: true,
            base_backoff_ms: 1_000,
            max_backoff_ms: 30_000,
            probe_hold_ms: 10_000,
            first_byte_timeout: FirstByteTimeout::default(),
        }
    }
}

/// `x-envoy-upstream-rq-per-try-timeout-ms` for requests whose response headers come at once
/// (streamed, or a single output token): `clamp(predicted_ttft · factor + margin, min, max)`.
/// Envoy ignores a per-try timeout once the response started, so it bounds the wait for the
/// response headers only; a try that times out is reset and retried on the next listed worker
/// (the route retries on `reset`). Non-streamed requests get none: a worker answers them
/// only when the whole generation is done, which no prompt-based estimate bounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct FirstByteTimeout {
    pub enabled: bool,
    /// Multiplies the predicted TTFT of the primary.
    #[cfg_attr(feature = "schema", schemars(range(min = 1.0)))]
    pub factor: f64,
    /// Added to it (ms).
    pub margin_ms: u64,
    /// Bounds of the result (ms).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub min_ms: u64,
    pub max_ms: u64,
}

impl Default for FirstByteTimeout {
    fn default() -> Self {
        FirstByteTimeout {
            enabled: true,
            factor: 4.0,
            margin_ms: 2_000,
            min_ms: 5_000,
            max_ms: 120_000,
        }
    }
}

impl FirstByteTimeout {
    /// The timeout (ms) for a request whose primary's predicted TTFT is `ttft_ms`.
    pub fn for_ttft(&self, ttft_ms: f64) -> u64 {
        let t = if ttft_ms.is_finite() { ttft_ms.max(0.0) } else { 0.0 };
        let ms = (t * self.factor).min(u64::MAX as f64 / 2.0) as u64;
        ms.saturating_add(self.margin_ms).clamp(self.min_ms, self.max_ms)
    }
}

impl HealthConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.base_backoff_ms == 0 || self.probe_hold_ms == 0 {
            return Err("health.base_backoff_ms and health.probe_hold_ms must be > 0".into());
        }
        if self.max_backoff_ms < self.base_backoff_ms {
            return Err("health.max_backoff_ms must be >= health.base_backoff_ms".into());
        }
        let f = &self.first_byte_timeout;
        if !(f.factor.is_finite() && f.factor >= 1.0) {
            return Err("health.first_byte_timeout.factor must be a number >= 1".into());
        }
        if f.min_ms == 0 || f.max_ms < f.min_ms {
            return Err("health.first_byte_timeout needs 0 < min_ms <= max_ms".into());
        }
        Ok(())
    }

    /// The backoff after `failures` failures in a row.
    pub fn backoff_ms(&self, failures: u32) -> u64 {
        let shift = failures.saturating_sub(1).min(32);
        self.base_backoff_ms.saturating_mul(1u64 << shift).min(self.max_backoff_ms)
    }
}

/// Bounds of what the singleton keeps and how it retries (the singleton's `bundles` section).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct BundleLimits {
    /// Fetch bundles from the updater at all.
    pub enabled: bool,
    /// How often the updater's bundle list is polled (a snapshot naming an unknown
    /// fingerprint polls it at once).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub list_interval_ms: u64,
    /// Timeout of one list or part request.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub timeout_ms: u64,
    /// Most distinct bundles kept in shared data (in use and retired together).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_bundles: usize,
    /// Most bytes of bundle parts kept in shared data.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_total_bytes: u64,
    /// How long a replaced bundle stays readable (threads still building from it).
    pub grace_ms: u64,
    /// First wait after a failed download; doubles with each failure of that bundle.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub retry_min_ms: u64,
    /// Longest wait between attempts.
    pub retry_max_ms: u64,
}

impl Default for BundleLimits {
    fn default() -> Self {
        BundleLimits {
            enabled: true,
            list_interval_ms: 2_000,
            timeout_ms: 10_000,
            max_bundles: 4,
            max_total_bytes: 128 << 20,
            grace_ms: 60_000,
            retry_min_ms: 500,
            retry_max_ms: 30_000,
        }
    }
}

impl BundleLimits {
    pub fn validate(&self) -> Result<(), String> {
        if self.list_interval_ms == 0 || self.timeout_ms == 0 {
            return Err("bundles.list_interval_ms and bundles.timeout_ms must be > 0".into());
        }
        if self.max_bundles == 0 || self.max_total_bytes == 0 {
            return Err("bundles.max_bundles and bundles.max_total_bytes must be > 0".into());
        }
        if self.retry_min_ms == 0 || self.retry_max_ms < self.retry_min_ms {
            return Err("bundles.retry_min_ms must be > 0 and <= retry_max_ms".into());
        }
        Ok(())
    }
}

/// `snapshot_sync.peers`: how the singleton reports this replica's decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct PeerSyncConfig {
    /// Report decisions to the updater and ask for other replicas' (`peers=1`).
    pub enabled: bool,
    /// How often the singleton looks for new decisions and load changes (ms).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1000)))]
    pub forward_ms: u64,
    /// Loads are re-sent at least this often while any is held, so they stay live at the
    /// updater (whose `--peer-load-ttl-ms` must be longer).
    pub heartbeat_ms: u64,
    /// Most hashes one report carries; more wait for the next report, and past four reports'
    /// worth the oldest are dropped (`kvroute.sync.peer_hashes_dropped`).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = MAX_HASHES)))]
    pub max_hashes_per_report: usize,
    /// Timeout of one report call (ms).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub timeout_ms: u64,
    /// The window over which the loads reported carry this replica's arrival rate per worker
    /// (ms; 0: none). Unset (the default): the filter's own `load.arrival_window_ms`, which its
    /// threads publish in shared data (`kvroute.load.limits`) with the rest of how they read
    /// the load shards. The other replicas add the rate to their own to foresee a busy
    /// worker's step fill.
    pub arrival_window_ms: Option<u64>,
}

impl Default for PeerSyncConfig {
    fn default() -> Self {
        PeerSyncConfig {
            enabled: true,
            forward_ms: 5,
            heartbeat_ms: 1_000,
            max_hashes_per_report: 16_384,
            timeout_ms: 500,
            arrival_window_ms: None,
        }
    }
}

impl PeerSyncConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=1_000).contains(&self.forward_ms) {
            return Err("peers.forward_ms must be 1..=1000".into());
        }
        if self.heartbeat_ms < self.forward_ms {
            return Err("peers.heartbeat_ms must be >= peers.forward_ms".into());
        }
        if self.max_hashes_per_report == 0 || self.max_hashes_per_report > MAX_HASHES {
            return Err(format!("peers.max_hashes_per_report must be 1..={}", MAX_HASHES));
        }
        if self.timeout_ms == 0 {
            return Err("peers.timeout_ms must be > 0".into());
        }
        Ok(())
    }
}
