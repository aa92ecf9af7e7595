//! The load balancer's configuration, in TOML.
//!
//! ```toml
//! [forwarder]
//! driver = "auto"          # on an interface: "auto" (AF_XDP, else AF_PACKET), "af-xdp",
//!                          # "xdp" (IPv4 TCP/UDP in the driver, the rest AF_XDP), "af-packet"
//! threads = 2              # packet threads (0: process in the I/O thread)
//! batch = 32               # packets per batch
//! batch_timeout_us = 50    # a partial batch is handed over after this long
//! queue_size = 1024        # per-thread receive and transmit queues
//! pool_buffers = 8192      # packet pool size (2 KiB buffers)
//!
//! [conntrack]
//! size = 65536             # entries per packet thread
//! tcp_timeout_s = 300
//! udp_timeout_s = 30
//!
//! [encap]
//! source = "10.0.0.1"      # outer source address for IPv4 backends
//! source6 = "fd00::1"      # outer source address for IPv6 backends
//! mac = "02:00:00:00:00:01"  # default: the interface's own MAC
//! # gateway_mac = "02:00:00:00:00:fe"  # the next hop's MAC; see below
//! ttl = 64
//! # source_prefix = "198.18.100.0/24"  # per-flow outer sources (RSS on the backends)
//! # source_prefix6 = "fd00:100::/64"
//!
//! [[pools]]
//! name = "web"
//! table_size = 65537
//! backends = [{ address = "10.1.0.1" }, { address = "10.1.0.2", weight = 2 }]
//! include = ["web-extra"]  # pools may contain pools
//! drained = ["10.1.0.2"]   # takes no new connections, keeps its weight
//!                          # (`fastpath lb drain|undrain BACKEND` edit this)
//!
//! [[vips]]
//! name = "http"
//! address = "192.0.2.80"
//! port = 80                # omit for an any-port VIP
//! protocol = "tcp"
//! pool = "web"
//!
//! [[prefix_groups]]        # paper section 4.2
//! name = "class-a"
//! prefixes = ["74.125.0.0/16", "173.194.0.0/16"]
//! cluster_prefix_len = 24  # a cluster's prefix length in this class
//!
//! [[vips]]
//! name = "svc1"
//! prefix_group = "class-a"
//! suffix = "0.0.0.1"       # host part under the cluster prefix
//! port = 443
//! protocol = "tcp"
//! pool = "web"
//! ```
//!
//! [`Config::load`] rejects a file whole if anything is wrong, naming the
//! file, the key and what was expected.
//!
//! `[encap] gateway_mac` is the MAC of the next hop every encapsulated frame
//! is sent to: the router towards the backends (or the backend itself when
//! it is on the interface's own subnet). Leave it out: the daemon
//! (`fastpath lb run --interface`) finds it from the kernel, as the kernel's
//! own packets would (the route to the first backend, then the neighbour
//! table, resolving the address if needed), checks it again every few
//! seconds and swaps in a change like a reload; `fastpath lb status` shows
//! what it found or why it could not. Set it only to override that. Pcap
//! replay has no interface and no kernel route: there the frames carry the
//! configured value, else [`PLACEHOLDER_GATEWAY_MAC`].

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use crate::config_chunks::{ChunkStats, ParseCache};

/// A problem found by one of [`Config::validate`]'s checks: the key and
/// what is wrong; `validate` adds the file.
struct Problem {
    key: String,
    problem: String,
}

fn problem<T>(key: String, problem: String) -> Result<T, Problem> {
    Err(Problem { key, problem })
}

/// Pools that include each other in a cycle, written `a -> b -> a`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pools include each other in a cycle: {0}")]
pub struct IncludeCycle(pub String);

/// A configuration error: the file, the key and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {key}: {problem}")]
pub struct ConfigError {
    /// The file (or "<string>").
    pub file: String,
    /// The key, as a TOML path (`vips[1].pool`).
    pub key: String,
    /// What is wrong and what was expected.
    pub problem: String,
}

/// Packet I/O driver for `lb run --interface`: `[forwarder] driver` in
/// the file, `--driver` on the command line (which overrides it). The
/// names are the same in both places: `auto`, `af-xdp`, `xdp` (the
/// forwarder's XDP part is [`crate::xdp`]), `af-packet`. The variants'
/// comments are also the command line's help for each value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Driver {
    /// AF_XDP if it can be had (our XDP program, native or generic), else
    /// AF_PACKET; says which and why.
    #[default]
    Auto,
    /// AF_XDP only: our XDP program steers VIP frames into the pool's
    /// buffers, the rest goes on to the kernel.
    AfXdp,
    /// The load balancer in the driver: IPv4 TCP and UDP to exactly
    /// matched IPv4 VIPs forwarded by an XDP program (XDP_TX, no copy, no
    /// socket), everything else (fragments, ICMP, IPv6, probes) through
    /// AF_XDP to the packet threads. Same backends, same bytes.
    Xdp,
    /// AF_PACKET only, with a TPACKET_V3 receive ring.
    AfPacket,
}

/// `[forwarder]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Forwarder {
    /// Packet I/O driver on an interface: "auto", "af-xdp", "xdp" or
    /// "af-packet".
    pub driver: Driver,
    /// Packet threads; 0 processes packets in the I/O thread.
    pub threads: usize,
    /// Packets per batch.
    pub batch: usize,
    /// Microseconds after which a partial batch is handed over.
    pub batch_timeout_us: u64,
    /// Per-thread queue size (a power of two).
    pub queue_size: usize,
    /// Packet pool buffers.
    pub pool_buffers: u32,
    /// Fragment table entries per packet thread.
    pub frag_table_size: usize,
    /// Milliseconds a fragment waits for its datagram's first fragment.
    pub frag_timeout_ms: u64,
}

impl Default for Forwarder {
    fn default() -> Self {
        Forwarder {
            driver: Driver::Auto,
            threads: 2,
            batch: 32,
            batch_timeout_us: 50,
            queue_size: 1024,
            pool_buffers: 8192,
            frag_table_size: 1024,
            frag_timeout_ms: 1000,
        }
    }
}

/// `[conntrack]`.
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

/// `[encap]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Encap {
    /// Outer source for IPv4 backends.
    pub source: Option<IpAddr>,
    /// Outer source for IPv6 backends.
    pub source6: Option<IpAddr>,
    /// Our MAC (default: the interface's own, or 02:00:00:00:00:01 for
    /// pcap files).
    pub mac: Option<String>,
    /// The next hop's MAC, overriding what the daemon resolves from the
    /// kernel (none: resolved; pcap replay uses [`PLACEHOLDER_GATEWAY_MAC`]).
    pub gateway_mac: Option<String>,
    /// Outer TTL / hop limit.
    pub ttl: u8,
    /// A prefix (IPv4 CIDR, /16 to /32) each flow's outer source address
    /// toward IPv4 backends is taken from, by its flow hash, so that the
    /// backends' NICs spread flows over their queues; GRE then carries the
    /// flow hash in its key. None: every frame leaves from `source`. A
    /// reload applies a change (flows then leave from new sources).
    pub source_prefix: Option<String>,
    /// The same for IPv6 backends (an IPv6 CIDR, /64 to /128).
    pub source_prefix6: Option<String>,
}

impl Default for Encap {
    fn default() -> Self {
        Encap {
            source: None,
            source6: None,
            mac: None,
            gateway_mac: None,
            ttl: 64,
            source_prefix: None,
            source_prefix6: None,
        }
    }
}

impl Encap {
    /// Per-flow entropy from `source_prefix` and `source_prefix6`, if
    /// either is set (validation has checked them; an invalid one counts
    /// as unset here).
    pub fn spread(&self) -> Option<packet::gre::Spread> {
        let parse = |s: &Option<String>| {
            let (a, l) = parse_prefix(s.as_deref()?)?;
            packet::gre::SourcePrefix::new(a, l).ok()
        };
        let s = packet::gre::Spread {
            v4: parse(&self.source_prefix).filter(|p| p.is_v4()),
            v6: parse(&self.source_prefix6).filter(|p| !p.is_v4()),
        };
        (s.v4.is_some() || s.v6.is_some()).then_some(s)
    }
}

