//! Request bodies come straight from clients: parsing, rendering and tokenizing any bytes
//! must return a value or an error, never panic.
#![no_main]
use kvroute_core::model::ModelBundle;
use kvroute_core::request::{parse, Endpoint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bundle = ModelBundle::demo().ok();
    for ep in [Endpoint::Chat, Endpoint::Completions] {
        if let (Ok(req), Some(b)) = (parse(ep, data), bundle.as_ref()) {
            let _ = b.prompt_tokens(&req.prompt);
        }
    }
});
