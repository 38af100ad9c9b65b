use super::*;
use crate::decision::config::sync::FirstByteTimeout;
use crate::shared::fake::MemStore;

const W: &str = "127.0.0.1:8001";

fn cfg() -> HealthConfig {
    HealthConfig {
        base_backoff_ms: 100,
        max_backoff_ms: 350,
        probe_hold_ms: 50,
        ..Default::default()
    }
}

#[test]
fn a_failure_ejects_for_a_backoff_that_doubles_up_to_the_cap() {
    let s = MemStore::new();
    let c = cfg();
    assert!(!HealthRecord::read(&s).is_down(W, 0), "no record: up");
    let f = report_failure(&s, &c, W, 1_000).unwrap();
    assert_eq!(f, Failure::Ejected { failures: 1, backoff_ms: 100 });
    let h = HealthRecord::read(&s);
    assert!(h.is_down(W, 1_099) && !h.is_down(W, 1_100), "down for exactly the backoff");
    assert_eq!(h.down(1_050).collect::<Vec<_>>(), vec![W]);
    // Other requests in flight to it fail too: no escalation while down.
    assert_eq!(report_failure(&s, &c, W, 1_010).unwrap(), Failure::AlreadyDown);
    // Half-open: the next failure doubles, then the cap holds.
    let mut now = 1_100;
    for want in [200, 350, 350] {
        match report_failure(&s, &c, W, now).unwrap() {
            Failure::Ejected { backoff_ms, .. } => assert_eq!(backoff_ms, want),
            other => panic!("{other:?}"),
        }
        now += want;
    }
    assert_eq!(HealthRecord::read(&s).get(W).unwrap().failures, 4);
}

#[test]
fn one_probe_is_claimed_after_the_backoff_and_an_answer_clears_the_record() {
    let s = MemStore::new();
    let c = cfg();
    report_failure(&s, &c, W, 0).unwrap();
    assert!(!claim_probe(&s, &c, W, 50).unwrap(), "still down: no probe");
    assert!(claim_probe(&s, &c, W, 100).unwrap(), "half-open: this request probes");
    assert!(HealthRecord::read(&s).is_down(W, 120), "held out of other decisions while probing");
    assert!(!claim_probe(&s, &c, W, 120).unwrap(), "one probe at a time");
    // An answer from a request sent before the failure does not bring it back while down;
    // the probe's answer does.
    assert!(report_answer(&s, W, 120).unwrap());
    assert!(HealthRecord::read(&s).get(W).is_none() && !HealthRecord::read(&s).is_down(W, 120));
    assert!(!report_answer(&s, W, 130).unwrap(), "nothing to clear");
}

#[test]
fn a_failed_probe_sends_it_down_for_longer_and_an_answer_while_down_changes_nothing() {
    let s = MemStore::new();
    let c = cfg();
    report_failure(&s, &c, W, 0).unwrap();
    assert!(!report_answer(&s, W, 10).unwrap(), "down: an old request's answer is ignored");
    assert!(HealthRecord::read(&s).is_down(W, 10));
    claim_probe(&s, &c, W, 100).unwrap();
    let f = report_failure(&s, &c, W, 110).unwrap();
    assert_eq!(f, Failure::Ejected { failures: 2, backoff_ms: 200 }, "a failed probe escalates");
    assert!(HealthRecord::read(&s).is_down(W, 309) && !HealthRecord::read(&s).is_down(W, 310));
}

#[test]
fn past_the_backoff_a_worker_stays_out_until_it_shows_a_sign_of_life() {
    let s = MemStore::new();
    report_failure(&s, &cfg(), W, 1_000).unwrap();
    let h = HealthRecord::read(&s);
    assert_eq!(h.get(W).unwrap().since_ms, 1_000);
    let silent = |_: &str, _: u64| false;
    let heard = |_: &str, since: u64| since < 1_500;
    assert_eq!(h.out(1_050, heard).collect::<Vec<_>>(), vec![W], "in its backoff");
    assert_eq!(h.out(2_000, silent).collect::<Vec<_>>(), vec![W], "no sign of life: still out");
    assert_eq!(h.out(2_000, heard).count(), 0, "heard from since it went down: eligible");
    assert!(h.half_open(W, 2_000) && !h.half_open(W, 1_050));
}

#[test]
fn unreadable_values_read_as_all_up_and_are_replaced() {
    let s = MemStore::new();
    s.poke(KEY, b"garbage");
    assert_eq!(HealthRecord::read(&s), HealthRecord::default());
    report_failure(&s, &cfg(), W, 0).unwrap();
    assert!(HealthRecord::read(&s).is_down(W, 1));
    for cut in 0..HealthRecord::read(&s).encode().len() {
        let bytes = HealthRecord::read(&s).encode();
        let _ = HealthRecord::decode(Some(&bytes[..cut]));
    }
}

#[test]
fn first_byte_timeout_follows_the_prediction_within_bounds() {
    let f = FirstByteTimeout {
        factor: 3.0,
        margin_ms: 500,
        min_ms: 1_000,
        max_ms: 10_000,
        ..Default::default()
    };
    assert_eq!(f.for_ttft(0.0), 1_000);
    assert_eq!(f.for_ttft(1_000.0), 3_500);
    assert_eq!(f.for_ttft(1e12), 10_000);
    assert_eq!(f.for_ttft(f64::NAN), 1_000);
    assert!(HealthConfig::default().validate().is_ok());
    let bad = HealthConfig { max_backoff_ms: 1, ..Default::default() };
    assert!(bad.validate().is_err());
}

#[test]
fn envoy_code_details_that_blame_the_worker() {
    for d in [
        "upstream_reset_before_response_started{connection_failure}",
        "upstream_reset_before_response_started{remote_reset}",
        "upstream_reset_after_response_started{remote_reset}",
        "upstream_per_try_timeout",
        "upstream_response_timeout",
    ] {
        assert!(worker_failed(d.as_bytes()), "{d}");
    }
    for d in [
        "via_upstream",
        "downstream_remote_disconnect",
        "upstream_reset_before_response_started{overflow}",
        "",
    ] {
        assert!(!worker_failed(d.as_bytes()), "{d}");
    }
}
