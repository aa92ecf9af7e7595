//! The liveness oracle, shared by the property test
//! (`crates/lb/tests/liveness.rs`, which includes this file) and the
//! `forward_sequence` fuzz target: runs a sequence of frames through the
//! datapath over a [`MemPort`] under a watchdog, and checks what the forwarder
//! owes under hostile input:
//!
//! - the run ends on its own (held fragments end too);
//! - every pool buffer returns;
//! - every output is valid GRE whose inner packet is the IP packet of an
//!   input frame (each input forwarded at most once), sent to the backend an
//!   independent model (the configuration and the maglev crate, no
//!   forwarder code) names for it, from the configured outer source; or
//!   else the refusal (`packet::reply`: a RST, a port unreachable) of an
//!   input the model says is for a VIP's address on a port no VIP serves,
//!   from a source that may be answered, each at most once per such input;
//! - whatever must be forwarded is (a packet or first fragment of a VIP
//!   flow, an ICMP error quoting one);
//! - received = forwarded + dropped by reason (expired included), with the
//!   malformed and not-for-a-VIP drops exactly those the model predicts;
//! - a datagram to a `quic` VIP goes to the backend whose server ID its
//!   destination connection ID carries (read by the model from the QUIC
//!   specifications and decoded with the `quic_lb` codec, never the
//!   forwarder's routing), else by its 5-tuple as any UDP flow, and the
//!   QUIC counters (routed, unroutable by reason) are those the model
//!   predicts.
//!
//! It also holds the fuzz input format ([`encode`], [`decode`]), so the
//! property test can seed the fuzz corpus.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use lb::config::Config;
use lb::counters::DropReason;
use lb::datapath::{Datapath, Params, RunStats};
use lb::worker::flow_hash;
use lb::Control;
use netio::mem::{MemPort, Vary};
use netio::HEADROOM;
use packet::gre::decapsulate;
use packet::{ethertype, flow, parse_frame, FlowKey, Reason};

/// Longest frame the port delivers whole (a pool buffer less headroom);
/// the oracle sees inputs cut to this, as the forwarder does.
pub const MAX_FRAME: usize = 2048 - HEADROOM;

/// Most frames a fuzz input is read as.
pub const MAX_FRAMES: usize = 512;

/// How long the watchdog waits, after stopping a run that did not end on
/// its own, for it to stop.
const GRACE: Duration = Duration::from_secs(5);

/// What the oracle adds to the sample configuration: two `quic` VIPs (IPv4
/// and IPv6, UDP port 443) over one pool whose backends carry QUIC-LB
/// server IDs (one drained: it takes no new flows, but the connection IDs
/// it issued still reach it; one down, [`DOWN`]: they do not), and four `[[quic_lb]]` configurations, one
/// server ID length (5 octets), at codepoints 0, 2, 5 and 6: plaintext,
/// single-pass (server ID and nonce 16 octets), four-pass with the server
/// ID longer than half the block (9 octets, all four rounds to read it)
/// and four-pass with it in the left half (13 octets). Codepoints 1, 3 and
/// 4 have none; 0b111 never routes.
pub const QUIC_CONFIG: &str = r#"
[[quic_lb]]
codepoint = 0
server_id_len = 5
nonce_len = 4
length_self_encoding = true

[[quic_lb]]
codepoint = 2
server_id_len = 5
nonce_len = 11
key = "8f95f09245765f80256934e50c66207f"

[[quic_lb]]
codepoint = 5
server_id_len = 5
nonce_len = 4
key = "fdf726a9893ec05c0632d3956680baf0"
length_self_encoding = true

[[quic_lb]]
codepoint = 6
server_id_len = 5
nonce_len = 8
key = "0x4d9d0fd25a25e7f321ef464e13f9fa3d"

[[pools]]
name = "h3"
table_size = 251
backends = [
  { address = "10.3.0.1", name = "h3-a", quic_server_id = "a1a1a1a1a1" },
  { address = "10.3.0.2", name = "h3-b", quic_server_id = "0000000000" },
  { address = "10.3.0.3", name = "h3-c", quic_server_id = "c3c3c3c3c3", weight = 2 },
  { address = "10.3.0.4", name = "h3-d", quic_server_id = "ffffffffff" },
]
drained = ["h3-c"]

