//! The updater under siege: the release `kvroute-updater` under real limits
//! (`prlimit`), attacked over a real ZMQ PUB socket with msgpack bombs and oversized messages,
//! and over its HTTP listener with idle connections and partial requests. It must stay up,
//! keep answering `/status`, keep applying a normal batch sent after the attacks, stay under
//! its memory ceiling, count every refusal, and keep its log bounded.

use std::time::{Duration, Instant};

use kvroute_stack::eventually;
use kvroute_stack::paths;
use kvroute_stack::process::Guard;
use kvroute_stack::siege::updater::{
    bombs, fd_count, open_idle, open_partial, peak_rss_kb, start_limited, ChildLimits,
    ZmtpPublisher,
};
use kvroute_stack::sim::SimWorker;
use kvroute_stack::stack::UPDATER_TOKEN;
use serde_json::Value;

/// The updater's stated memory ceiling under every bomb (peak resident set, `VmHWM`).
const CEILING_KB: u64 = 512 * 1024;
/// The address-space limit it runs under in the bomb test: 1 GiB, under which the
/// unbounded decoder aborted.
const ADDRESS_SPACE: u64 = 1 << 30;
/// The updater's default `max_batch_elements`: a batch of nils this long passes the pre-pass.
const ELEMENT_CAP: usize = 1 << 21;

async fn get_json(port: u16, path: &str) -> Option<Value> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().ok()?;
    http.get(format!("http://127.0.0.1:{port}{path}")).send().await.ok()?.json().await.ok()
}

async fn start_updater(
    dir: &std::path::Path,
    port: u16,
    worker: &str,
    limits: ChildLimits,
) -> anyhow::Result<Guard> {
    let args: Vec<String> = [
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--token",
        UPDATER_TOKEN,
        "--align-interval-ms",
        "300",
        "--worker",
        worker,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    start_limited(&args, limits, dir).await
}

fn worker<'a>(status: &'a Value, name: &str) -> &'a Value {
    &status["workers"][name]
}

