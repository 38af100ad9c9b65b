//! Each siege attack against a fresh stack, measured: its checks (`siege::table`), the
//! normal requests after it, its errors and the peak memory of Envoy and the updater. The
//! stack and every process of an attack stop when it returns (or when its time bound drops it).

use std::time::{Duration, Instant};

use anyhow::Context;
use kvroute_stack::siege::envoy::{self as envoy_siege, IdleFlood, PathOutcome};
use kvroute_stack::siege::requests::{self, After};
use kvroute_stack::siege::table::{self, Check};
use kvroute_stack::siege::updater::{
    bombs, fd_count, open_idle, open_partial, ChildLimits, ZmtpPublisher,
};
use kvroute_stack::siege::workers::{self, TrafficShape};
use kvroute_stack::stack::{Pool, Stack, StackOptions, MODEL};
use serde_json::json;

use crate::stacks::{self, LimitedUpdater};

/// What one attack measured.
pub struct Measured {
    pub checks: Vec<Check>,
    pub after: Option<After>,
    pub errors: usize,
    pub envoy_peak_kb: Option<u64>,
    pub updater_peak_kb: Option<u64>,
    pub detail: String,
}

/// Normal requests sent after every attack.
const AFTER: usize = 20;

async fn after(stack: &Stack) -> anyhow::Result<After> {
    requests::after_probe(&stack.base_url(), MODEL, AFTER, Duration::from_secs(10)).await
}

fn traffic(deadline: Duration) -> TrafficShape {
    TrafficShape { concurrency: 6, model: MODEL.into(), max_tokens: 16, deadline }
}

/// `kill -9` of one worker under streaming traffic.
pub async fn killed_worker() -> anyhow::Result<Measured> {
    let mut stack = stacks::start(stacks::streaming()).await?;
    stacks::ready(&stack).await?;
    let r = workers::kill_under_load(
        &mut stack,
        1,
        &traffic(Duration::from_secs(20)),
        Duration::from_secs(2),
        Duration::from_secs(8),
    )
    .await?;
    let after = after(&stack).await?;
    let (envoy_peak_kb, updater_peak_kb) = stacks::peaks(&stack, None);
    Ok(Measured {
        checks: table::kill_checks(&r),
        after: Some(after),
        errors: r.errors_in_flight + r.errors_after,
        envoy_peak_kb,
        updater_peak_kb,
        detail: format!(
            "health check failed {:.1}s after the kill; {} requests after it; {} streams in flight at the kill failed",
            r.hc_failed_after.as_secs_f64(),
            r.sent_after,
            r.errors_in_flight
        ),
    })
}

/// `SIGSTOP` of one worker under streaming traffic for 6 s, then `SIGCONT`.
pub async fn frozen_worker() -> anyhow::Result<Measured> {
    let stack = stacks::start(stacks::streaming()).await?;
    stacks::ready(&stack).await?;
    let bound = stacks::PER_TRY_MAX + Duration::from_millis(2_500);
    let r = workers::freeze_under_load(
        &stack,
        &traffic(Duration::from_secs(8)),
        Duration::from_secs(2),
        Duration::from_secs(6),
        bound,
        Duration::from_secs(30),
    )
    .await?;
    let after = after(&stack).await?;
    let (envoy_peak_kb, updater_peak_kb) = stacks::peaks(&stack, None);
    Ok(Measured {
        checks: table::freeze_checks(&r),
        after: Some(after),
        errors: r.errors_after + r.hung_in_flight,
        envoy_peak_kb,
        updater_peak_kb,
        detail: format!(
            "{} requests during the freeze, slowest {:.1}s (bound {:.1}s), {} tries timed out on the frozen worker, {} streams in flight at the freeze hung",
            r.sent_after,
            r.slowest_after.as_secs_f64(),
            bound.as_secs_f64(),
            r.try_timeouts,
            r.hung_in_flight
        ),
    })
}

const TRAP: &str = "/kvroute/trap";
const TRAP_THREADS: u32 = 3;

