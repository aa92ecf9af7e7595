//! `fastpath lb trace`: packet-tracer (Maglev paper, section 4.4). Sends
//! probes (marker format in `lb::tracer`) through the network on a raw
//! socket, collects the load balancers' reports, and prints the path of
//! each probe.

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use lb::tracer::{Marker, Probe, ProbeProto, QuicProbe, Report};

use crate::Format;

/// Transport of the probes.
#[derive(Clone, Copy, ValueEnum)]
pub enum Proto {
    /// TCP SYNs (a new connection's first packet).
    Tcp,
    /// UDP datagrams.
    Udp,
}

/// `fastpath lb trace`.
#[derive(Args)]
pub struct TraceArgs {
    /// The VIP and port to probe.
    #[arg(long)]
    vip: SocketAddr,
    /// Transport of the probes.
    #[arg(long, value_enum)]
    proto: Proto,
    /// Source address of the probes (default: the address this machine
    /// uses to reach the VIP). Replies from backends go there.
    #[arg(long)]
    src: Option<IpAddr>,
    /// Source port of the first probe (default: random, 20000-59999); probe
    /// i uses this plus i, so that probes hash to different load balancers
    /// and backends.
    #[arg(long)]
    sport: Option<u16>,
    /// Probes to send.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    count: u32,
    /// Send each probe as 2 fragments (the marker in the first), to see
    /// which load balancer handles them and whether one redirects them to
    /// the fleet peer responsible (section 4.3).
    #[arg(long)]
    fragment: bool,
    /// For a `quic` VIP (UDP): a QUIC destination connection ID in hex
    /// (e.g. from `fastpath lb quic-cid encode`) put before the marker, so
    /// that reports say how it routes: by its server ID (codepoint, server
    /// ID, backend), to a backend that is down, or why not and what chose
    /// instead. In a short header unless --quic-long; a short header's
    /// marker is found only when the load balancer has a configuration at
    /// the connection ID's codepoint.
    #[arg(long, value_parser = parse_dcid)]
    quic_dcid: Option<Vec<u8>>,
    /// Send --quic-dcid in a long header (QUIC version 1, Handshake): the
    /// marker is found whatever the codepoint.
    #[arg(long, requires = "quic_dcid")]
    quic_long: bool,
    /// Where reports come back: an address of this machine the load
    /// balancers can reach, and a UDP port to listen on.
    #[arg(long)]
    report_to: SocketAddr,
    /// How long to collect reports after the last probe, milliseconds.
    #[arg(long, default_value_t = 1000)]
    wait_ms: u64,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// A destination connection ID in hex: 1 to 20 octets (QUIC version 1's
/// longest).
fn parse_dcid(text: &str) -> Result<Vec<u8>, String> {
    let octets = quic_lb::parse_hex(text).map_err(|e| e.to_string())?;
    if octets.is_empty() || octets.len() > quic_lb::MAX_CID_LEN {
        return Err(format!(
            "a connection ID is 1 to {} octets, {} given",
            quic_lb::MAX_CID_LEN,
            octets.len()
        ));
    }
    Ok(octets)
}

/// One probe and what came back for it.
#[derive(serde::Serialize)]
struct Traced {
    /// Probe id (in the marker).
    probe: u64,
    /// Its source.
    src: SocketAddr,
    /// Whether it was sent as fragments.
    fragmented: bool,
    /// Reports, in arrival order.
    reports: Vec<Report>,
}

/// What `trace` found. The JSON document: vip, proto, report_to,
/// unreported, ignored, and probes[]{probe, src, fragmented, reports[]}
/// with each report as the load balancer sent it (`lb::tracer::Report`).
#[derive(serde::Serialize)]
struct Output {
    vip: SocketAddr,
    proto: &'static str,
    report_to: SocketAddr,
    probes: Vec<Traced>,
    /// Probes no load balancer reported.
    unreported: usize,
    /// Datagrams received that were not reports on these probes.
    ignored: usize,
}

/// The source address the kernel picks to reach `vip`.
fn source_for(vip: SocketAddr) -> anyhow::Result<IpAddr> {
    let any: SocketAddr = if vip.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let s = UdpSocket::bind(any)?;
    s.connect(vip)
        .with_context(|| format!("no route to {vip} to pick a source address (give --src)"))?;
    Ok(s.local_addr()?.ip())
}

/// A raw IP socket whose packets carry their own IP header (IPPROTO_RAW
/// implies IP_HDRINCL, for IPv6 too).
fn raw_socket(v4: bool) -> anyhow::Result<rustix::fd::OwnedFd> {
    use rustix::net::{ipproto, socket, AddressFamily, SocketType};
    let family = if v4 {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    socket(family, SocketType::RAW, Some(ipproto::RAW))
        .context("opening a raw IP socket (needs root or CAP_NET_RAW)")
}

fn random_u64() -> u64 {
    RandomState::new().hash_one(std::process::id())
}

/// Runs `fastpath lb trace`.
pub fn run(a: TraceArgs) -> anyhow::Result<()> {
    let rx = UdpSocket::bind(a.report_to)
        .with_context(|| format!("listening for reports on {}", a.report_to))?;
    let report_to = rx.local_addr()?;
    let src = match a.src {
        Some(s) => s,
        None => source_for(a.vip)?,
    };
    if src.is_ipv4() != a.vip.is_ipv4() {
        bail!("--src {src} and --vip {} are of different families", a.vip);
    }
    let proto = match a.proto {
        Proto::Tcp => ProbeProto::Tcp,
        Proto::Udp => ProbeProto::Udp,
    };
    if a.quic_dcid.is_some() && matches!(a.proto, Proto::Tcp) {
        bail!("--quic-dcid probes a quic VIP: QUIC runs over UDP (--proto udp)");
    }
    if a.quic_dcid.is_some() && a.fragment {
        bail!(
            "--quic-dcid with --fragment: a fragment routes by its 5-tuple, never by connection ID"
        );
    }
    let quic = a.quic_dcid.clone().map(|dcid| {
        if a.quic_long {
            QuicProbe::Long { dcid }
        } else {
            QuicProbe::Short { dcid }
        }
    });
    let raw = raw_socket(a.vip.is_ipv4())?;
    let base_id = random_u64();
    let sport0 = a.sport.unwrap_or(20_000 + (random_u64() % 40_000) as u16);
    let mut probes = Vec::with_capacity(a.count as usize);
    for i in 0..a.count {
        let id = base_id.wrapping_add(u64::from(i));
        // Port 0 is skipped: it means "no port" to many.
        let sport = match sport0.wrapping_add(i as u16) {
            0 => 1,
            p => p,
        };
        let probe = Probe {
            src: SocketAddr::new(src, sport),
            vip: a.vip,
            proto,
            marker: Marker { id, report_to },
            padding: if a.fragment { 64 } else { 16 },
            quic: quic.clone(),
        };
        // Marker checks (an unspecified or multicast --report-to) fail here.
        Marker::parse(&probe.marker.encode())
            .context("--report-to must be an address the load balancers can send to")?;
        let packets = probe.ip_packets(if a.fragment { 2 } else { 1 }, id as u32)?;
        for p in &packets {
            rustix::net::sendto(
                &raw,
                p,
                rustix::net::SendFlags::empty(),
                &SocketAddr::new(a.vip.ip(), 0),
            )
            .with_context(|| format!("sending probe {id:016x} to {}", a.vip))?;
        }
        probes.push(Traced {
            probe: id,
            src: probe.src,
            fragmented: a.fragment,
            reports: Vec::new(),
        });
    }
    let index: BTreeMap<u64, usize> = probes
        .iter()
        .enumerate()
        .map(|(i, p)| (p.probe, i))
        .collect();
    let deadline = Instant::now() + Duration::from_millis(a.wait_ms);
    let mut buf = vec![0u8; lb::tracer::MAX_REPORT];
    let mut ignored = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        rx.set_read_timeout(Some(left))?;
        match rx.recv(&mut buf) {
            Ok(n) => match Report::parse(&buf[..n]) {
                Ok(r) => match index.get(&r.probe) {
                    Some(&i) => probes[i].reports.push(r),
                    None => ignored += 1,
                },
                Err(_) => ignored += 1,
            },
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) => return Err(e).context("receiving reports"),
        }
    }
    let out = Output {
        vip: a.vip,
        proto: match a.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        },
        report_to,
        unreported: probes.iter().filter(|p| p.reports.is_empty()).count(),
        probes,
        ignored,
    };
    crate::report::emit(a.format, &out)?;
    if out.unreported == out.probes.len() {
        bail!(
            "no load balancer reported within {} ms (is [tracer] enabled, is {} reachable from them, \
             and do probes from {src} reach the VIP?)",
            a.wait_ms,
            report_to
        );
    }
    Ok(())
}

