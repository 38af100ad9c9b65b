//! The Kubernetes API server's watch stream (EndpointSlices and Pods) as the updater reads
//! it; the body (and what it checks) is `kvroute_fuzz::kube_watch_event`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvroute_fuzz::kube_watch_event(data));
