//! Tokenization that scales with conversations: turn k of a chat repeats turns 1..k-1, so
//! encoding the whole rendered prompt every turn costs quadratic time over a conversation.
//!
//! A [`TokenCache`] (one per Envoy thread) keeps the token ids of rendered prompts cut at
//! [`Cuts`]: points right after an added token, where the tokenizer's output is stable (what
//! precedes the cut encodes the same whatever follows; see `tokcache/cuts.rs`). Each entry holds
//! the ids of one segment, from the previous cut to its own, keyed by a 128-bit xxh3 of the
//! whole prefix up to its cut (seeded by the bundle's fingerprint) and checked against the
//! segment's byte range too, so a false hit would need a 128-bit collision. An encode finds the
//! longest run of cached segments from the start of the text, encodes only the rest (segment by
//! segment) and stores the new segments. A conversation's turns share their segments, and so do
//! the branches of one prefix.
//!
//! Eviction is least-recently-used under a byte bound ([`TokenCacheLimits`]), in two parts:
//! new segments enter on probation, and a segment reused once moves to the protected part
//! (at most [`PROTECTED_SHARE`] of the bound); so do the new segments of a conversation under
//! way ([`TokenCache::encode_continued`]), whose next turn repeats them. Probation is evicted
//! first, so a flood of prompts seen once (one-shot questions, retrieval prompts) cannot push
//! out the conversations whose turns keep coming back; a protected segment unused for long
//! goes back on probation. A hit refreshes its segments deepest first, so a chain loses its
//! leaves before its root. Only chat prompts (encoded without special tokens) go through the
//! cache. The ids stay in this thread's memory; nothing is exported but the counters
//! ([`TokenCacheStats`]).

mod cuts;
#[cfg(test)]
mod tests;

pub use cuts::Cuts;

use hashlink::LruCache;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use crate::decision::tokenize::model::{ModelBundle, ModelError};

/// What an entry costs besides its ids: the map node, key, fields and allocation headers.
pub const ENTRY_OVERHEAD_BYTES: usize = 96;

/// The share of the bound that reused segments may hold (numerator, denominator).
pub const PROTECTED_SHARE: (usize, usize) = (4, 5);

/// Bounds of a thread's token cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TokenCacheLimits {
    /// Heap bytes the cached ids may take (4 per id, plus [`ENTRY_OVERHEAD_BYTES`] per
    /// segment); 0 turns the cache off.
    pub max_bytes: usize,
}

impl Default for TokenCacheLimits {
    /// 4 MiB per thread: about a hundred 8 k-token conversations.
    fn default() -> Self {
        TokenCacheLimits { max_bytes: 4 << 20 }
    }
}

/// Counters for the filter to export.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenCacheStats {
    /// Encodes that reused a cached prefix.
    pub hits: u64,
    /// Encodes of a text with cut points and no cached prefix.
    pub misses: u64,
    /// Encodes of a text without cut points (or with the cache off): encoded whole.
    pub bypassed: u64,
    /// Token ids taken from the cache instead of being computed.
    pub saved_tokens: u64,
    /// Token ids computed by the tokenizer.
    pub encoded_tokens: u64,
    /// Segments evicted to stay within the bound.
    pub evictions: u64,
    /// Segments held now.
    pub entries: usize,
    /// Bytes held now, as counted against `max_bytes`.
    pub bytes: usize,
    /// Of those, the protected part's (segments reused, a conversation's turns).
    pub protected_bytes: usize,
}

/// The ids of one segment `text[start..end]`; `end` is a cut.
#[derive(Clone)]
struct Entry {
    check: u64,
    start: usize,
    end: usize,
    ids: Box<[u32]>,
}

impl Entry {
    fn bytes(&self) -> usize {
        ENTRY_OVERHEAD_BYTES + 4 * self.ids.len()
    }
}

type Lru = LruCache<u64, Entry, foldhash::fast::FixedState>;

