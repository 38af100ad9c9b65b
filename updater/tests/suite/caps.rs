//! Every bound of the updater, hit by a publisher the test drives over real ZMQ sockets: the
//! hit is counted (in `/status` and `/metrics`), memory stays within the bound, and the
//! worker's stream goes on.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use kvroute_updater::limits::{BlockLimits, Limits, ReplayLimits, WireLimits};

fn with_blocks(max_blocks_per_tier: usize, max_engine_keys: usize) -> Limits {
    Limits { blocks: BlockLimits { max_blocks_per_tier, max_engine_keys }, ..Limits::default() }
}

#[tokio::test]
async fn blocks_per_tier_are_capped_oldest_known_first() {
    let mut fake = Fake::start(ReplayMode::Normal).await;
    let (state, _follow) = follow_fake(&fake, with_blocks(8, 1000));
    // 20 chains of 2 GPU blocks, then 3 CPU blocks.
    for i in 0..20u64 {
        fake.publish(i, batch(&[stored(100 * (i + 1), 2, "GPU")]), &[]).await;
    }
    fake.publish(20, batch(&[stored(5000, 3, "CPU")]), &[]).await;
    assert!(until(10, || stat(&state, "batches") == 21).await, "{}", status(&state));
    assert_eq!(blocks(&state, "GPU"), 8);
    assert_eq!(blocks(&state, "CPU"), 3, "each tier has its own bound");
    assert_eq!(cap(&state, "blocks_per_tier"), 40 - 8);
    // The newest chains are the ones kept (the four last ones).
    let expect = kvroute_core::decision::hash::block_hashes(
        common::domain().seed(None, None),
        BLOCK,
        &(0..8).map(|t| t + 2000 * 1000).collect::<Vec<u32>>(),
    );
    let gpu = state.snapshot().workers[0].gpu.clone();
    assert!(expect.iter().all(|h| gpu.contains(h)), "the last chain stored was forgotten");

    // The same count on /metrics.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = kvroute_updater::server::router(Arc::clone(&state), "0123456789abcdef");
    let _server = spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("kvroute_updater_caps_hit_total{worker=\"w\",cap=\"blocks_per_tier\"} 32"),
        "{text}"
    );
}

#[tokio::test]
async fn engine_hash_map_is_capped() {
    let mut fake = Fake::start(ReplayMode::Normal).await;
    let (state, _follow) = follow_fake(&fake, with_blocks(1000, 10));
    for i in 0..10u64 {
        let medium = if i % 2 == 0 { "GPU" } else { "CPU" };
        fake.publish(i, batch(&[stored(100 * (i + 1), 3, medium)]), &[]).await;
    }
    assert!(until(10, || stat(&state, "batches") == 10).await, "{}", status(&state));
    assert_eq!(status(&state)["engine_keys"], 10);
    assert_eq!(cap(&state, "engine_keys"), 30 - 10);
    assert!(blocks(&state, "GPU") + blocks(&state, "CPU") <= 10);
}

fn with_replay(max_batches: usize, max_bytes: usize, max_time_ms: u64) -> Limits {
    Limits {
        replay: ReplayLimits {
            max_batches,
            max_bytes,
            max_time: Duration::from_millis(max_time_ms),
            retry_after: Duration::from_secs(600),
        },
        ..Limits::default()
    }
}

/// `fake` holds 30 batches for replay only; the updater's first catch-up is cut by `limits`.
/// The cut replay's contiguous part is applied, and the next gap does not replay again
/// (retry later) but skips ahead keeping what is known, so the live stream goes on.
async fn replay_cut(mode: ReplayMode, limits: Limits, cap_name: &str, applied: u64) {
    let mut fake = Fake::start(mode).await;
    for i in 0..30u64 {
        fake.buffer_only(i, batch(&[stored(100 * (i + 1), 1, "GPU")]));
    }
    let (state, _follow) = follow_fake(&fake, limits);
    assert!(until(10, || stat(&state, "replays_cut") == 1).await, "{}", status(&state));
    assert_eq!(cap(&state, cap_name), 1);
    assert_eq!(stat(&state, "batches"), applied);
    assert_eq!(blocks(&state, "GPU"), applied);
    // Live batches after the cut: no new replay while the retry waits.
    for seq in 30..40u64 {
        fake.publish(seq, batch(&[stored(100 * (seq + 1), 1, "GPU")]), &[]).await;
        if until(1, || stat(&state, "batches") > applied).await {
            break;
        }
    }
    assert!(stat(&state, "batches") > applied, "the live stream stopped after a cut replay");
    assert_eq!(stat(&state, "replays"), 1, "replayed again instead of waiting");
    assert!(blocks(&state, "GPU") > applied, "knowledge from the cut replay was lost");
}

