use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::{json, Value};

use super::*;
use crate::decision::tokenize::model::{DEMO_TOKENIZER_CONFIG, DEMO_TOKENIZER_JSON};
use crate::shared::fake::MemStore;

/// A demo-tokenizer bundle; `variant` changes its chat template (and so its fingerprint),
/// `pad` appends whitespace to `tokenizer_config.json` (same fingerprint, more parts).
fn files(variant: &str, pad: usize) -> BundleBlob {
    let mut cfg: Value = serde_json::from_str(DEMO_TOKENIZER_CONFIG).unwrap();
    let t = cfg["chat_template"].as_str().unwrap().to_string();
    cfg["chat_template"] = json!(format!("{t}{{# {variant} #}}"));
    let mut cfg = cfg.to_string().into_bytes();
    cfg.resize(cfg.len() + pad, b' ');
    BundleBlob::Files(crate::wire::bundle::BundleFiles {
        tokenizer_json: DEMO_TOKENIZER_JSON.as_bytes().to_vec(),
        tokenizer_config_json: cfg,
    })
}

/// Fingerprints of built bundles, by encoding (building a tokenizer is the slow part).
fn fingerprint(f: &BundleBlob) -> Result<u64, String> {
    static CACHE: OnceLock<std::sync::Mutex<HashMap<u64, u64>>> = OnceLock::new();
    let key = xxhash_rust::xxh3::xxh3_64(&f.encode());
    let cache = CACHE.get_or_init(Default::default);
    if let Some(fp) = cache.lock().unwrap().get(&key) {
        return Ok(*fp);
    }
    let fp = build(f)?.fingerprint();
    cache.lock().unwrap().insert(key, fp);
    Ok(fp)
}

/// A bundle as the updater serves it.
struct Served {
    model: String,
    fingerprint: u64,
    encoded: Vec<u8>,
}

impl Served {
    fn new(model: &str, f: &BundleBlob) -> Served {
        Served { model: model.into(), fingerprint: fingerprint(f).unwrap(), encoded: f.encode() }
    }

    fn listed(&self) -> Listed {
        Listed {
            model: self.model.clone(),
            fingerprint: self.fingerprint,
            parts: part_count(self.encoded.len()) as u32,
            bytes: self.encoded.len() as u64,
        }
    }

    fn parts(&self) -> String {
        part_count(self.encoded.len()).to_string()
    }
}

/// Changes an answer: status, parts header, body.
type Tamper = Box<dyn FnMut(PartRequest, &mut u16, &mut Option<String>, &mut Vec<u8>)>;

/// A fake updater: answers part requests from `served`, with an optional tamperer.
struct Updater {
    served: Vec<Served>,
    tamper: Tamper,
}

impl Updater {
    fn new(served: Vec<Served>) -> Updater {
        Updater { served, tamper: Box::new(|_, _, _, _| {}) }
    }

    fn list(&self) -> Vec<Listed> {
        let mut l: Vec<Listed> = self.served.iter().map(Served::listed).collect();
        l.sort_by(|a, b| a.model.cmp(&b.model));
        l
    }

    fn answer(&mut self, req: PartRequest) -> (u16, Option<String>, Vec<u8>) {
        let found = self.served.iter().find(|s| s.fingerprint == req.fingerprint);
        let (mut status, mut header, mut body) = match found {
            Some(s) => match crate::wire::bundle::part(&s.encoded, req.part as usize) {
                Some(p) => (200, Some(s.parts()), p.to_vec()),
                None => (404, None, Vec::new()),
            },
            None => (404, None, Vec::new()),
        };
        (self.tamper)(req, &mut status, &mut header, &mut body);
        (status, header, body)
    }
}

/// Runs the fetcher against `u` until it has nothing more to ask; returns every outcome.
fn drive(
    f: &mut Fetcher,
    store: &MemStore,
    u: &mut Updater,
    now: u64,
) -> Vec<Result<Progress, FetchError>> {
    let mut out = Vec::new();
    for _ in 0..200 {
        let (req, _) = f.next(store, now);
        let Some(req) = req else { return out };
        let (status, header, body) = u.answer(req);
        let mut verify = |blob: &BundleBlob| fingerprint(blob);
        out.push(f.received(
            store,
            req,
            status,
            header.as_deref().map(str::as_bytes),
            &body,
            now,
            &mut verify,
        ));
    }
    panic!("the fetcher never settled");
}