/// A bounded cache of token ids of prompt prefixes; see the module documentation.
#[derive(Clone)]
pub struct TokenCache {
    limits: TokenCacheLimits,
    /// Segments not reused yet, least recently used first: evicted first. Keys are xxh3
    /// digests already: a fast fixed hasher suffices.
    probation: Lru,
    /// Segments reused at least once. A key is in one part or the other, never both.
    protected: Lru,
    /// Bytes of both parts, and of `protected` alone.
    bytes: usize,
    protected_bytes: usize,
    stats: TokenCacheStats,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache")
            .field("limits", &self.limits)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for TokenCache {
    fn default() -> Self {
        TokenCache::new(TokenCacheLimits::default())
    }
}

impl TokenCache {
    pub fn new(limits: TokenCacheLimits) -> Self {
        let lru = || LruCache::with_hasher(usize::MAX, foldhash::fast::FixedState::default());
        TokenCache {
            limits,
            probation: lru(),
            protected: lru(),
            bytes: 0,
            protected_bytes: 0,
            stats: TokenCacheStats::default(),
        }
    }

    pub fn limits(&self) -> TokenCacheLimits {
        self.limits
    }

    /// Changes the bound, evicting what no longer fits.
    #[cfg(test)]
    pub(crate) fn set_limits(&mut self, limits: TokenCacheLimits) {
        self.limits = limits;
        self.shrink();
    }

    pub fn stats(&self) -> TokenCacheStats {
        let entries = self.probation.len() + self.protected.len();
        let (bytes, protected_bytes) = (self.bytes, self.protected_bytes);
        TokenCacheStats { entries, bytes, protected_bytes, ..self.stats }
    }

    /// The ids of `bundle.encode(text, false)`, reusing and extending what is cached; the new
    /// segments enter on probation. `cuts` must be `bundle.cuts()`.
    pub fn encode(
        &mut self,
        bundle: &ModelBundle,
        cuts: &Cuts,
        text: &str,
    ) -> Result<Vec<u32>, ModelError> {
        self.encode_as(bundle, cuts, text, false)
    }

    /// As [`TokenCache::encode`], for the prompt of a conversation under way (it carries an
    /// earlier answer): its next turn repeats it, so its new segments enter the protected
    /// part, where prompts seen once do not push them out before that turn comes.
    pub fn encode_continued(
        &mut self,
        bundle: &ModelBundle,
        cuts: &Cuts,
        text: &str,
    ) -> Result<Vec<u32>, ModelError> {
        self.encode_as(bundle, cuts, text, true)
    }

    fn encode_as(
        &mut self,
        bundle: &ModelBundle,
        cuts: &Cuts,
        text: &str,
        protect: bool,
    ) -> Result<Vec<u32>, ModelError> {
        let at = cuts.find(text);
        if at.is_empty() || self.limits.max_bytes == 0 {
            let ids = bundle.encode(text, false)?;
            self.stats.bypassed += 1;
            self.stats.encoded_tokens += ids.len() as u64;
            return Ok(ids);
        }
        let keys = prefix_keys(bundle.fingerprint(), text, &at);
        let start = |j: usize| if j == 0 { 0 } else { at[j - 1] };
        let have = (0..at.len())
            .take_while(|&j| {
                let (key, check) = keys[j];
                self.peek(key)
                    .is_some_and(|e| e.check == check && e.start == start(j) && e.end == at[j])
            })
            .count();
        let mut ids = Vec::new();
        for &(key, _) in &keys[..have] {
            if let Some(e) = self.peek(key) {
                ids.extend_from_slice(&e.ids);
            }
        }
        let saved = ids.len();
        let mut fresh = Vec::with_capacity(at.len() - have);
        for (j, &end) in at.iter().enumerate().skip(have) {
            fresh.push(bundle.encode(piece(text, start(j), end)?, false)?);
        }
        let tail = piece(text, at[at.len() - 1], text.len())?;
        let tail = if tail.is_empty() { Vec::new() } else { bundle.encode(tail, false)? };
        for seg in &fresh {
            ids.extend_from_slice(seg);
        }
        ids.extend_from_slice(&tail);
        if have > 0 {
            self.stats.hits += 1;
            self.stats.saved_tokens += saved as u64;
        } else {
            self.stats.misses += 1;
        }
        self.stats.encoded_tokens += (ids.len() - saved) as u64;
        // Deepest first, then the reused ones deepest first: the root is used most recently.
        for (j, seg) in (have..at.len()).zip(fresh).rev() {
            let (key, check) = keys[j];
            let e = Entry { check, start: start(j), end: at[j], ids: seg.into_boxed_slice() };
            self.insert(key, e, protect);
        }
        for &(key, _) in keys[..have].iter().rev() {
            self.reused(key);
        }
        self.shrink();
        Ok(ids)
    }

