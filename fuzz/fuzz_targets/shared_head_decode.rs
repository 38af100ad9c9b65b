//! The snapshot head in shared data; the body (and what it checks) is `kvroute_fuzz::shared_head_decode`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::shared_head_decode(data));
