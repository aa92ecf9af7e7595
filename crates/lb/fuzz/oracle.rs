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
//!   malformed and not-for-a-VIP drops exactly those the model predicts.
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

/// A VIP as the model sees it.
struct Vip {
    address: [u8; 16],
    port: Option<u16>,
    proto: u8,
    pool: String,
}

/// The model: VIPs and each pool's Maglev table over its members.
struct Model {
    vips: Vec<Vip>,
    pools: HashMap<String, (Vec<IpAddr>, maglev::Maglev)>,
    source: Option<IpAddr>,
    source6: Option<IpAddr>,
}

impl Model {
    fn new(cfg: &Config) -> Self {
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
            });
        }
        let mut pools = HashMap::new();
        for p in &cfg.pools {
            let members = cfg.flatten(&p.name).expect("a valid configuration");
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
            source: cfg.encap.source,
            source6: cfg.encap.source6,
        }
    }

    /// The pool of the VIP a flow is for: an exact port first, then any.
    fn pool(&self, f: &FlowKey) -> Option<&str> {
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
        matches(false)
            .or_else(|| matches(true))
            .map(|v| v.pool.as_str())
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
    /// An oracle for a configuration (its VIPs must have addresses).
    pub fn new(config: &str) -> Self {
        let cfg = Config::parse(config, "oracle").expect("a valid configuration");
        let control = Control::new(cfg.clone()).expect("tables for the configuration");
        Oracle {
            model: Model::new(&cfg),
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
                e.allowed = m.backend(&p.flow).into_iter().collect();
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
        ];
        for (ok, what) in checks {
            if !ok {
                return Err(format!("{what}: {counts}; pool in use {}", s.pool.in_use));
            }
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
