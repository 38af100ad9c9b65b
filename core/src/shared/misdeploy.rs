//! The shared-data part of the misdeployment watch ([`crate::decision::misdeploy`]): one
//! warning per symptom and interval for the whole Envoy process.

use super::SharedStore;
use crate::decision::misdeploy::Symptom;

/// Claims the right to log `symptom`'s warning now for the whole Envoy process (every thread's
/// VM shares the store): `true` at most once per `interval_ms`, whichever thread asks first.
pub fn claim_warning(
    store: &impl SharedStore,
    symptom: Symptom,
    now_ms: u64,
    interval_ms: u64,
) -> bool {
    let key = format!("kvroute.misdeploy.warned.{}", symptom.name());
    let (value, cas) = store.get(&key);
    let last = value.and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok()).map(u64::from_le_bytes);
    if last.is_some_and(|t| now_ms.saturating_sub(t) < interval_ms) {
        return false;
    }
    store.set(&key, &now_ms.to_le_bytes(), cas).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::fake::MemStore;

    #[test]
    fn one_warning_per_interval_for_the_whole_process() {
        let store = MemStore::default();
        let s = Symptom::NoKnowledge;
        assert!(claim_warning(&store, s, 1_000, 60_000), "the first thread to ask logs");
        assert!(!claim_warning(&store, s, 1_001, 60_000), "another thread does not");
        assert!(claim_warning(&store, Symptom::OverrideIgnored, 1_001, 60_000), "per symptom");
        assert!(!claim_warning(&store, s, 60_999, 60_000));
        assert!(claim_warning(&store, s, 61_000, 60_000));
    }
}
