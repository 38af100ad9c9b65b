//! An in-memory [`SharedStore`] with Envoy's semantics (a CAS token per value, bumped on every
//! write; a write without a token always succeeds), usable from many OS threads at once, with
//! faults to inject: writes that are lost, and values replaced by garbage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::{Counter, Counters, SharedStore, StoreError, Versioned};

#[derive(Debug, Default)]
pub struct MemStore {
    values: Mutex<HashMap<String, (Vec<u8>, u32)>>,
    /// Every `n`-th write fails as unavailable (0: none).
    fail_every: AtomicU64,
    writes: AtomicU64,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on every `n`-th write fails (0 turns it off).
    pub fn fail_every(&self, n: u64) {
        self.fail_every.store(n, Ordering::SeqCst);
    }

    /// Overwrites `key` with `bytes`, as a corrupting writer would.
    pub fn poke(&self, key: &str, bytes: &[u8]) {
        let mut v = self.values.lock().unwrap_or_else(|e| e.into_inner());
        let cas = v.get(key).map_or(1, |(_, c)| c.wrapping_add(1));
        v.insert(key.to_owned(), (bytes.to_vec(), cas));
    }

    /// Keys present, sorted.
    pub fn keys(&self) -> Vec<String> {
        let v = self.values.lock().unwrap_or_else(|e| e.into_inner());
        let mut k: Vec<String> = v.keys().cloned().collect();
        k.sort();
        k
    }

    /// Total bytes stored.
    pub fn bytes(&self) -> usize {
        let v = self.values.lock().unwrap_or_else(|e| e.into_inner());
        v.iter().map(|(k, (b, _))| k.len() + b.len()).sum()
    }
}

impl SharedStore for MemStore {
    fn get(&self, key: &str) -> Versioned {
        let v = self.values.lock().unwrap_or_else(|e| e.into_inner());
        match v.get(key) {
            Some((b, c)) => (Some(b.clone()), Some(*c)),
            None => (None, None),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        let every = self.fail_every.load(Ordering::SeqCst);
        if every > 0 && n % every == 0 {
            return Err(StoreError::Unavailable);
        }
        let mut v = self.values.lock().unwrap_or_else(|e| e.into_inner());
        let current = v.get(key).map(|(_, c)| *c);
        if let (Some(want), Some(have)) = (cas, current) {
            if want != have {
                return Err(StoreError::CasMismatch);
            }
        }
        let next = current.map_or(1, |c| c.wrapping_add(1));
        v.insert(key.to_owned(), (value.to_vec(), next));
        Ok(())
    }
}

/// Counts what the protocol reports, for assertions.
#[derive(Debug, Default)]
pub struct Tally(Mutex<HashMap<Counter, u64>>);

impl Tally {
    pub fn get(&self, c: Counter) -> u64 {
        self.0.lock().map(|m| m.get(&c).copied().unwrap_or(0)).unwrap_or(0)
    }
}

impl Counters for Tally {
    fn count(&self, what: Counter, n: u64) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry(what).or_default() += n;
        }
    }
}