#[tokio::test]
async fn a_replay_is_cut_by_batches() {
    replay_cut(ReplayMode::Normal, with_replay(10, 1 << 20, 10_000), "replay_batches", 10).await;
}

#[tokio::test]
async fn a_replay_is_cut_by_bytes() {
    let five: usize = (0..5u64).map(|i| batch(&[stored(100 * (i + 1), 1, "GPU")]).len()).sum();
    replay_cut(ReplayMode::Normal, with_replay(1000, five + 1, 10_000), "replay_bytes", 5).await;
}

#[tokio::test]
async fn a_replay_that_does_not_end_is_cut_by_time() {
    replay_cut(ReplayMode::NoEnd, with_replay(1000, 1 << 20, 300), "replay_time", 30).await;
}

fn with_wire(max_frame_bytes: usize, max_message_frames: usize) -> Limits {
    let wire = WireLimits { max_frame_bytes, max_message_frames, ..WireLimits::default() };
    Limits { wire, ..Limits::default() }
}

/// `[ts, [nil; n]]`: an events array of `n` nils, 1 byte each.
fn nils(n: usize) -> Bytes {
    let mut b = vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd];
    b.extend_from_slice(&(n as u32).to_be_bytes());
    b.extend(std::iter::repeat_n(0xc0, n));
    Bytes::from(b)
}

#[tokio::test]
async fn msgpack_bombs_and_malformed_messages_are_counted_and_the_stream_goes_on() {
    let mut fake = Fake::start(ReplayMode::Normal).await;
    let mut limits = with_wire(8 << 20, 8);
    limits.wire.max_batch_elements = 100_000;
    let (state, _follow) = follow_fake(&fake, limits);
    fake.publish(0, batch(&[stored(100, 1, "GPU")]), &[]).await;
    assert!(until(10, || stat(&state, "batches") == 1).await, "{}", status(&state));
    // 1 Mi real nils; an array declaring 2^32 - 1 elements; a string declaring 4 GiB; a map
    // declaring 2^32 - 1 entries inside the events array.
    fake.publish(1, nils(1 << 20), &[]).await;
    let mut huge = vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff];
    huge.extend([0xc0; 16]);
    fake.publish(2, Bytes::from(huge), &[]).await;
    fake.publish(3, Bytes::from_static(&[0x92, 0xdb, 0xff, 0xff, 0xff, 0xff, b'a']), &[]).await;
    let map = [0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff, 0xc0];
    fake.publish(4, Bytes::copy_from_slice(&map), &[]).await;
    // Messages that are not batches: no sequence frame, a 3-byte one, a topic alone.
    let seq = |s: &'static [u8]| Bytes::from_static(s);
    fake.publish_raw(vec![Bytes::new()]).await;
    fake.publish_raw(vec![Bytes::new(), seq(b"abc"), batch(&[])]).await;
    fake.publish_raw(vec![Bytes::new(), seq(&[0; 8])]).await;
    fake.publish(5, batch(&[stored(500, 1, "GPU")]), &[]).await;
    assert!(until(10, || status(&state)["next_seq"] == 6).await, "{}", status(&state));
    assert!(until(5, || stat(&state, "malformed_messages") == 3).await, "{}", status(&state));
    assert_eq!(stat(&state, "bad_batches"), 4, "{}", status(&state));
    assert_eq!(cap(&state, "batch_elements"), 1);
    assert_eq!(cap(&state, "declared_length"), 3);
    assert_eq!(blocks(&state, "GPU"), 2, "the batches around the bombs are applied");
    assert_eq!(stat(&state, "resyncs"), 0);
}