/// The filter VM of one Envoy worker thread aborts (the filter's `fault_injection.trap_path`);
/// clients pinned one to each thread keep sending for 8 s.
pub async fn vm_trap() -> anyhow::Result<Measured> {
    // Envoy hands each new connection to the thread with the fewest: pinned clients opened one
    // after the other land one on each thread.
    let at = "    per_connection_buffer_limit_bytes: 8388608\n";
    let balance = format!("{at}    connection_balance_config: {{ exact_balance: {{}} }}\n");
    let opts = StackOptions {
        pools: vec![Pool::demo(3)],
        envoy_concurrency: TRAP_THREADS,
        envoy_edits: vec![(at.into(), balance)],
        filter: json!({"fault_injection": {"trap_path": TRAP}}),
        ..stacks::release()
    };
    let stack = stacks::start(opts).await?;
    stacks::ready(&stack).await?;
    let clients = envoy_siege::pinned_clients(TRAP_THREADS as usize)?;
    let r = envoy_siege::trap_and_measure(
        &stack.base_url(),
        TRAP,
        MODEL,
        &clients,
        Duration::from_secs(8),
    )
    .await?;
    let after = after(&stack).await?;
    let (envoy_peak_kb, updater_peak_kb) = stacks::peaks(&stack, None);
    Ok(Measured {
        checks: table::trap_checks(&r),
        after: Some(after),
        errors: r.failed,
        envoy_peak_kb,
        updater_peak_kb,
        detail: format!(
            "trap answered {}; {} requests after it: {} routed, {} load-only, {} passed through, {} failed",
            r.trap_answer, r.sent, r.routed, r.load_only, r.passed_through, r.failed
        ),
    })
}

/// HTTP/2 requests ending with trailers, against the same requests without.
pub async fn trailers() -> anyhow::Result<Measured> {
    let opts = StackOptions {
        sim_args: ["--step-floor-ms", "20"].map(String::from).to_vec(),
        ..stacks::release()
    };
    let stack = stacks::start(opts).await?;
    stacks::ready(&stack).await?;
    let r = requests::trailers(&stack, MODEL, 10, 40).await;
    let after = after(&stack).await?;
    let (envoy_peak_kb, updater_peak_kb) = stacks::peaks(&stack, None);
    Ok(Measured {
        checks: table::trailers_checks(&r),
        after: Some(after),
        errors: r.with.errors + r.without.errors,
        envoy_peak_kb,
        updater_peak_kb,
        detail: format!(
            "{} small requests, a shed one and a 40-token stream each way (h2c)",
            r.with.sent
        ),
    })
}

/// A stack whose updater the bench runs under `limits`, worker 0's events from a publisher.
async fn updater_stack(
    limits: ChildLimits,
) -> anyhow::Result<(Stack, ZmtpPublisher, LimitedUpdater, u32)> {
    let stack = stacks::start(StackOptions { updater: false, ..stacks::release() }).await?;
    let publisher = ZmtpPublisher::bind().await?;
    let up = LimitedUpdater::start(&stack, Some(&publisher), limits).await?;
    let block_size = up.wait_subscribed(&publisher).await?;
    stacks::ready(&stack).await?;
    Ok((stack, publisher, up, block_size))
}

/// A 1 GiB address-space limit, under which the unbounded decoder aborted.
const ADDRESS_SPACE: u64 = 1 << 30;
const MIB60: usize = 60 << 20;

/// A normal batch after an attack on the updater's decoder, applied (`blocks` GPU blocks held
/// by the published worker afterwards).
async fn normal_batch_applied(
    publisher: &ZmtpPublisher,
    up: &LimitedUpdater,
    seq: u64,
    block_size: u32,
    blocks: u64,
) -> bool {
    if publisher
        .batch(seq, &bombs::stored(blocks, 10_000 * blocks as u32, block_size))
        .await
        .is_err()
    {
        return false;
    }
    kvroute_stack::eventually("a normal batch applied", Duration::from_secs(10), || async {
        let w = up.published_worker().await?;
        (w["blocks"]["GPU"].as_u64() == Some(blocks)).then_some(())
    })
    .await
    .is_ok()
}

