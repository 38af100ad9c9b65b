//! The singleton (Envoy bootstrap wasm service, same `vm_id` as the filter): pulls knowledge
//! snapshots from the updater on a short tick and publishes them in shared data, where every
//! worker thread's filter picks them up when the version moves.
//!
//! Shared data: `kvroute.snapshot.head` = version (u64 LE) + time the updater last confirmed
//! it (unix ms, u64 LE); `kvroute.snapshot.data` = the encoded snapshot. The payload is
//! validated (decoded) here before it is published.

use std::time::{Duration, UNIX_EPOCH};

use kvroute_core::config::SnapshotSyncConfig;
use kvroute_core::snapshot::Snapshot;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, RootContext};
use proxy_wasm::types::MetricType;

pub const HEAD_KEY: &str = "kvroute.snapshot.head";
pub const DATA_KEY: &str = "kvroute.snapshot.data";

/// Reads the head key: (version, confirmed at ms).
pub fn read_head() -> Option<(u64, u64)> {
    let (bytes, _) = hostcalls::get_shared_data(HEAD_KEY).ok()?;
    let b = bytes?;
    let v = u64::from_le_bytes(b.get(0..8)?.try_into().ok()?);
    let at = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
    Some((v, at))
}

fn write_head(version: u64, at_ms: u64) {
    let mut b = version.to_le_bytes().to_vec();
    b.extend_from_slice(&at_ms.to_le_bytes());
    let _ = hostcalls::set_shared_data(HEAD_KEY, Some(&b), None);
}

pub struct SnapshotSync {
    cfg: SnapshotSyncConfig,
    version: u64,
    pending: bool,
    fetched: Option<u32>,
    failed: Option<u32>,
}

impl SnapshotSync {
    pub fn new(cfg: SnapshotSyncConfig) -> Self {
        SnapshotSync {
            cfg,
            version: 0,
            pending: false,
            fetched: hostcalls::define_metric(
                MetricType::Counter,
                "kvroute.sync.snapshots_fetched",
            )
            .ok(),
            failed: hostcalls::define_metric(MetricType::Counter, "kvroute.sync.fetch_failures")
                .ok(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.get_current_time().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }

    fn count(id: Option<u32>) {
        if let Some(id) = id {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }

    pub fn start(&mut self) {
        self.set_tick_period(Duration::from_millis(self.cfg.interval_ms));
    }
}

impl Context for SnapshotSync {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        self.pending = false;
        let status = self.get_http_call_response_header(":status").unwrap_or_default();
        let now = self.now_ms();
        match status.as_str() {
            "304" => write_head(self.version, now),
            "200" => {
                let body = self.get_http_call_response_body(0, body_size).unwrap_or_default();
                match Snapshot::decode(&body) {
                    Ok(s) => {
                        let _ = hostcalls::set_shared_data(DATA_KEY, Some(&body), None);
                        self.version = s.version;
                        write_head(s.version, now);
                        Self::count(self.fetched);
                    }
                    Err(e) => {
                        log::warn!("kvroute: rejecting snapshot from the updater: {e}");
                        Self::count(self.failed);
                    }
                }
            }
            other => {
                log::debug!("kvroute: snapshot fetch answered {other}");
                Self::count(self.failed);
            }
        }
    }
}

impl RootContext for SnapshotSync {
    fn on_tick(&mut self) {
        if self.pending {
            return;
        }
        let path = format!("/v1/snapshot?since={}", self.version);
        let headers = vec![
            (":method", "GET"),
            (":path", path.as_str()),
            (":authority", self.cfg.authority.as_str()),
            ("x-kvroute-token", self.cfg.token.as_str()),
        ];
        let timeout = Duration::from_millis(self.cfg.timeout_ms);
        match self.dispatch_http_call(&self.cfg.cluster, headers, None, vec![], timeout) {
            Ok(_) => self.pending = true,
            Err(_) => Self::count(self.failed),
        }
    }
}