[[vips]]
name = "h3"
address = "192.0.2.43"
port = 443
protocol = "udp"
quic = true
pool = "h3"

[[vips]]
name = "h3-6"
address = "2001:db8::43"
port = 443
protocol = "udp"
quic = true
pool = "h3"
"#;

/// Backends the oracle marks down (as failed health checks would), where
/// the configuration has them: one of the `quic` pool, so that connection
/// IDs name a backend that is down.
pub const DOWN: [&str; 1] = ["h3-d"];

/// The sample configuration with [`QUIC_CONFIG`].
pub fn with_quic(sample: &str) -> String {
    format!("{sample}\n{QUIC_CONFIG}")
}

/// A VIP as the model sees it.
struct Vip {
    address: [u8; 16],
    port: Option<u16>,
    proto: u8,
    pool: String,
    quic: bool,
}

/// The model: VIPs, each pool's Maglev table over its members, and the
/// QUIC-LB configurations.
struct Model {
    vips: Vec<Vip>,
    pools: HashMap<String, (Vec<IpAddr>, maglev::Maglev)>,
    quic: QuicModel,
    source: Option<IpAddr>,
    source6: Option<IpAddr>,
}

/// What `quic` VIPs route by, from the configuration and QUIC-LB's codec
/// alone: the configurations by codepoint, and per pool its members by
/// server ID.
struct QuicModel {
    by_codepoint: [Option<quic_lb::Config>; 7],
    /// Each pool's members by server ID: address, and whether it is up.
    server_ids: HashMap<String, HashMap<Vec<u8>, (IpAddr, bool)>>,
}

/// What the model says of a datagram to a `quic` VIP: the backend its
/// connection ID names, or why none (the forwarder's counter name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuicOutcome {
    Routed(IpAddr),
    /// It names a backend that is down.
    Down,
    Miss(&'static str),
}

/// RFC 9369's QUIC version 2.
const QUIC_V2: u32 = 0x6b33_43cf;

impl QuicModel {
    fn new(cfg: &Config, down: &[&str]) -> Self {
        let mut by_codepoint: [Option<quic_lb::Config>; 7] = Default::default();
        for q in &cfg.quic_lb {
            let key = q
                .key
                .as_deref()
                .map(|k| quic_lb::parse_key(k).expect("the oracle's keys are inline and valid"));
            let c = quic_lb::Config::new(
                q.codepoint,
                q.server_id_len,
                q.nonce_len,
                key,
                q.length_self_encoding,
            )
            .expect("a valid QUIC-LB configuration");
            by_codepoint[usize::from(q.codepoint)] = Some(c);
        }
        let mut server_ids = HashMap::new();
        for p in &cfg.pools {
            let members = cfg.flatten(&p.name).expect("a valid configuration");
            let ids = members
                .iter()
                .filter_map(|m| {
                    let sid = quic_lb::parse_hex(m.quic_server_id.as_deref()?).ok()?;
                    let up = !down.contains(&m.display_name().as_str());
                    Some((sid, (m.address, up)))
                })
                .collect();
            server_ids.insert(p.name.clone(), ids);
        }
        QuicModel {
            by_codepoint,
            server_ids,
        }
    }

    /// The configurations, for generators (encoding connection IDs).
    fn configs(&self) -> Vec<quic_lb::Config> {
        self.by_codepoint.iter().flatten().cloned().collect()
    }