/// Checks every updater row shares: still running, `/status` answering, under the ceiling.
async fn updater_alive(up: &mut LimitedUpdater, peak_kb: Option<u64>) -> Vec<Check> {
    let running = up.guard.try_exit().is_none();
    let answers = up.status().await.is_some();
    vec![
        Check::new(if running { "the updater runs" } else { "the updater exited" }, running),
        Check::new("/status answers", answers),
        table::ceiling_check(peak_kb),
    ]
}

/// Msgpack bombs from a worker's PUB socket: 60 MiB of nils, of nested maps, of a map of nil
/// pairs, and batches declaring 2^32-1 elements or bytes; the updater under a 1 GiB
/// address-space limit.
pub async fn msgpack_bomb() -> anyhow::Result<Measured> {
    let limits = ChildLimits { address_space: Some(ADDRESS_SPACE), nofile: None };
    let (stack, publisher, mut up, bs) = updater_stack(limits).await?;
    let mut seq = 0u64;
    let mut payloads: Vec<(String, Vec<u8>)> = vec![
        ("60 MiB array of nils".into(), bombs::nils(MIB60)),
        ("60 MiB nested maps".into(), bombs::nested_maps(MIB60)),
        ("60 MiB map of nil pairs".into(), bombs::wide_map(MIB60)),
    ];
    payloads.extend(bombs::declared_huge().into_iter().map(|(n, b)| (n.to_string(), b)));
    let mut refused = 0;
    for (what, payload) in &payloads {
        publisher.batch(seq, payload).await.with_context(|| format!("sending {what}"))?;
        seq += 1;
        if up.wait_seq(seq, what, Duration::from_secs(30)).await.is_ok() {
            refused += 1;
        }
    }
    drop(payloads);
    let applied = normal_batch_applied(&publisher, &up, seq, bs, 1).await;
    let status = up.published_worker().await.unwrap_or_default();
    let bad = status["stats"]["bad_batches"].as_u64().unwrap_or(0);
    let after = after(&stack).await?;
    let (envoy_peak_kb, updater_peak_kb) = stacks::peaks(&stack, Some(&up.guard));
    let n = bombs::declared_huge().len() + 3;
    let mut checks = updater_alive(&mut up, updater_peak_kb).await;
    checks.push(Check::new(
        format!("{refused} of {n} bombs passed (refused or read) in time"),
        refused == n,
    ));
    checks.push(Check::new(format!("{bad} bad batches counted (goal {n})"), bad == n as u64));
    checks.push(Check::new("a normal batch after the bombs applied", applied));
    Ok(Measured {
        checks,
        after: Some(after),
        errors: n - refused,
        envoy_peak_kb,
        updater_peak_kb,
        detail: format!("updater under prlimit --as={ADDRESS_SPACE}"),
    })
}

/// One message of 16 frames of 60 MiB (nils) after the topic and sequence frames.
pub async fn big_frames() -> anyhow::Result<Measured> {
    let limits = ChildLimits { address_space: Some(ADDRESS_SPACE), nofile: None };
    let (stack, publisher, mut up, bs) = updater_stack(limits).await?;
    let bomb = bombs::nils(MIB60);
    let seq = 0u64.to_be_bytes();
    let mut frames: Vec<&[u8]> = vec![b"", &seq];
    frames.extend(std::iter::repeat_n(&bomb[..], 16));
    let sent = publisher.send(&frames).await.is_ok();
    drop(frames);
    drop(bomb);
    let passed =
        up.wait_seq(1, "16 x 60 MiB in one message", Duration::from_secs(60)).await.is_ok();
    let applied = normal_batch_applied(&publisher, &up, 1, bs, 1).await;
    let after = after(&stack).await?;
    let (envoy_peak_kb, updater_peak_kb) = stacks::peaks(&stack, Some(&up.guard));
    let mut checks = updater_alive(&mut up, updater_peak_kb).await;
    checks.push(Check::new("the 960 MiB message was sent and passed in time", sent && passed));
    checks.push(Check::new("a normal batch after it applied", applied));
    Ok(Measured {
        checks,
        after: Some(after),
        errors: usize::from(!passed),
        envoy_peak_kb,
        updater_peak_kb,
        detail: format!("updater under prlimit --as={ADDRESS_SPACE}"),
    })
}

