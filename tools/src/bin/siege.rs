//! kvroute-siege: every siege attack against the release stack (three
//! simulated workers, Envoy with the filter and the shipped bootstrap, the updater), each on a
//! fresh stack and bounded in time, then the table: attack, normal requests after it that
//! succeeded and were routed with knowledge (x/y), errors, peak memory (`VmHWM`) of Envoy and
//! of the updater, and the result against the attack's goal (`siege::table`).
//!
//! Run: `target/release/kvroute-siege [--only <attack>]... [--json <file>]` after
//! `./dev build`. Exits 1 when a row fails.

#[path = "siege/attacks.rs"]
mod attacks;
#[path = "siege/stacks.rs"]
mod stacks;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use kvroute_stack::siege::table::{self, Ran, Row, SiegeVerdict};

#[derive(Parser, Debug)]
#[command(about = "Attacks against the release stack, and the table of what survived")]
struct Args {
    /// Run only these attacks (their keys, see `--list`).
    #[arg(long)]
    only: Vec<String>,
    /// Also write the table as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The longest one attack (its stack included) may take, in seconds.
    #[arg(long, default_value_t = 240)]
    attack_timeout_s: u64,
    /// List the attacks and exit.
    #[arg(long)]
    list: bool,
}

/// An attack: its key for `--only`, its name in the table and its goal.
struct Attack {
    key: &'static str,
    name: &'static str,
    goal: &'static str,
    /// Tools it needs on this machine (`prlimit`).
    needs_prlimit: bool,
}

const ATTACKS: [Attack; 11] = [
    Attack {
        key: "killed-worker",
        name: "killed worker (kill -9 under load)",
        goal: "0 new requests sent to it after its health check fails (+ one interval)",
        needs_prlimit: false,
    },
    Attack {
        key: "frozen-worker",
        name: "frozen worker (SIGSTOP 6 s under load)",
        goal: "0 requests wait past the per-try timeout",
        needs_prlimit: false,
    },
    Attack {
        key: "vm-trap",
        name: "VM trap",
        goal: "routing back on that thread within 5 s, 0 requests answered 503 because of it",
        needs_prlimit: false,
    },
    Attack {
        key: "trailers",
        name: "HTTP/2 trailers",
        goal: "routed, shed and counted as without them",
        needs_prlimit: false,
    },
    Attack {
        key: "msgpack-bomb",
        name: "msgpack bombs (60 MiB, 2^32-1 declared)",
        goal: "updater RSS under 512 MiB and it keeps serving",
        needs_prlimit: true,
    },
    Attack {
        key: "big-frames",
        name: "16 x 60 MiB frames in one message",
        goal: "updater RSS under 512 MiB and it keeps serving",
        needs_prlimit: true,
    },
    Attack {
        key: "updater-idle-flood",
        name: "idle flood vs updater (2x its fd limit)",
        goal: "normal requests keep succeeding",
        needs_prlimit: true,
    },
    Attack {
        key: "envoy-idle-flood",
        name: "idle flood vs Envoy (2x its fd limit)",
        goal: "normal requests keep succeeding",
        needs_prlimit: true,
    },
    Attack {
        key: "zmq-garbage",
        name: "ZMQ garbage flood",
        goal: "every malformed message counted, log lines bounded",
        needs_prlimit: true,
    },
    Attack {
        key: "encoded-paths",
        name: "percent-encoded and odd paths",
        goal: "no spelling of a kvroute endpoint served unrouted",
        needs_prlimit: false,
    },
    Attack {
        key: "odd-numbers",
        name: "odd numbers (max_tokens 2.0, 2^64-1, prompt [[]])",
        goal: "answered as vLLM 0.33 answers them",
        needs_prlimit: false,
    },
];

async fn run(key: &str) -> anyhow::Result<attacks::Measured> {
    match key {
        "killed-worker" => attacks::killed_worker().await,
        "frozen-worker" => attacks::frozen_worker().await,
        "vm-trap" => attacks::vm_trap().await,
        "trailers" => attacks::trailers().await,
        "msgpack-bomb" => attacks::msgpack_bomb().await,
        "big-frames" => attacks::big_frames().await,
        "updater-idle-flood" => attacks::updater_idle_flood().await,
        "envoy-idle-flood" => attacks::envoy_idle_flood().await,
        "zmq-garbage" => attacks::zmq_garbage().await,
        "encoded-paths" => attacks::encoded_paths().await,
        "odd-numbers" => attacks::odd_numbers().await,
        other => anyhow::bail!("no attack {other:?}"),
    }
}

fn have_prlimit() -> bool {
    std::process::Command::new("prlimit")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

async fn row(a: &Attack, bound: Duration) -> Row {
    let mut row = Row::not_measured(a.name, a.goal, "");
    if a.needs_prlimit && !have_prlimit() {
        row.ran = Ran::NotMeasured("prlimit (util-linux) is not installed".into());
        return row;
    }
    match tokio::time::timeout(bound, run(a.key)).await {
        Ok(Ok(m)) => {
            row.ran = Ran::Yes;
            row.checks = m.checks;
            row.after = m.after;
            row.errors = m.errors;
            row.envoy_peak_kb = m.envoy_peak_kb;
            row.updater_peak_kb = m.updater_peak_kb;
            row.detail = m.detail;
        }
        Ok(Err(e)) => row.ran = Ran::Broke(format!("{e:#}")),
        Err(_) => row.ran = Ran::Broke(format!("not done within {}s", bound.as_secs())),
    }
    row
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.list {
        for a in &ATTACKS {
            println!("{:20} {} (goal: {})", a.key, a.name, a.goal);
        }
        return Ok(());
    }
    for k in &args.only {
        anyhow::ensure!(ATTACKS.iter().any(|a| a.key == k), "no attack {k:?} (see --list)");
    }
    let bound = Duration::from_secs(args.attack_timeout_s);
    let mut rows = Vec::new();
    for a in ATTACKS.iter().filter(|a| args.only.is_empty() || args.only.iter().any(|k| k == a.key))
    {
        let t0 = Instant::now();
        eprintln!("==> {}", a.name);
        let r = row(a, bound).await;
        eprintln!("    {} ({:.0}s)", r.verdict().label(), t0.elapsed().as_secs_f64());
        rows.push(r);
    }
    println!("{}", table::markdown(&rows));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&table::json(&rows))?)?;
    }
    if rows.iter().any(|r| matches!(r.verdict(), SiegeVerdict::Fail(_))) {
        std::process::exit(1);
    }
    Ok(())
}
