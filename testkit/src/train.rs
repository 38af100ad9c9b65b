//! Trains the demo bundle's byte-level BPE tokenizer on text from [`crate::textgen`], and writes
//! its Llama-3-style `tokenizer_config.json`. Native only; the result is committed under
//! `assets/demo-model/` and embedded in the filter.

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

use crate::textgen;

/// Special tokens, in vocabulary order (ids 0..).
pub const SPECIAL_TOKENS: [&str; 5] = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
];

/// A Llama-3-style instruct template.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n\
{{ message['content'] | trim }}<|eot_id|>{% endfor %}\
{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

pub const VOCAB_SIZE: usize = 2048;
const CORPUS_DOCS: u64 = 400;

/// Trains the demo tokenizer; returns (`tokenizer.json`, `tokenizer_config.json`).
pub fn train_demo_bundle() -> Result<(String, String), tokenizers::Error> {
    let specials: Vec<AddedToken> =
        SPECIAL_TOKENS.iter().map(|t| AddedToken::from(*t, true)).collect();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(VOCAB_SIZE)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(specials.clone())
        .build();
    let mut tk = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None::<tokenizers::NormalizerWrapper>)
        .with_pre_tokenizer(Some(tokenizers::PreTokenizerWrapper::ByteLevel(
            ByteLevel::default().add_prefix_space(false),
        )))
        .with_post_processor(None::<tokenizers::PostProcessorWrapper>)
        .with_decoder(Some(tokenizers::DecoderWrapper::ByteLevel(ByteLevel::default())))
        .build()?;
    let corpus = (0..CORPUS_DOCS).map(|d| textgen::words(0xC0DE_0000 + d, 200));
    tk.train(&mut trainer, corpus)?;
    let mut tk: Tokenizer = tk.into();
    tk.add_special_tokens(&specials);
    let bos = SPECIAL_TOKENS[0];
    let bos_id = tk.token_to_id(bos).ok_or("BOS missing after training")?;
    let post = TemplateProcessing::builder()
        .try_single(format!("{bos} $A"))?
        .try_pair(format!("{bos} $A {bos} $B"))?
        .special_tokens(vec![(bos.to_string(), bos_id)])
        .build()?;
    tk.with_post_processor(Some(post));
    let json = tk.to_string(true)?;
    // Keys in the committed file's order (serde_json keeps insertion order here).
    let config = serde_json::json!({
        "bos_token": bos,
        "chat_template": CHAT_TEMPLATE,
        "eos_token": "<|eot_id|>",
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    Ok((json + "\n", serde_json::to_string_pretty(&config)? + "\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed bundle is exactly what the project's trainer produces.
    #[test]
    fn committed_bundle_is_reproducible() {
        let (tok, cfg) = train_demo_bundle().unwrap();
        if std::env::var_os("KVROUTE_WRITE_BUNDLE").is_some() {
            let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../assets/demo-model");
            std::fs::write(format!("{dir}/tokenizer.json"), &tok).unwrap();
            std::fs::write(format!("{dir}/tokenizer_config.json"), &cfg).unwrap();
        }
        // What kvroute-core embeds (`decision::tokenize::model::DEMO_TOKENIZER_JSON`).
        assert!(
            tok == include_str!("../../assets/demo-model/tokenizer.json"),
            "retrain: KVROUTE_WRITE_BUNDLE=1 cargo test -p kvroute-testkit train"
        );
        assert_eq!(cfg, include_str!("../../assets/demo-model/tokenizer_config.json"));
    }
}