fn limits() -> BundleLimits {
    BundleLimits { grace_ms: 1_000, retry_min_ms: 100, retry_max_ms: 400, ..Default::default() }
}

fn model(name: &str, bundle: &str) -> ModelConfig {
    serde_json::from_value(json!({"name": name, "workers": ["127.0.0.1:1"], "bundle": bundle}))
        .unwrap()
}

fn non_empty_parts(store: &MemStore) -> Vec<String> {
    store
        .keys()
        .into_iter()
        .filter(|k| {
            k.starts_with("kvroute.bundle.") && store.get(k).0.is_some_and(|v| !v.is_empty())
        })
        .collect()
}

#[test]
fn manifest_round_trips_and_rejects_garbage() {
    crate::conformance::shared_data::manifest_round_trips_and_rejects_garbage();
}

#[test]
fn bundle_sizes_past_4_gib_are_refused() {
    crate::conformance::shared_data::bundle_sizes_past_4_gib_are_refused();
}

#[test]
fn the_updater_list_is_parsed_and_bad_entries_left_out() {
    let body = json!({"bundles": [
        {"model": "qwen3", "fingerprint": "00000000000000ab", "parts": 2, "bytes": PART_BYTES + 1, "block_size": 16},
        {"model": "demo", "fingerprint": "not-hex", "parts": 1, "bytes": 10},
        {"model": "big", "fingerprint": "00000000000000cd", "parts": 1, "bytes": PART_BYTES + 1},
        {"model": "qwen3", "fingerprint": "00000000000000ef", "parts": 1, "bytes": 10},
        {"model": "a", "fingerprint": "00000000000000EF", "parts": 1, "bytes": 10},
    ]});
    let (list, bad) = parse_list(body.to_string().as_bytes()).unwrap();
    assert_eq!(bad, 3);
    assert_eq!(list.iter().map(|l| l.model.as_str()).collect::<Vec<_>>(), ["a", "qwen3"]);
    assert_eq!(list[1].fingerprint, 0xab);
    assert!(parse_list(b"{").is_err());
    let many: Vec<Value> = (0..=MAX_MODELS)
        .map(|i| json!({"model": format!("m{i}"), "fingerprint": "0000000000000001", "parts": 1, "bytes": 1}))
        .collect();
    let too_many = json!({"bundles": many}).to_string();
    assert_eq!(parse_list(too_many.as_bytes()), Err(ListError::TooMany(MAX_MODELS + 1)));
}

