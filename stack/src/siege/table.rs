//! The `kvroute-siege` table: one [`Row`] per attack, and the pass logic, which makes each
//! attack's goal exact. A row passes when every one of its [`Check`]s is met and
//! every normal request sent after the attack succeeded and was routed with knowledge; a row
//! whose attack could not run is "not measured", never a pass.
//!
//! The `*_checks` functions turn an attack's report into its checks (pure, unit-tested); the
//! bench (`tools/src/bin/siege.rs`) runs the attacks and renders the rows ([`markdown`], [`json`]).

use std::time::Duration;

use serde_json::{json, Value};

use super::envoy::TrapReport;
use super::requests::{After, OddTry, PathTry, TrailersReport};
use super::workers::{FreezeReport, KillReport};

/// The updater's stated memory ceiling under every bomb (peak resident set).
pub const UPDATER_CEILING_KB: u64 = 512 * 1024;
/// How soon routing must come back on a trapped VM's thread.
pub const TRAP_RECOVERY: Duration = Duration::from_secs(5);
/// Fewest requests an attack on a worker must see after it to be judged.
pub const MIN_TRAFFIC: usize = 10;

/// One condition of an attack's goal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub what: String,
    pub met: bool,
}

impl Check {
    pub fn new(what: impl Into<String>, met: bool) -> Check {
        Check { what: what.into(), met }
    }
}

/// Whether an attack ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// Measured: the checks and the probe after it say how it went.
    Yes,
    /// The attack could not be made (its primitive is missing, a tool is absent): why.
    NotMeasured(String),
    /// The attack or its stack failed (an error, or its time bound ran out): what happened.
    Broke(String),
}

/// One attack as the bench reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub attack: String,
    /// The goal, in words.
    pub goal: String,
    pub ran: Ran,
    pub checks: Vec<Check>,
    /// Normal requests after the attack; `None` when none were sent.
    pub after: Option<After>,
    /// Requests of the attack itself (or of traffic during it) that failed.
    pub errors: usize,
    /// Peak resident memory (`VmHWM`, kB) of Envoy and of the updater over the attack.
    pub envoy_peak_kb: Option<u64>,
    pub updater_peak_kb: Option<u64>,
    /// The attack's own figures, in a few words.
    pub detail: String,
}

/// A row's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SiegeVerdict {
    Pass,
    /// What was not met.
    Fail(Vec<String>),
    NotMeasured(String),
}

impl SiegeVerdict {
    pub fn label(&self) -> String {
        match self {
            SiegeVerdict::Pass => "pass".into(),
            SiegeVerdict::Fail(why) => format!("FAIL: {}", why.join("; ")),
            SiegeVerdict::NotMeasured(why) => format!("not measured: {why}"),
        }
    }
}

impl Row {
    /// A row for an attack that was not made.
    pub fn not_measured(attack: &str, goal: &str, why: &str) -> Row {
        Row {
            attack: attack.into(),
            goal: goal.into(),
            ran: Ran::NotMeasured(why.into()),
            checks: Vec::new(),
            after: None,
            errors: 0,
            envoy_peak_kb: None,
            updater_peak_kb: None,
            detail: String::new(),
        }
    }

    /// The pass logic: every check met, and every request after the attack (at least one)
    /// succeeded and was routed with knowledge.
    pub fn verdict(&self) -> SiegeVerdict {
        match &self.ran {
            Ran::NotMeasured(why) => return SiegeVerdict::NotMeasured(why.clone()),
            Ran::Broke(what) => return SiegeVerdict::Fail(vec![what.clone()]),
            Ran::Yes => {}
        }
        let mut unmet: Vec<String> =
            self.checks.iter().filter(|c| !c.met).map(|c| c.what.clone()).collect();
        match self.after {
            Some(a) if a.sent > 0 && a.ok_routed == a.sent => {}
            Some(a) => unmet.push(format!(
                "{}/{} requests after it succeeded and were routed",
                a.ok_routed, a.sent
            )),
            None => unmet.push("no request sent after it".into()),
        }
        if unmet.is_empty() {
            SiegeVerdict::Pass
        } else {
            SiegeVerdict::Fail(unmet)
        }
    }
}