    fn peek(&self, key: u64) -> Option<&Entry> {
        self.protected.peek(&key).or_else(|| self.probation.peek(&key))
    }

    /// A new segment, on probation or protected (replacing any entry of that key).
    fn insert(&mut self, key: u64, e: Entry, protect: bool) {
        if let Some(old) = self.protected.remove(&key) {
            self.protected_bytes = self.protected_bytes.saturating_sub(old.bytes());
            self.bytes = self.bytes.saturating_sub(old.bytes());
        }
        if let Some(old) = self.probation.remove(&key) {
            self.bytes = self.bytes.saturating_sub(old.bytes());
        }
        self.bytes += e.bytes();
        if protect {
            self.protected_bytes += e.bytes();
            self.protected.insert(key, e);
        } else {
            self.probation.insert(key, e);
        }
    }

    /// A segment reused: protected, and the most recently used there.
    fn reused(&mut self, key: u64) {
        if self.protected.get(&key).is_some() {
            return;
        }
        if let Some(e) = self.probation.remove(&key) {
            self.protected_bytes += e.bytes();
            self.protected.insert(key, e);
        }
    }

    /// Puts the protected part's least recently used segments back on probation (as its most
    /// recently used ones) past its share, then evicts from probation, and from the protected
    /// part only when probation is empty.
    fn shrink(&mut self) {
        let (num, den) = PROTECTED_SHARE;
        let share = self.limits.max_bytes / den * num;
        while self.protected_bytes > share {
            let Some((key, e)) = self.protected.remove_lru() else { break };
            self.protected_bytes = self.protected_bytes.saturating_sub(e.bytes());
            self.probation.insert(key, e);
        }
        while self.bytes > self.limits.max_bytes {
            let e = match self.probation.remove_lru() {
                Some((_, e)) => e,
                None => match self.protected.remove_lru() {
                    Some((_, e)) => {
                        self.protected_bytes = self.protected_bytes.saturating_sub(e.bytes());
                        e
                    }
                    None => break,
                },
            };
            self.bytes = self.bytes.saturating_sub(e.bytes());
            self.stats.evictions += 1;
        }
    }
}

/// `text[a..b]`; cuts always fall on character boundaries (a token is matched whole).
fn piece(text: &str, a: usize, b: usize) -> Result<&str, ModelError> {
    text.get(a..b).ok_or_else(|| ModelError::Encode("cut inside a character".into()))
}

/// For each cut, the xxh3-128 of the text up to it, seeded with the bundle's fingerprint:
/// (map key, check).
fn prefix_keys(fingerprint: u64, text: &str, at: &[usize]) -> Vec<(u64, u64)> {
    let mut h = Xxh3::with_seed(fingerprint);
    let mut prev = 0;
    at.iter()
        .map(|&q| {
            h.update(&text.as_bytes()[prev..q]);
            prev = q;
            let d = h.digest128();
            (d as u64, (d >> 64) as u64)
        })
        .collect()
}
