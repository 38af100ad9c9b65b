//! The body scan: a request body read in one pass, the one big field of its shape (a
//! completion's `prompt`, a chat's `messages`) read straight into what kvroute keeps of it,
//! every other top-level field as a JSON value (they are small). The top level's punctuation
//! is read here, each key and value by `serde_json`, except a prompt of token ids in the usual
//! form (`id_array`: digits read by hand, no number-by-number visitor). No DOM of the whole
//! body is built; the result must equal the general path's (`pyjson` then the field readers),
//! which the differential tests (`scan_tests`) and the fuzz target `request_scan` check.
//!
//! `serde_json` (and `id_array`, a subset of it) reads as Python's `json` does every body the
//! scan accepts, except where noted here; each of those makes the scan give up ([`split`]
//! returns `None`) and the caller take the general path, which then gives the result or the
//! error Python would:
//!
//! - not UTF-8, a byte-order mark, NaN / Infinity, a float beyond a double (`1e400`), a lone
//!   surrogate escape, a value nested beyond `serde_json`'s 128 levels: `serde_json` refuses
//!   them (the whole body is checked as UTF-8 first: `serde_json` does not check the strings
//!   it skips);
//! - numbers that Python keeps as integers where `serde_json` makes floats (`-0`, integers
//!   beyond 64 bits) in any value kept ([`maybe_python_int`]); in a skipped value they change
//!   nothing, and an integer beyond Python's 4 300 digits is beyond a double too.
//!
//! Skipped values are still read as `serde_json` reads values ([`Skip`], never `IgnoredAny`,
//! which lets numbers out of range through), so what the scan accepts is JSON to Python.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// The big field of a body shape, read on its own by [`split`].
pub(super) trait Field: for<'de> Deserialize<'de> {
    /// Its key at the top level.
    const KEY: &'static str;

    /// A reader faster than `serde_json` for the common form of the value at the start of
    /// `text`: the value and the bytes it took, or `None` to have `serde_json` read it (from
    /// the same start). It must give what the `Deserialize` impl gives wherever it answers.
    fn read_fast(_text: &[u8]) -> Option<(Self, usize)> {
        None
    }
}

/// A body's top level: `field` is the last value of [`Field::KEY`] (a duplicate key's last
/// value wins, as in Python), `obj` every other field.
pub(super) struct Split<F> {
    pub obj: Map<String, Value>,
    pub field: Option<F>,
}

/// The top level of `body` with its big field read as `F`, or `None` when the body is not an
/// object, not JSON, or one where `serde_json` and Python may differ (see the module doc).
///
/// The object's own punctuation (`{`, `:`, `,`, `}` and the whitespace between) is read here;
/// each key and each value is read by `serde_json` on its own, the big field first by
/// [`Field::read_fast`]. A value thus has `serde_json`'s 128 levels below the top level
/// rather than 127: Python reads such a value too, and the same.
pub(super) fn split<F: Field>(body: &[u8]) -> Option<Split<F>> {
    let text = std::str::from_utf8(body).ok()?;
    let top = read_top::<F>(text)?;
    if top.obj.values().any(maybe_python_int) {
        return None;
    }
    Some(top)
}

fn read_top<F: Field>(text: &str) -> Option<Split<F>> {
    let bytes = text.as_bytes();
    let mut top = Split { obj: Map::new(), field: None };
    let mut at = skip_ws(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_ws(bytes, at + 1);
    if bytes.get(at) != Some(&b'}') {
        loop {
            let (key, end) = read_one::<String>(text, at)?;
            at = skip_ws(bytes, end);
            if bytes.get(at) != Some(&b':') {
                return None;
            }
            at = skip_ws(bytes, at + 1);
            // Duplicate keys: the last one wins, as in a `serde_json::Map`.
            at = if key == F::KEY {
                let fast = bytes.get(at..).and_then(F::read_fast).map(|(f, n)| (f, at + n));
                let (field, end) = fast.or_else(|| read_one::<F>(text, at))?;
                top.field = Some(field);
                end
            } else {
                let (value, end) = read_one::<Value>(text, at)?;
                top.obj.insert(key, value);
                end
            };
            at = skip_ws(bytes, at);
            match bytes.get(at) {
                Some(b',') => at = skip_ws(bytes, at + 1),
                Some(b'}') => break,
                _ => return None,
            }
        }
    }
    // Only whitespace after the object.
    (skip_ws(bytes, at + 1) == bytes.len()).then_some(top)
}

/// The first index at or after `at` that is not JSON whitespace (Python's `json` has the same
/// four bytes).
pub(super) fn skip_ws(bytes: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = bytes.get(at) {
        at += 1;
    }
    at
}

/// One JSON value of `text` starting at `at` (no whitespace before it), read by `serde_json`,
/// and the index just after it.
fn read_one<T: for<'de> Deserialize<'de>>(text: &str, at: usize) -> Option<(T, usize)> {
    let mut values = serde_json::Deserializer::from_str(text.get(at..)?).into_iter::<T>();
    let value = values.next()?.ok()?;
    Some((value, at + values.byte_offset()))
}

/// A value read and checked as `serde_json` reads a [`Value`] (numbers in range, strings
/// decoded), and dropped without being built.
pub(super) struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SkipVisitor)
    }
}

/// The visitor of [`Skip`]; other visitors use it for the values they do not keep.
pub(super) struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = Skip;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(Skip)
    }
}

/// Whether `v` holds a float that Python may have read as an integer: -0.0 (from `-0`) or an
/// integral float of at least 2^63 in size (from an integer beyond 64 bits).
pub(super) fn maybe_python_int(v: &Value) -> bool {
    let mut todo = vec![v];
    while let Some(v) = todo.pop() {
        match v {
            Value::Number(n) if n.is_f64() => {
                let f = n.as_f64().unwrap_or(0.0);
                if (f == 0.0 && f.is_sign_negative()) || (f.fract() == 0.0 && f.abs() >= 9.2e18) {
                    return true;
                }
            }
            Value::Array(items) => todo.extend(items),
            Value::Object(m) => todo.extend(m.values()),
            _ => {}
        }
    }
    false
}

/// The error that makes a scan give up (the caller then takes the general path).
pub(super) fn give_up<E: serde::de::Error>() -> E {
    E::custom("the general path reads this body")
}