/// The destination MAC of encapsulated frames when `[encap] gateway_mac`
/// is not set and no next hop was resolved: pcap replay (no interface), or
/// a daemon that could not resolve its gateway (it says so at start and in
/// `/status`; such frames are lost).
pub const PLACEHOLDER_GATEWAY_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];

/// `[api]`: the HTTP control API.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Api {
    /// Where to serve `/metrics`, `/status` and `POST /reload` (off when
    /// absent). Keep it on a loopback or management address; any other
    /// address needs `token_file`.
    pub listen: Option<std::net::SocketAddr>,
    /// A file whose first line is a bearer token (at least 16 characters):
    /// requests that change the load balancer (`POST /reload`) must carry
    /// `Authorization: Bearer <token>`. Required when `listen` is not a
    /// loopback address.
    pub token_file: Option<std::path::PathBuf>,
}

/// `[bgp]`: announcing VIPs through BIRD. fastpath writes the VIPs as
/// static routes into `vips_file`, which the BIRD configuration includes in
/// a static protocol named `protocol` (configured `disabled`); fastpath
/// enables that protocol while the forwarder is healthy and disables it
/// (withdrawing every VIP) when the forwarder stops or stalls.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Bgp {
    /// The file of static routes fastpath writes for BIRD to include.
    pub vips_file: std::path::PathBuf,
    /// BIRD's static protocol holding the VIP routes.
    #[serde(default = "default_bird_protocol")]
    pub protocol: String,
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
fn default_birdc() -> Vec<String> {
    vec!["birdc".into()]
}
/// The longest `[bgp] drain_ms`: one minute.
pub const MAX_DRAIN_MS: u64 = 60_000;

/// The shortest `[bgp] poll_ms`: three polls without a heartbeat withdraw
/// the VIPs, and an idle forwarder beats about every 20 ms.
pub const MIN_BGP_POLL_MS: u64 = 50;

fn default_bgp_poll() -> u64 {
    500
}

/// `[tracer]`: packet-tracer probes (Maglev section 4.4, [`crate::trace`]).
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

/// `[fleet]`: the load balancers that share the VIPs behind one router (the
/// Maglev pool of the paper's section 4.3), this one included. A fragment
/// of a datagram for a VIP is handled by one of them, chosen by the hash of
/// its 3-tuple (source, destination, protocol) over this list, the same on
/// every load balancer whatever the list's order; the others send it there
/// in GRE marked with [`packet::gre::FRAGMENT_REDIRECT_KEY`], and a marked
/// fragment is never sent on again. Changes apply on reload.
///
/// ```toml
/// [fleet]
/// peers = ["10.10.2.2", "10.10.2.3", "10.10.2.4"]  # this one is [encap] source
/// name = "lb1"                                      # default: the host name
/// health = { kind = "tcp", port = 179 }             # the default: BIRD's BGP port
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConf {
    /// Every load balancer's address, this one's included: `[encap]
    /// source` for IPv4 peers, `source6` for IPv6 ones (one family).
    pub peers: Vec<IpAddr>,
    /// This machine's name in reports (default: the host name).
    pub name: Option<String>,
    /// How the other peers' liveness is checked, from the daemon, at their
    /// addresses (`via` must be `"direct"`). Fragments whose peer is down
    /// are dropped, counted as `fragment_peer_down`. Default: a TCP connect
    /// to port 179, where each load balancer's BIRD listens for BGP.
    #[serde(default = "default_peer_health")]
    pub health: HealthConf,
}

fn default_peer_health() -> HealthConf {
    HealthConf {
        kind: CheckKind::Tcp,
        port: 179,
        path: slash(),
        expect_status: ok200(),
        interval_ms: interval(),
        timeout_ms: timeout(),
        rise: two(),
        fall: two(),
        via: CheckPath::Direct,
    }
}

impl FleetConf {
    /// This load balancer's own address in [`FleetConf::peers`]: `[encap]
    /// source` for IPv4 peers, `source6` for IPv6 ones.
    pub fn own(&self, encap: &Encap) -> Option<IpAddr> {
        if self.peers.first().is_some_and(IpAddr::is_ipv6) {
            encap.source6
        } else {
            encap.source
        }
    }
}

/// How a pool's backends are health-checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckKind {
    /// A TCP connection to the port succeeds.
    Tcp,
    /// An HTTP GET of `path` answers `expect_status`.
    Http,
}

/// A pool's health check (`health = { ... }` in `[[pools]]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConf {
    /// TCP connect or HTTP GET.
    pub kind: CheckKind,
    /// Port on the backend's address.
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

fn slash() -> String {
    "/".into()
}
fn ok200() -> u16 {
    200
}
fn interval() -> u64 {
    1000
}
fn timeout() -> u64 {
    500
}
fn two() -> u32 {
    2
}

/// One backend of a pool.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConf {
    /// Its address (the outer destination of encapsulated packets).
    pub address: IpAddr,
    /// Unique name; defaults to the address. Seeds its Maglev permutation.
    pub name: Option<String>,
    /// Relative weight; 0 drains it (or list it in its pool's `drained`,
    /// which keeps the weight to restore).
    #[serde(default = "one")]
    pub weight: u32,
}

impl BackendConf {
    /// Its name: `name`, else the address.
    pub fn display_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.address.to_string())
    }

    /// Whether `s` names it: its name, or its address (written any way
    /// that parses to it).
    pub fn is_named(&self, s: &str) -> bool {
        self.name.as_deref() == Some(s) || s.parse::<IpAddr>().is_ok_and(|a| a == self.address)
    }
}

fn one() -> u32 {
    1
}

/// `[[pools]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConf {
    /// Unique name.
    pub name: String,
    /// Backends.
    #[serde(default)]
    pub backends: Vec<BackendConf>,
    /// Other pools whose backends belong to this one.
    #[serde(default)]
    pub include: Vec<String>,
    /// Maglev table size for VIPs served by this pool (prime).
    #[serde(default = "default_table_size")]
    pub table_size: u64,
    /// Health check for the pool's own backends (none: always healthy).
    pub health: Option<HealthConf>,
    /// Own backends (by name or address) that take no new connections:
    /// their weight counts as 0 while they keep the one written, restored
    /// when they leave this list (`fastpath lb drain|undrain`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drained: Vec<String>,
}

impl PoolConf {
    /// Whether one of its own backends is drained (by `drained`).
    pub fn is_drained(&self, b: &BackendConf) -> bool {
        self.drained.iter().any(|d| b.is_named(d))
    }
}

fn default_table_size() -> u64 {
    u64::from(maglev::DEFAULT_TABLE_SIZE)
}

/// Transport protocol of a VIP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Protocol {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => packet::proto::TCP,
            Protocol::Udp => packet::proto::UDP,
        }
    }
}

/// `[[vips]]`: an address or a prefix-group suffix, a port (or any), a
/// protocol and a pool.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VipConf {
    /// Unique name.
    pub name: String,
    /// The VIP's address (or use `prefix_group` and `suffix`).
    pub address: Option<IpAddr>,
    /// Prefix group for prefix/suffix matching.
    pub prefix_group: Option<String>,
    /// Host part under the group's cluster prefix.
    pub suffix: Option<IpAddr>,
    /// Port; omitted means any port.
    pub port: Option<u16>,
    /// Protocol.
    pub protocol: Protocol,
    /// Backend pool.
    pub pool: String,
}

