//! Python semantics for template values, as Jinja2 under transformers has them: `str()` of
//! values, `json.dumps`, float `repr`, the whitespace-aware string methods, and
//! `datetime.now().strftime`.

use minijinja::value::{from_args, ValueKind};
use minijinja::{Error, ErrorKind, State, Value};

/// Python's `str.isspace()` characters: what `strip()` and `split()` treat as whitespace.
/// Unlike Rust's `char::is_whitespace`, it includes the separators U+001C..U+001F.
pub fn is_py_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n'
            | '\u{0b}'
            | '\u{0c}'
            | '\r'
            | '\u{1c}'..='\u{1f}'
            | ' '
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}

/// `s.strip(chars)` / `lstrip` / `rstrip`: `chars` None strips Python whitespace.
pub fn strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let strip_it = |c: char| match chars {
        Some(set) => set.contains(c),
        None => is_py_space(c),
    };
    let s = if left { s.trim_start_matches(strip_it) } else { s };
    if right {
        s.trim_end_matches(strip_it)
    } else {
        s
    }
}

/// `s.split(sep, maxsplit)`: without `sep`, runs of whitespace separate and leading or
/// trailing whitespace gives no empty items; `maxsplit` < 0 means no limit.
fn split(s: &str, sep: Option<&str>, maxsplit: i64) -> Result<Vec<String>, Error> {
    let limit = usize::try_from(maxsplit).ok();
    match sep {
        Some("") => Err(Error::new(ErrorKind::InvalidOperation, "empty separator")),
        Some(sep) => Ok(match limit {
            Some(n) => s.splitn(n.saturating_add(1), sep).map(str::to_owned).collect(),
            None => s.split(sep).map(str::to_owned).collect(),
        }),
        None => {
            let mut out = Vec::new();
            let mut rest = strip(s, None, true, false);
            while !rest.is_empty() {
                if limit.is_some_and(|n| out.len() >= n) {
                    out.push(rest.to_owned());
                    break;
                }
                let end = rest.find(is_py_space).unwrap_or(rest.len());
                out.push(rest[..end].to_owned());
                rest = strip(&rest[end..], None, true, false);
            }
            Ok(out)
        }
    }
}

/// A string argument that may be absent or `None`.
fn opt_str(v: Option<&Value>) -> Result<Option<&str>, Error> {
    match v {
        None => Ok(None),
        Some(v) if v.is_none() || v.is_undefined() => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "expected a string argument")),
    }
}

/// Methods on values: Python's string methods where minijinja's Rust defaults differ
/// (`strip` family, `split`), everything else from minijinja-contrib's pycompat.
pub fn method(state: &State, value: &Value, name: &str, args: &[Value]) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        let (left, right) = match name {
            "strip" => (true, true),
            "lstrip" => (true, false),
            "rstrip" => (false, true),
            "split" => {
                let (sep, maxsplit): (Option<Value>, Option<i64>) = from_args(args)?;
                let parts = split(s, opt_str(sep.as_ref())?, maxsplit.unwrap_or(-1))?;
                return Ok(Value::from(parts));
            }
            _ => {
                return minijinja_contrib::pycompat::unknown_method_callback(
                    state, value, name, args,
                )
            }
        };
        let (chars,): (Option<Value>,) = from_args(args)?;
        return Ok(Value::from(strip(s, opt_str(chars.as_ref())?, left, right)));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, name, args)
}

/// Python's `repr(float)` (also its `str`): the shortest digits that round-trip, positional
/// for exponents -5 < e < 16, else `d.ddde±XX`.
pub fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let decpt = exp + 1;
    let mut out = String::from(sign);
    if !(-4 < decpt && decpt <= 16) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push_str(&format!("e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.unsigned_abs()));
    } else if decpt <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', decpt.unsigned_abs() as usize));
        out.push_str(&digits);
    } else {
        let point = decpt as usize;
        if point >= digits.len() {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point]);
            out.push('.');
            out.push_str(&digits[point..]);
        }
    }
    out
}

fn as_f64(v: &Value) -> f64 {
    f64::try_from(v.clone()).unwrap_or(f64::NAN)
}

/// Python's `str(value)`: what `{{ value }}` prints.
pub fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => v.as_str().unwrap_or_default().to_owned(),
        _ => {
            let mut out = String::new();
            py_repr(v, &mut out);
            out
        }
    }
}

/// Python's `repr(value)`.
fn py_repr(v: &Value, out: &mut String) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
        ValueKind::Number => out.push_str(&py_float_repr(as_f64(v))),
        ValueKind::String => py_repr_str(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(&item, out);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(&key, out);
                out.push_str(": ");
                py_repr(&v.get_item(&key).unwrap_or_default(), out);
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
}

/// Characters `str.isprintable()` rejects (approximately: controls, separators other than the
/// ASCII space, and the common format characters), which `repr` escapes.
fn py_unprintable(c: char) -> bool {
    c.is_control()
        || (c != ' ' && is_py_space(c))
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}' | '\u{feff}' | '\u{e000}'..='\u{f8ff}')
}

