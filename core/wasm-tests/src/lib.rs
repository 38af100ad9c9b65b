//! kvroute-core's golden checks ([`kvroute_core::conformance`]) compiled to 32-bit wasm
//! (`wasm32-unknown-unknown`) and run under Node by `wasm-bindgen-test` (`tests/wasm.rs`):
//! block hashes, codecs, token ids of the oracle corpus (with template rendering) and cost
//! ranking, on the pointer width and float semantics the filter has in Envoy. The crate has no
//! code of its own; on the host it is empty, as those checks run as kvroute-core's unit tests.
