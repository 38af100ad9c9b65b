//! The SVG plots of a report, drawn with plotters' SVG backend into strings: the TTFT CDF, each
//! policy's per-worker queue over time, and p99 TTFT per cohort.
//!
//! Text needs no font files here: without the `ttf` feature plotters estimates text extents
//! itself and the SVG backend writes `<text>` elements for the viewer to render. Every plot
//! copes with no data, a single point and all-equal values (ranges are widened, never empty),
//! and marks an empty plot "(no data)" in its caption.

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::Report;
use crate::record::RunResult;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

const FONT: &str = "sans-serif";
/// Most points drawn per line; longer lines are thinned evenly (the last point kept).
const MAX_POINTS: usize = 1000;

/// The legend of `chart`'s labelled series at `pos`, in the house style.
pub(crate) fn legend<'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    pos: SeriesLabelPosition,
    font_size: u32,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, font_size))
        .draw()?;
    Ok(())
}

/// Draws onto a white `size` canvas and returns the SVG text.
fn svg(
    size: (u32, u32),
    draw: impl FnOnce(&Area<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, size).into_drawing_area();
        root.fill(&WHITE)?;
        draw(&root)?;
        root.present()?;
    }
    Ok(buf)
}

fn color(i: usize) -> RGBAColor {
    Palette99::pick(i).to_rgba()
}

/// At most [`MAX_POINTS`] of `points`, evenly spaced, keeping the last.
fn thin<T: Copy>(points: &[T]) -> Vec<T> {
    let n = points.len();
    if n <= MAX_POINTS {
        return points.to_vec();
    }
    (1..=MAX_POINTS).filter_map(|k| points.get((k * n).div_ceil(MAX_POINTS) - 1).copied()).collect()
}

/// `lo..hi`, made non-empty when the values are all equal (`hi` moved up by `max(1, |lo|)`);
/// `fallback` when the bounds are not finite or reversed.
fn span(lo: f64, hi: f64, fallback: (f64, f64)) -> (f64, f64) {
    if !(lo.is_finite() && hi.is_finite()) || lo > hi {
        return fallback;
    }
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        return (lo, lo + lo.abs().max(1.0));
    }
    (lo, hi)
}

