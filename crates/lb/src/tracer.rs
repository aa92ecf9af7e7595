//! Packet-tracer (Maglev paper, section 4.4): probes that load balancers
//! recognize, forward as usual, and report on to an address the probe names.
//!
//! # The marker
//!
//! A probe is an ordinary TCP or UDP packet to a VIP (any addresses, ports
//! and flags the sender chooses, so it hashes like the traffic it stands
//! for) whose transport payload begins with this marker, all integers in
//! network byte order:
//!
//! ```text
//!  offset  size  field
//!       0     8  magic "FPTRACE1"
//!       8     8  probe id (the sender's; echoed in the report)
//!      16     1  family of the report address: 4 or 6
//!      17     1  reserved, 0
//!      18     2  report port (not 0)
//!      20  4/16  report address (IPv4 or IPv6; not unspecified, multicast,
//!                loopback, link-local or broadcast; and reports go only to
//!                the prefixes of `[tracer] report_to`)
//! ```
//!
//! 24 bytes for an IPv4 report address, 36 for IPv6; anything may follow.
//! In a fragmented probe the marker is in the first fragment (the one with
//! the transport header). A UDP probe to a `quic` VIP may carry a QUIC
//! header first, to see how its connection ID routes: the marker then
//! follows the header's connection IDs (after the source connection ID of
//! a long header; after the destination connection ID of a short one, as
//! long as the configuration at its codepoint says, so a short header
//! whose codepoint has none cannot carry a marker: probe those with a long
//! header). A marker at the start of such a payload is read as QUIC too:
//! it is a short header whose connection ID begins "PTRACE1" (codepoint
//! 2), and is reported as what it is. A payload that does not begin with the magic is
//! not a probe; one that does and is malformed past it is counted
//! (`trace_invalid`) and forwarded without a report.
//!
//! # The report
//!
//! Each load balancer that recognizes a probe sends one UDP datagram to the
//! report address: a JSON [`Report`] (machine name, packet thread,
//! connection-table hit or miss, configuration generation, the VIP's table
//! fingerprint, the backend chosen, and whether the probe was a fragment
//! redirected to a peer or arrived redirected from one; for a `quic` VIP,
//! the QUIC decision: routed by connection ID (codepoint, server ID), the
//! server ID of a backend that is down, or why the connection ID does not
//! route, and the fallback that chose instead).
//!
//! # Cost on the datapath
//!
//! A packet thread looks for the magic only in TCP and UDP packets that
//! carry a transport header; a probe costs a token from a per-load-balancer
//! rate limiter ([`Tracer`], lock-free) and a lock-free push of a small
//! [`Record`] into a bounded queue (`crossbeam_queue::ArrayQueue`: packet
//! threads never wait for each other or for the reporter, and a push
//! between two other pushes is not lost, as a `try_lock` push was). Nothing
//! blocks and nothing calls the system: a probe over the rate is counted
//! (`trace_rate_limited`), one that finds the queue full is counted
//! (`trace_queue_full`). The
//! daemon drains the queue on its own thread, turns records into reports
//! and sends them (non-blocking; failures are counted, never retried).
//!
//! [`Probe`] builds probe frames (whole or as IPv4/IPv6 fragments) for the
//! `fastpath lb trace` command and for tests.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use packet::build::{Frame, L4};
use packet::parse::Parsed;
use packet::tcp::flags::SYN;
use packet::{proto, FlowKey};
use serde::{Deserialize, Serialize};

use crate::config::TracerConf;
use crate::tables::Tables;

/// The first bytes of every probe's transport payload.
pub const MAGIC: [u8; 8] = crate::xdp::abi::TRACE_MAGIC;
/// Marker length with an IPv4 report address.
pub const MARKER_LEN_V4: usize = 24;
/// Marker length with an IPv6 report address.
pub const MARKER_LEN_V6: usize = 36;
/// Records the queue between packet threads and the daemon holds.
pub const QUEUE_LEN: usize = 1024;
/// Ethernet header length of built frames (no VLAN tag).
const ETHERNET_LEN: usize = 14;
/// Largest report datagram (a report is a few hundred bytes).
pub const MAX_REPORT: usize = 4096;

/// What can be wrong with a marker, a probe to build, or a report.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The payload does not begin with [`MAGIC`]: not a probe.
    #[error("not a probe (the payload does not begin with the marker's magic)")]
    NotAProbe,
    /// The payload ends inside the marker.
    #[error("marker truncated: {len} bytes, {need} needed")]
    Truncated {
        /// Payload length.
        len: usize,
        /// Marker length for its family.
        need: usize,
    },
    /// The family byte is neither 4 nor 6.
    #[error("marker: report address family {0} (expected 4 or 6)")]
    Family(u8),
    /// The report address cannot receive a report.
    #[error("marker: cannot report to {0} (port 0, unspecified, multicast, loopback, link-local or broadcast)")]
    ReportAddress(SocketAddr),
    /// A probe's source and VIP are of different families.
    #[error("probe: source {src} and VIP {vip} are of different families")]
    Families {
        /// Source address.
        src: IpAddr,
        /// VIP.
        vip: IpAddr,
    },
    /// The probe is too short to be cut into that many fragments.
    #[error("probe: {len} bytes after the IP header cannot make {pieces} fragments (at least 2, each of 8 bytes or more)")]
    Fragments {
        /// Bytes after the IP header.
        len: usize,
        /// Fragments asked for.
        pieces: usize,
    },
    /// A report datagram is not a report.
    #[error("report: {0}")]
    Report(#[source] serde_json::Error),
}

