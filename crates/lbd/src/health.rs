//! Health checks (paper section 3.2's health checker): TCP connect or HTTP
//! GET, with interval, timeout, rise and fall. Checks are deduplicated by
//! backend address and check: a backend in several pools, or several VIPs
//! over one pool, is probed once.
//!
//! The rule, so that checks do not lie under load: `fall` counts
//! consecutive failures of checks that were really carried out on time. A
//! check whose own timer fired late (the prober was starved of CPU, say by
//! packet threads saturating a 2-core machine) proves nothing about the
//! backend: it is [`Outcome::Inconclusive`], counted apart, and neither
//! extends nor breaks a streak. A backend whose server answers, however
//! slowly, within the timeout stays up; one that refuses, answers wrongly,
//! or stays silent past a timeout the prober kept, goes down after `fall`
//! such checks in a row.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use lb::config::{CheckKind, CheckPath, Config, HealthConf};

use crate::tunnel::Routes;

/// One distinct check: an address and how to probe it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CheckKey {
    /// The backend's address.
    pub addr: IpAddr,
    /// The check.
    pub conf: HealthConf,
    /// For a check through the tunnel: the VIP it connects to (inside GRE
    /// to `addr`).
    pub vip: Option<IpAddr>,
}

impl CheckKey {
    /// Where the check connects: the backend's address, or the VIP.
    pub fn target(&self) -> SocketAddr {
        SocketAddr::new(self.vip.unwrap_or(self.addr), self.conf.port)
    }
}

impl std::fmt::Display for CheckKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(vip) = self.vip {
            write!(f, "via GRE to {}: ", self.addr)?;
            return match self.conf.kind {
                CheckKind::Tcp | CheckKind::Fastpath => {
                    write!(f, "tcp {}", SocketAddr::new(vip, self.conf.port))
                }
                CheckKind::Http => write!(
                    f,
                    "http {}{}",
                    SocketAddr::new(vip, self.conf.port),
                    self.conf.path
                ),
            };
        }
        match self.conf.kind {
            CheckKind::Tcp => write!(f, "tcp {}", SocketAddr::new(self.addr, self.conf.port)),
            CheckKind::Fastpath => write!(
                f,
                "fastpath liveness udp {}",
                SocketAddr::new(self.addr, self.conf.port)
            ),
            CheckKind::Http => write!(
                f,
                "http {}{}",
                SocketAddr::new(self.addr, self.conf.port),
                self.conf.path
            ),
        }
    }
}