/// `[[prefix_groups]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixGroupConf {
    /// Unique name.
    pub name: String,
    /// Prefixes in CIDR form.
    pub prefixes: Vec<String>,
    /// Prefix length of one cluster of this class.
    pub cluster_prefix_len: u8,
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[forwarder]`.
    #[serde(default)]
    pub forwarder: Forwarder,
    /// `[conntrack]`.
    #[serde(default)]
    pub conntrack: Conntrack,
    /// `[encap]`.
    #[serde(default)]
    pub encap: Encap,
    /// `[api]`.
    #[serde(default)]
    pub api: Api,
    /// `[bgp]` (no announcements when absent).
    #[serde(default)]
    pub bgp: Option<Bgp>,
    /// `[[pools]]`.
    #[serde(default)]
    pub pools: Vec<PoolConf>,
    /// `[[vips]]`.
    #[serde(default)]
    pub vips: Vec<VipConf>,
    /// `[[prefix_groups]]`.
    #[serde(default)]
    pub prefix_groups: Vec<PrefixGroupConf>,
    /// `[fleet]`: the load balancers sharing the VIPs, for fragments
    /// (none: fragments are handled here, as by a lone load balancer).
    #[serde(default)]
    pub fleet: Option<FleetConf>,
    /// `[tracer]`: packet-tracer probes (see [`crate::trace`]).
    #[serde(default)]
    pub tracer: TracerConf,
}

/// A backend's name as validation compares it: an address (the default
/// name) or another name.
#[derive(PartialEq, Eq, Hash)]
enum BackendKey<'a> {
    Addr(IpAddr),
    Name(&'a str),
}

impl BackendKey<'_> {
    /// The key of a backend, without formatting the address that names
    /// most backends: a name that is an address written the way it
    /// prints is that address.
    fn of(b: &BackendConf) -> BackendKey<'_> {
        match &b.name {
            None => BackendKey::Addr(b.address),
            Some(n) => match n.parse::<IpAddr>() {
                Ok(a) if a.to_string() == *n => BackendKey::Addr(a),
                _ => BackendKey::Name(n),
            },
        }
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut m {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

/// Parses `addr/len`.
pub fn parse_prefix(s: &str) -> Option<(IpAddr, u8)> {
    let (a, l) = s.split_once('/')?;
    let a: IpAddr = a.trim().parse().ok()?;
    let l: u8 = l.trim().parse().ok()?;
    let max = if a.is_ipv4() { 32 } else { 128 };
    (l <= max).then_some((a, l))
}

impl Config {
    /// Reads and validates a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::parse(&Config::read(path)?, &path.display().to_string())
    }

    /// A configuration file's text, or an error naming the file.
    pub fn read(path: &Path) -> Result<String, ConfigError> {
        std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.display().to_string(),
            key: "(file)".into(),
            problem: format!("cannot read: {e}"),
        })
    }

    /// Parses and validates TOML text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        Config::parse_with(text, file, &mut ParseCache::new())
    }

    /// [`Config::parse`] in pieces through `cache` ([`crate::config_chunks`]):
    /// a reload through the cache of the last load parses only the
    /// `[[pools]]`, `[[vips]]` and `[[prefix_groups]]` elements whose text
    /// changed. Same result and same errors as parsing the whole text.
    pub fn parse_with(
        text: &str,
        file: &str,
        cache: &mut ParseCache,
    ) -> Result<Config, ConfigError> {
        let cfg = match cache.parse(text) {
            Some(cfg) => cfg,
            None => Config::from_toml(text, file)?,
        };
        cfg.validate(file)?;
        Ok(cfg)
    }

    /// [`Config::parse`] without splitting the text: one `toml` parse of
    /// the whole of it on one thread (the reference the pieces are tested
    /// against, and the benchmark's peer).
    pub fn parse_whole(text: &str, file: &str) -> Result<Config, ConfigError> {
        let cfg = Config::from_toml(text, file)?;
        cfg.validate(file)?;
        Ok(cfg)
    }

    /// The whole text through `toml`, errors naming their line.
    pub(crate) fn from_toml(text: &str, file: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let mut problem = e.message().trim_end().to_string();
            let key = e
                .span()
                .map(|s| {
                    // Lines before the span, plus one: `lines().count()` would
                    // miss the line when the span starts in column 0.
                    let start = s.start.min(text.len());
                    let line = text.as_bytes()[..start]
                        .iter()
                        .filter(|&&b| b == b'\n')
                        .count()
                        + 1;
                    // The line itself (or, if long, what the span covers)
                    // names the key where the parser's message does not
                    // (`duplicate key`, a value out of range).
                    let from = text[..start].rfind('\n').map_or(0, |i| i + 1);
                    let to = text[start..].find('\n').map_or(text.len(), |i| start + i);
                    let whole = text[from..to].trim();
                    let spanned = text.get(start..s.end.min(text.len())).unwrap_or("").trim();
                    let shown = if whole.chars().count() <= 80 {
                        whole
                    } else if spanned.chars().count() <= 80 && !spanned.contains('\n') {
                        spanned
                    } else {
                        ""
                    };
                    if !shown.is_empty() && !problem.contains(shown) {
                        problem = format!("{problem} (`{shown}`)");
                    }
                    format!("line {line}")
                })
                .unwrap_or_else(|| "(syntax)".into());
            ConfigError {
                file: file.into(),
                key,
                problem,
            }
        })
    }

    /// Checks everything serde cannot: references, uniqueness, ranges. The
    /// first problem found is reported, in the order of the file's sections.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        self.check_forwarder()
            .and_then(|()| self.check_conntrack())
            .and_then(|()| self.check_encap())
            .and_then(|()| self.check_api())
            .and_then(|()| self.check_tracer())
            .and_then(|()| self.check_pools())
            .and_then(|()| self.check_bgp())
            .and_then(|()| self.check_fleet())
            .and_then(|()| self.check_prefix_groups())
            .and_then(|()| self.check_vips())
            // After the VIPs: tunnel checks need a VIP over their pool, and
            // a VIP naming a missing pool is the error to report first.
            .and_then(|()| self.check_health())
            .map_err(|p| ConfigError {
                file: file.into(),
                key: p.key,
                problem: p.problem,
            })
    }

    /// `[forwarder]`: thread count, batch, queue and pool sizes.
    fn check_forwarder(&self) -> Result<(), Problem> {
        let f = &self.forwarder;
        if f.threads > 64 {
            return problem(
                "forwarder.threads".into(),
                format!("{} is too many; expected 0 to 64", f.threads),
            );
        }
        if f.batch == 0 || f.batch > 1024 {
            return problem(
                "forwarder.batch".into(),
                format!("{} is out of range; expected 1 to 1024", f.batch),
            );
        }
        if !f.queue_size.is_power_of_two() || f.queue_size < f.batch {
            return problem(
                "forwarder.queue_size".into(),
                format!(
                    "{} must be a power of two of at least forwarder.batch ({})",
                    f.queue_size, f.batch
                ),
            );
        }
        let min_buffers = (f.queue_size * (2 * f.threads.max(1) + 2)) as u64;
        if u64::from(f.pool_buffers) < min_buffers {
            return problem(
                "forwarder.pool_buffers".into(),
                format!(
                    "{} cannot fill the queues; expected at least {min_buffers}",
                    f.pool_buffers
                ),
            );
        }
        if f.frag_table_size == 0 {
            return problem(
                "forwarder.frag_table_size".into(),
                "must be at least 1".into(),
            );
        }
        Ok(())
    }

    /// `[conntrack]`: table size and timeouts.
    fn check_conntrack(&self) -> Result<(), Problem> {
        let c = &self.conntrack;
        if !c.size.is_power_of_two() || c.size < 4 {
            return problem(
                "conntrack.size".into(),
                format!("{} must be a power of two of at least 4", c.size),
            );
        }
        for (k, v) in [
            ("conntrack.tcp_timeout_s", c.tcp_timeout_s),
            ("conntrack.udp_timeout_s", c.udp_timeout_s),
        ] {
            if !(v > 0.0 && v < 1e7) {
                return problem(
                    k.into(),
                    format!("{v} must be a positive number of seconds"),
                );
            }
        }
        Ok(())
    }

    /// `[encap]`: addresses, MACs, TTL.
    fn check_encap(&self) -> Result<(), Problem> {
        let e = &self.encap;
        if let Some(m) = e.mac.as_deref().filter(|m| parse_mac(m).is_none()) {
            return problem(
                "encap.mac".into(),
                format!("{m:?} is not a MAC address like 02:00:00:00:00:01"),
            );
        }
        if let Some(m) = e.gateway_mac.as_deref().filter(|m| parse_mac(m).is_none()) {
            return problem(
                "encap.gateway_mac".into(),
                format!("{m:?} is not a MAC address like 02:00:00:00:00:fe (leave it out to have the daemon resolve the next hop)"),
            );
        }
        if e.source.is_some_and(|a| !a.is_ipv4()) {
            return problem(
                "encap.source".into(),
                "must be an IPv4 address (use source6 for IPv6)".into(),
            );
        }
        if e.source6.is_some_and(|a| !a.is_ipv6()) {
            return problem("encap.source6".into(), "must be an IPv6 address".into());
        }
        if e.ttl == 0 {
            return problem("encap.ttl".into(), "must be at least 1".into());
        }
        for (key, value, v4, example) in [
            (
                "encap.source_prefix",
                &e.source_prefix,
                true,
                "198.18.100.0/24",
            ),
            (
                "encap.source_prefix6",
                &e.source_prefix6,
                false,
                "fd00:100::/64",
            ),
        ] {
            let Some(text) = value else { continue };
            let Some((addr, len)) = parse_prefix(text) else {
                return problem(
                    key.into(),
                    format!("{text:?} is not a prefix like \"{example}\""),
                );
            };
            if addr.is_ipv4() != v4 {
                return problem(
                    key.into(),
                    if v4 {
                        format!(
                            "{text:?} must be an IPv4 prefix (source_prefix6 is for IPv6 backends)"
                        )
                    } else {
                        format!(
                            "{text:?} must be an IPv6 prefix (source_prefix is for IPv4 backends)"
                        )
                    },
                );
            }
            if let Err(err) = packet::gre::SourcePrefix::new(addr, len) {
                return problem(key.into(), format!("{text:?}: {err}"));
            }
        }
        Ok(())
    }

    /// `[tracer]`: a rate and burst of at least one report (turn the tracer
    /// off with `enabled = false`), a name that fits in a report.
    fn check_tracer(&self) -> Result<(), Problem> {
        let t = &self.tracer;
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
        for (i, p) in t.report_to.iter().enumerate() {
            if parse_prefix(p).is_none() {
                return problem(
                    format!("tracer.report_to[{i}]"),
                    format!("{p:?} is not a prefix like \"10.1.0.0/24\""),
                );
            }
        }
        Ok(())
    }

    /// `[api]`: anyone who reaches a non-loopback API could reconfigure the
    /// load balancer, so such an address needs a token.
    fn check_api(&self) -> Result<(), Problem> {
        if let Some(addr) = self.api.listen {
            if !addr.ip().is_loopback() && self.api.token_file.is_none() {
                return problem(
                    "api.listen".into(),
                    format!(
                        "{addr} is reachable from other machines: set api.token_file \
                         (a file holding a bearer token) or listen on 127.0.0.1"
                    ),
                );
            }
        }
        Ok(())
    }

    /// `[[pools]]`: unique names, prime table sizes, unique backends, outer sources for their families, known includes without cycles.
    fn check_pools(&self) -> Result<(), Problem> {
        let e = &self.encap;
        // Pools: unique names, valid table sizes, known includes, unique
        // backend names within a pool, outer sources for their families.
        let mut pools = HashMap::new();
        for (i, p) in self.pools.iter().enumerate() {
            if pools.insert(p.name.as_str(), i).is_some() {
                return problem(
                    format!("pools[{i}].name"),
                    format!("{:?} is defined twice", p.name),
                );
            }
            if let Err(err) = maglev::check_table_size(p.table_size) {
                return problem(format!("pools[{i}].table_size"), err.to_string());
            }
            let name_of = BackendConf::display_name;
            let mut names = HashSet::with_capacity(p.backends.len());
            let mut addresses: HashMap<IpAddr, usize> = HashMap::with_capacity(p.backends.len());
            for (j, b) in p.backends.iter().enumerate() {
                if !names.insert(BackendKey::of(b)) {
                    return problem(
                        format!("pools[{i}].backends[{j}]"),
                        format!("backend {:?} appears twice", name_of(b)),
                    );
                }
                // The same machine under two names would get two shares of
                // the table: a silent double weight.
                if let Some(k) = addresses.insert(b.address, j) {
                    let (name, other) = (name_of(b), name_of(&p.backends[k]));
                    return problem(
                        format!("pools[{i}].backends[{j}]"),
                        format!(
                            "backend {name:?} has the address {} of backend {other:?} \
                             (pools[{i}].backends[{k}]); list a machine once and give it a weight",
                            b.address
                        ),
                    );
                }
                if b.address.is_ipv4() && e.source.is_none() {
                    return problem(
                        "encap.source".into(),
                        format!(
                            "pool {:?} has IPv4 backends, so an IPv4 outer source is needed",
                            p.name
                        ),
                    );
                }
                if b.address.is_ipv6() && e.source6.is_none() {
                    return problem(
                        "encap.source6".into(),
                        format!(
                            "pool {:?} has IPv6 backends, so an IPv6 outer source is needed",
                            p.name
                        ),
                    );
                }
            }
        }
        for (i, p) in self.pools.iter().enumerate() {
            for (j, d) in p.drained.iter().enumerate() {
                let named = p.backends.iter().filter(|b| b.is_named(d)).count();
                if named == 0 {
                    return problem(
                        format!("pools[{i}].drained[{j}]"),
                        format!(
                            "{d:?} is not one of pool {:?}'s own backends (by name or address)",
                            p.name
                        ),
                    );
                }
                if p.drained[..j]
                    .iter()
                    .any(|e| p.backends.iter().any(|b| b.is_named(d) && b.is_named(e)))
                {
                    return problem(
                        format!("pools[{i}].drained[{j}]"),
                        format!("{d:?} drains a backend listed earlier in drained"),
                    );
                }
            }
        }
        let index = self.pool_index();
        for (i, p) in self.pools.iter().enumerate() {
            for (j, inc) in p.include.iter().enumerate() {
                if !pools.contains_key(inc.as_str()) {
                    return problem(
                        format!("pools[{i}].include[{j}]"),
                        format!("no pool named {inc:?}"),
                    );
                }
            }
            if p.include.is_empty() {
                continue; // its own backends, checked above
            }
            let members = match self.flatten_in(&index, &p.name) {
                Ok(m) => m,
                Err(cycle) => return problem(format!("pools[{i}].include"), cycle.to_string()),
            };
            // Included pools may share a backend (same name: counted once),
            // but not an address under another name.
            let mut addresses: HashMap<IpAddr, String> = HashMap::new();
            for b in &members {
                let name = b.display_name();
                if let Some(other) = addresses.insert(b.address, name.clone()) {
                    return problem(
                        format!("pools[{i}].include"),
                        format!(
                            "pool {:?} reaches the address {} twice, as backends {other:?} and \
                             {name:?} (through its includes); list a machine once and give it a weight",
                            p.name, b.address
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// `[bgp]`: a birdc command, a BIRD protocol name, a poll interval.
    fn check_bgp(&self) -> Result<(), Problem> {
        if let Some(b) = &self.bgp {
            if b.birdc.is_empty() {
                return problem(
                    "bgp.birdc".into(),
                    "needs a command, e.g. [\"birdc\"]".into(),
                );
            }
            if b.protocol.is_empty()
                || !b
                    .protocol
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return problem(
                    "bgp.protocol".into(),
                    format!("{:?} is not a BIRD protocol name", b.protocol),
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
            let min_quiet = 2 * crate::datapath::LIVE_INTERVAL_MS;
            if b.drain_ms > 0 && (b.drain_quiet_ms < min_quiet || b.drain_quiet_ms > b.drain_ms) {
                return problem(
                    "bgp.drain_quiet_ms".into(),
                    format!(
                        "{} must be between {min_quiet} (counters are published every {} ms) and drain_ms ({})",
                        b.drain_quiet_ms,
                        crate::datapath::LIVE_INTERVAL_MS,
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
        }
        Ok(())
    }

    /// `[fleet]`: peers of one family, each once, this load balancer
    /// among them; a direct peer check with sane timers; a printable name.
    fn check_fleet(&self) -> Result<(), Problem> {
        let Some(f) = &self.fleet else {
            return Ok(());
        };
        if f.peers.len() > 1024 {
            return problem(
                "fleet.peers".into(),
                format!(
                    "{} peers are too many; expected at most 1024",
                    f.peers.len()
                ),
            );
        }
        let mut seen = HashMap::new();
        for (i, a) in f.peers.iter().enumerate() {
            if let Some(j) = seen.insert(*a, i) {
                return problem(
                    format!("fleet.peers[{i}]"),
                    format!(
                        "{a} is listed twice (also fleet.peers[{j}]); list each load balancer once"
                    ),
                );
            }
            if a.is_ipv4() != f.peers[0].is_ipv4() {
                return problem(
                    format!("fleet.peers[{i}]"),
                    format!(
                        "{a} is not of the family of fleet.peers[0] ({}); list one address family",
                        f.peers[0]
                    ),
                );
            }
            if a.is_unspecified() || a.is_multicast() {
                return problem(
                    format!("fleet.peers[{i}]"),
                    format!("{a} is not a load balancer's address"),
                );
            }
        }
        let (own_key, family) = if f.peers.first().is_some_and(IpAddr::is_ipv6) {
            ("encap.source6", "IPv6")
        } else {
            ("encap.source", "IPv4")
        };
        match f.own(&self.encap) {
            None => {
                return problem(
                    own_key.into(),
                    format!("[fleet] lists {family} peers: set {own_key}, this load balancer's address among them"),
                )
            }
            Some(me) if !f.peers.contains(&me) => {
                return problem(
                    "fleet.peers".into(),
                    format!(
                        "this load balancer ({own_key} = {me}) is not in the list; \
                         every load balancer lists the whole fleet, itself included"
                    ),
                )
            }
            Some(_) => {}
        }
        let h = &f.health;
        if h.via != CheckPath::Direct {
            return problem(
                "fleet.health.via".into(),
                "peers are checked at their own addresses: use \"direct\"".into(),
            );
        }
        if h.interval_ms == 0 || h.timeout_ms == 0 || h.timeout_ms > h.interval_ms * 10 {
            return problem(
                "fleet.health".into(),
                "interval_ms and timeout_ms must be positive, timeout_ms at most 10x interval_ms"
                    .into(),
            );
        }
        if h.rise == 0 || h.fall == 0 {
            return problem(
                "fleet.health".into(),
                "rise and fall must be at least 1".into(),
            );
        }
        if !h.path.starts_with('/') || h.path.contains(['\r', '\n', ' ']) {
            return problem(
                "fleet.health.path".into(),
                format!(
                    "{:?} must start with / and hold no spaces or line breaks",
                    h.path
                ),
            );
        }
        if let Some(n) = &f.name {
            if n.is_empty() || n.len() > 255 || n.chars().any(char::is_control) {
                return problem(
                    "fleet.name".into(),
                    format!("{n:?} must be 1 to 255 printable characters"),
                );
            }
        }
        Ok(())
    }

    /// This machine's name in reports: `[fleet] name`, else the host name.
    pub fn machine_name(&self) -> String {
        self.fleet
            .as_ref()
            .and_then(|f| f.name.clone())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_else(|| "unknown".into())
    }

    /// Each pool's health check: timers, rise and fall, HTTP path.
    fn check_health(&self) -> Result<(), Problem> {
        let mut tunnel_vips = None;
        for (i, p) in self.pools.iter().enumerate() {
            if let Some(h) = &p.health {
                if h.interval_ms == 0 || h.timeout_ms == 0 || h.timeout_ms > h.interval_ms * 10 {
                    return problem(
                        format!("pools[{i}].health"),
                        "interval_ms and timeout_ms must be positive, timeout_ms at most 10x interval_ms".into(),
                    );
                }
                if h.rise == 0 || h.fall == 0 {
                    return problem(
                        format!("pools[{i}].health"),
                        "rise and fall must be at least 1".into(),
                    );
                }
                if !h.path.starts_with('/') || h.path.contains(['\r', '\n', ' ']) {
                    return problem(
                        format!("pools[{i}].health.path"),
                        format!(
                            "{:?} must start with / and hold no spaces or line breaks",
                            h.path
                        ),
                    );
                }
                if h.via == CheckPath::Tunnel
                    && !tunnel_vips
                        .get_or_insert_with(|| self.tunnel_vips())
                        .contains_key(p.name.as_str())
                {
                    return problem(
                        format!("pools[{i}].health.via"),
                        format!(
                            "tunnel checks go to a VIP of the pool, but no VIP with an address \
                             serves pool {:?} (directly or through an include)",
                            p.name
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// `[[prefix_groups]]`: unique names, prefixes that fit the cluster prefix length.
    fn check_prefix_groups(&self) -> Result<(), Problem> {
        let mut groups = HashMap::new();
        for (i, g) in self.prefix_groups.iter().enumerate() {
            if groups.insert(g.name.as_str(), i).is_some() {
                return problem(
                    format!("prefix_groups[{i}].name"),
                    format!("{:?} is defined twice", g.name),
                );
            }
            for (j, p) in g.prefixes.iter().enumerate() {
                match parse_prefix(p) {
                    None => return problem(format!("prefix_groups[{i}].prefixes[{j}]"), format!("{p:?} is not a prefix like 74.125.0.0/16")),
                    Some((a, l)) if l > g.cluster_prefix_len || (a.is_ipv4() && g.cluster_prefix_len > 32) || g.cluster_prefix_len > 128 => {
                        return problem(
                            format!("prefix_groups[{i}].cluster_prefix_len"),
                            format!("{} must be at least every prefix's length ({l}) and fit the address family", g.cluster_prefix_len),
                        )
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }

    /// `[[vips]]`: unique names and keys, known pools and prefix groups, tables large enough for their pools.
    fn check_vips(&self) -> Result<(), Problem> {
        let pools = self.pool_index();
        let groups: HashSet<&str> = self.prefix_groups.iter().map(|g| g.name.as_str()).collect();
        let mut vip_names = HashSet::new();
        let mut vip_keys = HashSet::new();
        for (i, v) in self.vips.iter().enumerate() {
            if !vip_names.insert(v.name.as_str()) {
                return problem(
                    format!("vips[{i}].name"),
                    format!("{:?} is defined twice", v.name),
                );
            }
            if !pools.contains_key(v.pool.as_str()) {
                return problem(
                    format!("vips[{i}].pool"),
                    format!("no pool named {:?}", v.pool),
                );
            }
            let key = match (&v.address, &v.prefix_group, &v.suffix) {
                (Some(a), None, None) => format!("{a}"),
                (None, Some(g), Some(s)) => {
                    if !groups.contains(g.as_str()) {
                        return problem(
                            format!("vips[{i}].prefix_group"),
                            format!("no prefix group named {g:?}"),
                        );
                    }
                    format!("{g}/{s}")
                }
                _ => {
                    return problem(
                        format!("vips[{i}]"),
                        "give either `address`, or both `prefix_group` and `suffix`".into(),
                    )
                }
            };
            if let (Ok(members), Some(p)) = (
                self.pool_members(&pools, &v.pool),
                pools.get(v.pool.as_str()),
            ) {
                if members.len() as u64 > p.table_size {
                    return problem(
                        format!("vips[{i}].pool"),
                        format!(
                            "pool {:?} has {} backends, more than its table_size {}",
                            v.pool,
                            members.len(),
                            p.table_size
                        ),
                    );
                }
            }
            if !vip_keys.insert((key.clone(), v.port, v.protocol)) {
                return problem(
                    format!("vips[{i}]"),
                    format!(
                        "another VIP already serves {key} port {:?} {:?}",
                        v.port, v.protocol
                    ),
                );
            }
        }
        Ok(())
    }

    /// The keys whose change from `self` to `new` a running load balancer
    /// cannot apply (`[forwarder]`, `[conntrack]` and `[api]`: threads,
    /// queues, pool and table sizes, the API address), as `section.key`.
    /// Everything else (pools, backends, VIPs, health checks, BGP,
    /// encapsulation, `source_prefix` included) is applied by a reload.
    pub fn restart_keys(&self, new: &Config) -> Vec<String> {
        // Only the sections compared: serialising the whole configuration
        // (100,000 backends at scale) would cost a reload tens of ms.
        let sections = |c: &Config| {
            serde_json::json!({
                "fleet": c.fleet.is_some().then_some(true),
                "encap": c.encap,
                "forwarder": c.forwarder,
                "conntrack": c.conntrack,
                "api": c.api,
                "tracer": c.tracer,
            })
        };
        let (old, new) = (sections(self), sections(new));
        let mut keys = Vec::new();
        // Adding or removing [fleet] changes how the daemon opens its
        // ports (one AF_XDP socket per queue only without a fleet: a
        // peer's redirects would land on other queues than their
        // datagram's); changes inside it apply live.
        if old["fleet"].is_null() != new["fleet"].is_null() {
            keys.push("fleet".to_string());
        }
        for section in ["forwarder", "conntrack", "api", "tracer"] {
            let (a, b) = (&old[section], &new[section]);
            let names: std::collections::BTreeSet<&String> = a
                .as_object()
                .into_iter()
                .chain(b.as_object())
                .flat_map(|m| m.keys())
                .collect();
            for k in names {
                if a.get(k) != b.get(k) {
                    keys.push(format!("{section}.{k}"));
                }
            }
        }
        keys
    }

    /// The VIP address a tunnel health check of `pool`'s backends goes to:
    /// the first VIP with an address whose pool is `pool` or includes it.
    pub fn tunnel_vip(&self, pool: &str) -> Option<IpAddr> {
        self.vips
            .iter()
            .filter(|v| self.pool_reaches(&v.pool, pool, 0))
            .find_map(|v| v.address)
    }

    /// Whether pool `from` is `target` or includes it (directly or not).
    fn pool_reaches(&self, from: &str, target: &str, depth: usize) -> bool {
        if from == target {
            return true;
        }
        // Cycles are rejected by validation; the depth bound keeps a
        // hand-built Config from recursing for ever.
        depth < self.pools.len()
            && self
                .pools
                .iter()
                .filter(|p| p.name == from)
                .flat_map(|p| &p.include)
                .any(|inc| self.pool_reaches(inc, target, depth + 1))
    }

    /// The VIP address a tunnel health check of each pool goes to (as
    /// [`Config::tunnel_vip`] for every pool at once, in time linear in the
    /// VIPs, pools and includes): pools no VIP with an address reaches are
    /// absent.
    pub fn tunnel_vips(&self) -> HashMap<&str, IpAddr> {
        let index = self.pool_index();
        let mut out: HashMap<&str, IpAddr> = HashMap::new();
        let mut stack = Vec::new();
        // VIPs in order, so the first VIP reaching a pool wins. A pool
        // already assigned has all the pools it includes assigned too (it
        // was walked), so a walk stops there: each pool is walked once.
        for v in &self.vips {
            let Some(addr) = v.address else { continue };
            stack.push(v.pool.as_str());
            while let Some(name) = stack.pop() {
                let Some(p) = index.get(name) else { continue };
                if out.contains_key(p.name.as_str()) {
                    continue;
                }
                out.insert(p.name.as_str(), addr);
                stack.extend(p.include.iter().map(String::as_str));
            }
        }
        out
    }

    /// The pools by name (the first of a name: validation rejects
    /// duplicates), for [`Config::flatten_in`] and [`Config::pool_members`].
    pub fn pool_index(&self) -> HashMap<&str, &PoolConf> {
        let mut index = HashMap::with_capacity(self.pools.len());
        for p in &self.pools {
            index.entry(p.name.as_str()).or_insert(p);
        }
        index
    }

    /// The backends of a pool of a *validated* configuration with its
    /// included pools, as [`Config::flatten`]: a pool without includes or
    /// drained backends is its own backend list, borrowed (validation made
    /// its names unique).
    /// `index` is [`Config::pool_index`].
    pub fn pool_members<'a>(
        &'a self,
        index: &HashMap<&str, &'a PoolConf>,
        pool: &str,
    ) -> Result<std::borrow::Cow<'a, [BackendConf]>, IncludeCycle> {
        match index.get(pool) {
            Some(p) if p.include.is_empty() && p.drained.is_empty() => {
                Ok(std::borrow::Cow::Borrowed(&p.backends))
            }
            _ => self.flatten_in(index, pool).map(std::borrow::Cow::Owned),
        }
    }

    /// The backends of a pool with its included pools, each backend once
    /// (first occurrence wins), or the cycle that prevents it. A backend in
    /// its pool's `drained` list comes with weight 0.
    pub fn flatten(&self, pool: &str) -> Result<Vec<BackendConf>, IncludeCycle> {
        self.flatten_in(&self.pool_index(), pool)
    }

    /// [`Config::flatten`] with the pools by name ([`Config::pool_index`]),
    /// for callers flattening many pools.
    pub fn flatten_in(
        &self,
        index: &HashMap<&str, &PoolConf>,
        pool: &str,
    ) -> Result<Vec<BackendConf>, IncludeCycle> {
        Ok(self
            .members_as_written(index, pool)?
            .into_iter()
            .map(|(mut b, drained)| {
                // Drained: no share of the table (the file keeps its
                // weight to restore).
                if drained {
                    b.weight = 0;
                }
                b
            })
            .collect())
    }

    /// The backends of a pool with its included pools, each once (first
    /// occurrence wins, depth first in include order), with the weight
    /// written in the file and whether the pool that lists it drains it;
    /// or the cycle that prevents it. [`Config::flatten_in`] is this with
    /// drained weights as 0.
    pub fn members_as_written(
        &self,
        index: &HashMap<&str, &PoolConf>,
        pool: &str,
    ) -> Result<Vec<(BackendConf, bool)>, IncludeCycle> {
        fn walk<'a>(
            index: &HashMap<&str, &'a PoolConf>,
            name: &'a str,
            path: &mut Vec<&'a str>,
            seen: &mut HashSet<String>,
            out: &mut Vec<(BackendConf, bool)>,
        ) -> Result<(), IncludeCycle> {
            if path.contains(&name) {
                path.push(name);
                return Err(IncludeCycle(path.join(" -> ")));
            }
            let Some(&p) = index.get(name) else {
                return Ok(()); // reported by validate
            };
            path.push(name);
            for b in &p.backends {
                if seen.insert(b.display_name()) {
                    out.push((b.clone(), p.is_drained(b)));
                }
            }
            for inc in &p.include {
                walk(index, inc, path, seen, out)?;
            }
            path.pop();
            Ok(())
        }
        let mut out = Vec::new();
        walk(index, pool, &mut Vec::new(), &mut HashSet::new(), &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[encap]
source = "10.0.0.1"
[[pools]]
name = "web"
backends = [{ address = "10.1.0.1" }, { address = "10.1.0.2", weight = 2 }]
include = ["extra"]
[[pools]]
name = "extra"
backends = [{ address = "10.1.0.3", name = "third" }, { address = "10.1.0.1" }]
[[vips]]
name = "http"
address = "192.0.2.80"
port = 80
protocol = "tcp"
pool = "web"
"#;

    #[test]
    fn good_config_flattens_pools() {
        let c = Config::parse(GOOD, "t.toml").unwrap();
        let b = c.flatten("web").unwrap();
        let names: Vec<String> = b
            .iter()
            .map(|b| b.name.clone().unwrap_or(b.address.to_string()))
            .collect();
        assert_eq!(names, ["10.1.0.1", "10.1.0.2", "third"]);
        assert_eq!(c.forwarder.batch_timeout_us, 50);
    }

    fn err(text: &str) -> ConfigError {
        Config::parse(text, "t.toml").unwrap_err()
    }

    #[test]
    fn errors_name_file_key_and_problem() {
        let e = err(&GOOD.replace("pool = \"web\"", "pool = \"nope\""));
        assert_eq!(
            (e.file.as_str(), e.key.as_str()),
            ("t.toml", "vips[0].pool")
        );
        assert!(e.problem.contains("nope"));
        let e = err(&format!("{GOOD}\n[[pools]]\nname = \"loop\"\ninclude = [\"loop2\"]\n[[pools]]\nname = \"loop2\"\ninclude = [\"loop\"]\n"));
        assert!(
            e.problem.contains("cycle") && e.problem.contains("loop -> loop2 -> loop"),
            "{e}"
        );
        let e = err(&GOOD.replace("[encap]", "[encap]\nttl = 0"));
        assert_eq!(e.key, "encap.ttl");
        let e = err(&GOOD.replace("name = \"web\"\n", "name = \"web\"\ntable_size = 65536\n"));
        assert!(
            e.key == "pools[0].table_size" && e.problem.contains("not prime"),
            "{e}"
        );
        let e = err(&GOOD.replace("port = 80", "port = 80\ncolour = \"blue\""));
        assert!(
            e.problem.contains("colour") && e.key.starts_with("line"),
            "{e}"
        );
        let e = err(&GOOD.replace("source = \"10.0.0.1\"", ""));
        assert_eq!(e.key, "encap.source");
        let e = err(&GOOD.replace("port = 80", "port = 99999"));
        assert!(e.key.starts_with("line"), "{e}");
        assert!(e.problem.contains("port = 99999"), "{e}");
        // The parser's message does not name the table; the line does.
        let e = err(&format!("{GOOD}\n[encap]\nttl = 3\n"));
        assert!(e.key == "line 18" && e.problem.contains("[encap]"), "{e}");
        let e = err("[conntrack]\nsize = 1000\n");
        assert_eq!(e.key, "conntrack.size");
        // A tracer reports only to prefixes it is given (issue 14 review).
        let e = err(&GOOD.replace("[encap]", "[tracer]\nenabled = true\n[encap]"));
        assert_eq!(e.key, "tracer.report_to", "{e}");
        let e = err(&GOOD.replace(
            "[encap]",
            "[tracer]\nenabled = true\nreport_to = [\"10.1.0.0\"]\n[encap]",
        ));
        assert_eq!(e.key, "tracer.report_to[0]", "{e}");
        let c = Config::parse(
            &GOOD.replace(
                "[encap]",
                "[tracer]\nenabled = true\nreport_to = [\"10.1.0.0/24\"]\n[encap]",
            ),
            "t",
        )
        .unwrap();
        assert!(c.tracer.enabled);
        assert!(!Config::parse(GOOD, "t").unwrap().tracer.enabled);
        // An API anyone can reach needs a token (issue 13, finding 9).
        let e = err(&GOOD.replace("[encap]", "[api]\nlisten = \"0.0.0.0:9180\"\n[encap]"));
        assert!(
            e.key == "api.listen" && e.problem.contains("token_file"),
            "{e}"
        );
        Config::parse(
            &GOOD.replace(
                "[encap]",
                "[api]\nlisten = \"0.0.0.0:9180\"\ntoken_file = \"/etc/t\"\n[encap]",
            ),
            "t",
        )
        .unwrap();
        Config::parse(
            &GOOD.replace("[encap]", "[api]\nlisten = \"[::1]:9180\"\n[encap]"),
            "t",
        )
        .unwrap();
        // A bad key in column 0 is reported on its own line (it was one
        // line too high).
        let e = err("[forwarder]\nthreads = 2\nbatch = 32\nthreadz = 4\n");
        assert_eq!(e.key, "line 4", "{e}");
        let e = err("\n\n[forwarder]\n  threadz = 4\n");
        assert_eq!(e.key, "line 4", "{e}");
        // One machine under two names would silently double its weight.
        let e = err(&GOOD.replace(
            "{ address = \"10.1.0.2\", weight = 2 }",
            "{ address = \"10.1.0.2\", weight = 2 }, { address = \"10.1.0.2\", name = \"again\" }",
        ));
        assert_eq!(e.key, "pools[0].backends[2]", "{e}");
        assert!(
            e.problem.contains("\"again\"") && e.problem.contains("\"10.1.0.2\""),
            "{e}"
        );
        let e = err(&GOOD.replace(
            "{ address = \"10.1.0.3\", name = \"third\" }",
            "{ address = \"10.1.0.2\", name = \"third\" }",
        ));
        assert_eq!(e.key, "pools[0].include", "{e}");
        assert!(
            e.problem.contains("10.1.0.2") && e.problem.contains("third"),
            "{e}"
        );
        assert!(Config::load(Path::new("/nonexistent.toml"))
            .unwrap_err()
            .to_string()
            .contains("/nonexistent.toml"));
    }

    #[test]
    fn gateway_mac_is_optional_and_checked_when_set() {
        // Unset: no placeholder in the configuration; the daemon resolves
        // the next hop (issue 17, finding 1).
        let c = Config::parse(GOOD, "t.toml").unwrap();
        assert_eq!(c.encap.gateway_mac, None);
        assert_eq!(Encap::default().gateway_mac, None);
        // Set: an override, kept as written.
        let c = Config::parse(
            &GOOD.replace("[encap]", "[encap]\ngateway_mac = \"02:aa:bb:cc:dd:ee\""),
            "t.toml",
        )
        .unwrap();
        assert_eq!(c.encap.gateway_mac.as_deref(), Some("02:aa:bb:cc:dd:ee"));
        // Set badly: still an error naming the key and the way out.
        for bad in ["02:aa:bb:cc:dd", "router", "02:aa:bb:cc:dd:zz", ""] {
            let e = err(&GOOD.replace("[encap]", &format!("[encap]\ngateway_mac = \"{bad}\"")));
            assert_eq!(e.key, "encap.gateway_mac", "{bad}: {e}");
            assert!(
                e.problem.contains(&format!("{bad:?}")) && e.problem.contains("leave it out"),
                "{e}"
            );
        }
    }

    #[test]
    fn restart_keys_name_what_a_reload_cannot_apply() {
        let old = Config::parse(GOOD, "t").unwrap();
        assert!(old.restart_keys(&old).is_empty());
        let new = Config::parse(
            &GOOD
                .replace(
                    "[encap]",
                    "[forwarder]\nthreads = 3\n[api]\nlisten = \"127.0.0.1:9999\"\n[encap]",
                )
                .replace(
                    "{ address = \"10.1.0.2\", weight = 2 }",
                    "{ address = \"10.1.0.2\", weight = 3 }",
                ),
            "t",
        )
        .unwrap();
        // The weight is applied live; threads and the API address are not.
        assert_eq!(old.restart_keys(&new), ["forwarder.threads", "api.listen"]);
        // The tracer is built at start; [fleet] coming or going changes
        // how the ports are opened.
        let traced = Config::parse(
            &GOOD.replace(
                "[encap]",
                "[tracer]\nenabled = true\nreport_to = [\"10.1.0.0/24\"]\n[encap]",
            ),
            "t",
        )
        .unwrap();
        assert_eq!(
            old.restart_keys(&traced),
            ["tracer.enabled", "tracer.report_to"]
        );
    }

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
    fn driver_key() {
        let c = Config::parse(
            &GOOD.replace("[encap]", "[forwarder]\ndriver = \"af-packet\"\n[encap]"),
            "t",
        )
        .unwrap();
        assert_eq!(c.forwarder.driver, Driver::AfPacket);
        assert_eq!(
            Config::parse(GOOD, "t").unwrap().forwarder.driver,
            Driver::Auto
        );
        let e = err(&GOOD.replace("[encap]", "[forwarder]\ndriver = \"dpdk\"\n[encap]"));
        assert!(
            e.problem.contains("dpdk") && e.problem.contains("af-xdp"),
            "{e}"
        );
    }

    #[test]
    fn fleet_lists_this_load_balancer_once_in_one_family() {
        let fleet = |peers: &str| format!("{GOOD}\n[fleet]\npeers = [{peers}]\nname = \"lb1\"\n");
        let c = Config::parse(&fleet("\"10.0.0.2\", \"10.0.0.1\", \"10.0.0.3\""), "t").unwrap();
        let f = c.fleet.as_ref().unwrap();
        assert_eq!(f.own(&c.encap), Some(ip("10.0.0.1")));
        assert_eq!((f.health.kind, f.health.port), (CheckKind::Tcp, 179));
        assert_eq!(c.machine_name(), "lb1");
        let e = err(&fleet("\"10.0.0.2\", \"10.0.0.3\""));
        assert!(
            e.key == "fleet.peers" && e.problem.contains("10.0.0.1"),
            "{e}"
        );
        let e = err(&fleet("\"10.0.0.1\", \"10.0.0.2\", \"10.0.0.1\""));
        assert!(
            e.key == "fleet.peers[2]" && e.problem.contains("twice"),
            "{e}"
        );
        let e = err(&fleet("\"10.0.0.1\", \"fd00::2\""));
        assert!(
            e.key == "fleet.peers[1]" && e.problem.contains("family"),
            "{e}"
        );
        // IPv6 peers identify this load balancer by source6.
        let e = err(&fleet("\"fd00::1\", \"fd00::2\""));
        assert_eq!(e.key, "encap.source6", "{e}");
        let v6 =
            fleet("\"fd00::1\", \"fd00::2\"").replace("[encap]", "[encap]\nsource6 = \"fd00::1\"");
        Config::parse(&v6, "t").unwrap();
        let e = err(&fleet("\"10.0.0.1\"").replace(
            "name = \"lb1\"",
            "health = { kind = \"tcp\", port = 179, via = \"tunnel\" }",
        ));
        assert_eq!(e.key, "fleet.health.via", "{e}");
        let e = err(&fleet("\"10.0.0.1\"").replace("name = \"lb1\"", "colour = 1"));
        assert!(
            e.key.starts_with("line") && e.problem.contains("colour"),
            "{e}"
        );
        // A change inside [fleet] is applied by a reload; adding or
        // removing the section changes how the ports are opened.
        let old = Config::parse(GOOD, "t").unwrap();
        let one = Config::parse(&fleet("\"10.0.0.1\""), "t").unwrap();
        let two = Config::parse(&fleet("\"10.0.0.1\", \"10.0.0.2\""), "t").unwrap();
        assert!(one.restart_keys(&two).is_empty());
        assert_eq!(old.restart_keys(&two), ["fleet"]);
        assert_eq!(two.restart_keys(&old), ["fleet"]);
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// examples/lb.toml loads, and shows every section the configuration
    /// has (as a table, or commented out where a capture replay cannot use
    /// it): a section added here and not there fails this test.
    #[test]
    fn the_annotated_example_is_valid_and_complete() {
        let text = include_str!("../../../examples/lb.toml");
        let c = Config::parse(text, "examples/lb.toml").unwrap();
        let sections = serde_json::to_value(&c).unwrap();
        for key in sections.as_object().unwrap().keys() {
            let shown = [format!("[{key}]"), format!("[[{key}]]")].iter().any(|h| {
                text.lines()
                    .any(|l| l.trim_start_matches("# ").starts_with(h.as_str()))
            });
            assert!(shown, "examples/lb.toml does not show [{key}]");
        }
        // Every health-check key and the BGP drain keys are shown too.
        for k in [
            "interval_ms",
            "timeout_ms",
            "rise",
            "fall",
            "drain_ms",
            "drain_quiet_ms",
            "report_to",
        ] {
            assert!(text.contains(k), "examples/lb.toml does not show {k}");
        }
    }

    #[test]
    fn prefix_groups_validate() {
        let g = format!(
            "{GOOD}\n[[prefix_groups]]\nname = \"a\"\nprefixes = [\"74.125.0.0/16\"]\ncluster_prefix_len = 24\n[[vips]]\nname = \"s\"\nprefix_group = \"a\"\nsuffix = \"0.0.0.1\"\nprotocol = \"udp\"\npool = \"web\"\n"
        );
        Config::parse(&g, "t").unwrap();
        assert_eq!(
            err(&g.replace("cluster_prefix_len = 24", "cluster_prefix_len = 8")).key,
            "prefix_groups[0].cluster_prefix_len"
        );
        assert_eq!(
            err(&g.replace("74.125.0.0/16", "74.125.0.0")).key,
            "prefix_groups[0].prefixes[0]"
        );
        assert_eq!(
            err(&g.replace("prefix_group = \"a\"", "prefix_group = \"b\"")).key,
            "vips[1].prefix_group"
        );
        assert_eq!(err(&g.replace("suffix = \"0.0.0.1\"\n", "")).key, "vips[1]");
    }

    #[test]
    fn a_name_that_is_another_backends_address_is_taken() {
        let pool = |list: &str| {
            format!(
                "[encap]\nsource = \"10.0.0.1\"\n[[pools]]\nname = \"web\"\nbackends = [{list}]\n\
                 [[vips]]\nname = \"v\"\naddress = \"198.18.0.1\"\nprotocol = \"tcp\"\npool = \"web\"\n"
            )
        };
        let e = err(&pool(
            "{ address = \"10.1.0.9\" }, { address = \"10.1.0.2\", name = \"10.1.0.9\" }",
        ));
        assert_eq!(e.key, "pools[0].backends[1]");
        assert!(
            e.problem.contains("\"10.1.0.9\" appears twice"),
            "{}",
            e.problem
        );
        // Written another way it is another name.
        Config::parse(
            &pool("{ address = \"fd00::9\" }, { address = \"fd00::2\", name = \"fd00:0::9\" }")
                .replace("[encap]\n", "[encap]\nsource6 = \"fd00::1\"\n"),
            "t",
        )
        .unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// `tunnel_vips` (linear) agrees with `tunnel_vip` (per pool) on
        /// any include graph, cycles and unknown pools included.
        #[test]
        fn tunnel_vips_agree_with_tunnel_vip(
            includes in proptest::collection::vec(proptest::collection::vec(0usize..7, 0..3), 6),
            vips in proptest::collection::vec((0usize..7, proptest::prelude::any::<bool>()), 0..6),
        ) {
            let cfg = Config {
                pools: includes
                    .iter()
                    .enumerate()
                    .map(|(i, inc)| PoolConf {
                        name: format!("p{i}"),
                        backends: Vec::new(),
                        // p6 does not exist.
                        include: inc.iter().map(|j| format!("p{j}")).collect(),
                        table_size: 251,
                        health: None,
                        drained: Vec::new(),
                    })
                    .collect(),
                vips: vips
                    .iter()
                    .enumerate()
                    .map(|(i, &(pool, addressed))| VipConf {
                        name: format!("v{i}"),
                        address: addressed.then(|| IpAddr::from([198, 18, 0, i as u8 + 1])),
                        prefix_group: None,
                        suffix: None,
                        port: None,
                        protocol: Protocol::Tcp,
                        pool: format!("p{pool}"),
                    })
                    .collect(),
                ..Config::default()
            };
            let all = cfg.tunnel_vips();
            for p in &cfg.pools {
                proptest::prop_assert_eq!(all.get(p.name.as_str()).copied(), cfg.tunnel_vip(&p.name));
            }
        }
    }
}
