//! ZMTP framing from workers through the updater's frame guard; the body is `kvroute_fuzz::zmtp_frames`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::zmtp_frames(data));
