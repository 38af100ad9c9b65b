//! Integer fields read as vLLM's pydantic models read them: an `int` field in pydantic v2's
//! lax mode, validating the Python objects Starlette's `request.json()` built (see `pyjson`).
//! Checked against pydantic 2.14 / pydantic-core 2.50 (the table in the tests):
//!
//! - an `int` (any size; `-0` is 0) is itself; `true` / `false` are 1 / 0;
//! - a float is accepted when it has no fractional part and lies strictly between -2^63 and
//!   2^63 (`2.0`, `1e3`, `-0.0`); `2.5` and `1e-3` are refused (`int_from_float`), larger ones
//!   too (`int_parsing_size`), and NaN and infinities (`finite_number`);
//! - a string is trimmed of Unicode white space, then read as an optional sign, ASCII digits
//!   with single underscores between them, and optionally a `.` followed by zeros only
//!   (`" 2 "`, `"1_000"`, `"2.00"`, `"+3"`); anything else is refused (`"1e3"`, `"0x10"`,
//!   `"2."`, `"2.5"`, `""`);
//! - anything else (null aside, which the caller handles) is refused.
//!
//! A value is returned as an `i128`, saturated: an integer beyond it is just as much out of
//! range for every field kvroute reads.

use serde_json::Value;

use crate::decision::pyjson;

/// The integer pydantic's lax `int` makes of `v`, or `None` when it refuses `v`.
pub fn lax_int(v: &Value) -> Option<i128> {
    match v {
        Value::Bool(b) => Some(i128::from(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                return Some(i128::from(i));
            }
            if let Some(u) = n.as_u64() {
                return Some(i128::from(u));
            }
            float_int(n.as_f64()?)
        }
        Value::String(s) => str_int(s),
        Value::Object(_) => {
            // Integers beyond 64 bits, NaN and the infinities as `pyjson` holds them.
            let spelling = pyjson::special_number(v)?;
            if matches!(spelling, "NaN" | "Infinity" | "-Infinity") {
                return None;
            }
            digits(spelling)
        }
        Value::Null | Value::Array(_) => None,
    }
}

/// Whether `v` is an integer without any conversion (pydantic's strict `int`: a Python `int`,
/// not a `bool` or a float).
pub fn is_strict_int(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.is_i64() || n.is_u64(),
        Value::Object(_) => pyjson::special_number(v)
            .is_some_and(|s| !matches!(s, "NaN" | "Infinity" | "-Infinity")),
        _ => false,
    }
}

/// A float as an `int`: integral and strictly inside the 64-bit range.
fn float_int(f: f64) -> Option<i128> {
    // -2^63 and 2^63 are exact doubles; pydantic refuses both bounds.
    const BOUND: f64 = 9_223_372_036_854_775_808.0;
    if !f.is_finite() || f.fract() != 0.0 || f <= -BOUND || f >= BOUND {
        return None;
    }
    // In range and integral: the conversion is exact.
    Some(f as i128)
}

