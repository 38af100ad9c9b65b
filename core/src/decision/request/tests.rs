use super::*;
use serde_json::json;

fn chat(v: Value) -> Result<ParsedRequest, RequestError> {
    parse(Endpoint::Chat, v.to_string().as_bytes())
}

fn chat_prompt(v: Value) -> ChatPrompt {
    match chat(v).unwrap().prompt {
        Prompt::Chat(c) => c,
        other => panic!("not a chat prompt: {other:?}"),
    }
}

fn prompt_of(ep: Endpoint, v: Value) -> ChatPrompt {
    match parse(ep, v.to_string().as_bytes()).unwrap().prompt {
        Prompt::Chat(c) => c,
        other => panic!("not a chat prompt: {other:?}"),
    }
}

#[test]
fn endpoints_from_paths() {
    assert_eq!(Endpoint::from_path(b"/v1/chat/completions"), Some(Endpoint::Chat));
    assert_eq!(Endpoint::from_path(b"/v1/completions?x=1"), Some(Endpoint::Completions));
    assert_eq!(Endpoint::from_path(b"/v1/completions//"), Some(Endpoint::Completions));
    assert_eq!(Endpoint::from_path(b"/v1/messages"), Some(Endpoint::Messages));
    assert_eq!(Endpoint::from_path(b"/v1/responses/?stream=1"), Some(Endpoint::Responses));
    assert_eq!(Endpoint::from_path(b"/v1/messages/count_tokens"), None);
    assert_eq!(Endpoint::from_path(b"/v1/models"), None);
    assert_eq!(Endpoint::from_path(b"/v1/chat/completions?\xff\xfe"), Some(Endpoint::Chat));
    assert_eq!(Endpoint::from_path(b"/v1/chat/\xffcompletions"), None);
    assert_eq!(Endpoint::from_path(b""), None);
    assert_eq!(Endpoint::from_path(b"/"), None);
    assert!(Endpoint::Messages.is_chat() && !Endpoint::Completions.is_chat());
}

#[test]
fn percent_encoded_paths_are_the_endpoints_vllm_serves() {
    // Every row: what vLLM 0.33's server (uvicorn + Starlette) routes the target to.
    let rows: &[(&[u8], Option<Endpoint>)] = &[
        (b"/v1/chat/%63ompletions", Some(Endpoint::Chat)),
        (b"/v1/chat/%63ompletions/", Some(Endpoint::Chat)),
        (b"/%76%31/%63%68%61%74/%63%6f%6d%70%6c%65%74%69%6f%6e%73", Some(Endpoint::Chat)),
        (b"/v1%2Fchat%2Fcompletions", Some(Endpoint::Chat)),
        (b"/v1/%63ompletions?stream=%74rue", Some(Endpoint::Completions)),
        (b"/v1/%6Dessages", Some(Endpoint::Messages)),
        (b"/v1/respon%73es", Some(Endpoint::Responses)),
        (b"/v1/chat/completions#x", Some(Endpoint::Chat)),
        (b"/v1/chat/%2563ompletions", None),
        (b"/v1/chat/completions%3F", None),
        (b"/v1/chat/completions%00", None),
        (b"/V1/chat/completions", None),
        (b"//v1/chat/completions", None),
        (b"/v1//chat/completions", None),
        (b"/v1/./chat/completions", None),
        (b"/v1/x/../chat/completions", None),
        (b"/v1/chat/completions%ff", None),
    ];
    for (path, want) in rows {
        assert_eq!(Endpoint::from_path(path), *want, "{}", String::from_utf8_lossy(path));
    }
}

#[test]
fn parses_chat_with_all_fields() {
    let r = chat(json!({"model":"m","messages":[{"role":"user","content":"hi"}],
        "stream":true,"stream_options":{"include_usage":true},"cache_salt":"t1","user":"u",
        "max_tokens":7}))
    .unwrap();
    assert_eq!(r.model, "m");
    assert!(r.stream && r.include_usage);
    assert_eq!(r.cache_salt.as_deref(), Some("t1"));
    assert_eq!(r.user.as_deref(), Some("u"));
    assert_eq!(r.max_tokens, Some(7));
    let Prompt::Chat(c) = r.prompt else { panic!("not chat") };
    assert!(c.add_generation_prompt && !c.continue_final_message && c.tools.is_none());
}

