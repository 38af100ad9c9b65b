//! Host access behind one small trait, [`Host`]: headers, bodies, properties, local replies,
//! shared data, HTTP calls, the clock, metrics and the tick. [`Proxy`] is the real one over
//! proxy-wasm's hostcalls; tests use an in-memory host. The free functions are [`Proxy`]'s, for
//! the glue that only ever runs in Envoy.
//!
//! Host calls never panic here. The SDK's trait helpers unwrap every host status (and its
//! `String` getters unwrap UTF-8, which HTTP/2 does not guarantee); a panic traps the VM. These
//! read everything as bytes and turn every failure into `None` / `false`.

use std::time::{Duration, UNIX_EPOCH};

use kvroute_core::shared::{SharedStore, StoreError, Versioned};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, Bytes, LogLevel, MapType, MetricType, Status};

/// A header list as proxy-wasm takes it.
pub type Headers<'a> = Vec<(&'a str, &'a str)>;

/// What the filter asks of its host.
pub trait Host: SharedStore {
    /// A header of the request (`Request`), the response (`Response`) or an HTTP call's answer
    /// (`CallResponse`).
    fn header(&self, map: Map, name: &str) -> Option<Bytes>;
    /// Sets (`Some`) or removes (`None`) a request or response header.
    fn set_header(&self, map: Map, name: &str, value: Option<&str>) -> bool;
    /// The first `size` bytes of the request body, the response body or a call's answer.
    fn body(&self, buffer: Buffer, size: usize) -> Option<Bytes>;
    fn property(&self, path: &[&str]) -> Option<Bytes>;
    /// Answers the request locally.
    fn send_response(&self, status: u16, headers: &[(&str, &str)], body: &[u8]) -> bool;
    /// Sends an HTTP call; its token, `None` if it could not be sent.
    fn dispatch(
        &self,
        cluster: &str,
        headers: Headers<'_>,
        body: Option<&[u8]>,
        timeout_ms: u64,
    ) -> Option<u32>;
    /// Host time, unix nanoseconds (0 if the host cannot tell).
    fn now_nanos(&self) -> u64;
    /// Host time, unix milliseconds.
    fn now_ms(&self) -> u64 {
        self.now_nanos() / 1_000_000
    }
    fn define_metric(&self, kind: MetricType, name: &str) -> Option<u32>;
    fn increment_metric(&self, id: u32, by: u64);
    /// Sets a gauge, or records a histogram value.
    fn record_metric(&self, id: u32, value: u64);
    fn set_tick(&self, ms: u64) -> bool;
    /// Makes stream (or root) context `id` the one the next host calls act on.
    fn set_effective_context(&self, id: u32) -> bool;
    /// Resumes the effective context's paused request.
    fn resume_request(&self) -> bool;
    /// Registers this root context's shared queue `name` (its id); `on_queue_ready` is then
    /// called on this context's thread for each message enqueued.
    fn register_queue(&self, name: &str) -> Option<u32>;
    /// The id of queue `name` registered in VM `vm_id`, if one is.
    fn resolve_queue(&self, vm_id: &str, name: &str) -> Option<u32>;
    /// Enqueues `value`; false if the queue is gone or the host refused.
    fn enqueue(&self, queue: u32, value: &[u8]) -> bool;
    /// The next message of `queue`; `None` when it is empty or gone.
    fn dequeue(&self, queue: u32) -> Option<Bytes>;
}

/// Header maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Map {
    Request,
    Response,
    CallResponse,
}

/// Body buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buffer {
    Request,
    Response,
    CallResponse,
    PluginConfiguration,
}

/// The real host: proxy-wasm's hostcalls into Envoy.
#[derive(Debug, Default, Clone, Copy)]
pub struct Proxy;

impl SharedStore for Proxy {
    fn get(&self, key: &str) -> Versioned {
        hostcalls::get_shared_data(key).unwrap_or((None, None))
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(_) => Err(StoreError::Unavailable),
        }
    }
}

impl Host for Proxy {
    fn header(&self, map: Map, name: &str) -> Option<Bytes> {
        let map = match map {
            Map::Request => MapType::HttpRequestHeaders,
            Map::Response => MapType::HttpResponseHeaders,
            Map::CallResponse => MapType::HttpCallResponseHeaders,
        };
        hostcalls::get_map_value_bytes(map, name).ok().flatten()
    }

    fn set_header(&self, map: Map, name: &str, value: Option<&str>) -> bool {
        let map = match map {
            Map::Request => MapType::HttpRequestHeaders,
            Map::Response => MapType::HttpResponseHeaders,
            Map::CallResponse => return false,
        };
        hostcalls::set_map_value(map, name, value).is_ok()
    }

    fn body(&self, buffer: Buffer, size: usize) -> Option<Bytes> {
        let buffer = match buffer {
            Buffer::Request => BufferType::HttpRequestBody,
            Buffer::Response => BufferType::HttpResponseBody,
            Buffer::CallResponse => BufferType::HttpCallResponseBody,
            Buffer::PluginConfiguration => BufferType::PluginConfiguration,
        };
        hostcalls::get_buffer(buffer, 0, size).ok().flatten()
    }