/// Every distinct check in a configuration, with the backend names it
/// decides for.
pub fn checks(cfg: &Config) -> HashMap<CheckKey, Vec<String>> {
    let mut out: HashMap<CheckKey, Vec<String>> = HashMap::new();
    let tunnel_vips = cfg.tunnel_vips();
    for p in &cfg.pools {
        let Some(h) = &p.health else { continue };
        let vip = match h.via {
            CheckPath::Direct => None,
            // Validation guarantees one.
            CheckPath::Tunnel => tunnel_vips.get(p.name.as_str()).copied(),
        };
        for b in &p.backends {
            let name = b.display_name();
            let names = out
                .entry(CheckKey {
                    addr: b.address,
                    conf: h.clone(),
                    vip,
                })
                .or_default();
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    out
}

/// What an operator should know about `cfg`'s health checks: every pool
/// whose checks go straight to the backends' own addresses (`via =
/// "direct"`, the default) while a VIP with an address could carry them
/// through GRE. Client traffic reaches a backend only through its decap
/// agent; a direct check does not, so a backend whose agent is dead stays
/// up while every new connection to it fails. One line per pool.
pub fn warnings(cfg: &Config) -> Vec<String> {
    let tunnel_vips = cfg.tunnel_vips();
    cfg.pools
        .iter()
        .filter(|p| {
            p.health
                .as_ref()
                .is_some_and(|h| h.via == CheckPath::Direct)
                && tunnel_vips.contains_key(p.name.as_str())
        })
        .map(|p| {
            format!(
                "pool {:?}: health checks go straight to the backends' addresses, not through \
                 GRE and the decap agent as client traffic does: a backend whose agent is dead \
                 stays up while its new connections fail; set via = \"tunnel\" in its health \
                 (pools[{}].health.via; needs root)",
                p.name,
                cfg.pools
                    .iter()
                    .position(|q| std::ptr::eq(q, p))
                    .unwrap_or_default()
            )
        })
        .collect()
}

/// What one check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The backend answered as expected within the timeout.
    Up,
    /// It refused, answered wrongly, or stayed silent past the timeout.
    Down,
    /// The prober's own timer fired late (more than half the timeout past
    /// due): the check says nothing about the backend.
    Inconclusive,
}

/// One check, judged by [`Outcome`]'s rule. Tunnel checks need the
/// tunnel's routes; without them they fail.
pub async fn check(key: &CheckKey, tunnel: Option<&Routes>) -> Outcome {
    let started = std::time::Instant::now();
    let timeout = Duration::from_millis(key.conf.timeout_ms);
    match probe(key, tunnel).await {
        true => Outcome::Up,
        false if started.elapsed() > timeout + timeout / 2 => Outcome::Inconclusive,
        false => Outcome::Down,
    }
}

/// One probe; true if the backend answered as expected within the timeout.
pub async fn probe(key: &CheckKey, tunnel: Option<&Routes>) -> bool {
    let c = &key.conf;
    // Only a `[fleet]` peer answers it (validation keeps it off pools);
    // the peers' task probes it with its own address (tasks::peers).
    if c.kind == CheckKind::Fastpath {
        return false;
    }
    let fut = async {
        // Held until the check is over: the tunnel's route for its port.
        let mut _route = None;
        let mut s = match (key.vip, tunnel) {
            (None, _) => TcpStream::connect(key.target()).await.ok()?,
            (Some(_), Some(routes)) => {
                let (s, guard) = crate::tunnel::connect(routes, key.addr, key.target())
                    .await
                    .ok()?;
                _route = Some(guard);
                s
            }
            (Some(_), None) => return None,
        };
        if c.kind == CheckKind::Tcp {
            return Some(true);
        }
        let host = match key.vip.unwrap_or(key.addr) {
            IpAddr::V4(a) => a.to_string(),
            IpAddr::V6(a) => format!("[{a}]"),
        };
        let req = format!("GET {} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: fastpath-health\r\nConnection: close\r\n\r\n", c.path);
        s.write_all(req.as_bytes()).await.ok()?;
        // The status line ("HTTP/1.x NNN") decides; the rest of the answer is
        // read too (up to 64 KiB) so the server is not cut off mid-reply.
        let mut head = Vec::with_capacity(64);
        let mut chunk = [0u8; 4096];
        let mut total = 0usize;
        loop {
            let r = s.read(&mut chunk).await.ok()?;
            if r == 0 {
                break;
            }
            let take = (64 - head.len()).min(r);
            head.extend_from_slice(&chunk[..take]);
            total += r;
            if total > 65_536 {
                break;
            }
        }
        let line = std::str::from_utf8(&head).ok()?;
        let code: u16 = line.get(9..12)?.parse().ok()?;
        Some(line.starts_with("HTTP/1.") && code == c.expect_status)
    };
    tokio::time::timeout(Duration::from_millis(c.timeout_ms), fut)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Rise/fall hysteresis for one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tracker {
    /// Current verdict.
    pub healthy: bool,
    streak: u32,
}

impl Default for Tracker {
    /// Starts healthy, so a new backend takes traffic at once; `fall`
    /// failures take it out.
    fn default() -> Self {
        Tracker {
            healthy: true,
            streak: 0,
        }
    }
}

impl Tracker {
    /// Records a check's [`Outcome`]; returns the new verdict if it changed.
    /// An inconclusive check changes nothing.
    pub fn record_outcome(&mut self, o: Outcome, rise: u32, fall: u32) -> Option<bool> {
        match o {
            Outcome::Up => self.record(true, rise, fall),
            Outcome::Down => self.record(false, rise, fall),
            Outcome::Inconclusive => None,
        }
    }

    /// Records a probe; returns the new verdict if it changed.
    pub fn record(&mut self, ok: bool, rise: u32, fall: u32) -> Option<bool> {
        if ok == self.healthy {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        if self.streak >= if ok { rise } else { fall } {
            self.healthy = ok;
            self.streak = 0;
            return Some(ok);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rise_and_fall() {
        let mut t = Tracker::default();
        assert_eq!(t.record(false, 2, 3), None);
        assert_eq!(
            t.record(true, 2, 3),
            None,
            "a success resets the failure streak"
        );
        assert_eq!(t.record(false, 2, 3), None);
        assert_eq!(t.record(false, 2, 3), None);
        assert_eq!(t.record(false, 2, 3), Some(false));
        assert_eq!(t.record(true, 2, 3), None);
        assert_eq!(t.record(true, 2, 3), Some(true));
    }

    #[test]
    fn checks_are_deduplicated_by_address_and_check() {
        let cfg = Config::parse(
            r#"
[encap]
source = "10.0.0.1"
[[pools]]
name = "a"
backends = [{ address = "10.1.0.1" }, { address = "10.1.0.2" }]
health = { kind = "http", port = 80 }
[[pools]]
name = "b"
backends = [{ address = "10.1.0.1" }]
health = { kind = "http", port = 80 }
[[pools]]
name = "c"
backends = [{ address = "10.1.0.1", name = "same-host-other-check" }]
health = { kind = "tcp", port = 443 }
"#,
            "t",
        )
        .unwrap();
        let c = checks(&cfg);
        assert_eq!(
            c.len(),
            3,
            "10.1.0.1:80 http is probed once for pools a and b"
        );
        let http1 = c
            .keys()
            .find(|k| k.addr.to_string() == "10.1.0.1" && k.conf.kind == CheckKind::Http)
            .unwrap();
        assert_eq!(c[http1], vec!["10.1.0.1".to_string()]);
    }

    #[test]
    fn direct_checks_of_backends_behind_decap_agents_are_warned_about() {
        let cfg = |web: &str, dns: &str| {
            Config::parse(
                &format!(
                    "[encap]\nsource = \"10.0.0.1\"\n\
                     [[pools]]\nname = \"web\"\nbackends = [{{ address = \"10.1.0.1\" }}]\n{web}\n\
                     [[pools]]\nname = \"dns\"\nbackends = [{{ address = \"10.1.0.2\" }}]\n{dns}\n\
                     [[pools]]\nname = \"unused\"\nbackends = [{{ address = \"10.1.0.3\" }}]\n\
                     health = {{ kind = \"tcp\", port = 80 }}\n\
                     [[vips]]\nname = \"http\"\naddress = \"198.18.0.80\"\nport = 80\nprotocol = \"tcp\"\npool = \"web\"\n\
                     [[vips]]\nname = \"dns\"\naddress = \"198.18.0.53\"\nprotocol = \"udp\"\npool = \"dns\"\n"
                ),
                "t.toml",
            )
            .unwrap()
        };
        // The default (direct) and an explicit direct check: a warning per
        // pool that serves a VIP, naming the pool and the key.
        let w = warnings(&cfg(
            "health = { kind = \"http\", port = 80 }",
            "health = { kind = \"tcp\", port = 53, via = \"direct\" }",
        ));
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains("\"web\"") && w[0].contains("pools[0].health.via"),
            "{w:?}"
        );
        assert!(
            w[1].contains("\"dns\"") && w[1].contains("via = \"tunnel\""),
            "{w:?}"
        );
        // Through the tunnel, or no checks: nothing to say.
        let w = warnings(&cfg(
            "health = { kind = \"http\", port = 80, via = \"tunnel\" }",
            "",
        ));
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn inconclusive_checks_neither_extend_nor_break_a_streak() {
        let mut t = Tracker::default();
        assert_eq!(t.record_outcome(Outcome::Down, 2, 2), None);
        for _ in 0..10 {
            assert_eq!(t.record_outcome(Outcome::Inconclusive, 2, 2), None);
        }
        assert_eq!(t.record_outcome(Outcome::Down, 2, 2), Some(false));
        assert_eq!(t.record_outcome(Outcome::Up, 2, 2), None);
        assert_eq!(t.record_outcome(Outcome::Inconclusive, 2, 2), None);
        assert_eq!(t.record_outcome(Outcome::Up, 2, 2), Some(true));
    }

    /// A server that accepts but never answers: with the prober running on
    /// time, that is a failure; with the prober starved (its thread blocked
    /// past the timeout, as packet threads can do on 2 cores), the same
    /// silence is inconclusive, not a dead backend.
    #[tokio::test(flavor = "current_thread")]
    async fn a_starved_prober_does_not_declare_a_backend_dead() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut keep = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                keep.push(s); // never answers
            }
        });
        let key = CheckKey {
            vip: None,
            addr: "127.0.0.1".parse().unwrap(),
            conf: HealthConf {
                via: CheckPath::Direct,
                kind: CheckKind::Http,
                port,
                path: "/".into(),
                expect_status: 200,
                interval_ms: 100,
                timeout_ms: 100,
                rise: 1,
                fall: 1,
            },
        };
        // On time, silence is a failure (retried: a loaded test machine may
        // itself make a check late, which is exactly what is not counted).
        let mut on_time = Vec::new();
        for _ in 0..5 {
            on_time.push(check(&key, None).await);
            if on_time.last() == Some(&Outcome::Down) {
                break;
            }
        }
        assert_eq!(on_time.last(), Some(&Outcome::Down), "{on_time:?}");
        // Starve the runtime's only thread while the check waits.
        let hog = tokio::spawn(async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            std::thread::sleep(Duration::from_millis(400));
        });
        assert_eq!(check(&key, None).await, Outcome::Inconclusive);
        hog.await.unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn probes_a_real_server() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            for status in ["200 OK", "503 Service Unavailable"] {
                let (mut s, _) = l.accept().await.unwrap();
                let mut b = [0u8; 256];
                let _ = s.read(&mut b).await;
                let _ = s
                    .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let conf = |kind| HealthConf {
            via: CheckPath::Direct,
            kind,
            port,
            path: "/".into(),
            expect_status: 200,
            interval_ms: 100,
            timeout_ms: 500,
            rise: 1,
            fall: 1,
        };
        let key = CheckKey {
            vip: None,
            addr: "127.0.0.1".parse().unwrap(),
            conf: conf(CheckKind::Http),
        };
        assert!(probe(&key, None).await, "200 is healthy");
        assert!(!probe(&key, None).await, "503 is not");
        let closed = CheckKey {
            vip: None,
            addr: "127.0.0.1".parse().unwrap(),
            conf: HealthConf {
                port: 1,
                ..conf(CheckKind::Tcp)
            },
        };
        assert!(!probe(&closed, None).await, "a refused connection is not");
    }
}
