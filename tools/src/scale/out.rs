//! Each curve as a CSV file (one row per point) and an SVG plot of chosen columns against the
//! first, on log-log axes.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

/// One measured curve: a table whose first column is the x axis.
pub struct Curve {
    /// File stem: `NAME.csv`, `NAME.svg`.
    pub name: &'static str,
    pub title: String,
    pub columns: Vec<&'static str>,
    pub rows: Vec<Vec<f64>>,
    /// The columns plotted against the first, and the y axis' label.
    pub plot: Vec<&'static str>,
    pub y_label: &'static str,
}

impl Curve {
    pub fn new(name: &'static str, title: String, columns: &[&'static str]) -> Curve {
        Curve {
            name,
            title,
            columns: columns.to_vec(),
            rows: Vec::new(),
            plot: Vec::new(),
            y_label: "",
        }
    }

    pub fn plotting(mut self, columns: &[&'static str], y_label: &'static str) -> Curve {
        self.plot = columns.to_vec();
        self.y_label = y_label;
        self
    }

    pub fn push(&mut self, row: Vec<f64>) {
        debug_assert_eq!(row.len(), self.columns.len());
        self.rows.push(row);
    }

    pub fn csv(&self) -> String {
        let mut s = self.columns.join(",");
        s.push('\n');
        for r in &self.rows {
            let cells: Vec<String> = r.iter().map(|v| fmt(*v)).collect();
            let _ = writeln!(s, "{}", cells.join(","));
        }
        s
    }

    /// Writes `NAME.csv` and `NAME.svg` into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::write(dir.join(format!("{}.csv", self.name)), self.csv())?;
        if !self.plot.is_empty() {
            std::fs::write(dir.join(format!("{}.svg", self.name)), self.svg()?)?;
        }
        Ok(())
    }

    fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| *c == name)
    }

    fn svg(&self) -> anyhow::Result<String> {
        let series: Vec<(&str, Vec<(f64, f64)>)> = self
            .plot
            .iter()
            .filter_map(|c| {
                let i = self.column(c)?;
                let pts = self
                    .rows
                    .iter()
                    .map(|r| (r[0], r[i]))
                    .filter(|p| p.0 > 0.0 && p.1 > 0.0 && p.1.is_finite())
                    .collect();
                Some((*c, pts))
            })
            .collect();
        let all = series.iter().flat_map(|s| s.1.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in all {
            (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (1.0, 10.0, 1.0, 10.0);
        }
        let mut buf = String::new();
        {
            let root = SVGBackend::with_string(&mut buf, (760, 440)).into_drawing_area();
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(&self.title, ("sans-serif", 17))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(
                    (x0 / 1.3..x1 * 1.3).log_scale(),
                    (y0 / 1.5..y1 * 1.5).log_scale(),
                )?;
            chart
                .configure_mesh()
                .x_desc(self.columns[0])
                .y_desc(self.y_label)
                .x_label_formatter(&|v| fmt_axis(*v))
                .y_label_formatter(&|v| fmt_axis(*v))
                .draw()?;
            for (k, (name, pts)) in series.into_iter().enumerate() {
                let color = Palette99::pick(k).to_rgba();
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                    .label(name)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()?;
            root.present()?;
        }
        Ok(buf)
    }
}

/// A CSV cell: integers without a fraction, others with up to 3 decimals.
fn fmt(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

fn fmt_axis(v: f64) -> String {
    match v.abs() {
        a if a >= 1e6 => format!("{:.0}M", v / 1e6),
        a if a >= 1e3 => format!("{:.0}k", v / 1e3),
        a if a >= 1.0 => format!("{v:.0}"),
        _ => format!("{v:.2}"),
    }
}
