//! KV-event payloads come from workers over ZMQ: any bytes decode or fail cleanly.
#![no_main]
use kvroute_updater::decode::decode_batch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_batch(data);
});
