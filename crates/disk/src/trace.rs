//! The SKIPPY trace format: what `fastpath disk skippy --csv` writes and
//! `fastpath disk analyze` reads back, so that a run on one machine can be
//! analysed (and plotted) on another.
//!
//! A trace is one point a line: `step,latency,lba`, after a header line
//! ([`HEADER`]) whose second field names the latency's unit
//! (`latency_ms`, `latency_us`, `latency_s`; also `latency (us)` and the
//! like). Reading:
//!
//! - fields are separated by commas, semicolons or whitespace (spaces,
//!   tabs); a line with a semicolon is split at semicolons only, so that a
//!   decimal comma is never taken for a separator;
//! - blank lines and lines starting with `#` are skipped; `# unit: us` states
//!   the unit as a header would;
//! - the first line that is not a point is taken for the header; any other
//!   line that does not parse is an error naming the file and the line;
//! - a missing or unreadable `lba` is reconstructed from the step
//!   ([`skippy_lba`]), as older traces and other tools carry only
//!   `step,latency`;
//! - the unit comes from `--unit` ([`Unit`]) or the header; both given and
//!   different is an error; neither means milliseconds, and the reader is
//!   told ([`Trace::unit_stated`]);
//! - a trace with no point at all is an error naming its first line that is
//!   not a point.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use crate::skippy::Point;

/// The first line of a written trace.
pub const HEADER: &str = "step,latency_ms,lba";

/// What a data line must hold, as an error message says it.
const EXPECTED: &str = "step,latency[,lba] separated by commas, semicolons or whitespace";

/// The unit of a trace's latencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// Milliseconds (what fastpath writes).
    Ms,
    /// Microseconds.
    Us,
    /// Seconds.
    S,
}

impl Unit {
    /// Milliseconds per unit.
    pub fn ms_per_unit(self) -> f64 {
        match self {
            Unit::Ms => 1.0,
            Unit::Us => 1e-3,
            Unit::S => 1e3,
        }
    }
    /// The unit's short name (`ms`, `us`, `s`).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Ms => "ms",
            Unit::Us => "us",
            Unit::S => "s",
        }
    }
    /// The unit a header field or comment names, if it names one:
    /// `latency_us`, `latency (µs)`, `ms`, `seconds`, ...
    pub fn named_in(field: &str) -> Option<Unit> {
        let f = field.trim().to_ascii_lowercase().replace('µ', "u");
        // The last word of the field: after `_`, `(`, `[`, space or `:`.
        let word = f
            .trim_end_matches([')', ']'])
            .rsplit(['_', '(', '[', ' ', ':', '='])
            .next()
            .unwrap_or("")
            .trim();
        match word {
            "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => Some(Unit::Ms),
            "us" | "usec" | "usecs" | "microsecond" | "microseconds" => Some(Unit::Us),
            "s" | "sec" | "secs" | "second" | "seconds" => Some(Unit::S),
            _ => None,
        }
    }
}

/// A unit name that is none of `ms`, `us`, `s`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown unit {0:?}: ms, us or s")]
pub struct UnknownUnit(pub String);

impl std::str::FromStr for Unit {
    type Err = UnknownUnit;
    fn from_str(s: &str) -> Result<Self, UnknownUnit> {
        match s {
            "ms" => Ok(Unit::Ms),
            "us" | "µs" => Ok(Unit::Us),
            "s" => Ok(Unit::S),
            _ => Err(UnknownUnit(s.to_string())),
        }
    }
}