/// Killed worker: no attempt on it once its health check failed (plus one interval), no
/// error for requests sent after the kill, enough traffic to tell.
pub fn kill_checks(r: &KillReport) -> Vec<Check> {
    vec![
        Check::new(
            format!("{} attempts on the killed worker after its health check failed + 1 interval (goal 0)", r.attempts_after_hc.attempts()),
            r.attempts_after_hc.attempts() == 0,
        ),
        Check::new(
            format!("{} errors among requests sent after the kill (goal 0)", r.errors_after),
            r.errors_after == 0,
        ),
        Check::new(
            format!("{} requests after the kill (at least {MIN_TRAFFIC})", r.sent_after),
            r.sent_after >= MIN_TRAFFIC,
        ),
    ]
}

/// Frozen worker: no request sent during the freeze waits past the bound (per-try timeout plus
/// the request's own time), enough traffic to tell, and the worker serves again once continued.
pub fn freeze_checks(r: &FreezeReport) -> Vec<Check> {
    vec![
        Check::new(
            format!("{} requests waited past the per-try timeout (goal 0)", r.waited_past_bound),
            r.waited_past_bound == 0,
        ),
        Check::new(
            format!("{} requests during the freeze (at least {MIN_TRAFFIC})", r.sent_after),
            r.sent_after >= MIN_TRAFFIC,
        ),
        Check::new("the worker serves again once continued", r.served_again),
    ]
}

/// VM trap: no request failed because of it (no 503), none bypassed the filter, and routing
/// with knowledge back on every thread within [`TRAP_RECOVERY`].
pub fn trap_checks(r: &TrapReport) -> Vec<Check> {
    let back = r.recovered_after.is_some_and(|t| t <= TRAP_RECOVERY);
    vec![
        Check::new(format!("{} requests failed after the trap (goal 0)", r.failed), r.failed == 0),
        Check::new(
            format!("{} requests passed through unrouted (goal 0)", r.passed_through),
            r.passed_through == 0,
        ),
        Check::new(
            format!(
                "routing back within {}s (after {})",
                TRAP_RECOVERY.as_secs(),
                r.recovered_after.map_or("never".into(), |t| format!("{:.1}s", t.as_secs_f64()))
            ),
            back,
        ),
    ]
}

/// Trailers: routed, shed and counted in flight as without them.
pub fn trailers_checks(r: &TrailersReport) -> Vec<Check> {
    let (w, wo) = (&r.with, &r.without);
    vec![
        Check::new(
            format!(
                "routed {}/{} with trailers, {}/{} without",
                w.routed, w.sent, wo.routed, wo.sent
            ),
            w.sent > 0 && w.routed == w.sent && wo.routed == wo.sent,
        ),
        Check::new(
            format!(
                "shed: {:?} with trailers, {:?} without (goal 429 both)",
                w.shed_status, wo.shed_status
            ),
            w.shed_status == Some(429) && wo.shed_status == Some(429),
        ),
        Check::new(
            format!("counted in flight: {} with trailers, {} without", w.counted, wo.counted),
            w.counted && wo.counted,
        ),
    ]
}

/// Odd paths: none served by a worker without kvroute deciding, every one answered.
pub fn path_checks(tries: &[PathTry]) -> Vec<Check> {
    let bypassed: Vec<String> = tries
        .iter()
        .filter(|t| t.bypassed())
        .map(|t| format!("{} {}", t.proto.name(), t.path))
        .collect();
    let unanswered =
        tries.iter().filter(|t| t.outcome == super::envoy::PathOutcome::NoAnswer).count();
    vec![
        Check::new(
            format!(
                "{} of {} served unrouted (goal 0){}",
                bypassed.len(),
                tries.len(),
                if bypassed.is_empty() {
                    String::new()
                } else {
                    format!(": {}", bypassed.join(", "))
                }
            ),
            bypassed.is_empty() && !tries.is_empty(),
        ),
        Check::new(format!("{unanswered} not answered (goal 0)"), unanswered == 0),
    ]
}

/// Odd numbers: each answered in time with vLLM's status (and routed when served).
pub fn odd_checks(tries: &[OddTry]) -> Vec<Check> {
    tries
        .iter()
        .map(|t| {
            let got = t.got.map_or("no answer".into(), |s| s.to_string());
            let routed = if t.want == 200 {
                if t.routed {
                    ", routed"
                } else {
                    ", not routed"
                }
            } else {
                ""
            };
            Check::new(format!("{}: {got}{routed} (vLLM: {})", t.name, t.want), t.as_vllm())
        })
        .collect()
}