#[test]
fn content_parts_are_joined_with_newlines_and_empty_texts_dropped() {
    let c = chat_prompt(json!({"model":"m","messages":[{"role":"user","content":[
        {"type":"text","text":"a"},{"type":"text","text":""},"b",{"type":"input_text","text":"c"},
        {"type":"text","text":null}]},
        {"role":"assistant","content":[{"type":"refusal","refusal":"no"}]},
        {"role":"assistant","content":null}]}));
    assert_eq!(c.messages[0], json!({"role":"user","content":"a\nb\nc"}));
    assert_eq!(c.messages[1]["content"], "no");
    assert_eq!(c.messages[2]["content"], "");
}

#[test]
fn messages_keep_only_what_the_engine_keeps() {
    let c = chat_prompt(json!({"model":"m","messages":[
        {"role":"user","content":"q","name":"ann","extra":1,"reasoning_content":"ignored for users"},
        {"role":"assistant","content":"a","reasoning_content":"old field"},
        {"role":"assistant","content":"b","reasoning":"new","reasoning_content":"old"},
        {"role":"assistant","content":"c","tool_calls":[]},
        {"role":"tool","content":"r","tool_call_id":"t1","name":7}]}));
    assert_eq!(c.messages[0], json!({"role":"user","content":"q","name":"ann"}));
    assert_eq!(
        c.messages[1],
        json!({"role":"assistant","content":"a","reasoning":"old field","reasoning_content":"old field"})
    );
    assert_eq!(c.messages[2]["reasoning_content"], "new");
    assert_eq!(c.messages[3], json!({"role":"assistant","content":"c"}));
    assert_eq!(c.messages[4], json!({"role":"tool","content":"r","tool_call_id":"t1"}));
}

#[test]
fn tool_call_arguments_are_parsed_like_vllm_does() {
    let call =
        |args: Value| json!({"id":"c","type":"function","function":{"name":"f","arguments":args}});
    let c = chat_prompt(json!({"model":"m","messages":[{"role":"assistant","content":null,
        "tool_calls":[call(json!("{\"b\": 1.50, \"a\": [true]}")), call(json!("{bad")), call(json!("")),
                      call(json!(null)), call(json!({"k":"v"}))]}]}));
    let args: Vec<&Value> = c.messages[0]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["function"]["arguments"])
        .collect();
    assert_eq!(
        args,
        [&json!({"b":1.5,"a":[true]}), &json!({}), &json!({}), &json!({}), &json!({"k":"v"})]
    );
    let keys: Vec<&String> = args[0].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["b", "a"], "key order is kept");
}

#[test]
fn tools_take_the_engines_canonical_form() {
    let c = chat_prompt(json!({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[
        {"function":{"parameters":{"type":"object"},"name":"f","extra":1}},
        {"type":"function","defer_loading":true,"function":{"name":"g","description":"d","strict":false}}]}));
    assert_eq!(
        c.tools.unwrap(),
        vec![
            json!({"type":"function","function":{"name":"f","description":null,"parameters":{"type":"object"}}}),
            json!({"type":"function","function":{"name":"g","description":"d","parameters":null,
                   "strict":false,"defer_loading":true},"defer_loading":true}),
        ]
    );
    let bad =
        json!({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"custom"}]});
    assert_eq!(chat(bad), Err(RequestError::InvalidField("tools")));
}

#[test]
fn template_kwargs_merge_as_in_vllm() {
    let c = chat_prompt(json!({"model":"m","messages":[{"role":"user","content":"x"}],
        "chat_template_kwargs":{"enable_thinking":false,"add_generation_prompt":false,"flag":[1]},
        "reasoning_effort":"high","documents":[{"title":"t","text":"d"}]}));
    assert!(c.add_generation_prompt, "the request-level flag wins over the kwargs");
    assert_eq!(
        Value::Object(c.kwargs),
        json!({"enable_thinking":false,"flag":[1],"reasoning_effort":"high"})
    );
    assert_eq!(c.documents, Some(json!([{"title":"t","text":"d"}])));
    let c = chat_prompt(json!({"model":"m","messages":[{"role":"user","content":"x"}],
        "reasoning_effort":"none","add_generation_prompt":false,"continue_final_message":true}));
    assert_eq!(Value::Object(c.kwargs), json!({"enable_thinking":false,"reasoning_effort":"none"}));
    assert!(!c.add_generation_prompt && c.continue_final_message);
}

