//! The fast path equals the `tokenizers` crate, id for id, for both bundles (demo: ByteLevel
//! with GPT-2's regex, no normalizer, BOS template; Qwen3: NFC, a Split regex then ByteLevel,
//! special and non-special added tokens) on random texts; shapes it does not reproduce fall
//! back to the crate.

use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::decision::tokenize::model::shared_for_tests::{demo, qwen};
use crate::decision::tokenize::model::{ModelBundle, DEMO_TOKENIZER_CONFIG, DEMO_TOKENIZER_JSON};

fn fast(b: &ModelBundle) -> &FastBpe {
    b.fast_encoder().unwrap_or_else(|e| panic!("no fast encoder: {e}"))
}

/// The demo tokenizer.json with `edit` applied, as a bundle.
fn demo_edited(edit: impl FnOnce(&mut Value)) -> ModelBundle {
    let mut v: Value = serde_json::from_str(DEMO_TOKENIZER_JSON).unwrap();
    edit(&mut v);
    ModelBundle::from_hf(&v.to_string(), DEMO_TOKENIZER_CONFIG).unwrap()
}

fn same_as_crate(b: &ModelBundle, text: &str) -> Result<(), TestCaseError> {
    let f = fast(b);
    for special in [false, true] {
        let want = b.encode_with_crate(text, special).unwrap();
        prop_assert_eq!(f.encode(text, special), want, "special {} text {:?}", special, text);
    }
    Ok(())
}

/// Pieces of text: words, numbers, punctuation, whitespace runs, Latin accents and combining
/// marks (NFC composes them), Hangul jamo, CJK, RTL, emoji with ZWJ, any printable character,
/// both bundles' added tokens and parts of them, and long runs of one class.
fn piece() -> impl Strategy<Value = String> {
    let fixed = prop::sample::select(vec![
        "hello",
        " world",
        "The",
        " the",
        "don't",
        "I'M",
        "'s",
        "'ll",
        "42",
        "3.14",
        "1,000",
        "naïve",
        "café",
        "e\u{301}",
        "A\u{30a}",
        "\u{338}",
        ">\u{338}",
        "\u{1100}\u{1161}",
        "\u{1100}\u{1161}\u{11a8}",
        "한국어",
        "日本語",
        "中文",
        "مرحبا",
        "שלום",
        "🦀",
        "👩\u{200d}💻",
        "👨\u{200d}👩\u{200d}👧",
        "🏳\u{fe0f}\u{200d}🌈",
        "\u{a0}",
        "\u{3000}",
        "\u{2028}",
        "\u{feff}",
        " ",
        "  ",
        "   ",
        "\n",
        "\n\n",
        "\n\n\n\n",
        "\t",
        "\t\t",
        "\r\n",
        "\r",
        " \n ",
        "  \n",
        "\n ",
        ".",
        ",",
        "!",
        "?!",
        "...",
        "(",
        ")",
        "{\"a\": 1}",
        "<",
        ">",
        "|>",
        "<|",
        "Ω",
        "ﬁ",
        "Ⅻ",
        "½",
        "²",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<|fim_pad|>",
        "<|eot_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|im_sta",
        "<|im_start",
        "im_start|>",
        "<think",
        "<|begin_of_",
        "<<|im_end|>>",
        "<|im_start|><|im_end|>",
    ])
    .prop_map(str::to_owned);
    prop_oneof![
        20 => fixed,
        3 => "[a-zA-Z]{1,12}",
        2 => " [a-z]{1,10}",
        2 => "[0-9]{1,9}",
        2 => "[!-/:-@\\[-`{-~]{1,5}",
        3 => "[ \t\r\n]{1,12}",
        1 => "[a-zA-Z\u{c0}-\u{24f}][\u{300}-\u{36f}\u{1ab0}-\u{1aff}\u{20d0}-\u{20ff}]{1,3}",
        1 => "[\u{1100}-\u{1112}][\u{1161}-\u{1175}][\u{11a8}-\u{11c2}]?",
        2 => "[\u{4e00}-\u{9fff}\u{3040}-\u{30ff}\u{ac00}-\u{d7a3}]{1,8}",
        1 => "[\u{590}-\u{6ff}\u{750}-\u{77f}]{1,8}",
        1 => "[\u{1f300}-\u{1faff}][\u{200d}\u{fe0f}\u{1f3fb}-\u{1f3ff}]?[\u{1f300}-\u{1faff}]?",
        4 => "\\PC{1,6}",
        1 => "\\p{L}{1,6}",
        1 => "\\p{N}{1,4}",
        1 => "\\p{M}{1,3}",
        1 => "\\s{1,6}",
        1 => long_run(),
        2 => repeats(),
    ]
}