    /// Where a UDP payload to a `quic` VIP of `pool` goes, read as the
    /// specifications say: QUIC's invariant header (RFC 8999: a long
    /// header states its connection IDs' lengths, a short header's DCID
    /// runs from the second octet), version 1's and 2's 20-octet limit
    /// (RFC 9000 section 17.2, RFC 9369), then QUIC-LB (draft 21 section 3
    /// "Unroutable Connection IDs"): codepoint 0b111 never routes, the
    /// codepoint must have a configuration, a long header's length must be
    /// the self-described one plus one where the servers self-describe
    /// (the optional check this load balancer makes), the DCID must hold
    /// the first octet, server ID and nonce, and the server ID decoded
    /// (all passes) must be a member's of the pool.
    fn outcome(&self, pool: &str, payload: &[u8]) -> QuicOutcome {
        use QuicOutcome::Miss;
        let Some(&first) = payload.first() else {
            return Miss("not_quic");
        };
        let long = first & 0x80 != 0;
        let dcid = if long {
            let Some(v) = payload.get(1..5) else {
                return Miss("not_quic");
            };
            let version = u32::from_be_bytes([v[0], v[1], v[2], v[3]]);
            let Some(&dl) = payload.get(5) else {
                return Miss("not_quic");
            };
            let dl = usize::from(dl);
            let Some(&sl) = payload.get(6 + dl) else {
                return Miss("not_quic");
            };
            let sl = usize::from(sl);
            if payload.len() < 7 + dl + sl {
                return Miss("not_quic");
            }
            if matches!(version, 1 | QUIC_V2) && (dl > 20 || sl > 20) {
                return Miss("not_quic");
            }
            &payload[6..6 + dl]
        } else {
            &payload[1..]
        };
        let Some(&c0) = dcid.first() else {
            return Miss("not_quic");
        };
        let codepoint = c0 >> 5;
        if codepoint == 0b111 {
            return Miss("codepoint_reserved");
        }
        let Some(conf) = &self.by_codepoint[usize::from(codepoint)] else {
            return Miss("codepoint_unknown");
        };
        if long && conf.self_describing() && usize::from(c0 & 0x1f) != dcid.len() - 1 {
            return Miss("cid_length_mismatch");
        }
        if dcid.len() < 1 + conf.server_id_len() + conf.nonce_len() {
            return Miss("cid_too_short");
        }
        let Ok(d) = conf.decode(dcid) else {
            return Miss("cid_too_short");
        };
        match self
            .server_ids
            .get(pool)
            .and_then(|ids| ids.get(d.server_id.as_bytes()))
        {
            Some(&(b, true)) => QuicOutcome::Routed(b),
            Some(&(_, false)) => QuicOutcome::Down,
            None => Miss("server_id_unknown"),
        }
    }
}

impl Model {
    /// The model of `cfg` with the backends named in `down` down.
    fn new(cfg: &Config, down: &[&str]) -> Self {
        let mut vips = Vec::new();
        for v in &cfg.vips {
            let address = v
                .address
                .expect("the oracle models VIPs with an address, not prefix groups");
            vips.push(Vip {
                address: flow::from_ip(address),
                port: v.port,
                proto: v.protocol.number(),
                pool: v.pool.clone(),
                quic: v.quic,
            });
        }
        let mut pools = HashMap::new();
        for p in &cfg.pools {
            let mut members = cfg.flatten(&p.name).expect("a valid configuration");
            // A backend that is down has no share of the table.
            members.retain(|m| !down.contains(&m.display_name().as_str()));
            let backends: Vec<maglev::Backend> = members
                .iter()
                .map(|m| {
                    maglev::Backend::weighted(
                        m.name.clone().unwrap_or_else(|| m.address.to_string()),
                        m.weight,
                    )
                })
                .collect();
            let mut t = maglev::Maglev::new(p.table_size).expect("a prime table size");
            t.populate(&backends).expect("populated");
            let addrs = members.iter().map(|m| m.address).collect();
            pools.insert(p.name.clone(), (addrs, t));
        }
        Model {
            vips,
            pools,
            quic: QuicModel::new(cfg, down),
            source: cfg.encap.source,
            source6: cfg.encap.source6,
        }
    }

    /// The pool of the VIP a flow is for: an exact port first, then any.
    fn pool(&self, f: &FlowKey) -> Option<&str> {
        self.vip(f).map(|v| v.pool.as_str())
    }

    /// The VIP a flow is for: an exact port first, then any.
    fn vip(&self, f: &FlowKey) -> Option<&Vip> {
        let matches = |any: bool| {
            self.vips.iter().find(|v| {
                v.address == f.dst
                    && v.proto == f.proto
                    && if any {
                        v.port.is_none()
                    } else {
                        v.port == Some(f.dst_port)
                    }
            })
        };
        matches(false).or_else(|| matches(true))
    }

