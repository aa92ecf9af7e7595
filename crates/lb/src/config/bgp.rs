//! `[bgp]`: announcing the VIPs through BIRD, and the graceful stop.

use serde::{Deserialize, Serialize};

use super::{problem, Problem, LIVE_INTERVAL_MS};

/// `[bgp]`: announcing VIPs through BIRD. BIRD's static protocols are per
/// address family, so there are two of each: fastpath writes the IPv4 VIPs
/// as static routes into `vips_file`, which the BIRD configuration includes
/// in a static protocol named `protocol` (ipv4 channel, configured
/// `disabled`), and the IPv6 VIPs into `vips_file6`, included in
/// `protocol6` (ipv6 channel). fastpath enables a family's protocol while
/// the forwarder is healthy and disables it (withdrawing its VIPs) when the
/// forwarder stops or stalls. It reads back from BIRD, every poll, what
/// BIRD really exports, and puts BIRD back when its state differs. Each
/// routes file states its protocol's wanted state (`disabled no;` or
/// `disabled yes;`, after the shipped `disabled;`), so a `birdc configure`
/// changes only the routes that changed and keeps the protocol as it runs;
/// a withdrawal writes `disabled yes;` before it disables. The IPv6
/// protocol is used only while there are IPv6 VIPs.
/// `dist/bird/fastpath.conf` defines both with these default names.
///
/// ```toml
/// [bgp]
/// vips_file = "/run/fastpath/vips.conf"  # IPv4 routes; IPv6 in vips6.conf beside it
/// protocol = "fastpath_vips"
/// protocol6 = "fastpath_vips6"
/// birdc = ["birdc"]
/// poll_ms = 500
/// drain_ms = 3000          # keep forwarding after the withdrawal, at most this long
/// drain_quiet_ms = 300     # ... until no packet arrived for this long
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Bgp {
    /// The file of IPv4 static routes fastpath writes for BIRD to include.
    pub vips_file: std::path::PathBuf,
    /// BIRD's static protocol holding the IPv4 VIP routes.
    #[serde(default = "default_bird_protocol")]
    pub protocol: String,
    /// The file of IPv6 static routes (default: `vips_file` with a 6
    /// before its extension, `/run/fastpath/vips6.conf` beside
    /// `/run/fastpath/vips.conf`; see [`Bgp::routes_file6`]).
    #[serde(default)]
    pub vips_file6: Option<std::path::PathBuf>,
    /// BIRD's static protocol holding the IPv6 VIP routes; empty when this
    /// BIRD has none (IPv6 VIPs are then not announced, which
    /// `check-config` and the daemon's start warn about).
    #[serde(default = "default_bird_protocol6")]
    pub protocol6: String,
    /// The command that talks to BIRD (e.g. ["birdc", "-s", "/run/bird/bird.ctl"]).
    #[serde(default = "default_birdc")]
    pub birdc: Vec<String>,
    /// How often the controller checks the forwarder, milliseconds.
    #[serde(default = "default_bgp_poll")]
    pub poll_ms: u64,
    /// Graceful stop (SIGTERM, SIGINT): after withdrawing the VIPs, keep
    /// forwarding until no packet has arrived for `drain_quiet_ms` (the
    /// router has moved the traffic to the other load balancers), at most
    /// this long, milliseconds; 0 stops at once.
    #[serde(default = "default_drain_ms")]
    pub drain_ms: u64,
    /// How long without an arriving packet counts as drained, milliseconds.
    #[serde(default = "default_drain_quiet_ms")]
    pub drain_quiet_ms: u64,
}

fn default_drain_ms() -> u64 {
    3000
}
fn default_drain_quiet_ms() -> u64 {
    300
}

fn default_bird_protocol() -> String {
    "fastpath_vips".into()
}
fn default_bird_protocol6() -> String {
    "fastpath_vips6".into()
}