/// The updater's peak memory under the ceiling (a reading is needed: a gone updater fails).
pub fn ceiling_check(updater_peak_kb: Option<u64>) -> Check {
    let what = match updater_peak_kb {
        Some(kb) => {
            format!("updater peak {} MiB (ceiling {} MiB)", kb / 1024, UPDATER_CEILING_KB / 1024)
        }
        None => "updater peak memory unreadable (not running)".into(),
    };
    Check::new(what, updater_peak_kb.is_some_and(|kb| kb < UPDATER_CEILING_KB))
}

fn mib(kb: Option<u64>) -> String {
    kb.map_or("-".into(), |kb| format!("{:.0} MiB", kb as f64 / 1024.0))
}

/// The table as Markdown: attack, requests after it that succeeded and were routed, errors,
/// peak memory of Envoy and of the updater, result; then each row's figures.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| attack | after: ok & routed | errors | RSS peak Envoy | RSS peak updater | result |\n\
         |---|---|---|---|---|---|\n",
    );
    for r in rows {
        let after = r.after.map_or("-".into(), |a| format!("{}/{}", a.ok_routed, a.sent));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.attack,
            after,
            r.errors,
            mib(r.envoy_peak_kb),
            mib(r.updater_peak_kb),
            r.verdict().label().replace('|', "/")
        ));
    }
    out.push('\n');
    for r in rows {
        out.push_str(&format!("- **{}** (goal: {})", r.attack, r.goal));
        if !r.detail.is_empty() {
            out.push_str(&format!(": {}", r.detail));
        }
        let checks: Vec<String> = r
            .checks
            .iter()
            .map(|c| format!("{} {}", if c.met { "✓" } else { "✗" }, c.what))
            .collect();
        if !checks.is_empty() {
            out.push_str(&format!(" — {}", checks.join("; ")));
        }
        out.push('\n');
    }
    out
}

