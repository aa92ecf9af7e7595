//! Health checks: a pool's (`health = { ... }` in `[[pools]]`) and the
//! `[fleet]` peers' (`[fleet] health`), with their defaults and checks.

use serde::{Deserialize, Serialize};

use super::{problem, Config, Problem, MAX_DURATION_MS};

/// The longest HTTP health-check path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// A health check's timers, counts, path and expected status (`key` is
/// where it is: `pools[3].health`, `fleet.health`).
pub(super) fn check_health_conf(key: &str, h: &HealthConf) -> Result<(), Problem> {
    if h.interval_ms == 0
        || h.timeout_ms == 0
        || h.interval_ms > MAX_DURATION_MS
        || h.timeout_ms > MAX_DURATION_MS
        || h.timeout_ms > h.interval_ms * 10
    {
        return problem(
            key.into(),
            format!(
                "interval_ms and timeout_ms must be positive, at most a day ({MAX_DURATION_MS}), \
                 timeout_ms at most 10x interval_ms"
            ),
        );
    }
    if h.rise == 0 || h.fall == 0 {
        return problem(key.into(), "rise and fall must be at least 1".into());
    }
    // Port 0 is no port: a connection to it is refused by every host, so
    // every backend would be down.
    if h.port == 0 {
        return problem(
            format!("{key}.port"),
            "0 is not a port a check can reach: give the port the backends serve on, \
             like 80"
                .into(),
        );
    }
    // The path goes into the request line as written: a space, a line
    // break, a NUL or a TAB would split or end it.
    if !h.path.starts_with('/')
        || h.path.chars().any(|c| c == ' ' || c.is_control())
        || h.path.len() > MAX_PATH_BYTES
    {
        let shown: String = h.path.chars().take(40).collect();
        return problem(
            format!("{key}.path"),
            format!(
                "{shown:?} must start with / and hold no spaces or control characters (line \
                 breaks, NUL, TAB), in at most {MAX_PATH_BYTES} bytes; encode them as %20, \
                 %09..."
            ),
        );
    }
    if !(100..=599).contains(&h.expect_status) {
        return problem(
            format!("{key}.expect_status"),
            format!(
                "{} is not an HTTP status; expected 100 to 599 (200: OK)",
                h.expect_status
            ),
        );
    }
    Ok(())
}

/// How a pool's backends (or the `[fleet]` peers) are health-checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckKind {
    /// A TCP connection to the port succeeds.
    Tcp,
    /// An HTTP GET of `path` answers `expect_status`.
    Http,
    /// `[fleet]` peers only: the peer's own fastpath answers a UDP
    /// liveness probe on `port` at its address, and does so only while its
    /// datapath's heartbeat advances (so a peer whose machine is up but
    /// whose forwarder is dead or stalled is down). Nothing else listens
    /// there, unlike BGP's port, where every probe made BIRD log an
    /// unexpected connection.
    Fastpath,
}

/// A pool's health check (`health = { ... }` in `[[pools]]`).
///
/// ```toml
/// [[pools]]
/// name = "web"
/// health = { kind = "http", port = 80, path = "/", expect_status = 200,
///            interval_ms = 1000, timeout_ms = 500, rise = 2, fall = 2, via = "direct" }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConf {
    /// TCP connect or HTTP GET.
    pub kind: CheckKind,
    /// Port on the backend's address (1 to 65535).
    pub port: u16,
    /// HTTP path.
    #[serde(default = "slash")]
    pub path: String,
    /// Expected HTTP status.
    #[serde(default = "ok200")]
    pub expect_status: u16,
    /// Milliseconds between checks.
    #[serde(default = "interval")]
    pub interval_ms: u64,
    /// Milliseconds a check may take.
    #[serde(default = "timeout")]
    pub timeout_ms: u64,
    /// Consecutive successes that make a down backend healthy.
    #[serde(default = "two")]
    pub rise: u32,
    /// Consecutive failures that take a healthy backend down.
    #[serde(default = "two")]
    pub fall: u32,
    /// Which way the check goes: `"direct"` to the backend's own address,
    /// or `"tunnel"`: GRE-encapsulated to the backend with a VIP of the pool
    /// as inner destination, the way client traffic goes, so a backend
    /// whose decapsulation is dead is seen as down. Tunnel checks need root
    /// and an address VIP over the pool.
    #[serde(default)]
    pub via: CheckPath,
}

/// The way a health check goes (`via` in a pool's `health`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckPath {
    /// To the backend's own address.
    #[default]
    Direct,
    /// Through GRE to a VIP on the backend, as client traffic goes.
    Tunnel,
}

pub(super) fn slash() -> String {
    "/".into()
}
pub(super) fn ok200() -> u16 {
    200
}
pub(super) fn interval() -> u64 {
    1000
}
pub(super) fn timeout() -> u64 {
    500
}
pub(super) fn two() -> u32 {
    2
}

