//! Model bundles, the bundle manifest and the updater's bundle list; the body (and what it checks) is `kvroute_fuzz::bundle_decode`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::bundle_decode(data));
