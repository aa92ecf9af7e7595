//! `[conntrack]`: the packet threads' connection tables.

use serde::{Deserialize, Serialize};

use super::{problem, Problem, MAX_DURATION_MS};

/// The largest `[conntrack] size` per packet thread: 16,777,216 entries
/// (about 0.9 GiB per thread).
pub const MAX_CONNTRACK_SIZE: usize = 1 << 24;

/// The shortest `[conntrack]` timeout, seconds: one millisecond, the
/// connection table's unit.
pub const MIN_CONNTRACK_TIMEOUT_S: f64 = 0.001;

/// `[conntrack]`.
///
/// ```toml
/// [conntrack]
/// size = 65536             # entries per packet thread
/// tcp_timeout_s = 300
/// udp_timeout_s = 30
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Conntrack {
    /// Entries per packet thread (a power of two, at least 4).
    pub size: usize,
    /// Idle timeout of TCP entries, seconds: from
    /// [`MIN_CONNTRACK_TIMEOUT_S`] to a day.
    pub tcp_timeout_s: f64,
    /// Idle timeout of other entries, seconds, bounded as TCP's.
    pub udp_timeout_s: f64,
}

impl Default for Conntrack {
    fn default() -> Self {
        Conntrack {
            size: 65_536,
            tcp_timeout_s: 300.0,
            udp_timeout_s: 30.0,
        }
    }
}

impl Conntrack {
    /// `[conntrack]`: table size and timeouts.
    pub(super) fn check(&self) -> Result<(), Problem> {
        let c = self;
        if !c.size.is_power_of_two() || c.size < 4 || c.size > MAX_CONNTRACK_SIZE {
            return problem(
                "conntrack.size".into(),
                format!(
                    "{} must be a power of two from 4 to {MAX_CONNTRACK_SIZE}",
                    c.size
                ),
            );
        }
        let day_s = (MAX_DURATION_MS / 1000) as f64;
        for (k, v) in [
            ("conntrack.tcp_timeout_s", c.tcp_timeout_s),
            ("conntrack.udp_timeout_s", c.udp_timeout_s),
        ] {
            // The datapath counts in milliseconds: anything shorter than
            // one (1e-300) would round to 0 and expire every entry at once.
            // NaN and infinities fail the comparison.
            if !(MIN_CONNTRACK_TIMEOUT_S..=day_s).contains(&v) {
                return problem(
                    k.into(),
                    format!(
                        "{v} must be a number of seconds from {MIN_CONNTRACK_TIMEOUT_S} (one millisecond, \
                         what the connection table counts in) to a day ({day_s})"
                    ),
                );
            }
        }
        Ok(())
    }
}