fn py_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if py_unprintable(c) => {
                let n = c as u32;
                if n < 0x100 {
                    out.push_str(&format!("\\x{n:02x}"));
                } else if n < 0x10000 {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// The options of `json.dumps` that templates pass to `tojson`.
#[derive(Debug, Clone, Default)]
pub struct JsonOptions {
    pub ensure_ascii: bool,
    /// The indent string (`indent=2` is two spaces); None is the compact form.
    pub indent: Option<String>,
    /// (item separator, key separator); None is Python's default for the indent.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

/// `indent=` as json.dumps takes it: an int (spaces) or a string.
pub fn indent_arg(v: Option<&Value>) -> Result<Option<String>, Error> {
    match v {
        None => Ok(None),
        Some(v) if v.is_none() || v.is_undefined() => Ok(None),
        Some(v) if v.kind() == ValueKind::String => Ok(Some(v.as_str().unwrap_or("").to_owned())),
        Some(v) => {
            let n = i64::try_from(v.clone())?;
            Ok(Some(" ".repeat(usize::try_from(n).unwrap_or(0))))
        }
    }
}

/// `separators=(item, key)`.
pub fn separators_arg(v: Option<&Value>) -> Result<Option<(String, String)>, Error> {
    let Some(v) = v.filter(|v| !v.is_none() && !v.is_undefined()) else {
        return Ok(None);
    };
    let parts: Vec<Value> = v.try_iter()?.collect();
    match parts.as_slice() {
        [a, b] if a.as_str().is_some() && b.as_str().is_some() => Ok(Some((
            a.as_str().unwrap_or_default().to_owned(),
            b.as_str().unwrap_or_default().to_owned(),
        ))),
        _ => Err(Error::new(ErrorKind::InvalidOperation, "separators must be two strings")),
    }
}

/// Python's `json.dumps(value, ...)`.
pub fn py_json_dumps(v: &Value, opts: &JsonOptions) -> Result<String, Error> {
    let (item_sep, key_sep) = match &opts.separators {
        Some((a, b)) => (a.as_str(), b.as_str()),
        None if opts.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let mut out = String::new();
    let enc = Encoder { opts, item_sep, key_sep };
    enc.value(v, 0, &mut out)?;
    Ok(out)
}

struct Encoder<'a> {
    opts: &'a JsonOptions,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl Encoder<'_> {
    fn value(&self, v: &Value, level: usize, out: &mut String) -> Result<(), Error> {
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
            ValueKind::Number => out.push_str(&json_float(as_f64(v))),
            _ if v.downcast_object_ref::<super::BigInt>().is_some() => out.push_str(&v.to_string()),
            ValueKind::String => self.string(v.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container('[', ']', items.len(), level, out, |i, level, out| {
                    self.value(&items[i], level, out)
                })?;
            }
            ValueKind::Map => {
                let mut items = Vec::new();
                for key in v.try_iter()? {
                    let item = v.get_item(&key)?;
                    items.push((self.key(&key)?, item));
                }
                if self.opts.sort_keys {
                    items.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container('{', '}', items.len(), level, out, |i, level, out| {
                    self.string(&items[i].0, out);
                    out.push_str(self.key_sep);
                    self.value(&items[i].1, level, out)
                })?;
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {kind} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }

    /// A dict key as json.dumps writes it: strings as they are, numbers, booleans and None
    /// in their JSON spelling.
    fn key(&self, key: &Value) -> Result<String, Error> {
        Ok(match key.kind() {
            ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
            ValueKind::None => "null".into(),
            ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
            ValueKind::Number if key.is_integer() => key.to_string(),
            ValueKind::Number => json_float(as_f64(key)),
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("keys must be str, int, float, bool or None, not {kind}"),
                ))
            }
        })
    }

    fn container(
        &self,
        open: char,
        close: char,
        len: usize,
        level: usize,
        out: &mut String,
        mut item: impl FnMut(usize, usize, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        let inner = level + 1;
        let newline = |out: &mut String, level: usize| {
            if let Some(indent) = &self.opts.indent {
                out.push('\n');
                for _ in 0..level {
                    out.push_str(indent);
                }
            }
        };
        newline(out, inner);
        for i in 0..len {
            if i > 0 {
                out.push_str(self.item_sep);
                newline(out, inner);
            }
            item(i, inner, out)?;
        }
        newline(out, level);
        out.push(close);
        Ok(())
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.opts.ensure_ascii && !(' '..='~').contains(&c) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A float as json.dumps writes it (`NaN`, `Infinity` allowed, as Python does by default).
fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        py_float_repr(f)
    }
}

/// `datetime.now().strftime(fmt)`, in UTC (the engine's local zone is unknown).
pub fn strftime_now(fmt: &str) -> Result<String, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, "clock before 1970"))?
        .as_secs();
    Ok(strftime(i64::try_from(secs).unwrap_or(0), fmt))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] =
    ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// C `strftime` over a UTC timestamp for the directives chat templates use (glibc's `%-d`
/// style unpadded forms included); unknown directives are kept as written.
pub fn strftime(unix_secs: i64, fmt: &str) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (Monday = 0)
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let num = |n: i64, width: usize| {
            if unpadded {
                n.to_string()
            } else {
                format!("{n:0width$}")
            }
        };
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&num(year.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(month, 2)),
            Some('d') => out.push_str(&num(day, 2)),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('H') => out.push_str(&num(hour, 2)),
            Some('I') => out.push_str(&num(hour12, 2)),
            Some('M') => out.push_str(&num(minute, 2)),
            Some('S') => out.push_str(&num(second, 2)),
            Some('j') => out.push_str(&num(yday, 3)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('Z') | Some('z') => {} // a naive datetime has no zone
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month, day) of a day count since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
