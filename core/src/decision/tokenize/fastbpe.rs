//! A fast, exact byte-level BPE encoder for the tokenizer shapes kvroute's bundles use.
//!
//! [`FastBpe::new`] inspects a loaded Hugging Face [`Tokenizer`] (and its `tokenizer.json` text,
//! for the merge list) and builds an encoder only when every stage is one it reproduces
//! exactly; anything else is [`Unsupported`] and the caller keeps the `tokenizers` crate. The
//! stages, in the crate's order (`Tokenizer::encode` → `AddedVocabulary::extract_and_normalize`
//! → pre-tokenizer → `BPE::tokenize` → post-processor):
//!
//! 1. Added tokens, all `normalized: false` and without `lstrip`/`rstrip`/`single_word`, are
//!    split out of the raw text with the same Aho-Corasick automaton (leftmost-longest);
//!    `encode_special_tokens` must be off.
//! 2. Each piece between them is normalized on its own: none, or NFC with the same
//!    `unicode-normalization-alignments` crate the `tokenizers` crate uses.
//! 3. Pre-tokenization: `Split` steps (regex, `Isolated`, not inverted) then one final
//!    `ByteLevel` (no prefix space; with `use_regex`, GPT-2's pattern is one more split). Any
//!    pattern runs on `fancy-regex` as in the crate (a regex error such as the backtrack limit
//!    ends the matches there, as the crate's `SysRegex` does). The three known patterns
//!    (GPT-2, Qwen2/3, Llama 3), which need backtracking only for their `\s+(?!\S)`
//!    alternative, run on `regex-automata` (the engine `fancy-regex` delegates to) with that
//!    alternative replaced by a one-character adjustment (`Splitter::Known`); a property
//!    test checks the pieces equal `fancy-regex`'s. `fancy-regex` costs a VM run and an
//!    allocation per match (~0.6 µs): it was most of the time left. Their pieces of ASCII
//!    text come from a byte scanner of the same rules (`fastbpe/ascii.rs`), without a
//!    search call per piece.
//! 4. BPE without dropout, prefix or suffix (`""` counts as none) or byte fallback, on the
//!    piece's bytes (GPT-2's byte alphabet), merging the lowest-ranked pair first and the
//!    leftmost among equal ranks, as the crate's `Word::merge_all`; `ignore_merges` looks the
//!    whole piece up first. Bytes missing from the vocabulary are dropped as the crate drops
//!    them (an `unk_token` is refused unless every byte is in the vocabulary).
//! 5. Post-processors: none, `ByteLevel` (offsets only), `TemplateProcessing` (its single
//!    template), or a `Sequence` of those. Truncation and padding must be off.
//!
//! Speed comes from working on byte slices and `Vec<u32>` of symbol ids with no per-character
//! or per-piece allocation (the crate keeps a `NormalizedString` with alignments per piece),
//! a `(left, right) → (rank, merged)` table keyed by one `u64`, and a bounded per-piece cache.
//! Short pieces merge by scanning adjacent pairs; pieces over [`SCAN_MAX`] symbols use the
//! crate's own heap-and-linked-list algorithm (so a long run is not quadratic).

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use fancy_regex::Regex;
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;
use tokenizers::models::ModelWrapper;
use tokenizers::{Model, Tokenizer};
use unicode_normalization_alignments::{is_nfc_quick, IsNormalized, UnicodeNormalization};

/// Why a tokenizer gets no fast encoder (the `tokenizers` crate is used instead).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Unsupported {
    #[error("truncation, padding or encode_special_tokens is set")]
    Options,
    #[error("normalizer: {0}")]
    Normalizer(String),
    #[error("pre-tokenizer: {0}")]
    PreTokenizer(String),
    #[error("model: {0}")]
    Model(String),
    #[error("added token: {0}")]
    AddedToken(String),
    #[error("post-processor: {0}")]
    PostProcessor(String),
    #[error("tokenizer.json: {0}")]
    Json(String),
    #[error("a probe text encodes differently than with the tokenizers crate")]
    Probe,
}

/// GPT-2's pre-tokenization pattern, as `ByteLevel { use_regex: true }` applies it.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Qwen2's (and Qwen3's) pattern.
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's pattern.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The alternatives these patterns end with: the only part that needs backtracking.
const WHITESPACE_TAIL: &str = r"|\s+(?!\S)|\s+";

