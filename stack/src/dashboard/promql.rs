//! The metric names a PromQL expression reads: enough of PromQL's lexical structure to tell a
//! metric from a function, a keyword, a label name, a string, a number or a duration.

use std::collections::BTreeSet;

/// A metric an expression selects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum MetricRef {
    /// By name: `rate(foo_total[5m])`, or `{__name__="foo_total"}`.
    Name(String),
    /// By a regular expression on the name: `{__name__=~"foo_.+_total"}`.
    Pattern(String),
}

/// Keywords and operators spelled as words; never metric names.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "inf",
    "nan",
    "atan2",
];

/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// Every metric `expr` selects, in order of name. Fails on unbalanced brackets or an
/// unterminated string, so a typo in a dashboard cannot hide a name.
pub fn metric_refs(expr: &str) -> Result<BTreeSet<MetricRef>, String> {
    let b = expr.as_bytes();
    let mut out = BTreeSet::new();
    let mut i = 0;
    let mut depth = 0i32;
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' | b'\'' | b'`' => i = skip_string(b, i)?,
            b'{' => {
                let end = find_close(b, i, b'{', b'}')?;
                out.extend(name_matchers(&expr[i + 1..end])?);
                i = end + 1;
            }
            b'[' => i = find_close(b, i, b'[', b']')? + 1,
            b'(' => {
                depth += 1;
                i += 1;
            }
            b')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("unbalanced ')' at {i} in {expr}"));
                }
                i += 1;
            }
            b'}' | b']' => return Err(format!("unbalanced '{}' at {i} in {expr}", c as char)),
            b'$' => {
                // Grafana variables belong in label values and ranges (skipped above); one
                // inside a name would split it, so names must be interpolated first.
                let end = skip_variable(b, i + 1);
                let ident = |c: &u8| c.is_ascii_alphanumeric() || *c == b'_' || *c == b':';
                if i.checked_sub(1).and_then(|k| b.get(k)).is_some_and(ident)
                    || b.get(end).is_some_and(ident)
                {
                    return Err(format!(
                        "variable inside a name at {i} in {expr}: interpolate first"
                    ));
                }
                i = end;
            }
            b'0'..=b'9' | b'.' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_')
                {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b':' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':')
                {
                    i += 1;
                }
                let word = &expr[start..i];
                let lower = word.to_ascii_lowercase();
                let next = next_non_space(b, i);
                if LABEL_LISTS.contains(&lower.as_str()) && next.is_some_and(|j| b[j] == b'(') {
                    let open = next.unwrap_or(i);
                    i = find_close(b, open, b'(', b')')? + 1;
                } else if KEYWORDS.contains(&lower.as_str())
                    || next.is_some_and(|j| b[j] == b'(')
                    || next.is_some_and(|j| grouping_follows(&expr[j..]))
                {
                    // A keyword, a function or aggregation called here, or an aggregation
                    // with its grouping first (`sum by (l) (...)`).
                } else {
                    out.insert(MetricRef::Name(word.to_owned()));
                }
            }
            _ => i += 1,
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced '(' in {expr}"));
    }
    Ok(out)
}

/// Whether `rest` starts with `by` or `without` as a word.
fn grouping_follows(rest: &str) -> bool {
    ["by", "without"].iter().any(|k| {
        rest.get(..k.len()).is_some_and(|w| w.eq_ignore_ascii_case(k))
            && !rest[k.len()..]
                .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    })
}

fn next_non_space(b: &[u8], mut i: usize) -> Option<usize> {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    (i < b.len()).then_some(i)
}

/// Past a Grafana variable (`$name`, `${name}`), `at` just after the `$`.
fn skip_variable(b: &[u8], mut at: usize) -> usize {
    if b.get(at) == Some(&b'{') {
        while at < b.len() && b[at] != b'}' {
            at += 1;
        }
        return at + 1;
    }
    while at < b.len() && (b[at].is_ascii_alphanumeric() || b[at] == b'_') {
        at += 1;
    }
    at
}

/// The index just past the string that opens at `at`.
fn skip_string(b: &[u8], at: usize) -> Result<usize, String> {
    let quote = b[at];
    let mut i = at + 1;
    while i < b.len() {
        match b[i] {
            b'\\' if quote != b'`' => i += 2,
            c if c == quote => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err(format!("unterminated string at {at}"))
}

/// The index of the bracket closing the one at `at`, skipping strings inside.
fn find_close(b: &[u8], at: usize, open: u8, close: u8) -> Result<usize, String> {
    let mut depth = 0;
    let mut i = at;
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' | b'`' => {
                i = skip_string(b, i)?;
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    Err(format!("'{}' at {at} is never closed", open as char))
}

/// `__name__` matchers in the body of a `{...}` selector.
fn name_matchers(body: &str) -> Result<Vec<MetricRef>, String> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(pos) = rest.find("__name__") {
        let after = rest[pos + "__name__".len()..].trim_start();
        let (regex, value) = if let Some(v) = after.strip_prefix("=~") {
            (true, v)
        } else if let Some(v) = after.strip_prefix('=') {
            (false, v)
        } else {
            // `!=`, `!~`: excludes names, selects none by itself.
            rest = after;
            continue;
        };
        let value = value.trim_start();
        let quote = value.bytes().next().ok_or("__name__ matcher without a value")?;
        let end = skip_string(value.as_bytes(), 0)?;
        let inner = value[1..end - 1].to_owned();
        if !matches!(quote, b'"' | b'\'' | b'`') {
            return Err(format!("__name__ matcher without a quoted value in {{{body}}}"));
        }
        out.push(if regex { MetricRef::Pattern(inner) } else { MetricRef::Name(inner) });
        rest = &value[end..];
    }
    Ok(out)
}