/// The marker a probe carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    /// The sender's probe id.
    pub id: u64,
    /// Where reports go.
    pub report_to: SocketAddr,
}

impl Marker {
    /// The marker's bytes (24 or 36).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MARKER_LEN_V6);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&self.id.to_be_bytes());
        b.push(if self.report_to.is_ipv4() { 4 } else { 6 });
        b.push(0);
        b.extend_from_slice(&self.report_to.port().to_be_bytes());
        match self.report_to.ip() {
            IpAddr::V4(a) => b.extend_from_slice(&a.octets()),
            IpAddr::V6(a) => b.extend_from_slice(&a.octets()),
        }
        b
    }

    /// Reads the marker at the start of a transport payload.
    pub fn parse(payload: &[u8]) -> Result<Marker, TraceError> {
        if !has_magic(payload) {
            return Err(TraceError::NotAProbe);
        }
        let need = |need: usize| {
            if payload.len() < need {
                Err(TraceError::Truncated {
                    len: payload.len(),
                    need,
                })
            } else {
                Ok(())
            }
        };
        need(MARKER_LEN_V4)?;
        let mut id = [0u8; 8];
        id.copy_from_slice(&payload[8..16]);
        let port = u16::from_be_bytes([payload[18], payload[19]]);
        let ip = match payload[16] {
            4 => {
                let mut a = [0u8; 4];
                a.copy_from_slice(&payload[20..24]);
                IpAddr::V4(Ipv4Addr::from(a))
            }
            6 => {
                need(MARKER_LEN_V6)?;
                let mut a = [0u8; 16];
                a.copy_from_slice(&payload[20..36]);
                IpAddr::V6(Ipv6Addr::from(a))
            }
            f => return Err(TraceError::Family(f)),
        };
        let report_to = SocketAddr::new(ip, port);
        // Reports go to one host: not to link-local, broadcast, the
        // reserved class E (240/4) or "this network" (0/8) either.
        let link_local = match ip {
            IpAddr::V4(a) => {
                a.is_link_local() || a.is_broadcast() || a.octets()[0] >= 240 || a.octets()[0] == 0
            }
            IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
        };
        if port == 0 || ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() || link_local {
            return Err(TraceError::ReportAddress(report_to));
        }
        Ok(Marker {
            id: u64::from_be_bytes(id),
            report_to,
        })
    }
}

#[inline]
fn has_magic(payload: &[u8]) -> bool {
    payload.len() >= MAGIC.len() && payload[..MAGIC.len()] == MAGIC
}

/// The transport payload of a parsed TCP or UDP packet that carries its
/// transport header (not ICMP, not a later fragment), if it is in `frame`.
pub fn payload<'f>(frame: &'f [u8], p: &Parsed) -> Option<&'f [u8]> {
    if p.icmp_quote.is_some() || p.fragment.is_some_and(|f| !f.is_first()) {
        return None;
    }
    let end = (p.l3_offset + p.l3_len).min(frame.len());
    let start = match p.flow.proto {
        proto::UDP => p.l4_offset + 8,
        proto::TCP => p.l4_offset + usize::from(*frame.get(p.l4_offset + 12)? >> 4) * 4,
        _ => return None,
    };
    frame.get(start..end)
}

/// Looks for a marker in a parsed frame: `None` when it is not a probe (the
/// common case, decided by the first 8 payload bytes), else the marker or
/// why it is malformed.
#[inline]
pub fn find(frame: &[u8], p: &Parsed) -> Option<Result<Marker, TraceError>> {
    find_at(frame, p, 0)
}

/// [`find`] with the marker `at` octets into the transport payload (after
/// a QUIC header's connection IDs, [`crate::quic::Read::header_len`]).
#[inline]
pub fn find_at(frame: &[u8], p: &Parsed, at: usize) -> Option<Result<Marker, TraceError>> {
    let pl = payload(frame, p)?.get(at..)?;
    has_magic(pl).then(|| Marker::parse(pl))
}

/// What a `quic` VIP's routing made of a datagram's connection ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuicOutcome {
    /// Routed by it, to the backend chosen.
    Routed,
    /// It names this backend, which is down (the fallback chose instead).
    ServerDown(u32),
    /// It does not route, for this reason (the fallback chose).
    Miss(crate::quic::Miss),
}