impl Bgp {
    /// The file of IPv6 routes: `vips_file6`, else `vips_file` with a 6
    /// before its extension (`vips.conf` gives `vips6.conf`, `vips` gives
    /// `vips6`).
    pub fn routes_file6(&self) -> std::path::PathBuf {
        if let Some(f) = &self.vips_file6 {
            return f.clone();
        }
        let stem = self
            .vips_file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = match self.vips_file.extension() {
            Some(ext) => format!("{stem}6.{}", ext.to_string_lossy()),
            None => format!("{stem}6"),
        };
        self.vips_file.with_file_name(name)
    }
}
/// BIRD's keywords, which name no protocol (see the file's header).
const BIRD_KEYWORDS: &str = include_str!("bird_keywords.txt");

/// Whether `name` can name a BIRD protocol in the commands fastpath sends
/// (`enable NAME`, `disable NAME`, `show protocols all NAME`): a BIRD
/// symbol (a letter or `_`, then letters, digits and `_`, at most 64
/// characters) that is none of BIRD's keywords, so never `all`, which
/// BIRD reads as every protocol, BGP sessions included. The one check of
/// `check-config`, the daemon and `fastpath lb withdraw`; the error says
/// why, for the caller to name the key.
pub fn bird_protocol_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let symbol = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 64;
    if !symbol {
        return Err(format!(
            "{name:?} is not a BIRD protocol name (a letter or _, then letters, digits and _, at most 64)"
        ));
    }
    let lower = name.to_ascii_lowercase();
    let keyword = BIRD_KEYWORDS
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(str::split_whitespace)
        .any(|k| k == lower);
    if keyword {
        return Err(format!(
            "{name:?} is one of BIRD's keywords{}, not a protocol name",
            if lower == "all" {
                " (`disable all` would disable every protocol, BGP sessions included)"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

fn default_birdc() -> Vec<String> {
    vec!["birdc".into()]
}
/// The longest `[bgp] drain_ms`: one minute.
pub const MAX_DRAIN_MS: u64 = 60_000;

/// The shortest `[bgp] poll_ms`: three polls without a heartbeat withdraw
/// the VIPs, and an idle forwarder beats about every 20 ms.
pub const MIN_BGP_POLL_MS: u64 = 50;

/// The longest `[bgp] poll_ms`: one minute. Three polls without a
/// heartbeat withdraw the VIPs, so a longer poll would keep a dead
/// forwarder announced for minutes.
pub const MAX_BGP_POLL_MS: u64 = 60_000;

fn default_bgp_poll() -> u64 {
    500
}

impl Bgp {
    /// `[bgp]`: a birdc command, a BIRD protocol name, a poll interval.
    pub(super) fn check(&self) -> Result<(), Problem> {
        let b = self;
        if b.birdc.is_empty() {
            return problem(
                "bgp.birdc".into(),
                "needs a command, e.g. [\"birdc\"]".into(),
            );
        }
        if b.birdc.len() > 64 || b.birdc.iter().any(|a| a.len() > 4096 || a.contains('\0')) {
            return problem(
                "bgp.birdc".into(),
                "must be at most 64 arguments of at most 4096 bytes, without NUL".into(),
            );
        }
        if b.vips_file.as_os_str().is_empty() {
            return problem(
                "bgp.vips_file".into(),
                "needs the path of the file BIRD includes".into(),
            );
        }
        if let Err(why) = bird_protocol_name(&b.protocol) {
            return problem("bgp.protocol".into(), why);
        }
        // Empty: no IPv6 protocol in this BIRD.
        if !b.protocol6.is_empty() {
            if let Err(why) = bird_protocol_name(&b.protocol6) {
                return problem(
                    "bgp.protocol6".into(),
                    format!("{why} (empty: no IPv6 announcements)"),
                );
            }
        }
        if b.protocol6 == b.protocol {
            return problem(
                "bgp.protocol6".into(),
                format!(
                    "{:?} is bgp.protocol too: each family needs its own protocol (empty: no IPv6 announcements)",
                    b.protocol6
                ),
            );
        }
        if b.routes_file6() == b.vips_file || b.routes_file6().as_os_str().is_empty() {
            return problem(
                "bgp.vips_file6".into(),
                "needs a path other than vips_file: each family's routes have their own file"
                    .into(),
            );
        }
        // Counters reach the control plane every LIVE_INTERVAL_MS: a
        // shorter quiet time would call a busy forwarder drained. A
        // drain is bounded: a stop must not wait for ever.
        if b.drain_ms > MAX_DRAIN_MS {
            return problem(
                "bgp.drain_ms".into(),
                format!(
                    "{} is longer than {MAX_DRAIN_MS} (a stop must end; 0 stops at once)",
                    b.drain_ms
                ),
            );
        }
        let min_quiet = 2 * LIVE_INTERVAL_MS;
        if b.drain_quiet_ms > MAX_DRAIN_MS
            || (b.drain_ms > 0 && (b.drain_quiet_ms < min_quiet || b.drain_quiet_ms > b.drain_ms))
        {
            return problem(
                "bgp.drain_quiet_ms".into(),
                format!(
                    "{} must be between {min_quiet} (counters are published every {} ms) and drain_ms ({})",
                    b.drain_quiet_ms,
                    LIVE_INTERVAL_MS,
                    b.drain_ms
                ),
            );
        }
        // The forwarder's heartbeat advances every ~20 ms when idle; a
        // faster poll would see an idle forwarder as stalled.
        if b.poll_ms < MIN_BGP_POLL_MS {
            return problem(
                "bgp.poll_ms".into(),
                format!("must be at least {MIN_BGP_POLL_MS} (an idle forwarder's heartbeat advances every ~20 ms)"),
            );
        }
        if b.poll_ms > MAX_BGP_POLL_MS {
            return problem(
                "bgp.poll_ms".into(),
                format!(
                    "{} is longer than {MAX_BGP_POLL_MS} (three polls without a heartbeat \
                     withdraw the VIPs: a dead forwarder would stay announced that long)",
                    b.poll_ms
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::*;
    use crate::config::*;

    #[test]
    fn bgp_names_a_protocol_and_a_routes_file_per_family() {
        let bgp = |extra: &str| {
            format!("{GOOD}\n[bgp]\nvips_file = \"/run/fastpath/vips.conf\"\n{extra}")
        };
        let c = Config::parse(&bgp(""), "t").unwrap();
        let b = c.bgp.as_ref().unwrap();
        assert_eq!(
            (b.protocol.as_str(), b.protocol6.as_str()),
            ("fastpath_vips", "fastpath_vips6")
        );
        assert_eq!(
            b.routes_file6(),
            std::path::Path::new("/run/fastpath/vips6.conf")
        );
        let c = Config::parse(&bgp("").replace("vips.conf", "vips"), "t").unwrap();
        assert_eq!(
            c.bgp.unwrap().routes_file6(),
            std::path::Path::new("/run/fastpath/vips6")
        );
        let c = Config::parse(&bgp("vips_file6 = \"/run/v6\"\nprotocol6 = \"\""), "t").unwrap();
        let b = c.bgp.unwrap();
        assert_eq!(
            (b.routes_file6(), b.protocol6.as_str()),
            (std::path::PathBuf::from("/run/v6"), "")
        );
        for (extra, key) in [
            ("protocol6 = \"fastpath_vips\"", "bgp.protocol6"),
            ("protocol6 = \"no spaces\"", "bgp.protocol6"),
            ("vips_file6 = \"/run/fastpath/vips.conf\"", "bgp.vips_file6"),
        ] {
            assert_eq!(err(&bgp(extra)).key, key, "{extra}");
        }
    }
}

#[cfg(test)]
mod protocol_names {
    use super::bird_protocol_name;

    #[test]
    fn bird_protocol_names_are_symbols_and_never_keywords() {
        for ok in [
            "fastpath_vips",
            "fastpath_vips6",
            "_x",
            "v4",
            "Static1",
            &"a".repeat(64),
        ] {
            assert!(bird_protocol_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1v4", "a-b", "a b", "a.b", "\"x\"", &"a".repeat(65)] {
            let e = bird_protocol_name(bad).unwrap_err();
            assert!(e.contains("not a BIRD protocol name"), "{bad}: {e}");
        }
        for kw in [
            "all", "All", "protocol", "bgp", "static", "define", "disabled", "table",
        ] {
            let e = bird_protocol_name(kw).unwrap_err();
            assert!(e.contains("keywords"), "{kw}: {e}");
        }
        assert!(bird_protocol_name("all")
            .unwrap_err()
            .contains("every protocol"));
    }
}
