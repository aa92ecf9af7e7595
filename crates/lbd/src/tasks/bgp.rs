//! The controller of the paper's section 3.2: it watches the forwarder and
//! announces or withdraws every VIP through a real BGP daemon (BIRD). No BGP
//! is spoken here: BIRD holds the sessions; fastpath writes the VIP routes
//! into a file BIRD includes and enables or disables the static protocol
//! that holds them. The controller is a thread of the daemon
//! ([`controller`]); the [`Announcer`] is what it drives.

use std::fmt::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lb::config::{Bgp, Config};

use crate::state::{BgpState, Shared};

/// Why talking to BIRD failed.
#[derive(Debug, thiserror::Error)]
pub enum BgpError {
    /// `[bgp] birdc` names no command (rejected by validation; kept for
    /// callers that build a [`Bgp`] by hand).
    #[error("bgp.birdc is empty: it needs a command, e.g. [\"birdc\"]")]
    NoBirdc,
    /// birdc could not be started.
    #[error("running {program}: {source} (is bird2 installed?)")]
    Spawn {
        /// The program.
        program: String,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// birdc ran and BIRD refused (codes 8xxx/9xxx, or a failed exit).
    #[error("birdc {command}: {output}")]
    Refused {
        /// The birdc arguments.
        command: String,
        /// What birdc printed.
        output: String,
    },
    /// The file of VIP routes that BIRD includes could not be written.
    #[error("writing {path}: {source}")]
    RoutesFile {
        /// The file (`[bgp] vips_file`).
        path: std::path::PathBuf,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
}

/// Runs a birdc command; its output, or why it failed.
pub fn birdc(b: &Bgp, args: &[&str]) -> Result<String, BgpError> {
    let (program, rest) = b.birdc.split_first().ok_or(BgpError::NoBirdc)?;
    let out = Command::new(program)
        .args(rest)
        .args(args)
        .output()
        .map_err(|source| BgpError::Spawn {
            program: program.clone(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // birdc reports errors on stdout with codes 8xxx/9xxx and exits 0.
    if !out.status.success()
        || text
            .lines()
            .any(|l| l.starts_with('8') || l.starts_with('9'))
    {
        return Err(BgpError::Refused {
            command: args.join(" "),
            output: format!(
                "{}{}",
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(text)
}

/// The BIRD static routes for the configuration's address VIPs whose
/// index `serving` accepts (one route per address, whatever its ports; an
/// address is announced if any VIP on it serves). Only the family of `ipv6`
/// is written: BIRD's static protocol is per address family.
pub fn routes(cfg: &Config, ipv6: bool, serving: &dyn Fn(usize) -> bool) -> String {
    let mut addrs: Vec<std::net::IpAddr> = cfg
        .vips
        .iter()
        .enumerate()
        .filter(|(i, _)| serving(*i))
        .filter_map(|(_, v)| v.address)
        .filter(|a| a.is_ipv6() == ipv6)
        .collect();
    addrs.sort();
    addrs.dedup();
    let mut s = String::from(lb::config::VIPS_FILE_HEADER);
    for a in addrs {
        let len = if a.is_ipv4() { 32 } else { 128 };
        let _ = writeln!(s, "route {a}/{len} blackhole;");
    }
    s
}

/// Announcement state, driven by [`Announcer::step`].
#[derive(Debug, Default)]
pub struct Announcer {
    written: Option<String>,
    announced: Option<bool>,
    /// The last error talking to BIRD, if the last step failed.
    pub last_error: Option<String>,
}

impl Announcer {
    /// Makes BIRD's view match: the routes of the VIPs of `cfg` that
    /// `serving` accepts (those with a healthy backend), announced if the
    /// forwarder is `healthy`, all withdrawn otherwise.
    pub fn step(&mut self, b: &Bgp, cfg: &Config, healthy: bool, serving: &dyn Fn(usize) -> bool) {
        let res = (|| {
            let want = routes(cfg, false, serving);
            if self.written.as_ref() != Some(&want) {
                std::fs::write(&b.vips_file, &want).map_err(|source| BgpError::RoutesFile {
                    path: b.vips_file.clone(),
                    source,
                })?;
                birdc(b, &["configure"])?;
                self.written = Some(want);
                self.announced = None; // a reconfiguration may reset the protocol's state
            }
            if self.announced != Some(healthy) {
                birdc(
                    b,
                    &[if healthy { "enable" } else { "disable" }, &b.protocol],
                )?;
                // Announcing is the normal course (INFO); withdrawing what
                // was announced means the datapath stopped beating (WARN).
                match (healthy, self.announced) {
                    (true, _) => tracing::info!(announced = true, "BGP: VIPs announced"),
                    (false, Some(true)) => tracing::warn!(
                        announced = false,
                        "BGP: VIPs withdrawn: the datapath stopped beating"
                    ),
                    (false, _) => tracing::info!(
                        announced = false,
                        "BGP: VIPs not announced until the datapath forwards"
                    ),
                }
                self.announced = Some(healthy);
            }
            Ok::<(), BgpError>(())
        })();
        self.last_error = res.err().map(|e| e.to_string());
        if let Some(e) = &self.last_error {
            tracing::error!("BGP controller: {e}");
        }
    }

    /// Withdraws every VIP (on shutdown).
    pub fn withdraw(&mut self, b: &Bgp) {
        match birdc(b, &["disable", &b.protocol]) {
            Ok(_) => tracing::info!("BGP: VIPs withdrawn"),
            Err(e) => tracing::error!("BGP controller: could not withdraw: {e}"),
        }
        self.announced = Some(false);
    }

    /// Whether the VIPs are announced as far as we know.
    pub fn announced(&self) -> bool {
        self.announced == Some(true)
    }
}

/// Announces the VIPs while the datapath's heartbeat advances; withdraws
/// them when it stalls, when `[bgp]` goes away, and on the way out.
pub fn controller(shared: &Shared, heartbeat: &AtomicU64, stop: &AtomicBool) {
    // Without [bgp] at start nothing is announced, and adding it later
    // needs a restart (Config::restart_keys): no thread stays for it.
    if shared.control().config().bgp.is_none() {
        return;
    }
    let mut ann = Announcer::default();
    let mut last_beat = 0u64;
    let mut stale = 0u32;
    let mut last_conf = None;
    while !stop.load(Ordering::Relaxed) {
        let cfg = shared
            .control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .config()
            .clone();
        let Some(b) = cfg.bgp.clone() else {
            if let Some(old) = last_conf.take() {
                ann.withdraw(&old);
            }
            *shared.bgp.lock().unwrap_or_else(|p| p.into_inner()) = None;
            std::thread::sleep(Duration::from_millis(500));
            continue;
        };
        // Withdraw only after three polls without progress: one quiet
        // poll is a scheduling hiccup, not a dead forwarder.
        let beat = heartbeat.load(Ordering::Relaxed);
        stale = if beat == last_beat { stale + 1 } else { 0 };
        let alive = beat != 0 && stale < 3;
        last_beat = beat;
        // Announce only VIPs that can be served: a VIP whose backends are
        // all down would attract traffic only to drop it.
        let tables = shared
            .control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tables()
            .load_full();
        ann.step(&b, &cfg, alive, &|i| {
            tables.vips.get(i).is_some_and(|v| !v.slots.is_empty())
        });
        *shared.bgp.lock().unwrap_or_else(|p| p.into_inner()) = Some(BgpState {
            announced: ann.announced(),
            error: ann.last_error.clone(),
        });
        last_conf = Some(b.clone());
        // Sleep in small steps so a stop is acted on quickly.
        let until = Instant::now() + Duration::from_millis(b.poll_ms);
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if let Some(b) = last_conf {
        ann.withdraw(&b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_per_family_deduplicated() {
        let cfg = Config::parse(
            r#"
[encap]
source = "10.0.0.1"
source6 = "fd00::1"
[[pools]]
name = "p"
backends = [{ address = "10.1.0.1" }]
[[vips]]
name = "a"
address = "192.0.2.80"
port = 80
protocol = "tcp"
pool = "p"
[[vips]]
name = "b"
address = "192.0.2.80"
port = 443
protocol = "tcp"
pool = "p"
[[vips]]
name = "c"
address = "2001:db8::80"
protocol = "udp"
pool = "p"
"#,
            "t",
        )
        .unwrap();
        let v4 = routes(&cfg, false, &|_| true);
        assert_eq!(v4.matches("route").count(), 1);
        assert!(v4.contains("route 192.0.2.80/32 blackhole;"));
        assert!(routes(&cfg, true, &|_| true).contains("route 2001:db8::80/128 blackhole;"));
        // A VIP with no healthy backend is not announced; an address stays
        // announced while any VIP on it serves.
        assert!(!routes(&cfg, true, &|i| i != 2).contains("2001:db8::80"));
        assert!(routes(&cfg, false, &|i| i == 1).contains("192.0.2.80"));
        assert!(!routes(&cfg, false, &|i| i == 2).contains("192.0.2.80"));
    }
}