    /// For a whole UDP datagram to a `quic` VIP (not a fragment: a first
    /// fragment routes by its 5-tuple, as the rest of its datagram must):
    /// what its connection ID says. The UDP payload is what the UDP header's
    /// length covers (RFC 768), not whatever else the IP packet holds.
    fn quic(&self, frame: &[u8], p: &packet::Parsed) -> Option<QuicOutcome> {
        if p.flow.proto != packet::proto::UDP || p.fragment.is_some() || p.icmp_quote.is_some() {
            return None;
        }
        let v = self.vip(&p.flow).filter(|v| v.quic)?;
        let l4 = &frame[p.l4_offset..p.l3_offset + p.l3_len];
        let len = usize::from(u16::from_be_bytes([l4[4], l4[5]]));
        Some(self.quic.outcome(&v.pool, &l4[8..len]))
    }

    /// Whether an address is a VIP's (later fragments carry no port).
    fn is_vip_address(&self, a: &[u8; 16]) -> bool {
        self.vips.iter().any(|v| v.address == *a)
    }

    /// The backend Maglev names for a flow to a VIP, if it is for one.
    fn backend(&self, f: &FlowKey) -> Option<IpAddr> {
        let (addrs, table) = self.pools.get(self.pool(f)?)?;
        Some(addrs[table.lookup(flow_hash(f))? as usize])
    }
}

/// What identifies a datagram: source, destination, protocol and
/// identification, as the forwarder's fragment table keys it.
type DatagramKey = ([u8; 16], [u8; 16], u8, u32);

/// What the model says of one input IP packet (inputs with the same bytes
/// share an entry).
#[derive(Debug, Default)]
struct Expected {
    /// Input frames carrying it.
    count: usize,
    /// Backends it may go to (empty: it must not be forwarded).
    allowed: Vec<IpAddr>,
    /// Whether every copy must be forwarded.
    must: bool,
    /// Copies seen in the output.
    seen: usize,
}

/// Runs frame sequences through the datapath for one configuration and
/// checks every run.
pub struct Oracle {
    cfg: Config,
    control: Control,
    model: Model,
}

impl Oracle {
    /// The QUIC-LB configurations of the oracle's configuration (for
    /// generators encoding connection IDs).
    pub fn quic_configs(&self) -> Vec<quic_lb::Config> {
        self.model.quic.configs()
    }

    /// An oracle for a configuration (its VIPs must have addresses).
    pub fn new(config: &str) -> Self {
        let cfg = Config::parse(config, "oracle").expect("a valid configuration");
        let mut control = Control::new(cfg.clone()).expect("tables for the configuration");
        // The backends of [`DOWN`] this configuration has, down.
        let down: Vec<&str> = DOWN
            .iter()
            .copied()
            .filter(|name| control.set_health(name, false))
            .collect();
        Oracle {
            model: Model::new(&cfg, &down),
            control,
            cfg,
        }
    }

    /// A datapath with `threads` packet threads (0: inline) and its own
    /// packet pool.
    pub fn datapath(&self, threads: usize) -> Arc<Datapath> {
        let mut params = Params::from_config(&self.cfg);
        params.threads = threads;
        params.hugepages = maio::Hugepages::Never;
        Arc::new(Datapath::new(params, self.control.tables()).expect("a packet pool"))
    }

    /// Runs `frames` through `dp` and checks the run (see the module
    /// documentation). A run that has not ended after `deadline` is stopped
    /// and reported. Returns the run's counters, or what went wrong.
    pub fn check(
        &self,
        dp: &Arc<Datapath>,
        frames: &[Vec<u8>],
        deadline: Duration,
    ) -> Result<RunStats, String> {
        let frames: Vec<Vec<u8>> = frames
            .iter()
            .map(|f| f[..f.len().min(MAX_FRAME)].to_vec())
            .collect();
        let n = frames.len() as u64;
        let mut port = MemPort::new(frames.clone(), Vary::None, Some(n)).capture();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let (run_dp, run_stop) = (Arc::clone(dp), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("liveness-run".into())
            .spawn(move || {
                let r = run_dp.run(&mut port, &run_stop);
                let _ = tx.send((r, port));
            })
            .map_err(|e| format!("starting the run: {e}"))?;
        let (result, mut port) = match rx.recv_timeout(deadline) {
            Ok(done) => done,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err("the datapath panicked".into());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                stop.store(true, Ordering::Relaxed);
                let how = match rx.recv_timeout(GRACE) {
                    Ok((Ok(s), _)) => format!(
                        "stopped by the watchdog: rx {} tx {} dropped {} held {} in the pool {}",
                        s.counters.rx,
                        s.counters.tx,
                        s.counters.dropped(),
                        s.counters.frag_held
                            - s.counters.frag_released
                            - s.counters.drops_for(DropReason::FragExpired),
                        s.pool.in_use
                    ),
                    Ok((Err(e), _)) => format!("stopped by the watchdog with an error: {e}"),
                    Err(_) => format!("and did not stop either within {GRACE:?} of being told"),
                };
                return Err(format!(
                    "the run did not end on its own within {deadline:?}: {how}"
                ));
            }
        };
        let stats = result.map_err(|e| format!("the run failed: {e}"))?;
        let out = port.captured.take().unwrap_or_default();
        self.verify(&frames, &stats, &out)?;
        Ok(stats)
    }

