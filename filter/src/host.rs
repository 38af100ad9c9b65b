//! Host calls that never panic. The SDK's trait helpers unwrap every host status (and its
//! `String` getters unwrap UTF-8, which HTTP/2 does not guarantee); a panic traps the VM. These
//! wrappers read everything as bytes and turn every failure into `None` / `false`.

use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, Bytes, LogLevel, MapType};

pub fn request_header(name: &str) -> Option<Bytes> {
    hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name).ok().flatten()
}

pub fn set_request_header(name: &str, value: Option<&str>) -> bool {
    hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value).is_ok()
}

pub fn response_header(name: &str) -> Option<Bytes> {
    hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name).ok().flatten()
}

pub fn set_response_header(name: &str, value: &str) -> bool {
    hostcalls::set_map_value(MapType::HttpResponseHeaders, name, Some(value)).is_ok()
}

pub fn call_response_header(name: &str) -> Option<Bytes> {
    hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, name).ok().flatten()
}

pub fn request_body(size: usize) -> Option<Bytes> {
    hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size).ok().flatten()
}

pub fn response_body(size: usize) -> Option<Bytes> {
    hostcalls::get_buffer(BufferType::HttpResponseBody, 0, size).ok().flatten()
}

pub fn call_response_body(size: usize) -> Option<Bytes> {
    hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size).ok().flatten()
}

pub fn plugin_configuration() -> Option<Bytes> {
    hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX).ok().flatten()
}

pub fn property(path: &[&str]) -> Option<Bytes> {
    hostcalls::get_property(path.to_vec()).ok().flatten()
}

pub fn send_response(status: u16, headers: &[(&str, &str)], body: &[u8]) -> bool {
    hostcalls::send_http_response(u32::from(status), headers.to_vec(), Some(body)).is_ok()
}

/// Host time, unix milliseconds (0 if the host cannot tell).
pub fn now_ms() -> u64 {
    now_nanos() / 1_000_000
}

pub fn now_nanos() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64)
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

pub fn set_tick(ms: u64) -> bool {
    hostcalls::set_tick_period(Duration::from_millis(ms)).is_ok()
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
