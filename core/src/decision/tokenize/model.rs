//! A model's tokenizer and chat template, loaded from Hugging Face style files, and the
//! built-in demo bundle (trained by this project, see `kvroute-sim make-bundle`).

use std::sync::Arc;

use serde_json::{Map, Value};
use thiserror::Error;
use tokenizers::Tokenizer;
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::decision::request::{ChatPrompt, Prompt};
use crate::decision::template::{py_strip, ChatTemplate, RenderInput, TemplateError};
use crate::decision::tokenize::fastbpe::{FastBpe, Unsupported};
use crate::decision::tokenize::tokcache::Cuts;
use crate::wire::Reader;

/// The demo bundle's `tokenizer.json`, committed under `assets/demo-model/`.
pub const DEMO_TOKENIZER_JSON: &str = include_str!("../../../../assets/demo-model/tokenizer.json");
/// The demo bundle's `tokenizer_config.json` (chat template and special tokens).
pub const DEMO_TOKENIZER_CONFIG: &str =
    include_str!("../../../../assets/demo-model/tokenizer_config.json");

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
    /// The `tokenizers` crate's model; `None` in a bundle read from a compiled encoder
    /// ([`ModelBundle::from_compiled`]), which always has `fast`.
    tokenizer: Option<Arc<Tokenizer>>,
    /// The exact fast encoder when the tokenizer's shape allows one (`Err`: why not).
    fast: Arc<Result<FastBpe, Unsupported>>,
    /// Where a text may be cut without changing its ids (the token cache's segments).
    cuts: Arc<Cuts>,
    template: Arc<ChatTemplate>,
    fingerprint: u64,
}

impl std::fmt::Debug for ModelBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelBundle({:016x})", self.fingerprint)
    }
}

/// Feeds everything written to it into an xxh3 hash.
struct HashWriter(Xxh3);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ModelBundle {
    /// Loads a bundle from the text of `tokenizer.json` and `tokenizer_config.json`.
    pub fn from_hf(tokenizer_json: &str, tokenizer_config_json: &str) -> Result<Self, ModelError> {
        let tokenizer = Tokenizer::from_bytes(tokenizer_json.as_bytes())
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        let (cfg, template) = config_and_template(tokenizer_config_json)?;
        // The tokenizer and the whole configuration (BOS, special tokens, template, ...) are
        // part of the cache domain, each in a canonical form, so that the same bundle gets the
        // same fingerprint whether it was read from its files (updater, simulator) or given
        // inline as JSON values (the filter's config): the tokenizer as its own serialization
        // (vocabulary and added tokens ordered by id), streamed into the hash without a copy;
        // the configuration as compact JSON in its key order.
        let mut fp = HashWriter(Xxh3::new());
        serde_json::to_writer(&mut fp, &tokenizer)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        fp.0.update(&[0xff]);
        fp.0.update(cfg.to_string().as_bytes());
        let fast = FastBpe::new(&tokenizer, tokenizer_json);
        let cuts = Cuts::of(&tokenizer);
        Ok(ModelBundle {
            tokenizer: Some(Arc::new(tokenizer)),
            fast: Arc::new(fast),
            cuts: Arc::new(cuts),
            template: Arc::new(template),
            fingerprint: fp.0.digest(),
        })
    }

    /// The encoder's part of a compiled bundle: the fast encoder's tables and the cut tokens,
    /// as [`ModelBundle::from_compiled`] reads them; `None` when this tokenizer has no fast
    /// encoder (it must then travel as `tokenizer.json`).
    pub fn compiled_encoder(&self) -> Option<Vec<u8>> {
        let fast = self.fast.as_ref().as_ref().ok()?;
        let mut out = Vec::new();
        fast.write_compiled(&mut out);
        self.cuts.write_compiled(&mut out);
        Some(out)
    }

    /// A bundle from [`ModelBundle::compiled_encoder`]'s bytes and `tokenizer_config.json`,
    /// with the `fingerprint` the bundle was built with from its files (it cannot be
    /// recomputed without the `tokenizer.json` it came from). It encodes exactly as the
    /// bundle it was compiled from and holds a few MB where the crate's model takes ~25 MB
    /// (Qwen3) and ~150 MB to build; it cannot `decode` or `encode_with_crate`.
    pub fn from_compiled(
        fingerprint: u64,
        encoder: &[u8],
        tokenizer_config_json: &str,
    ) -> Result<Self, ModelError> {
        let (_, template) = config_and_template(tokenizer_config_json)?;
        let compiled = |e: &dyn std::fmt::Display| ModelError::Tokenizer(e.to_string());
        let mut r = Reader::new(encoder);
        let fast = FastBpe::read_compiled(&mut r).map_err(|e| compiled(&e))?;
        let cuts = Cuts::read_compiled(&mut r).map_err(|e| compiled(&e))?;
        if r.remaining() != 0 {
            return Err(compiled(&"trailing bytes after the compiled encoder"));
        }
        Ok(ModelBundle {
            tokenizer: None,
            fast: Arc::new(Ok(fast)),
            cuts: Arc::new(cuts),
            template: Arc::new(template),
            fingerprint,
        })
    }

