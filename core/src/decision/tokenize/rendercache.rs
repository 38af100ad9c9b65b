//! Rendering that scales with conversations: a [`RenderCache`] (one per Envoy thread) keeps
//! the rendered text of recent chat prompts, keyed by their messages, so that the next turn of
//! a conversation renders only the messages it adds
//! ([`crate::decision::template::ChatTemplate::render_after`]).
//!
//! A key is a 128-bit xxh3, seeded by the bundle's fingerprint, of everything the template
//! sees besides the messages (tools, documents, kwargs) and then of each message in order;
//! the digest after message `k` names the prompt made of the first `k`. A render looks for the
//! longest of its message prefixes that is cached (the whole prompt included: a retry is a
//! copy), renders the rest from it, and stores its own text. Prompts of fewer than
//! [`MIN_MESSAGES`] messages, with media or `continue_final_message`, and templates that
//! [`ChatTemplate::incremental`] does not allow, are rendered in full and not stored.
//!
//! Eviction is least-recently-used under a byte bound ([`RenderCacheLimits`]). The texts stay
//! in this thread's memory; nothing is exported but the counters ([`RenderCacheStats`]).

use hashlink::LruCache;
use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

use crate::decision::request::ChatPrompt;
use crate::decision::template::{ChatTemplate, RenderInput};
use crate::decision::tokenize::model::{ModelBundle, ModelError};

/// Prompts with fewer messages are rendered in full and not stored: rendering them costs
/// little, and most one-message prompts have no next turn (no hashing, no copy for them).
pub const MIN_MESSAGES: usize = 5;

/// What an entry costs besides its text: the map node, key, fields and allocation header.
pub const ENTRY_OVERHEAD_BYTES: usize = 80;

/// Bounds of a thread's render cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderCacheLimits {
    /// Bytes the cached texts may take (plus [`ENTRY_OVERHEAD_BYTES`] each); 0 turns the
    /// cache off.
    pub max_bytes: usize,
}

impl Default for RenderCacheLimits {
    /// 4 MiB per thread: about a hundred 8 k-token conversations.
    fn default() -> Self {
        RenderCacheLimits { max_bytes: 4 << 20 }
    }
}

/// Counters for the filter to export.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenderCacheStats {
    /// Renders that started from a cached prefix of their messages.
    pub hits: u64,
    /// Renders done in full: nothing cached, or the window's checks declined.
    pub misses: u64,
    /// Of the misses, those where a cached prefix was found but the window's checks declined.
    pub declined: u64,
    /// Renders not eligible (fewer than [`MIN_MESSAGES`] messages, media,
    /// `continue_final_message`, template not allowed, cache off): rendered in full, not
    /// stored.
    pub bypassed: u64,
    /// Entries evicted to stay within the bound.
    pub evictions: u64,
    /// Entries held now.
    pub entries: usize,
    /// Bytes held now, as counted against `max_bytes`.
    pub bytes: usize,
}

struct Entry {
    check: u64,
    /// The text of the prompt made of the key's messages.
    text: String,
    /// Whether `text` ends with the generation prompt.
    agp: bool,
}

impl Entry {
    fn bytes(&self) -> usize {
        ENTRY_OVERHEAD_BYTES + self.text.len()
    }
}

type Lru = LruCache<u64, Entry, foldhash::fast::FixedState>;

/// A bounded cache of rendered chat prompts; see the module documentation.
pub struct RenderCache {
    limits: RenderCacheLimits,
    entries: Lru,
    bytes: usize,
    stats: RenderCacheStats,
}

impl std::fmt::Debug for RenderCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenderCache")
            .field("limits", &self.limits)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for RenderCache {
    fn default() -> Self {
        RenderCache::new(RenderCacheLimits::default())
    }
}

impl RenderCache {
    pub fn new(limits: RenderCacheLimits) -> Self {
        RenderCache {
            limits,
            entries: LruCache::with_hasher(usize::MAX, foldhash::fast::FixedState::default()),
            bytes: 0,
            stats: RenderCacheStats::default(),
        }
    }

    pub fn stats(&self) -> RenderCacheStats {
        RenderCacheStats { entries: self.entries.len(), bytes: self.bytes, ..self.stats }
    }

