//! A model's tokenizer and chat template, loaded from Hugging Face style files, and the
//! built-in demo bundle (trained by this project, see `kvroute-sim make-bundle`).

use std::sync::Arc;

use serde_json::Value;
use thiserror::Error;
use tokenizers::Tokenizer;
use xxhash_rust::xxh3::xxh3_64;

use crate::request::Prompt;
use crate::template::{ChatTemplate, TemplateError};

/// The demo bundle's `tokenizer.json`, committed under `assets/demo-model/`.
pub const DEMO_TOKENIZER_JSON: &str = include_str!("../../assets/demo-model/tokenizer.json");
/// The demo bundle's `tokenizer_config.json` (chat template and special tokens).
pub const DEMO_TOKENIZER_CONFIG: &str =
    include_str!("../../assets/demo-model/tokenizer_config.json");

#[derive(Debug, Error)]
pub enum ModelError {
    #[error("tokenizer.json does not load: {0}")]
    Tokenizer(String),
    #[error("tokenizer_config.json is invalid: {0}")]
    Config(String),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("tokenization failed: {0}")]
    Encode(String),
}

/// Tokenizer + chat template, able to turn any parsed prompt into the engine's token ids.
#[derive(Clone)]
pub struct ModelBundle {
    tokenizer: Arc<Tokenizer>,
    template: Arc<ChatTemplate>,
    fingerprint: u64,
}

impl std::fmt::Debug for ModelBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelBundle({:016x})", self.fingerprint)
    }
}

impl ModelBundle {
    /// Loads a bundle from the text of `tokenizer.json` and `tokenizer_config.json`.
    pub fn from_hf(tokenizer_json: &str, tokenizer_config_json: &str) -> Result<Self, ModelError> {
        let tokenizer = Tokenizer::from_bytes(tokenizer_json.as_bytes())
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        let cfg: Value = serde_json::from_str(tokenizer_config_json)
            .map_err(|e| ModelError::Config(e.to_string()))?;
        let chat_template = cfg
            .get("chat_template")
            .and_then(Value::as_str)
            .ok_or_else(|| ModelError::Config("no string 'chat_template'".into()))?;
        let template = ChatTemplate::new(
            chat_template,
            &special(&cfg, "bos_token"),
            &special(&cfg, "eos_token"),
        )?;
        let mut fp = tokenizer_json.as_bytes().to_vec();
        fp.extend_from_slice(chat_template.as_bytes());
        Ok(ModelBundle {
            tokenizer: Arc::new(tokenizer),
            template: Arc::new(template),
            fingerprint: xxh3_64(&fp),
        })
    }

    /// The same tokenizer with another chat template (e.g. a misconfigured engine).
    pub fn with_chat_template(&self, source: &str) -> Result<Self, ModelError> {
        let template =
            ChatTemplate::new(source, self.template.bos_token(), self.template.eos_token())?;
        let mut fp = self.fingerprint.to_le_bytes().to_vec();
        fp.extend_from_slice(source.as_bytes());
        Ok(ModelBundle {
            tokenizer: Arc::clone(&self.tokenizer),
            template: Arc::new(template),
            fingerprint: xxh3_64(&fp),
        })
    }

    /// Loads a Hugging Face style model directory (`tokenizer.json`, `tokenizer_config.json`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn from_dir(dir: &std::path::Path) -> Result<Self, ModelError> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .map_err(|e| ModelError::Config(format!("{}: {e}", dir.join(name).display())))
        };
        Self::from_hf(&read("tokenizer.json")?, &read("tokenizer_config.json")?)
    }

    /// The project's own demo bundle.
    pub fn demo() -> Result<Self, ModelError> {
        Self::from_hf(DEMO_TOKENIZER_JSON, DEMO_TOKENIZER_CONFIG)
    }

    /// xxh3 of the tokenizer and template sources: part of the cache domain.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Renders the chat template as the engine does (with the generation prompt).
    pub fn render_chat(&self, messages: &[Value]) -> Result<String, ModelError> {
        self.render_chat_with(messages, true)
    }

    /// Renders the chat template, choosing whether to append the generation prompt.
    pub fn render_chat_with(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        Ok(self.template.render(messages, add_generation_prompt)?)
    }

    /// Tokenizes `text`; `add_special_tokens` applies the tokenizer's post-processor (BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| ModelError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text (used by the simulated engine to produce output).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.tokenizer.decode(ids, false).map_err(|e| ModelError::Encode(e.to_string()))
    }

    /// The engine's token ids for a prompt: chat prompts are rendered and encoded without
    /// special tokens (the template carries BOS, as in vLLM's chat endpoint); text completions
    /// are encoded with them; token-id prompts are used as given.
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, ModelError> {
        match prompt {
            Prompt::Messages(m) => self.encode(&self.render_chat(m)?, false),
            Prompt::Text(t) => self.encode(t, true),
            Prompt::Tokens(t) => Ok(t.clone()),
        }
    }

    /// The tokenizer itself, for inspecting its configuration (the token cache reads which
    /// added tokens cut a text at points where tokenization is stable).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