    /// The same tokenizer with another chat template (e.g. a misconfigured engine).
    pub fn with_chat_template(&self, source: &str) -> Result<Self, ModelError> {
        let template = ChatTemplate::new(source, self.template.special_tokens())?;
        let mut fp = self.fingerprint.to_le_bytes().to_vec();
        fp.extend_from_slice(source.as_bytes());
        Ok(ModelBundle {
            tokenizer: self.tokenizer.clone(),
            fast: Arc::clone(&self.fast),
            cuts: Arc::clone(&self.cuts),
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

    /// xxh3 of `tokenizer.json` and of the whole (canonical) `tokenizer_config.json`: part of
    /// the cache domain.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The chat template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Renders normalized messages as the engine does, with the generation prompt.
    pub fn render_chat(&self, messages: &[Value]) -> Result<String, ModelError> {
        self.render_chat_with(messages, true)
    }

    /// Renders normalized messages, choosing whether to append the generation prompt.
    pub fn render_chat_with(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        let chat = ChatPrompt { add_generation_prompt, ..ChatPrompt::new(messages.to_vec()) };
        self.render(&chat)
    }

    /// The text the engine tokenizes for a chat prompt (media parts contribute no text).
    pub fn render(&self, chat: &ChatPrompt) -> Result<String, ModelError> {
        self.render_messages(chat, &chat.messages)
    }

    /// A chat prompt rendered for routing: with media, the text is cut where the engine puts
    /// the first media placeholder (what follows is only sized, never hashed).
    pub fn render_for_routing(&self, chat: &ChatPrompt) -> Result<RenderedChat, ModelError> {
        let Some(cut) = chat.media else {
            return Ok(RenderedChat { text: self.render(chat)?, after_media: None });
        };
        let mut messages = chat.messages.clone();
        if let Some(Value::Object(m)) = messages.get_mut(cut.message) {
            // vLLM's string-content templates get the placeholders before the message's text,
            // joined by "\n" (chat_utils `_get_full_multimodal_text_prompt`).
            let text = m.get("content").and_then(Value::as_str).unwrap_or("");
            let content = if text.is_empty() {
                MEDIA_SENTINEL.to_owned()
            } else {
                format!("{MEDIA_SENTINEL}\n{text}")
            };
            m.insert("content".into(), Value::String(content));
        }
        let full = self.render_messages(chat, &messages)?;
        let mut found = full.match_indices(MEDIA_SENTINEL);
        let text_only = match (found.next(), found.next()) {
            (Some((at, _)), None) => {
                let rest = &full[at + MEDIA_SENTINEL.len()..];
                return Ok(RenderedChat {
                    text: full[..at].to_owned(),
                    after_media: Some(AfterMedia { text: rest.to_owned(), items: cut.items }),
                });
            }
            // The template dropped or repeated the content: nothing is safely hashable.
            _ => full.replace(MEDIA_SENTINEL, ""),
        };
        Ok(RenderedChat {
            text: String::new(),
            after_media: Some(AfterMedia { text: text_only, items: cut.items }),
        })
    }

    /// Renders `messages` with the options of `chat`, continuing the final message as
    /// transformers does: the message gets a tag appended, the text is cut at the tag (and
    /// right-stripped when the template trimmed the space the tag carries).
    fn render_messages(&self, chat: &ChatPrompt, messages: &[Value]) -> Result<String, ModelError> {
        let render_err = |m: &str| ModelError::Template(TemplateError::Render(m.into()));
        if chat.continue_final_message && chat.add_generation_prompt {
            return Err(render_err(
                "continue_final_message and add_generation_prompt are not compatible",
            ));
        }
        let mut tagged;
        let mut final_text = None;
        let messages = if chat.continue_final_message {
            tagged = messages.to_vec();
            let last = tagged.last_mut().and_then(Value::as_object_mut);
            let content = last.and_then(|m| m.get_mut("content"));
            let Some(Value::String(text)) = content else {
                return Err(render_err("continue_final_message: no text in the final message"));
            };
            final_text = Some(text.clone());
            text.push_str(CONTINUE_TAG);
            &tagged[..]
        } else {
            messages
        };
        let rendered = self.template.render(&RenderInput {
            messages,
            tools: chat.tools.as_deref(),
            documents: chat.documents.as_ref(),
            add_generation_prompt: chat.add_generation_prompt,
            kwargs: &chat.kwargs,
        })?;
        let Some(final_text) = final_text else {
            return Ok(rendered);
        };
        let tag = CONTINUE_TAG.trim_end();
        let tag_at = rendered.rfind(tag);
        match tag_at {
            Some(at) if rendered.contains(py_strip(&final_text, None, true, true)) => {
                if rendered[at..].starts_with(CONTINUE_TAG) {
                    Ok(rendered[..at].to_owned())
                } else {
                    Ok(py_strip(&rendered[..at], None, false, true).to_owned())
                }
            }
            _ => Err(render_err("continue_final_message: the final message is not in the text")),
        }
    }

    /// Tokenizes `text`; `add_special_tokens` applies the tokenizer's post-processor (BOS).
    /// Uses the exact fast encoder ([`crate::decision::tokenize::fastbpe`]) when the tokenizer has one.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        if let Ok(fast) = self.fast.as_ref() {
            return Ok(fast.encode(text, add_special_tokens));
        }
        self.encode_with_crate(text, add_special_tokens)
    }

    /// Tokenizes `text` with the `tokenizers` crate itself (the reference of the fast path).
    pub fn encode_with_crate(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .crate_tokenizer()?
            .encode(text, add_special_tokens)
            .map_err(|e| ModelError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text (used by the simulated engine to produce output).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.crate_tokenizer()?.decode(ids, false).map_err(|e| ModelError::Encode(e.to_string()))
    }

    fn crate_tokenizer(&self) -> Result<&Tokenizer, ModelError> {
        self.tokenizer
            .as_deref()
            .ok_or_else(|| ModelError::Encode("a compiled bundle has no tokenizers model".into()))
    }

    /// The engine's token ids for a prompt: chat prompts are rendered and encoded without
    /// special tokens (the template carries BOS, as in vLLM's chat endpoint); text completions
    /// are encoded with them; token-id prompts are used as given.
    /// Media parts contribute no text here (see [`ModelBundle::routing_tokens`]).
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, ModelError> {
        match prompt {
            Prompt::Chat(c) => self.encode(&self.render(c)?, false),
            Prompt::Text(t) => self.encode(t, true),
            Prompt::Tokens(t) => Ok(t.clone()),
        }
    }

    /// The ids kvroute may hash for a prompt and the prompt's size for the cost model.
    pub fn routing_tokens(&self, prompt: &Prompt) -> Result<RoutingTokens, ModelError> {
        match prompt {
            Prompt::Chat(c) => self.render_for_routing(c)?.tokens(|t| self.encode(t, false)),
            _ => {
                let ids = self.prompt_tokens(prompt)?;
                Ok(RoutingTokens { prompt_tokens: ids.len() as u64, hashable: ids, media: false })
            }
        }
    }

    /// The fast encoder, or why this tokenizer has none.
    pub fn fast_encoder(&self) -> Result<&FastBpe, &Unsupported> {
        self.fast.as_ref().as_ref()
    }

    /// The `tokenizers` crate's model, for inspecting its configuration; `None` in a bundle
    /// read from a compiled encoder.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_deref()
    }

    /// The added tokens after which a text may be cut (the token cache's segments).
    pub fn cuts(&self) -> &Cuts {
        &self.cuts
    }
}

/// `tokenizer_config.json` parsed, and its chat template with the special tokens it names.
fn config_and_template(tokenizer_config_json: &str) -> Result<(Value, ChatTemplate), ModelError> {
    let cfg: Value = serde_json::from_str(tokenizer_config_json)
        .map_err(|e| ModelError::Config(e.to_string()))?;
    let chat_template = cfg
        .get("chat_template")
        .and_then(Value::as_str)
        .ok_or_else(|| ModelError::Config("no string 'chat_template'".into()))?;
    let template = ChatTemplate::new(chat_template, &special_tokens(&cfg))?;
    Ok((cfg, template))
}

/// The demo and Qwen3 bundles, each loaded once per test binary (tests of several modules
/// tokenize with both).
#[cfg(test)]
pub(crate) mod shared_for_tests {
    use std::sync::OnceLock;

