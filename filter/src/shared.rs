//! Envoy shared data behind kvroute-core's [`SharedStore`]: the whole protocol (journal, load
//! shards, snapshot head and ring) lives in `kvroute_core::shared`; this is only the hostcall.

use kvroute_core::shared::{SharedStore, StoreError, Versioned};
use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

/// The shared data of this VM's `vm_id`.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostStore;

impl SharedStore for HostStore {
    fn get(&self, key: &str) -> Versioned {
        hostcalls::get_shared_data(key).unwrap_or((None, None))
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(_) => Err(StoreError::Unavailable),
        }
    }
}
