//! [`WorkerName`]: a worker's name as decisions carry it. Shared, not copied: a decision over a
//! pool of a thousand workers holds a thousand names, and cloning one is a count, not an
//! allocation. It reads, compares and prints as the `str` it holds, and carries its
//! [`worker_key`] beside the pointer: a decision looks each worker up by that key, so it never
//! reads a name's bytes (each a separate allocation, and so a cache miss per worker).

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

/// The key of a worker address in load shards, in peers' reports and in the knowledge index
/// (64-bit xxh3: two addresses of one fleet sharing a key are not expected).
pub fn worker_key(worker: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(worker.as_bytes())
}

/// The hasher of maps keyed by [`worker_key`]: the key is already a 64-bit xxh3 of the name,
/// so it is its own hash. A decision probes several such maps for every worker of the pool;
/// a general hasher would hash each key again (on 32-bit wasm, foldhash's 64 × 64 → 128-bit
/// multiply is a call). Only for worker keys: names come from the operator's pool, not from
/// clients; maps keyed by block hashes, which clients' prompts choose, keep a seeded hasher.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHash(u64);

impl Hasher for KeyHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not reached for `u64` keys (`write_u64`); any other key is folded in as xxh3 would.
        self.0 = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.0);
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

/// [`KeyHash`] as a map's hasher.
pub type ByKey = std::hash::BuildHasherDefault<KeyHash>;

/// A worker's name (`host:port`, as Envoy's original-destination cluster reads it) and its
/// [`worker_key`].
#[derive(Clone)]
pub struct WorkerName(Arc<str>, u64);

impl WorkerName {
    fn new(name: Arc<str>) -> Self {
        let key = worker_key(&name);
        WorkerName(name, key)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// [`worker_key`] of the name, computed once.
    pub fn key(&self) -> u64 {
        self.1
    }
}

impl Default for WorkerName {
    fn default() -> Self {
        WorkerName::new(Arc::from(""))
    }
}

impl PartialEq for WorkerName {
    fn eq(&self, o: &Self) -> bool {
        self.1 == o.1 && self.0 == o.0
    }
}

impl Eq for WorkerName {}

impl PartialOrd for WorkerName {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for WorkerName {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.cmp(&o.0)
    }
}

/// Hashes as the `str` (a map keyed by names is looked up with a `&str`).
impl Hash for WorkerName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl Deref for WorkerName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for WorkerName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for WorkerName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for WorkerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for WorkerName {
    fn from(s: &str) -> Self {
        WorkerName::new(Arc::from(s))
    }
}

impl From<String> for WorkerName {
    fn from(s: String) -> Self {
        WorkerName::new(Arc::from(s))
    }
}

impl From<&String> for WorkerName {
    fn from(s: &String) -> Self {
        WorkerName::new(Arc::from(s.as_str()))
    }
}

impl From<WorkerName> for String {
    fn from(w: WorkerName) -> Self {
        w.0.to_string()
    }
}

impl PartialEq<str> for WorkerName {
    fn eq(&self, o: &str) -> bool {
        &*self.0 == o
    }
}

impl PartialEq<&str> for WorkerName {
    fn eq(&self, o: &&str) -> bool {
        &*self.0 == *o
    }
}

impl PartialEq<String> for WorkerName {
    fn eq(&self, o: &String) -> bool {
        *self.0 == **o
    }
}

impl PartialEq<WorkerName> for str {
    fn eq(&self, o: &WorkerName) -> bool {
        self == &*o.0
    }
}

impl PartialEq<WorkerName> for &str {
    fn eq(&self, o: &WorkerName) -> bool {
        *self == &*o.0
    }
}

impl PartialEq<WorkerName> for String {
    fn eq(&self, o: &WorkerName) -> bool {
        **self == *o.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_reads_compares_and_prints_as_its_text() {
        let w = WorkerName::from("10.0.0.1:8000");
        let copy = w.clone();
        assert!(Arc::ptr_eq(&w.0, &copy.0), "a clone shares the text");
        assert_eq!(w, "10.0.0.1:8000");
        assert_eq!("10.0.0.1:8000".to_string(), w);
        assert_eq!(format!("{w} {w:?}"), "10.0.0.1:8000 \"10.0.0.1:8000\"");
        let mut names: Vec<WorkerName> = ["b", "a"].into_iter().map(WorkerName::from).collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(w.key(), worker_key("10.0.0.1:8000"));
        assert_eq!(WorkerName::default().key(), worker_key(""));
        assert_eq!(String::from(w), "10.0.0.1:8000");
    }
}