/// 1000+ characters of one kind: letters without spaces, spaces, newlines, digits,
/// punctuation, CJK, or a repeated short word without spaces.
fn long_run() -> impl Strategy<Value = String> {
    (0usize..8, 1000usize..1600, "[a-z]{1,4}").prop_map(|(kind, n, w)| match kind {
        0 => "abcdefghij".repeat(n / 10),
        1 => " ".repeat(n),
        2 => "\n".repeat(n),
        3 => "1234567890".repeat(n / 10),
        4 => "-=".repeat(n / 2),
        5 => "漢字".repeat(n / 2),
        6 => w.repeat(n / w.len()),
        _ => " \t".repeat(n / 2),
    })
}

/// A short unit repeated: pairs of equal rank side by side, where merging the leftmost first
/// matters ("aaa" is "aa"+"a", not "a"+"aa").
fn repeats() -> impl Strategy<Value = String> {
    ("[a-eA \n0.]{1,3}", 2usize..40).prop_map(|(u, n)| u.repeat(n))
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(piece(), 0..24).prop_map(|p| p.concat())
}

/// The end of every piece `fancy-regex` cuts `s` into, gaps between matches included.
fn fancy_bounds(fancy: &Regex, s: &str) -> Vec<usize> {
    let mut want = Vec::new();
    let mut prev = 0;
    for m in fancy.find_iter(s) {
        let m = m.unwrap();
        if m.start() > prev {
            want.push(m.start());
        }
        want.push(m.end());
        prev = m.end();
    }
    if prev < s.len() {
        want.push(s.len());
    }
    want
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn demo_fast_equals_crate(t in text()) {
        same_as_crate(demo(), &t)?;
    }

    #[test]
    fn qwen3_fast_equals_crate(t in text()) {
        same_as_crate(qwen(), &t)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The heap merge (pieces over SCAN_MAX symbols) and the scan merge agree on any piece.
    #[test]
    fn heap_and_scan_merges_agree(piece in prop_oneof!["[ a-z\n0-9]{2,300}", "\\PC{2,80}", repeats()]) {
        for b in [demo(), qwen()] {
            let f = fast(b);
            let syms: Vec<u32> =
                piece.bytes().map(|x| f.byte_ids[usize::from(x)]).filter(|&i| i != NONE).collect();
            let mut scan = syms.clone();
            f.merge_scan(&mut scan, &mut Vec::new());
            let mut heap = syms;
            f.merge_heap(&mut heap, &mut Vec::new(), &mut BinaryHeap::new());
            prop_assert_eq!(scan, heap, "{:?}", piece);
        }
    }

    /// The known patterns' splitter cuts every text where `fancy-regex` runs of the very
    /// pattern do.
    #[test]
    fn known_splitters_equal_fancy_regex(
        t in text(),
        ws in "[ \t\r\n\u{a0}\u{3000}\u{2028}\u{85}\u{b}\u{c}a1.'é]{0,40}",
        // ASCII runs with non-ASCII letters, digits, spaces and case folds of `s`/`k` between
        // them: where the byte scanner's pieces meet the regex engine's.
        mixed in "([ \t\r\nab1.,'sSlLrReE]{1,4}|é|\u{a0}|\u{3000}|\u{85}|²|٣|ſ|\u{212a}|—|日){0,40}",
    ) {
        for pattern in [GPT2_PATTERN, QWEN2_PATTERN, LLAMA3_PATTERN] {
            let Ok(Splitter::Known { re, fancy, ascii }) = splitter(pattern) else {
                panic!("{pattern} is known");
            };
            for s in [t.as_str(), ws.as_str(), mixed.as_str()] {
                let mut bounds = Vec::new();
                prop_assert!(known_bounds(&re, &mut re.create_cache(), ascii, s, &mut bounds));
                prop_assert_eq!(&bounds, &fancy_bounds(&fancy, s), "{} on {:?}", pattern, s);
            }
        }
    }

    /// On ASCII text the known patterns' byte scanner cuts where `fancy-regex` runs of the
    /// very pattern do.
    #[test]
    fn ascii_splitters_equal_fancy_regex(
        t in text().prop_map(|t| t.chars().filter(char::is_ascii).collect::<String>()),
        mixed in "([ \t\r\n\x0b\x0c\x1c\x1fa-zA-Z0-9.,!?'\"_-]|'[sStTmMdD]|'[rRvV][eE]|'[lL][lL]| [a-z]| [0-9]| [.!]){0,60}",
    ) {
        for pattern in [GPT2_PATTERN, QWEN2_PATTERN, LLAMA3_PATTERN] {
            let Ok(Splitter::Known { fancy, ascii, .. }) = splitter(pattern) else {
                panic!("{pattern} is known");
            };
            for s in [t.as_str(), mixed.as_str()] {
                let mut bounds = Vec::new();
                ascii.bounds(s.as_bytes(), &mut bounds);
                prop_assert_eq!(&bounds, &fancy_bounds(&fancy, s), "{} on {:?}", pattern, s);
            }
        }
    }

    /// Supported variants of the demo tokenizer: legacy "a b" merges, ignore_merges, NFC, a
    /// Sequence with a (fancy-regex) Split before ByteLevel, no post-processor, Llama 3's
    /// pattern.
    #[test]
    fn supported_variants_equal_crate(t in text()) {
        for b in variants() {
            same_as_crate(b, &t)?;
        }
    }

    /// The cache gives what a fresh encoder gives, however often a piece recurs.
    #[test]
    fn cache_hits_equal_fresh_encodes(words in prop::collection::vec(piece(), 1..40)) {
        let text = words.concat();
        for t in [text.clone(), text.clone(), text.repeat(3)] {
            same_as_crate(qwen(), &t)?;
        }
    }
}

fn variants() -> &'static [ModelBundle] {
    static V: OnceLock<Vec<ModelBundle>> = OnceLock::new();
    V.get_or_init(|| {
        let legacy = demo_edited(|v| {
            let merges = v["model"]["merges"].as_array().unwrap();
            let lines: Vec<Value> = merges
                .iter()
                .map(|m| Value::String(format!("{} {}", m[0].as_str().unwrap(), m[1].as_str().unwrap())))
                .collect();
            v["model"]["merges"] = Value::Array(lines);
        });
        let ignore = demo_edited(|v| v["model"]["ignore_merges"] = Value::Bool(true));
        let nfc = demo_edited(|v| v["normalizer"] = serde_json::json!({"type": "NFC"}));
        let split = demo_edited(|v| {
            v["pre_tokenizer"] = serde_json::json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
            ]})
        });
        let bare = demo_edited(|v| v["post_processor"] = Value::Null);
        let llama3 = demo_edited(|v| {
            v["pre_tokenizer"] = serde_json::json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
            ]})
        });
        let all = vec![legacy, ignore, nfc, split, bare, llama3];
        for b in &all {
            fast(b);
        }
        all
    })
}