/// Pieces of at most this many symbols merge by scanning pairs; longer ones use a heap.
pub const SCAN_MAX: usize = 64;
/// Pieces of at most this many bytes are cached.
const CACHE_MAX_PIECE: usize = 64;
/// The cache is cleared when it holds more pieces than this...
const CACHE_MAX_ENTRIES: usize = 8192;
/// ... or more ids than this.
const CACHE_MAX_IDS: usize = 1 << 16;

/// No id (a byte missing from the vocabulary).
const NONE: u32 = u32::MAX;
/// No merge for a pair.
const NO_MERGE: u64 = u64::MAX;

/// One `Split` step of the pre-tokenizer.
enum Splitter {
    /// The pattern as the crate runs it (`fancy-regex`, one VM run per match).
    Fancy(Regex),
    /// A known pattern `PREFIX|\s+(?!\S)|\s+` (PREFIX without look-around), run by the
    /// regex engine `fancy-regex` delegates to, as the two patterns `[PREFIX, \s+]`
    /// (leftmost-first, so the earlier one wins as in an alternation), anchored where the
    /// previous match ended. When `\s+` matched, the backtracking engine would have tried
    /// `\s+(?!\S)` first: over the same maximal run of whitespace, it matches all but the
    /// run's last character when the run has at least two and non-whitespace follows (the
    /// look-ahead fails at the run's end and holds one character earlier), and otherwise
    /// leaves the run to `\s+`. So the match is shortened by one character in that case.
    /// Anything unexpected (no match where one must be, an empty match) falls back to
    /// `fancy` for the whole text.
    /// ASCII text skips the regex engine: `ascii` splits it by the same rules.
    Known { re: regex_automata::meta::Regex, fancy: Regex, ascii: ascii::Known },
}

/// One post-processing template (`TemplateProcessing`'s `single`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// The encoded sequence.
    Sequence,
    /// A special token's ids, added only with `add_special_tokens`.
    Special(Vec<u32>),
}

/// Hashes the merge table's `u64` keys (fixed content: no need for a keyed hash).
#[derive(Default, Clone, Copy)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let m = u128::from(self.0 ^ n) * 0x9e37_79b9_7f4a_7c15_u128;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type MergeMap = HashMap<u64, u64, BuildHasherDefault<PairHasher>>;

/// Maps keyed by a piece's bytes, looked up once or twice per piece of every prompt. Pieces
/// come from clients, so the hash is seeded per process (foldhash's, not the default SipHash:
/// SipHash was a tenth of a prompt's tokenization inside Envoy).
type PieceMap<V> = HashMap<Box<[u8]>, V, foldhash::fast::RandomState>;

/// The fast encoder; see the module documentation.
pub struct FastBpe {
    /// Added tokens (raw text, leftmost-longest) and their ids.
    added: Option<(AhoCorasick, Vec<u32>)>,
    /// The added tokens' texts, in the order of `added`'s ids (kept for [`compiled`]).
    added_text: Vec<String>,
    nfc: bool,
    /// Applied in order, each to every piece of the previous one (`Isolated`).
    splits: Vec<Splitter>,
    /// Id of each byte's symbol, or [`NONE`].
    byte_ids: [u32; 256],
    /// `left << 32 | right` → `rank << 32 | merged`.
    merges: MergeMap,
    /// `ignore_merges`: whole pieces (as bytes) that are in the vocabulary.
    whole: Option<PieceMap<u32>>,
    /// Post-processors, in order.
    post: Vec<Vec<Part>>,
    state: Mutex<State>,
}

impl std::fmt::Debug for FastBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastBpe")
            .field("added", &self.added.as_ref().map_or(0, |a| a.1.len()))
            .field("nfc", &self.nfc)
            .field("splits", &self.splits.len())
            .field("merges", &self.merges.len())
            .field("ignore_merges", &self.whole.is_some())
            .finish()
    }
}

/// Per-call scratch space and the piece cache, behind the encoder's mutex.
#[derive(Default)]
struct State {
    cache: PieceCache,
    /// Search caches of the `Known` splitters, by level.
    regex: Vec<Option<regex_automata::meta::Cache>>,
    /// Piece boundaries of a `Known` split, by level.
    bounds: Vec<Vec<usize>>,
    syms: Vec<u32>,
    ranks: Vec<u64>,
    heap: Vec<HeapSym>,
    queue: BinaryHeap<Reverse<(u32, u32, u32)>>,
}

impl State {
    /// Scratch space kept between calls, in elements: a huge piece's is given back.
    const KEEP: usize = 4096;

    fn trim(&mut self) {
        self.syms.shrink_to(Self::KEEP);
        self.ranks.shrink_to(Self::KEEP);
        self.heap.shrink_to(Self::KEEP);
        if self.queue.capacity() > Self::KEEP {
            self.queue = BinaryHeap::new();
        }
        for b in &mut self.bounds {
            b.shrink_to(Self::KEEP);
        }
    }
}