#[tokio::test]
async fn a_message_over_the_byte_cap_is_emptied_past_it() {
    let mut fake = Fake::start(ReplayMode::Normal).await;
    let mut limits = with_wire(1 << 20, 16);
    limits.wire.max_message_bytes = 2 << 20;
    let (state, _follow) = follow_fake(&fake, limits);
    fake.publish(0, batch(&[stored(100, 1, "GPU")]), &[]).await;
    assert!(until(10, || stat(&state, "batches") == 1).await, "{}", status(&state));
    // 12 frames of 900 KiB after the batch: the message is 10.5 MiB, the cap 2 MiB.
    let extra: Vec<Bytes> = (0..12).map(|_| Bytes::from(vec![7u8; 900 << 10])).collect();
    fake.publish(1, batch(&[stored(200, 1, "GPU")]), &extra).await;
    fake.publish(2, batch(&[stored(300, 1, "GPU")]), &[]).await;
    assert!(until(10, || status(&state)["next_seq"] == 3).await, "{}", status(&state));
    assert_eq!(cap(&state, "message_bytes"), 1);
    assert_eq!(blocks(&state, "GPU"), 3, "the batch in the capped message still applies");
}

#[tokio::test]
async fn oversized_frames_and_messages_are_refused_and_the_stream_goes_on() {
    let mut fake = Fake::start(ReplayMode::Normal).await;
    let (state, _follow) = follow_fake(&fake, with_wire(4096, 8));
    fake.publish(0, batch(&[stored(100, 1, "GPU")]), &[]).await;
    assert!(until(10, || stat(&state, "batches") == 1).await, "{}", status(&state));
    // A payload over 1 MiB (a valid batch: one chain of 64 k blocks).
    let big = batch(&[stored(1_000_000, 1 << 16, "GPU")]);
    assert!(big.len() > 1 << 20);
    fake.publish(1, big, &[]).await;
    // Messages of 3 + 40 frames, until one comes live (a replay carries no extra frames).
    let extra: Vec<Bytes> = (0..40).map(|_| Bytes::from_static(b"x")).collect();
    let mut seq = 2;
    while seq < 20 {
        fake.publish(seq, batch(&[stored(100 * (seq + 1), 1, "GPU")]), &extra).await;
        seq += 1;
        if until(1, || cap(&state, "message_frames") >= 1).await {
            break;
        }
    }
    fake.publish(seq, batch(&[stored(100 * (seq + 1), 1, "GPU")]), &[]).await;
    let next = seq + 1;
    assert!(until(10, || status(&state)["next_seq"] == next).await, "{}", status(&state));
    assert!(cap(&state, "frame_bytes") >= 1);
    assert!(cap(&state, "message_frames") >= 1);
    assert_eq!(stat(&state, "bad_batches"), 1, "the oversized batch is refused");
    assert_eq!(blocks(&state, "GPU"), next - 1, "batches around the refused one are applied");
    assert_eq!(stat(&state, "resyncs"), 0);
    assert_eq!(status(&state)["connected"], true);
}

/// A peer that completes the ZMTP handshake as a PUB, then announces a frame of 2^62 bytes.
/// Unguarded, the ZMQ codec would reserve that much memory at once (and abort the process);
/// here the announcement is refused and counted, and the updater keeps running.
#[tokio::test]
async fn a_huge_announced_frame_is_refused_before_allocation() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let _peer = spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok((mut conn, _)) = listener.accept().await else { return };
        let mut greeting = vec![0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 3, 0];
        greeting.extend_from_slice(b"NULL");
        greeting.resize(64, 0);
        let mut ready = vec![0x04, 25, 5];
        ready.extend_from_slice(b"READY");
        ready.push(11);
        ready.extend_from_slice(b"Socket-Type");
        ready.extend_from_slice(&[0, 0, 0, 3]);
        ready.extend_from_slice(b"PUB");
        let mut huge = vec![0x02];
        huge.extend_from_slice(&(1u64 << 62).to_be_bytes());
        huge.extend_from_slice(&[0; 64]);
        for part in [greeting, ready, huge] {
            if conn.write_all(&part).await.is_err() {
                return;
            }
        }
        // Stay connected, reading whatever the subscriber sends.
        let mut sink = [0u8; 1024];
        while conn.read(&mut sink).await.is_ok_and(|n| n > 0) {}
    });
    let state = Arc::new(kvroute_updater::state::State::with_limits(
        domain(),
        ["w".to_string()],
        with_wire(4096, 8),
    ));
    let ep = kvroute_updater::subscriber::Endpoints {
        worker: "w".into(),
        events: format!("tcp://127.0.0.1:{port}"),
        replay: None,
    };
    let _follow = spawn(kvroute_updater::subscriber::follow(Arc::clone(&state), ep));
    assert!(until(10, || cap(&state, "frame_bytes") == 1).await, "{}", status(&state));
    assert_eq!(stat(&state, "batches"), 0);
}
