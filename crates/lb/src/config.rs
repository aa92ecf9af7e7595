//! The load balancer's configuration, in TOML.
//!
//! ```toml
//! [forwarder]
//! driver = "auto"          # on an interface: "auto" (AF_XDP, else AF_PACKET), "af-xdp",
//!                          # "xdp" (TCP/UDP in the driver, the rest AF_XDP), "af-packet"
//! threads = 2              # packet threads (0: process in the I/O thread)
//! batch = 32               # packets per batch
//! batch_timeout_us = 50    # a partial batch is handed over after this long
//! queue_size = 1024        # per-thread receive and transmit queues
//! # pool_buffers = 8192    # packet pool size (2 KiB buffers); default: what the
//!                          # queues of `threads` packet threads hold, at least 8192
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
//! file, the key and what was expected: the one function `fastpath lb
//! check-config`, `fastpath lb run` and every reload go through ([`load`]
//! says what it checks beyond the text). Every size has an upper bound
//! (`MAX_*` here), names are bounded, addresses are of the right class, and
//! pools' includes are walked without recursion, each pool once
//! ([`includes`]).
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

use serde::{Deserialize, Serialize};

pub use crate::config_chunks::{ChunkStats, ParseCache};
pub use includes::{MAX_INCLUDE_DEPTH, MAX_RESOLVED};
pub use load::{
    machine_memory, read_token, Checked, MachineMemory, MemoryEstimate, MemoryPart, TokenError,
    MAX_CONFIG_BYTES, MAX_TOKEN_FILE_BYTES, MIN_TOKEN_CHARS, VIPS_FILE_HEADER,
};

mod includes;
mod load;

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

/// The largest Maglev table: 16,777,213 slots, the largest prime below
/// 2^24 (64 MiB of entries). The paper uses 65,537 and names 655,373 for
/// larger pools; M above 100 times the backends keeps the imbalance near
/// 1%, so this serves 167,000 backends in one pool. What a configuration's
/// tables need together is checked against the machine's memory.
pub const MAX_TABLE_SIZE: u64 = 16_777_213;

/// The deepest `[forwarder] queue_size`: 65,536 packets (128 MiB of 2 KiB
/// buffers behind each queue); deeper queues only add delay.
pub const MAX_QUEUE_SIZE: usize = 1 << 16;

/// The largest `[forwarder] pool_buffers`: 4,194,304 buffers (8 GiB).
pub const MAX_POOL_BUFFERS: u32 = 1 << 22;

/// The fewest buffers a pool sized by the thread count gets
/// ([`Forwarder::pool_buffers`] without `pool_buffers` in the file).
pub const DEFAULT_POOL_BUFFERS: u32 = 8192;

/// The largest `[conntrack] size` per packet thread: 16,777,216 entries
/// (about 0.9 GiB per thread).
pub const MAX_CONNTRACK_SIZE: usize = 1 << 24;

/// The largest `[forwarder] frag_table_size` per packet thread: 1,048,576
/// datagrams being reassembled.
pub const MAX_FRAG_TABLE_SIZE: usize = 1 << 20;

/// The longest `[forwarder] batch_timeout_us`: one second, TCP's shortest
/// retransmission timeout; a packet held longer would be sent again.
pub const MAX_BATCH_TIMEOUT_US: u64 = 1_000_000;

/// The longest timeout, interval or wait a configuration may give
/// (conntrack timeouts, health-check timers, the fragment wait): one day.
pub const MAX_DURATION_MS: u64 = 86_400_000;

/// The longest HTTP health-check path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// Why `a` cannot be a host's own address (a backend, a VIP, an outer
/// source), or `None` when it can: not unspecified, not the broadcast
/// address, not multicast, not loopback (an IPv4-mapped IPv6 address is
/// judged as its IPv4 address).
pub fn not_a_host(a: IpAddr) -> Option<&'static str> {
    let a = match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    };
    if a.is_unspecified() {
        Some("the unspecified address")
    } else if matches!(a, IpAddr::V4(v4) if v4.is_broadcast()) {
        Some("the broadcast address")
    } else if a.is_multicast() {
        Some("a multicast address")
    } else if a.is_loopback() {
        Some("a loopback address")
    } else {
        None
    }
}

/// Why `m` cannot be a station's MAC address (zero, broadcast or
/// multicast: the group bit of the first octet), or `None` when it can.
pub fn not_a_station(m: [u8; 6]) -> Option<&'static str> {
    if m == [0; 6] {
        Some("the zero address")
    } else if m == [0xff; 6] {
        Some("the broadcast address")
    } else if m[0] & 1 == 1 {
        Some("a multicast address (the first octet is odd)")
    } else {
        None
    }
}

/// The ranges no unicast host is in: a prefix reports go to may not
/// overlap them (`0.0.0.0/0` would send reports anywhere, broadcast
/// included).
const NOT_UNICAST: [(&str, IpAddr, u8); 5] = [
    (
        "\"this network\" (0.0.0.0/8)",
        IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        8,
    ),
    (
        "multicast (224.0.0.0/4)",
        IpAddr::V4(std::net::Ipv4Addr::new(224, 0, 0, 0)),
        4,
    ),
    (
        "reserved and broadcast (240.0.0.0/4)",
        IpAddr::V4(std::net::Ipv4Addr::new(240, 0, 0, 0)),
        4,
    ),
    (
        "the unspecified address (::)",
        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        128,
    ),
    (
        "multicast (ff00::/8)",
        IpAddr::V6(std::net::Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0)),
        8,
    ),
];

/// Whether two prefixes share an address: the shorter contains the other.
fn overlaps((a, la): (IpAddr, u8), (b, lb): (IpAddr, u8)) -> bool {
    let bits = |x: IpAddr| match x {
        IpAddr::V4(v) => u128::from(u32::from(v)) << 96,
        IpAddr::V6(v) => u128::from(v),
    };
    if a.is_ipv4() != b.is_ipv4() {
        return false;
    }
    let l = u32::from(la.min(lb));
    let mask = if l == 0 { 0 } else { u128::MAX << (128 - l) };
    bits(a) & mask == bits(b) & mask
}