/// The table as JSON (one object per row).
pub fn json(rows: &[Row]) -> Value {
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            let verdict = r.verdict();
            json!({
                "attack": r.attack,
                "goal": r.goal,
                "result": match &verdict {
                    SiegeVerdict::Pass => "pass",
                    SiegeVerdict::Fail(_) => "fail",
                    SiegeVerdict::NotMeasured(_) => "not measured",
                },
                "why": match verdict {
                    SiegeVerdict::Pass => Vec::new(),
                    SiegeVerdict::Fail(w) => w,
                    SiegeVerdict::NotMeasured(w) => vec![w],
                },
                "after": r.after.map(|a| json!({"sent": a.sent, "ok_routed": a.ok_routed, "failed": a.failed})),
                "errors": r.errors,
                "envoy_peak_kb": r.envoy_peak_kb,
                "updater_peak_kb": r.updater_peak_kb,
                "checks": r.checks.iter().map(|c| json!({"what": c.what, "met": c.met})).collect::<Vec<_>>(),
                "detail": r.detail,
            })
        })
        .collect();
    json!({"rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rawhttp::Proto;
    use crate::siege::envoy::PathOutcome;
    use crate::siege::requests::TrailersSide;
    use crate::siege::workers::HostCounters;

    fn row(checks: Vec<Check>, after: Option<After>) -> Row {
        Row {
            attack: "a".into(),
            goal: "g".into(),
            ran: Ran::Yes,
            checks,
            after,
            errors: 0,
            envoy_peak_kb: Some(40_000),
            updater_peak_kb: None,
            detail: String::new(),
        }
    }

    const ALL_OK: Option<After> = Some(After { sent: 20, ok_routed: 20, failed: 0 });

    #[test]
    fn a_row_passes_only_with_every_check_met_and_every_later_request_routed() {
        assert_eq!(row(vec![Check::new("x", true)], ALL_OK).verdict(), SiegeVerdict::Pass);
        let unmet = row(vec![Check::new("x", true), Check::new("y", false)], ALL_OK);
        assert_eq!(unmet.verdict(), SiegeVerdict::Fail(vec!["y".into()]));
        let one_unrouted = row(vec![], Some(After { sent: 20, ok_routed: 19, failed: 0 }));
        assert_eq!(
            one_unrouted.verdict(),
            SiegeVerdict::Fail(vec!["19/20 requests after it succeeded and were routed".into()])
        );
        assert!(matches!(row(vec![], Some(After::default())).verdict(), SiegeVerdict::Fail(_)));
        assert!(matches!(row(vec![], None).verdict(), SiegeVerdict::Fail(_)));
        let missing = Row::not_measured("a", "g", "its primitive has not landed");
        assert_eq!(
            missing.verdict(),
            SiegeVerdict::NotMeasured("its primitive has not landed".into())
        );
        let mut broke = row(vec![Check::new("x", true)], ALL_OK);
        broke.ran = Ran::Broke("timed out after 120s".into());
        assert_eq!(broke.verdict(), SiegeVerdict::Fail(vec!["timed out after 120s".into()]));
    }

    #[test]
    fn each_attacks_checks_hold_its_goal() {
        let met = |c: &[Check]| c.iter().all(|c| c.met);
        let kill = KillReport { sent_after: 40, ..Default::default() };
        assert!(met(&kill_checks(&kill)));
        let one_attempt = KillReport {
            attempts_after_hc: HostCounters { rq_total: 0, cx_connect_fail: 1, rq_timeout: 0 },
            ..kill.clone()
        };
        assert!(!met(&kill_checks(&one_attempt)));
        assert!(!met(&kill_checks(&KillReport { errors_after: 1, ..kill.clone() })));
        assert!(!met(&kill_checks(&KillReport { sent_after: 3, ..kill })));

        let freeze = FreezeReport { sent_after: 30, served_again: true, ..Default::default() };
        assert!(met(&freeze_checks(&freeze)));
        assert!(!met(&freeze_checks(&FreezeReport { waited_past_bound: 1, ..freeze.clone() })));
        assert!(!met(&freeze_checks(&FreezeReport { served_again: false, ..freeze })));

        let trap = TrapReport {
            sent: 90,
            routed: 85,
            load_only: 5,
            recovered_after: Some(Duration::from_millis(1500)),
            ..Default::default()
        };
        assert!(met(&trap_checks(&trap)));
        assert!(!met(&trap_checks(&TrapReport { failed: 1, ..trap.clone() })));
        assert!(!met(&trap_checks(&TrapReport { recovered_after: None, ..trap.clone() })));
        let slow = TrapReport { recovered_after: Some(Duration::from_millis(5100)), ..trap };
        assert!(!met(&trap_checks(&slow)));

        let side =
            TrailersSide { sent: 5, routed: 5, shed_status: Some(429), counted: true, errors: 0 };
        let alike = TrailersReport { with: side.clone(), without: side.clone() };
        assert!(met(&trailers_checks(&alike)) && alike.alike());
        for with in [
            TrailersSide { routed: 4, ..side.clone() },
            TrailersSide { shed_status: Some(200), ..side.clone() },
            TrailersSide { counted: false, ..side.clone() },
        ] {
            let r = TrailersReport { with, without: side.clone() };
            assert!(!met(&trailers_checks(&r)) && !r.alike(), "{r:?}");
        }

        let path = |outcome| PathTry { path: "/v1/chat/%63ompletions", proto: Proto::H2c, outcome };
        let fine = [
            path(PathOutcome::Routed(200)),
            path(PathOutcome::Refused(400)),
            path(PathOutcome::PassedThrough(404)),
        ];
        assert!(met(&path_checks(&fine)));
        assert!(!met(&path_checks(&[path(PathOutcome::PassedThrough(200))])));
        assert!(!met(&path_checks(&[path(PathOutcome::NoAnswer)])));
        assert!(!met(&path_checks(&[])));

        let odd = |want, got, routed| OddTry { name: "n", want, got, routed, took: Duration::ZERO };
        assert!(met(&odd_checks(&[odd(200, Some(200), true), odd(400, Some(400), false)])));
        assert!(!met(&odd_checks(&[odd(200, Some(200), false)])));
        assert!(!met(&odd_checks(&[odd(400, None, false)])));
        assert!(!met(&odd_checks(&[odd(200, Some(400), false)])));

        assert!(ceiling_check(Some(100 * 1024)).met);
        assert!(!ceiling_check(Some(UPDATER_CEILING_KB)).met);
        assert!(!ceiling_check(None).met);
    }

    #[test]
    fn the_table_shows_every_row_and_its_result() {
        let rows = vec![
            row(vec![Check::new("x", true)], ALL_OK),
            Row::not_measured("zmq garbage", "counted", "no primitive"),
        ];
        let md = markdown(&rows);
        assert!(md.contains("| a | 20/20 | 0 | 39 MiB | - | pass |"), "{md}");
        assert!(
            md.contains("| zmq garbage | - | 0 | - | - | not measured: no primitive |"),
            "{md}"
        );
        let j = json(&rows);
        assert_eq!(j["rows"][0]["result"], "pass");
        assert_eq!(j["rows"][1]["result"], "not measured");
    }
}
