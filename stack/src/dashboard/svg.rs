//! The dashboard's panels as one SVG: a grid of charts, each with the panel's title and unit
//! and one line per series, drawn with plotters' SVG backend (no font files: the viewer renders
//! the `<text>` elements).

use std::collections::BTreeMap;

use plotters::prelude::*;

const FONT: &str = "sans-serif";
const CELL: (u32, u32) = (640, 300);

/// One panel's evaluated queries: a line per series, x in seconds since the run started.
#[derive(Debug, Clone)]
pub struct PanelData {
    pub title: String,
    pub unit: String,
    pub lines: Vec<(String, Vec<(f64, f64)>)>,
}

/// Grafana's `legendFormat`: `{{label}}` replaced by the series' label value.
pub fn legend(format: &str, labels: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = format;
    while let Some(pos) = rest.find("{{") {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[pos..]);
            return out;
        };
        let key = after[..end].trim();
        out.push_str(labels.get(key).map_or("", String::as_str));
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    if out.is_empty() {
        format!("{labels:?}")
    } else {
        out
    }
}

/// The unit as an axis label (Grafana's unit ids are terse).
fn unit_label(unit: &str) -> &str {
    match unit {
        "reqps" => "requests/s",
        "percentunit" => "ratio (0..1)",
        "ops" => "per second",
        "short" => "",
        u => u,
    }
}

/// All panels in a grid `cols` wide.
pub fn render(panels: &[PanelData], cols: usize, subtitle: &str) -> anyhow::Result<String> {
    let cols = cols.max(1);
    let rows = panels.len().div_ceil(cols).max(1);
    let head = 40;
    let size = (CELL.0 * cols as u32, CELL.1 * rows as u32 + head);
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, size).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, body) = root.split_vertically(head);
        top.titled(&format!("kvroute dashboard: {subtitle}"), (FONT, 22))?;
        let cells = body.split_evenly((rows, cols));
        for (p, area) in panels.iter().zip(cells.iter()) {
            chart(area, p)?;
        }
        root.present()?;
    }
    Ok(buf)
}

fn chart(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    p: &PanelData,
) -> anyhow::Result<()> {
    let finite = |pts: &Vec<(f64, f64)>| -> Vec<(f64, f64)> {
        pts.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect()
    };
    let lines: Vec<(String, Vec<(f64, f64)>)> = p
        .lines
        .iter()
        .map(|(n, pts)| (n.clone(), finite(pts)))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    let all = || lines.iter().flat_map(|(_, v)| v.iter().copied());
    let x_hi = all().map(|q| q.0).reduce(f64::max).unwrap_or(1.0).max(1.0);
    let y_lo = all().map(|q| q.1).reduce(f64::min).unwrap_or(0.0).min(0.0);
    let y_hi = all().map(|q| q.1).reduce(f64::max).unwrap_or(1.0);
    let y_hi = if y_hi > y_lo { y_hi + (y_hi - y_lo) * 0.1 } else { y_lo + 1.0 };
    let caption = if lines.is_empty() { format!("{} (no data)", p.title) } else { p.title.clone() };
    let mut c = ChartBuilder::on(area)
        .caption(caption, (FONT, 16))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..x_hi, y_lo..y_hi)?;
    c.configure_mesh()
        .x_labels(8)
        .y_labels(6)
        .max_light_lines(1)
        .x_desc("seconds")
        .y_desc(unit_label(&p.unit))
        .label_style((FONT, 11))
        .axis_desc_style((FONT, 12))
        .draw()?;
    for (i, (name, pts)) in lines.iter().enumerate() {
        let col = Palette99::pick(i).to_rgba();
        c.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], col.stroke_width(2)));
    }
    if !lines.is_empty() {
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font((FONT, 10))
            .draw()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legends_take_label_values() {
        let labels: BTreeMap<String, String> =
            [("worker".to_string(), "a:1".to_string())].into_iter().collect();
        assert_eq!(legend("{{worker}} running", &labels), "a:1 running");
        assert_eq!(legend("{{ worker }}/{{absent}}", &labels), "a:1/");
        assert_eq!(legend("p99", &labels), "p99");
        assert_eq!(legend("{{broken", &labels), "{{broken");
    }

    #[test]
    fn panels_render_with_and_without_data() {
        let panels = vec![
            PanelData {
                title: "Decisions per worker".into(),
                unit: "reqps".into(),
                lines: vec![("w1".into(), vec![(0.0, 1.0), (1.0, f64::NAN), (2.0, 3.0)])],
            },
            PanelData { title: "Quiet".into(), unit: "s".into(), lines: vec![] },
        ];
        let svg = render(&panels, 2, "test").unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("Decisions per worker"));
        assert!(
            svg.contains("Quiet (no data)") && svg.contains("requests/s") && svg.contains("w1")
        );
    }
}
