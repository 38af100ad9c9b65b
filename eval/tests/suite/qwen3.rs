//! A short benchmark on Qwen3's real tokenizer and chat template, as a user runs it: the
//! release `kvroute-bench` with `eval/tests/plans/qwen3-short.toml` (two Envoys of two worker
//! threads, chat prompts that the filter and the workers render and tokenize, the Qwen3 bundle
//! distributed by the updater). It must finish, serve every request, and kvroute's decisions
//! must credit the cache. `./dev setup` fetches the Qwen3 bundle; `./dev build` the binaries.

use std::process::Command;
use std::time::{Duration, Instant};

use kvroute_eval::report::Report;
use kvroute_stack::paths;

#[test]
fn a_short_qwen3_bench_with_two_envoys_and_chat_prompts_completes() {
    let root = paths::repo_root();
    let plan = root.join("eval/tests/plans/qwen3-short.toml");
    let out = paths::scratch_dir("qwen3-bench").unwrap();
    let bench = root.join("target/release/kvroute-bench");
    assert!(bench.exists(), "{} missing: run ./dev build", bench.display());
    let started = Instant::now();
    let mut child = Command::new(&bench)
        .arg("--plan")
        .arg(&plan)
        .arg("--out")
        .arg(&out)
        .arg("--quiet")
        .spawn()
        .unwrap();
    // The bench stops every process it started, also on failure; bounded here all the same.
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(900) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvroute-bench ran for more than 15 minutes");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.success(), "kvroute-bench failed ({status}); results in {}", out.display());
    let text = std::fs::read_to_string(out.join("multi-turn/report.json")).unwrap();
    let report: Report = serde_json::from_str(&text).unwrap();
    for name in ["kvroute", "least-request"] {
        let p = report.policy(name).unwrap_or_else(|| panic!("{name} missing from the report"));
        let (requests, ok) = p.cohorts.iter().fold((0, 0), |(r, o), c| (r + c.requests, o + c.ok));
        assert!(requests > 0 && ok == requests, "{name}: {ok} of {requests} served");
    }
    let kv = report.policy("kvroute").unwrap();
    let credited = kv.cohorts.iter().map(|c| c.audit.hit_as_predicted).sum::<usize>();
    assert!(credited > 0, "kvroute's decisions never met a cached prefix: {:?}", kv.cohorts);
    eprintln!(
        "qwen3 bench: {:.0} s, results in {}",
        started.elapsed().as_secs_f64(),
        out.display()
    );
}