#[test]
fn a_bundle_is_fetched_part_by_part_then_published_and_built_by_threads() {
    let store = MemStore::new();
    let demo = Served::new("demo", &files("a", 2 * PART_BYTES + 100));
    assert_eq!(demo.parts(), "3");
    let mut u = Updater::new(vec![demo]);
    let mut thread = BundleFollower::new(&[model("demo", "updater")]);
    assert!(thread.tick(&store, 0).changed.is_empty(), "nothing published yet");
    let mut f = Fetcher::new(limits(), &store);
    f.set_wanted(&store, u.list());
    // One part per call: the first answer only stores, nothing is published.
    let (req, _) = f.next(&store, 0);
    let req = req.unwrap();
    assert_eq!(req, PartRequest { fingerprint: u.served[0].fingerprint, part: 0 });
    assert_eq!(f.next(&store, 0).0, None, "one part in flight at a time");
    let (s, h, b) = u.answer(req);
    let r = f.received(&store, req, s, h.as_deref().map(str::as_bytes), &b, 0, &mut fingerprint);
    assert_eq!(r, Ok(Progress::Stored));
    assert_eq!(read_manifest(&store), None, "published before every part arrived");
    let rest = drive(&mut f, &store, &mut u, 0);
    let fp = u.served[0].fingerprint;
    assert_eq!(
        rest.last().unwrap().as_ref().unwrap(),
        &Progress::Published {
            fingerprint: fp,
            models: vec!["demo".into()],
            bytes: u.served[0].encoded.len() as u64
        }
    );
    let m = read_manifest(&store).unwrap();
    assert_eq!(m.model("demo").map(|p| (p.fingerprint, p.parts)), Some((fp, 3)));
    assert_eq!(non_empty_parts(&store).len(), 3);
    // A thread builds it on its tick, once.
    let t = thread.tick(&store, 0);
    assert_eq!(t.built.map(|b| b.0), Some(fp));
    assert_eq!(t.changed.len(), 1);
    assert_eq!(t.changed[0].1.as_ref().map(ModelBundle::fingerprint), Some(fp));
    assert_eq!(thread.ready(), 1);
    assert!(thread.tick(&store, 1).changed.is_empty() && thread.tick(&store, 1).built.is_none());
    // A pinned model takes only its fingerprint; the demo's built-in and inline sources are
    // not followed at all.
    let mut pinned = BundleFollower::new(&[model("demo", &format!("{fp:016x}"))]);
    assert_eq!(pinned.tick(&store, 0).changed.len(), 1);
    let mut other = BundleFollower::new(&[model("demo", "00000000000000ff")]);
    assert!(other.tick(&store, 0).changed.is_empty());
    let demo_cfg: ModelConfig =
        serde_json::from_value(json!({"name": "demo", "workers": ["127.0.0.1:1"]})).unwrap();
    assert!(BundleFollower::new(&[demo_cfg]).is_empty());
}

/// The demo bundle in its compiled form, as the updater serves it, with `fingerprint`.
fn compiled(fingerprint: u64) -> BundleBlob {
    let b = ModelBundle::demo().unwrap();
    BundleBlob::Compiled(crate::wire::bundle::CompiledBundle {
        fingerprint,
        encoder: b.compiled_encoder().unwrap(),
        tokenizer_config_json: DEMO_TOKENIZER_CONFIG.as_bytes().to_vec(),
    })
}

#[test]
fn a_compiled_bundle_is_published_and_threads_build_it_without_the_tokenizers_model() {
    let store = MemStore::new();
    let want = ModelBundle::demo().unwrap();
    let fp = want.fingerprint();
    let mut u = Updater::new(vec![Served::new("demo", &compiled(fp))]);
    let mut f = Fetcher::new(limits(), &store);
    f.set_wanted(&store, u.list());
    let out = drive(&mut f, &store, &mut u, 0);
    assert!(matches!(out.last(), Some(Ok(Progress::Published { .. }))), "{out:?}");
    let mut thread = BundleFollower::new(&[model("demo", "updater")]);
    let t = thread.tick(&store, 0);
    assert_eq!(t.built.map(|b| b.0), Some(fp));
    let built = t.changed[0].1.clone().unwrap();
    assert!(built.tokenizer().is_none());
    let text = "<|start_header_id|>user<|end_header_id|>\n\nhello there, wörld 🦀<|eot_id|>";
    assert_eq!(built.encode(text, false).unwrap(), want.encode(text, false).unwrap());
    assert_eq!(built.cuts(), want.cuts());
}

#[test]
fn a_compiled_bundle_that_names_another_fingerprint_is_refused_by_the_singleton() {
    // The singleton does not build bundles; a compiled one names its fingerprint, which must
    // be the one the updater listed (the check `flow::sync` makes without building).
    let store = MemStore::new();
    let fp = ModelBundle::demo().unwrap().fingerprint();
    let mut u = Updater::new(vec![Served::new("demo", &compiled(fp ^ 1))]);
    u.served[0].fingerprint = fp;
    let mut f = Fetcher::new(limits(), &store);
    f.set_wanted(&store, u.list());
    let (req, _) = f.next(&store, 0);
    let req = req.unwrap();
    let (s, h, b) = u.answer(req);
    let mut named = |blob: &BundleBlob| Ok(stated_fingerprint(blob, req.fingerprint));
    let r = f.received(&store, req, s, h.as_deref().map(str::as_bytes), &b, 0, &mut named);
    assert_eq!(r, Err(FetchError::Fingerprint { expected: fp, got: fp ^ 1 }));
    assert_eq!(read_manifest(&store), None);
}