    use super::{qwen3, ModelBundle};

    pub fn demo() -> &'static ModelBundle {
        static B: OnceLock<ModelBundle> = OnceLock::new();
        B.get_or_init(|| ModelBundle::demo().unwrap())
    }

    pub fn qwen() -> &'static ModelBundle {
        static B: OnceLock<ModelBundle> = OnceLock::new();
        B.get_or_init(|| qwen3().unwrap_or_else(|e| panic!("{e}")))
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

/// A token of tokenizer_config.json: either a string or `{"content": "..."}`.
fn token_text(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content").and_then(Value::as_str),
        _ => None,
    }
}

/// The template variables transformers derives from the tokenizer (its `special_tokens_map`):
/// each special token that is set, and the additional special tokens when there are any.
fn special_tokens(cfg: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    for key in SPECIAL_TOKENS {
        if let Some(t) = cfg.get(key).and_then(token_text) {
            out.insert(key.into(), Value::String(t.into()));
        }
    }
    let extra: Vec<Value> = cfg
        .get("additional_special_tokens")
        .and_then(Value::as_array)
        .map(|l| l.iter().filter_map(token_text).map(|t| Value::String(t.into())).collect())
        .unwrap_or_default();
    if !extra.is_empty() {
        out.insert("additional_special_tokens".into(), Value::Array(extra));
    }
    out
}