/// The QUIC step of a probe's decision, as a packet thread records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuicStep {
    /// What became of the connection ID.
    pub outcome: QuicOutcome,
    /// Its codepoint and server ID (as [`quic_lb::server_id_number`]),
    /// when it decoded.
    pub server_id: Option<(u8, u128)>,
}

/// The QUIC step in a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuicReport {
    /// "routed" (by the connection ID), "server_down" (it names a backend
    /// that is down), or why it does not route, by its counter's name
    /// (`not_quic`, `codepoint_reserved`, `codepoint_unknown`,
    /// `cid_too_short`, `cid_length_mismatch`, `server_id_unknown`).
    pub decision: String,
    /// The connection ID's config rotation codepoint, when it decoded.
    pub codepoint: Option<u8>,
    /// The server ID it carries, in hex, when it decoded.
    pub server_id: Option<String>,
    /// The backend that server ID names, when that backend is down.
    pub down_backend: Option<String>,
    /// Unless routed by connection ID: what chose the backend instead,
    /// "connection table" (an entry for the 5-tuple) or "maglev" (none).
    pub fallback: Option<String>,
}

/// A connection-table lookup's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lookup {
    /// The flow had an entry.
    Hit,
    /// It had none (Maglev's table chose).
    Miss,
}

/// What a fragment had to do with other load balancers (section 4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Redirect {
    /// Neither redirected nor arrived redirected.
    #[default]
    No,
    /// This load balancer sent it on to the peer at this address.
    To([u8; 16]),
    /// It arrived redirected by a peer (whose address, when known).
    Arrived(Option<[u8; 16]>),
}

/// What a packet thread knows about a probe, queued for the daemon: plain
/// data, no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The marker.
    pub marker: Marker,
    /// Packet thread (or queue) index.
    pub thread: u16,
    /// The probe's 5-tuple.
    pub flow: FlowKey,
    /// Whether the probe was a (first) fragment.
    pub fragment: bool,
    /// The connection-table lookup, if one was made.
    pub conntrack: Option<Lookup>,
    /// The tables' generation.
    pub generation: u64,
    /// VIP index in those tables, and its table fingerprint, if matched.
    pub vip: Option<(u32, u64)>,
    /// Backend id, if one was chosen.
    pub backend: Option<u32>,
    /// Fragment redirection.
    pub redirect: Redirect,
    /// For a datagram to a `quic` VIP, what its connection ID said.
    pub quic: Option<QuicStep>,
}

/// The report a load balancer sends for a probe (one JSON object in one
/// UDP datagram).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The probe id from the marker.
    pub probe: u64,
    /// The reporting load balancer (`[tracer] name`, `[fleet] name` or the
    /// host name).
    pub machine: String,
    /// The packet thread that handled the probe.
    pub thread: u16,
    /// The probe's source.
    pub src: SocketAddr,
    /// Its destination (the VIP).
    pub vip: SocketAddr,
    /// "tcp" or "udp".
    pub proto: String,
    /// The VIP's name in the configuration, if matched.
    pub vip_name: Option<String>,
    /// Whether the probe was a fragment (the first, with the marker).
    pub fragment: bool,
    /// Connection-table hit or miss (absent when no lookup was made).
    pub conntrack: Option<Lookup>,
    /// Configuration generation of the tables that decided.
    pub generation: u64,
    /// The VIP's table fingerprint, 16 hex digits (as in `/status`).
    pub fingerprint: Option<String>,
    /// The backend chosen (name).
    pub backend: Option<String>,
    /// Its address.
    pub backend_address: Option<IpAddr>,
    /// The peer this load balancer redirected the fragment to.
    pub redirected_to: Option<IpAddr>,
    /// Whether the probe arrived redirected by a peer.
    pub arrived_redirected: bool,
    /// That peer, when known.
    pub redirected_from: Option<IpAddr>,
    /// For a datagram to a `quic` VIP: how its connection ID routed
    /// (absent otherwise, and from load balancers that do not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<QuicReport>,
}

/// A fingerprint as reports and `/status` print it.
pub fn fingerprint_hex(f: u64) -> String {
    format!("{f:016x}")
}