    fn property(&self, path: &[&str]) -> Option<Bytes> {
        hostcalls::get_property(path.to_vec()).ok().flatten()
    }

    fn send_response(&self, status: u16, headers: &[(&str, &str)], body: &[u8]) -> bool {
        hostcalls::send_http_response(u32::from(status), headers.to_vec(), Some(body)).is_ok()
    }

    fn dispatch(
        &self,
        cluster: &str,
        headers: Headers<'_>,
        body: Option<&[u8]>,
        timeout_ms: u64,
    ) -> Option<u32> {
        let timeout = Duration::from_millis(timeout_ms);
        hostcalls::dispatch_http_call(cluster, headers, body, vec![], timeout).ok()
    }

    fn now_nanos(&self) -> u64 {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64)
    }

    fn define_metric(&self, kind: MetricType, name: &str) -> Option<u32> {
        match hostcalls::define_metric(kind, name) {
            Ok(id) => Some(id),
            Err(e) => {
                log::warn!("kvroute: cannot define metric {name}: {e:?}");
                None
            }
        }
    }

    fn increment_metric(&self, id: u32, by: u64) {
        let _ = hostcalls::increment_metric(id, i64::try_from(by).unwrap_or(i64::MAX));
    }

    fn record_metric(&self, id: u32, value: u64) {
        let _ = hostcalls::record_metric(id, value);
    }

    fn set_tick(&self, ms: u64) -> bool {
        hostcalls::set_tick_period(Duration::from_millis(ms)).is_ok()
    }

    fn set_effective_context(&self, id: u32) -> bool {
        hostcalls::set_effective_context(id).is_ok()
    }

    fn resume_request(&self) -> bool {
        hostcalls::resume_http_request().is_ok()
    }

    fn register_queue(&self, name: &str) -> Option<u32> {
        hostcalls::register_shared_queue(name).ok()
    }

    fn resolve_queue(&self, vm_id: &str, name: &str) -> Option<u32> {
        hostcalls::resolve_shared_queue(vm_id, name).ok().flatten()
    }

    fn enqueue(&self, queue: u32, value: &[u8]) -> bool {
        hostcalls::enqueue_shared_queue(queue, Some(value)).is_ok()
    }

    fn dequeue(&self, queue: u32) -> Option<Bytes> {
        hostcalls::dequeue_shared_queue(queue).ok().flatten()
    }
}

pub fn request_header(name: &str) -> Option<Bytes> {
    Proxy.header(Map::Request, name)
}

pub fn set_request_header(name: &str, value: Option<&str>) -> bool {
    Proxy.set_header(Map::Request, name, value)
}

pub fn response_header(name: &str) -> Option<Bytes> {
    Proxy.header(Map::Response, name)
}

pub fn set_response_header(name: &str, value: &str) -> bool {
    Proxy.set_header(Map::Response, name, Some(value))
}

pub fn request_body(size: usize) -> Option<Bytes> {
    Proxy.body(Buffer::Request, size)
}

pub fn response_body(size: usize) -> Option<Bytes> {
    Proxy.body(Buffer::Response, size)
}

pub fn plugin_configuration() -> Option<Bytes> {
    Proxy.body(Buffer::PluginConfiguration, usize::MAX)
}

pub fn property(path: &[&str]) -> Option<Bytes> {
    Proxy.property(path)
}

pub fn send_response(status: u16, headers: &[(&str, &str)], body: &[u8]) -> bool {
    Proxy.send_response(status, headers, body)
}

/// Host time, unix milliseconds (0 if the host cannot tell).
pub fn now_ms() -> u64 {
    Proxy.now_ms()
}

pub fn now_nanos() -> u64 {
    Proxy.now_nanos()
}

pub fn set_tick(ms: u64) -> bool {
    Proxy.set_tick(ms)
}

pub fn register_queue(name: &str) -> Option<u32> {
    Proxy.register_queue(name)
}

pub fn dequeue(queue: u32) -> Option<Bytes> {
    Proxy.dequeue(queue)
}

pub fn enqueue(queue: u32, value: &[u8]) -> bool {
    Proxy.enqueue(queue, value)
}

/// Size of this VM's linear memory in bytes (it grows, never shrinks).
pub fn wasm_memory_bytes() -> usize {
    #[cfg(target_arch = "wasm32")]
    {
        core::arch::wasm32::memory_size(0) << 16
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        0
    }
}

/// Logs through Envoy, even from a panic hook.
pub fn log(level: LogLevel, message: &str) {
    let _ = hostcalls::log(level, message);
}

/// Routes panics to Envoy's log before the VM traps: where, never what (a panic message could
/// quote request data, and nothing of a prompt may be logged).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let at = info.location().map(|l| format!("{}:{}", l.file(), l.line()));
        log(
            LogLevel::Critical,
            &format!("kvroute: panic at {}; the VM will trap", at.as_deref().unwrap_or("?")),
        );
    }));
}