/// Whether `name` matches a `__name__=~` pattern made of literal text and `.+`/`.*` only (the
/// only forms the dashboard uses; anything else is refused rather than half understood).
/// PromQL anchors these patterns at both ends.
pub fn pattern_matches(pattern: &str, name: &str) -> Result<bool, String> {
    // Literal text and wildcards (`true`: at least one character).
    let mut parts: Vec<(&str, Option<bool>)> = Vec::new();
    let mut rest = pattern;
    while let Some(pos) = [rest.find(".+"), rest.find(".*")].into_iter().flatten().min() {
        parts.push((&rest[..pos], None));
        parts.push(("", Some(&rest[pos..pos + 2] == ".+")));
        rest = &rest[pos + 2..];
    }
    parts.push((rest, None));
    let special = |s: &str| s.contains(|c: char| "\\^$.|?*+()[]{}".contains(c));
    if let Some((bad, _)) = parts.iter().find(|(lit, _)| special(lit)) {
        return Err(format!(
            "pattern {pattern}: only literal text with .+ or .* is understood ({bad})"
        ));
    }
    Ok(matches_from(&parts, name))
}

fn matches_from(parts: &[(&str, Option<bool>)], name: &str) -> bool {
    match parts.split_first() {
        None => name.is_empty(),
        Some(((lit, None), rest)) => name.strip_prefix(lit).is_some_and(|n| matches_from(rest, n)),
        Some(((_, Some(non_empty)), rest)) => {
            let from = usize::from(*non_empty);
            (from..=name.len())
                .filter(|&k| name.is_char_boundary(k))
                .any(|k| matches_from(rest, &name[k..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Vec<String> {
        metric_refs(expr)
            .unwrap()
            .into_iter()
            .map(|r| match r {
                MetricRef::Name(n) => n,
                MetricRef::Pattern(p) => format!("~{p}"),
            })
            .collect()
    }

    #[test]
    fn metrics_are_told_from_functions_keywords_labels_and_literals() {
        assert_eq!(
            names(
                r#"sum by (kvroute_worker) (rate(kvroute_worker_decisions{job=~"$envoy_job"}[$__rate_interval]))"#
            ),
            ["kvroute_worker_decisions"]
        );
        assert_eq!(
            names("histogram_quantile(0.99, sum by (le) (rate(x_bucket[5m])))"),
            ["x_bucket"]
        );
        assert_eq!(names("a / on(instance) group_left(worker) b"), ["a", "b"]);
        assert_eq!(names("sum(a) without (job, instance) > bool 1e3"), ["a"]);
        assert_eq!(names("a offset 5m unless b and c or d_total"), ["a", "b", "c", "d_total"]);
        assert_eq!(names("scalar(max(up)) - min(foo:recorded)"), ["foo:recorded", "up"]);
        assert_eq!(names(r#"label_replace(a, "dst", "$1", "src", "(.*) b")"#), ["a"]);
        assert_eq!(names("max(x) by (w)"), ["x"]);
        assert_eq!(names("topk by (w) (3, bytes)"), ["bytes"]);
        assert_eq!(names("rate(a[5m:1m]) * 0x1F + Inf - NaN"), ["a"]);
        assert_eq!(names("SUM BY (w) (a) + $x"), ["a"]);
        assert!(metric_refs("kvroute_calibration_${m}_base_us").is_err());
        assert!(metric_refs("max(a_$m)").is_err());
        assert!(names("time() - 3").is_empty());
    }

    #[test]
    fn name_matchers_inside_selectors_are_metrics() {
        assert_eq!(names(r#"{__name__="up", job="x"}"#), ["up"]);
        assert_eq!(names(r#"max({__name__=~"a_.+_b", job=~"$j"})"#), ["~a_.+_b"]);
        assert!(names(r#"{__name__!="up", job="x"}"#).is_empty());
        // Label values that look like names are not metrics.
        assert_eq!(names(r#"m{a="rate(b)", c='d{e}'}"#), ["m"]);
    }

    #[test]
    fn malformed_expressions_are_errors() {
        for bad in ["rate(a[5m]", "a{b=\"c\"", "sum(a))", "a]", "a{b=\"c}", "x{__name__=~up}"] {
            assert!(metric_refs(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn patterns_with_wildcards_match_names() {
        let p = "kvroute_calibration_m_worker_.+_deviation_permille";
        assert!(pattern_matches(p, "kvroute_calibration_m_worker_127_0_0_1_80_deviation_permille")
            .unwrap());
        assert!(!pattern_matches(p, "kvroute_calibration_m_worker__deviation_permille").unwrap());
        assert!(!pattern_matches(p, "kvroute_calibration_n_worker_w_deviation_permille").unwrap());
        assert!(pattern_matches("a.*b", "ab").unwrap());
        assert!(!pattern_matches("a.+b", "ab").unwrap());
        assert!(pattern_matches("a.+b.+c", "axbyc").unwrap());
        assert!(!pattern_matches("a.+b.+c", "abc").unwrap());
        assert!(pattern_matches("exact", "exact").unwrap());
        assert!(!pattern_matches("exact", "exactly").unwrap());
        assert!(pattern_matches("a|b", "a").is_err());
        assert!(pattern_matches("a\\d", "a1").is_err());
    }
}
