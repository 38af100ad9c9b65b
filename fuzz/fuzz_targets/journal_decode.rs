//! Shared-data journal entries: the decoder must never panic on any bytes.
#![no_main]
use kvroute_core::journal::JournalEntry;
use kvroute_core::load::WorkerLoad;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = JournalEntry::decode(data) {
        assert_eq!(JournalEntry::decode(&e.encode()), Ok(e));
    }
    let _ = WorkerLoad::decode(data);
});
