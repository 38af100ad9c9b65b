//! Request JSON read as vLLM reads it: with Python's `json` module (Starlette's
//! `request.json()`, then pydantic on the resulting Python objects), not with a strict JSON
//! parser. What differs from `serde_json`:
//!
//! - integers stay integers at any size (`12345678901234567890123` is a Python `int`, not a
//!   float), up to Python's 4 300-digit limit for converting a string to an int (beyond it,
//!   `int()` raises and the server answers 400);
//! - `-0` is the integer 0 (Python prints `0`), `-0.0` the float -0.0 (`-0.0`);
//! - `NaN`, `Infinity` and `-Infinity` are accepted, and a float too large for a double
//!   (`1e400`) is infinite instead of an error;
//! - a body (bytes) may start with a UTF-8 byte-order mark: `json.loads` on bytes detects the
//!   encoding as `utf-8-sig` and drops it. A *string* with one (a tool call's `arguments`) is
//!   an error, as in `json.loads(str)`;
//! - nesting: Python's bound is its recursion limit less the stack already in use, so it
//!   depends on the Python version (about 990 containers with Python 3.11's limit of 1000
//!   under FastAPI; 3.12 and 3.13 count C recursion against a limit of several thousand).
//!   kvroute parses with an explicit stack (no recursion: the filter runs in a wasm VM with a
//!   small stack), keeps containers down to [`MAX_DEPTH`] levels (enough for any real schema;
//!   the template then renders them as vLLM does), replaces anything deeper with `null`
//!   and says so ([`Parsed::truncated`]: such a request is routed on load alone and the
//!   engine decides), and refuses only beyond [`HARD_DEPTH`], deeper than any Python before
//!   3.14 reads.
//!
//! What is the same as Python: whitespace is only space, tab, CR and LF; control characters in
//! strings are refused (`strict=True`); a duplicate key keeps its first position and its last
//! value (a `dict` built from pairs; the core's `serde_json` keeps insertion order); no
//! trailing data. Strings with a lone surrogate escape (`"\ud800"`), which Python keeps but no
//! tokenizer can encode, are refused.
//!
//! Numbers `serde_json::Value` cannot hold (integers beyond 64 bits, NaN and infinities) are
//! held as a one-key object `{NUMBER_KEY: spelling}` (see [`special_number`]), spelled as
//! Python's `json.dumps` writes them; the template renders them as the numbers they are.

use serde_json::{Map, Number, Value};
use thiserror::Error;

/// Most containers nested in one another that are kept (deeper ones become `null` and the
/// parse says it truncated).
pub const MAX_DEPTH: usize = 256;

/// Most containers nested in one another that a body may have at all (Python 3.13's C
/// recursion limit is 10 000; each open container costs the parser a few bytes).
pub const HARD_DEPTH: usize = 20_000;

/// Python's default limit on the digits of an integer read from a string
/// (`sys.get_int_max_str_digits()`).
pub const MAX_INT_DIGITS: usize = 4300;

/// The key of the one-key object that holds a number `serde_json` cannot (see
/// [`special_number`]). A NUL and two noncharacters: no client sends it by accident.
pub const NUMBER_KEY: &str = "\u{0}\u{fdd0}kvroute.py-number\u{fdd1}";

/// Why a body is not JSON to Python.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PyJsonError {
    #[error("{what} at byte {at}")]
    Syntax { what: &'static str, at: usize },
    #[error("body is not UTF-8")]
    NotUtf8,
    #[error("unexpected UTF-8 BOM")]
    Bom,
    #[error("nesting deeper than {HARD_DEPTH}")]
    TooDeep,
    #[error("integer with more than {MAX_INT_DIGITS} digits")]
    IntTooLong,
    #[error("lone surrogate escape at byte {0}")]
    LoneSurrogate(usize),
}

/// A parsed document.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub value: Value,
    /// Containers deeper than [`MAX_DEPTH`] were replaced by `null`.
    pub truncated: bool,
}

/// A request body as Python's `json.loads(body_bytes)` reads it.
pub fn from_body(body: &[u8]) -> Result<Parsed, PyJsonError> {
    let body = body.strip_prefix(b"\xef\xbb\xbf").unwrap_or(body);
    let text = std::str::from_utf8(body).map_err(|_| PyJsonError::NotUtf8)?;
    Parser { s: text.as_bytes(), pos: 0, truncated: false }.document()
}

