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
            },
            Err(e) => {
                eprintln!("request {} failed: {e:#}", arrival.id);
                Outcome { arrival, sent, status: None, ttft_ms: 0.0, predicted_ttft_ms: None }
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

/// Prints the table, the promises kept overall, and the return after the overload.
pub fn print(all: &[Outcome], idle_ms: f64, max_wait_ms: f64, overload_end: Duration) {
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
    match first {
        Some(i) => println!(
            "after the overload: meetable deadlines not admitted before the first admitted one: {i}; first admitted {:.1} s after the overload ended",
            after[i].sent.saturating_sub(overload_end).as_secs_f64()
        ),
        None => println!(
            "after the overload: none of {} meetable deadlines was admitted",
            after.len()
        ),
    }
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
}