/// An axis tick: whole numbers without decimals, others with up to three.
fn tick(v: &f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// Tick positions for a log axis over `lo..=hi` (both positive): 1-2-5 per decade, or every
/// 1..9 multiple when that gives fewer than four.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let ticks = |mantissas: &[f64]| -> Vec<f64> {
        let (d0, d1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        (d0..=d1)
            .flat_map(|d| mantissas.iter().map(move |m| m * 10f64.powi(d)))
            .filter(|v| (lo..=hi).contains(v))
            .collect()
    };
    if !(lo > 0.0 && hi.is_finite() && lo < hi) || hi / lo > 1e12 {
        return vec![];
    }
    let coarse = ticks(&[1.0, 2.0, 5.0]);
    if coarse.len() >= 4 {
        coarse
    } else {
        ticks(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    }
}

fn caption(title: &str, empty: bool) -> String {
    if empty {
        format!("{title} (no data)")
    } else {
        title.to_owned()
    }
}

/// TTFT CDF of every run's ok requests, one line per policy, log-scaled x (a TTFT of 0 is
/// drawn at the left edge).
pub(super) fn ttft_cdf(runs: &[RunResult]) -> anyhow::Result<String> {
    let lines: Vec<(&str, Vec<f64>)> = runs
        .iter()
        .map(|r| {
            let ttft = r.records.iter().filter(|x| x.ok()).filter_map(|x| x.ttft_ms);
            (r.policy.as_str(), super::stats::sorted(ttft))
        })
        .collect();
    let all = || lines.iter().flat_map(|(_, v)| v.iter().copied());
    let positive = || all().filter(|v| *v > 0.0);
    let empty = all().next().is_none();
    let (lo, hi) = match (positive().reduce(f64::min), positive().reduce(f64::max)) {
        (Some(lo), Some(hi)) if hi > lo => (lo / 1.1, hi * 1.1),
        (Some(v), Some(_)) => (v / 2.0, v * 2.0),
        _ => (0.1, 1000.0),
    };
    svg((900, 560), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(caption("TTFT CDF", empty), (FONT, 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(
                (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
                0f64..1f64,
            )?;
        chart
            .configure_mesh()
            .x_desc("TTFT (ms, log scale)")
            .y_desc("fraction of ok requests")
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .draw()?;
        for (i, (policy, v)) in lines.iter().enumerate() {
            let n = v.len() as f64;
            let start = v.first().map(|x| (x.max(lo), 0.0));
            let steps = v.iter().enumerate().map(|(k, x)| (x.max(lo), (k + 1) as f64 / n));
            let points: Vec<(f64, f64)> = start.into_iter().chain(steps).collect();
            let c = color(i);
            chart
                .draw_series(LineSeries::new(thin(&points), c.stroke_width(2)))?
                .label(*policy)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        if !lines.is_empty() {
            legend(&mut chart, SeriesLabelPosition::LowerRight, 14)?;
        }
        Ok(())
    })
}

/// Queue (`running + waiting`) of every worker of `policy`'s run over time, one line per
/// worker; `run` is `None` when the run is missing (an empty plot).
pub(super) fn queue(policy: &str, run: Option<&RunResult>) -> anyhow::Result<String> {
    let samples: Vec<_> =
        run.map(|r| r.queue.iter().filter(|s| s.t_ms.is_finite()).collect()).unwrap_or_default();
    let workers = run
        .map_or(0, |r| r.workers.len())
        .max(samples.iter().map(|s| s.worker + 1).max().unwrap_or(0));
    let name = |w: usize| {
        run.and_then(|r| r.workers.get(w)).cloned().unwrap_or_else(|| format!("worker-{w}"))
    };
    let t = |s: &&crate::record::QueueSample| s.t_ms / 1000.0;
    let q = |s: &&crate::record::QueueSample| f64::from(s.running) + f64::from(s.waiting);
    let t_lo = samples.iter().map(t).reduce(f64::min).unwrap_or(0.0).min(0.0);
    let t_hi = samples.iter().map(t).reduce(f64::max).unwrap_or(1.0);
    let (t_lo, t_hi) = span(t_lo, t_hi, (0.0, 1.0));
    let q_hi = samples.iter().map(q).reduce(f64::max).unwrap_or(0.0);
    let title = format!("{policy}: queue per worker");
    svg((900, 480), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(caption(&title, samples.is_empty()), (FONT, 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(t_lo..t_hi, 0f64..(q_hi * 1.3).max(1.0))?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("running + waiting")
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .draw()?;
        for w in 0..workers {
            let mut points: Vec<(f64, f64)> =
                samples.iter().filter(|s| s.worker == w).map(|s| (t(s), q(s))).collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let c = color(w);
            chart
                .draw_series(LineSeries::new(thin(&points), c.stroke_width(2)))?
                .label(name(w))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        if workers > 0 {
            legend(&mut chart, SeriesLabelPosition::UpperRight, 13)?;
        }
        Ok(())
    })
}

/// Longest cohort name on the x axis.
const LABEL_CHARS: usize = 18;

/// An x axis of `n` groups, group `i` spanning `i..i + 1`, labelled at its centre.
struct Groups(usize);

impl Ranged for Groups {
    type ValueType = f64;
    type FormatOption = DefaultFormatting;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let n = self.0.max(1) as f64;
        limit.0 + ((f64::from(limit.1 - limit.0)) * v / n).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            return vec![];
        }
        (0..self.0).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> Range<f64> {
        0.0..self.0.max(1) as f64
    }
}

/// p99 TTFT per cohort, grouped bars: one group per cohort, one bar per policy.
pub(super) fn cohort_tails(report: &Report) -> anyhow::Result<String> {
    let cohorts = &report.cohorts;
    let n_c = cohorts.len().max(1);
    let n_p = report.policies.len().max(1);
    let bars: Vec<Vec<(usize, f64)>> = report
        .policies
        .iter()
        .map(|p| {
            cohorts
                .iter()
                .enumerate()
                .filter_map(|(i, c)| Some((i, p.cohort(c)?.ttft_p99_ms?)))
                .filter(|(_, v)| v.is_finite() && *v >= 0.0)
                .collect()
        })
        .collect();
    let y_hi = bars.iter().flatten().map(|(_, v)| *v).reduce(f64::max).unwrap_or(0.0);
    let empty = bars.iter().all(Vec::is_empty);
    let labels: Vec<String> = cohorts
        .iter()
        .map(|c| {
            if c.chars().count() > LABEL_CHARS {
                format!("{}…", c.chars().take(LABEL_CHARS - 1).collect::<String>())
            } else {
                c.clone()
            }
        })
        .collect();
    let width = u32::try_from(n_c).unwrap_or(u32::MAX).saturating_mul(160).clamp(700, 4000);
    svg((width, 520), |root| {
        let x_label = |v: &f64| labels.get(v.floor() as usize).cloned().unwrap_or_default();
        let mut chart = ChartBuilder::on(root)
            .caption(caption("TTFT p99 per cohort", empty), (FONT, 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(Groups(n_c), 0f64..(y_hi * 1.1).max(1.0))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&x_label)
            .x_desc("cohort")
            .y_desc("TTFT p99 (ms)")
            .y_label_formatter(&tick)
            .draw()?;
        let bar = 0.8 / n_p as f64;
        for (j, (p, values)) in report.policies.iter().zip(&bars).enumerate() {
            let c = color(j);
            let x0 = |i: usize| i as f64 + 0.1 + j as f64 * bar;
            chart
                .draw_series(
                    values.iter().map(|&(i, v)| {
                        Rectangle::new([(x0(i), 0.0), (x0(i) + bar, v)], c.filled())
                    }),
                )?
                .label(p.policy.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        }
        if !report.policies.is_empty() {
            legend(&mut chart, SeriesLabelPosition::UpperLeft, 14)?;
        }
        Ok(())
    })
}

/// A line chart of `lines` (name, points) on `area`: linear axes from 0, points marked.
fn lines_chart(
    area: &Area<'_>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[(String, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    let all = || lines.iter().flat_map(|(_, v)| v.iter().copied());
    let empty = all().next().is_none();
    let x_hi = all().map(|p| p.0).filter(|v| v.is_finite()).reduce(f64::max).unwrap_or(1.0);
    let y_hi = all().map(|p| p.1).filter(|v| v.is_finite()).reduce(f64::max).unwrap_or(1.0);
    let (_, x_hi) = span(0.0, x_hi * 1.1, (0.0, 1.0));
    let (_, y_hi) = span(0.0, y_hi * 1.15, (0.0, 1.0));
    let mut chart = ChartBuilder::on(area)
        .caption(caption(title, empty), (FONT, 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_hi, 0f64..y_hi)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    for (i, (name, points)) in lines.iter().enumerate() {
        let c = color(i);
        let pts: Vec<(f64, f64)> =
            points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
    }
    if !lines.is_empty() {
        legend(&mut chart, SeriesLabelPosition::UpperLeft, 13)?;
    }
    Ok(())
}

/// The load sweep: TTFT p90 (left) and useful completions/s (right) against the offered rate,
/// one line per policy, medians over valid repeats.
pub(super) fn sweep(report: &Report) -> anyhow::Result<String> {
    let line = |f: fn(&crate::sweep::SweepPoint) -> Option<f64>| -> Vec<(String, Vec<(f64, f64)>)> {
        report
            .policy_names()
            .into_iter()
            .map(|name| {
                let pts = report
                    .sweep
                    .points
                    .iter()
                    .filter(|p| p.policy == name)
                    .filter_map(|p| Some((p.offered_per_s.median?, f(p)?)))
                    .collect();
                (name.to_owned(), pts)
            })
            .collect()
    };
    let p90 = line(|p| p.ttft_p90_ms.median);
    let useful = line(|p| p.useful_per_s.median);
    svg((1200, 520), |root| {
        let halves = root.split_evenly((1, 2));
        lines_chart(
            &halves[0],
            "TTFT p90 vs offered load",
            "offered (requests/s)",
            "TTFT p90 (ms)",
            &p90,
        )?;
        lines_chart(
            &halves[1],
            "Useful completions/s vs offered load",
            "offered (requests/s)",
            "useful/s (within SLO)",
            &useful,
        )
    })
}

/// kvroute's estimate error per time window of the run, one line per kvroute policy.
pub(super) fn estimate(report: &Report) -> anyhow::Result<String> {
    let lines: Vec<(String, Vec<(f64, f64)>)> = report
        .estimate
        .iter()
        .map(|e| {
            let pts = e
                .windows
                .iter()
                .enumerate()
                .filter_map(|(w, (_, m))| Some(((w + 1) as f64, 100.0 * (*m)?)))
                .collect();
            (e.policy.clone(), pts)
        })
        .collect();
    svg((900, 480), |root| {
        lines_chart(
            root,
            "TTFT estimate error over the run",
            "time window (tenths of the arrival span)",
            "median |predicted − observed| / observed (%)",
            &lines,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_keeps_the_ends_and_bounds_the_count() {
        let v: Vec<usize> = (0..2500).collect();
        let t = thin(&v);
        assert_eq!(t.len(), MAX_POINTS);
        assert_eq!(t.last(), Some(&2499));
        assert!(t.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(thin(&v[..3]), vec![0, 1, 2]);
        assert!(thin::<usize>(&[]).is_empty());
    }

    #[test]
    fn spans_are_never_empty() {
        assert_eq!(span(0.0, 0.0, (0.0, 1.0)), (0.0, 1.0));
        assert_eq!(span(5.0, 5.0, (0.0, 1.0)), (5.0, 10.0));
        assert_eq!(span(1.0, 3.0, (0.0, 1.0)), (1.0, 3.0));
        assert_eq!(span(f64::NAN, 3.0, (0.0, 1.0)), (0.0, 1.0));
        assert_eq!(
            (tick(&100.0), tick(&0.25), tick(&(0.1 + 0.2)), tick(&-3.0)),
            ("100".into(), "0.25".into(), "0.3".into(), "-3".into())
        );
    }

    #[test]
    fn log_ticks_are_round_and_inside() {
        assert_eq!(log_ticks(5.0, 600.0), vec![5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0]);
        assert_eq!(log_ticks(15.0, 60.0), vec![20.0, 30.0, 40.0, 50.0, 60.0]);
        assert!(log_ticks(0.0, 10.0).is_empty());
        assert!(log_ticks(10.0, 10.0).is_empty());
    }

    #[test]
    fn empty_inputs_draw_empty_plots() {
        let cdf = ttft_cdf(&[]).expect("cdf");
        assert!(cdf.contains("<svg") && cdf.contains("TTFT CDF (no data)"));
        let q = queue("p", None).expect("queue");
        assert!(q.contains("<svg") && q.contains("(no data)"));
        let report = super::super::summarize(
            &super::super::Setup::new(
                super::super::tests_scope(),
                None,
                crate::record::Slo { ttft_ms: 1.0, mean_gap_ms: 1.0, stall_ms: 1.0 },
            ),
            &[],
        );
        let s = sweep(&report).expect("sweep");
        assert!(s.contains("<svg") && s.contains("(no data)"));
        let e = estimate(&report).expect("estimate");
        assert!(e.contains("<svg") && e.contains("(no data)"));
    }
}
