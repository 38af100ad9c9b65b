//! Request bodies from clients; the body (and what it checks) is `kvroute_fuzz::request_parse`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::request_parse(data));
