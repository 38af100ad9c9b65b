//! What happened to each request, and the table per class and phase.

use std::time::Duration;

use kvroute_stack::client::Reply;

use super::plan::{Arrival, Class, Phase};

/// One request's fate.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub arrival: Arrival,
    /// When it was really sent, from the start of the overload.
    pub sent: Duration,
    /// `None`: no HTTP answer (a transport error).
    pub status: Option<u16>,
    pub ttft_ms: f64,
    /// The filter's estimate, from the decision header.
    pub predicted_ttft_ms: Option<f64>,
    /// The decision header's estimated wait, what admission promised, and the chosen worker
    /// (of a shed request: the worker with the best promise, and that promise).
    pub predicted_wait_ms: Option<f64>,
    pub promised_ttft_ms: Option<f64>,
    pub worker: Option<String>,
}

impl Outcome {
    pub fn of(arrival: Arrival, sent: Duration, reply: anyhow::Result<Reply>) -> Outcome {
        match reply {
            Ok(r) => Outcome {
                arrival,
                sent,
                status: Some(r.status),
                ttft_ms: r.ttft.as_secs_f64() * 1e3,
                predicted_ttft_ms: r
                    .decision_field("predicted_ttft_ms")
                    .and_then(|v| v.parse().ok()),
                predicted_wait_ms: r
                    .decision_field("predicted_wait_ms")
                    .and_then(|v| v.parse().ok()),
                promised_ttft_ms: r.decision_field("promised_ttft_ms").and_then(|v| v.parse().ok()),
                // A shed request's header names the worker with the best promise.
                worker: r.decision_field("worker").or_else(|| r.decision_field("best_worker")),
            },
            Err(e) => {
                eprintln!("request {} failed: {e:#}", arrival.id);
                Outcome {
                    arrival,
                    sent,
                    status: None,
                    ttft_ms: 0.0,
                    predicted_ttft_ms: None,
                    predicted_wait_ms: None,
                    promised_ttft_ms: None,
                    worker: None,
                }
            }
        }
    }

    fn admitted(&self) -> bool {
        self.status == Some(200)
    }

    /// Whether an admitted request got what its class promises: its deadline, or a wait (TTFT
    /// beyond the idle TTFT) within `max_wait_ms`.
    fn kept(&self, idle_ms: f64, max_wait_ms: f64) -> bool {
        match (self.arrival.class, self.arrival.deadline_ms) {
            (Class::Interactive, Some(d)) => self.ttft_ms <= d as f64,
            (Class::Interactive, None) => true,
            (Class::Batch, _) => self.ttft_ms - idle_ms <= max_wait_ms,
        }
    }

    /// (predicted − actual) / actual.
    fn estimate_error(&self) -> Option<f64> {
        let p = self.predicted_ttft_ms?;
        (self.ttft_ms > 0.0).then(|| (p - self.ttft_ms) / self.ttft_ms)
    }
}

fn quantile(v: Vec<f64>, p: f64) -> String {
    kvroute_stack::quantile(&v, p).map_or("-".into(), |x| format!("{x:.0}"))
}

fn pct(n: usize, of: usize) -> String {
    if of == 0 {
        "-".into()
    } else {
        format!("{:.0} %", 100.0 * n as f64 / of as f64)
    }
}

/// One CSV row per request, in arrival order: when it was sent, its class, phase and
/// deadline, the answer, the TTFT, the filter's estimates, the worker, and whether it kept
/// its promise (admitted requests only).
pub fn csv(all: &[Outcome], idle_ms: f64, max_wait_ms: f64) -> String {
    let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.1}"));
    let mut out = String::from(
        "id,sent_ms,class,phase,deadline_ms,status,ttft_ms,predicted_ttft_ms,predicted_wait_ms,promised_ttft_ms,worker,kept\n",
    );
    for o in all {
        let kept =
            if o.admitted() { o.kept(idle_ms, max_wait_ms).to_string() } else { String::new() };
        out.push_str(&format!(
            "{},{:.1},{},{},{},{},{:.1},{},{},{},{},{}\n",
            o.arrival.id,
            o.sent.as_secs_f64() * 1e3,
            o.arrival.class.name(),
            o.arrival.phase.name(),
            o.arrival.deadline_ms.map_or(String::new(), |d| d.to_string()),
            o.status.map_or(String::new(), |s| s.to_string()),
            o.ttft_ms,
            opt(o.predicted_ttft_ms),
            opt(o.predicted_wait_ms),
            opt(o.promised_ttft_ms),
            o.worker.as_deref().unwrap_or(""),
            kept
        ));
    }
    out
}