/// A string as Python's `json.loads(text)` reads it (a leading BOM is an error).
pub fn from_str(text: &str) -> Result<Parsed, PyJsonError> {
    if text.starts_with('\u{feff}') {
        return Err(PyJsonError::Bom);
    }
    Parser { s: text.as_bytes(), pos: 0, truncated: false }.document()
}

/// The spelling of a number `serde_json` cannot hold (`"NaN"`, `"Infinity"`, `"-Infinity"`,
/// or the digits of an integer beyond 64 bits), if `v` is one.
pub fn special_number(v: &Value) -> Option<&str> {
    match v {
        Value::Object(m) if m.len() == 1 => m.get(NUMBER_KEY).and_then(Value::as_str),
        _ => None,
    }
}

fn special(spelling: String) -> Value {
    let mut m = Map::new();
    m.insert(NUMBER_KEY.to_owned(), Value::String(spelling));
    Value::Object(m)
}

/// A float as Python holds it: finite floats as JSON numbers, the rest spelled.
pub fn float_value(f: f64) -> Value {
    match Number::from_f64(f) {
        Some(n) => Value::Number(n),
        None if f.is_nan() => special("NaN".into()),
        None if f > 0.0 => special("Infinity".into()),
        None => special("-Infinity".into()),
    }
}

/// An open container.
enum Frame {
    Array(Vec<Value>),
    /// The object so far and the key whose value is being read.
    Object(Map<String, Value>, String),
    /// A container deeper than [`MAX_DEPTH`]: read, checked, not kept (array or object).
    Skipped {
        object: bool,
    },
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
    truncated: bool,
}

