//! The daemon's open files, shared out so that the HTTP API cannot starve
//! the work that keeps backends up and packets moving.
//!
//! Every API connection, health check, `birdc` call and configuration read
//! takes a descriptor from one `RLIMIT_NOFILE`. A flood of idle API
//! connections that takes them all makes every health check fail (each
//! needs a socket), and every backend is then marked down by a daemon whose
//! backends are fine. So at start the soft limit is raised to the hard one
//! ([`raise_nofile`]), and the descriptors the daemon needs besides the API
//! are set aside ([`Budget`]): those already open when the API starts (the
//! datapath's sockets and maps, the tunnel, the runtime), one per health
//! check and per `[fleet]` peer at a time (each check has at most one probe
//! in flight), and a margin for `birdc`, the configuration file, the
//! tracer's socket and netlink. The API may hold what is left, at most
//! [`MAX_API_CONNECTIONS`]; above that it closes new connections at once
//! ([`Connections`]). A reload that changes the checks sets
//! the API's share again.

use std::io;
use std::sync::Mutex;

use lb::Config;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

use crate::access::Connections;

/// The most API connections open at once, however many descriptors there
/// are: more than the operators, scrapers and fleet checks of a load
/// balancer need, few enough that their buffers stay small.
pub const MAX_API_CONNECTIONS: usize = 512;
/// The fewest the API is given, even where the budget leaves less (then
/// logged): an API that refuses everything cannot even say why.
pub const MIN_API_CONNECTIONS: usize = 4;
/// Descriptors kept for what opens files now and then: a `birdc` call
/// (pipes for its output), the configuration file and its write-back
/// (read, temporary file, directory), the routes file for BIRD, netlink
/// queries for the next hop, the packet-tracer's socket, a tunnel made
/// again by a reload, and log files.
pub const MARGIN: usize = 64;

/// Why the open-files limit could not be raised (the daemon runs on with
/// the limit it has).
#[derive(Debug, thiserror::Error)]
#[error("raising the open-files limit (RLIMIT_NOFILE) from {soft} to {hard}: {source}")]
pub struct RaiseError {
    /// The soft limit it stays at.
    pub soft: u64,
    /// The hard limit asked for.
    pub hard: u64,
    /// The system's answer.
    #[source]
    pub source: io::Error,
}

/// The open-files limit before and after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    /// The soft limit the process started with (`None`: unlimited).
    pub before: Option<u64>,
    /// The soft limit now.
    pub now: Option<u64>,
    /// The hard limit.
    pub hard: Option<u64>,
}

impl Nofile {
    /// The soft limit now, as a number (unlimited: `u64::MAX`).
    pub fn limit(&self) -> u64 {
        self.now.unwrap_or(u64::MAX)
    }
}

/// The open-files limit as it is.
pub fn nofile() -> Nofile {
    let l = getrlimit(Resource::Nofile);
    Nofile {
        before: l.current,
        now: l.current,
        hard: l.maximum,
    }
}

/// Raises the soft open-files limit to the hard one (what a process may do
/// without privileges), so that the common soft default of 1,024 does not
/// bound a daemon that probes hundreds of backends.
pub fn raise_nofile() -> Result<Nofile, RaiseError> {
    let mut n = nofile();
    if n.before == n.hard {
        return Ok(n);
    }
    let (soft, hard) = (n.limit(), n.hard.unwrap_or(u64::MAX));
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: n.hard,
            maximum: n.hard,
        },
    )
    .map_err(|e| RaiseError {
        soft,
        hard,
        source: e.into(),
    })?;
    n.now = getrlimit(Resource::Nofile).current;
    Ok(n)
}

/// Descriptors this process has open now (`/proc/self/fd`), if readable.
pub fn open_descriptors() -> Option<usize> {
    // The directory's own descriptor is one of them while it is read.
    std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count().saturating_sub(1))
}

/// What the daemon needs besides the API, in descriptors, for `cfg`: one
/// per distinct health check and `[fleet]` peer (each has one probe in
/// flight at most) and [`MARGIN`].
pub fn needed_besides_api(cfg: &Config) -> usize {
    let checks = crate::health::checks(cfg).len();
    let peers = cfg.fleet.as_ref().map_or(0, |f| f.peers.len());
    checks + peers + MARGIN
}

/// How the open files are shared out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The soft open-files limit.
    pub limit: u64,
    /// Descriptors open when the API started (datapath, tunnel, runtime).
    pub at_start: usize,
    /// Set aside for health checks, peers, BIRD and the margin.
    pub reserved: usize,
}