/// Why a trace could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Writing the trace file failed.
    #[error("writing {}", .path.display())]
    Write {
        /// The trace file.
        path: PathBuf,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// Reading the trace file failed.
    #[error("reading {}", .path.display())]
    Read {
        /// The trace file.
        path: PathBuf,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// The trace's text is not a trace.
    #[error("{}:{source}", .path.display())]
    Parse {
        /// The trace file.
        path: PathBuf,
        /// What is wrong, and where.
        #[source]
        source: ParseError,
    },
}

/// What is wrong with a trace's text (see [`parse`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A line of the trace is not a point.
    #[error("{line}: expected {expected}, found {text:?}")]
    BadLine {
        /// The line, counted from 1.
        line: usize,
        /// What the line should have held.
        expected: &'static str,
        /// The line (its first 60 characters).
        text: String,
    },
    /// Not one line is a point.
    #[error("{}: no point in the trace (expected {EXPECTED} on each line)", match .first_line { Some((n, t)) => format!("{n}: found {t:?}"), None => "1: the trace is empty".to_string() })]
    NoPoints {
        /// The first line that is not a point, counted from 1, and its text.
        first_line: Option<(usize, String)>,
    },
    /// The header names one unit and `--unit` another.
    #[error("1: the header says the latencies are in {header}, --unit says {flag}")]
    UnitConflict {
        /// The header's unit.
        header: &'static str,
        /// The flag's unit.
        flag: &'static str,
    },
}

impl ParseError {
    /// The same complaint, naming the file it was read from.
    pub fn in_file(self, path: &Path) -> Error {
        Error::Parse {
            path: path.to_path_buf(),
            source: self,
        }
    }
}

/// A trace read back.
#[derive(Debug, Clone)]
pub struct Trace {
    /// The points, latencies in milliseconds, in file order.
    pub points: Vec<Point>,
    /// The unit the file's latencies were in.
    pub unit: Unit,
    /// Whether the unit was stated (header or `--unit`) rather than assumed.
    pub unit_stated: bool,
}

/// Where step `step` of a forward SKIPPY run lies, for traces that do not
/// record it: `s(s+1)/2 + s` sectors. Each step moves on by one sector more
/// than the last, so this is the run's real position less a constant (the
/// start plus one), and the extraction only uses differences of positions.
pub fn skippy_lba(step: u32) -> u64 {
    let s = step as u64;
    s * (s + 1) / 2 + s
}

/// A trace as text: [`HEADER`], then one `step,latency_ms,lba` line per
/// point (latency to the nanosecond).
pub fn to_csv(points: &[Point]) -> String {
    let mut s = String::from(HEADER);
    s.push('\n');
    for p in points {
        // Writing to a String cannot fail.
        let _ = writeln!(s, "{},{:.6},{}", p.step, p.latency_ms, p.lba);
    }
    s
}