/// Ids of recently seen pieces; cleared whole when full.
#[derive(Default)]
struct PieceCache {
    map: PieceMap<(u32, u32)>,
    ids: Vec<u32>,
}

impl PieceCache {
    fn get(&self, piece: &[u8]) -> Option<&[u32]> {
        let &(at, len) = self.map.get(piece)?;
        self.ids.get(at as usize..(at + len) as usize)
    }

    fn insert(&mut self, piece: &[u8], ids: &[u32]) {
        if self.map.len() >= CACHE_MAX_ENTRIES || self.ids.len() + ids.len() > CACHE_MAX_IDS {
            self.map.clear();
            self.ids.clear();
        }
        let at = self.ids.len() as u32;
        self.ids.extend_from_slice(ids);
        self.map.insert(piece.into(), (at, ids.len() as u32));
    }
}

/// A symbol of the heap algorithm: a linked list over the piece's initial symbols.
#[derive(Clone, Copy)]
struct HeapSym {
    id: u32,
    prev: u32,
    next: u32,
    alive: bool,
}

impl FastBpe {
    /// The fast encoder of `tokenizer` (loaded from `tokenizer_json`), or why there is none.
    pub fn new(tokenizer: &Tokenizer, tokenizer_json: &str) -> Result<FastBpe, Unsupported> {
        if tokenizer.get_truncation().is_some()
            || tokenizer.get_padding().is_some()
            || tokenizer.get_encode_special_tokens()
        {
            return Err(Unsupported::Options);
        }
        let nfc = normalizer(tokenizer)?;
        let splits = pre_tokenizer(tokenizer)?;
        let post = post_processor(tokenizer)?;
        let (added, added_text) = added_tokens(tokenizer)?;
        let ModelWrapper::BPE(bpe) = tokenizer.get_model() else {
            return Err(Unsupported::Model("not BPE".into()));
        };
        if !matches!(bpe.dropout, None | Some(0.0)) {
            return Err(Unsupported::Model("dropout".into()));
        }
        if bpe.continuing_subword_prefix.as_deref().is_some_and(|p| !p.is_empty())
            || bpe.end_of_word_suffix.as_deref().is_some_and(|s| !s.is_empty())
        {
            return Err(Unsupported::Model(
                "continuing_subword_prefix or end_of_word_suffix".into(),
            ));
        }
        if bpe.byte_fallback {
            return Err(Unsupported::Model("byte_fallback".into()));
        }
        let chars = byte_chars();
        let mut byte_ids = [NONE; 256];
        let mut buf = [0u8; 4];
        for (id, c) in byte_ids.iter_mut().zip(chars) {
            *id = bpe.token_to_id(c.encode_utf8(&mut buf)).unwrap_or(NONE);
        }
        if bpe.unk_token.is_some() && byte_ids.contains(&NONE) {
            return Err(Unsupported::Model(
                "unk_token with bytes missing from the vocabulary".into(),
            ));
        }
        // The merge loops tell a stale pair from a live one by the token it makes, as the
        // crate's does: exact when no two strings share an id.
        let vocab = bpe.get_vocab();
        let mut ids: Vec<u32> = vocab.values().copied().collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != vocab.len() {
            return Err(Unsupported::Model("two tokens share an id".into()));
        }
        drop(ids);
        let whole = bpe.ignore_merges.then(|| whole_pieces(vocab, &chars));
        let merges = merge_map(bpe, tokenizer_json)?;
        let fast = FastBpe {
            added,
            added_text,
            nfc,
            splits,
            byte_ids,
            merges,
            whole,
            post,
            state: Mutex::new(State::default()),
        };
        fast.probe(tokenizer)?;
        Ok(fast)
    }

