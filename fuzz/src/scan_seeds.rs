//! The seeds of `request_scan` (written with the others by `seeds.rs`): bodies where the body
//! scan and the general path could part, each after its mode byte (`0` a whole body, `1` the
//! `messages` of a chat body, `2` the `prompt` of a completions body; see
//! [`crate::request_scan`]).

use kvroute_core::decision::pyjson::MAX_INT_DIGITS;

/// `text` after the mode byte `mode`, with each `@` replaced by a byte that is not UTF-8.
fn seed(mode: u8, text: &str) -> Vec<u8> {
    let mut out = vec![mode];
    out.extend(text.bytes().map(|b| if b == b'@' { 0xff } else { b }));
    out
}

pub fn request_scan() -> Vec<(&'static str, Vec<u8>)> {
    let long_int = "9".repeat(MAX_INT_DIGITS + 1);
    let deep = format!("{}1{}", "[".repeat(130), "]".repeat(130));
    let seeds = vec![
        (
            "chat-ordinary.json",
            seed(
                b'0',
                r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"a\u00e9\n"},"b",{"type":"image_url","image_url":{"url":"u"}}],"x":[1,{"k":2}]},{"role":"assistant","content":null,"reasoning_content":"r","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}]},{"role":"tool","tool_call_id":"c","content":"42"}],"stream":true,"max_tokens":5}"#,
            ),
        ),
        (
            "chat-duplicate-keys.json",
            seed(
                b'0',
                r#"{"model":"m","messages":[],"messages":[{"role":"user","content":"a","content":["b"],"role":"assistant","role":"user"}]}"#,
            ),
        ),
        (
            "messages-python-ints-kept.json",
            seed(
                b'1',
                r#"[{"role":"tool","content":"x","tool_call_id":-0},{"role":"developer","content":"d","tools":[123456789012345678901234]}]"#,
            ),
        ),
        (
            "messages-skipped-not-utf8.json",
            seed(b'1', r#"[{"role":"user","content":"x","x":"@"}]"#),
        ),
        (
            "messages-skipped-long-int.json",
            seed(b'1', &format!(r#"[{{"role":"user","content":"x","x":{long_int}}}]"#)),
        ),
        (
            "messages-skipped-deep.json",
            seed(b'1', &format!(r#"[{{"role":"user","content":"x","x":{deep}}}]"#)),
        ),
        (
            "messages-wrong-types.json",
            seed(b'1', r#"[{"role":"user","content":"x"},7,{"role":1,"content":{"a":NaN}}]"#),
        ),
        ("prompt-ids.txt", seed(b'2', "[1,2,3,4294967295]")),
        ("prompt-ids-spaced.txt", seed(b'2', "[ 1 ,\n2,\t3\r\n, 0 ]  ")),
        ("prompt-ids-edges.txt", seed(b'2', "[0,01,00,9999999999,10000000000,-7,7E0]")),
        ("body-spaced.json", seed(b'0', " {\n \"prompt\" : [ 5 , 6 ] ,\t\"model\":\"m\" } \r\n")),
        ("prompt-not-ids.txt", seed(b'2', "[1,2,-0,4294967296,1.0,\"3\",[4],1e400]")),
        ("prompt-object-long-int.txt", seed(b'2', &format!(r#"{{"a":{long_int}}}"#))),
    ];
    for (_, s) in &seeds {
        // Both paths already agree on every seed.
        crate::request_scan(s);
    }
    seeds
}