/// Idle connections (and some partial requests) of twice the updater's open-files limit held
/// against its HTTP listener while normal traffic goes through Envoy.
pub async fn updater_idle_flood() -> anyhow::Result<Measured> {
    const NOFILE: u64 = 256;
    let stack = stacks::start(StackOptions { updater: false, ..stacks::release() }).await?;
    let limits = ChildLimits { address_space: None, nofile: Some(NOFILE) };
    let mut up = LimitedUpdater::start(&stack, None, limits).await?;
    stacks::ready(&stack).await?;
    let addr = format!("127.0.0.1:{}", up.port);
    envoy_siege::ensure_own_nofile(2 * NOFILE + 256)?;
    let partial = open_partial(&addr, 32).await;
    let idle = open_idle(&addr, 2 * NOFILE as usize).await;
    let opened = idle.len() + partial.len();
    let during = after(&stack).await?;
    let status = up.status().await;
    let fds = up.guard.pid().and_then(fd_count).unwrap_or(0);
    drop(idle);
    drop(partial);
    let after = after(&stack).await?;
    let (envoy_peak_kb, updater_peak_kb) = stacks::peaks(&stack, Some(&up.guard));
    let mut checks = updater_alive(&mut up, updater_peak_kb).await;
    checks.push(Check::new(
        format!(
            "during the flood {}/{} requests succeeded and were routed",
            during.ok_routed, during.sent
        ),
        during.ok_routed == during.sent,
    ));
    checks.push(Check::new("/status answered during the flood", status.is_some()));
    checks.push(Check::new(format!("{fds} descriptors (limit {NOFILE})"), fds as u64 <= NOFILE));
    let http = status.map(|s| s["http"].clone()).unwrap_or_default();
    Ok(Measured {
        checks,
        after: Some(after),
        errors: during.sent - during.ok_routed,
        envoy_peak_kb,
        updater_peak_kb,
        detail: format!("{opened} connections opened at nofile {NOFILE}; updater http {http}"),
    })
}

/// Idle connections of twice Envoy's open-files limit (some stopped mid request line) held
/// against its listener; the connection cap set under the limit, as a deployment would.
pub async fn envoy_idle_flood() -> anyhow::Result<Measured> {
    const NOFILE: usize = 512;
    const CAP: usize = 400;
    let cap = "max_active_downstream_connections: 32768";
    let opts = StackOptions {
        envoy_edits: vec![(cap.into(), format!("max_active_downstream_connections: {CAP}"))],
        ..stacks::release()
    };
    let stack = stacks::start(opts).await?;
    stacks::ready(&stack).await?;
    let pid = stack.envoy.guard.pid().context("envoy is not running")?;
    // The attacker holds the flood, the clients and its own files.
    envoy_siege::ensure_own_nofile(2 * NOFILE as u64 + 256)?;
    envoy_siege::limit_nofile(pid, NOFILE as u64)?;
    let addr = stack.base_url().trim_start_matches("http://").to_owned();
    let flood = IdleFlood::open(&addr, 2 * NOFILE - 124, 124, Duration::from_secs(2)).await?;
    let served = envoy_siege::serve_through(
        &stack.base_url(),
        MODEL,
        10,
        Duration::from_secs(5),
        Duration::from_secs(30),
    )
    .await?;
    let (opened, partial) = (flood.opened, flood.partial);
    flood.close();
    let after = after(&stack).await?;
    let (envoy_peak_kb, updater_peak_kb) = stacks::peaks(&stack, None);
    Ok(Measured {
        checks: vec![
            Check::new(
                format!("the flood opened {opened} connections (at least {NOFILE})"),
                opened >= NOFILE,
            ),
            Check::new(
                format!(
                    "{}/10 requests served during the flood within 30 s ({} failed tries)",
                    served.ok, served.failed_tries
                ),
                served.ok == 10,
            ),
        ],
        after: Some(after),
        errors: served.failed_tries,
        envoy_peak_kb,
        updater_peak_kb,
        detail: format!(
            "{opened} connections ({partial} partial) at nofile {NOFILE}, connection cap {CAP}"
        ),
    })
}