/// Prints the table, the promises kept overall, each replica's share of the overload's
/// interactive requests (where `replicas` > 1; arrival `id` went to replica `id % replicas`),
/// and the return after the overload.
pub fn print(
    all: &[Outcome],
    (idle_ms, max_wait_ms): (f64, f64),
    overload_end: Duration,
    replicas: usize,
) {
    println!(
        "\n{:<12} {:<9} {:>5} {:>8} {:>5} {:>6} {:>12} {:>9} {:>9} {:>11} {:>11}",
        "class",
        "phase",
        "sent",
        "admitted",
        "shed",
        "failed",
        "kept",
        "TTFT p50",
        "TTFT p99",
        "est err p50",
        "within 15 %"
    );
    for class in Class::ALL {
        for phase in Phase::ALL {
            let rows: Vec<&Outcome> = all
                .iter()
                .filter(|o| o.arrival.class == class && o.arrival.phase == phase)
                .collect();
            let admitted: Vec<&&Outcome> = rows.iter().filter(|o| o.admitted()).collect();
            let shed = rows.iter().filter(|o| o.status == Some(429)).count();
            let failed = rows.len() - admitted.len() - shed;
            let kept = admitted.iter().filter(|o| o.kept(idle_ms, max_wait_ms)).count();
            let ttft: Vec<f64> = admitted.iter().map(|o| o.ttft_ms).collect();
            let errors: Vec<f64> = admitted.iter().filter_map(|o| o.estimate_error()).collect();
            let within = errors.iter().filter(|e| e.abs() <= 0.15).count();
            println!(
                "{:<12} {:<9} {:>5} {:>8} {:>5} {:>6} {:>12} {:>9} {:>9} {:>11} {:>11}",
                class.name(),
                phase.name(),
                rows.len(),
                admitted.len(),
                shed,
                failed,
                format!("{kept} ({})", pct(kept, admitted.len())),
                quantile(ttft.clone(), 0.5),
                quantile(ttft, 0.99),
                quantile(errors.iter().map(|e| e * 100.0).collect(), 0.5) + " %",
                pct(within, errors.len())
            );
        }
    }
    let admitted: Vec<&Outcome> = all.iter().filter(|o| o.admitted()).collect();
    let kept = admitted.iter().filter(|o| o.kept(idle_ms, max_wait_ms)).count();
    println!(
        "\nadmitted requests that kept their promise: {kept} of {} ({})",
        admitted.len(),
        pct(kept, admitted.len())
    );
    for r in (0..replicas).filter(|_| replicas > 1) {
        let (sent, admitted, kept) = replica_share(all, r, replicas, (idle_ms, max_wait_ms));
        println!(
            "replica {}: interactive in the overload: {admitted} of {sent} admitted, {kept} kept ({})",
            r + 1,
            pct(kept, admitted)
        );
    }
    let p99 = |c: Class| {
        let v: Vec<f64> =
            admitted.iter().filter(|o| o.arrival.class == c).map(|o| o.ttft_ms).collect();
        quantile(v, 0.99)
    };
    println!(
        "TTFT p99 of admitted requests: interactive {} ms, batch {} ms",
        p99(Class::Interactive),
        p99(Class::Batch)
    );
    let after: Vec<&Outcome> = all
        .iter()
        .filter(|o| o.arrival.phase == Phase::After && o.arrival.class == Class::Interactive)
        .collect();
    let first = after.iter().position(|o| o.admitted());
    // Meetable on an idle pool; what each met is the backlog at its send.
    let backlog: Vec<usize> = after.iter().map(|o| waiting_at(all, o.sent)).collect();
    let counts = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
    let refused = &after[..first.unwrap_or(after.len())];
    if !refused.is_empty() {
        println!("after the overload: {}", shed_promises(refused));
    }
    match first {
        Some(i) => println!(
            "after the overload: deadlines meetable on an idle pool not admitted before the first admitted one: {i}; first admitted {:.1} s after the overload ended; admitted requests waiting for a first token at each send, up to that one: {}",
            after[i].sent.saturating_sub(overload_end).as_secs_f64(),
            counts(&backlog[..=i])
        ),
        None => println!(
            "after the overload: none of {} deadlines meetable on an idle pool was admitted; admitted requests waiting for a first token at each send: {}",
            after.len(),
            counts(&backlog)
        ),
    }
}

