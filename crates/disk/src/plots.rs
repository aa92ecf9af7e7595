//! SVG plots of the three curves, with the fits and detected points.

use std::path::Path;

use measure::plot::{chart, Labels, PlotError, Series, Style};

use crate::extract::{Extraction, Line, ZoneFits};
use crate::seeker::SeekPoint;
use crate::skippy::Point;
use crate::zoned::ZonePoint;

fn line(label: &str, l: &Line, x0: f64, x1: f64) -> (Series, Style) {
    (
        Series {
            label: label.into(),
            points: vec![(x0, l.at(x0)), (x1, l.at(x1))],
        },
        Style::Fit,
    )
}

/// The SKIPPY sawtooth with L1-L4 and the points (1), (2), (3).
pub fn skippy(path: &Path, title: &str, pts: &[Point], ex: &Extraction) -> Result<(), PlotError> {
    let mut s = vec![(
        Series {
            label: "latency".into(),
            points: pts.iter().map(|p| (p.step as f64, p.latency_ms)).collect(),
        },
        Style::Points,
    )];
    if let Extraction::Rotational(e) = ex {
        let last = pts.last().map_or(1.0, |p| p.step as f64);
        s.push(line("L1 (extra rotation)", &e.l1, 0.0, e.point2 as f64));
        s.push(line("L2", &e.l2, e.point3 as f64, last));
        if let Some(l) = &e.l3 {
            s.push(line("L3 (head switch)", l, e.point3 as f64, last));
        }
        if let Some(l) = &e.l4 {
            s.push(line("L4 (cylinder switch)", l, e.point3 as f64, last));
        }
        let at = |step: u32| {
            pts.iter()
                .find(|p| p.step == step)
                .map(|p| (p.step as f64, p.latency_ms))
        };
        let marks: Vec<(f64, f64)> = [e.point1, e.point2, e.point3]
            .into_iter()
            .filter_map(at)
            .collect();
        s.push((
            Series {
                label: "points (1), (2), (3)".into(),
                points: marks,
            },
            Style::Points,
        ));
    }
    chart(
        path,
        &Labels {
            title,
            x: "step (sectors)",
            y: "latency (ms)",
        },
        &s,
    )
}

/// The ZONED profile with the linear and quadratic fits.
pub fn zoned(
    path: &Path,
    title: &str,
    z: &[ZonePoint],
    f: Option<&ZoneFits>,
) -> Result<(), PlotError> {
    let xs: Vec<f64> = z.iter().map(|p| p.offset as f64 / 1e9).collect();
    let mut s = vec![(
        Series {
            label: "bandwidth".into(),
            points: xs.iter().copied().zip(z.iter().map(|p| p.mbps)).collect(),
        },
        Style::Points,
    )];
    if let Some(f) = f {
        let fit = |label: &str, g: &dyn Fn(f64) -> f64| {
            (
                Series {
                    label: label.into(),
                    points: xs.iter().map(|&x| (x, g(x))).collect(),
                },
                Style::Fit,
            )
        };
        s.push(fit("linear fit", &|x| f.linear.a * x + f.linear.b));
        s.push(fit("quadratic fit a*x^2+b", &|x| {
            f.quadratic.a * x * x + f.quadratic.b
        }));
        s.push(fit("linear, two points", &|x| {
            f.linear_two_point.a * x + f.linear_two_point.b
        }));
        s.push(fit("quadratic, two points", &|x| {
            f.quadratic_two_point.a * x * x + f.quadratic_two_point.b
        }));
    }
    chart(
        path,
        &Labels {
            title,
            x: "location (GB)",
            y: "bandwidth (MB/s)",
        },
        &s,
    )
}

/// The SEEKER curve.
pub fn seeker(path: &Path, title: &str, s: &[SeekPoint]) -> Result<(), PlotError> {
    chart(
        path,
        &Labels {
            title,
            x: "distance from sector 0 (sectors)",
            y: "shortest access (ms, includes MTM)",
        },
        &[(
            Series {
                label: "seek + MTM".into(),
                points: s.iter().map(|p| (p.lba as f64, p.min_ms)).collect(),
            },
            Style::Line,
        )],
    )
}
