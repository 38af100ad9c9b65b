//! kvroute-filter: the proxy-wasm glue that runs kvroute inside Envoy.
//!
//! Where to start: [`root::KvRoot`] is created per Envoy worker thread; it parses the plugin
//! configuration into a [`kvroute_core::decision::router::Router`] and makes one [`http::KvHttp`] per
//! request. All decisions happen in `kvroute-core`; this crate only moves bytes between Envoy and
//! the core: the request body in, the destination header out, load and knowledge through Envoy
//! shared data ([`shared`], the protocol itself is `kvroute_core::shared`), counters to
//! `/stats/prometheus` ([`metrics`]). The same module also runs as the singleton bootstrap
//! service that pulls the updater's snapshots ([`sync`]). Host calls go through [`host`],
//! which reads every value as bytes and never panics; a panic hook logs through Envoy.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod calib;
#[cfg(test)]
mod fake;
pub mod host;
pub mod http;
pub mod metrics;
pub mod root;
pub mod shared;
pub mod sync;
pub mod thread;
pub mod waiting;

proxy_wasm::main! {{
    host::install_panic_hook();
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|id| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::KvRoot::new(id))
    });
}}