    /// The ids of `text`, as `tokenizer.encode(text, add_special_tokens).get_ids()`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Vec<u32> {
        let mut guard = self.state.try_lock().ok();
        let mut local = None;
        let st: &mut State = match guard.as_deref_mut() {
            Some(st) => st,
            // Another thread holds the cache: encode without it.
            None => local.get_or_insert_with(State::default),
        };
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        match &self.added {
            Some((ac, ids)) => {
                let mut prev = 0;
                for m in ac.find_iter(text) {
                    if let Some(gap) = text.get(prev..m.start()) {
                        self.encode_gap(gap, st, &mut out);
                    }
                    if let Some(&id) = ids.get(m.pattern().as_usize()) {
                        out.push(id);
                    }
                    prev = m.end();
                }
                if let Some(gap) = text.get(prev..) {
                    self.encode_gap(gap, st, &mut out);
                }
            }
            None => self.encode_gap(text, st, &mut out),
        }
        st.trim();
        for template in &self.post {
            out = apply_template(template, out, add_special_tokens);
        }
        out
    }

    /// The text between two added tokens: normalized, pre-tokenized and merged.
    fn encode_gap(&self, gap: &str, st: &mut State, out: &mut Vec<u32>) {
        if gap.is_empty() {
            return;
        }
        let normalized = self.normalize(gap);
        self.split(0, &normalized, st, &mut |piece, st| {
            self.encode_piece(piece.as_bytes(), st, out)
        });
    }

    fn normalize<'a>(&self, s: &'a str) -> Cow<'a, str> {
        // No character below U+0300 is changed by NFC (their UTF-8 bytes are all below 0xCC).
        if !self.nfc || s.bytes().all(|b| b < 0xcc) || is_nfc_quick(s.chars()) == IsNormalized::Yes
        {
            return Cow::Borrowed(s);
        }
        Cow::Owned(s.nfc().map(|(c, _)| c).collect())
    }

    /// Calls `f` with each non-empty piece of `s` after the split steps from `level` on.
    fn split(&self, level: usize, s: &str, st: &mut State, f: &mut dyn FnMut(&str, &mut State)) {
        let Some(splitter) = self.splits.get(level) else {
            if !s.is_empty() {
                f(s, st);
            }
            return;
        };
        let fancy = match splitter {
            Splitter::Fancy(re) => re,
            Splitter::Known { re, fancy, ascii } => {
                if st.bounds.len() <= level {
                    st.bounds.resize_with(level + 1, Vec::new);
                    st.regex.resize_with(level + 1, || None);
                }
                let mut bounds = std::mem::take(&mut st.bounds[level]);
                let ok = if s.is_ascii() {
                    ascii.bounds(s.as_bytes(), &mut bounds);
                    true
                } else {
                    let cache = st.regex[level].get_or_insert_with(|| re.create_cache());
                    known_bounds(re, cache, *ascii, s, &mut bounds)
                };
                if ok {
                    let mut prev = 0;
                    for &end in &bounds {
                        self.split(level + 1, &s[prev..end], st, f);
                        prev = end;
                    }
                }
                st.bounds[level] = bounds;
                if ok {
                    return;
                }
                fancy
            }
        };
        let mut prev = 0;
        for m in fancy.find_iter(s) {
            // As the crate's `SysRegex`: an error (backtrack limit) ends the matches.
            let Ok(m) = m else { break };
            if m.start() > prev {
                self.split(level + 1, &s[prev..m.start()], st, f);
            }
            self.split(level + 1, m.as_str(), st, f);
            prev = m.end();
        }
        if prev < s.len() {
            self.split(level + 1, &s[prev..], st, f);
        }
    }

    fn encode_piece(&self, piece: &[u8], st: &mut State, out: &mut Vec<u32>) {
        if let Some(&id) = self.whole.as_ref().and_then(|w| w.get(piece)) {
            out.push(id);
            return;
        }
        if let [b] = piece {
            let id = self.byte_ids[usize::from(*b)];
            if id != NONE {
                out.push(id);
            }
            return;
        }
        let cacheable = piece.len() <= CACHE_MAX_PIECE;
        if cacheable {
            if let Some(ids) = st.cache.get(piece) {
                out.extend_from_slice(ids);
                return;
            }
        }
        let State { cache, syms, ranks, heap, queue, .. } = st;
        syms.clear();
        syms.extend(piece.iter().map(|&b| self.byte_ids[usize::from(b)]).filter(|&id| id != NONE));
        if syms.len() <= SCAN_MAX {
            self.merge_scan(syms, ranks);
        } else {
            self.merge_heap(syms, heap, queue);
        }
        out.extend_from_slice(syms);
        if cacheable {
            cache.insert(piece, syms);
        }
    }

    /// `rank << 32 | merged` of the pair, or [`NO_MERGE`].
    #[inline]
    fn merge_of(&self, left: u32, right: u32) -> u64 {
        self.merges.get(&pair_key(left, right)).copied().unwrap_or(NO_MERGE)
    }

    /// Merges the lowest-ranked pair, the leftmost among equals, until none is left: a scan
    /// of the pairs' ranks per merge, quadratic but allocation-free for short pieces.
    fn merge_scan(&self, syms: &mut Vec<u32>, ranks: &mut Vec<u64>) {
        if syms.len() < 2 {
            return;
        }
        ranks.clear();
        ranks.extend(syms.windows(2).map(|w| self.merge_of(w[0], w[1])));
        loop {
            let mut best = NO_MERGE;
            let mut at = 0;
            for (i, &r) in ranks.iter().enumerate() {
                if r < best {
                    best = r;
                    at = i;
                }
            }
            if best == NO_MERGE {
                return;
            }
            syms[at] = best as u32;
            syms.remove(at + 1);
            ranks.remove(at);
            if at > 0 {
                ranks[at - 1] = self.merge_of(syms[at - 1], syms[at]);
            }
            if at + 1 < syms.len() {
                ranks[at] = self.merge_of(syms[at], syms[at + 1]);
            }
        }
    }

    /// The crate's `Word::merge_all` without dropout: a min-heap of (rank, position) over a
    /// linked list of symbols; stale entries are skipped when popped.
    fn merge_heap(
        &self,
        syms: &mut Vec<u32>,
        heap: &mut Vec<HeapSym>,
        queue: &mut BinaryHeap<Reverse<(u32, u32, u32)>>,
    ) {
        let n = syms.len();
        heap.clear();
        heap.extend(syms.iter().enumerate().map(|(i, &id)| HeapSym {
            id,
            prev: if i == 0 { NONE } else { i as u32 - 1 },
            next: if i + 1 == n { NONE } else { i as u32 + 1 },
            alive: true,
        }));
        queue.clear();
        let push = |queue: &mut BinaryHeap<_>, pos: u32, m: u64| {
            if m != NO_MERGE {
                queue.push(Reverse(((m >> 32) as u32, pos, m as u32)));
            }
        };
        for (i, w) in syms.windows(2).enumerate() {
            push(queue, i as u32, self.merge_of(w[0], w[1]));
        }
        while let Some(Reverse((_, pos, merged))) = queue.pop() {
            let p = pos as usize;
            let Some(&cur) = heap.get(p) else { continue };
            if !cur.alive || cur.next == NONE {
                continue;
            }
            let right = heap[cur.next as usize];
            // Stale unless the pair there still merges into the same token (as the crate checks).
            let now = self.merge_of(cur.id, right.id);
            if now == NO_MERGE || now as u32 != merged {
                continue;
            }
            heap[cur.next as usize].alive = false;
            heap[p].id = merged;
            heap[p].next = right.next;
            if right.next != NONE {
                heap[right.next as usize].prev = pos;
            }
            if cur.prev != NONE {
                push(queue, cur.prev, self.merge_of(heap[cur.prev as usize].id, merged));
            }
            if right.next != NONE {
                push(queue, pos, self.merge_of(merged, heap[right.next as usize].id));
            }
        }
        syms.clear();
        let mut i = 0;
        while i != NONE as usize {
            let Some(s) = heap.get(i) else { break };
            syms.push(s.id);
            i = s.next as usize;
        }
    }

    /// Refuses the fast path if a probe text (every added token, words, numbers, whitespace
    /// runs, accents, CJK, emoji) encodes differently than with the crate.
    fn probe(&self, tokenizer: &Tokenizer) -> Result<(), Unsupported> {
        let mut text = String::from(PROBE);
        let mut added: Vec<_> = tokenizer.get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        for (_, t) in added {
            text.push_str(&t.content);
            text.push_str(" x\n");
        }
        for special in [false, true] {
            let want = tokenizer.encode(text.as_str(), special).map_err(|_| Unsupported::Probe)?;
            if self.encode(&text, special) != want.get_ids() {
                return Err(Unsupported::Probe);
            }
        }
        Ok(())
    }

    /// Empties the piece cache (benchmarks measure encodes without it).
    pub fn clear_cache(&self) {
        if let Ok(mut st) = self.state.try_lock() {
            st.cache.map.clear();
            st.cache.ids.clear();
        }
    }

    /// Heap bytes of the encoder's merge table (and `ignore_merges` table); not counting the
    /// piece cache (bounded by `CACHE_MAX_ENTRIES` and `CACHE_MAX_IDS`, under 1 MB), the
    /// compiled regexes or the added-token automaton.
    pub fn table_bytes(&self) -> usize {
        let merges = self.merges.capacity() * (16 + 1);
        let whole = self
            .whole
            .as_ref()
            .map_or(0, |w| w.capacity() * (16 + 4 + 1) + w.keys().map(|k| k.len()).sum::<usize>());
        merges + whole
    }
}

