//! Envoy shared data behind kvroute-core's [`kvroute_core::shared::SharedStore`]: the whole
//! protocol (journal, load shards, snapshot head and ring) lives in `kvroute_core::shared`;
//! the hostcall is [`crate::host::Proxy`]'s.

/// The shared data of this VM's `vm_id`.
pub use crate::host::Proxy as HostStore;