impl Report {
    /// The report for a record, with names from `tables` (backend ids are
    /// stable; the VIP is named only if the tables are the generation that
    /// decided, as indexes may move on reload).
    pub fn new(r: &Record, machine: &str, tables: &Tables) -> Report {
        let ip = |a: &[u8; 16]| packet::flow::to_ip(a);
        let backend = r.backend.and_then(|b| tables.backends.get(b as usize));
        Report {
            probe: r.marker.id,
            machine: machine.to_string(),
            thread: r.thread,
            src: SocketAddr::new(ip(&r.flow.src), r.flow.src_port),
            vip: SocketAddr::new(ip(&r.flow.dst), r.flow.dst_port),
            proto: match r.flow.proto {
                proto::TCP => "tcp".into(),
                proto::UDP => "udp".into(),
                p => p.to_string(),
            },
            vip_name: r
                .vip
                .filter(|_| tables.generation == r.generation)
                .and_then(|(i, _)| tables.vips.get(i as usize))
                .map(|v| v.name.clone()),
            fragment: r.fragment,
            conntrack: r.conntrack,
            generation: r.generation,
            fingerprint: r.vip.map(|(_, f)| fingerprint_hex(f)),
            backend: backend.map(|b| b.name.clone()),
            backend_address: backend.map(|b| ip(&b.addr)),
            redirected_to: match r.redirect {
                Redirect::To(a) => Some(ip(&a)),
                _ => None,
            },
            arrived_redirected: matches!(r.redirect, Redirect::Arrived(_)),
            redirected_from: match r.redirect {
                Redirect::Arrived(a) => a.map(|a| ip(&a)),
                _ => None,
            },
            quic: r.quic.map(|q| QuicReport {
                decision: match q.outcome {
                    QuicOutcome::Routed => "routed".into(),
                    QuicOutcome::ServerDown(_) => "server_down".into(),
                    QuicOutcome::Miss(m) => m.name().into(),
                },
                codepoint: q.server_id.map(|(c, _)| c),
                server_id: q.server_id.map(|(_, s)| {
                    quic_lb::server_id_of_number(s)
                        .as_bytes()
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect()
                }),
                down_backend: match q.outcome {
                    QuicOutcome::ServerDown(b) => {
                        tables.backends.get(b as usize).map(|b| b.name.clone())
                    }
                    _ => None,
                },
                fallback: match (q.outcome, r.conntrack) {
                    (QuicOutcome::Routed, _) | (_, None) => None,
                    (_, Some(Lookup::Hit)) => Some("connection table".into()),
                    (_, Some(Lookup::Miss)) => Some("maglev".into()),
                },
            }),
        }
    }

    /// The datagram's bytes.
    pub fn to_json(&self) -> Vec<u8> {
        // A struct of strings, numbers and addresses always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a report datagram.
    pub fn parse(datagram: &[u8]) -> Result<Report, TraceError> {
        serde_json::from_slice(datagram).map_err(TraceError::Report)
    }
}

/// What became of a probe offered to the [`Tracer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Queued for a report.
    Queued,
    /// Over the rate: no report.
    RateLimited,
    /// The queue was full: no report.
    QueueFull,
    /// The report address is outside `[tracer] report_to`: no report.
    NotAllowed,
}

/// Whether `ip` lies in `net/len` (families must match).
fn in_prefix(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    let (a, b, bits): (u128, u128, u32) = match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u32::from(a).into(), u32::from(b).into(), 32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
        _ => return false,
    };
    let len = u32::from(len).min(bits);
    if len == 0 {
        return true;
    }
    let shift = bits - len;
    (a >> shift) == (b >> shift)
}