#[test]
fn errors_name_the_problem() {
    assert!(matches!(parse(Endpoint::Chat, b"{not json"), Err(RequestError::InvalidJson(_))));
    assert_eq!(chat(json!([1])), Err(RequestError::NotAnObject));
    assert_eq!(chat(json!({"messages":[]})), Err(RequestError::MissingModel));
    assert_eq!(chat(json!({"model":"m"})), Err(RequestError::InvalidMessages));
    assert_eq!(chat(json!({"model":3,"messages":[]})), Err(RequestError::InvalidField("model")));
    assert_eq!(
        chat(json!({"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"})),
        Err(RequestError::InvalidField("stream"))
    );
    let unknown = json!({"model":"m","messages":[{"role":"user","content":[{"type":"x"}]}]});
    assert_eq!(chat(unknown), Err(RequestError::InvalidMessages));
    let kwargs =
        json!({"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":1});
    assert_eq!(chat(kwargs), Err(RequestError::InvalidField("chat_template_kwargs")));
}

#[test]
fn completion_prompts() {
    let p = |v: Value| parse(Endpoint::Completions, v.to_string().as_bytes()).map(|r| r.prompt);
    assert_eq!(p(json!({"model":"m","prompt":"hi"})), Ok(Prompt::Text("hi".into())));
    assert_eq!(p(json!({"model":"m","prompt":["hi"]})), Ok(Prompt::Text("hi".into())));
    assert_eq!(p(json!({"model":"m","prompt":[1,2,3]})), Ok(Prompt::Tokens(vec![1, 2, 3])));
    assert_eq!(p(json!({"model":"m","prompt":[1,-2]})), Err(RequestError::InvalidPrompt));
    assert_eq!(p(json!({"model":"m"})), Err(RequestError::InvalidPrompt));
    assert_eq!(p(json!({"model":"m","prompt":["a",[1]]})), Err(RequestError::InvalidPrompt));
}

#[test]
fn media_parts_are_valid_and_marked_batches_load_only() {
    let c = chat_prompt(json!({"model":"m","messages":[
        {"role":"user","content":"first"},
        {"role":"user","content":[
            {"type":"text","text":"what is this"},
            {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},
            {"image_url":"https://example.com/x.png"}]},
        {"role":"user","content":[{"type":"input_audio","input_audio":{"data":"","format":"wav"}}]}]}));
    assert_eq!(c.media, Some(MediaCut { message: 1, items: 3 }));
    assert_eq!(c.messages[1]["content"], "what is this");
    let c = |v: Value| parse(Endpoint::Completions, v.to_string().as_bytes()).unwrap();
    let texts = c(json!({"model":"m","prompt":["a","b"]}));
    assert_eq!(
        (texts.prompt, texts.load_only),
        (Prompt::Text("a\nb".into()), Some(LoadOnly::Batch))
    );
    let ids = c(json!({"model":"m","prompt":[[1,2],[3]]}));
    assert_eq!((ids.prompt, ids.load_only), (Prompt::Tokens(vec![1, 2, 3]), Some(LoadOnly::Batch)));
    assert_eq!(c(json!({"model":"m","prompt":"a"})).load_only, None);
}

