use super::python::{strftime, strip};
use super::*;
use serde_json::json;

fn specials() -> Map<String, Json> {
    json!({"bos_token": "<s>", "eos_token": "</s>"}).as_object().cloned().unwrap_or_default()
}

fn render(src: &str, messages: &[Json], kwargs: Json) -> Result<String, TemplateError> {
    let t = ChatTemplate::new(src, &specials())?;
    let kwargs = kwargs.as_object().cloned().unwrap_or_default();
    t.render(&RenderInput {
        messages,
        tools: None,
        documents: None,
        add_generation_prompt: true,
        kwargs: &kwargs,
    })
}

fn expr(src: &str) -> String {
    render(src, &[], json!({})).unwrap()
}

#[test]
fn renders_hf_style_template_with_pycompat_methods() {
    let src = "{{ bos_token }}{% for m in messages %}[{{ m.role|upper }}]{{ m.content.strip() }}\
               {% endfor %}{% if add_generation_prompt %}[A]{% endif %}";
    let msgs = [json!({"role":"user","content":"  hi  "})];
    assert_eq!(render(src, &msgs, json!({})).unwrap(), "<s>[USER]hi[A]");
}

#[test]
fn raise_exception_is_a_render_error() {
    let err = render("{{ raise_exception('no system role') }}", &[], json!({})).unwrap_err();
    assert!(err.to_string().contains("no system role"));
}

#[test]
fn bad_template_is_a_compile_error() {
    assert!(matches!(ChatTemplate::new("{% for %}", &specials()), Err(TemplateError::Compile(_))));
}

#[test]
fn kwargs_override_special_tokens_and_reach_the_template() {
    let out = render(
        "{{ bos_token }}|{{ enable_thinking }}",
        &[],
        json!({"bos_token": "B", "enable_thinking": false}),
    );
    assert_eq!(out.unwrap(), "B|False");
}

#[test]
fn trim_and_lstrip_blocks_as_transformers_sets_them() {
    let src = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
    let msgs = [json!({"role":"user","content":"a"}), json!({"role":"user","content":"b"})];
    assert_eq!(render(src, &msgs, json!({})).unwrap(), "a\nb\n");
}

#[test]
fn values_print_as_python_str() {
    assert_eq!(
        expr("{{ none }}|{{ true }}|{{ false }}|{{ 1.0 }}|{{ 2 }}|{{ undefined_var }}"),
        "None|True|False|1.0|2|"
    );
    assert_eq!(expr("{{ [1, 'a', none, 0.5] }}"), "[1, 'a', None, 0.5]");
    assert_eq!(expr("{{ {'k': \"it's\"} }}"), "{'k': \"it's\"}");
    assert_eq!(expr("{{ 3 | string }}{{ none | string }}"), "3None");
}

#[test]
fn tojson_is_pythons_json_dumps() {
    let t = ChatTemplate::new("{{ tools[0] | tojson }}", &specials()).unwrap();
    let tool = json!({"type": "function", "function": {"name": "f", "description": null,
        "parameters": {"z": 1, "a": [1.0, -0.0, 1e-7, 1e21, 12345678901234567u64, 0.1],
                       "s": "<é> \"q\" \\ \n\t\u{1}\u{7f}😀", "b": true}}});
    let tools = [tool];
    let out = t
        .render(&RenderInput {
            messages: &[],
            tools: Some(&tools),
            documents: None,
            add_generation_prompt: false,
            kwargs: &Map::new(),
        })
        .unwrap();
    assert_eq!(
        out,
        r#"{"type": "function", "function": {"name": "f", "description": null, "parameters": {"z": 1, "a": [1.0, -0.0, 1e-07, 1e+21, 12345678901234567, 0.1], "s": "<é> \"q\" \\ \n\t\u0001<DEL>😀", "b": true}}}"#
            .replace("<DEL>", "\u{7f}")
    );
}

/// Numbers as Python's `json` read them from the request (`request::pyjson`) print as Python
/// prints them, with `tojson` and as `str()`.
#[test]
fn python_numbers_from_the_request_print_as_python_prints_them() {
    let body = br#"{"a": [12345678901234567890123, -98765432109876543210, 9223372036854775808,
        123456789012345678901234567890123456789012345, -0, -0.0, NaN, Infinity, -Infinity,
        1e400, -1e400, 1e-400, 1E5, 2.5E-3, 1e16]}"#;
    let v = crate::decision::pyjson::from_body(body).unwrap().value;
    let t = ChatTemplate::new("{{ messages[0] | tojson }}|{{ messages[0] }}", &specials()).unwrap();
    let out = t
        .render(&RenderInput {
            messages: std::slice::from_ref(&v),
            tools: None,
            documents: None,
            add_generation_prompt: false,
            kwargs: &Map::new(),
        })
        .unwrap();
    let nums = "12345678901234567890123, -98765432109876543210, 9223372036854775808, \
        123456789012345678901234567890123456789012345, 0, -0.0";
    assert_eq!(
        out,
        format!(
            "{{\"a\": [{nums}, NaN, Infinity, -Infinity, Infinity, -Infinity, 0.0, 100000.0, 0.0025, 1e+16]}}|\
             {{'a': [{nums}, nan, inf, -inf, inf, -inf, 0.0, 100000.0, 0.0025, 1e+16]}}"
        )
    );
}