/// A string as an `int` (see the module doc).
fn str_int(s: &str) -> Option<i128> {
    let s = s.trim();
    let s = match s.split_once('.') {
        Some((int, zeros)) if !zeros.is_empty() && zeros.bytes().all(|b| b == b'0') => int,
        Some(_) => return None,
        None => s,
    };
    let (negative, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    // Digits in groups separated by single underscores: no empty group anywhere.
    if body.split('_').any(|g| g.is_empty() || !g.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let n = body
        .bytes()
        .filter(u8::is_ascii_digit)
        .fold(0i128, |n, d| n.saturating_mul(10).saturating_add(i128::from(d - b'0')));
    Some(if negative { -n } else { n })
}

/// The digits of an integer as `pyjson` spells one beyond 64 bits (`-` and digits).
fn digits(spelling: &str) -> Option<i128> {
    let (negative, body) = match spelling.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, spelling),
    };
    if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n =
        body.bytes().fold(0i128, |n, d| n.saturating_mul(10).saturating_add(i128::from(d - b'0')));
    Some(if negative { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `v` as a JSON text, read as vLLM's server reads a body.
    fn int(text: &str) -> Option<i128> {
        let body = format!(r#"{{"x": {text}}}"#);
        let parsed = pyjson::from_body(body.as_bytes()).unwrap().value;
        lax_int(&parsed["x"])
    }

    /// Each row was run through pydantic 2.14 (`class M(BaseModel): x: int | None`,
    /// `M.model_validate(json.loads(body))`): `Some` is what it made of the value, `None` a
    /// validation error.
    #[test]
    fn lax_ints_are_what_pydantic_accepts() {
        const BIG: i128 = 99_999_999_999_999_999_999_999;
        let rows: &[(&str, Option<i128>)] = &[
            ("2", Some(2)),
            ("-0", Some(0)),
            ("18446744073709551615", Some(18_446_744_073_709_551_615)),
            ("99999999999999999999999", Some(BIG)),
            ("2.0", Some(2)),
            ("4.0e0", Some(4)),
            ("1e3", Some(1000)),
            ("1E3", Some(1000)),
            ("1.5e1", Some(15)),
            ("-1.0", Some(-1)),
            ("-0.0", Some(0)),
            ("9.2e18", Some(9_200_000_000_000_000_000)),
            ("-9.2e18", Some(-9_200_000_000_000_000_000)),
            ("2.5", None),
            ("1e-3", None),
            ("1e20", None),
            ("9.3e18", None),
            ("9223372036854775807.0", None),
            ("-9223372036854775808.0", None),
            ("1e308", None),
            ("NaN", None),
            ("Infinity", None),
            ("-Infinity", None),
            ("true", Some(1)),
            ("false", Some(0)),
            (r#""2""#, Some(2)),
            (r#"" 2 ""#, Some(2)),
            (r#"" -5 ""#, Some(-5)),
            (r#""+3""#, Some(3)),
            (r#""-0""#, Some(0)),
            (r#""007""#, Some(7)),
            (r#""1_000""#, Some(1000)),
            (r#""1_000_000""#, Some(1_000_000)),
            (r#""0_7""#, Some(7)),
            (r#""2.0""#, Some(2)),
            (r#""2.00""#, Some(2)),
            (r#""-0.000""#, Some(0)),
            (r#""1_0.0""#, Some(10)),
            (r#""2.0 ""#, Some(2)),
            (r#""\t3""#, Some(3)),
            (r#""1\n""#, Some(1)),
            (r#""\u000b3""#, Some(3)),
            (r#""\u00853""#, Some(3)),
            (r#""\u00a03""#, Some(3)),
            (r#""\u30003""#, Some(3)),
            (r#""1.0\u3000""#, Some(1)),
            (r#""-99999999999999999999999""#, Some(-BIG)),
            (r#""""#, None),
            (r#"" ""#, None),
            (r#""\u001c3""#, None),
            (r#""\uff13""#, None),
            (r#""\u0663""#, None),
            (r#""3\u0000""#, None),
            (r#""1e3""#, None),
            (r#""1e0""#, None),
            (r#""2.0e0""#, None),
            (r#""0x10""#, None),
            (r#""0b1""#, None),
            (r#""2.""#, None),
            (r#"".0""#, None),
            (r#""-.0""#, None),
            (r#""2.5""#, None),
            (r#""1.5""#, None),
            (r#""2.0000000000000000001""#, None),
            (r#""1.0_0""#, None),
            (r#""1._0""#, None),
            (r#""1.00_""#, None),
            (r#""1 000""#, None),
            (r#""1 .0""#, None),
            (r#""1.0 0""#, None),
            (r#""1__0""#, None),
            (r#""_1""#, None),
            (r#""1_""#, None),
            (r#""+_1""#, None),
            (r#""+""#, None),
            (r#""-""#, None),
            (r#""+-1""#, None),
            (r#""--1""#, None),
            (r#""+ 1""#, None),
            ("[]", None),
            ("{}", None),
            ("null", None),
        ];
        for (text, want) in rows {
            assert_eq!(int(text), *want, "{text}");
        }
    }

    #[test]
    fn only_python_ints_are_strict() {
        let strict = |text: &str| {
            let body = format!(r#"{{"x": {text}}}"#);
            is_strict_int(&pyjson::from_body(body.as_bytes()).unwrap().value["x"])
        };
        for text in ["1", "-0", "123456789012345678901234567890"] {
            assert!(strict(text), "{text}");
        }
        for text in ["1.0", "true", r#""1""#, "NaN", "Infinity", "null", "[1]"] {
            assert!(!strict(text), "{text}");
        }
    }

    #[test]
    fn integers_beyond_i128_saturate() {
        let huge = "9".repeat(60);
        assert_eq!(int(&huge), Some(i128::MAX));
        assert_eq!(int(&format!("-{huge}")), Some(-i128::MAX));
        assert_eq!(int(&format!(r#""{huge}""#)), Some(i128::MAX));
    }
}
