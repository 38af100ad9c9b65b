//! [`WorkerName`]: a worker's name as decisions carry it. Shared, not copied: a decision over a
//! pool of a thousand workers holds a thousand names, and cloning one is a count, not an
//! allocation. It reads, compares and prints as the `str` it holds.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A worker's name (`host:port`, as Envoy's original-destination cluster reads it).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct WorkerName(Arc<str>);

impl WorkerName {
    pub fn as_str(&self) -> &str {
        &self.0
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
        WorkerName(Arc::from(s))
    }
}

impl From<String> for WorkerName {
    fn from(s: String) -> Self {
        WorkerName(Arc::from(s))
    }
}

impl From<&String> for WorkerName {
    fn from(s: &String) -> Self {
        WorkerName(Arc::from(s.as_str()))
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
        assert_eq!(String::from(w), "10.0.0.1:8000");
    }
}
