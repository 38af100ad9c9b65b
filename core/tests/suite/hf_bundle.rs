//! Any Hugging Face `tokenizer.json` + `tokenizer_config.json` pair loads and tokenizes the way
//! the engine would. Here: a differently built tokenizer (word-level model, whitespace
//! pre-tokenizer, ChatML template, `bos_token` in object form) next to the demo bundle.

use std::collections::HashMap;

use kvroute_core::decision::request::Prompt;
use kvroute_core::decision::tokenize::model::ModelBundle;
use serde_json::json;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::{AddedToken, Tokenizer};

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn chatml_tokenizer() -> Tokenizer {
    let words =
        ["[UNK]", "hello", "world", "system", "user", "assistant", "be", "brief", ".", "\n"];
    let vocab: HashMap<String, u32> =
        words.iter().enumerate().map(|(i, w)| (w.to_string(), i as u32)).collect();
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tk = Tokenizer::new(model);
    tk.with_pre_tokenizer(Some(Whitespace {}));
    tk.add_special_tokens(&[
        AddedToken::from("<|im_start|>", true),
        AddedToken::from("<|im_end|>", true),
    ]);
    tk
}

#[test]
fn a_differently_built_tokenizer_loads_and_matches_direct_tokenization() {
    let tk = chatml_tokenizer();
    let json_text = tk.to_string(false).unwrap();
    let config = json!({"chat_template": CHATML, "bos_token": {"content": "<s>", "special": true}, "eos_token": "<|im_end|>"});
    let bundle = ModelBundle::from_hf(&json_text, &config.to_string()).unwrap();
    let messages = vec![
        json!({"role": "system", "content": "be brief ."}),
        json!({"role": "user", "content": "hello world"}),
    ];
    let rendered = bundle.render_chat(&messages).unwrap();
    assert_eq!(
        rendered,
        "<|im_start|>system\nbe brief .<|im_end|>\n<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = bundle.prompt_tokens(&Prompt::messages(messages)).unwrap();
    let direct = tk.encode(rendered.as_str(), false).unwrap().get_ids().to_vec();
    assert_eq!(ids, direct);
    let start = tk.token_to_id("<|im_start|>").unwrap();
    assert_eq!(ids[0], start, "special tokens are matched whole");
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 3);
    assert_ne!(bundle.fingerprint(), ModelBundle::demo().unwrap().fingerprint());
}

#[test]
fn demo_bundle_matches_its_own_tokenizer_file() {
    let bundle = ModelBundle::demo().unwrap();
    let tk = Tokenizer::from_bytes(
        kvroute_core::decision::tokenize::model::DEMO_TOKENIZER_JSON.as_bytes(),
    )
    .unwrap();
    let messages = vec![json!({"role": "user", "content": "Route the request to the worker."})];
    let rendered = bundle.render_chat(&messages).unwrap();
    let direct = tk.encode(rendered.as_str(), false).unwrap().get_ids().to_vec();
    assert_eq!(bundle.prompt_tokens(&Prompt::messages(messages)).unwrap(), direct);
}