const PROBE: &str = "Hello, world! It's 2024-06-01: don't   stop\t\tnow.\r\n\n\n  naïve café \
     e\u{301} Å\u{30a} 日本語のテキスト 한국어 مرحبا 🦀👩\u{200d}💻 x=1+2; <|im_sta fn(){}\n";

fn apply_template(template: &[Part], ids: Vec<u32>, add_special_tokens: bool) -> Vec<u32> {
    if let [Part::Sequence] = template {
        return ids;
    }
    let mut out = Vec::with_capacity(ids.len() + 4);
    for part in template {
        match part {
            Part::Sequence => out.extend_from_slice(&ids),
            Part::Special(s) if add_special_tokens => out.extend_from_slice(s),
            Part::Special(_) => {}
        }
    }
    out
}

/// The end of every piece of `s` for a `Known` splitter (see there), gaps between matches
/// included; false if something unexpected happened. A piece whose bytes, and those read to
/// find it, are ASCII comes from the byte scanner (a match depends on nothing before its
/// start); the others from the regex engine.
fn known_bounds(
    re: &regex_automata::meta::Regex,
    cache: &mut regex_automata::meta::Cache,
    ascii: ascii::Known,
    s: &str,
    bounds: &mut Vec<usize>,
) -> bool {
    use regex_automata::{Anchored, Input};
    bounds.clear();
    let mut pos = 0;
    while pos < s.len() {
        let (end, read) = ascii.piece(s.as_bytes(), pos);
        if s.as_bytes()[pos..read].is_ascii() {
            bounds.push(end);
            pos = end;
            continue;
        }
        let input = Input::new(s).range(pos..).anchored(Anchored::Yes);
        let m = match re.search_with(cache, &input) {
            Some(m) => m,
            // No match starts here: the gap up to the next match is a piece.
            None => match re.search_with(cache, &Input::new(s).range(pos..)) {
                Some(m) => {
                    bounds.push(m.start());
                    m
                }
                None => {
                    bounds.push(s.len());
                    return true;
                }
            },
        };
        if m.is_empty() {
            return false;
        }
        let mut end = m.end();
        if m.pattern().as_usize() == 1 && end < s.len() {
            let run = &s[m.start()..end];
            let mut chars = run.chars();
            if let (Some(last), Some(_)) = (chars.next_back(), chars.next()) {
                end -= last.len_utf8();
            }
        }
        bounds.push(end);
        pos = end;
    }
    true
}

fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// GPT-2's map from bytes to printable characters (the crate's `bytes_char`).
fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0;
    for (b, c) in (0..=255u8).zip(out.iter_mut()) {
        *c = if matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff) {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
    }
    out
}

fn normalizer(tokenizer: &Tokenizer) -> Result<bool, Unsupported> {
    let v = serde_json::to_value(tokenizer.get_normalizer())
        .map_err(|e| Unsupported::Normalizer(e.to_string()))?;
    match &v {
        Value::Null => Ok(false),
        v if v.get("type").and_then(Value::as_str) == Some("NFC")
            && v.as_object().is_some_and(|o| o.len() == 1) =>
        {
            Ok(true)
        }
        v => Err(Unsupported::Normalizer(v.to_string())),
    }
}

fn pre_tokenizer(tokenizer: &Tokenizer) -> Result<Vec<Splitter>, Unsupported> {
    let v = serde_json::to_value(tokenizer.get_pre_tokenizer())
        .map_err(|e| Unsupported::PreTokenizer(e.to_string()))?;
    let mut steps = Vec::new();
    flatten_pre_tokenizers(&v, &mut steps);
    let bad = |v: &Value| Unsupported::PreTokenizer(v.to_string());
    let Some((last, splits)) = steps.split_last() else {
        return Err(bad(&v));
    };
    let is_false = |v: &Value, key: &str| v.get(key).and_then(Value::as_bool) == Some(false);
    if last.get("type").and_then(Value::as_str) != Some("ByteLevel")
        || !is_false(last, "add_prefix_space")
    {
        return Err(bad(last));
    }
    let use_regex = last.get("use_regex").and_then(Value::as_bool).ok_or_else(|| bad(last))?;
    let mut patterns = Vec::new();
    for s in splits {
        let pattern = s.get("pattern").and_then(|p| p.get("Regex")).and_then(Value::as_str);
        match pattern {
            Some(p)
                if s.get("type").and_then(Value::as_str) == Some("Split")
                    && s.get("behavior").and_then(Value::as_str) == Some("Isolated")
                    && is_false(s, "invert") =>
            {
                patterns.push(p)
            }
            _ => return Err(bad(s)),
        }
    }
    if use_regex {
        patterns.push(GPT2_PATTERN);
    }
    patterns.into_iter().map(splitter).collect()
}