    /// Checks a finished run against the model.
    fn verify(&self, frames: &[Vec<u8>], s: &RunStats, out: &[Vec<u8>]) -> Result<(), String> {
        let m = &self.model;
        let n = frames.len() as u64;
        // First fragments by datagram: the backends later fragments may
        // follow (any first fragment of the same datagram the forwarder
        // could have recorded).
        let mut firsts: HashMap<DatagramKey, Vec<IpAddr>> = HashMap::new();
        for f in frames {
            if let Ok(p) = parse_frame(f) {
                if let Some(fi) = p.fragment.filter(|fi| fi.is_first()) {
                    if p.icmp_quote.is_none() {
                        if let Some(b) = m.backend(&p.flow) {
                            firsts
                                .entry((p.flow.src, p.flow.dst, p.flow.proto, fi.ident))
                                .or_default()
                                .push(b);
                        }
                    }
                }
            }
        }
        let mut want: HashMap<&[u8], Expected> = HashMap::new();
        let mut malformed = [0u64; Reason::ALL.len()];
        let mut no_vip = 0u64;
        // Whole packets and first fragments for a VIP's address that no VIP
        // takes (ICMP errors are counted as not for a VIP).
        let mut not_served = 0u64;
        // Datagrams to a `quic` VIP routed by connection ID, and the others
        // by the forwarder's counter name for why not.
        let mut quic_routed = 0u64;
        let mut quic_down = 0u64;
        let mut quic_miss: HashMap<&str, u64> = HashMap::new();
        // The refusals (`packet::reply`) those frames may get, when whole
        // and from a source that may be answered (rate-limited: may, not
        // must), and how many came.
        let mut replies: HashMap<Vec<u8>, u64> = HashMap::new();
        let mut refusals = 0u64;
        for f in frames {
            let p = match parse_frame(f) {
                Ok(p) => p,
                Err(e) => {
                    malformed[e.0.index()] += 1;
                    continue;
                }
            };
            let e = want
                .entry(&f[p.l3_offset..p.l3_offset + p.l3_len])
                .or_default();
            e.count += 1;
            // In the forwarder's order: ICMP errors, later fragments, the
            // rest (whole packets and first fragments).
            if let Some(q) = p.icmp_quote {
                e.allowed = m.backend(&q).into_iter().collect();
                e.must = !e.allowed.is_empty();
            } else if let Some(fi) = p.fragment.filter(|fi| !fi.is_first()) {
                e.allowed = firsts
                    .get(&(p.flow.src, p.flow.dst, p.flow.proto, fi.ident))
                    .cloned()
                    .unwrap_or_default();
                e.must = false;
                if !m.is_vip_address(&p.flow.dst) {
                    no_vip += 1;
                }
                continue;
            } else {
                e.allowed = match m.quic(f, &p) {
                    // The backend the connection ID names, which is up.
                    Some(QuicOutcome::Routed(b)) => {
                        quic_routed += 1;
                        vec![b]
                    }
                    // Its backend is down: the fallback, as for a miss.
                    Some(QuicOutcome::Down) => {
                        quic_down += 1;
                        m.backend(&p.flow).into_iter().collect()
                    }
                    // Unroutable: the connection table, then Maglev, as any
                    // UDP flow (the table holds only Maglev's choices here).
                    Some(QuicOutcome::Miss(why)) => {
                        *quic_miss.entry(why).or_default() += 1;
                        m.backend(&p.flow).into_iter().collect()
                    }
                    None => m.backend(&p.flow).into_iter().collect(),
                };
                e.must = !e.allowed.is_empty();
            }
            if e.allowed.is_empty() {
                if p.icmp_quote.is_none() && m.is_vip_address(&p.flow.dst) {
                    not_served += 1;
                    let src = &p.flow.src;
                    let forged = flow::martian_source(src) || m.is_vip_address(src) || p.ttl == 0;
                    let mut r = Vec::new();
                    if !forged && packet::reply::refusal(f, &p, &mut r).is_some() {
                        *replies.entry(r).or_default() += 1;
                    }
                } else {
                    no_vip += 1;
                }
            }
        }
        for (i, frame) in out.iter().enumerate() {
            if let Some(n) = replies.get_mut(frame.as_slice()).filter(|n| **n > 0) {
                *n -= 1;
                refusals += 1;
                continue;
            }
            let d = decapsulate(frame)
                .map_err(|e| format!("output {i} is not GRE ({e}): {}", hex(frame)))?;
            if d.inner.end != frame.len() {
                return Err(format!("output {i} has bytes after its inner packet"));
            }
            let inner = &frame[d.inner.clone()];
            let e = want.get_mut(inner).ok_or_else(|| {
                format!(
                    "output {i} carries a packet that no input carries: {}",
                    hex(inner)
                )
            })?;
            e.seen += 1;
            if e.seen > e.count {
                return Err(format!(
                    "output {i}: a packet sent {} times was forwarded {} times: {}",
                    e.count,
                    e.seen,
                    hex(inner)
                ));
            }
            let v = inner.first().map(|b| b >> 4);
            let et_ok = match d.ethertype {
                ethertype::IPV4 => v == Some(4),
                ethertype::IPV6 => v == Some(6),
                _ => false,
            };
            if !et_ok {
                return Err(format!(
                    "output {i}: GRE protocol {:#06x} for an IP version {v:?} packet",
                    d.ethertype
                ));
            }
            let backend = flow::to_ip(&d.outer_dst);
            if !e.allowed.contains(&backend) {
                return Err(format!(
                    "output {i} went to {backend}, the model allows {:?}: {}",
                    e.allowed,
                    hex(inner)
                ));
            }
            let source = if backend.is_ipv4() {
                m.source
            } else {
                m.source6
            };
            if Some(flow::to_ip(&d.outer_src)) != source {
                return Err(format!(
                    "output {i}: outer source {} instead of {source:?}",
                    flow::to_ip(&d.outer_src)
                ));
            }
        }
        for (ip, e) in &want {
            if e.must && e.seen != e.count {
                return Err(format!(
                    "a packet for a VIP sent {} times was forwarded {} times (drops {:?}): {}",
                    e.count,
                    e.seen,
                    s.counters.drop_table(),
                    hex(ip)
                ));
            }
        }
        let c = &s.counters;
        let counts = format!(
            "fed {n}, port rx {} tx {}, counters rx {} tx {} drops {:?}, held {} released {}, \
             captured {}",
            s.port.rx,
            s.port.tx,
            c.rx,
            c.tx,
            c.drop_table(),
            c.frag_held,
            c.frag_released,
            out.len()
        );
        let expired = c.drops_for(DropReason::FragExpired);
        let checks = [
            (s.port.rx == n, "the port delivered every frame"),
            (c.rx == n, "received = frames fed"),
            (c.rx == c.tx + c.dropped(), "received = forwarded + dropped"),
            (
                c.tx + refusals == out.len() as u64,
                "forwarded + refusals = frames sent",
            ),
            (
                s.port.tx == c.tx + refusals,
                "the port sent what was forwarded or refused",
            ),
            (
                c.refused_tcp_rst + c.refused_icmp_unreachable == refusals,
                "refusals counted as sent",
            ),
            (
                c.frag_held == c.frag_released + expired,
                "every held fragment released or expired",
            ),
            (
                c.per_vip.iter().map(|t| t.packets).sum::<u64>() == c.tx,
                "per-VIP counters add up to forwarded",
            ),
            (
                c.drops_for(DropReason::NoVip) == no_vip,
                "no-VIP drops as modelled",
            ),
            (
                c.drops_for(DropReason::VipPortNotServed) == not_served,
                "drops for a VIP's address on a port no VIP serves as modelled",
            ),
            (
                c.drops_for(DropReason::NoHealthyBackend) == 0,
                "no drop for want of a healthy backend",
            ),
            (
                c.drops_for(DropReason::EncapFailed) == 0,
                "no encapsulation failure",
            ),
            (s.pool.in_use == 0, "every buffer back in the pool"),
            (
                c.quic_routed == quic_routed,
                "QUIC datagrams routed by connection ID as modelled",
            ),
            (
                c.quic_server_down == quic_down,
                "QUIC datagrams whose connection ID names a down backend as modelled",
            ),
        ];
        for (ok, what) in checks {
            if !ok {
                return Err(format!("{what}: {counts}; pool in use {}", s.pool.in_use));
            }
        }
        // The miss counters by their stable names (the model's reasons are
        // its own; only the counters' order is the forwarder's).
        for (i, miss) in lb::quic::Miss::ALL.iter().enumerate() {
            let want = quic_miss.remove(miss.name()).unwrap_or(0);
            if c.quic_miss[i] != want {
                return Err(format!(
                    "QUIC connection IDs unroutable for {}: {}, the model says {want}: {counts}; \
                     quic routed {} (model {quic_routed}), misses {:?}",
                    miss.name(),
                    c.quic_miss[i],
                    c.quic_routed,
                    c.quic_miss
                ));
            }
        }
        if let Some((name, n)) = quic_miss.iter().next() {
            return Err(format!(
                "the model counts {n} QUIC misses as {name}, which the forwarder has no counter for"
            ));
        }
        for r in Reason::ALL {
            let got = c.drops_for(DropReason::Malformed(r));
            if got != malformed[r.index()] {
                return Err(format!(
                    "{} drops: {got}, the parser rejects {} inputs for it: {counts}",
                    r.name(),
                    malformed[r.index()]
                ));
            }
        }
        Ok(())
    }
}