#[test]
fn bad_or_partial_downloads_are_retried_with_backoff_and_never_published() {
    let store = MemStore::new();
    let served = Served::new("demo", &files("a", PART_BYTES + 10));
    let fp = served.fingerprint;
    let mut u = Updater::new(vec![served]);
    let mut f = Fetcher::new(limits(), &store);
    f.set_wanted(&store, u.list());
    let tail = u.served[0].encoded.len() - PART_BYTES;
    let cases: Vec<(Tamper, FetchError)> = vec![
        (
            Box::new(|r, _, _, b| {
                if r.part == 1 {
                    b.pop();
                }
            }),
            FetchError::PartSize { part: 1, got: tail - 1, expected: tail },
        ),
        (
            Box::new(|r, _, _, b| {
                if r.part == 1 {
                    b[0] ^= 1;
                }
            }),
            FetchError::Decode(BundleError::Checksum),
        ),
        (
            Box::new(|r, s, _, _| {
                if r.part == 1 {
                    *s = 503;
                }
            }),
            FetchError::Status(503),
        ),
        (
            Box::new(|r, s, _, _| {
                if r.part == 0 {
                    *s = 0;
                }
            }),
            FetchError::NoAnswer,
        ),
        (Box::new(|_, _, h, _| *h = Some("7".into())), FetchError::PartsHeader),
        (Box::new(|_, _, h, _| *h = None), FetchError::PartsHeader),
    ];
    let mut now = 0;
    for (i, (tamper, want)) in cases.into_iter().enumerate() {
        u.tamper = tamper;
        let out = drive(&mut f, &store, &mut u, now);
        assert_eq!(out.last(), Some(&Err(want)), "case {i}");
        assert_eq!(read_manifest(&store), None, "case {i}: a bad download was published");
        assert!(non_empty_parts(&store).is_empty(), "case {i}: parts of a bad download kept");
        // Backing off: nothing is asked until the wait is over, and the wait doubles.
        let wait = (100u64 << i).min(400);
        assert_eq!(f.next(&store, now).0, None, "case {i}");
        assert_eq!(f.next(&store, now + wait - 1).0, None, "case {i}");
        // The request made when the wait is over is the next case's first.
        now += wait;
    }
    u.tamper = Box::new(|_, _, _, _| {});
    let out = drive(&mut f, &store, &mut u, now);
    assert!(matches!(out.last(), Some(Ok(Progress::Published { .. }))), "{out:?}");
    assert_eq!(read_manifest(&store).unwrap().model("demo").unwrap().fingerprint, fp);
}

#[test]
fn a_bundle_that_is_not_what_the_updater_named_is_refused() {
    let store = MemStore::new();
    let mut served = Served::new("demo", &files("a", 0));
    served.fingerprint ^= 1;
    let mut u = Updater::new(vec![served]);
    let mut f = Fetcher::new(limits(), &store);
    f.set_wanted(&store, u.list());
    let out = drive(&mut f, &store, &mut u, 0);
    assert!(matches!(out.last(), Some(Err(FetchError::Fingerprint { .. }))), "{out:?}");
    assert_eq!(read_manifest(&store), None);
    // A shared-data failure is a failed download too.
    let store = MemStore::new();
    store.fail_every(1);
    let mut u = Updater::new(vec![Served::new("demo", &files("a", 0))]);
    let mut f = Fetcher::new(limits(), &store);
    f.set_wanted(&store, u.list());
    assert_eq!(drive(&mut f, &store, &mut u, 0).last(), Some(&Err(FetchError::Store)));
}

