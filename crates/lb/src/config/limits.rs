//! The bounds every section is checked against, the names they share, and
//! the counts checked before anything else walks the file.

use super::{problem, Config, PoolConf, Problem};

/// The most `[[pools]]`, `[[vips]]` or `[[prefix_groups]]` a file may
/// hold: 65,536 of each (fifty times the largest configuration measured,
/// 1,000 VIPs over 1,000 pools; a VIP's prefix group is kept in 16 bits).
pub const MAX_ELEMENTS: usize = 65_536;

/// The most backends all pools list together: 1,048,576 (ten times the
/// largest configuration measured, 1,000 pools of 100).
pub const MAX_BACKENDS: usize = 1 << 20;

/// The most `include` entries all pools list together, and the most
/// prefixes all prefix groups list together: 1,048,576.
pub const MAX_LIST_ENTRIES: usize = 1 << 20;

/// The longest name (of a pool, backend, VIP, prefix group or machine), in
/// bytes: 255, a DNS name's limit; names are printed in tables, reports and
/// metrics labels.
pub const MAX_NAME_BYTES: usize = 255;

/// The longest timeout, interval or wait a configuration may give
/// (conntrack timeouts, health-check timers, the fragment wait): one day.
pub const MAX_DURATION_MS: u64 = 86_400_000;

/// How often a packet thread publishes its counters to the control plane
/// (the datapath's live view), milliseconds. Defined here, below the
/// datapath, because `[bgp] drain_quiet_ms` is bounded by it: a quiet time
/// shorter than two publications would call a busy forwarder drained.
pub const LIVE_INTERVAL_MS: u64 = 100;

/// A name: 1 to [`MAX_NAME_BYTES`] bytes, none of them a control character.
pub(super) fn check_name(key: impl FnOnce() -> String, name: &str) -> Result<(), Problem> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES || name.chars().any(char::is_control) {
        let shown: String = name.chars().take(40).collect();
        let more = if shown.len() < name.len() { "..." } else { "" };
        return problem(
            key(),
            format!(
                "{shown:?}{more} ({} bytes) must be 1 to {MAX_NAME_BYTES} bytes of printable characters",
                name.len()
            ),
        );
    }
    Ok(())
}

impl Config {
    /// How many pools, VIPs, prefix groups, backends, includes and
    /// prefixes the file holds: checked first, so that no other check
    /// walks more than these bounds.
    pub(super) fn check_counts(&self) -> Result<(), Problem> {
        for (key, n) in [
            ("pools", self.pools.len()),
            ("vips", self.vips.len()),
            ("prefix_groups", self.prefix_groups.len()),
        ] {
            if n > MAX_ELEMENTS {
                return problem(
                    key.into(),
                    format!("{n} elements are too many; expected at most {MAX_ELEMENTS}"),
                );
            }
        }
        let sum = |f: &dyn Fn(&PoolConf) -> usize| self.pools.iter().map(f).sum::<usize>();
        for (key, n, max) in [
            ("pools[].backends", sum(&|p| p.backends.len()), MAX_BACKENDS),
            (
                "pools[].include",
                sum(&|p| p.include.len()),
                MAX_LIST_ENTRIES,
            ),
            (
                "pools[].drained",
                sum(&|p| p.drained.len()),
                MAX_LIST_ENTRIES,
            ),
            (
                "prefix_groups[].prefixes",
                self.prefix_groups.iter().map(|g| g.prefixes.len()).sum(),
                MAX_LIST_ENTRIES,
            ),
        ] {
            if n > max {
                return problem(
                    key.into(),
                    format!("{n} entries in all are too many; expected at most {max}"),
                );
            }
        }
        Ok(())
    }
}
