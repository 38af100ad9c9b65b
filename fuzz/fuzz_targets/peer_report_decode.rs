//! Envoy replicas' peer reports to the updater; the body (and what it checks) is
//! `kvroute_fuzz::peer_report_decode`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::peer_report_decode(data));
