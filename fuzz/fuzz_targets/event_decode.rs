//! KV-event batches from workers; the body (and what it checks) is `kvroute_fuzz::event_decode`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::event_decode(data));
