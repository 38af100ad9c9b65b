//! The whole shared-data protocol over fuzzed shared data; the body is `kvroute_fuzz::shared_protocol`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::shared_protocol(data));
