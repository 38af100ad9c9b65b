//! Shared-data journal entries and load counters; the body (and what it checks) is `kvroute_fuzz::journal_decode`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::journal_decode(data));
