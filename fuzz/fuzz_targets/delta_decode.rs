//! Snapshot deltas from the updater; the body (and what it checks) is `kvroute_fuzz::delta_decode`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::delta_decode(data));