#[test]
fn a_new_bundle_replaces_the_old_which_is_removed_after_the_grace_period() {
    let store = MemStore::new();
    let a = Served::new("demo", &files("a", 0));
    let b = Served::new("demo", &files("b", 0));
    let (fa, fb) = (a.fingerprint, b.fingerprint);
    assert_ne!(fa, fb);
    let mut f = Fetcher::new(limits(), &store);
    let mut thread = BundleFollower::new(&[model("demo", "updater")]);
    let mut pinned = BundleFollower::new(&[model("demo", &format!("{fa:016x}"))]);
    let mut u = Updater::new(vec![a]);
    f.set_wanted(&store, u.list());
    drive(&mut f, &store, &mut u, 0);
    assert_eq!(thread.tick(&store, 0).changed[0].1.as_ref().unwrap().fingerprint(), fa);
    assert_eq!(pinned.tick(&store, 0).changed.len(), 1);
    // The updater restarts with another bundle for the model.
    u.served = vec![b];
    f.set_wanted(&store, u.list());
    let (req, _) = f.next(&store, 10);
    assert_eq!(req.map(|r| r.fingerprint), Some(fb));
    assert_eq!(read_manifest(&store).unwrap().model("demo").unwrap().fingerprint, fa);
    let (s, h, body) = u.answer(req.unwrap());
    let r = f.received(
        &store,
        req.unwrap(),
        s,
        h.as_deref().map(str::as_bytes),
        &body,
        10,
        &mut fingerprint,
    );
    assert!(matches!(r, Ok(Progress::Published { fingerprint, .. }) if fingerprint == fb));
    let m = read_manifest(&store).unwrap();
    assert_eq!(m.model("demo").unwrap().fingerprint, fb);
    assert_eq!(m.retired.iter().map(|r| r.fingerprint).collect::<Vec<_>>(), [fa]);
    // Threads switch once built; a model pinned to the old one loses it.
    let t = thread.tick(&store, 20);
    assert_eq!(t.changed.len(), 1);
    assert_eq!(t.changed[0].1.as_ref().unwrap().fingerprint(), fb);
    let p = pinned.tick(&store, 20);
    assert_eq!(p.changed.len(), 1);
    assert!(p.changed[0].1.is_none());
    // The old parts stay readable for the grace period, then are blanked.
    assert!(read_parts(&store, fa, 1, served_len(&m, fa)).is_some());
    f.next(&store, 10 + 999);
    assert!(non_empty_parts(&store).iter().any(|k| k.contains(&format!("{fa:016x}"))));
    let (_, hk) = f.next(&store, 10 + 1_000);
    assert_eq!(hk.removed, 1);
    let m = read_manifest(&store).unwrap();
    assert!(m.retired.is_empty());
    let left = non_empty_parts(&store);
    assert!(left.iter().all(|k| k.contains(&format!("{fb:016x}"))), "{left:?}");
    // The updater going back to the old bundle is a new download (it was removed).
    u.served = vec![Served::new("demo", &files("a", 0))];
    f.set_wanted(&store, u.list());
    let out = drive(&mut f, &store, &mut u, 2_000);
    assert!(matches!(out.last(), Some(Ok(Progress::Published { .. }))));
    assert_eq!(read_manifest(&store).unwrap().model("demo").unwrap().fingerprint, fa);
}

fn served_len(m: &Manifest, fp: u64) -> u64 {
    m.stored().get(&fp).map_or(0, |(_, b)| *b)
}

#[test]
fn models_sharing_a_bundle_store_it_once_and_bounds_hold() {
    let store = MemStore::new();
    let a = Served::new("m1", &files("a", 0));
    let a2 = Served::new("m2", &files("a", 0));
    let b = Served::new("m3", &files("b", 0));
    let c = Served::new("m4", &files("c", 0));
    let mut u = Updater::new(vec![a, a2, b, c]);
    let lim = BundleLimits { max_bundles: 2, ..limits() };
    let mut f = Fetcher::new(lim, &store);
    f.set_wanted(&store, u.list());
    let out = drive(&mut f, &store, &mut u, 0);
    let published = out.iter().filter(|r| matches!(r, Ok(Progress::Published { .. }))).count();
    assert_eq!(published, 2, "{out:?}");
    let m = read_manifest(&store).unwrap();
    assert_eq!(m.models.iter().map(|p| p.model.as_str()).collect::<Vec<_>>(), ["m1", "m2", "m3"]);
    assert_eq!(m.stored().len(), 2);
    assert_eq!(f.next(&store, 0).1.capped, 0, "a capped bundle is counted once");
    // A byte budget too small for anything more leaves the rest out as well.
    let store = MemStore::new();
    let one = u.served[0].encoded.len() as u64;
    let mut f = Fetcher::new(BundleLimits { max_total_bytes: one, ..limits() }, &store);
    f.set_wanted(&store, u.list());
    drive(&mut f, &store, &mut u, 0);
    assert_eq!(read_manifest(&store).unwrap().stored().len(), 1);
    assert_eq!(f.next(&store, 0), (None, Housekeeping::default()));
}