/// ZMQ garbage from a worker's PUB socket: 1 000 messages without a sequence frame and 1 000
/// undecodable batches; every one counted, the log bounded (one line per kind and 10 s).
pub async fn zmq_garbage() -> anyhow::Result<Measured> {
    let (stack, publisher, mut up, _) = updater_stack(ChildLimits::default()).await?;
    let started = Instant::now();
    let malformed_before = up.log_lines("without an 8-byte sequence");
    let refused_before = up.log_lines("refused:");
    for _ in 0..1000 {
        publisher.send(&[b"", b"not-a-seq"]).await?;
    }
    for seq in 0..1000u64 {
        publisher.batch(seq, &[0xc1, 0xc1]).await?;
    }
    let counted =
        kvroute_stack::eventually("the garbage counted", Duration::from_secs(30), || async {
            let st = up.published_worker().await?["stats"].clone();
            (st["bad_batches"].as_u64() == Some(1000) && st["malformed_messages"] == 1000)
                .then_some(st)
        })
        .await;
    let allowed = 2 + started.elapsed().as_secs() as usize / 10;
    let malformed = up.log_lines("without an 8-byte sequence") - malformed_before;
    let refused = up.log_lines("refused:") - refused_before;
    let after = after(&stack).await?;
    let (envoy_peak_kb, updater_peak_kb) = stacks::peaks(&stack, Some(&up.guard));
    let mut checks = updater_alive(&mut up, updater_peak_kb).await;
    checks
        .push(Check::new("1000 malformed messages and 1000 bad batches counted", counted.is_ok()));
    checks.push(Check::new(
        format!("{malformed} + {refused} log lines for them (at most {allowed} each)"),
        malformed <= allowed && refused <= allowed,
    ));
    Ok(Measured {
        checks,
        after: Some(after),
        errors: 0,
        envoy_peak_kb,
        updater_peak_kb,
        detail: format!("sent in {:.1}s", started.elapsed().as_secs_f64()),
    })
}

/// Spellings of `/v1/chat/completions` over HTTP/1.1 and h2c, the shipped bootstrap.
pub async fn encoded_paths() -> anyhow::Result<Measured> {
    let stack = stacks::start(stacks::release()).await?;
    stacks::ready(&stack).await?;
    let tries = requests::encoded_paths(&stack, MODEL).await;
    let routed = tries.iter().filter(|t| matches!(t.outcome, PathOutcome::Routed(_))).count();
    let refused = tries.iter().filter(|t| matches!(t.outcome, PathOutcome::Refused(_))).count();
    let after = after(&stack).await?;
    let (envoy_peak_kb, updater_peak_kb) = stacks::peaks(&stack, None);
    Ok(Measured {
        checks: table::path_checks(&tries),
        after: Some(after),
        errors: tries.iter().filter(|t| t.outcome == PathOutcome::NoAnswer).count(),
        envoy_peak_kb,
        updater_peak_kb,
        detail: format!("{} tries: {routed} routed, {refused} refused by Envoy", tries.len()),
    })
}

/// `max_tokens` 2.0, "16", 1e1, 2^64-1 and 2.5; `"prompt": [[]]` and `[[], [1, 2]]`.
pub async fn odd_numbers() -> anyhow::Result<Measured> {
    let stack = stacks::start(stacks::release()).await?;
    stacks::ready(&stack).await?;
    let tries = requests::odd_numbers(&stack, MODEL).await;
    let took: Vec<String> =
        tries.iter().map(|t| format!("{} {:.2}s", t.name, t.took.as_secs_f64())).collect();
    let after = after(&stack).await?;
    let (envoy_peak_kb, updater_peak_kb) = stacks::peaks(&stack, None);
    Ok(Measured {
        checks: table::odd_checks(&tries),
        after: Some(after),
        errors: tries.iter().filter(|t| t.got.is_none()).count(),
        envoy_peak_kb,
        updater_peak_kb,
        detail: format!("answered in: {}", took.join(", ")),
    })
}
