//! What Envoy threads share through shared data, pinned: bundle files (golden bytes), the bundle
//! manifest and the snapshot head (round trips, every truncation refused), the calibration
//! state (golden bytes, floats included), and bundle sizes past 4 GiB refused before a 32-bit
//! `usize` could truncate them.

use crate::decision::calib::estimator::{ModelState, PriorityPromise, WorkerDev, INITIAL_SCALE};
use crate::decision::cost::Profile;
use crate::shared::bundles::{
    parse_list, read_parts, Manifest, ManifestError, PublishedBundle, Retired,
};
use crate::shared::fake::MemStore;
use crate::shared::knowledge::Head;
use crate::wire::bundle::{BundleFiles, MAX_BUNDLE_BYTES};

/// The bundle files of the golden bytes.
pub fn bundle_files_sample() -> BundleFiles {
    BundleFiles { tokenizer_json: b"{\"a\":1}".to_vec(), tokenizer_config_json: b"{}".to_vec() }
}

pub fn bundle_files_golden() {
    let enc = bundle_files_sample().encode();
    assert_eq!(&enc[..5], b"KVRB\x01");
    assert_eq!(&enc[5..9], &7u32.to_le_bytes());
    assert_eq!(enc.len(), 5 + 4 + 7 + 4 + 2 + 8);
    assert_eq!(BundleFiles::decode(&enc), Ok(bundle_files_sample()));
}

/// The manifest of the round trip.
pub fn manifest_sample() -> Manifest {
    Manifest {
        generation: 7,
        models: vec![PublishedBundle {
            model: "qwen3".into(),
            fingerprint: 0xabc,
            parts: 11,
            bytes: 11 << 20,
        }],
        retired: vec![Retired { fingerprint: 0xdef, parts: 1, bytes: 10, since_ms: 5 }],
    }
}

pub fn manifest_round_trips_and_rejects_garbage() {
    let m = manifest_sample();
    let enc = m.encode();
    assert_eq!(&enc[..5], b"KVRM\x01");
    assert_eq!(Manifest::decode(&enc), Ok(m.clone()));
    for cut in 0..enc.len() {
        assert!(Manifest::decode(&enc[..cut]).is_err(), "cut at {cut}");
    }
    let mut longer = enc.clone();
    longer.push(0);
    assert_eq!(Manifest::decode(&longer), Err(ManifestError::Trailing));
    let mut bad_size = m.clone();
    bad_size.models[0].parts = 3;
    assert!(Manifest::decode(&bad_size.encode()).is_err(), "parts must fit bytes");
    assert_eq!(m.stored_bytes(), (11 << 20) + 10);
}

/// A bundle of 4 GiB + 10 bytes in one part: a 32-bit `usize` truncates its size to 10 bytes,
/// which one part does hold. The manifest, the updater's list and the part reader must refuse
/// it from the u64 size (past [`MAX_BUNDLE_BYTES`]) on every target.
pub fn bundle_sizes_past_4_gib_are_refused() {
    let bytes = (1u64 << 32) + 10;
    assert!(bytes > MAX_BUNDLE_BYTES as u64);
    let mut m = manifest_sample();
    m.models[0].parts = 1;
    m.models[0].bytes = bytes;
    assert_eq!(Manifest::decode(&m.encode()), Err(ManifestError::TooLarge(1)));
    let mut m = manifest_sample();
    m.retired[0].bytes = bytes;
    assert_eq!(Manifest::decode(&m.encode()), Err(ManifestError::TooLarge(1)));
    let list = format!(
        r#"{{"bundles":[{{"model":"m","fingerprint":"00000000000000ab","parts":1,"bytes":{bytes}}}]}}"#
    );
    assert_eq!(parse_list(list.as_bytes()), Ok((Vec::new(), 1)));
    assert_eq!(read_parts(&MemStore::new(), 0xab, 1, bytes), None);
}

pub fn calibration_state_golden() {
    let mut st = ModelState::new(&Profile {
        prefill_base_ms: 1.0,
        prefill_ms_per_token: 0.5,
        prefill_ms_per_token_sq: 0.0,
        decode_interference_ms: 2.0,
        ..Profile::default()
    });
    st.samples = 3;
    st.workers.push(WorkerDev { worker: "a:1".into(), log_dev: 0.0, samples: 2 });
    let bytes = st.encode();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let f = |v: f64| v.to_le_bytes().iter().map(|b| format!("{b:02x}")).collect::<String>();
    let mut want = String::from("4b564302");
    // Own base, per token, per token², interference; the queue's base, per token, per token²;
    // the batch fill (2 % of a default 8 192-token step at 0.5 ms per token).
    for v in [1.0, 0.5, 0.0, 2.0, 1.0, 0.5, 0.0, 0.02 * 8192.0 * 0.5] {
        want += &f(v);
    }
    want += "0300000000000000";
    // weight, a[36], b[8]
    for _ in 0..45 {
        want += &f(0.0);
    }
    for _ in 0..8 {
        want += &f(1.0);
    }
    want += &f(INITIAL_SCALE);
    want += &f(0.0) /* promise margin 1 */;
    want += "0100" /* one worker */;
    want += "03613a31" /* "a:1" */;
    want += &f(0.0);
    want += "02000000";
    assert_eq!(hex, want);
    assert_eq!(bytes.len(), 4 + 8 * 8 + 8 + 8 * 55 + 2 + 4 + 8 + 4);
    assert_eq!(hex[..24], *"4b564302000000000000f03f", "magic, version, prior base 1.0");
    assert_eq!(ModelState::decode(&bytes), Ok(st.clone()));
    // With priorities tracked apart: version 3, their quantiles between the pool-wide one and
    // the workers.
    st.priorities = vec![
        PriorityPromise { priority: -1, log: 0.5, samples: 7 },
        PriorityPromise { priority: 10, log: 0.25, samples: 30 },
    ];
    let v3 = st.encode();
    let hex3: String = v3.iter().map(|b| format!("{b:02x}")).collect();
    let at = 2 * (4 + 8 * 8 + 8 + 8 * 55);
    assert_eq!(hex3[..8], *"4b564303");
    assert_eq!(hex3[8..at], want[8..at], "the same fields up to the pool-wide margin");
    let mut priorities = String::from("02");
    priorities += &format!("ffffffff{}07000000", f(0.5));
    priorities += &format!("0a000000{}1e000000", f(0.25));
    assert_eq!(hex3[at..at + priorities.len()], priorities);
    assert_eq!(hex3[at + priorities.len()..], want[at..], "then the workers, as before");
    assert_eq!(ModelState::decode(&v3), Ok(st));
}

pub fn head_round_trips_and_rejects_truncation() {
    let h = Head { version: 9, checked_at_ms: 1234, full_version: 7, seq: 300 };
    let b = h.encode();
    assert_eq!(b.len(), Head::BYTES);
    assert_eq!(&b[24..], &300u64.to_le_bytes(), "the sequence number last, little-endian");
    assert_eq!(Head::decode(&b), Some(h.clone()));
    for n in 0..b.len() {
        assert_eq!(Head::decode(&b[..n]), None);
    }
    let mut long = b.clone();
    long.push(0);
    assert_eq!(Head::decode(&long), None);
}