#[tokio::test]
async fn msgpack_bombs_and_floods_leave_the_updater_up_under_its_ceiling() -> anyhow::Result<()> {
    let dir = paths::scratch_dir("siege-updater-bombs")?;
    let sim = SimWorker::start(0, &[], &dir).await?;
    let publisher = ZmtpPublisher::bind().await?;
    let port = paths::free_port()?;
    let name = sim.addr.clone();
    let limits = ChildLimits { address_space: Some(ADDRESS_SPACE), nofile: None };
    let spec = format!("{name},{}", publisher.endpoint());
    let updater = start_updater(&dir, port, &spec, limits).await?;
    let pid = updater.pid().expect("running");
    // Subscribed, and the worker's model and block size known (its batches are indexed).
    let block_size =
        eventually("the worker aligned and subscribed", Duration::from_secs(30), || {
            let n = publisher.subscribers();
            let name = &name;
            async move {
                let s = get_json(port, "/status").await?;
                let w = worker(&s, name);
                (n > 0 && w["connected"] == true && w["member"] == true)
                    .then(|| w["block_size"].as_u64())
                    .flatten()
            }
        })
        .await? as u32;
    let mut seq = 0u64;
    publisher.batch(seq, &bombs::stored(1, 1000, block_size)).await?;
    seq += 1;
    eventually("the first batch applied", Duration::from_secs(10), || async {
        let s = get_json(port, "/status").await?;
        (worker(&s, &name)["blocks"]["GPU"].as_u64() == Some(1)).then_some(())
    })
    .await?;
    let base_kb = peak_rss_kb(pid).unwrap_or(0);

    // The bombs, each followed by a /status answer and a peak-memory reading.
    const MIB60: usize = 60 << 20;
    let mut peaks = Vec::new();
    let mut attacks: Vec<(String, Vec<u8>)> = vec![
        ("60 MiB array of nils".into(), bombs::nils(MIB60)),
        ("60 MiB nested maps".into(), bombs::nested_maps(MIB60)),
        ("60 MiB map of nil pairs".into(), bombs::wide_map(MIB60)),
    ];
    attacks.extend(bombs::declared_huge().into_iter().map(|(n, b)| (n.to_string(), b)));
    let bombs_sent = attacks.len() as u64 + 1;
    for (what, payload) in &attacks {
        publisher.batch(seq, payload).await?;
        seq += 1;
        let want = seq;
        eventually(&format!("{what} refused"), Duration::from_secs(30), || async {
            let s = get_json(port, "/status").await?;
            (worker(&s, &name)["next_seq"].as_u64() == Some(want)).then_some(())
        })
        .await?;
        peaks.push((what.clone(), peak_rss_kb(pid).unwrap_or(u64::MAX)));
    }
    // The largest batch that passes: nils up to the element cap (2 Mi), decoded in full.
    publisher.batch(seq, &bombs::nils(ELEMENT_CAP)).await?;
    seq += 1;
    let want = seq;
    eventually("a batch at the element cap decoded", Duration::from_secs(30), || async {
        let s = get_json(port, "/status").await?;
        (worker(&s, &name)["next_seq"].as_u64() == Some(want)).then_some(())
    })
    .await?;
    peaks.push(("2 Mi nils (at the element cap)".into(), peak_rss_kb(pid).unwrap_or(u64::MAX)));
    // 16 frames of 60 MiB nils in one message after the topic and sequence frames.
    let bomb = bombs::nils(MIB60);
    let seq_bytes = seq.to_be_bytes();
    let mut frames: Vec<&[u8]> = vec![b"", &seq_bytes];
    frames.extend(std::iter::repeat_n(&bomb[..], 16));
    publisher.send(&frames).await?;
    seq += 1;
    let want = seq;
    eventually("16 x 60 MiB in one message refused", Duration::from_secs(60), || async {
        let s = get_json(port, "/status").await?;
        (worker(&s, &name)["next_seq"].as_u64() == Some(want)).then_some(())
    })
    .await?;
    peaks.push(("16 x 60 MiB frames in one message".into(), peak_rss_kb(pid).unwrap_or(u64::MAX)));
    drop(bomb);

    // A normal batch after the bombs is applied.
    publisher.batch(seq, &bombs::stored(2, 5000, block_size)).await?;
    seq += 1;
    eventually("a normal batch applied after the bombs", Duration::from_secs(10), || async {
        let s = get_json(port, "/status").await?;
        (worker(&s, &name)["blocks"]["GPU"].as_u64() == Some(2)).then_some(())
    })
    .await?;
    let s = get_json(port, "/status").await.expect("/status answers");
    let stats = &worker(&s, &name)["stats"];
    assert_eq!(stats["bad_batches"].as_u64(), Some(bombs_sent), "{stats}");
    let caps = &stats["caps_hit"];
    assert!(caps["batch_elements"].as_u64() >= Some(3), "{caps}");
    assert!(caps["declared_length"].as_u64() >= Some(4), "{caps}");
    assert!(caps["message_bytes"].as_u64() >= Some(1), "{caps}");
    assert!(caps["message_frames"].as_u64() >= Some(1), "{caps}");
    assert!(stats["bad_events"].as_u64() >= Some(ELEMENT_CAP as u64 - 16), "{stats}");
    let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await?.text().await?;
    let line =
        format!("kvroute_updater_caps_hit_total{{worker=\"{name}\",cap=\"declared_length\"}} 4");
    assert!(metrics.contains(&line), "{line} not in /metrics");

    // Floods: 1 000 messages without a sequence frame, 1 000 undecodable batches.
    let started = Instant::now();
    let lines_before = log_lines(&dir, "without an 8-byte sequence");
    for _ in 0..1000 {
        publisher.send(&[b"", b"not-a-seq"]).await?;
    }
    for _ in 0..1000 {
        publisher.batch(seq, &[0xc1, 0xc1]).await?;
        seq += 1;
    }
    let want_bad = bombs_sent + 1000;
    let counted = eventually("both floods counted", Duration::from_secs(30), || async {
        let s = get_json(port, "/status").await?;
        let st = worker(&s, &name)["stats"].clone();
        (st["bad_batches"].as_u64() == Some(want_bad) && st["malformed_messages"] == 1000)
            .then_some(st)
    })
    .await?;
    assert_eq!(counted["malformed_messages"], 1000);
    // At most one line per kind, worker and 10 s (plus the first).
    let allowed = 2 + started.elapsed().as_secs() as usize / 10;
    let malformed = log_lines(&dir, "without an 8-byte sequence") - lines_before;
    let refused = log_lines(&dir, "refused:");
    assert!(malformed <= allowed, "{malformed} log lines for 1000 malformed messages");
    assert!(refused <= allowed + bombs_sent as usize, "{refused} lines for refused batches");

    let peak_kb = peak_rss_kb(pid).expect("the updater is still running");
    eprintln!("updater peak RSS (VmHWM) before the bombs: {} MiB", base_kb / 1024);
    for (what, kb) in &peaks {
        eprintln!("updater peak RSS (VmHWM) after {what}: {} MiB", kb / 1024);
    }
    eprintln!("updater peak RSS (VmHWM) at the end: {} MiB (ceiling 512 MiB)", peak_kb / 1024);
    assert!(peak_kb < CEILING_KB, "peak RSS {peak_kb} kB over the ceiling");
    assert!(get_json(port, "/status").await.is_some(), "/status stops answering");
    drop(updater);
    drop(sim);
    Ok(())
}

