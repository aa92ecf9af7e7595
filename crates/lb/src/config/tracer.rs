//! `[tracer]`: packet-tracer probes (the probes themselves are
//! [`crate::tracer`]).

use serde::{Deserialize, Serialize};

use super::{check_prefix, overlapping, problem, Problem, NOT_UNICAST};

/// `[tracer]`: packet-tracer probes (Maglev section 4.4, [`crate::tracer`]).
/// A probe is forwarded as usual; this load balancer also reports what it
/// did with it, at most `rate_per_s` reports a second (bursts of `burst`),
/// the rest counted as `trace_rate_limited`. Off unless enabled: a report
/// names backends and machines, and goes where the probe says, so only to
/// the prefixes in `report_to` (where the operators' tracers run). Read at
/// start only (a change is reported as needing a restart).
///
/// ```toml
/// [tracer]
/// enabled = true
/// report_to = ["10.1.0.0/24"]
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracerConf {
    /// Whether probes are recognized and reported.
    pub enabled: bool,
    /// Reports per second, sustained.
    pub rate_per_s: u32,
    /// Reports that may go at once after a quiet spell.
    pub burst: u32,
    /// This machine's name in reports (default: `[fleet] name` if set,
    /// else the host name).
    pub name: Option<String>,
    /// Prefixes a report may go to (`"10.1.0.0/24"`); a probe naming any
    /// other address is counted as `trace_invalid` and not reported on.
    /// Needed when enabled.
    pub report_to: Vec<String>,
}

impl Default for TracerConf {
    fn default() -> Self {
        TracerConf {
            enabled: false,
            rate_per_s: 100,
            burst: 100,
            name: None,
            report_to: Vec::new(),
        }
    }
}

impl TracerConf {
    /// `[tracer]`: a rate and burst of at least one report (turn the tracer
    /// off with `enabled = false`), a name that fits in a report.
    pub(super) fn check(&self) -> Result<(), Problem> {
        let t = self;
        for (k, v) in [
            ("tracer.rate_per_s", t.rate_per_s),
            ("tracer.burst", t.burst),
        ] {
            if v == 0 || v > 1_000_000 {
                return problem(
                    k.into(),
                    format!("{v} is out of range; expected 1 to 1000000 (enabled = false turns the tracer off)"),
                );
            }
        }
        if let Some(n) = &t.name {
            if n.is_empty() || n.len() > 255 || n.chars().any(char::is_control) {
                return problem(
                    "tracer.name".into(),
                    format!("{n:?} must be 1 to 255 printable characters"),
                );
            }
        }
        if t.enabled && t.report_to.is_empty() {
            return problem(
                "tracer.report_to".into(),
                "an enabled tracer needs the prefixes reports may go to, e.g. [\"10.1.0.0/24\"]: a probe names its report address, and reports name backends".into(),
            );
        }
        if t.report_to.len() > 1024 {
            return problem(
                "tracer.report_to".into(),
                format!(
                    "{} prefixes are too many; expected at most 1024",
                    t.report_to.len()
                ),
            );
        }
        for (i, p) in t.report_to.iter().enumerate() {
            let key = || format!("tracer.report_to[{i}]");
            let prefix = check_prefix(key, p, "10.1.0.0/24")?;
            // Reports go to unicast hosts only.
            if let Some(what) = overlapping(prefix, &NOT_UNICAST) {
                return problem(
                    key(),
                    format!(
                        "{p:?} includes {what}, where no tracer runs; give the prefix of the \
                         tracers' unicast addresses, e.g. \"10.1.0.0/24\""
                    ),
                );
            }
        }
        Ok(())
    }
}
