use kvroute_core::decision::misdeploy::{MisdeployConfig, Unrouted, Watch};

use super::Waiting;
use crate::fake::FakeHost;

const ROOT: u32 = 1;

fn watch() -> Watch {
    let cfg = MisdeployConfig { body_wait_ms: 1_000, ..Default::default() };
    Watch::new(cfg, 0)
}

#[test]
fn a_request_whose_body_never_came_is_resumed_unrouted() {
    let host = FakeHost::at(0);
    let (waiting, mut watch) = (Waiting::default(), watch());
    waiting.pause(7, 0);
    assert!(waiting.resume_expired(&host, &mut watch, ROOT, 999).is_empty());
    let why = waiting.resume_expired(&host, &mut watch, ROOT, 1_000);
    assert_eq!(why, [Unrouted::BodyNotDelivered]);
    assert_eq!(*host.resumed.borrow(), [7]);
    assert!(host.replied.borrow().is_empty());
    // The root context is effective again; the stream finds why it was passed on, once.
    assert_eq!(host.effective.get(), ROOT);
    assert_eq!(waiting.take_passed_on(7), Some(Unrouted::BodyNotDelivered));
    assert_eq!(waiting.take_passed_on(7), None);
    // Once passed on, never again.
    assert!(waiting.resume_expired(&host, &mut watch, ROOT, 5_000).is_empty());
}

#[test]
fn a_body_stalled_part_way_is_answered_408_and_progress_defers_it() {
    let host = FakeHost::at(0);
    let (waiting, mut watch) = (Waiting::default(), watch());
    waiting.pause(9, 0);
    waiting.progress(9, 800);
    assert!(waiting.resume_expired(&host, &mut watch, ROOT, 1_500).is_empty());
    assert_eq!(waiting.resume_expired(&host, &mut watch, ROOT, 1_800), [Unrouted::BodyTimeout]);
    assert_eq!(*host.replied.borrow(), [(9, 408)]);
    assert!(host.resumed.borrow().is_empty());
}

#[test]
fn a_request_done_waiting_is_left_alone() {
    let host = FakeHost::at(0);
    let (waiting, mut watch) = (Waiting::default(), watch());
    waiting.pause(3, 0);
    waiting.done(3);
    assert!(waiting.resume_expired(&host, &mut watch, ROOT, 10_000).is_empty());
    assert!(host.resumed.borrow().is_empty() && host.replied.borrow().is_empty());
}