    /// The text of `bundle.render(chat)`, from the longest cached prefix of its messages.
    pub fn render(
        &mut self,
        bundle: &ModelBundle,
        chat: &ChatPrompt,
    ) -> Result<String, ModelError> {
        let template = bundle.template();
        let eligible = self.limits.max_bytes > 0
            && chat.media.is_none()
            && !chat.continue_final_message
            && chat.messages.len() >= MIN_MESSAGES
            && template.incremental();
        if !eligible {
            self.stats.bypassed += 1;
            return bundle.render(chat);
        }
        let keys = prefix_keys(bundle.fingerprint(), chat);
        let input = RenderInput {
            messages: &chat.messages,
            tools: chat.tools.as_deref(),
            documents: chat.documents.as_ref(),
            add_generation_prompt: chat.add_generation_prompt,
            kwargs: &chat.kwargs,
        };
        let text = match self.render_from_prefix(template, &input, &keys) {
            Some(text) => {
                self.stats.hits += 1;
                text
            }
            None => {
                self.stats.misses += 1;
                template.render(&input)?
            }
        };
        // A text over the whole bound is not stored: it would only evict everything else.
        let fits = ENTRY_OVERHEAD_BYTES + text.len() <= self.limits.max_bytes;
        if let (Some(&(key, check)), true) = (keys.last(), fits) {
            let e = Entry { check, text: text.clone(), agp: chat.add_generation_prompt };
            self.bytes += e.bytes();
            if let Some(old) = self.entries.insert(key, e) {
                self.bytes = self.bytes.saturating_sub(old.bytes());
            }
            self.shrink();
        }
        Ok(text)
    }

    /// The text rendered from the longest cached prefix, or `None` (none, or declined).
    fn render_from_prefix(
        &mut self,
        template: &ChatTemplate,
        input: &RenderInput<'_>,
        keys: &[(u64, u64)],
    ) -> Option<String> {
        let (k, key) = keys.iter().enumerate().rev().find_map(|(i, &(key, check))| {
            self.entries.peek(&key).is_some_and(|e| e.check == check).then_some((i + 1, key))
        })?;
        // Refreshed: the conversation is alive.
        let entry = self.entries.get(&key)?;
        if k == input.messages.len() && entry.agp == input.add_generation_prompt {
            return Some(entry.text.clone());
        }
        let text = template.render_after(input, k, &entry.text, entry.agp);
        if text.is_none() {
            self.stats.declined += 1;
        }
        text
    }

    fn shrink(&mut self) {
        while self.bytes > self.limits.max_bytes {
            let Some((_, e)) = self.entries.remove_lru() else { break };
            self.bytes = self.bytes.saturating_sub(e.bytes());
            self.stats.evictions += 1;
        }
    }
}

/// For each message, the xxh3-128 of the prompt's context and its messages up to that one:
/// (map key, check).
fn prefix_keys(fingerprint: u64, chat: &ChatPrompt) -> Vec<(u64, u64)> {
    let mut h = Xxh3::with_seed(fingerprint);
    hash_object(&mut h, &chat.kwargs);
    match &chat.tools {
        Some(tools) => hash_array(&mut h, tools),
        None => h.update(&[0xfe]),
    }
    match &chat.documents {
        Some(d) => hash_json(&mut h, d),
        None => h.update(&[0xfe]),
    }
    h.update(&[0xff]);
    chat.messages
        .iter()
        .map(|m| {
            hash_json(&mut h, m);
            let d = h.digest128();
            (d as u64, (d >> 64) as u64)
        })
        .collect()
}

/// Feeds `v` into `h` unambiguously: a tag per kind, lengths before contents.
fn hash_json(h: &mut Xxh3, v: &Value) {
    match v {
        Value::Null => h.update(&[0]),
        Value::Bool(b) => h.update(&[1, u8::from(*b)]),
        Value::Number(n) => hash_bytes(h, 2, n.to_string().as_bytes()),
        Value::String(s) => hash_bytes(h, 3, s.as_bytes()),
        Value::Array(items) => hash_array(h, items),
        Value::Object(m) => hash_object(h, m),
    }
}

fn hash_bytes(h: &mut Xxh3, tag: u8, b: &[u8]) {
    h.update(&[tag]);
    h.update(&(b.len() as u64).to_le_bytes());
    h.update(b);
}

fn hash_array(h: &mut Xxh3, items: &[Value]) {
    h.update(&[4]);
    h.update(&(items.len() as u64).to_le_bytes());
    items.iter().for_each(|x| hash_json(h, x));
}

fn hash_object(h: &mut Xxh3, m: &serde_json::Map<String, Value>) {
    h.update(&[5]);
    h.update(&(m.len() as u64).to_le_bytes());
    for (k, x) in m {
        hash_bytes(h, 3, k.as_bytes());
        hash_json(h, x);
    }
}

#[cfg(test)]
mod shipped_tests;
#[cfg(test)]
mod tests;