impl Budget {
    /// The API's share: what the limit leaves after what was open at start
    /// and what is reserved, at most [`MAX_API_CONNECTIONS`], at least
    /// [`MIN_API_CONNECTIONS`].
    pub fn api_connections(&self) -> usize {
        let left = self
            .limit
            .saturating_sub(self.at_start as u64)
            .saturating_sub(self.reserved as u64);
        usize::try_from(left)
            .unwrap_or(usize::MAX)
            .clamp(MIN_API_CONNECTIONS, MAX_API_CONNECTIONS)
    }

    /// Whether the limit leaves the API fewer than [`MIN_API_CONNECTIONS`]
    /// after the reservation (then the limit is too low for this
    /// configuration: raise the hard limit, `LimitNOFILE=` in a unit).
    pub fn tight(&self) -> bool {
        self.limit
            .saturating_sub(self.at_start as u64 + self.reserved as u64)
            < MIN_API_CONNECTIONS as u64
    }
}

/// Sets the API's share of open files (`conns`' cap, and `budget`'s
/// reservation) for `cfg`'s health checks and peers. `at_start`, the
/// descriptors open when the API starts, is measured once at start; a
/// reload keeps it (`None`).
pub(crate) fn share_open_files(
    budget: &Mutex<Budget>,
    conns: &Connections,
    cfg: &Config,
    at_start: Option<usize>,
) {
    let mut b = budget.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = at_start {
        b.at_start = n;
    }
    b.reserved = needed_besides_api(cfg);
    let cap = b.api_connections();
    if cap != conns.cap() || at_start.is_some() {
        tracing::info!(
            limit = b.limit,
            open_at_start = b.at_start,
            reserved = b.reserved,
            "HTTP API: at most {cap} connections at once (the rest of the open files \
             is kept for the datapath, health checks, peers and BIRD)"
        );
    }
    if b.tight() {
        tracing::warn!(
            limit = b.limit,
            open_at_start = b.at_start,
            reserved = b.reserved,
            "the open-files limit barely covers this configuration's health checks; \
             raise the hard limit (LimitNOFILE= in a service unit, or ulimit -Hn)"
        );
    }
    conns.set_cap(cap);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_gets_what_is_left_within_bounds() {
        let b = |limit, at_start, reserved| Budget {
            limit,
            at_start,
            reserved,
        };
        // The common soft limit: the API's share is what remains.
        assert_eq!(b(1024, 40, 70).api_connections(), MAX_API_CONNECTIONS);
        assert_eq!(b(600, 40, 70).api_connections(), 490);
        // Nothing left: the least, and the budget says it is tight.
        assert_eq!(b(100, 40, 70).api_connections(), MIN_API_CONNECTIONS);
        assert!(b(100, 40, 70).tight());
        assert!(!b(1024, 40, 70).tight());
        // A huge limit does not give the API more than its bound.
        assert_eq!(b(u64::MAX, 40, 70).api_connections(), MAX_API_CONNECTIONS);
    }

    #[test]
    fn checks_and_peers_are_reserved() {
        let cfg = Config::parse(
            "[encap]\nsource = \"10.0.0.1\"\n\
             [fleet]\npeers = [\"10.0.0.1\", \"10.0.0.2\"]\n\
             [[pools]]\nname = \"web\"\nbackends = [{ address = \"10.1.0.1\" }, { address = \"10.1.0.2\" }, { address = \"10.1.0.3\" }]\n\
             health = { kind = \"tcp\", port = 80 }\n\
             [[vips]]\nname = \"v\"\naddress = \"198.18.0.1\"\nport = 80\nprotocol = \"tcp\"\npool = \"web\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(needed_besides_api(&cfg), 3 + 2 + MARGIN);
    }

    #[test]
    fn descriptors_are_counted_and_the_limit_is_raised_to_the_hard_one() {
        // Other tests open and close files meanwhile: 64 of ours stand out.
        let before = open_descriptors().unwrap();
        let files: Vec<_> = (0..64)
            .map(|_| std::fs::File::open("/proc/self/status").unwrap())
            .collect();
        assert!(open_descriptors().unwrap() >= before + 32);
        drop(files);
        let n = raise_nofile().unwrap();
        assert_eq!(n.now, n.hard);
        assert_eq!(nofile().now, n.hard);
    }
}
