//! Deadline and priority header values from clients; the body is `kvroute_fuzz::admission_headers`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::admission_headers(data));