fn splitter(pattern: &str) -> Result<Splitter, Unsupported> {
    let err = |e: &dyn std::fmt::Display| Unsupported::PreTokenizer(e.to_string());
    let fancy = Regex::new(pattern).map_err(|e| err(&e))?;
    let known = [
        (GPT2_PATTERN, ascii::Known::Gpt2),
        (QWEN2_PATTERN, ascii::Known::Qwen2),
        (LLAMA3_PATTERN, ascii::Known::Llama3),
    ]
    .into_iter()
    .find_map(|(p, k)| (p == pattern).then_some(k));
    match (pattern.strip_suffix(WHITESPACE_TAIL), known) {
        (Some(prefix), Some(ascii)) => {
            let re =
                regex_automata::meta::Regex::new_many(&[prefix, r"\s+"]).map_err(|e| err(&e))?;
            Ok(Splitter::Known { re, fancy, ascii })
        }
        _ => Ok(Splitter::Fancy(fancy)),
    }
}

/// The steps of a (possibly nested) `Sequence` pre-tokenizer, in order.
fn flatten_pre_tokenizers<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v.get("pretokenizers").and_then(Value::as_array) {
        Some(list) if v.get("type").and_then(Value::as_str) == Some("Sequence") => {
            for p in list {
                flatten_pre_tokenizers(p, out);
            }
        }
        _ => out.push(v),
    }
}

fn post_processor(tokenizer: &Tokenizer) -> Result<Vec<Vec<Part>>, Unsupported> {
    let v = serde_json::to_value(tokenizer.get_post_processor())
        .map_err(|e| Unsupported::PostProcessor(e.to_string()))?;
    let mut out = Vec::new();
    post_steps(&v, &mut out)?;
    Ok(out)
}

fn post_steps(v: &Value, out: &mut Vec<Vec<Part>>) -> Result<(), Unsupported> {
    let bad = || Unsupported::PostProcessor(v.to_string());
    match v.get("type").and_then(Value::as_str) {
        _ if v.is_null() => Ok(()),
        Some("ByteLevel") => Ok(()),
        Some("Sequence") => {
            let list = v.get("processors").and_then(Value::as_array).ok_or_else(bad)?;
            list.iter().try_for_each(|p| post_steps(p, out))
        }
        Some("TemplateProcessing") => {
            let single = v.get("single").and_then(Value::as_array).ok_or_else(bad)?;
            let specials = v.get("special_tokens").ok_or_else(bad)?;
            let mut parts = Vec::new();
            for piece in single {
                if let Some(seq) = piece.get("Sequence") {
                    if seq.get("id").and_then(Value::as_str) != Some("A") {
                        return Err(bad());
                    }
                    parts.push(Part::Sequence);
                } else {
                    let name = piece
                        .get("SpecialToken")
                        .and_then(|s| s.get("id"))
                        .and_then(Value::as_str)
                        .ok_or_else(bad)?;
                    let ids = specials
                        .get(name)
                        .and_then(|s| s.get("ids"))
                        .and_then(Value::as_array)
                        .ok_or_else(bad)?
                        .iter()
                        .map(|id| id.as_u64().and_then(|i| u32::try_from(i).ok()).ok_or_else(bad))
                        .collect::<Result<Vec<u32>, _>>()?;
                    parts.push(Part::Special(ids));
                }
            }
            out.push(parts);
            Ok(())
        }
        _ => Err(bad()),
    }
}

/// The added tokens as an automaton with their ids, and their texts.
type Added = (Option<(AhoCorasick, Vec<u32>)>, Vec<String>);

fn added_tokens(tokenizer: &Tokenizer) -> Result<Added, Unsupported> {
    let mut tokens: Vec<_> = tokenizer.get_added_tokens_decoder().into_iter().collect();
    tokens.sort_by_key(|(id, _)| *id);
    let mut seen = std::collections::HashSet::new();
    for (id, t) in &tokens {
        if t.normalized || t.lstrip || t.rstrip || t.single_word || t.content.is_empty() {
            return Err(Unsupported::AddedToken(format!("{:?}", t.content)));
        }
        if !seen.insert(t.content.as_str()) || tokenizer.token_to_id(&t.content) != Some(*id) {
            return Err(Unsupported::AddedToken(format!("{:?}: ambiguous id", t.content)));
        }
    }
    let (ids, text): (Vec<u32>, Vec<String>) =
        tokens.into_iter().map(|(id, t)| (id, t.content)).unzip();
    let ac = added_automaton(&text).map_err(Unsupported::AddedToken)?;
    Ok((ac.map(|ac| (ac, ids)), text))
}

