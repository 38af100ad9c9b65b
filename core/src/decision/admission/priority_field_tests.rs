use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::decision::pyjson;

fn edit(body: &str, e: PriorityEdit) -> Option<String> {
    rewrite(body.as_bytes(), e).unwrap().map(|b| String::from_utf8(b).unwrap())
}

#[test]
fn a_missing_member_is_inserted_first_and_the_rest_kept_byte_for_byte() {
    let body = r#"{ "model": "m",  "messages": [{"role":"user","content":"hi"}] }"#;
    assert_eq!(
        edit(body, PriorityEdit::Set(7)).unwrap(),
        r#"{ "priority":7,"model": "m",  "messages": [{"role":"user","content":"hi"}] }"#
    );
    assert_eq!(edit("{}", PriorityEdit::Set(-3)).unwrap(), r#"{"priority":-3}"#);
    assert_eq!(edit(" { \n} ", PriorityEdit::Set(1)).unwrap(), " {\"priority\":1 \n} ");
    assert_eq!(edit("{}", PriorityEdit::Remove), None);
    assert_eq!(edit(r#"{"a":1}"#, PriorityEdit::Keep), None);
}

#[test]
fn one_member_has_its_value_replaced_in_place() {
    let body = r#"{"model":"m","priority" : 12,"stream":true}"#;
    assert_eq!(
        edit(body, PriorityEdit::Set(0)).unwrap(),
        r#"{"model":"m","priority" : 0,"stream":true}"#
    );
    assert_eq!(edit(body, PriorityEdit::Set(12)), None);
    assert_eq!(
        edit(r#"{"priority":"urgent"}"#, PriorityEdit::Set(5)).unwrap(),
        r#"{"priority":5}"#
    );
    assert_eq!(
        edit(r#"{"priority":{"a":[1,"}"]},"x":1}"#, PriorityEdit::Set(2)).unwrap(),
        r#"{"priority":2,"x":1}"#
    );
}

#[test]
fn removal_keeps_the_other_members_and_their_separators() {
    let r = |b: &str| edit(b, PriorityEdit::Remove).unwrap();
    assert_eq!(r(r#"{"priority":-100}"#), "{}");
    assert_eq!(r(r#"{"a":1, "priority":-100}"#), r#"{"a":1}"#);
    assert_eq!(r(r#"{"priority":-100, "a":1}"#), r#"{"a":1}"#);
    assert_eq!(r(r#"{"a":1, "priority":-1 ,"b":2}"#), r#"{"a":1 ,"b":2}"#);
    assert_eq!(r("\u{feff}{\"priority\":1,\"a\":2}"), "\u{feff}{\"a\":2}");
}

#[test]
fn escaped_and_duplicate_keys_are_all_caught_and_nested_ones_left_alone() {
    // Python decodes the key and keeps the last duplicate: every spelling must go.
    let body = r#"{"pri\u006frity":-9,"priority":-8,"priorit\u0079":-7,"tools":[{"priority":1}],"Priority":3,"priority ":4}"#;
    let out = edit(body, PriorityEdit::Set(10)).unwrap();
    assert_eq!(out, r#"{"priority":10,"tools":[{"priority":1}],"Priority":3,"priority ":4}"#);
    let v = pyjson::from_body(out.as_bytes()).unwrap().value;
    assert_eq!(v["priority"], json!(10));
    assert_eq!(v["tools"][0]["priority"], json!(1));
    // Not `priority`: a key that only looks like it.
    for key in [r#""p\"riority""#, r#""priority\u0000""#, r#""\u0170riority""#, r#""prio""#] {
        let body = format!("{{{key}:1}}");
        assert_eq!(edit(&body, PriorityEdit::Remove), None, "{key}");
    }
}

#[test]
fn python_only_numbers_and_strings_with_brackets_are_skipped_as_values() {
    let body = r#"{"a":NaN,"b":-Infinity,"c":123456789012345678901234567890,"d":"}]\"{","priority":1e400}"#;
    let out = edit(body, PriorityEdit::Remove).unwrap();
    assert_eq!(out, r#"{"a":NaN,"b":-Infinity,"c":123456789012345678901234567890,"d":"}]\"{"}"#);
}

#[test]
fn bodies_that_are_not_one_object_are_errors() {
    for body in [
        "",
        "[]",
        "{",
        r#"{"a"}"#,
        r#"{"a":}"#,
        r#"{"a":1"#,
        r#"{"a":1} x"#,
        r#"{"a":"1}"#,
        r#"{"a":[1}"#,
        r#"{"a":1,}"#,
        "{a:1}",
    ] {
        assert!(rewrite(body.as_bytes(), PriorityEdit::Remove).is_err(), "{body:?}");
    }
    // Keep never reads the body.
    assert_eq!(rewrite(b"garbage", PriorityEdit::Keep), Ok(None));
}

/// Pieces of bodies: keys (some decoding to `priority`) and values (some with brackets or
/// quotes inside strings, nested `priority` members, Python-only numbers).
const KEYS: &[&str] = &[
    r#""priority""#,
    r#""pri\u006frity""#,
    r#""\u0070riority""#,
    r#""Priority""#,
    r#""priority ""#,
    r#""model""#,
    r#""messages""#,
    r#""x\"y""#,
    r#""\\""#,
];
const VALUES: &[&str] = &[
    "0",
    "-12",
    "3.5",
    "-0",
    "1e3",
    "NaN",
    "-Infinity",
    "123456789012345678901234567890",
    "true",
    "null",
    r#""text""#,
    r#""}]{[\"""#,
    r#""\u00e9\n""#,
    "[]",
    "{}",
    r#"[1, {"priority": 2}, "]"]"#,
    r#"{"priority": {"priority": []}, "k": "}"}"#,
];
const SPACE: &[&str] = &["", " ", "\n", "\t ", "\r\n  "];

fn body() -> impl Strategy<Value = String> {
    let member = (0..KEYS.len(), 0..VALUES.len(), 0..SPACE.len(), 0..SPACE.len());
    (prop::collection::vec(member, 0..8), 0..SPACE.len(), any::<bool>()).prop_map(
        |(members, ws, bom)| {
            let inner: Vec<String> = members
                .iter()
                .map(|&(k, v, a, b)| format!("{}{}:{}{}", KEYS[k], SPACE[a], SPACE[b], VALUES[v]))
                .collect();
            let sep = format!(",{}", SPACE[ws]);
            let bom = if bom { "\u{feff}" } else { "" };
            format!("{bom}{}{{{}{}}}", SPACE[ws], inner.join(&sep), SPACE[ws])
        },
    )
}

fn without_priority(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("priority");
    }
    v
}

proptest! {
    /// Differential against the Python-faithful parser: the edited body reads as the original
    /// with its `priority` member set or removed, and nothing else changed.
    #[test]
    fn the_edit_changes_only_the_top_level_priority(
        body in body(),
        set in prop::option::of(-1000i64..1000),
    ) {
        let before = pyjson::from_body(body.as_bytes()).unwrap().value;
        let e = set.map_or(PriorityEdit::Remove, PriorityEdit::Set);
        let out = rewrite(body.as_bytes(), e).unwrap();
        let after = match &out {
            Some(b) => pyjson::from_body(b).unwrap().value,
            None => before.clone(),
        };
        prop_assert_eq!(without_priority(&after), without_priority(&before));
        prop_assert_eq!(after.get("priority").cloned(), set.map(|n| json!(n)));
        if out.is_none() {
            prop_assert_eq!(before.get("priority").cloned(), set.map(|n| json!(n)));
        }
    }

    /// Any bytes: an answer, never a panic.
    #[test]
    fn any_bytes_are_answered(bytes in prop::collection::vec(any::<u8>(), 0..64), n in any::<i64>()) {
        let _ = rewrite(&bytes, PriorityEdit::Set(n));
        let _ = rewrite(&bytes, PriorityEdit::Remove);
    }
}