/// The deepest body kvroute keeps renders without exhausting the stack (the wasm filter's is
/// small; `core/wasm-tests` runs the golden checks there).
#[test]
fn the_deepest_kept_body_renders() {
    use crate::decision::pyjson::{from_body, MAX_DEPTH};
    let n = MAX_DEPTH - 1;
    let text = format!("[{}1{}]", "{\"x\": [".repeat(n / 2), "]}".repeat(n / 2));
    let p = from_body(text.as_bytes()).unwrap();
    assert!(!p.truncated);
    let t = ChatTemplate::new("{{ messages | tojson }}{{ messages }}", &specials()).unwrap();
    let msgs = p.value.as_array().cloned().unwrap_or_default();
    let render = move || {
        t.render(&RenderInput {
            messages: &msgs,
            tools: None,
            documents: None,
            add_generation_prompt: false,
            kwargs: &Map::new(),
        })
        .map(|s| s.len())
    };
    // Half the wasm filter's 1 MiB stack, in a debug build (larger frames than the release wasm).
    let len = std::thread::Builder::new().stack_size(512 << 10).spawn(render).unwrap().join();
    assert!(len.unwrap().unwrap() > 4 * n);
}

#[test]
fn tojson_options() {
    assert_eq!(
        expr("{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2) }}"),
        "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2\n  ]\n}"
    );
    assert_eq!(expr("{{ {'b': 1, 'a': {}} | tojson(sort_keys=true) }}"), "{\"a\": {}, \"b\": 1}");
    assert_eq!(
        expr("{{ {'b': 'é😀'} | tojson(ensure_ascii=true) }}"),
        "{\"b\": \"\\u00e9\\ud83d\\ude00\"}"
    );
    assert_eq!(expr("{{ [1, 2] | tojson(separators=[',', ':']) }}"), "[1,2]");
}

#[test]
fn python_float_repr() {
    for (f, want) in [
        (1.0, "1.0"),
        (0.1, "0.1"),
        (-0.0, "-0.0"),
        (1e-4, "0.0001"),
        (1e-5, "1e-05"),
        (1234.5, "1234.5"),
        (1e15, "1000000000000000.0"),
        (1e16, "1e+16"),
        (1.2345678901234568e17, "1.2345678901234568e+17"),
        (2.71, "2.71"),
        (-2.5e-300, "-2.5e-300"),
        (f64::INFINITY, "inf"),
    ] {
        assert_eq!(py_float_repr(f), want, "{f}");
    }
}

#[test]
fn string_methods_follow_python() {
    assert_eq!(strip("\u{1f}\u{3000} x \u{a0}\u{1c}", None, true, true), "x");
    assert_eq!(strip("\n\nx\n", Some("\n"), true, false), "x\n");
    assert_eq!(expr("{{ '\\x1f a \\x1c' | trim }}|{{ 'xxaxx' | trim('x') }}"), "a|a");
    assert_eq!(expr("{{ '  a  b\\tc ' .split() }}"), "['a', 'b', 'c']");
    assert_eq!(expr("{{ '  a  b c ' .split(none, 1) }}"), "['a', 'b c ']");
    assert_eq!(expr("{{ 'a</think>b</think>c'.split('</think>')[-1] }}"), "c");
    assert_eq!(expr("{{ 'a,b,c'.split(',', 1) }}"), "['a', 'b,c']");
    assert_eq!(expr("{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ 'hi'.startswith('h') }}"), "hi\n|True");
    assert!(render("{{ 'a'.split('') }}", &[], json!({})).is_err());
}

#[test]
fn strftime_formats_utc() {
    // 2024-02-29 13:05:09 UTC, a Thursday.
    let t = 1_709_211_909;
    assert_eq!(strftime(t, "%d %b %Y"), "29 Feb 2024");
    assert_eq!(
        strftime(t, "%A %B %-d, %y %H:%M:%S %I%p %j %% %Q"),
        "Thursday February 29, 24 13:05:09 01PM 060 % %Q"
    );
    assert_eq!(strftime(0, "%Y-%m-%d %a"), "1970-01-01 Thu");
    assert!(!expr("{{ strftime_now('%Y') }}").is_empty());
}
