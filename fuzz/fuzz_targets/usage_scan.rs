//! Response bodies come from workers: the usage scanner takes any chunking of any bytes.
#![no_main]
use kvroute_core::usage::UsageScanner;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut s = UsageScanner::default();
    let split = data.first().map_or(0, |b| *b as usize % (data.len().max(1)));
    s.push(&data[..split]);
    s.push(&data[split..]);
    let _ = s.usage();
});