/// One conversation (system, user, a tool call and its result, a follow-up), as each endpoint
/// spells it.
fn same_conversation() -> [(Endpoint, Value); 3] {
    let schema =
        json!({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]});
    let chat = json!({"model":"m","tools":[{"type":"function","function":{"name":"weather",
            "description":"Weather now.","parameters":schema}}],
        "messages":[
            {"role":"system","content":"Be brief."},
            {"role":"user","content":"Weather in Oslo?"},
            {"role":"assistant","content":"Checking.","tool_calls":[{"id":"c1","type":"function",
                "function":{"name":"weather","arguments":"{\"city\": \"Oslo\"}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"-3 °C"},
            {"role":"user","content":"Thanks. Tomorrow?"}]});
    let messages = json!({"model":"m","max_tokens":100,"system":"Be brief.",
        "tools":[{"name":"weather","description":"Weather now.","input_schema":schema}],
        "messages":[
            {"role":"user","content":"Weather in Oslo?"},
            {"role":"assistant","content":[{"type":"text","text":"Checking."},
                {"type":"tool_use","id":"c1","name":"weather","input":{"city":"Oslo"}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":"-3 °C"},
                {"type":"text","text":"Thanks. Tomorrow?"}]}]});
    let responses = json!({"model":"m","instructions":"Be brief.",
        "tools":[{"type":"function","name":"weather","description":"Weather now.","parameters":schema},
                 {"type":"web_search"}],
        "input":[
            {"role":"user","content":"Weather in Oslo?"},
            {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking."}]},
            {"type":"function_call","call_id":"c1","name":"weather","arguments":"{\"city\": \"Oslo\"}"},
            {"type":"function_call_output","call_id":"c1","output":"-3 °C"},
            {"type":"message","role":"user","content":[{"type":"input_text","text":"Thanks. Tomorrow?"}]}]});
    [(Endpoint::Chat, chat), (Endpoint::Messages, messages), (Endpoint::Responses, responses)]
}

/// The parts of a chat prompt that reach the template (tool-call ids never do).
fn rendered_view(c: &ChatPrompt) -> (Vec<Value>, Option<Vec<Value>>, bool, Map<String, Value>) {
    let mut messages = c.messages.clone();
    for m in &mut messages {
        for call in m.get_mut("tool_calls").and_then(Value::as_array_mut).into_iter().flatten() {
            call.as_object_mut().map(|o| o.remove("id"));
        }
    }
    (messages, c.tools.clone(), c.add_generation_prompt, c.kwargs.clone())
}

#[test]
fn one_conversation_gives_one_chat_prompt_on_every_endpoint() {
    let [chat, messages, responses] = same_conversation().map(|(ep, v)| prompt_of(ep, v));
    assert_eq!(rendered_view(&chat), rendered_view(&messages));
    assert_eq!(rendered_view(&chat), rendered_view(&responses));
}

#[test]
fn anthropic_conversion_details() {
    let c = prompt_of(
        Endpoint::Messages,
        json!({"model":"m","max_tokens":5,
        "system":[{"type":"text","text":"A"},{"type":"text","text":"x-anthropic-billing-header: h"},{"type":"text","text":"B"}],
        "output_config":{"effort":"low"},
        "tools":[{"name":"p","input_schema":{"properties":{}}}],
        "messages":[
            {"role":"system","content":"C"},
            {"role":"ctx","content":"u1"},
            {"role":"assistant","content":[{"type":"thinking","thinking":"t1","signature":"s"},
                {"type":"thinking","thinking":"t2"},{"type":"redacted_thinking","data":"x"}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"z",
                "content":[{"type":"text","text":"r1"},{"type":"text","text":"r2"},
                           {"type":"image","source":{"type":"url","url":"u"}}]}]},
            {"role":"user","content":[]}]}),
    );
    assert_eq!(c.messages[0], json!({"role":"system","content":"ABC"}));
    assert_eq!(c.messages[1], json!({"role":"user","content":"u1"}));
    assert_eq!(c.messages[2]["reasoning"], "t1t2");
    assert_eq!(c.messages[3], json!({"role":"tool","content":"r1\nr2","tool_call_id":"z"}));
    assert_eq!(c.messages[4]["role"], "user");
    assert_eq!(c.messages.len(), 5, "the empty user message is dropped");
    assert_eq!(c.media, Some(MediaCut { message: 4, items: 1 }));
    assert_eq!(
        c.tools.unwrap()[0]["function"]["parameters"],
        json!({"properties":{},"type":"object"})
    );
    assert_eq!(c.kwargs.get("enable_thinking"), Some(&json!(true)));
    let r = parse(Endpoint::Messages, br#"{"model":"m","max_tokens":3,"stream":true,"cache_salt":"s","messages":[{"role":"user","content":"x"}]}"#).unwrap();
    assert!(r.include_usage);
    assert_eq!(r.cache_salt.as_deref(), Some("s"), "vLLM 0.33 salts a Messages request too");
    assert_eq!(r.max_tokens, Some(3));
    let bad = json!({"model":"m","messages":[{"role":"user","content":[{"type":"document"}]}]});
    assert_eq!(
        parse(Endpoint::Messages, bad.to_string().as_bytes()),
        Err(RequestError::InvalidMessages)
    );
}

#[test]
fn responses_conversion_details() {
    let c = prompt_of(
        Endpoint::Responses,
        json!({"model":"m","reasoning":{"effort":"low"},
        "input":[
            {"type":"reasoning","id":"r","summary":[{"type":"summary_text","text":"sum"}]},
            {"type":"function_call","call_id":"a","name":"f","arguments":"{}"},
            {"type":"function_call","call_id":"b","name":"g","arguments":"{\"x\":1}"},
            {"type":"function_call_output","call_id":"a","output":"A"},
            {"type":"message","role":"assistant","status":"incomplete",
             "content":[{"type":"output_text","text":"par"},{"type":"output_text","text":"ignored"}]}]}),
    );
    assert_eq!(c.messages[0]["reasoning"], "sum");
    assert_eq!(c.messages[0]["tool_calls"].as_array().map(Vec::len), Some(2));
    assert_eq!(c.messages[1], json!({"role":"tool","content":"A","tool_call_id":"a"}));
    assert_eq!(c.messages[2], json!({"role":"assistant","content":"par"}));
    assert!(
        c.continue_final_message && !c.add_generation_prompt,
        "an unfinished message is continued"
    );
    assert_eq!(Value::Object(c.kwargs), json!({"reasoning_effort":"low"}));
    let r = parse(
        Endpoint::Responses,
        br#"{"model":"m","input":"hi","max_output_tokens":9,"cache_salt":"s"}"#,
    )
    .unwrap();
    assert_eq!(
        (r.max_tokens, r.cache_salt.as_deref(), r.include_usage),
        (Some(9), Some("s"), true)
    );
    for bad in [
        json!({"model":"m","input":[]}),
        json!({"model":"m","input":7}),
        json!({"model":"m","input":[{"type":"item_reference","id":"x"}]}),
    ] {
        assert_eq!(
            parse(Endpoint::Responses, bad.to_string().as_bytes()).map(|_| ()),
            Err(RequestError::InvalidInput)
        );
    }
}

#[test]
fn prompt_logprobs_make_the_engine_skip_its_cache() {
    let skips = |ep: Endpoint, extra: Value| {
        let mut body = match ep {
            Endpoint::Completions => json!({"model": "m", "prompt": "hi"}),
            _ => json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        };
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            body[k] = v;
        }
        parse(ep, body.to_string().as_bytes()).unwrap().skips_cache_read
    };
    use Endpoint::{Chat, Completions};
    assert!(!skips(Chat, json!({})));
    assert!(!skips(Chat, json!({"prompt_logprobs": null, "logprobs": true, "top_logprobs": 5})));
    assert!(skips(Chat, json!({"prompt_logprobs": 0})));
    // Chat's top_logprobs defaults to 0, so echo alone asks for prompt logprobs.
    assert!(skips(Chat, json!({"echo": true})));
    assert!(!skips(Chat, json!({"echo": true, "top_logprobs": null})));
    assert!(!skips(Chat, json!({"echo": false, "top_logprobs": 3})));
    assert!(!skips(Completions, json!({"echo": true})));
    assert!(skips(Completions, json!({"echo": true, "logprobs": 0})));
    assert!(skips(Completions, json!({"prompt_logprobs": 1})));
    assert!(!skips(Completions, json!({"logprobs": 2})));
    assert!(!skips(Endpoint::Messages, json!({"max_tokens": 5, "prompt_logprobs": 1})));
}

/// The general path for a completions body: the whole body as one JSON value.
fn general_completions(body: &[u8]) -> Result<ParsedRequest, RequestError> {
    let parsed = crate::decision::pyjson::from_body(body)
        .map_err(|e| RequestError::InvalidJson(e.to_string()))?;
    assert!(!parsed.truncated);
    parse_value(Endpoint::Completions, &parsed.value)
}

mod early_prompt {
    use super::*;
    use proptest::prelude::*;

    fn prompt_value() -> impl Strategy<Value = Value> {
        let id = prop_oneof![
            8 => (0u64..200_000).prop_map(Value::from),
            1 => Just(json!(4_294_967_296u64)),
            1 => Just(json!(-1)),
            1 => Just(json!(1.5)),
            1 => Just(json!("7")),
        ];
        prop_oneof![
            4 => prop::collection::vec((0u64..200_000).prop_map(Value::from), 0..40)
                .prop_map(Value::Array),
            2 => prop::collection::vec(id, 0..8).prop_map(Value::Array),
            1 => "[a-z ]{0,12}".prop_map(Value::from),
            1 => prop::collection::vec("[a-z]{0,5}".prop_map(Value::from), 0..3)
                .prop_map(Value::Array),
            1 => prop::collection::vec(
                prop::collection::vec((0u64..9).prop_map(Value::from), 0..3).prop_map(Value::Array),
                0..3
            )
            .prop_map(Value::Array),
            1 => Just(Value::Null),
            1 => Just(json!({"ids": [1, 2]})),
        ]
    }

    proptest! {
        #[test]
        fn early_prompts_parse_as_the_general_path_does(
            prompt in proptest::option::of(prompt_value()),
            model in prop_oneof![Just(json!("m")), Just(json!("")), Just(json!(3))],
            with_model in any::<bool>(),
            stream in prop_oneof![Just(json!(true)), Just(json!("yes")), Just(Value::Null)],
            duplicate in any::<bool>(),
        ) {
            let mut body = Map::new();
            if with_model {
                body.insert("model".into(), model);
            }
            body.insert("stream".into(), stream);
            if let Some(p) = &prompt {
                body.insert("prompt".into(), p.clone());
            }
            let mut text = Value::Object(body).to_string();
            if duplicate {
                // A second `prompt` key after the first: the last one wins on both paths.
                text.insert_str(text.len() - 1, r#","prompt":[5,6,7]"#);
                text = text.replacen("{,", "{", 1);
            }
            let fast = parse(Endpoint::Completions, text.as_bytes());
            let general = general_completions(text.as_bytes());
            prop_assert_eq!(fast, general, "{}", text);
        }
    }

    #[test]
    fn bodies_that_are_not_objects_get_the_general_errors() {
        for body in [&b"[1,2]"[..], b"{\"prompt\": [1,", b"", b"\xff", b"null"] {
            assert_eq!(parse(Endpoint::Completions, body), general_completions(body));
        }
        // Numbers Python reads as ints where serde_json reads floats, and what only Python
        // reads: both paths agree with Python.
        for (body, want) in [
            (r#"{"model":"m","prompt":[-0, 5]}"#, Ok(Prompt::Tokens(vec![0, 5]))),
            (r#"{"model":"m","prompt":[1],"max_tokens":-0}"#, Ok(Prompt::Tokens(vec![1]))),
            (
                r#"{"model":"m","prompt":"x","seed":123456789012345678901}"#,
                Ok(Prompt::Text("x".into())),
            ),
            (r#"{"model":"m","prompt":"x","temperature":NaN}"#, Ok(Prompt::Text("x".into()))),
            (r#"{"model":"m","prompt":"x","top_p":1e400}"#, Ok(Prompt::Text("x".into()))),
            ("\u{feff}{\"model\":\"m\",\"prompt\":[3]}", Ok(Prompt::Tokens(vec![3]))),
            (r#"{"model":"m","prompt":[123456789012345678901]}"#, Err(RequestError::InvalidPrompt)),
            // pydantic's lax `int` reads an integral float as the integer.
            (r#"{"model":"m","prompt":[-0.0]}"#, Ok(Prompt::Tokens(vec![0]))),
        ] {
            let fast = parse(Endpoint::Completions, body.as_bytes());
            assert_eq!(fast, general_completions(body.as_bytes()), "{body}");
            assert_eq!(fast.map(|r| r.prompt), want, "{body}");
        }
        let ids: Vec<u32> = (0..20_000).collect();
        let body = json!({"model": "m", "prompt": ids}).to_string();
        let got = parse(Endpoint::Completions, body.as_bytes()).unwrap();
        assert_eq!(got.prompt, Prompt::Tokens(ids));
    }
}

/// Integer fields as vLLM's pydantic models read them (each row run through pydantic 2.14 on
/// vLLM 0.33's field types): `max_tokens` on every endpoint, and completion token ids, where
/// the prompt's union picks an exact match first (`["1"]` is text) and a lax one after.
#[test]
fn integer_fields_accept_what_pydantic_accepts() {
    let max = |endpoint: Endpoint, field: &str, v: &str| {
        let body = match endpoint {
            Endpoint::Completions => format!(r#"{{"model":"m","prompt":"x","{field}":{v}}}"#),
            Endpoint::Responses => format!(r#"{{"model":"m","input":"x","{field}":{v}}}"#),
            _ => format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],"{field}":{v}}}"#
            ),
        };
        parse(endpoint, body.as_bytes()).map(|r| r.max_tokens)
    };
    let bad = Err(RequestError::InvalidField("max_tokens"));
    let rows: &[(&str, Result<Option<u64>, RequestError>)] = &[
        ("2", Ok(Some(2))),
        ("2.0", Ok(Some(2))),
        ("1e3", Ok(Some(1000))),
        ("true", Ok(Some(1))),
        ("false", Ok(Some(0))),
        (r#""16""#, Ok(Some(16))),
        (r#"" 1_000 ""#, Ok(Some(1000))),
        (r#""2.00""#, Ok(Some(2))),
        ("-0.0", Ok(Some(0))),
        ("null", Ok(None)),
        ("18446744073709551615", Ok(Some(u64::MAX))),
        // Beyond 64 bits: still an int to Python, past any context length.
        ("123456789012345678901234567890", Ok(Some(u64::MAX))),
        ("2.5", bad.clone()),
        ("1e-3", bad.clone()),
        ("1e20", bad.clone()),
        ("NaN", bad.clone()),
        ("Infinity", bad.clone()),
        (r#""1e3""#, bad.clone()),
        (r#""2.5""#, bad.clone()),
        (r#""""#, bad.clone()),
        ("[]", bad.clone()),
        ("{}", bad.clone()),
        ("-1", bad.clone()),
        ("-2.0", bad.clone()),
    ];
    let fields: &[(Endpoint, &str)] = &[
        (Endpoint::Chat, "max_tokens"),
        (Endpoint::Chat, "max_completion_tokens"),
        (Endpoint::Completions, "max_tokens"),
        (Endpoint::Messages, "max_tokens"),
        (Endpoint::Responses, "max_output_tokens"),
    ];
    for &(endpoint, field) in fields {
        for (v, want) in rows {
            assert_eq!(&max(endpoint, field, v), want, "{endpoint:?} {field}: {v}");
        }
    }

    let prompt = |v: &str| {
        let body = format!(r#"{{"model":"m","prompt":{v}}}"#);
        let fast = parse(Endpoint::Completions, body.as_bytes());
        let general = pyjson::from_body(body.as_bytes())
            .map_err(|e| RequestError::InvalidJson(e.to_string()))
            .and_then(|p| parse_value(Endpoint::Completions, &p.value));
        assert_eq!(fast, general, "{v}");
        fast.map(|r| (r.prompt, r.load_only))
    };
    let tokens = |ids: &[u32]| Ok((Prompt::Tokens(ids.to_vec()), None));
    let batch = |ids: &[u32]| Ok((Prompt::Tokens(ids.to_vec()), Some(LoadOnly::Batch)));
    type Want = Result<(Prompt, Option<LoadOnly>), RequestError>;
    let rows: &[(&str, Want)] = &[
        ("[1.0, 2.0]", tokens(&[1, 2])),
        ("[1, -0.0]", tokens(&[1, 0])),
        (r#"[1, "2"]"#, tokens(&[1, 2])),
        (r#"["1", 2]"#, tokens(&[1, 2])),
        ("[true, 1]", tokens(&[1, 1])),
        (r#"["1"]"#, Ok((Prompt::Text("1".into()), None))),
        (r#"["a", "1"]"#, Ok((Prompt::Text("a\n1".into()), Some(LoadOnly::Batch)))),
        ("[[1.0]]", batch(&[1])),
        (r#"[["1"]]"#, batch(&[1])),
        (r#"[[1], ["2"]]"#, batch(&[1, 2])),
        ("[[true]]", batch(&[1])),
        ("[[]]", batch(&[])),
        ("[1.5]", Err(RequestError::InvalidPrompt)),
        (r#"[1.0, "a"]"#, Err(RequestError::InvalidPrompt)),
        ("[-1]", Err(RequestError::InvalidPrompt)),
        ("[[-1]]", Err(RequestError::InvalidPrompt)),
        (r#"[[1, "a"]]"#, Err(RequestError::InvalidPrompt)),
    ];
    for (v, want) in rows {
        assert_eq!(&prompt(v), want, "{v}");
    }
}