/// What the filter promised the requests it shed (their decision header's best promise),
/// against the deadlines they sent.
fn shed_promises(shed: &[&Outcome]) -> String {
    let promised: Vec<f64> = shed.iter().filter_map(|o| o.promised_ttft_ms).collect();
    let deadlines: Vec<f64> =
        shed.iter().filter_map(|o| o.arrival.deadline_ms).map(|d| d as f64).collect();
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if v.is_empty() {
            "-".to_string()
        } else if hi - lo < 0.5 {
            format!("{lo:.0}")
        } else {
            format!("{lo:.0}–{hi:.0}")
        }
    };
    format!(
        "the {} not admitted were promised {} ms at best ({} with a promise), against deadlines of {} ms",
        shed.len(),
        range(&promised),
        promised.len(),
        range(&deadlines)
    )
}

/// Replica `r`'s interactive requests of the overload (of `replicas`, each arrival `id` sent
/// to replica `id % replicas`): (sent, admitted, kept their deadline).
fn replica_share(
    all: &[Outcome],
    r: usize,
    replicas: usize,
    (idle_ms, max_wait_ms): (f64, f64),
) -> (usize, usize, usize) {
    let mine = all.iter().filter(|o| {
        o.arrival.id % replicas.max(1) == r
            && o.arrival.class == Class::Interactive
            && o.arrival.phase == Phase::Overload
    });
    mine.fold((0, 0, 0), |(s, a, k), o| {
        let kept = o.admitted() && o.kept(idle_ms, max_wait_ms);
        (s + 1, a + usize::from(o.admitted()), k + usize::from(kept))
    })
}

