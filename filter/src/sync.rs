//! The singleton (Envoy bootstrap wasm service, same `vm_id` as the filter): pulls knowledge from
//! the updater on a short tick and publishes it in shared data, where every worker thread's
//! filter picks it up when the version moves. The layout of what it publishes, and its checks,
//! are `kvroute_core::shared::knowledge`; this is the HTTP call and the tick.

use std::time::Duration;

use kvroute_core::config::SnapshotSyncConfig;
use kvroute_core::shared::knowledge::{Publisher, Taken};
use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

use crate::host;
use crate::shared::HostStore;

pub struct SnapshotSync {
    cfg: SnapshotSyncConfig,
    publisher: Publisher,
    pending: bool,
    fetched_full: Option<u32>,
    fetched_delta: Option<u32>,
    failed: Option<u32>,
    version_gauge: Option<u32>,
}

fn count(id: Option<u32>) {
    if let Some(id) = id {
        let _ = hostcalls::increment_metric(id, 1);
    }
}

impl SnapshotSync {
    pub fn new(cfg: SnapshotSyncConfig) -> Self {
        let c = MetricType::Counter;
        SnapshotSync {
            cfg,
            publisher: Publisher::default(),
            pending: false,
            fetched_full: hostcalls::define_metric(c, "kvroute.sync.full_snapshots").ok(),
            fetched_delta: hostcalls::define_metric(c, "kvroute.sync.deltas").ok(),
            failed: hostcalls::define_metric(c, "kvroute.sync.fetch_failures").ok(),
            version_gauge: hostcalls::define_metric(
                MetricType::Gauge,
                "kvroute.sync.snapshot_version",
            )
            .ok(),
        }
    }

    pub fn start(&self) {
        if !host::set_tick(self.cfg.interval_ms) {
            log::error!("kvroute: snapshot sync cannot set its tick");
        }
    }

    pub fn on_http_call_response(
        &mut self,
        _token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        self.pending = false;
        let status = host::call_response_header(":status").unwrap_or_default();
        let taken = match status.as_slice() {
            b"304" => Ok(None),
            b"200" => {
                let body = host::call_response_body(body_size).unwrap_or_default();
                self.publisher.take(&HostStore, body).map(Some).map_err(|e| e.to_string())
            }
            other => Err(format!("updater answered {}", String::from_utf8_lossy(other))),
        };
        match taken {
            Ok(kind) => {
                count(match kind {
                    Some(Taken::Full) => self.fetched_full,
                    Some(Taken::Delta) => self.fetched_delta,
                    None => None,
                });
                self.publisher.confirmed(&HostStore, host::now_ms());
                if let Some(id) = self.version_gauge {
                    let _ = hostcalls::record_metric(id, self.publisher.head().version);
                }
            }
            Err(e) => {
                log::debug!("kvroute: snapshot sync: {e}");
                count(self.failed);
            }
        }
    }

    pub fn on_tick(&mut self) {
        if self.pending {
            return;
        }
        let path = format!("/v1/snapshot?since={}", self.publisher.version());
        let headers = vec![
            (":method", "GET"),
            (":path", path.as_str()),
            (":authority", self.cfg.authority.as_str()),
            ("x-kvroute-token", self.cfg.token.as_str()),
        ];
        let timeout = Duration::from_millis(self.cfg.timeout_ms);
        match hostcalls::dispatch_http_call(&self.cfg.cluster, headers, None, vec![], timeout) {
            Ok(_) => self.pending = true,
            Err(_) => count(self.failed),
        }
    }
}
