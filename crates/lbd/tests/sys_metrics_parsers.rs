//! `/metrics` read by parsers we did not write: Prometheus' own checker
//! (`promtool`) on the classic format, and Python's OpenMetrics parser
//! (`prometheus_client`) on OpenMetrics. The exposition is that of a
//! fixed `/status` snapshot (`tests/data/status.json`, which the unit
//! tests of the exposition read too).
//!
//! System tests: they run outside programs, and fail naming what is
//! missing.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use lb::counters::Counters;
use lbd::status::Status;
use lbd::{encode_metrics_as, MetricsFormat};

fn status() -> Status {
    serde_json::from_str(include_str!("data/status.json")).unwrap()
}

/// Runs `program args` with `input` on its stdin.
fn run_with_input(program: &str, args: &[&str], input: &str) -> Output {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// promtool (Prometheus' own checker, which we did not write) reads
/// the classic exposition, evil names included, without an error.
#[test]
#[ignore = "system test: promtool (Prometheus)"]
fn promtool_accepts_the_classic_format() {
    systest::require_program("promtool");
    let mut s = status();
    s.vips[0].backends[0].name = "b\"1\nx".into();
    let text = encode_metrics_as(MetricsFormat::Classic, &s, &Counters::new(), 0);
    let out = run_with_input("promtool", &["check", "metrics"], &text);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !said.contains("error"),
        "{said}\n{text}"
    );
}

/// Python's OpenMetrics parser (prometheus_client, a parser we did not
/// write) reads the exposition whole.
#[test]
#[ignore = "system test: python3-prometheus-client"]
fn python_openmetrics_parser_accepts_it() {
    let py = "/usr/bin/python3";
    let check = "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as p\n\
                 fams = list(p(sys.stdin.read()))\nprint(len(fams), sum(len(f.samples) for f in fams))";
    systest::require_python_module(py, "prometheus_client");
    let text = encode_metrics_as(MetricsFormat::OpenMetrics, &status(), &Counters::new(), 0);
    let out = run_with_input(py, &["-c", check], &text);
    assert!(
        out.status.success(),
        "{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let families: usize = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(families, text.matches("# TYPE ").count());
}
