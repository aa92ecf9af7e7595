//! SVG plots with plotters: line charts (one line per series) and grouped
//! bar charts. SVG needs no font libraries, so plots work on a bare server.

use std::path::Path;

use plotters::prelude::*;

/// A plotting failure, with the file it concerns.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw {path}: {reason}")]
pub struct PlotError {
    /// The plot file.
    pub path: String,
    /// What went wrong.
    pub reason: String,
}

/// One named line of (x, y) points.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
}

/// Axis titles and chart caption.
#[derive(Debug, Clone)]
pub struct Labels<'a> {
    /// Caption above the chart.
    pub title: &'a str,
    /// X axis title.
    pub x: &'a str,
    /// Y axis title.
    pub y: &'a str,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn err(path: &Path, e: impl std::fmt::Display) -> PlotError {
    PlotError {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

fn range(vals: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in vals.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    let pad = ((hi - lo) * 0.08).max(1e-9);
    (if from_zero { lo } else { lo - pad }, hi + pad)
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// A line with a marker at every point.
    Line,
    /// Markers only (measurements).
    Points,
    /// A thin line without markers (fits).
    Fit,
}

/// Draws a line chart with markers to an SVG file.
pub fn line_chart(path: &Path, labels: &Labels<'_>, series: &[Series]) -> Result<(), PlotError> {
    let styled: Vec<(Series, Style)> = series.iter().map(|s| (s.clone(), Style::Line)).collect();
    chart(path, labels, &styled)
}

/// Draws series, each in its own style, to an SVG file.
pub fn chart(
    path: &Path,
    labels: &Labels<'_>,
    styled: &[(Series, Style)],
) -> Result<(), PlotError> {
    let series: Vec<&Series> = styled.iter().map(|(s, _)| s).collect();
    let (x0, x1) = range(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.0)),
        true,
    );
    let (y0, y1) = range(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        true,
    );
    let root = SVGBackend::new(path, (800, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(labels.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| err(path, e))?;
    chart
        .configure_mesh()
        .x_desc(labels.x)
        .y_desc(labels.y)
        .draw()
        .map_err(|e| err(path, e))?;
    for (i, (s, style)) in styled.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        match style {
            Style::Line | Style::Fit => {
                let w = if *style == Style::Line { 2 } else { 1 };
                chart
                    .draw_series(LineSeries::new(
                        s.points.iter().copied(),
                        color.stroke_width(w),
                    ))
                    .map_err(|e| err(path, e))?
                    .label(s.label.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(w))
                    });
                if *style == Style::Line {
                    chart
                        .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                        .map_err(|e| err(path, e))?;
                }
            }
            Style::Points => {
                chart
                    .draw_series(s.points.iter().map(|&p| Circle::new(p, 2, color.filled())))
                    .map_err(|e| err(path, e))?
                    .label(s.label.clone())
                    .legend(move |(x, y)| Circle::new((x + 10, y), 3, color.filled()));
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))
}

/// Draws grouped bars: one group per category, one bar per series in each
/// group (`values[series][category]`).
pub fn bar_chart(
    path: &Path,
    labels: &Labels<'_>,
    categories: &[String],
    series_labels: &[String],
    values: &[Vec<f64>],
) -> Result<(), PlotError> {
    let (_, y1) = range(values.iter().flatten().copied(), true);
    let groups = categories.len().max(1);
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(labels.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..groups as f64, 0f64..y1)
        .map_err(|e| err(path, e))?;
    let cats = categories.to_vec();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups * 2 + 1)
        .x_label_formatter(&move |x| {
            let i = (*x - 0.5).round();
            if (x - 0.5 - i).abs() < 1e-6 && i >= 0.0 {
                cats.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_desc(labels.x)
        .y_desc(labels.y)
        .draw()
        .map_err(|e| err(path, e))?;
    let k = series_labels.len().max(1) as f64;
    let bar = 0.8 / k;
    for (si, (name, vals)) in series_labels.iter().zip(values).enumerate() {
        let color = COLORS[si % COLORS.len()];
        chart
            .draw_series(vals.iter().enumerate().map(|(ci, &v)| {
                let x = ci as f64 + 0.1 + si as f64 * bar;
                Rectangle::new([(x, 0.0), (x + bar * 0.9, v)], color.filled())
            }))
            .map_err(|e| err(path, e))?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_svg_with_labels() {
        let dir = std::env::temp_dir().join(format!("measure-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("line.svg");
        let labels = Labels {
            title: "Disruption",
            x: "failed %",
            y: "changed %",
        };
        line_chart(
            &p,
            &labels,
            &[Series {
                label: "M=65537".into(),
                points: vec![(1.0, 2.0), (2.0, 4.5)],
            }],
        )
        .unwrap();
        let s = std::fs::read_to_string(&p).unwrap();
        assert!(s.starts_with("<svg") && s.contains("Disruption") && s.contains("M=65537"));
        let b = dir.join("bars.svg");
        bar_chart(
            &b,
            &labels,
            &["small".into(), "large".into()],
            &["max".into()],
            &[vec![0.13, 0.11]],
        )
        .unwrap();
        let s = std::fs::read_to_string(&b).unwrap();
        assert!(s.contains("small") && s.contains("<rect"));
        std::fs::remove_dir_all(&dir).unwrap();
        // An unwritable path is an error naming the path, not a panic.
        let bad = Path::new("/nonexistent-dir/x.svg");
        let e = line_chart(bad, &labels, &[]).unwrap_err();
        assert!(e.to_string().contains("/nonexistent-dir/x.svg"));
    }
}