/// A name: 1 to [`MAX_NAME_BYTES`] bytes, none of them a control character.
fn check_name(key: impl FnOnce() -> String, name: &str) -> Result<(), Problem> {
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

/// A health check's timers, counts, path and expected status (`key` is
/// where it is: `pools[3].health`, `fleet.health`).
fn check_health_conf(key: &str, h: &HealthConf) -> Result<(), Problem> {
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
    if !h.path.starts_with('/')
        || h.path.contains(['\r', '\n', ' '])
        || h.path.len() > MAX_PATH_BYTES
    {
        let shown: String = h.path.chars().take(40).collect();
        return problem(
            format!("{key}.path"),
            format!(
                "{shown:?} must start with / and hold no spaces or line breaks, in at most \
                 {MAX_PATH_BYTES} bytes"
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
    /// The load balancer in the driver: TCP and UDP to exactly matched
    /// VIPs, over IPv4 without options and IPv6 without extension headers,
    /// forwarded by an XDP program (XDP_TX, no copy, no socket), everything
    /// else (fragments, ICMP, extension headers, prefix-group VIPs, probes)
    /// through AF_XDP to the packet threads. Same backends, same bytes.
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
    /// Packet pool buffers as written in the file; none (the default):
    /// sized by the thread count ([`Forwarder::pool_buffers`]). A value
    /// given must fill the queues of `threads` packet threads.
    pub pool_buffers: Option<u32>,
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
            pool_buffers: None,
            frag_table_size: 1024,
            frag_timeout_ms: 1000,
        }
    }
}

impl Forwarder {
    /// The buffers the datapath's rings and queues hold when full with
    /// `threads` packet threads: a receive and a transmit queue each, the
    /// I/O loop's receive ring (two queues deep) and its transmit ring (two
    /// queues deep per thread, counted with the threads' queues here, as
    /// it only holds what they emptied). A pool smaller than this would
    /// make steering wait for buffers the queues keep.
    pub fn needed_buffers(&self) -> u64 {
        (self.queue_size as u64).saturating_mul(2 * self.threads.max(1) as u64 + 2)
    }

    /// The pool's size: `pool_buffers` as written, else what the queues
    /// of the thread count need ([`Forwarder::needed_buffers`]), at least
    /// [`DEFAULT_POOL_BUFFERS`] (at most [`MAX_POOL_BUFFERS`], which
    /// validation makes sure is enough).
    pub fn pool_buffers(&self) -> u32 {
        self.pool_buffers.unwrap_or_else(|| {
            self.needed_buffers()
                .clamp(u64::from(DEFAULT_POOL_BUFFERS), u64::from(MAX_POOL_BUFFERS))
                as u32
        })
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
    /// Whether reads (`GET /status`, `GET /metrics`) need the token too.
    /// Unset: they do when `listen` is not a loopback address and there is
    /// a token (a data address is reachable by whoever reaches the
    /// machine, and `/status` names every backend); on loopback they stay
    /// open, for a local Prometheus and `fastpath lb status`. `true` needs
    /// `token_file`; `false` keeps reads open on any address (a scraper
    /// that cannot send a token, behind a firewall).
    pub token_for_reads: Option<bool>,
}

impl Api {
    /// Whether reads need the token (see [`Api::token_for_reads`]).
    pub fn reads_need_token(&self) -> bool {
        self.token_file.is_some()
            && self
                .token_for_reads
                .unwrap_or_else(|| self.listen.is_some_and(|l| !l.ip().is_loopback()))
    }
}

/// `[bgp]`: announcing VIPs through BIRD. BIRD's static protocols are per
/// address family, so there are two of each: fastpath writes the IPv4 VIPs
/// as static routes into `vips_file`, which the BIRD configuration includes
/// in a static protocol named `protocol` (ipv4 channel, configured
/// `disabled`), and the IPv6 VIPs into `vips_file6`, included in
/// `protocol6` (ipv6 channel). fastpath enables a family's protocol while
/// the forwarder is healthy and disables it (withdrawing its VIPs) when the
/// forwarder stops or stalls. It reads back from BIRD, every poll, what
/// BIRD really exports, and puts BIRD back when its state differs (a
/// `birdc configure` resets the protocols to `disabled`, a restarted BIRD
/// starts so). The IPv6 protocol is used only while there are IPv6 VIPs.
/// `dist/bird/fastpath.conf` defines both with these default names.
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
/// health = { kind = "fastpath", port = 9181 }       # the default: fastpath's own probe
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
    /// are dropped, counted as `fragment_peer_down`. Default: kind
    /// `"fastpath"` on [`PEER_PORT`]: each peer's fastpath answers while
    /// its datapath beats (this load balancer answers the others there).
    #[serde(default = "default_peer_health")]
    pub health: HealthConf,
}

/// The UDP port on which a `[fleet]` peer's fastpath answers the liveness
/// probe of [`CheckKind::Fastpath`] by default.
pub const PEER_PORT: u16 = 9181;

fn default_peer_health() -> HealthConf {
    HealthConf {
        kind: CheckKind::Fastpath,
        port: PEER_PORT,
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
    /// `[tracer]`: packet-tracer probes (see [`crate::tracer`]).
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
    ///
    /// Every check is bounded by the sizes it checks first and walks pools
    /// and their includes without recursion, in time linear in the file,
    /// so that any text, however built, is answered quickly on any thread.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        self.check_all().map_err(|p| ConfigError {
            file: file.into(),
            key: p.key,
            problem: p.problem,
        })
    }

    /// [`Config::validate`] of `[forwarder]` alone: after the thread
    /// count changed (`--threads`), the sizes that depend on it.
    pub fn validate_forwarder(&self, file: &str) -> Result<(), ConfigError> {
        self.check_forwarder().map_err(|p| ConfigError {
            file: file.into(),
            key: p.key,
            problem: p.problem,
        })
    }

    fn check_all(&self) -> Result<(), Problem> {
        self.check_counts()?;
        self.check_forwarder()?;
        self.check_conntrack()?;
        self.check_encap()?;
        self.check_api()?;
        self.check_tracer()?;
        let resolved = self.check_pools()?;
        self.check_bgp()?;
        self.check_fleet()?;
        self.check_prefix_groups()?;
        self.check_vips(&resolved)?;
        // After the VIPs: tunnel checks need a VIP over their pool, and a
        // VIP naming a missing pool is the error to report first.
        self.check_health()
    }

    /// `[forwarder]`: thread count, batch, queue and pool sizes, waits.
    fn check_forwarder(&self) -> Result<(), Problem> {
        let f = &self.forwarder;
        // The XDP program steers VIP addresses and the prefix groups'
        // prefixes, the latter in a trie of a fixed size: a configuration
        // with more prefixes than it holds would be refused by the daemon
        // at start (`auto` would fall back to AF_PACKET), so it is refused
        // here.
        if matches!(f.driver, Driver::AfXdp | Driver::Xdp) {
            let prefixes = crate::vip::VipMatcher::new(self).prefixes().len();
            if prefixes > netio::afxdp::MAX_VIP_PREFIXES {
                return problem(
                    "forwarder.driver".into(),
                    format!(
                        "\"{}\" steers at most {} prefix-group prefixes (the XDP program's \
                         trie), and the prefix groups have {prefixes}; use driver = \
                         \"af-packet\" or \"auto\"",
                        if f.driver == Driver::Xdp {
                            "xdp"
                        } else {
                            "af-xdp"
                        },
                        netio::afxdp::MAX_VIP_PREFIXES
                    ),
                );
            }
        }
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
        if f.batch_timeout_us > MAX_BATCH_TIMEOUT_US {
            return problem(
                "forwarder.batch_timeout_us".into(),
                format!(
                    "{} is longer than {MAX_BATCH_TIMEOUT_US} (one second: a packet held longer \
                     would be retransmitted)",
                    f.batch_timeout_us
                ),
            );
        }
        if !f.queue_size.is_power_of_two()
            || f.queue_size < f.batch
            || f.queue_size > MAX_QUEUE_SIZE
        {
            return problem(
                "forwarder.queue_size".into(),
                format!(
                    "{} must be a power of two of at least forwarder.batch ({}) and at most \
                     {MAX_QUEUE_SIZE}",
                    f.queue_size, f.batch
                ),
            );
        }
        // Both bounded above: no overflow.
        let needed = f.needed_buffers();
        match f.pool_buffers {
            Some(b) if b > MAX_POOL_BUFFERS => {
                return problem(
                    "forwarder.pool_buffers".into(),
                    format!("{b} is more than the most, {MAX_POOL_BUFFERS}"),
                )
            }
            Some(b) if u64::from(b) < needed => {
                return problem(
                    "forwarder.pool_buffers".into(),
                    format!(
                        "{b} cannot fill the queues of {} packet thread(s): expected at least \
                         {needed} (queue_size {} x (2 x {} + 2)); raise it, or leave it out to \
                         size the pool by the thread count",
                        f.threads,
                        f.queue_size,
                        f.threads.max(1)
                    ),
                )
            }
            None if needed > u64::from(MAX_POOL_BUFFERS) => {
                return problem(
                    "forwarder.queue_size".into(),
                    format!(
                        "{} for {} packet thread(s) needs a pool of {needed} buffers, more than \
                         the most ({MAX_POOL_BUFFERS}); use a smaller queue_size",
                        f.queue_size, f.threads
                    ),
                )
            }
            _ => {}
        }
        if f.frag_table_size == 0 || f.frag_table_size > MAX_FRAG_TABLE_SIZE {
            return problem(
                "forwarder.frag_table_size".into(),
                format!(
                    "{} is out of range; expected 1 to {MAX_FRAG_TABLE_SIZE}",
                    f.frag_table_size
                ),
            );
        }
        if f.frag_timeout_ms > MAX_DURATION_MS {
            return problem(
                "forwarder.frag_timeout_ms".into(),
                format!(
                    "{} is longer than a day ({MAX_DURATION_MS} ms)",
                    f.frag_timeout_ms
                ),
            );
        }
        Ok(())
    }

    /// `[conntrack]`: table size and timeouts.
    fn check_conntrack(&self) -> Result<(), Problem> {
        let c = &self.conntrack;
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
        // Frames go from one station to another: a group address as their
        // source is invalid, as their destination it floods the segment.
        // The source may be zero: it is the interface's own MAC when not
        // configured, and loopback's is zero.
        for (key, m, what) in [
            ("encap.mac", &e.mac, "this load balancer's"),
            ("encap.gateway_mac", &e.gateway_mac, "the next hop's"),
        ] {
            let Some(text) = m else { continue };
            let why = parse_mac(text)
                .filter(|m| key == "encap.gateway_mac" || *m != [0; 6])
                .and_then(not_a_station);
            if let Some(why) = why {
                return problem(
                    key.into(),
                    format!("{text:?} is {why}, not {what} own MAC address"),
                );
            }
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
        for (key, a) in [("encap.source", e.source), ("encap.source6", e.source6)] {
            if let Some(why) = a.and_then(not_a_host) {
                return problem(
                    key.into(),
                    format!(
                        "{} is {why}: backends answer the outer source, so it must be this \
                         load balancer's own unicast address",
                        a.map_or(String::new(), |a| a.to_string())
                    ),
                );
            }
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
            let Some(prefix) = parse_prefix(p) else {
                return problem(
                    format!("tracer.report_to[{i}]"),
                    format!("{p:?} is not a prefix like \"10.1.0.0/24\""),
                );
            };
            // Reports go to unicast hosts only.
            if let Some((what, _, _)) = NOT_UNICAST
                .iter()
                .find(|(_, a, l)| overlaps(prefix, (*a, *l)))
            {
                return problem(
                    format!("tracer.report_to[{i}]"),
                    format!(
                        "{p:?} includes {what}, where no tracer runs; give the prefix of the \
                         tracers' unicast addresses, e.g. \"10.1.0.0/24\""
                    ),
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
        if self.api.token_for_reads == Some(true) && self.api.token_file.is_none() {
            return problem(
                "api.token_for_reads".into(),
                "reads cannot need a token when there is none: set api.token_file".into(),
            );
        }
        Ok(())
    }

    /// How many pools, VIPs, prefix groups, backends, includes and
    /// prefixes the file holds: checked first, so that no other check
    /// walks more than these bounds.
    fn check_counts(&self) -> Result<(), Problem> {
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

    /// `[[pools]]`: unique names, prime table sizes, unique backends with
    /// host addresses, outer sources for their families, drained lists
    /// that name their own backends, and includes that exist, without
    /// cycles, at most [`MAX_INCLUDE_DEPTH`] deep, reaching each address
    /// under one name. Returns how many backends each pool resolves to
    /// (own and included), by position.
    fn check_pools(&self) -> Result<Vec<usize>, Problem> {
        let e = &self.encap;
        // Pools: unique names, valid table sizes, known includes, unique
        // backend names within a pool, outer sources for their families.
        let mut pools: HashMap<&str, usize> = HashMap::with_capacity(self.pools.len());
        for (i, p) in self.pools.iter().enumerate() {
            check_name(|| format!("pools[{i}].name"), &p.name)?;
            if pools.insert(p.name.as_str(), i).is_some() {
                return problem(
                    format!("pools[{i}].name"),
                    format!("{:?} is defined twice", p.name),
                );
            }
            if let Err(err) = maglev::check_table_size(p.table_size) {
                return problem(format!("pools[{i}].table_size"), err.to_string());
            }
            if p.table_size > MAX_TABLE_SIZE {
                return problem(
                    format!("pools[{i}].table_size"),
                    format!(
                        "{} is larger than {MAX_TABLE_SIZE}, the largest table allowed \
                         (the paper uses 65537)",
                        p.table_size
                    ),
                );
            }
            let name_of = BackendConf::display_name;
            let mut names = HashSet::with_capacity(p.backends.len());
            let mut addresses: HashMap<IpAddr, usize> = HashMap::with_capacity(p.backends.len());
            for (j, b) in p.backends.iter().enumerate() {
                if let Some(n) = &b.name {
                    check_name(|| format!("pools[{i}].backends[{j}].name"), n)?;
                }
                if let Some(why) = not_a_host(b.address) {
                    return problem(
                        format!("pools[{i}].backends[{j}].address"),
                        format!("{} is {why}, not a backend's address", b.address),
                    );
                }
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
            // Each entry names own backends (by name, or by address, in
            // which case it names the backend at that address), and no two
            // entries drain the same backend: one pass over the backends
            // and one over the entries.
            if !p.drained.is_empty() {
                let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(p.backends.len());
                for (j, b) in p.backends.iter().enumerate() {
                    if let Some(n) = &b.name {
                        by_name.insert(n.as_str(), j);
                    }
                }
                let mut drained: HashSet<usize> = HashSet::with_capacity(p.drained.len());
                for (j, d) in p.drained.iter().enumerate() {
                    let named = by_name.get(d.as_str()).copied();
                    let at = d
                        .parse::<IpAddr>()
                        .ok()
                        .and_then(|a| addresses.get(&a).copied());
                    if named.is_none() && at.is_none() {
                        return problem(
                            format!("pools[{i}].drained[{j}]"),
                            format!(
                                "{d:?} is not one of pool {:?}'s own backends (by name or address)",
                                p.name
                            ),
                        );
                    }
                    let these = [named, at].into_iter().flatten();
                    if these.clone().any(|b| drained.contains(&b)) {
                        return problem(
                            format!("pools[{i}].drained[{j}]"),
                            format!("{d:?} drains a backend listed earlier in drained"),
                        );
                    }
                    drained.extend(these);
                }
            }
        }
        for (i, p) in self.pools.iter().enumerate() {
            for (j, inc) in p.include.iter().enumerate() {
                if !pools.contains_key(inc.as_str()) {
                    return problem(
                        format!("pools[{i}].include[{j}]"),
                        format!("no pool named {inc:?}"),
                    );
                }
            }
        }
        includes::check_graph(&self.pools, &pools)?;
        let index = self.pool_index();
        let mut resolved: Vec<usize> = self.pools.iter().map(|p| p.backends.len()).collect();
        let mut budget = MAX_RESOLVED;
        for (i, p) in self.pools.iter().enumerate() {
            if p.include.is_empty() {
                continue; // its own backends, checked above
            }
            // Included pools may share a backend (same name: counted once),
            // but not an address under another name.
            let mut addresses: rustc_hash::FxHashMap<IpAddr, &BackendConf> = Default::default();
            let mut twice = None;
            let mut count = 0usize;
            let walked = includes::walk(&index, &p.name, budget, &mut |b, _| {
                count += 1;
                if let Some(other) = addresses.insert(b.address, b) {
                    twice.get_or_insert((other, b));
                }
            });
            match walked {
                Ok(spent) => budget -= spent,
                Err(includes::WalkError::Cycle(c)) => {
                    return problem(format!("pools[{i}].include"), c.to_string())
                }
                Err(includes::WalkError::Budget) => {
                    return problem(
                        format!("pools[{i}].include"),
                        format!(
                            "resolving the includes of this pool and those before it reaches \
                             more than {MAX_RESOLVED} pools and backends in all; share fewer \
                             pools through include"
                        ),
                    )
                }
            }
            if let Some((other, b)) = twice {
                return problem(
                    format!("pools[{i}].include"),
                    format!(
                        "pool {:?} reaches the address {} twice, as backends {:?} and \
                         {:?} (through its includes); list a machine once and give it a weight",
                        p.name,
                        b.address,
                        other.display_name(),
                        b.display_name()
                    ),
                );
            }
            resolved[i] = count;
        }
        Ok(resolved)
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
            // BIRD's symbols are at most 64 characters.
            let bird_name =
                |n: &str| n.len() <= 64 && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if b.protocol.is_empty() || !bird_name(&b.protocol) {
                return problem(
                    "bgp.protocol".into(),
                    format!("{:?} is not a BIRD protocol name", b.protocol),
                );
            }
            // Empty: no IPv6 protocol in this BIRD.
            if !bird_name(&b.protocol6) || b.protocol6 == b.protocol {
                return problem(
                    "bgp.protocol6".into(),
                    format!(
                        "{:?} is not a BIRD protocol name other than bgp.protocol (empty: no IPv6 announcements)",
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
            let min_quiet = 2 * crate::datapath::LIVE_INTERVAL_MS;
            if b.drain_quiet_ms > MAX_DRAIN_MS
                || (b.drain_ms > 0
                    && (b.drain_quiet_ms < min_quiet || b.drain_quiet_ms > b.drain_ms))
            {
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
            if a.is_unspecified()
                || a.is_multicast()
                || matches!(a, IpAddr::V4(v4) if v4.is_broadcast())
            {
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
        if h.kind == CheckKind::Fastpath && h.port == 0 {
            return problem(
                "fleet.health.port".into(),
                format!(
                    "the peers' fastpath answers on a UDP port: give one (default {PEER_PORT})"
                ),
            );
        }
        check_health_conf("fleet.health", h)?;
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
                             serves pool {:?} (directly or through an include)",
                            p.name
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// `[[prefix_groups]]`: unique names, at least one prefix, prefixes of
    /// one family that fit the cluster prefix length.
    fn check_prefix_groups(&self) -> Result<(), Problem> {
        let mut groups = HashMap::new();
        for (i, g) in self.prefix_groups.iter().enumerate() {
            check_name(|| format!("prefix_groups[{i}].name"), &g.name)?;
            if groups.insert(g.name.as_str(), i).is_some() {
                return problem(
                    format!("prefix_groups[{i}].name"),
                    format!("{:?} is defined twice", g.name),
                );
            }
            if g.prefixes.is_empty() {
                return problem(
                    format!("prefix_groups[{i}].prefixes"),
                    "needs at least one prefix, like \"74.125.0.0/16\"".into(),
                );
            }
            let mut family = None;
            for (j, p) in g.prefixes.iter().enumerate() {
                match parse_prefix(p) {
                    None => return problem(format!("prefix_groups[{i}].prefixes[{j}]"), format!("{p:?} is not a prefix like 74.125.0.0/16")),
                    Some((a, _)) if *family.get_or_insert(a.is_ipv4()) != a.is_ipv4() => {
                        return problem(
                            format!("prefix_groups[{i}].prefixes[{j}]"),
                            format!("{p:?} is not of the family of the group's first prefix; a group's clusters are all IPv4 or all IPv6"),
                        )
                    }
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

    /// `[[vips]]`: unique names and keys, host addresses, known pools and
    /// prefix groups (a suffix of the group's family), tables large enough
    /// for their pools. `resolved` is each pool's backend count, by
    /// position ([`Config::check_pools`]).
    fn check_vips(&self, resolved: &[usize]) -> Result<(), Problem> {
        let mut pools: HashMap<&str, usize> = HashMap::with_capacity(self.pools.len());
        for (i, p) in self.pools.iter().enumerate() {
            pools.entry(p.name.as_str()).or_insert(i);
        }
        let groups: HashMap<&str, &PrefixGroupConf> = self
            .prefix_groups
            .iter()
            .map(|g| (g.name.as_str(), g))
            .collect();
        let mut vip_names = HashSet::new();
        let mut vip_keys = HashSet::new();
        for (i, v) in self.vips.iter().enumerate() {
            check_name(|| format!("vips[{i}].name"), &v.name)?;
            if !vip_names.insert(v.name.as_str()) {
                return problem(
                    format!("vips[{i}].name"),
                    format!("{:?} is defined twice", v.name),
                );
            }
            let Some(&pool) = pools.get(v.pool.as_str()) else {
                return problem(
                    format!("vips[{i}].pool"),
                    format!("no pool named {:?}", v.pool),
                );
            };
            let key = match (&v.address, &v.prefix_group, &v.suffix) {
                (Some(a), None, None) => {
                    if let Some(why) = not_a_host(*a) {
                        return problem(
                            format!("vips[{i}].address"),
                            format!("{a} is {why}, not an address clients can reach a service at"),
                        );
                    }
                    format!("{a}")
                }
                (None, Some(g), Some(s)) => {
                    let Some(group) = groups.get(g.as_str()) else {
                        return problem(
                            format!("vips[{i}].prefix_group"),
                            format!("no prefix group named {g:?}"),
                        );
                    };
                    let v4 = group
                        .prefixes
                        .first()
                        .and_then(|p| parse_prefix(p))
                        .is_some_and(|(a, _)| a.is_ipv4());
                    if s.is_ipv4() != v4 {
                        return problem(
                            format!("vips[{i}].suffix"),
                            format!(
                                "{s} is not of the family of prefix group {g:?} ({}); \
                                 a suffix completes the group's prefixes",
                                if v4 { "IPv4" } else { "IPv6" }
                            ),
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
            let (members, size) = (resolved[pool], self.pools[pool].table_size);
            if members as u64 > size {
                return problem(
                    format!("vips[{i}].pool"),
                    format!(
                        "pool {:?} has {members} backends, more than its table_size {size}",
                        v.pool,
                    ),
                );
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
                "bgp": c.bgp.is_some().then_some(true),
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
        // Without [bgp] at start the daemon runs no BGP controller, so
        // adding the section waits for a restart (removing it withdraws
        // the VIPs at once).
        if old["bgp"].is_null() && !new["bgp"].is_null() {
            keys.push("bgp".to_string());
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
    /// the first VIP with an address whose pool is `pool` or includes it
    /// (one walk over the VIPs and pools: [`Config::tunnel_vips`]).
    pub fn tunnel_vip(&self, pool: &str) -> Option<IpAddr> {
        self.tunnel_vips().get(pool).copied()
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
    /// drained weights as 0. Each pool is entered once, with no recursion:
    /// linear in the pools, includes and backends it reaches.
    pub fn members_as_written(
        &self,
        index: &HashMap<&str, &PoolConf>,
        pool: &str,
    ) -> Result<Vec<(BackendConf, bool)>, IncludeCycle> {
        let mut out = Vec::new();
        includes::walk(index, pool, usize::MAX, &mut |b, drained| {
            out.push((b.clone(), drained));
        })
        .map_err(|e| match e {
            includes::WalkError::Cycle(c) => c,
            // Cannot happen: each pool is entered once, so the walk spends
            // at most the pools and backends there are.
            includes::WalkError::Budget => IncludeCycle(format!("{pool} (too large to resolve)")),
        })?;
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
        // A tracer reports only to prefixes it is given, never the world.
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
        // An API anyone can reach needs a token.
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
        assert!(Config::load(std::path::Path::new("/nonexistent.toml"))
            .unwrap_err()
            .to_string()
            .contains("/nonexistent.toml"));
    }

    #[test]
    fn gateway_mac_is_optional_and_checked_when_set() {
        // Unset: no placeholder in the configuration; the daemon resolves
        // the next hop itself.
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

    #[test]
    fn fleet_lists_this_load_balancer_once_in_one_family() {
        let fleet = |peers: &str| format!("{GOOD}\n[fleet]\npeers = [{peers}]\nname = \"lb1\"\n");
        let c = Config::parse(&fleet("\"10.0.0.2\", \"10.0.0.1\", \"10.0.0.3\""), "t").unwrap();
        let f = c.fleet.as_ref().unwrap();
        assert_eq!(f.own(&c.encap), Some(ip("10.0.0.1")));
        // Peers are checked by their own fastpath, not at BGP's port.
        assert_eq!(
            (f.health.kind, f.health.port),
            (CheckKind::Fastpath, PEER_PORT)
        );
        let e = err(&GOOD.replace(
            "include = [\"extra\"]",
            "include = [\"extra\"]\nhealth = { kind = \"fastpath\", port = 80 }",
        ));
        assert_eq!(e.key, "pools[0].health.kind", "{e}");
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

    /// Runs `f` on a thread with a 256 KiB stack: validation must not need
    /// more, whatever the configuration's depth.
    fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    /// Pools `p0` including `p1` ... including `p{n-1}`, which has the one
    /// backend; a VIP over `p0`.
    fn chain(n: usize) -> String {
        let mut t = String::from("[encap]\nsource = \"10.0.0.1\"\n");
        for i in 0..n {
            t += &format!("[[pools]]\nname = \"p{i}\"\n");
            if i + 1 < n {
                t += &format!("include = [\"p{}\"]\n", i + 1);
            } else {
                t += "backends = [{ address = \"10.1.0.1\" }]\n";
            }
        }
        t + "[[vips]]\nname = \"v\"\naddress = \"192.0.2.80\"\nprotocol = \"tcp\"\npool = \"p0\"\n"
    }

    /// Pools including each other 6,000 levels deep once overflowed the
    /// stack of the thread that validated them (the daemon died on a
    /// reload). The walks keep their path on the heap, and a chain deeper
    /// than 64 levels is an error naming it.
    #[test]
    fn deep_includes_are_an_error_not_a_stack_overflow() {
        let e = on_small_stack(|| Config::parse(&chain(6000), "t").unwrap_err());
        assert_eq!(e.key, "pools[0].include", "{e}");
        assert!(
            e.problem.contains("more than 64 levels") && e.problem.contains("p0 -> p1"),
            "{e}"
        );
        // 64 levels (65 pools) is the most.
        let c = on_small_stack(|| Config::parse(&chain(65), "t").unwrap());
        assert_eq!(c.flatten("p0").unwrap().len(), 1);
        let e = err(&chain(66));
        assert!(e.problem.contains("(65 levels)"), "{e}");
        // A chain met through a pool walked before is measured too.
        let text = chain(66).replace(
            "[[pools]]\nname = \"p0\"\n",
            "[[pools]]\nname = \"top\"\ninclude = [\"p2\"]\n[[pools]]\nname = \"p0\"\n",
        );
        let e = err(&text);
        assert!(e.problem.contains("64 levels"), "{e}");
        // Hand-built, unvalidated: flattening a deep chain walks it
        // without recursion.
        let deep = on_small_stack(|| {
            let mut c = Config::from_toml(&chain(20_000), "t").unwrap();
            c.pools.reverse();
            c.flatten("p0").unwrap().len()
        });
        assert_eq!(deep, 1);
    }

    /// Pools in `levels` levels of two, each including both of the next
    /// level: 2^levels paths from the top, 2 x levels pools.
    fn diamond(levels: usize) -> String {
        let mut t = String::from("[encap]\nsource = \"10.0.0.1\"\n");
        for l in 0..levels {
            for side in ["a", "b"] {
                t += &format!("[[pools]]\nname = \"l{l}{side}\"\n");
                if l + 1 < levels {
                    t += &format!("include = [\"l{n}a\", \"l{n}b\"]\n", n = l + 1);
                }
                t += &format!(
                    "backends = [{{ address = \"10.1.{l}.{}\" }}]\n",
                    if side == "a" { 1 } else { 2 }
                );
            }
        }
        t + "[[vips]]\nname = \"v\"\naddress = \"192.0.2.80\"\nprotocol = \"tcp\"\npool = \"l0a\"\n\
             [[pools]]\nname = \"h\"\ninclude = [\"l0a\"]\nhealth = { kind = \"tcp\", port = 80, via = \"tunnel\" }\n\
             [[vips]]\nname = \"w\"\naddress = \"192.0.2.81\"\nprotocol = \"tcp\"\npool = \"h\"\n"
    }

    /// 80 pools including each other as a diamond once made validation
    /// walk 2^levels paths (check-config never ended; a reload froze the
    /// control plane). Each walk enters a pool once.
    #[test]
    fn diamonds_are_walked_in_linear_time() {
        let started = std::time::Instant::now();
        let c = on_small_stack(|| Config::parse(&diamond(60), "t").unwrap());
        assert_eq!(c.flatten("l0a").unwrap().len(), 119);
        assert_eq!(c.tunnel_vip("l59b"), Some(ip("192.0.2.80")));
        let index = c.pool_index();
        assert_eq!(c.members_as_written(&index, "l1b").unwrap().len(), 117);
        let e = on_small_stack(|| Config::parse(&diamond(80), "t").unwrap_err());
        assert!(e.problem.contains("64 levels"), "{e}");
        // Unvalidated, 200 levels: 2^200 paths, 400 pools.
        let big = on_small_stack(|| {
            let c = Config::from_toml(&diamond(200), "t").unwrap();
            (c.flatten("l0a").unwrap().len(), c.tunnel_vip("l199a"))
        });
        assert_eq!(big, (399, Some(ip("192.0.2.80"))));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        // Many pools sharing one large pool resolve to pools x backends:
        // bounded, and the bound is an error naming the pool where it ran out.
        let mut wide = String::from(
            "[encap]\nsource = \"10.0.0.1\"\n[[pools]]\nname = \"big\"\nbackends = [\n",
        );
        for b in 0..4000 {
            wide += &format!("{{ address = \"10.1.{}.{}\" }},\n", b / 250, b % 250 + 1);
        }
        wide += "]\n";
        for p in 0..600 {
            wide += &format!("[[pools]]\nname = \"w{p}\"\ninclude = [\"big\"]\n");
        }
        let started = std::time::Instant::now();
        let e = on_small_stack(move || Config::parse(&wide, "t").unwrap_err());
        assert!(
            e.key.starts_with("pools[") && e.problem.contains(&MAX_RESOLVED.to_string()),
            "{e}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // A cycle is still named from the pool it comes back to.
        let cyclic = diamond(5).replace(
            "[[pools]]\nname = \"l4b\"\n",
            "[[pools]]\nname = \"l4b\"\ninclude = [\"l2a\"]\n",
        );
        let e = err(&cyclic);
        assert!(
            e.key == "pools[4].include" && e.problem.contains("l2a -> l3a -> l4b -> l2a"),
            "{e}"
        );
    }

    /// Sizes once had no upper bound (a table of 2^31-1 slots, a
    /// queue whose buffers overflow `usize`, unbounded connection and
    /// fragment tables), and names could be of any length. Each is refused naming its
    /// key; and what the sizes imply together must fit the machine.
    #[test]
    fn sizes_and_names_are_bounded() {
        for (from, to, key) in [
            ("name = \"web\"\n", "name = \"web\"\ntable_size = 2147483647\n", "pools[0].table_size"),
            ("name = \"web\"\n", "name = \"web\"\ntable_size = 500000003\n", "pools[0].table_size"),
            ("[encap]", "[forwarder]\nqueue_size = 4611686018427387904\n[encap]", "forwarder.queue_size"),
            ("[encap]", "[forwarder]\nqueue_size = 131072\npool_buffers = 4000000\n[encap]", "forwarder.queue_size"),
            ("[encap]", "[forwarder]\npool_buffers = 4294967295\n[encap]", "forwarder.pool_buffers"),
            ("[encap]", "[forwarder]\nfrag_table_size = 1099511627776\n[encap]", "forwarder.frag_table_size"),
            ("[encap]", "[forwarder]\nfrag_timeout_ms = 9223372036854775807\n[encap]", "forwarder.frag_timeout_ms"),
            ("[encap]", "[forwarder]\nbatch_timeout_us = 9223372036854775807\n[encap]", "forwarder.batch_timeout_us"),
            ("[encap]", "[conntrack]\nsize = 1099511627776\n[encap]", "conntrack.size"),
            ("[encap]", "[conntrack]\ntcp_timeout_s = 9e6\n[encap]", "conntrack.tcp_timeout_s"),
            ("[encap]", "[bgp]\nvips_file = \"/run/v\"\ndrain_ms = 0\ndrain_quiet_ms = 9223372036854775807\n[encap]", "bgp.drain_quiet_ms"),
        ] {
            let text = GOOD.replace(from, to);
            assert_ne!(text, GOOD);
            let e = err(&text);
            assert_eq!(e.key, key, "{to}: {e}");
        }
        // The largest table is accepted.
        Config::parse(
            &GOOD.replace(
                "name = \"web\"\n",
                "name = \"web\"\ntable_size = 16777213\n",
            ),
            "t",
        )
        .unwrap();
        // Names: 255 bytes at most, printable.
        let long = "n".repeat(65_536);
        for (from, to, key) in [
            (
                "name = \"web\"",
                format!("name = \"{long}\""),
                "pools[0].name",
            ),
            (
                "name = \"http\"",
                format!("name = \"{long}\""),
                "vips[0].name",
            ),
            (
                "name = \"third\"",
                format!("name = \"{long}\""),
                "pools[1].backends[0].name",
            ),
            (
                "name = \"third\"",
                "name = \"a\\nb\"".to_string(),
                "pools[1].backends[0].name",
            ),
            ("name = \"http\"", "name = \"\"".to_string(), "vips[0].name"),
        ] {
            let e = err(&GOOD.replace(from, &to));
            assert_eq!(e.key, key, "{e}");
            assert!(e.problem.len() < 200, "the message repeats the name: {e}");
        }
        let ok = "x".repeat(255);
        Config::parse(
            &GOOD.replace("name = \"http\"", &format!("name = \"{ok}\"")),
            "t",
        )
        .unwrap();
        // Everything within bounds, together more than the machine has.
        let big = Config::parse(
            &GOOD.replace(
                "[encap]",
                "[forwarder]\nthreads = 64\npool_buffers = 200000\n[conntrack]\nsize = 16777216\n[encap]",
            ),
            "t",
        )
        .unwrap();
        let estimate = big.memory_estimate();
        assert!(estimate.total() > 50 << 30, "{estimate:?}");
        let machine = MachineMemory {
            bytes: 8 << 30,
            source: "a test's".into(),
        };
        let (key, why) = estimate.fits(&machine).unwrap_err();
        assert_eq!(key, "conntrack.size");
        assert!(
            why.contains("8.0 GiB")
                && why.contains("conntrack.size")
                && why.contains("64 packet threads"),
            "{why}"
        );
        let small = Config::parse(GOOD, "t").unwrap().memory_estimate();
        small.fits(&machine).unwrap();
        assert!(small.total() < 256 << 20, "{small:?}");
        // Every part says what sizes it; the tables are counted per pool.
        let parts: Vec<&str> = small.parts.iter().map(|p| p.key).collect();
        assert_eq!(
            parts,
            [
                "forwarder.pool_buffers",
                "forwarder.queue_size",
                "conntrack.size",
                "forwarder.frag_table_size",
                "pools.table_size"
            ]
        );
        assert_eq!(
            small.parts[4].bytes,
            2 * (65_537 * 4 + 65_537_u64.div_ceil(8))
        );
    }

    /// Every driver serves prefix-group VIPs (the XDP program steers the
    /// groups' prefixes); with more prefixes than its trie holds, the XDP
    /// drivers are refused here as the daemon would refuse them at start.
    #[test]
    fn xdp_drivers_take_prefix_group_vips_up_to_the_steering_trie() {
        let groups = |prefixes: &str| {
            format!(
                "[[prefix_groups]]\nname = \"g\"\nprefixes = [{prefixes}]\n\
                 cluster_prefix_len = 28\n[[vips]]\nname = \"svc\"\nprefix_group = \"g\"\n\
                 suffix = \"0.0.0.1\"\nport = 443\nprotocol = \"tcp\"\npool = \"web\"\n"
            )
        };
        let with = |driver: &str, prefixes: &str| {
            format!("{GOOD}\n{}", groups(prefixes)).replace(
                "[encap]",
                &format!("[forwarder]\ndriver = \"{driver}\"\n[encap]"),
            )
        };
        let many = |n: usize| {
            (0..n)
                .map(|i| format!("\"74.{}.{}.0/24\"", i / 256, i % 256))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let most = netio::afxdp::MAX_VIP_PREFIXES;
        for d in ["af-xdp", "xdp", "auto", "af-packet"] {
            Config::parse(&with(d, "\"74.125.0.0/16\""), "t").unwrap();
            Config::parse(&with(d, &many(most)), "t").unwrap();
        }
        for d in ["af-xdp", "xdp"] {
            let e = err(&with(d, &many(most + 1)));
            assert_eq!(e.key, "forwarder.driver", "{e}");
            assert!(e.problem.contains(&format!("have {}", most + 1)), "{e}");
        }
        for d in ["auto", "af-packet"] {
            Config::parse(&with(d, &many(most + 1)), "t").unwrap();
        }
    }

    #[test]
    fn addresses_are_of_the_right_class() {
        for bad in ["0.0.0.0", "255.255.255.255", "224.0.0.1", "127.0.0.1"] {
            let e = err(&GOOD.replace(
                "\"10.1.0.1\" }, { address",
                &format!("\"{bad}\" }}, {{ address"),
            ));
            assert_eq!(e.key, "pools[0].backends[0].address", "{bad}: {e}");
            let e = err(&GOOD.replace("192.0.2.80", bad));
            assert_eq!(e.key, "vips[0].address", "{bad}: {e}");
            let e = err(&GOOD.replace("source = \"10.0.0.1\"", &format!("source = \"{bad}\"")));
            assert_eq!(e.key, "encap.source", "{bad}: {e}");
        }
        let v6 = |a: &str| {
            GOOD.replace(
                "source = \"10.0.0.1\"",
                "source = \"10.0.0.1\"\nsource6 = \"fd00::1\"",
            )
            .replace("192.0.2.80", a)
        };
        Config::parse(&v6("2001:db8::80"), "t").unwrap();
        for bad in ["::", "ff02::1", "::1", "::ffff:127.0.0.1"] {
            assert_eq!(err(&v6(bad)).key, "vips[0].address", "{bad}");
        }
        for mac in [
            "ff:ff:ff:ff:ff:ff",
            "01:00:5e:00:00:01",
            "00:00:00:00:00:00",
        ] {
            let e = err(&GOOD.replace("[encap]", &format!("[encap]\ngateway_mac = \"{mac}\"")));
            assert_eq!(e.key, "encap.gateway_mac", "{mac}: {e}");
            if mac != "00:00:00:00:00:00" {
                let e = err(&GOOD.replace("[encap]", &format!("[encap]\nmac = \"{mac}\"")));
                assert_eq!(e.key, "encap.mac", "{mac}: {e}");
            }
        }
        // Loopback's MAC, which the daemon takes as its own on `lo`.
        Config::parse(
            &GOOD.replace("[encap]", "[encap]\nmac = \"00:00:00:00:00:00\""),
            "t",
        )
        .unwrap();
        for (prefix, ok) in [
            ("0.0.0.0/0", false),
            ("224.0.0.0/4", false),
            ("255.255.255.255/32", false),
            ("128.0.0.0/1", false),
            ("::/0", false),
            ("ff02::/16", false),
            ("10.1.0.0/24", true),
            ("fd00:9::/64", true),
        ] {
            let text = GOOD.replace(
                "[encap]",
                &format!("[tracer]\nenabled = true\nreport_to = [\"{prefix}\"]\n[encap]"),
            );
            match Config::parse(&text, "t") {
                Ok(_) => assert!(ok, "{prefix} accepted"),
                Err(e) => assert!(!ok && e.key == "tracer.report_to[0]", "{prefix}: {e}"),
            }
        }
        let group = |prefixes: &str, suffix: &str| {
            format!(
                "{GOOD}\n[[prefix_groups]]\nname = \"a\"\nprefixes = [{prefixes}]\ncluster_prefix_len = 24\n\
                 [[vips]]\nname = \"s\"\nprefix_group = \"a\"\nsuffix = \"{suffix}\"\nprotocol = \"udp\"\npool = \"web\"\n"
            )
        };
        Config::parse(&group("\"74.125.0.0/16\"", "0.0.0.1"), "t").unwrap();
        assert_eq!(
            err(&group("\"74.125.0.0/16\"", "::1")).key,
            "vips[1].suffix"
        );
        assert_eq!(
            err(&group("\"74.125.0.0/16\", \"2001:db8::/32\"", "0.0.0.1")).key,
            "prefix_groups[0].prefixes[1]"
        );
        // An empty group once let a cluster length of 200 through, which
        // overflowed the matcher's arithmetic.
        let e =
            err(&group("", "0.0.0.1")
                .replace("cluster_prefix_len = 24", "cluster_prefix_len = 200"));
        assert_eq!(e.key, "prefix_groups[0].prefixes", "{e}");
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

    /// A directory of files for the checks beyond the text, removed when
    /// dropped.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let d = std::env::temp_dir().join(format!("fastpath-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }

        fn write(&self, name: &str, text: &str) -> std::path::PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, text).unwrap();
            p
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Any thread count from 0 to 64 starts with the default sizes: the
    /// pool follows the count. A pool written in the file is kept, and
    /// must hold the queues of the count, whether the file or `--threads`
    /// sets it; the refusal says what would.
    #[test]
    fn the_pool_follows_the_thread_count() {
        let with = |forwarder: &str| {
            GOOD.replace("[encap]", &format!("[forwarder]\n{forwarder}\n[encap]"))
        };
        let mut last = 0;
        for threads in 0..=64usize {
            let c = Config::parse(&with(&format!("threads = {threads}")), "t").unwrap();
            let f = &c.forwarder;
            assert_eq!(f.pool_buffers, None);
            assert!(
                u64::from(f.pool_buffers()) >= f.needed_buffers(),
                "{threads}"
            );
            assert!(f.pool_buffers() >= DEFAULT_POOL_BUFFERS && f.pool_buffers() >= last);
            last = f.pool_buffers();
        }
        assert_eq!(last, 1024 * 130);
        let e = err(&with("threads = 8\npool_buffers = 16384"));
        assert_eq!(e.key, "forwarder.pool_buffers");
        assert!(
            e.problem.contains("at least 18432") && e.problem.contains("8 packet thread"),
            "{e}"
        );
        let c = Config::parse(&with("threads = 2\npool_buffers = 100000"), "t").unwrap();
        assert_eq!(c.forwarder.pool_buffers(), 100_000);
        // The deepest queues for 64 threads would need more than a pool
        // may hold: the queue size is what to change.
        let e = err(&with("threads = 64\nqueue_size = 65536"));
        assert_eq!(e.key, "forwarder.queue_size", "{e}");

        let dir = Scratch::new("threads");
        let file = dir.write("lb.toml", GOOD);
        let name = file.display().to_string();
        let checked = Config::load(&file)
            .unwrap()
            .with_threads(32, &name)
            .unwrap();
        assert_eq!(checked.config.forwarder.threads, 32);
        assert_eq!(checked.config.forwarder.pool_buffers(), 1024 * 66);
        assert_eq!(
            checked.memory.parts[0].bytes,
            1024 * 66 * (2048 + 1),
            "the memory is estimated for the new count"
        );
        let file = dir.write("small.toml", &with("pool_buffers = 8192"));
        let e = Config::load(&file)
            .unwrap()
            .with_threads(32, &name)
            .unwrap_err();
        assert_eq!(e.key, "forwarder.pool_buffers");
        assert!(
            e.problem.contains("32 packet thread") && e.problem.contains("--threads 32"),
            "{e}"
        );
    }

    /// A missing, short, directory or `/dev/zero` token file, and
    /// `vips_file = "/etc/passwd"`, passed check-config. `Config::load`
    /// (check-config, the start, every reload) reads them as the daemon
    /// would.
    #[test]
    fn files_a_configuration_names_are_checked_when_it_loads() {
        let dir = Scratch::new("load");
        let token = dir.write("token", "  a-long-enough-secret-token \nnext\n");
        let short = dir.write("short", "short\n");
        let big = dir.write(
            "big",
            &format!("a-long-enough-secret-token\n{}", "x".repeat(5000)),
        );
        let load = |api: String, bgp: String| {
            let text = GOOD.replace("[encap]", &format!("{api}{bgp}[encap]"));
            let f = dir.write("lb.toml", &text);
            Config::load(&f)
        };
        let api = |t: &std::path::Path| {
            format!(
                "[api]\nlisten = \"0.0.0.0:9180\"\ntoken_file = \"{}\"\n",
                t.display()
            )
        };
        let checked = load(api(&token), String::new()).unwrap();
        assert!(checked.text.contains("token_file"));
        assert_eq!(read_token(&token).unwrap(), "a-long-enough-secret-token");
        for t in [
            dir.0.join("missing"),
            short,
            big,
            dir.0.clone(),
            std::path::PathBuf::from("/dev/zero"),
        ] {
            let e = load(api(&t), String::new()).unwrap_err();
            assert_eq!(e.key, "api.token_file", "{}: {e}", t.display());
            assert!(e.problem.contains(&t.display().to_string()), "{e}");
        }
        let bgp = |p: &std::path::Path| format!("[bgp]\nvips_file = \"{}\"\n", p.display());
        for ok in [
            dir.0.join("not-yet"),
            dir.write("written", VIPS_FILE_HEADER),
            dir.write("placeholder", "# filled in by fastpath\n"),
            dir.write("empty", ""),
        ] {
            load(String::new(), bgp(&ok)).unwrap();
        }
        for bad in [
            std::path::PathBuf::from("/etc/passwd"),
            dir.write("bird.conf", "router id 10.0.0.1;\n# fastpath\n"),
            dir.0.clone(),
        ] {
            let e = load(String::new(), bgp(&bad)).unwrap_err();
            assert_eq!(e.key, "bgp.vips_file", "{}: {e}", bad.display());
        }
        // The configuration itself: a regular file of bounded size.
        for bad in [std::path::Path::new("/dev/zero"), &dir.0] {
            let e = Config::load(bad).unwrap_err();
            assert_eq!(e.key, "(file)", "{e}");
        }
        // What the machine has: found here, and larger than a small
        // configuration's estimate.
        let m = machine_memory().expect("Linux says how much memory there is");
        assert!(m.bytes > checked.memory.total(), "{m:?}");
        assert!(checked.machine.is_some());
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

        /// `tunnel_vips` (one walk) agrees with the definition (the first
        /// VIP with an address whose pool reaches the pool, by a search
        /// of its own per VIP) on any include graph, cycles and unknown
        /// pools included.
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
            let reaches = |from: &str, target: &str| {
                let mut todo = vec![from.to_string()];
                let mut seen = HashSet::new();
                while let Some(p) = todo.pop() {
                    if p == target {
                        return true;
                    }
                    if seen.insert(p.clone()) {
                        for q in cfg.pools.iter().filter(|q| q.name == p) {
                            todo.extend(q.include.iter().cloned());
                        }
                    }
                }
                false
            };
            for p in &cfg.pools {
                let want = cfg
                    .vips
                    .iter()
                    .filter(|v| reaches(&v.pool, &p.name))
                    .find_map(|v| v.address);
                proptest::prop_assert_eq!(all.get(p.name.as_str()).copied(), want);
                proptest::prop_assert_eq!(cfg.tunnel_vip(&p.name), want);
            }
        }
    }
}