/// Write `points` as a trace file at `path` (replacing what was there).
pub fn write(path: &Path, points: &[Point]) -> Result<(), Error> {
    std::fs::write(path, to_csv(points)).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// A line's fields (see the module's rules on separators).
fn fields(line: &str) -> Vec<&str> {
    if line.contains(';') {
        line.split(';').map(str::trim).collect()
    } else if line.contains(',') {
        line.split(',').map(str::trim).collect()
    } else {
        line.split_whitespace().collect()
    }
}

fn clip(line: &str) -> String {
    line.chars().take(60).collect()
}

/// The points of a trace's text, in file order, latencies converted to
/// milliseconds; `unit` is what `--unit` said, if anything.
pub fn parse(text: &str, unit: Option<Unit>) -> Result<Trace, ParseError> {
    let mut pts = Vec::new();
    let mut header_unit = None;
    let mut header_seen = false;
    let mut first_bad: Option<(usize, String)> = None;
    let mut raw: Vec<(u32, f64, Option<u64>)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if let Some(c) = t.strip_prefix('#') {
            if let Some((k, v)) = c.split_once([':', '=']) {
                if k.trim().eq_ignore_ascii_case("unit") {
                    header_unit = header_unit.or(Unit::named_in(v));
                }
            }
            continue;
        }
        let f = fields(t);
        let parsed = match (f.first(), f.get(1)) {
            (Some(a), Some(b)) => match (a.parse::<u32>(), b.parse::<f64>()) {
                (Ok(step), Ok(lat)) if lat.is_finite() => Some((step, lat)),
                _ => None,
            },
            _ => None,
        };
        match parsed {
            Some((step, lat)) => raw.push((step, lat, f.get(2).and_then(|x| x.parse().ok()))),
            None if !header_seen && raw.is_empty() => {
                header_seen = true;
                first_bad.get_or_insert((n + 1, clip(t)));
                // `latency_us`, or `latency (us)` split at the space.
                let unit_word = f.get(1).and_then(|x| Unit::named_in(x)).or_else(|| {
                    f.get(2)
                        .filter(|x| x.starts_with(['(', '[']))
                        .and_then(|x| Unit::named_in(x))
                });
                if let Some(u) = unit_word {
                    header_unit = Some(u);
                }
            }
            None if raw.is_empty() => {
                first_bad.get_or_insert((n + 1, clip(t)));
                return Err(ParseError::NoPoints {
                    first_line: first_bad,
                });
            }
            None => {
                return Err(ParseError::BadLine {
                    line: n + 1,
                    expected: EXPECTED,
                    text: clip(t),
                })
            }
        }
    }
    if raw.is_empty() {
        return Err(ParseError::NoPoints {
            first_line: first_bad,
        });
    }
    let unit_used = match (header_unit, unit) {
        (Some(h), Some(f)) if h != f => {
            return Err(ParseError::UnitConflict {
                header: h.name(),
                flag: f.name(),
            })
        }
        (h, f) => f.or(h),
    };
    let k = unit_used.unwrap_or(Unit::Ms).ms_per_unit();
    for (step, lat, lba) in raw {
        pts.push(Point {
            step,
            lba: lba.unwrap_or_else(|| skippy_lba(step)),
            latency_ms: lat * k,
        });
    }
    Ok(Trace {
        points: pts,
        unit: unit_used.unwrap_or(Unit::Ms),
        unit_stated: unit_used.is_some(),
    })
}

/// Read the trace file at `path` (`unit` as in [`parse`]).
pub fn read(path: &Path, unit: Option<Unit>) -> Result<Trace, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, unit).map_err(|e| e.in_file(path))
}