#[test]
fn a_restarted_singleton_keeps_what_was_published_and_late_answers_are_ignored() {
    let store = MemStore::new();
    let mut u = Updater::new(vec![Served::new("demo", &files("a", 0))]);
    let mut f = Fetcher::new(limits(), &store);
    f.set_wanted(&store, u.list());
    drive(&mut f, &store, &mut u, 0);
    let mut again = Fetcher::new(limits(), &store);
    again.set_wanted(&store, u.list());
    assert_eq!(again.next(&store, 0).0, None, "nothing to fetch again");
    assert!(again.knows(u.served[0].fingerprint));
    let stray = PartRequest { fingerprint: 1, part: 0 };
    let r = again.received(&store, stray, 200, Some(b"1"), b"x", 0, &mut fingerprint);
    assert_eq!(r, Ok(Progress::Ignored));
    // A download whose bundle left the list is dropped, its parts blanked.
    let store = MemStore::new();
    let mut u = Updater::new(vec![Served::new("demo", &files("a", PART_BYTES))]);
    let mut f = Fetcher::new(limits(), &store);
    f.set_wanted(&store, u.list());
    let req = f.next(&store, 0).0.unwrap();
    let (s, h, body) = u.answer(req);
    f.received(&store, req, s, h.as_deref().map(str::as_bytes), &body, 0, &mut fingerprint)
        .unwrap();
    assert_eq!(non_empty_parts(&store).len(), 1);
    f.set_wanted(&store, Vec::new());
    assert!(non_empty_parts(&store).is_empty());
    assert_eq!(f.next(&store, 0).0, None);
}

#[test]
fn a_thread_that_cannot_build_keeps_its_bundle_and_backs_off() {
    let store = MemStore::new();
    let mut u = Updater::new(vec![Served::new("demo", &files("a", 0))]);
    let mut f = Fetcher::new(limits(), &store);
    f.set_wanted(&store, u.list());
    drive(&mut f, &store, &mut u, 0);
    let fa = u.served[0].fingerprint;
    let mut thread = BundleFollower::new(&[model("demo", "updater")]);
    assert_eq!(thread.tick(&store, 0).changed.len(), 1);
    // The manifest names a bundle whose parts are gone (a lost write, a race with removal).
    let mut m = read_manifest(&store).unwrap();
    m.models[0].fingerprint = 0x1234;
    m.retired.clear();
    store.poke(MANIFEST_KEY, &m.encode());
    let t = thread.tick(&store, 10);
    assert_eq!(t.failed.as_ref().map(|f| f.0), Some(0x1234));
    assert!(t.changed.is_empty(), "the model keeps the bundle it has");
    assert!(thread.tick(&store, 11).failed.is_none(), "backing off");
    assert!(thread.tick(&store, 10 + 2_000).failed.is_some());
    // A corrupt manifest changes nothing.
    store.poke(MANIFEST_KEY, b"garbage");
    assert!(thread.tick(&store, 10_000).changed.is_empty());
    // A thread that starts now finds no bundle for the model.
    let mut fresh = BundleFollower::new(&[model("demo", "updater")]);
    store.poke(MANIFEST_KEY, &m.encode());
    assert!(fresh.tick(&store, 0).changed.is_empty());
    assert_eq!(fresh.ready(), 0);
    assert_ne!(fa, 0x1234);
}
