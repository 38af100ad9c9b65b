//! Request bodies read by the body scan; the body (and what it checks) is `kvroute_fuzz::request_scan`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::request_scan(data));