/// Whether `ip` is one host of `net/len` rather than the prefix as a
/// whole: not its network address (IPv4, and IPv6's subnet-router anycast)
/// nor its IPv4 broadcast address. Prefixes of one or two addresses
/// (/31, /32; /127, /128) are all hosts.
fn is_host_of(ip: IpAddr, len: u8) -> bool {
    let (a, bits): (u128, u32) = match ip {
        IpAddr::V4(a) => (u32::from(a).into(), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    };
    let host_bits = bits.saturating_sub(u32::from(len));
    if host_bits < 2 {
        return true;
    }
    let host_mask = (1u128 << host_bits) - 1;
    let host = a & host_mask;
    host != 0 && (ip.is_ipv6() || host != host_mask)
}

/// A token bucket as GCRA (the "virtual scheduling" form): one atomic, the
/// theoretical arrival time of the next report; lock-free.
#[derive(Debug)]
struct Bucket {
    interval_ns: u64,
    tolerance_ns: u64,
    tat_ns: AtomicU64,
}

impl Bucket {
    fn new(rate_per_s: u32, burst: u32) -> Self {
        let interval_ns = 1_000_000_000 / u64::from(rate_per_s.max(1));
        Bucket {
            interval_ns,
            tolerance_ns: interval_ns * u64::from(burst.max(1) - 1),
            tat_ns: AtomicU64::new(0),
        }
    }

    fn admit(&self, now_ns: u64) -> bool {
        let mut tat = self.tat_ns.load(Ordering::Relaxed);
        loop {
            let start = tat.max(now_ns);
            if start - now_ns > self.tolerance_ns {
                return false;
            }
            match self.tat_ns.compare_exchange_weak(
                tat,
                start + self.interval_ns,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(t) => tat = t,
            }
        }
    }
}

/// One load balancer's tracer: the rate limiter and the queue between its
/// packet threads (producers) and the daemon's reporting thread, plus the
/// reporter's counters.
#[derive(Debug)]
pub struct Tracer {
    /// Prefixes reports may go to (all when empty: tests).
    allowed: Vec<(IpAddr, u8)>,
    bucket: Bucket,
    queue: ArrayQueue<Record>,
    /// Reports sent (counted by the reporter).
    pub sent: AtomicU64,
    /// Reports that could not be sent (counted by the reporter; never
    /// retried).
    pub send_errors: AtomicU64,
}

impl Tracer {
    /// A tracer admitting `rate_per_s` reports a second in bursts of
    /// `burst`, queueing at most `capacity`.
    pub fn new(rate_per_s: u32, burst: u32, capacity: usize) -> Self {
        Tracer {
            allowed: Vec::new(),
            bucket: Bucket::new(rate_per_s, burst),
            queue: ArrayQueue::new(capacity.max(1)),
            sent: AtomicU64::new(0),
            send_errors: AtomicU64::new(0),
        }
    }

    /// The tracer `[tracer]` asks for (none when disabled).
    pub fn from_config(c: &TracerConf) -> Option<Arc<Tracer>> {
        c.enabled.then(|| {
            let mut t = Tracer::new(c.rate_per_s, c.burst, QUEUE_LEN);
            t.allowed = c
                .report_to
                .iter()
                .filter_map(|p| crate::config::parse_prefix(p))
                .collect();
            Arc::new(t)
        })
    }

    /// Whether a report may go to `ip`: one host inside one of `[tracer]
    /// report_to`, not a prefix's network or broadcast address (a report
    /// sent there would reach every host of the prefix, or a router).
    pub fn may_report_to(&self, ip: IpAddr) -> bool {
        self.allowed.is_empty()
            || self
                .allowed
                .iter()
                .any(|&(net, len)| in_prefix(ip, net, len) && is_host_of(ip, len))
    }

    /// A packet thread offers a record at `now_ms` (the datapath's clock).
    /// Never blocks: over the rate, or with the queue full, the record is
    /// refused.
    pub fn offer(&self, r: Record, now_ms: u64) -> Offer {
        // Before the bucket: probes to elsewhere cost no report's token.
        if !self.may_report_to(r.marker.report_to.ip()) {
            return Offer::NotAllowed;
        }
        if !self.bucket.admit(now_ms.saturating_mul(1_000_000)) {
            return Offer::RateLimited;
        }
        // Into slots reserved at creation: no allocation, no lock.
        match self.queue.push(r) {
            Ok(()) => Offer::Queued,
            Err(_) => Offer::QueueFull,
        }
    }

    /// Moves every queued record to `out` (the reporter). Records pushed
    /// while this runs are moved too or left for the next call.
    pub fn take(&self, out: &mut Vec<Record>) {
        out.extend(std::iter::from_fn(|| self.queue.pop()).take(self.queue.capacity()));
    }
}

/// Transport of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeProto {
    /// TCP (a SYN, as a new connection's first packet).
    Tcp,
    /// UDP.
    Udp,
}

/// A probe to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Source address and port.
    pub src: SocketAddr,
    /// The VIP and port.
    pub vip: SocketAddr,
    /// TCP or UDP.
    pub proto: ProbeProto,
    /// The marker.
    pub marker: Marker,
    /// Bytes after the marker (so that fragments have room).
    pub padding: usize,
    /// A QUIC header before the marker (UDP to a `quic` VIP): how its
    /// connection ID routes is reported.
    pub quic: Option<QuicProbe>,
}

/// The QUIC header a probe carries before its marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuicProbe {
    /// A short header (1-RTT: what an established connection sends) with
    /// this destination connection ID; the load balancer finds the marker
    /// after as many octets as the configuration at its codepoint says.
    Short {
        /// The destination connection ID.
        dcid: Vec<u8>,
    },
    /// A long header of QUIC version 1 (a Handshake packet's form) with
    /// this destination connection ID and an empty source one.
    Long {
        /// The destination connection ID (at most 255 octets).
        dcid: Vec<u8>,
    },
}

impl QuicProbe {
    /// The header's octets.
    pub fn header(&self) -> Vec<u8> {
        match self {
            // Short form, fixed bit set (RFC 9000 section 17.3.1).
            QuicProbe::Short { dcid } => {
                let mut b = vec![0x40];
                b.extend_from_slice(dcid);
                b
            }
            // Long form, fixed bit, type Handshake (RFC 9000 section
            // 17.2.4), version 1, the DCID, an empty SCID.
            QuicProbe::Long { dcid } => {
                let mut b = vec![0xe0, 0, 0, 0, 1, dcid.len().min(255) as u8];
                b.extend_from_slice(&dcid[..dcid.len().min(255)]);
                b.push(0);
                b
            }
        }
    }
}

impl Probe {
    /// The probe's transport payload: the QUIC header if any, the marker
    /// and zero padding.
    pub fn payload(&self) -> Vec<u8> {
        let mut b = self
            .quic
            .as_ref()
            .map(QuicProbe::header)
            .unwrap_or_default();
        b.extend_from_slice(&self.marker.encode());
        b.resize(b.len() + self.padding, 0);
        b
    }

    fn frame_repr(&self) -> Result<Frame, TraceError> {
        let (s, v) = (self.src.ip(), self.vip.ip());
        if s.is_ipv4() != v.is_ipv4() {
            return Err(TraceError::Families { src: s, vip: v });
        }
        let pl = self.payload();
        let (sp, dp) = (self.src.port(), self.vip.port());
        Ok(match self.proto {
            ProbeProto::Tcp => Frame::tcp(s, v, sp, dp, SYN, &pl),
            ProbeProto::Udp => Frame::udp(s, v, sp, dp, &pl),
        })
    }

