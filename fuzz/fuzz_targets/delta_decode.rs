//! Snapshot deltas arrive over HTTP from the updater and sit in shared data: any bytes decode or fail cleanly.
#![no_main]
use kvroute_core::delta::Delta;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Delta::decode(data) {
        assert_eq!(Delta::decode(&s.encode()), Ok(s));
    }
});