impl Parser<'_> {
    fn err(&self, what: &'static str) -> PyJsonError {
        PyJsonError::Syntax { what, at: self.pos }
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn document(mut self) -> Result<Parsed, PyJsonError> {
        self.ws();
        let value = self.value()?;
        self.ws();
        if self.pos != self.s.len() {
            return Err(self.err("extra data"));
        }
        Ok(Parsed { value, truncated: self.truncated })
    }

    /// Opens a container at `pos` (`{` or `[`) below `depth` open ones: `None` when it is
    /// empty (and read), else its frame, `pos` at its first value.
    fn open(&mut self, depth: usize) -> Result<Option<Frame>, PyJsonError> {
        if depth >= HARD_DEPTH {
            return Err(PyJsonError::TooDeep);
        }
        let object = self.peek() == Some(b'{');
        let close = if object { b'}' } else { b']' };
        self.pos += 1;
        self.ws();
        if self.peek() == Some(close) {
            self.pos += 1;
            return Ok(None);
        }
        let key = if object { self.key()? } else { String::new() };
        Ok(Some(if depth >= MAX_DEPTH {
            self.truncated = true;
            Frame::Skipped { object }
        } else if object {
            Frame::Object(Map::new(), key)
        } else {
            Frame::Array(Vec::new())
        }))
    }

    /// One value, containers included, without recursion.
    fn value(&mut self) -> Result<Value, PyJsonError> {
        let mut stack: Vec<Frame> = Vec::new();
        'value: loop {
            // A value starts at `pos` (whitespace skipped).
            let mut v = match self.peek() {
                Some(b'{' | b'[') => {
                    let object = self.peek() == Some(b'{');
                    match self.open(stack.len())? {
                        Some(frame) => {
                            stack.push(frame);
                            continue 'value;
                        }
                        None if stack.len() >= MAX_DEPTH => {
                            self.truncated = true;
                            Value::Null
                        }
                        None if object => Value::Object(Map::new()),
                        None => Value::Array(Vec::new()),
                    }
                }
                _ => self.scalar()?,
            };
            // A value is complete: hand it to the open containers, closing those that end.
            loop {
                let Some(top) = stack.last_mut() else { return Ok(v) };
                self.ws();
                match top {
                    Frame::Array(items) => {
                        items.push(v);
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                self.ws();
                                continue 'value;
                            }
                            Some(b']') => self.pos += 1,
                            _ => return Err(self.err("expecting ',' delimiter")),
                        }
                    }
                    Frame::Object(map, key) => {
                        map.insert(std::mem::take(key), v);
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                self.ws();
                                *key = self.key()?;
                                continue 'value;
                            }
                            Some(b'}') => self.pos += 1,
                            _ => return Err(self.err("expecting ',' delimiter")),
                        }
                    }
                    Frame::Skipped { object } => {
                        let close = if *object { b'}' } else { b']' };
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                self.ws();
                                if *object {
                                    self.key()?;
                                }
                                continue 'value;
                            }
                            Some(c) if c == close => self.pos += 1,
                            _ => return Err(self.err("expecting ',' delimiter")),
                        }
                    }
                }
                v = match stack.pop() {
                    Some(Frame::Array(items)) => Value::Array(items),
                    Some(Frame::Object(map, _)) => Value::Object(map),
                    Some(Frame::Skipped { .. }) => Value::Null,
                    None => return Err(self.err("unbalanced")),
                };
            }
        }
    }

    /// An object key and its colon; leaves `pos` at the value.
    fn key(&mut self) -> Result<String, PyJsonError> {
        if self.peek() != Some(b'"') {
            return Err(self.err("expecting property name enclosed in double quotes"));
        }
        let key = self.string()?;
        self.ws();
        if self.peek() != Some(b':') {
            return Err(self.err("expecting ':' delimiter"));
        }
        self.pos += 1;
        self.ws();
        Ok(key)
    }

    fn literal(&mut self, word: &[u8], v: Value) -> Result<Value, PyJsonError> {
        if self.s[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(v)
        } else {
            Err(self.err("expecting value"))
        }
    }

    fn scalar(&mut self) -> Result<Value, PyJsonError> {
        match self.peek() {
            Some(b'"') => self.string().map(Value::String),
            Some(b'n') => self.literal(b"null", Value::Null),
            Some(b't') => self.literal(b"true", Value::Bool(true)),
            Some(b'f') => self.literal(b"false", Value::Bool(false)),
            Some(b'N') => self.literal(b"NaN", float_value(f64::NAN)),
            Some(b'I') => self.literal(b"Infinity", float_value(f64::INFINITY)),
            Some(b'-') if self.s[self.pos..].starts_with(b"-Infinity") => {
                self.literal(b"-Infinity", float_value(f64::NEG_INFINITY))
            }
            _ => self.number(),
        }
    }

    /// Python's number grammar: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?`, an int
    /// without fraction and exponent, else a float (correctly rounded, overflow infinite).
    fn number(&mut self) -> Result<Value, PyJsonError> {
        let start = self.pos;
        let digits = |p: &mut Self| {
            let from = p.pos;
            while p.peek().is_some_and(|b| b.is_ascii_digit()) {
                p.pos += 1;
            }
            p.pos - from
        };
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => {
                self.pos = start;
                return Err(self.err("expecting value"));
            }
        }
        let int_end = self.pos;
        let mut float = false;
        if self.peek() == Some(b'.') && self.s.get(self.pos + 1).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
            digits(self);
            float = true;
        }
        if let Some(b'e' | b'E') = self.peek() {
            let e = self.pos;
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if digits(self) == 0 {
                // Python backs off to before the `e`; whatever follows is then an error.
                self.pos = e;
            } else {
                float = true;
            }
        }
        // ASCII only: the slices are valid UTF-8.
        let text = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("0");
        if float {
            let f: f64 = text.parse().map_err(|_| self.err("bad number"))?;
            return Ok(float_value(f));
        }
        let negative = text.starts_with('-');
        let magnitude = &self.s[start + usize::from(negative)..int_end];
        if magnitude.len() > MAX_INT_DIGITS {
            return Err(PyJsonError::IntTooLong);
        }
        if let Ok(i) = text.parse::<i64>() {
            // `-0` is the int 0.
            return Ok(Value::Number(i.into()));
        }
        if let Ok(u) = text.parse::<u64>() {
            return Ok(Value::Number(u.into()));
        }
        Ok(special(text.to_owned()))
    }

    /// A string at `pos` (on its opening quote), escapes decoded.
    fn string(&mut self) -> Result<String, PyJsonError> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let from = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // The input is UTF-8 and the run stops only at ASCII bytes.
            out.push_str(std::str::from_utf8(&self.s[from..self.pos]).unwrap_or_default());
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let c = match self.peek() {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            let at = self.pos - 1;
                            self.pos += 1;
                            let hi = self.hex4()?;
                            let c = if (0xd800..0xdc00).contains(&hi)
                                && self.s[self.pos..].starts_with(b"\\u")
                            {
                                let save = self.pos;
                                self.pos += 2;
                                let lo = self.hex4()?;
                                if (0xdc00..0xe000).contains(&lo) {
                                    0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                                } else {
                                    self.pos = save;
                                    hi
                                }
                            } else {
                                hi
                            };
                            out.push(char::from_u32(c).ok_or(PyJsonError::LoneSurrogate(at))?);
                            continue;
                        }
                        _ => return Err(self.err("invalid \\escape")),
                    };
                    self.pos += 1;
                    out.push(c);
                }
                Some(_) => return Err(self.err("invalid control character")),
                None => return Err(self.err("unterminated string")),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, PyJsonError> {
        let h = self.s.get(self.pos..self.pos + 4).ok_or(self.err("invalid \\uXXXX escape"))?;
        let h = std::str::from_utf8(h).map_err(|_| self.err("invalid \\uXXXX escape"))?;
        if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.err("invalid \\uXXXX escape"));
        }
        let v = u32::from_str_radix(h, 16).map_err(|_| self.err("invalid \\uXXXX escape"))?;
        self.pos += 4;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn num(v: &Value) -> Option<&str> {
        special_number(v)
    }

    fn from_str(text: &str) -> Result<Value, PyJsonError> {
        super::from_str(text).map(|p| {
            assert!(!p.truncated);
            p.value
        })
    }

    #[test]
    fn ordinary_json_reads_as_serde_json_does() {
        for text in [
            r#"{"a": [1, 2.5, -3, true, false, null, "x\n\u00e9\ud83d\ude00"], "b": {}}"#,
            r#"[]"#,
            r#" {"k": 18446744073709551615, "n": -9223372036854775808, "f": 1e-7} "#,
            r#"{"a": 1, "b": 2, "a": 3}"#,
            r#"[0.1, 1E5, 1.0e+2, 2.5E-3, 123456789012345678.0]"#,
        ] {
            let want: Value = serde_json::from_str(text).unwrap();
            assert_eq!(from_str(text).unwrap(), want, "{text}");
        }
        // A duplicate key keeps its first place and its last value, as a Python dict.
        let v = from_str(r#"{"a": 1, "b": 2, "a": 3}"#).unwrap();
        assert_eq!(v.as_object().unwrap().keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(v["a"], 3);
    }

    #[test]
    fn numbers_as_python_reads_them() {
        let v = from_str("[-0, -0.0, 0, 12345678901234567890123, -98765432109876543210]").unwrap();
        assert!(v[0].is_i64() && v[0] == 0);
        assert!(v[1].as_f64().is_some_and(|f| f == 0.0 && f.is_sign_negative()));
        assert_eq!(num(&v[3]), Some("12345678901234567890123"));
        assert_eq!(num(&v[4]), Some("-98765432109876543210"));
        let v = from_str("[NaN, Infinity, -Infinity, 1e400, -1e400, 1e-400]").unwrap();
        assert_eq!(num(&v[0]), Some("NaN"));
        assert_eq!(num(&v[1]), Some("Infinity"));
        assert_eq!(num(&v[2]), Some("-Infinity"));
        assert_eq!(num(&v[3]), Some("Infinity"));
        assert_eq!(num(&v[4]), Some("-Infinity"));
        assert_eq!(v[5], json!(0.0));
        let long = "9".repeat(MAX_INT_DIGITS);
        assert_eq!(num(&from_str(&long).unwrap()), Some(long.as_str()));
        assert_eq!(from_str(&format!("{long}9")), Err(PyJsonError::IntTooLong));
        // Long floats are fine.
        assert!(from_str(&format!("{long}9.5")).is_ok());
    }

    #[test]
    fn what_python_refuses() {
        for text in [
            "",
            " ",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".5",
            "+1",
            "1e",
            "-",
            "nan",
            "inf",
            "-NaN",
            "[1 2]",
            "{'a': 1}",
            "\"\t\"",
            "\"\\x\"",
            "\"\\u12\"",
            "[1]]",
            "{\"a\" 1}",
            "tru",
            "\"abc",
            "[",
            "{",
        ] {
            assert!(from_str(text).is_err(), "{text:?}");
        }
        assert_eq!(from_str("\"\\ud800\""), Err(PyJsonError::LoneSurrogate(1)));
        assert!(from_str("\"\\ud800\\u0041\"").is_err());
    }

    #[test]
    fn a_body_may_start_with_a_bom_a_string_may_not() {
        assert_eq!(from_body(b"\xef\xbb\xbf{\"a\": 1}").unwrap().value, json!({"a": 1}));
        assert_eq!(from_str("\u{feff}{\"a\": 1}"), Err(PyJsonError::Bom));
        assert_eq!(from_body(b"{\"a\": \"\xff\"}"), Err(PyJsonError::NotUtf8));
    }

    #[test]
    fn nesting_is_kept_to_the_bound_checked_beyond_it_and_refused_past_the_hard_bound() {
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let objs = |n: usize| format!("{}[1, {{}}, []]{}", "{\"a\":".repeat(n), "}".repeat(n));
        for text in [deep(MAX_DEPTH), objs(MAX_DEPTH - 2)] {
            let p = super::from_str(&text).unwrap();
            assert!(!p.truncated);
            assert_eq!(p.value, serde_json::from_str::<Value>(&text).unwrap_or(p.value.clone()));
        }
        // Deeper: read and checked, the part below the bound replaced by null.
        let p = super::from_str(&deep(MAX_DEPTH + 1)).unwrap();
        assert!(p.truncated);
        let mut v = &p.value;
        for _ in 0..MAX_DEPTH {
            v = &v[0];
        }
        assert_eq!(*v, Value::Null);
        let p = super::from_str(&format!("[{}, 7]", objs(MAX_DEPTH + 50))).unwrap();
        assert!(p.truncated);
        assert_eq!(p.value[1], 7);
        for bad in [
            format!("{}1,]{}", "[".repeat(MAX_DEPTH + 3), "]".repeat(MAX_DEPTH + 2)),
            format!("{}{{\"a\" 1}}{}", "[".repeat(MAX_DEPTH + 3), "]".repeat(MAX_DEPTH + 3)),
            format!("{}NaX{}", "[".repeat(MAX_DEPTH + 3), "]".repeat(MAX_DEPTH + 3)),
            "[".repeat(MAX_DEPTH + 3),
        ] {
            assert!(super::from_str(&bad).is_err());
        }
        assert!(super::from_str(&deep(HARD_DEPTH)).unwrap().truncated);
        assert_eq!(super::from_str(&deep(HARD_DEPTH + 1)), Err(PyJsonError::TooDeep));
        // Far deeper input fails at the bound, not on the stack.
        assert_eq!(super::from_str(&"[".repeat(1_000_000)), Err(PyJsonError::TooDeep));
    }

    fn has_float(v: &Value) -> bool {
        match v {
            Value::Number(n) => n.is_f64(),
            Value::Array(items) => items.iter().any(has_float),
            Value::Object(m) => m.values().any(has_float),
            _ => false,
        }
    }

    proptest::proptest! {
        /// Any text of JSON-ish pieces: never a panic; what serde_json reads without floats
        /// reads the same; what is kept prints back (serde_json) to the same value.
        #[test]
        fn any_text_parses_or_fails_cleanly(pieces in proptest::collection::vec(proptest::prop_oneof![
            proptest::strategy::Just("{"), proptest::strategy::Just("}"), proptest::strategy::Just("["),
            proptest::strategy::Just("]"), proptest::strategy::Just(","), proptest::strategy::Just(":"),
            proptest::strategy::Just("\"a\""), proptest::strategy::Just("\"\\u00e9\\ud83d\\ude00\""),
            proptest::strategy::Just("-0"), proptest::strategy::Just("1e400"), proptest::strategy::Just("NaN"),
            proptest::strategy::Just("-Infinity"), proptest::strategy::Just("12345678901234567890123"),
            proptest::strategy::Just("0.5"), proptest::strategy::Just("7"), proptest::strategy::Just("null"),
            proptest::strategy::Just(" "), proptest::strategy::Just("\u{feff}"), proptest::strategy::Just("1."),
            proptest::strategy::Just("\"\\"), proptest::strategy::Just("tru"), proptest::strategy::Just("e5"),
        ], 0..40)) {
            let text: String = pieces.concat();
            let python = super::from_str(&text);
            if let Ok(strict) = serde_json::from_str::<Value>(&text) {
                if !has_float(&strict) {
                    proptest::prop_assert_eq!(python.clone().map(|p| p.value), Ok(strict));
                }
            }
            if let Ok(p) = python {
                let again = serde_json::to_string(&p.value).unwrap();
                proptest::prop_assert_eq!(super::from_str(&again).map(|q| q.value), Ok(p.value));
            }
        }
    }

    #[test]
    fn floats_keep_their_value() {
        let v = from_str("[1.0, 1e16, 0.1, 5e-324, 1.7976931348623157e308]").unwrap();
        let fs: Vec<f64> = v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(fs, [1.0, 1e16, 0.1, 5e-324, f64::MAX]);
        assert!(v[0].is_f64());
    }
}