/// The automaton that finds `tokens` in raw text as the crate does (leftmost-longest); none
/// for no tokens.
fn added_automaton(tokens: &[String]) -> Result<Option<AhoCorasick>, String> {
    if tokens.is_empty() {
        return Ok(None);
    }
    AhoCorasickBuilder::new()
        .match_kind(MatchKind::LeftmostLongest)
        .build(tokens)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// One entry of the `merges` list: `"a b"` or `["a", "b"]`.
enum MergeItem<'a> {
    Line(Cow<'a, str>),
    Pair(Cow<'a, str>, Cow<'a, str>),
}

impl<'de: 'a, 'a> Deserialize<'de> for MergeItem<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = MergeItem<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a merge: \"a b\" or [\"a\", \"b\"]")
            }

            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(MergeItem::Line(Cow::Borrowed(s)))
            }

            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(MergeItem::Line(Cow::Owned(s.to_owned())))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let missing = || serde::de::Error::custom("a merge pair has two strings");
                let a = seq.next_element::<CowStr<'a>>()?.ok_or_else(missing)?.0;
                let b = seq.next_element::<CowStr<'a>>()?.ok_or_else(missing)?.0;
                if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    return Err(missing());
                }
                Ok(MergeItem::Pair(a, b))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A string borrowed from the JSON text when it has no escapes.
struct CowStr<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for CowStr<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = CowStr<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Borrowed(s)))
            }

            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct JsonFile<'a> {
    #[serde(borrow)]
    model: JsonModel<'a>,
}

#[derive(Deserialize)]
struct JsonModel<'a> {
    #[serde(borrow)]
    merges: Vec<MergeItem<'a>>,
}

/// The merge table, ranked as the crate ranks it: by position in the list (legacy lines
/// starting with `#version` skipped), a pair listed twice keeping its last rank.
fn merge_map(
    bpe: &tokenizers::models::bpe::BPE,
    tokenizer_json: &str,
) -> Result<MergeMap, Unsupported> {
    let file: JsonFile =
        serde_json::from_str(tokenizer_json).map_err(|e| Unsupported::Json(e.to_string()))?;
    let items = file.model.merges;
    let legacy = items.iter().any(|m| matches!(m, MergeItem::Line(_)));
    if legacy && items.iter().any(|m| matches!(m, MergeItem::Pair(..))) {
        return Err(Unsupported::Json("merges mix strings and pairs".into()));
    }
    let mut map = MergeMap::with_capacity_and_hasher(items.len(), Default::default());
    let mut joined = String::new();
    let id = |s: &str| bpe.token_to_id(s).ok_or_else(|| Unsupported::Json(format!("merge {s:?}")));
    let pairs = items.iter().filter_map(|m| match m {
        MergeItem::Pair(a, b) => Some(Ok((a.as_ref(), b.as_ref()))),
        MergeItem::Line(l) if l.starts_with("#version") => None,
        MergeItem::Line(l) => {
            let mut parts = l.split(' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(b), None) => Some(Ok((a, b))),
                _ => Some(Err(Unsupported::Json(format!("merge line {l:?}")))),
            }
        }
    });
    for (rank, pair) in pairs.enumerate() {
        let (a, b) = pair?;
        joined.clear();
        joined.push_str(a);
        joined.push_str(b);
        let (left, right, new) = (id(a)?, id(b)?, id(&joined)?);
        let rank = u32::try_from(rank).map_err(|_| Unsupported::Json("too many merges".into()))?;
        map.insert(pair_key(left, right), (u64::from(rank) << 32) | u64::from(new));
    }
    map.shrink_to_fit();
    Ok(map)
}

/// `ignore_merges`: every vocabulary entry spelled in the byte alphabet, as bytes.
fn whole_pieces(vocab: HashMap<String, u32>, chars: &[char; 256]) -> PieceMap<u32> {
    let byte_of: HashMap<char, u8> = (0..=255u8).zip(chars.iter()).map(|(b, &c)| (c, b)).collect();
    vocab
        .into_iter()
        .filter_map(|(s, id)| {
            let bytes: Option<Vec<u8>> = s.chars().map(|c| byte_of.get(&c).copied()).collect();
            Some((bytes?.into_boxed_slice(), id))
        })
        .collect()
}

mod ascii;
pub mod compiled;
#[cfg(test)]
mod tests;