/// Where `./dev setup` puts the Qwen3 bundle (`.cache/models/qwen3/` in the repository), or
/// `KVROUTE_QWEN3_DIR` when set. Used by tests, the harness and the benchmarks.
#[cfg(not(target_arch = "wasm32"))]
pub fn qwen3_dir() -> std::path::PathBuf {
    match std::env::var_os("KVROUTE_QWEN3_DIR") {
        Some(d) => d.into(),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cache/models/qwen3"),
    }
}

/// The Qwen3 bundle from [`qwen3_dir`], with an error that says how to get it.
#[cfg(not(target_arch = "wasm32"))]
pub fn qwen3() -> Result<ModelBundle, ModelError> {
    let dir = qwen3_dir();
    ModelBundle::from_dir(&dir).map_err(|e| {
        ModelError::Config(format!(
            "Qwen3 bundle missing at {} (run ./dev setup): {e}",
            dir.display()
        ))
    })
}

/// A special token from tokenizer_config.json: either a string or `{"content": "..."}`.
fn special(cfg: &Value, key: &str) -> String {
    match cfg.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).unwrap_or("").into(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn demo_bundle_renders_llama3_style_and_starts_with_one_bos() {
        let b = ModelBundle::demo().unwrap();
        let msgs = vec![json!({"role":"user","content":"hello there"})];
        let text = b.render_chat(&msgs).unwrap();
        assert!(text.starts_with("<|begin_of_text|><|start_header_id|>user<|end_header_id|>"));
        assert!(text.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"));
        let ids = b.prompt_tokens(&Prompt::Messages(msgs)).unwrap();
        let bos = b.encode("<|begin_of_text|>", false).unwrap();
        assert_eq!(bos.len(), 1, "BOS is one special token");
        assert_eq!(ids[0], bos[0]);
        assert_ne!(ids[1], bos[0], "chat rendering must not add a second BOS");
        // A text completion gets BOS from the post-processor.
        let t = b.prompt_tokens(&Prompt::Text("hello".into())).unwrap();
        assert_eq!(t[0], bos[0]);
        assert_eq!(b.decode(&t[1..]).unwrap(), "hello");
    }

    #[test]
    fn special_tokens_are_never_split() {
        let b = ModelBundle::demo().unwrap();
        for tok in ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>"] {
            assert_eq!(b.encode(tok, false).unwrap().len(), 1, "{tok}");
        }
    }

    #[test]
    fn bad_files_are_errors() {
        assert!(matches!(ModelBundle::from_hf("{}", "{}"), Err(ModelError::Tokenizer(_))));
        assert!(matches!(
            ModelBundle::from_hf(DEMO_TOKENIZER_JSON, "{}"),
            Err(ModelError::Config(_))
        ));
    }

    #[test]
    fn qwen3_bundle_loads_and_renders_chatml() {
        let b = qwen3().unwrap();
        let msgs = vec![json!({"role":"user","content":"hello"})];
        let text = b.render_chat(&msgs).unwrap();
        assert_eq!(text, "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n");
        let ids = b.prompt_tokens(&Prompt::Messages(msgs)).unwrap();
        assert_eq!(ids[0], b.encode("<|im_start|>", false).unwrap()[0]);
    }
}
