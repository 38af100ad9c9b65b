//! The decode step learned from streams' gaps, in shared data; the body (and what it checks) is `kvroute_fuzz::calib_steps_decode`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::calib_steps_decode(data));
