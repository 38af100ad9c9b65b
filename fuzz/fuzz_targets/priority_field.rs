//! The engine-priority edit of request bodies; the body is `kvroute_fuzz::priority_field`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::priority_field(data));
