use super::*;

fn watch() -> Watch {
    Watch::new(MisdeployConfig::default(), 1_000)
}

#[test]
fn a_request_without_any_body_makes_the_thread_stop_pausing_until_a_probe() {
    let mut w = watch();
    assert!(w.should_pause(1_000));
    assert_eq!(w.timed_out(false, 3_000), Unrouted::BodyNotDelivered);
    assert!(w.has(Symptom::BodyNotDelivered, 3_000));
    // Requests pass on at once until the probe period has gone by.
    assert!(!w.should_pause(3_001));
    assert!(!w.should_pause(62_999));
    assert!(w.should_pause(63_000), "one probe per period");
    assert!(!w.should_pause(63_001));
    // The probe's body arrives: the host delivers bodies now.
    w.body_delivered();
    assert!(!w.has(Symptom::BodyNotDelivered, 63_002));
    assert!(w.should_pause(63_002));
}

#[test]
fn a_stalled_client_is_not_a_misconfigured_host() {
    let mut w = watch();
    w.body_delivered();
    assert_eq!(w.timed_out(true, 5_000), Unrouted::BodyTimeout);
    // Once bodies have been seen, one that never comes is a client's stall.
    assert_eq!(w.timed_out(false, 6_000), Unrouted::BodyNotDelivered);
    assert!(!w.has(Symptom::BodyNotDelivered, 6_000));
    assert!(w.should_pause(6_000));
}

#[test]
fn no_knowledge_only_after_the_grace_and_never_once_arrived() {
    let mut w = watch();
    assert!(!w.has(Symptom::NoKnowledge, 30_999));
    assert!(w.has(Symptom::NoKnowledge, 31_000));
    w.knowledge(false);
    assert!(w.has(Symptom::NoKnowledge, 40_000));
    w.knowledge(true);
    w.knowledge(false);
    assert!(!w.has(Symptom::NoKnowledge, 40_000), "knowledge that arrived once is not missing");

    let off = MisdeployConfig { knowledge_within_ms: 0, ..Default::default() };
    assert!(!Watch::new(off, 0).has(Symptom::NoKnowledge, u64::MAX));
}

#[test]
fn override_ignored_needs_a_full_window_mostly_missed() {
    let mut w = watch();
    for _ in 0..15 {
        w.served(false);
    }
    assert!(!w.has(Symptom::OverrideIgnored, 0), "window not full yet");
    w.served(false);
    assert!(w.has(Symptom::OverrideIgnored, 0));
    // Honoured answers (connect-failure retries are the usual misses) clear it.
    for _ in 0..8 {
        w.served(true);
    }
    assert!(w.has(Symptom::OverrideIgnored, 0), "8 of 16 missed is 50 %");
    w.served(true);
    assert!(!w.has(Symptom::OverrideIgnored, 0), "7 of 16 missed is under 50 %");
    for _ in 0..16 {
        w.served(true);
    }
    w.served(false);
    assert!(!w.has(Symptom::OverrideIgnored, 0));
}

#[test]
fn warnings_at_most_once_per_interval_and_header_names_every_symptom() {
    let mut w = watch();
    assert_eq!(w.header_field(0), "none");
    w.timed_out(false, 2_000);
    assert_eq!(w.warnings_due(2_000), vec![Symptom::BodyNotDelivered]);
    assert!(w.warnings_due(2_001).is_empty());
    assert_eq!(w.warnings_due(31_000), vec![Symptom::NoKnowledge]);
    assert_eq!(w.warnings_due(62_000), vec![Symptom::BodyNotDelivered]);
    assert_eq!(w.header_field(62_000), "body_not_delivered+no_knowledge");
}

#[test]
fn config_defaults_validate_and_bounds_are_checked() {
    let c = MisdeployConfig::default();
    assert!(c.validate(250).is_ok());
    assert!(c.validate(5_000).is_err(), "the tick must be able to resume in time");
    assert!(MisdeployConfig { body_wait_ms: 0, ..c }.validate(1).is_err());
    assert!(MisdeployConfig { override_window: 0, ..c }.validate(1).is_err());
    assert!(MisdeployConfig { override_mismatch_percent: 0, ..c }.validate(1).is_err());
    assert!(MisdeployConfig { override_mismatch_percent: 101, ..c }.validate(1).is_err());
    assert!(MisdeployConfig { probe_interval_ms: 0, ..c }.validate(1).is_err());
}
