//! Compiled tokenizer encoders, as filter threads read them from a compiled bundle; the body (and what it checks) is `kvroute_fuzz::compiled_encoder`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::compiled_encoder(data));
