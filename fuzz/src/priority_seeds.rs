//! The seeds of `priority_field` (written with the others by `seeds.rs`): bodies whose
//! `priority` hides behind escapes, duplicates, nesting, brackets in strings or Python-only
//! numbers, each after the byte that picks the value set ([`crate::priority_field`]).

/// `body` after the value byte `b` (the value set is `b - 128`).
fn seed(b: u8, body: &str) -> Vec<u8> {
    let mut out = vec![b];
    out.extend_from_slice(body.as_bytes());
    out
}

pub fn priority_field() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("plain.json", seed(138, r#"{"model":"m","messages":[],"priority":-5}"#)),
        ("absent.json", seed(128, r#" { "model" : "m" } "#)),
        ("empty-object.json", seed(0, "{}")),
        (
            "escaped-duplicates.json",
            seed(
                200,
                r#"{"pri\u006frity":-9,"priority":1,"priorit\u0079":2,"Priority":3,"priority ":4}"#,
            ),
        ),
        (
            "nested-and-brackets.json",
            seed(
                100,
                r#"{"tools":[{"priority":1,"d":"}]\"{["}],"priority":{"priority":[]},"x":"\\"}"#,
            ),
        ),
        (
            "python-numbers.json",
            seed(
                129,
                "\u{feff}{\"a\":NaN,\"b\":-Infinity,\"priority\":123456789012345678901234567890}",
            ),
        ),
        ("not-an-object.json", seed(1, r#"[{"priority":1}]"#)),
        ("trailing.json", seed(1, r#"{"priority":1} {"#)),
    ]
}
