//! Knowledge snapshots from the updater; the body (and what it checks) is `kvroute_fuzz::snapshot_decode`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::snapshot_decode(data));
