//! The SKIPPY trace format: what `fastpath disk skippy --csv` writes and
//! `fastpath disk analyze` reads back, so that a run on one machine can be
//! analysed (and plotted) on another.
//!
//! A trace is CSV, one point a line: `step,latency_ms,lba`, after a header
//! line [`HEADER`]. Reading is lenient where it cannot mislead: fields are
//! trimmed, a line with fewer than two fields is skipped, a first line that
//! does not parse is taken for a header, and a missing or unreadable `lba`
//! is reconstructed from the step ([`skippy_lba`]), as older traces and
//! traces from other tools carry only `step,latency_ms`. Any other line
//! that does not parse is an error naming the file and the line.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use crate::bench::Point;

/// The first line of a written trace.
pub const HEADER: &str = "step,latency_ms,lba";

/// What a data line must hold, as an error message says it.
const EXPECTED: &str = "step,latency_ms";

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
    /// A line of the trace is not a point.
    #[error("{}:{line}: expected {expected}", .path.display())]
    Parse {
        /// The trace file.
        path: PathBuf,
        /// The line, counted from 1.
        line: usize,
        /// What the line should have held.
        expected: &'static str,
    },
}

/// A line of a trace's text that is not a point (see [`parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: expected {expected}")]
pub struct BadLine {
    /// The line, counted from 1.
    pub line: usize,
    /// What the line should have held.
    pub expected: &'static str,
}

impl BadLine {
    /// The same complaint, naming the file it was read from.
    pub fn in_file(self, path: &Path) -> Error {
        Error::Parse {
            path: path.to_path_buf(),
            line: self.line,
            expected: self.expected,
        }
    }
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

/// The points of a trace's text, in file order (see the module's rules).
pub fn parse(text: &str) -> Result<Vec<Point>, BadLine> {
    let mut pts = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let (Some(a), Some(b)) = (f.first(), f.get(1)) else {
            continue;
        };
        match (a.parse::<u32>(), b.parse::<f64>()) {
            (Ok(step), Ok(latency_ms)) => pts.push(Point {
                step,
                lba: f
                    .get(2)
                    .and_then(|x| x.parse().ok())
                    .unwrap_or_else(|| skippy_lba(step)),
                latency_ms,
            }),
            // The header.
            _ if n == 0 => {}
            _ => {
                return Err(BadLine {
                    line: n + 1,
                    expected: EXPECTED,
                })
            }
        }
    }
    Ok(pts)
}

/// Read the trace file at `path`.
pub fn read(path: &Path) -> Result<Vec<Point>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text).map_err(|e| e.in_file(path))
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

    #[test]
    fn a_written_trace_reads_back() {
        let pts = vec![pt(0, 1, 8.25), pt(1, 3, 0.123456789), pt(2, 6, 12.0)];
        let text = to_csv(&pts);
        assert_eq!(
            text,
            "step,latency_ms,lba\n0,8.250000,1\n1,0.123457,3\n2,12.000000,6\n"
        );
        let back = parse(&text).unwrap();
        assert_eq!(back.len(), 3);
        for (a, b) in pts.iter().zip(&back) {
            assert_eq!((a.step, a.lba), (b.step, b.lba));
            assert!((a.latency_ms - b.latency_ms).abs() < 1e-6);
        }
    }

    #[test]
    fn missing_positions_are_reconstructed_from_the_steps() {
        let back = parse("step,latency_ms\n0,1.0\n1, 2.0 \n2,3.0,x\n3,4.0,100\n").unwrap();
        let lbas: Vec<u64> = back.iter().map(|p| p.lba).collect();
        assert_eq!(lbas, [0, 2, 5, 100]);
        assert_eq!(back[1].latency_ms, 2.0);
    }

    #[test]
    fn reconstructed_positions_step_like_a_run() {
        // A forward run moves on by step + 1 sectors after each access.
        for s in 1..500 {
            assert_eq!(skippy_lba(s) - skippy_lba(s - 1), s as u64 + 1);
        }
    }

    #[test]
    fn short_lines_and_a_header_are_skipped_other_garbage_is_not() {
        assert_eq!(parse("whatever header\n\n1,2.0\nnote\n").unwrap().len(), 1);
        assert_eq!(parse("").unwrap().len(), 0);
        assert_eq!(
            parse("step,latency_ms\n1,2.0\nx,y\n").unwrap_err(),
            BadLine {
                line: 3,
                expected: "step,latency_ms"
            }
        );
        // Only the first line may be a header.
        assert_eq!(parse("1,2.0\nstep,latency_ms\n").unwrap_err().line, 2);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let e = BadLine {
            line: 3,
            expected: EXPECTED,
        }
        .in_file(Path::new("t.csv"));
        assert_eq!(e.to_string(), "t.csv:3: expected step,latency_ms");
        let missing = Path::new("/nonexistent/fastpath-trace.csv");
        match read(missing) {
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
        let back = read(&f).unwrap();
        assert_eq!(back.len(), 50);
        assert!(back.iter().zip(&pts).all(|(a, b)| a.lba == b.lba));
        assert!(matches!(
            write(&dir.join("no/such/dir.csv"), &pts),
            Err(Error::Write { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