/// How many admitted requests were sent by `at` and had not yet had their first token: the
/// backlog a request sent at `at` met (as far as this bench's own requests show it).
fn waiting_at(all: &[Outcome], at: Duration) -> usize {
    let at_ms = at.as_secs_f64() * 1e3;
    all.iter()
        .filter(|o| o.admitted() && o.sent <= at)
        .filter(|o| o.sent.as_secs_f64() * 1e3 + o.ttft_ms > at_ms)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(
        class: Class,
        deadline_ms: Option<u64>,
        ttft_ms: f64,
        predicted: Option<f64>,
    ) -> Outcome {
        let arrival =
            Arrival { id: 0, at: Duration::ZERO, phase: Phase::Overload, class, deadline_ms };
        Outcome {
            arrival,
            sent: Duration::ZERO,
            status: Some(200),
            ttft_ms,
            predicted_ttft_ms: predicted,
            predicted_wait_ms: None,
            promised_ttft_ms: None,
            worker: None,
        }
    }

    #[test]
    fn promises_and_estimate_errors() {
        // Interactive: the deadline it sent.
        assert!(outcome(Class::Interactive, Some(1000), 1000.0, None).kept(600.0, 50.0));
        assert!(!outcome(Class::Interactive, Some(1000), 1000.5, None).kept(600.0, 50.0));
        // Batch: the wait beyond the idle TTFT against max_wait.
        assert!(outcome(Class::Batch, None, 650.0, None).kept(600.0, 50.0));
        assert!(!outcome(Class::Batch, None, 651.0, None).kept(600.0, 50.0));
        let e = outcome(Class::Batch, None, 800.0, Some(600.0)).estimate_error();
        assert!(e.is_some_and(|e| (e + 0.25).abs() < 1e-9), "{e:?}");
        assert_eq!(outcome(Class::Batch, None, 800.0, None).estimate_error(), None);
        assert_eq!(outcome(Class::Batch, None, 0.0, Some(5.0)).estimate_error(), None);
        assert_eq!(quantile(vec![3.0, 1.0, 2.0], 0.5), "2");
        assert_eq!(quantile(Vec::new(), 0.5), "-");
        assert_eq!(pct(1, 4), "25 %");
        assert_eq!(pct(1, 0), "-");
    }

    #[test]
    fn shed_requests_are_reported_with_the_promises_they_were_refused_with() {
        let shed = |promised: Option<f64>| Outcome {
            status: Some(429),
            promised_ttft_ms: promised,
            ..outcome(Class::Interactive, Some(1015), 1.0, None)
        };
        let (a, b, c) = (shed(Some(3489.9)), shed(Some(7404.0)), shed(None));
        assert_eq!(
            shed_promises(&[&a, &b, &c]),
            "the 3 not admitted were promised 3490–7404 ms at best (2 with a promise), against deadlines of 1015 ms"
        );
        assert_eq!(
            shed_promises(&[&c]),
            "the 1 not admitted were promised - ms at best (0 with a promise), against deadlines of 1015 ms"
        );
    }

    #[test]
    fn the_backlog_a_request_met_is_the_admitted_ones_still_waiting_at_its_send() {
        let at = |sent_ms: u64, ttft_ms: f64, status: u16| Outcome {
            sent: Duration::from_millis(sent_ms),
            status: Some(status),
            ..outcome(Class::Batch, None, ttft_ms, None)
        };
        let all =
            [at(0, 1500.0, 200), at(500, 400.0, 200), at(600, 2000.0, 429), at(900, 50.0, 200)];
        let waiting = |ms| waiting_at(&all, Duration::from_millis(ms));
        // At 700 ms: the first (until 1 500) and the second (until 900); a shed one is none.
        assert_eq!(waiting(700), 2);
        // At 900 ms the second had its first token, the one sent then is waiting.
        assert_eq!(waiting(900), 2);
        assert_eq!(waiting(1_499), 1);
        assert_eq!(waiting(1_500), 0);
    }

    #[test]
    fn each_replica_counts_its_own_arrivals() {
        let one = |id: usize, status: u16, ttft_ms: f64| Outcome {
            arrival: Arrival { id, ..outcome(Class::Interactive, Some(1000), 0.0, None).arrival },
            status: Some(status),
            ..outcome(Class::Interactive, Some(1000), ttft_ms, None)
        };
        let batch = Outcome {
            arrival: Arrival { id: 4, ..outcome(Class::Batch, None, 0.0, None).arrival },
            ..outcome(Class::Batch, None, 10.0, None)
        };
        let all =
            [one(0, 200, 900.0), one(1, 429, 0.0), one(2, 200, 1200.0), one(3, 200, 5.0), batch];
        assert_eq!(replica_share(&all, 0, 2, (600.0, 50.0)), (2, 2, 1));
        assert_eq!(replica_share(&all, 1, 2, (600.0, 50.0)), (2, 1, 1));
    }

    #[test]
    fn one_csv_row_per_request() {
        let mut shed = outcome(Class::Interactive, Some(1000), 0.5, None);
        shed.status = Some(429);
        let mut kept = outcome(Class::Batch, None, 640.0, Some(600.0));
        kept.worker = Some("127.0.0.1:9".into());
        kept.predicted_wait_ms = Some(12.25);
        kept.promised_ttft_ms = Some(900.0);
        let text = csv(&[shed, kept], 600.0, 50.0);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("id,sent_ms,class"));
        assert_eq!(lines[1], "0,0.0,interactive,overload,1000,429,0.5,,,,,");
        assert_eq!(lines[2], "0,0.0,batch,overload,,200,640.0,600.0,12.2,900.0,127.0.0.1:9,true");
    }
}
