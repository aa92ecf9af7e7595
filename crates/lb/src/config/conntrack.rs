//! `[conntrack]`: the packet threads' connection tables.

use serde::{Deserialize, Serialize};

use super::{problem, Problem, MAX_DURATION_MS};

/// The largest `[conntrack] size` per packet thread: 16,777,216 entries
/// (about 0.9 GiB per thread).
pub const MAX_CONNTRACK_SIZE: usize = 1 << 24;

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
    /// Idle timeout of TCP entries, seconds.
    pub tcp_timeout_s: f64,
    /// Idle timeout of other entries, seconds.
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
            if !(v > 0.0 && v <= day_s) {
                return problem(
                    k.into(),
                    format!("{v} must be a positive number of seconds, at most a day ({day_s})"),
                );
            }
        }
        Ok(())
    }
}
