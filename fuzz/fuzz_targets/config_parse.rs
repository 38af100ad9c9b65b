//! Plugin configuration: any bytes parse and validate to a config or an error.
#![no_main]
use kvroute_core::config::FilterConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(cfg) = FilterConfig::from_json(data) {
        let _ = kvroute_core::router::Router::new(&cfg);
    }
});