const SPECIAL_TOKENS: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/// Stands where the engine puts the first media placeholder. Private-use characters: a text
/// that contains it anyway makes it ambiguous, and the prompt is then not hashed.
const MEDIA_SENTINEL: &str = "\u{e000}kvroute:media\u{e001}";

/// What transformers appends to the final message to find where it ends in the text.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// Tokens a media item is assumed to take in the engine's prompt, for the cost model only
/// (images are a few hundred to a few thousand tokens, depending on model and resolution).
pub const MEDIA_ITEM_TOKENS: u64 = 768;

/// A chat prompt rendered for routing (see [`ModelBundle::render_for_routing`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedChat {
    /// The text the engine tokenizes, up to the first media placeholder if there is media.
    pub text: String,
    /// What follows the first media placeholder: sized, never hashed.
    pub after_media: Option<AfterMedia>,
}

/// The part of a rendered chat prompt after its first media placeholder.
#[derive(Debug, Clone, PartialEq)]
pub struct AfterMedia {
    /// The rendered text after the placeholder (later media contribute no text).
    pub text: String,
    /// Media parts in the whole conversation.
    pub items: usize,
}

/// The ids kvroute may hash for a prompt, and its size for the cost model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingTokens {
    /// The whole prompt's ids; with media, those strictly before the first media placeholder
    /// minus the last one (it could merge with what the engine puts at the cut).
    pub hashable: Vec<u32>,
    /// The prompt's size: exact, or with media the ids before the cut, those of the text after
    /// it, and [`MEDIA_ITEM_TOKENS`] per media item.
    pub prompt_tokens: u64,
    /// Whether the prompt has media (only a prefix is hashable).
    pub media: bool,
}

impl RenderedChat {
    /// Tokenizes with `encode` (without special tokens; e.g. through a token cache).
    pub fn tokens(
        &self,
        mut encode: impl FnMut(&str) -> Result<Vec<u32>, ModelError>,
    ) -> Result<RoutingTokens, ModelError> {
        let mut hashable = if self.text.is_empty() { Vec::new() } else { encode(&self.text)? };
        let Some(after) = &self.after_media else {
            return Ok(RoutingTokens {
                prompt_tokens: hashable.len() as u64,
                hashable,
                media: false,
            });
        };
        let rest = if after.text.is_empty() { 0 } else { encode(&after.text)?.len() as u64 };
        let prompt_tokens =
            hashable.len() as u64 + rest + (after.items as u64).saturating_mul(MEDIA_ITEM_TOKENS);
        hashable.pop();
        Ok(RoutingTokens { hashable, prompt_tokens, media: true })
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
        let ids = b.prompt_tokens(&Prompt::messages(msgs)).unwrap();
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
        let ids = b.prompt_tokens(&Prompt::messages(msgs)).unwrap();
        assert_eq!(ids[0], b.encode("<|im_start|>", false).unwrap()[0]);
    }

    #[test]
    fn the_fingerprint_ignores_formatting_so_inline_and_file_bundles_agree() {
        // The filter's inline config holds the files as JSON values and re-serializes them
        // compactly; the updater and the simulator read the files: same bundle, same domain.
        let dir = qwen3_dir();
        let tok = std::fs::read_to_string(dir.join("tokenizer.json")).unwrap();
        let cfg = std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap();
        let from_file = ModelBundle::from_hf(&tok, &cfg).unwrap();
        let compact = |t: &str| serde_json::from_str::<Value>(t).unwrap().to_string();
        let inline = ModelBundle::from_hf(&compact(&tok), &compact(&cfg)).unwrap();
        assert_eq!(from_file.fingerprint(), inline.fingerprint());
        let demo = ModelBundle::demo().unwrap();
        assert_ne!(demo.fingerprint(), from_file.fingerprint());
        let other = cfg.replace("<|im_end|>\",", "<|endoftext|>\",");
        let changed = ModelBundle::from_hf(&tok, &other).unwrap();
        assert_ne!(changed.fingerprint(), from_file.fingerprint(), "eos_token is in the domain");
    }
}