/// Why an analysed trace is refused: its rotation is no disk's, or it has
/// no rotation at all while the same numbers in another unit would; the
/// message says which unit to try.
pub fn implausible_units(trace: &Trace, ex: &crate::extract::Extraction) -> Option<String> {
    use crate::extract::{skippy, Extraction};
    let plausible = |e: &Extraction| match e {
        Extraction::Rotational(e) => (2.0..=30.0)
            .contains(&e.rotation_ms)
            .then_some(e.rotation_ms),
        Extraction::NoRotation { .. } => None,
    };
    if plausible(ex).is_some() {
        return None;
    }
    // The same trace read in each other unit.
    let other = [Unit::Ms, Unit::Us, Unit::S]
        .into_iter()
        .filter(|&u| u != trace.unit)
        .find_map(|u| {
            let k = u.ms_per_unit() / trace.unit.ms_per_unit();
            let pts: Vec<Point> = trace
                .points
                .iter()
                .map(|p| Point {
                    latency_ms: p.latency_ms * k,
                    ..*p
                })
                .collect();
            plausible(&skippy(&pts)).map(|r| (u, r))
        });
    let read_as = format!(
        "read as {} ({})",
        trace.unit.name(),
        if trace.unit_stated {
            "as stated"
        } else {
            "assumed: no header names the unit"
        }
    );
    match (ex, other) {
        (Extraction::Rotational(e), Some((u, r))) => Some(format!(
            "a rotation of {:.3} ms is outside 2-30 ms, which no disk has; {read_as}; in {} the trace gives {r:.3} ms: pass --unit {} (or name it in the header, e.g. latency_{})",
            e.rotation_ms,
            u.name(),
            u.name(),
            u.name()
        )),
        (Extraction::Rotational(e), None) => Some(format!(
            "a rotation of {:.3} ms is outside 2-30 ms, which no disk has; {read_as}: check the trace's unit (--unit ms|us|s)",
            e.rotation_ms
        )),
        (Extraction::NoRotation { reason }, Some((u, r))) if !trace.unit_stated => Some(format!(
            "no rotational signature {read_as} ({reason}); in {} the trace gives a rotation of {r:.3} ms: pass --unit {}",
            u.name(),
            u.name()
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(step: u32, lba: u64, latency_ms: f64) -> Point {
        Point {
            step,
            lba,
            latency_ms,
        }
    }

    fn lat(t: &Trace) -> Vec<f64> {
        t.points.iter().map(|p| p.latency_ms).collect()
    }

    #[test]
    fn a_written_trace_reads_back() {
        let pts = vec![pt(0, 1, 8.25), pt(1, 3, 0.123456789), pt(2, 6, 12.0)];
        let text = to_csv(&pts);
        assert_eq!(
            text,
            "step,latency_ms,lba\n0,8.250000,1\n1,0.123457,3\n2,12.000000,6\n"
        );
        let back = parse(&text, None).unwrap();
        assert_eq!((back.unit, back.unit_stated), (Unit::Ms, true));
        assert_eq!(back.points.len(), 3);
        for (a, b) in pts.iter().zip(&back.points) {
            assert_eq!((a.step, a.lba), (b.step, b.lba));
            assert!((a.latency_ms - b.latency_ms).abs() < 1e-6);
        }
    }

    #[test]
    fn missing_positions_are_reconstructed_from_the_steps() {
        let back = parse(
            "step,latency_ms\n0,1.0\n1, 2.0 \n2,3.0,x\n3,4.0,100\n",
            None,
        )
        .unwrap();
        let lbas: Vec<u64> = back.points.iter().map(|p| p.lba).collect();
        assert_eq!(lbas, [0, 2, 5, 100]);
        assert_eq!(back.points[1].latency_ms, 2.0);
    }

    #[test]
    fn reconstructed_positions_step_like_a_run() {
        // A forward run moves on by step + 1 sectors after each access.
        for s in 1..500 {
            assert_eq!(skippy_lba(s) - skippy_lba(s - 1), s as u64 + 1);
        }
    }

    #[test]
    fn separators_are_commas_semicolons_or_whitespace() {
        let want = [8.25, 0.5, 12.0];
        for text in [
            "step latency_ms lba\n0 8.25 1\n1   0.5 3\n2 12 6\n",
            "step\tlatency_ms\tlba\n0\t8.25\t1\n1\t0.5\t3\n2\t12\t6\n",
            "step;latency_ms;lba\n0;8.25;1\n1; 0.5 ;3\n2;12;6\n",
            "step,latency_ms,lba\n0,8.25,1\n1,0.5,3\n2,12,6\n",
            "0 8.25\n1 0.5\n2 12\n",
        ] {
            let t = parse(text, None).unwrap();
            assert_eq!(lat(&t), want, "{text:?}");
        }
        // A semicolon line keeps its decimal comma out of the fields: the
        // value does not parse, and the line is named.
        let e = parse("step;latency_ms\n0;8,25\n", None).unwrap_err();
        assert!(
            matches!(
                e,
                ParseError::NoPoints {
                    first_line: Some((1, _))
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn units_come_from_the_header_or_the_flag() {
        let us = "step,latency_us,lba\n0,8250,1\n1,500,3\n";
        let t = parse(us, None).unwrap();
        assert_eq!((t.unit, t.unit_stated), (Unit::Us, true));
        assert_eq!(lat(&t), [8.25, 0.5]);
        let s = "step\tlatency (s)\n0\t0.00825\n1\t0.0005\n";
        let t = parse(s, None).unwrap();
        assert_eq!(t.unit, Unit::S);
        assert!((t.points[0].latency_ms - 8.25).abs() < 1e-9);
        let bare = "0 8250\n1 500\n";
        let t = parse(bare, None).unwrap();
        assert_eq!((t.unit, t.unit_stated), (Unit::Ms, false));
        let t = parse(bare, Some(Unit::Us)).unwrap();
        assert_eq!((t.unit, t.unit_stated), (Unit::Us, true));
        assert_eq!(lat(&t), [8.25, 0.5]);
        let t = parse("# unit: us\n0;8250\n1;500\n", None).unwrap();
        assert_eq!(t.unit, Unit::Us);
        assert_eq!(
            parse(us, Some(Unit::Ms)).unwrap_err(),
            ParseError::UnitConflict {
                header: "us",
                flag: "ms"
            }
        );
        assert_eq!(parse(us, Some(Unit::Us)).unwrap().unit, Unit::Us);
        for (f, u) in [
            ("latency_ms", Some(Unit::Ms)),
            ("Latency(µs)", Some(Unit::Us)),
            ("latency [usec]", Some(Unit::Us)),
            ("time_seconds", Some(Unit::S)),
            ("latency", None),
            ("lba", None),
        ] {
            assert_eq!(Unit::named_in(f), u, "{f}");
        }
        assert_eq!("us".parse(), Ok(Unit::Us));
        assert!("min".parse::<Unit>().is_err());
    }

    #[test]
    fn no_point_at_all_is_an_error_naming_the_first_line() {
        // What used to parse silently as zero points.
        let e = parse("step|latency\n0|8.25\n", None).unwrap_err();
        assert_eq!(
            e,
            ParseError::NoPoints {
                first_line: Some((1, "step|latency".into()))
            }
        );
        assert!(
            e.to_string().starts_with("1: found \"step|latency\""),
            "{e}"
        );
        let e = parse("", None).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        let e = parse("step,latency_ms\n", None).unwrap_err();
        assert!(
            matches!(
                e,
                ParseError::NoPoints {
                    first_line: Some((1, _))
                }
            ),
            "{e}"
        );
        // A header then garbage names the garbage's line... the header's.
        let e = parse("# comment\nstep,latency_ms\nx,y\n", None).unwrap_err();
        assert!(
            matches!(
                e,
                ParseError::NoPoints {
                    first_line: Some((2, _))
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn short_lines_and_a_header_are_skipped_other_garbage_is_not() {
        assert_eq!(
            parse("whatever header\n\n1,2.0\n", None)
                .unwrap()
                .points
                .len(),
            1
        );
        let e = parse("step,latency_ms\n1,2.0\nx,y\n", None).unwrap_err();
        assert!(matches!(e, ParseError::BadLine { line: 3, .. }), "{e}");
        // Only the first line may be a header.
        let e = parse("1,2.0\nstep,latency_ms\n", None).unwrap_err();
        assert!(matches!(e, ParseError::BadLine { line: 2, .. }), "{e}");
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let e = parse("step,latency_ms\n1,2.0\nx,y\n", None)
            .unwrap_err()
            .in_file(Path::new("t.csv"));
        assert!(
            e.to_string().starts_with("t.csv:3: expected step,latency"),
            "{e}"
        );
        let missing = Path::new("/nonexistent/fastpath-trace.csv");
        match read(missing, None) {
            Err(e @ Error::Read { .. }) => {
                assert_eq!(e.to_string(), format!("reading {}", missing.display()));
                let src = std::error::Error::source(&e).expect("keeps the io::Error");
                assert!(src.downcast_ref::<io::Error>().is_some());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn files_round_trip() {
        let dir = std::env::temp_dir().join(format!("disk-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t.csv");
        let pts: Vec<Point> = (0..50).map(|s| pt(s, skippy_lba(s), s as f64)).collect();
        write(&f, &pts).unwrap();
        let back = read(&f, None).unwrap();
        assert_eq!(back.points.len(), 50);
        assert!(back.points.iter().zip(&pts).all(|(a, b)| a.lba == b.lba));
        assert!(matches!(
            write(&dir.join("no/such/dir.csv"), &pts),
            Err(Error::Write { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
