//! Response bodies from workers, in two chunks; the body (and what it checks) is `kvroute_fuzz::usage_scan`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::usage_scan(data));