    /// The probe as one Ethernet frame (IPv4 without "don't fragment").
    pub fn frame(&self) -> Result<Vec<u8>, TraceError> {
        let mut f = self.frame_repr()?;
        if let packet::build::Ip::V4(r) = &mut f.ip {
            r.dont_frag = false;
        }
        Ok(f.to_bytes())
    }

    /// The probe as IP packets for a raw socket (no Ethernet header): one
    /// packet, or with `pieces` of 2 or more, that many fragments of the
    /// datagram `ident` (see [`Probe::fragments`]).
    pub fn ip_packets(&self, pieces: usize, ident: u32) -> Result<Vec<Vec<u8>>, TraceError> {
        let frames = if pieces <= 1 {
            vec![self.frame()?]
        } else {
            self.fragments(pieces, ident)?
        };
        // Built frames carry no VLAN tag: a 14-byte Ethernet header.
        Ok(frames
            .into_iter()
            .map(|f| f[ETHERNET_LEN..].to_vec())
            .collect())
    }

    /// The probe cut into `pieces` fragments (IPv4 fragments, or IPv6 with
    /// a fragment header), as Ethernet frames in order; the first carries
    /// the transport header and the marker. `ident` identifies the
    /// datagram.
    pub fn fragments(&self, pieces: usize, ident: u32) -> Result<Vec<Vec<u8>>, TraceError> {
        let f = self.frame_repr()?;
        let whole = f.to_bytes();
        let p =
            packet::parse_frame(&whole).map_err(|_| TraceError::Fragments { len: 0, pieces })?;
        let l4 = &whole[p.l4_offset..p.l3_offset + p.l3_len];
        // Every fragment but the last carries a multiple of 8 bytes; the
        // first holds the transport header and the whole marker, the rest
        // is shared evenly.
        let hdr = l4.len() - self.payload().len();
        let first = (hdr + self.payload().len() - self.padding).div_ceil(8) * 8;
        let rest = l4.len().saturating_sub(first);
        let step = (rest / pieces.saturating_sub(1).max(1)) / 8 * 8;
        if pieces < 2 || rest == 0 || (pieces > 2 && step < 8) {
            return Err(TraceError::Fragments {
                len: l4.len(),
                pieces,
            });
        }
        let mut cuts: Vec<usize> = (0..pieces - 1).map(|k| first + k * step).collect();
        cuts.insert(0, 0);
        cuts.push(l4.len());
        let proto = f.protocol();
        let mut out = Vec::with_capacity(pieces);
        for w in cuts.windows(2) {
            let (a, b) = (w[0], w[1]);
            let piece = Frame::new(
                self.src.ip(),
                self.vip.ip(),
                L4::Raw(proto, l4[a..b].to_vec()),
            )
            .fragment(ident, a as u16, b < l4.len());
            out.push(piece.to_bytes());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_go_only_to_the_configured_prefixes() {
        let mut c = TracerConf {
            enabled: true,
            report_to: vec!["10.1.0.0/24".into(), "2001:db8::/32".into()],
            ..TracerConf::default()
        };
        let t = Tracer::from_config(&c).unwrap();
        assert!(t.may_report_to("10.1.0.77".parse().unwrap()));
        assert!(!t.may_report_to("10.1.1.1".parse().unwrap()));
        assert!(!t.may_report_to("192.0.2.1".parse().unwrap()));
        assert!(t.may_report_to("2001:db8:1::9".parse().unwrap()));
        assert!(!t.may_report_to("2001:db9::1".parse().unwrap()));
        c.enabled = false;
        assert!(Tracer::from_config(&c).is_none());
        // Loopback, link-local, broadcast, class E and "this network" are
        // refused in the marker.
        for ip in [
            "127.0.0.1",
            "169.254.1.1",
            "255.255.255.255",
            "240.0.0.1",
            "0.1.2.3",
            "::1",
            "fe80::1",
        ] {
            let m = Marker {
                id: 1,
                report_to: SocketAddr::new(ip.parse().unwrap(), 9999),
            };
            assert!(
                matches!(
                    Marker::parse(&m.encode()),
                    Err(TraceError::ReportAddress(_))
                ),
                "{ip}"
            );
        }
    }
    /// Reports go to one host: a prefix's network and broadcast
    /// addresses (IPv6: its subnet-router anycast) are inside it but are
    /// refused; prefixes of one or two addresses are all hosts.
    #[test]
    fn reports_go_only_to_unicast_hosts_of_the_prefixes() {
        let c = TracerConf {
            enabled: true,
            report_to: vec![
                "10.1.0.0/24".into(),
                "10.2.0.0/31".into(),
                "10.3.0.7/32".into(),
                "2001:db8::/64".into(),
                "2001:db8:1::/127".into(),
            ],
            ..TracerConf::default()
        };
        let t = Tracer::from_config(&c).unwrap();
        for (ip, ok) in [
            ("10.1.0.0", false),
            ("10.1.0.255", false),
            ("10.1.0.1", true),
            ("10.1.0.254", true),
            ("10.2.0.0", true),
            ("10.2.0.1", true),
            ("10.3.0.7", true),
            ("2001:db8::", false),
            ("2001:db8::1", true),
            ("2001:db8::ffff:ffff:ffff:ffff", true),
            ("2001:db8:1::", true),
            ("2001:db8:1::1", true),
        ] {
            assert_eq!(t.may_report_to(ip.parse().unwrap()), ok, "{ip}");
        }
    }

    /// Packet threads offering at once lose nothing while the queue has
    /// room (a `try_lock` queue refused a record whenever two pushes met),
    /// and a full queue refuses exactly the overflow.
    #[test]
    fn concurrent_offers_are_all_queued_until_the_queue_is_full() {
        const THREADS: u16 = 4;
        const EACH: u64 = 2_000;
        for capacity in [THREADS as usize * EACH as usize, 1_000] {
            let t = Arc::new(Tracer::new(u32::MAX, u32::MAX, capacity));
            let barrier = Arc::new(std::sync::Barrier::new(usize::from(THREADS)));
            let outcomes: Vec<Vec<Offer>> = (0..THREADS)
                .map(|thread| {
                    let (t, barrier) = (Arc::clone(&t), Arc::clone(&barrier));
                    std::thread::spawn(move || {
                        barrier.wait();
                        (0..EACH)
                            .map(|i| {
                                let r = Record {
                                    marker: Marker {
                                        id: u64::from(thread) << 32 | i,
                                        report_to: "192.0.2.7:9999".parse().unwrap(),
                                    },
                                    thread,
                                    flow: FlowKey::default(),
                                    fragment: false,
                                    conntrack: None,
                                    generation: 1,
                                    vip: None,
                                    backend: None,
                                    redirect: Redirect::No,
                                    quic: None,
                                };
                                t.offer(r, 0)
                            })
                            .collect()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            let queued = outcomes.iter().flatten().filter(|o| **o == Offer::Queued);
            let refused = outcomes
                .iter()
                .flatten()
                .filter(|o| **o == Offer::QueueFull);
            let total = u64::from(THREADS) * EACH;
            assert_eq!(queued.count(), capacity.min(total as usize), "{capacity}");
            assert_eq!(
                refused.count() as u64,
                total - capacity.min(total as usize) as u64
            );
            let mut out = Vec::new();
            t.take(&mut out);
            assert_eq!(out.len(), capacity.min(total as usize));
            let mut ids: Vec<u64> = out.iter().map(|r| r.marker.id).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), out.len(), "no record twice");
            t.take(&mut out);
            assert_eq!(out.len(), capacity.min(total as usize), "drained");
        }
    }

    use proptest::prelude::*;

    fn marker(to: &str) -> Marker {
        Marker {
            id: 0x0102_0304_0506_0708,
            report_to: to.parse().unwrap(),
        }
    }

    #[test]
    fn markers_round_trip_in_both_families() {
        for to in ["192.0.2.7:9999", "[2001:db8::7]:5"] {
            let m = marker(to);
            let b = m.encode();
            assert_eq!(
                b.len(),
                if m.report_to.is_ipv4() {
                    MARKER_LEN_V4
                } else {
                    MARKER_LEN_V6
                }
            );
            assert_eq!(Marker::parse(&b).unwrap(), m);
            let mut longer = b.clone();
            longer.extend_from_slice(b"anything");
            assert_eq!(Marker::parse(&longer).unwrap(), m);
            assert!(matches!(
                Marker::parse(&b[..b.len() - 1]),
                Err(TraceError::Truncated { .. })
            ));
        }
    }

    #[test]
    fn bad_markers_are_refused_by_reason() {
        let mut b = marker("192.0.2.7:9999").encode();
        b[7] = b'2';
        assert!(matches!(Marker::parse(&b), Err(TraceError::NotAProbe)));
        let mut b = marker("192.0.2.7:9999").encode();
        b[16] = 5;
        assert!(matches!(Marker::parse(&b), Err(TraceError::Family(5))));
        for to in ["192.0.2.7:0", "0.0.0.0:9", "224.0.0.1:9", "[::]:9"] {
            let b = marker(to).encode();
            assert!(
                matches!(Marker::parse(&b), Err(TraceError::ReportAddress(_))),
                "{to}"
            );
        }
    }

    #[test]
    fn probes_parse_and_fragments_carry_the_marker_first() {
        for (src, vip) in [
            ("10.1.0.5:40000", "198.18.0.10:80"),
            ("[fd00::5]:40000", "[2001:db8:18::10]:80"),
        ] {
            for proto in [ProbeProto::Tcp, ProbeProto::Udp] {
                let probe = Probe {
                    src: src.parse().unwrap(),
                    vip: vip.parse().unwrap(),
                    proto,
                    marker: marker("192.0.2.7:9999"),
                    padding: 64,
                    quic: None,
                };
                let f = probe.frame().unwrap();
                let p = packet::parse_frame(&f).unwrap();
                assert_eq!(find(&f, &p).unwrap().unwrap(), probe.marker);
                for pieces in [2, 3] {
                    let frags = probe.fragments(pieces, 77).unwrap();
                    assert_eq!(frags.len(), pieces);
                    let mut total = 0;
                    for (i, fr) in frags.iter().enumerate() {
                        let p = packet::parse_frame(fr).unwrap();
                        let fi = p.fragment.expect("a fragment");
                        assert_eq!(fi.offset as usize, total);
                        assert_eq!(fi.more, i + 1 < pieces);
                        total += p.l3_offset + p.l3_len - p.l4_offset;
                        let m = find(fr, &p);
                        assert_eq!(m.is_some(), i == 0, "marker only in the first");
                    }
                    let whole = packet::parse_frame(&f).unwrap();
                    assert_eq!(total, whole.l3_offset + whole.l3_len - whole.l4_offset);
                }
                let ips = probe.ip_packets(2, 9).unwrap();
                assert_eq!(ips.len(), 2);
                assert_eq!(ips[0][0] >> 4, if probe.vip.is_ipv4() { 4 } else { 6 });
                assert_eq!(probe.ip_packets(1, 9).unwrap(), vec![f[14..].to_vec()]);
                assert!(probe.fragments(1, 1).is_err());
                assert!(probe.fragments(1000, 1).is_err());
            }
        }
    }

    #[test]
    fn the_bucket_admits_its_burst_then_its_rate() {
        let b = Bucket::new(10, 3);
        let t0 = 5_000_000_000;
        assert_eq!((0..10).filter(|_| b.admit(t0)).count(), 3);
        // 100 ms later: one more token.
        assert_eq!((0..10).filter(|_| b.admit(t0 + 100_000_000)).count(), 1);
        // A quiet second refills the burst, not more.
        assert_eq!((0..10).filter(|_| b.admit(t0 + 2_000_000_000)).count(), 3);
    }

    #[test]
    fn reports_round_trip_as_json() {
        let r = Report {
            probe: 7,
            machine: "lb1".into(),
            thread: 1,
            src: "10.1.0.5:40000".parse().unwrap(),
            vip: "198.18.0.10:80".parse().unwrap(),
            proto: "tcp".into(),
            vip_name: Some("web".into()),
            fragment: false,
            conntrack: Some(Lookup::Miss),
            generation: 3,
            fingerprint: Some(fingerprint_hex(0xabc)),
            backend: Some("b1".into()),
            backend_address: Some("10.2.0.1".parse().unwrap()),
            redirected_to: None,
            arrived_redirected: false,
            redirected_from: None,
            quic: None,
        };
        let j = r.to_json();
        assert!(j.len() < MAX_REPORT);
        assert_eq!(Report::parse(&j).unwrap(), r);
        assert!(String::from_utf8_lossy(&j).contains("\"conntrack\":\"miss\""));
        // No QUIC step: none on the wire (what a load balancer that does
        // not say sends reads the same).
        assert!(!String::from_utf8_lossy(&j).contains("quic"));
        let q = Report {
            conntrack: None,
            quic: Some(QuicReport {
                decision: "routed".into(),
                codepoint: Some(2),
                server_id: Some("a1a1".into()),
                down_backend: None,
                fallback: None,
            }),
            ..r
        };
        assert_eq!(Report::parse(&q.to_json()).unwrap(), q);
        assert!(Report::parse(b"{}").is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_payloads_never_panic_the_parser(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            with_magic in any::<bool>(),
        ) {
            let mut b = bytes;
            if with_magic {
                let mut m = MAGIC.to_vec();
                m.extend_from_slice(&b);
                b = m;
            }
            match Marker::parse(&b) {
                Ok(m) => prop_assert_eq!(Marker::parse(&m.encode()).unwrap(), m),
                Err(TraceError::NotAProbe) => prop_assert!(!b.starts_with(&MAGIC)),
                Err(_) => prop_assert!(b.starts_with(&MAGIC)),
            }
        }

        #[test]
        fn arbitrary_frames_never_panic_find(
            bytes in proptest::collection::vec(any::<u8>(), 0..128),
            at in 0usize..128,
        ) {
            // A valid UDP frame whose payload is overwritten from `at`.
            let mut f = Frame::udp(
                "10.0.0.1".parse().unwrap(),
                "198.18.0.1".parse().unwrap(),
                1,
                2,
                &[0u8; 64],
            )
            .to_bytes();
            let at = (42 + at).min(f.len());
            let n = bytes.len().min(f.len() - at);
            f[at..at + n].copy_from_slice(&bytes[..n]);
            if let Ok(p) = packet::parse_frame(&f) {
                let _ = find(&f, &p);
            }
        }
    }
}