fn log_lines(dir: &std::path::Path, needle: &str) -> usize {
    let text = std::fs::read_to_string(dir.join("updater.log")).unwrap_or_default();
    text.lines().filter(|l| l.contains(needle)).count()
}

/// An authenticated snapshot fetch on a fresh connection: its status, within 5 s.
async fn snapshot(port: u16) -> Option<u16> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().ok()?;
    let r = http
        .get(format!("http://127.0.0.1:{port}/v1/snapshot?since=0"))
        .header("x-kvroute-token", UPDATER_TOKEN)
        .send()
        .await
        .ok()?;
    Some(r.status().as_u16())
}

#[tokio::test]
async fn idle_floods_of_twice_the_fd_limit_do_not_stop_the_updater() -> anyhow::Result<()> {
    const NOFILE: u64 = 256;
    let dir = paths::scratch_dir("siege-updater-idle")?;
    let port = paths::free_port()?;
    // A worker that publishes nothing: the HTTP surface is what is attacked.
    let nobody = format!("127.0.0.1:{}", paths::free_port()?);
    let limits = ChildLimits { address_space: None, nofile: Some(NOFILE) };
    let updater = start_updater(&dir, port, &nobody, limits).await?;
    let pid = updater.pid().expect("running");
    let addr = format!("127.0.0.1:{port}");
    assert_eq!(snapshot(port).await, Some(200));
    let version = get_json(port, "/status").await.expect("/status")["version"].as_u64();
    // An Envoy's long poll, in flight through the flood: never cut for room.
    let poll = tokio::spawn(async move {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().ok()?;
        let since = version.unwrap_or(0);
        let url = format!("http://127.0.0.1:{port}/v1/snapshot?since={since}&wait_ms=4000");
        let r = http.get(url).header("x-kvroute-token", UPDATER_TOKEN).send().await.ok()?;
        Some(r.status().as_u16())
    });
    let mut partial = open_partial(&addr, 32).await;
    let idle = open_idle(&addr, 2 * NOFILE as usize).await;
    let opened = idle.len() + partial.len();
    for round in 0..5 {
        let t = Instant::now();
        let status = get_json(port, "/status").await;
        assert!(status.is_some(), "round {round}: /status unanswered");
        assert_eq!(snapshot(port).await, Some(200), "round {round}: snapshot refused");
        assert!(t.elapsed() < Duration::from_secs(10));
        let fds = fd_count(pid).unwrap_or(0);
        assert!(fds as u64 <= NOFILE, "{fds} descriptors");
    }
    let status = get_json(port, "/status").await.expect("/status answers");
    let http = &status["http"];
    let cap = http["max_connections"].as_u64().unwrap_or(0);
    assert!(cap > 0 && cap < NOFILE, "{http}");
    assert!(http["connections"].as_u64() <= Some(cap), "{http}");
    assert!(http["shed"]["for_room"].as_u64() > Some(0), "{http}");
    let polled = poll.await?;
    assert!(matches!(polled, Some(200 | 304)), "the long poll was cut: {polled:?}");
    // The partial requests are closed by the header-read timeout (10 s by default).
    let closed =
        kvroute_stack::siege::updater::closed_by_peer(&mut partial, Duration::from_secs(15)).await;
    assert_eq!(closed, partial.len(), "partial requests kept open");
    let after = get_json(port, "/status").await.expect("/status answers");
    eprintln!(
        "idle flood: {opened} connections opened at nofile {NOFILE}; cap {cap}; http {}",
        after["http"]
    );
    drop(idle);
    drop(partial);
    drop(updater);
    Ok(())
}