impl Config {
    /// Each pool's health check: timers, rise and fall, HTTP path.
    pub(super) fn check_health(&self) -> Result<(), Problem> {
        let mut tunnel_vips = None;
        for (i, p) in self.pools.iter().enumerate() {
            if let Some(h) = &p.health {
                if h.kind == CheckKind::Fastpath {
                    return problem(
                        format!("pools[{i}].health.kind"),
                        "\"fastpath\" checks [fleet] peers; check backends with \"tcp\" or \"http\"".into(),
                    );
                }
                check_health_conf(&format!("pools[{i}].health"), h)?;
                if h.via == CheckPath::Tunnel
                    && !tunnel_vips
                        .get_or_insert_with(|| self.tunnel_vips())
                        .contains_key(p.name.as_str())
                {
                    return problem(
                        format!("pools[{i}].health.via"),
                        format!(
                            "tunnel checks go to a VIP of the pool, but no VIP with an address \
                             serves pool {:?} (directly or through an include); to take its last \
                             VIP away, check it directly first (via = \"direct\" in \
                             pools[{i}].health, or no health), or keep a VIP with an address \
                             over it",
                            p.name
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::*;
    use crate::config::*;

    #[test]
    fn tunnel_checks_need_an_address_vip_over_the_pool() {
        let tunnel = GOOD.replace(
            "include = [\"extra\"]",
            "include = [\"extra\"]\nhealth = { kind = \"http\", port = 80, via = \"tunnel\" }",
        );
        let c = Config::parse(&tunnel, "t").unwrap();
        assert_eq!(c.tunnel_vip("web"), Some("192.0.2.80".parse().unwrap()));
        // "extra" is served through web's include.
        assert_eq!(c.tunnel_vip("extra"), Some("192.0.2.80".parse().unwrap()));
        let e = err(&tunnel.replace("pool = \"web\"", "pool = \"extra\""));
        assert_eq!(e.key, "pools[0].health.via", "{e}");
        // The refusal says how to get where the operator was going.
        assert!(
            e.problem.contains("via = \"direct\"") && e.problem.contains("pools[0].health"),
            "{e}"
        );
        // A VIP naming a missing pool is reported as that, not as the
        // tunnel check that lost its VIP.
        let e = err(&tunnel.replace("pool = \"web\"", "pool = \"gone\""));
        assert_eq!(e.key, "vips[0].pool", "{e}");
        let e = err(&GOOD.replace(
            "include = [\"extra\"]",
            "include = [\"extra\"]\nhealth = { kind = \"tcp\", port = 80, via = \"sideways\" }",
        ));
        assert!(e.problem.contains("sideways"), "{e}");
    }

    #[test]
    fn health_and_bgp_values_are_in_range() {
        let health = |h: &str| {
            GOOD.replace(
                "include = [\"extra\"]",
                &format!("include = [\"extra\"]\nhealth = {{ kind = \"http\", port = 80, {h} }}"),
            )
        };
        Config::parse(&health("expect_status = 204"), "t").unwrap();
        for (h, key) in [
            ("expect_status = 0", "pools[0].health.expect_status"),
            ("expect_status = 600", "pools[0].health.expect_status"),
            ("interval_ms = 9223372036854775807", "pools[0].health"),
            (
                "interval_ms = 1000, timeout_ms = 9223372036854775807",
                "pools[0].health",
            ),
        ] {
            assert_eq!(err(&health(h)).key, key, "{h}");
        }
        let long_path = format!("path = \"/{}\"", "p".repeat(2000));
        assert_eq!(err(&health(&long_path)).key, "pools[0].health.path");
        let bgp = |k: &str| {
            GOOD.replace(
                "[encap]",
                &format!("[bgp]\nvips_file = \"/run/v.conf\"\n{k}\n[encap]"),
            )
        };
        Config::parse(&bgp("poll_ms = 60000"), "t").unwrap();
        for k in ["poll_ms = 9000000000000000000", "poll_ms = 60001"] {
            assert_eq!(err(&bgp(k)).key, "bgp.poll_ms", "{k}");
        }
        assert_eq!(
            err(&bgp(&format!("protocol = \"{}\"", "p".repeat(65)))).key,
            "bgp.protocol"
        );
        assert_eq!(err(&bgp("birdc = [\"bird\\u0000c\"]")).key, "bgp.birdc");
        let fleet = format!("{GOOD}\n[fleet]\npeers = [\"10.0.0.1\", \"255.255.255.255\"]\n");
        assert_eq!(err(&fleet).key, "fleet.peers[1]");
        let fleet = format!("{GOOD}\n[fleet]\npeers = [\"10.0.0.1\"]\nhealth = {{ kind = \"http\", port = 80, expect_status = 0 }}\n");
        assert_eq!(err(&fleet).key, "fleet.health.expect_status");
    }
}