/// Frames as hex, for failure messages.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Control byte flag of a fuzz chunk: fill in the IPv4 header checksum
/// (so the fuzzer reaches past the checksum check).
pub const FIX_IPV4_CHECKSUM: u8 = 1;

/// A frame sequence as a fuzz input: per frame a control byte, a
/// little-endian `u16` length and the bytes.
pub fn encode(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        let f = &f[..f.len().min(MAX_FRAME)];
        out.push(0);
        out.extend_from_slice(&(f.len() as u16).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// Reads a fuzz input as a frame sequence (see [`encode`]): lengths are
/// cut to [`MAX_FRAME`] and to what is left; at most [`MAX_FRAMES`].
pub fn decode(mut data: &[u8]) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    while data.len() >= 3 && frames.len() < MAX_FRAMES {
        let ctl = data[0];
        let len = usize::from(u16::from_le_bytes([data[1], data[2]]))
            .min(MAX_FRAME)
            .min(data.len() - 3);
        let mut f = data[3..3 + len].to_vec();
        data = &data[3 + len..];
        if ctl & FIX_IPV4_CHECKSUM != 0 {
            fix_ipv4_checksum(&mut f);
        }
        frames.push(f);
    }
    frames
}

/// Fills in the header checksum of an (optionally tagged) IPv4 frame.
fn fix_ipv4_checksum(f: &mut [u8]) {
    let (mut l3, mut et) = (14, f.get(12..14));
    if et == Some(&[0x81, 0x00][..]) {
        (l3, et) = (18, f.get(16..18));
    }
    if et != Some(&[0x08, 0x00][..]) {
        return;
    }
    let Some(&vhl) = f.get(l3) else { return };
    let hl = usize::from(vhl & 0x0f) * 4;
    if hl < 20 || f.len() < l3 + hl {
        return;
    }
    f[l3 + 10..l3 + 12].fill(0);
    let sum = packet::checksum::checksum(&f[l3..l3 + hl]);
    f[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
}