impl crate::report::Report for Output {
    fn to_text(&self) -> String {
        table(self)
    }
}

/// A report's QUIC step in a table cell: "routed cp 1 sid 0a02",
/// "server_down sid 0a02 (h3-b), maglev", "codepoint_unknown, maglev".
fn quic_cell(q: &lb::tracer::QuicReport) -> String {
    let mut s = q.decision.clone();
    if let Some(cp) = q.codepoint {
        s.push_str(&format!(" cp {cp}"));
    }
    if let Some(sid) = &q.server_id {
        s.push_str(&format!(" sid {sid}"));
    }
    if let Some(b) = &q.down_backend {
        s.push_str(&format!(" ({b})"));
    }
    if let Some(f) = &q.fallback {
        s.push_str(&format!(", {f}"));
    }
    s
}

fn table(o: &Output) -> String {
    let mut t = measure::Table::new([
        "probe",
        "source",
        "load balancer",
        "thread",
        "conntrack",
        "generation",
        "fingerprint",
        "backend",
        "fragment",
        "quic",
    ]);
    for p in &o.probes {
        let id = format!("{:016x}", p.probe);
        if p.reports.is_empty() {
            t.row([
                id.clone(),
                p.src.to_string(),
                "(no report)".into(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
        for (k, r) in p.reports.iter().enumerate() {
            let frag = match (&r.redirected_to, r.arrived_redirected, &r.redirected_from) {
                (Some(to), _, _) => format!("redirected to {to}"),
                (None, true, Some(from)) => format!("arrived redirected from {from}"),
                (None, true, None) => "arrived redirected".into(),
                _ if r.fragment => "handled here".into(),
                _ => "-".into(),
            };
            let backend = match (&r.backend, &r.backend_address) {
                (Some(n), Some(a)) if n != &a.to_string() => format!("{n} ({a})"),
                (Some(n), _) => n.clone(),
                (None, _) => "-".into(),
            };
            t.row([
                if k == 0 { id.clone() } else { String::new() },
                if k == 0 {
                    p.src.to_string()
                } else {
                    String::new()
                },
                r.machine.clone(),
                r.thread.to_string(),
                r.conntrack
                    .map_or("-", |c| match c {
                        lb::tracer::Lookup::Hit => "hit",
                        lb::tracer::Lookup::Miss => "miss",
                    })
                    .into(),
                r.generation.to_string(),
                r.fingerprint.clone().unwrap_or_else(|| "-".into()),
                backend,
                frag,
                r.quic.as_ref().map_or_else(|| "-".into(), quic_cell),
            ]);
        }
    }
    format!(
        "{} probes to {} ({}), reports to {}; {} without a report\n{t}",
        o.probes.len(),
        o.vip,
        o.proto,
        o.report_to,
        o.unreported
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_ids_are_1_to_20_octets_of_hex() {
        assert_eq!(parse_dcid("2a0b").unwrap(), vec![0x2a, 0x0b]);
        assert!(parse_dcid("").is_err());
        assert!(parse_dcid(&"ab".repeat(21)).is_err());
        assert!(parse_dcid("2a0").is_err());
    }

    #[test]
    fn the_quic_cell_says_decision_server_id_and_fallback() {
        let q = |decision: &str, cp, sid: Option<&str>, down: Option<&str>, fb: Option<&str>| {
            quic_cell(&lb::tracer::QuicReport {
                decision: decision.into(),
                codepoint: cp,
                server_id: sid.map(Into::into),
                down_backend: down.map(Into::into),
                fallback: fb.map(Into::into),
            })
        };
        assert_eq!(
            q("routed", Some(1), Some("0a02"), None, None),
            "routed cp 1 sid 0a02"
        );
        assert_eq!(
            q(
                "server_down",
                Some(1),
                Some("0a02"),
                Some("h3-b"),
                Some("maglev")
            ),
            "server_down cp 1 sid 0a02 (h3-b), maglev"
        );
        assert_eq!(
            q(
                "codepoint_reserved",
                None,
                None,
                None,
                Some("connection table")
            ),
            "codepoint_reserved, connection table"
        );
    }
}