#[test]
fn both_bundles_have_a_fast_encoder() {
    assert!(demo().fast_encoder().is_ok());
    assert!(qwen().fast_encoder().is_ok());
    // ModelBundle::encode goes through it.
    let text = "<|im_start|>user\nhello, wörld 日本 🦀<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(qwen().encode(text, false).unwrap(), qwen().encode_with_crate(text, false).unwrap());
    // Qwen3's ByteLevel post-processor adds nothing; the demo's template adds BOS.
    assert_eq!(qwen().encode("hi", true).unwrap(), qwen().encode("hi", false).unwrap());
    let with_bos = demo().encode("hi", true).unwrap();
    assert_eq!(with_bos[0], 0);
    assert_eq!(&with_bos[1..], &demo().encode("hi", false).unwrap()[..]);
}

#[test]
fn fixed_texts_equal_crate() {
    let long_word = "x".repeat(5000);
    let texts = [
        "",
        " ",
        "a",
        "\u{301}",
        "<|im_start|>",
        "<|im_start|><|im_start|>",
        "ab<|im_start|>cd",
        "e\u{301}<|im_end|>\u{301}",
        "Ḱ\u{323}\u{302}",
        "\u{1100}\u{1161}\u{11a8}",
        long_word.as_str(),
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "                                                                                    x",
        "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    ];
    for b in [demo(), qwen()] {
        for t in texts {
            same_as_crate(b, t).unwrap();
        }
    }
}

/// A shape the fast path does not reproduce has no fast encoder, and the bundle still
/// encodes with the crate.
#[test]
fn unsupported_shapes_fall_back_to_the_crate() {
    let cases: Vec<(&str, ModelBundle)> = vec![
        (
            "metaspace",
            demo_edited(
                |v| v["pre_tokenizer"] = serde_json::json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true}),
            ),
        ),
        ("byte_fallback", demo_edited(|v| v["model"]["byte_fallback"] = Value::Bool(true))),
        ("lstrip", demo_edited(|v| v["added_tokens"][2]["lstrip"] = Value::Bool(true))),
        ("normalized", demo_edited(|v| v["added_tokens"][2]["normalized"] = Value::Bool(true))),
        (
            "prefix space",
            demo_edited(|v| v["pre_tokenizer"]["add_prefix_space"] = Value::Bool(true)),
        ),
        ("lowercase", demo_edited(|v| v["normalizer"] = serde_json::json!({"type": "Lowercase"}))),
        ("dropout", demo_edited(|v| v["model"]["dropout"] = serde_json::json!(0.5))),
        (
            "bert post-processor",
            demo_edited(
                |v| v["post_processor"] = serde_json::json!({"type": "BertProcessing", "sep": ["<|eot_id|>", 4], "cls": ["<|begin_of_text|>", 0]}),
            ),
        ),
        (
            "truncation",
            demo_edited(
                |v| v["truncation"] = serde_json::json!({"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}),
            ),
        ),
    ];
    let text = "Hello world <|start_header_id|>user<|end_header_id|>\n\n  don't 42 ñ";
    for (name, b) in cases {
        assert!(b.fast_encoder().is_err(), "{name}: the fast path must refuse this shape");
        if name == "dropout" {
            continue; // random: no two encodes agree
        }
        for special in [false, true] {
            let want = b.tokenizer().unwrap().encode(text, special).unwrap().get_ids().to_vec();
            assert_eq!(b.encode(text, special).unwrap(), want, "{name}");
        }
    }
}

#[test]
fn refusals_say_why() {
    let b = demo_edited(|v| v["model"]["byte_fallback"] = Value::Bool(true));
    assert_eq!(b.fast_encoder().unwrap_err(), &Unsupported::Model("byte_fallback".into()));
    let b = demo_edited(|v| v["added_tokens"][0]["rstrip"] = Value::Bool(true));
    assert!(matches!(b.fast_encoder(), Err(Unsupported::AddedToken(_))));
}

/// The NFC shortcut (text left as is when the quick check says it is normalized) gives what
/// full NFC gives.
#[test]
fn nfc_shortcut_equals_full_nfc() {
    let f = fast(qwen());
    let full = |s: &str| -> String { s.nfc().map(|(c, _)| c).collect() };
    let marks = ['\u{301}', '\u{308}', '\u{323}', '\u{338}', '\u{3099}', '\u{1161}', '\u{11a8}'];
    for c in (0..0x11_0000u32).filter_map(char::from_u32) {
        let s = c.to_string();
        assert_eq!(f.normalize(&s), full(&s), "{:?}", c);
        for m in marks {
            let s = format!("{c}{m}");
            assert_eq!(f.normalize(&s), full(&s), "{:?}", s);
        }
    }
}

/// The bundle read back from `b`'s compiled encoder (no `tokenizers` model in it).
fn recompiled(b: &ModelBundle, config: &str) -> ModelBundle {
    let enc = b.compiled_encoder().expect("a fast encoder compiles");
    let c = ModelBundle::from_compiled(b.fingerprint(), &enc, config).unwrap();
    assert!(c.tokenizer().is_none());
    assert_eq!(c.compiled_encoder().unwrap(), enc, "writing is deterministic and lossless");
    assert_eq!(c.cuts(), b.cuts());
    assert_eq!(c.fingerprint(), b.fingerprint());
    c
}

fn compiled_bundles() -> &'static [(ModelBundle, ModelBundle)] {
    static V: OnceLock<Vec<(ModelBundle, ModelBundle)>> = OnceLock::new();
    V.get_or_init(|| {
        let qwen_cfg = std::fs::read_to_string(
            crate::decision::tokenize::model::qwen3_dir().join("tokenizer_config.json"),
        )
        .unwrap();
        let mut all = vec![
            (demo().clone(), recompiled(demo(), DEMO_TOKENIZER_CONFIG)),
            (qwen().clone(), recompiled(qwen(), &qwen_cfg)),
        ];
        for b in variants() {
            all.push((b.clone(), recompiled(b, DEMO_TOKENIZER_CONFIG)));
        }
        all
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// A bundle read from its compiled encoder encodes as the crate does, for both bundles and
    /// every supported variant (ignore_merges, legacy merges, NFC, fancy Split, no template).
    #[test]
    fn compiled_encoders_equal_crate(t in text()) {
        for (from_files, compiled) in compiled_bundles() {
            for special in [false, true] {
                let want = from_files.encode_with_crate(&t, special).unwrap();
                prop_assert_eq!(compiled.encode(&t, special).unwrap(), want);
            }
        }
    }
}

#[test]
fn compiled_encoder_golden_and_corruptions() {
    let enc = demo().compiled_encoder().unwrap();
    // Pinned: a change of layout or of what is written shows here.
    assert_eq!(&enc[..6], b"KVFB\x01\x00");
    assert_eq!((enc.len(), xxhash_rust::xxh3::xxh3_64(&enc)), (25_247, 0xa787_7c4e_59fd_54b8));
    let read = |b: &[u8]| ModelBundle::from_compiled(1, b, DEMO_TOKENIZER_CONFIG);
    // Every cut in the header, then a stride through the tables (each read compiles the
    // regexes again: every cut would take a minute).
    for cut in (0..256).chain((256..enc.len()).step_by(37)) {
        assert!(read(&enc[..cut]).is_err(), "cut at {cut}");
    }
    let mut longer = enc.clone();
    longer.push(0);
    assert!(read(&longer).is_err(), "trailing bytes");
    let mut format = enc.clone();
    format[4] = 9;
    assert!(read(&format).unwrap_err().to_string().contains("format 9"));
    let c = read(&enc).unwrap();
    assert!(c.decode(&[1, 2]).is_err(), "no tokenizers model to decode with");
    assert!(c.encode_with_crate("hi", false).is_err());
}
