//! `quic` VIPs in the driver (`bpf/lb.c`) against the packet thread
//! (`lb::worker`), datagram by datagram: a VIP whose QUIC-LB
//! configurations are all plaintext routes by connection ID in the driver,
//! and whatever the driver decides (forwarded, dropped) the worker decides
//! the same, byte for byte, and counts the same (`quic_routed`,
//! `quic_miss` by reason, `quic_server_down`); what the driver leaves to
//! user space it does not count. Each datagram's expected outcome is also
//! derived from how it was made (the draft's rules: draft-ietf-quic-load-
//! balancers-21, "Load Balancer Forwarding", "Config Rotation",
//! "Plaintext CID Algorithm"; RFC 8999's invariant header), not from
//! either implementation. Connection IDs are made by the servers' encoder
//! (`quic_lb::Config::encode`), frames by etherparse.
//!
//! A VIP with an encrypted configuration is left to user space whole.
//!
//! The program runs through `BPF_PROG_TEST_RUN`: root, as every XDP test.

mod common;

use std::net::IpAddr;
use std::time::Instant;

use etherparse::{IpHeaders, Ipv4Header, Ipv6FlowLabel, Ipv6Header, PacketBuilder};
use lb::config::Config;
use lb::conntrack::Conntrack;
use lb::frag::FragTable;
use lb::quic::Miss;
use lb::worker::Worker;
use lb::xdp::{Detached, XdpTables, XDP_DROP, XDP_TX};
use lb::{Control, Mode};
use maio::{Hugepages, Pool};
use proptest::prelude::*;

/// The VIPs: `h3` (IPv4), `h3v6` and `h3-edge` (a prefix group's, by
/// suffix) route QUIC; `other-ports` and `edge-other-ports` take the rest
/// of `h3`'s and `h3-edge`'s addresses (any port), ordinary UDP VIPs. Codepoint 0
/// self-describes its length, codepoint 2 does not; `keys` puts a key on
/// the codepoints given (encrypted).
fn config(keys: &[u8], swapped: bool) -> Config {
    let key = |cp: u8| {
        if keys.contains(&cp) {
            "key = \"8f95f09245765f80256934e50c66207f\"\n"
        } else {
            ""
        }
    };
    let (a, c) = if swapped {
        ("0003", "0001")
    } else {
        ("0001", "0003")
    };
    let text = format!(
        r#"
[encap]
source = "10.0.0.1"
gateway_mac = "02:00:00:00:0e:01"
mac = "02:00:00:00:0e:02"

[[quic_lb]]
codepoint = 0
server_id_len = 2
nonce_len = 6
length_self_encoding = true
{k0}
[[quic_lb]]
codepoint = 2
server_id_len = 2
nonce_len = 4
{k2}
[[pools]]
name = "h3"
table_size = 251
backends = [
  {{ address = "10.1.0.1", quic_server_id = "{a}" }},
  {{ address = "10.1.0.2", quic_server_id = "0002" }},
  {{ address = "10.1.0.3", quic_server_id = "{c}" }},
  {{ address = "10.1.0.4", quic_server_id = "0004" }},
]

[[pools]]
name = "plain"
table_size = 251
backends = [{{ address = "10.2.0.1" }}, {{ address = "10.2.0.2" }}]

[[vips]]
name = "h3"
address = "198.18.0.10"
port = 443
protocol = "udp"
quic = true
pool = "h3"

[[vips]]
name = "other-ports"
address = "198.18.0.10"
protocol = "udp"
pool = "plain"

[[vips]]
name = "h3v6"
address = "2001:db8::443"
port = 443
protocol = "udp"
quic = true
pool = "h3"

[[vips]]
name = "dns"
address = "198.18.0.53"
port = 53
protocol = "udp"
pool = "plain"

[[prefix_groups]]
name = "edge"
prefixes = ["198.18.64.0/20"]
cluster_prefix_len = 24

[[vips]]
name = "h3-edge"
prefix_group = "edge"
suffix = "0.0.0.10"
port = 443
protocol = "udp"
quic = true
pool = "h3"

[[vips]]
name = "edge-other-ports"
prefix_group = "edge"
suffix = "0.0.0.10"
protocol = "udp"
pool = "plain"
"#,
        k0 = key(0),
        k2 = key(2),
    );
    Config::parse(&text, "quic.toml").expect("valid")
}

/// The servers' encoders, as configured (plaintext).
fn encoder(cp: u8) -> quic_lb::Config {
    match cp {
        0 => quic_lb::Config::new(0, 2, 6, None, true),
        _ => quic_lb::Config::new(2, 2, 4, None, false),
    }
    .expect("valid")
}

/// Both datapaths over one control plane (as tests/sys_xdp.rs).
struct Both {
    control: Control,
    xdp: Detached,
    tables: XdpTables,
    worker: Worker,
    pool: Pool,
    start: Instant,
}

impl Both {
    fn new(cfg: Config) -> Self {
        systest::require_root();
        let control = Control::new(cfg.clone()).expect("control");
        let t = control.tables().load_full();
        let xdp = Detached::load(lb::xdp::sizes(&cfg, &t))
            .expect("loading the XDP load balancer (needs root and clang at build time)");
        let mut tables = XdpTables::new(xdp.lb.clone(), &cfg.conntrack);
        let s = tables.sync(&t).expect("sync");
        assert!(s.enabled, "{s:?}");
        let pool = Pool::new(maio::Config {
            buffers: 256,
            buf_size: 2048,
            hugepages: Hugepages::Never,
            magazine_depth: 16,
        })
        .expect("pool");
        let worker = Worker::new(
            &pool,
            Mode::Maglev,
            Conntrack::new(
                4096,
                (cfg.conntrack.tcp_timeout_s * 1000.0) as u64,
                (cfg.conntrack.udp_timeout_s * 1000.0) as u64,
            ),
            FragTable::new(64, 10_000),
        );
        Both {
            control,
            xdp,
            tables,
            worker,
            pool,
            start: Instant::now(),
        }
    }

    fn sync(&mut self) {
        let t = self.control.tables().load_full();
        assert!(self.tables.sync(&t).expect("sync").enabled);
    }

    fn worker(&mut self, frame: &[u8]) -> Option<Vec<u8>> {
        let mut h = self.pool.handle();
        let mut batch = vec![common::packet(&self.pool, &mut h, frame)];
        let mut out = Vec::new();
        let t = self.control.tables().load_full();
        let now = self.start.elapsed().as_millis() as u64;
        self.worker.process(&t, &mut batch, &mut out, now);
        let mut sent = None;
        for p in out {
            sent = Some(p.frame(&self.pool).to_vec());
            h.free(p.buf).expect("free");
        }
        sent
    }

    /// The driver's QUIC counters: routed, the misses, server down.
    fn xdp_quic(&self) -> [u64; 8] {
        quic_counters(&self.tables.counters().expect("counters"))
    }

    fn worker_quic(&self) -> [u64; 8] {
        quic_counters(&self.worker.counters)
    }
}

fn quic_counters(c: &lb::counters::Counters) -> [u64; 8] {
    let mut q = [0; 8];
    q[0] = c.quic_routed;
    q[1..7].copy_from_slice(&c.quic_miss);
    q[7] = c.quic_server_down;
    q
}

fn delta(a: [u64; 8], b: [u64; 8]) -> [u64; 8] {
    std::array::from_fn(|i| b[i] - a[i])
}

/// The counter one datagram should raise, as [`quic_counters`] orders
/// them.
fn slot(o: Outcome) -> usize {
    match o {
        Outcome::Routed(_) => 0,
        Outcome::Miss(m) => 1 + m.index(),
        Outcome::Down => 7,
    }
}

/// Whether a UDP frame's checksum field holds the folded pseudo-header
/// sum (RFC 768, RFC 8200 section 8.1), as a sender that leaves the
/// checksum to offload writes it: such frames go to user space, which
/// completes the checksum (one in 65,536 of any others by chance).
fn partial(frame: &[u8]) -> bool {
    let word = |b: &[u8]| u32::from(u16::from_be_bytes([b[0], b[1]]));
    let (addrs, l4) = if frame[12..14] == [0x86, 0xdd] {
        (&frame[22..54], 54)
    } else {
        (&frame[26..34], 34)
    };
    let len = frame.len() - l4;
    let mut sum: u32 = addrs.chunks(2).map(word).sum::<u32>() + 17 + len as u32;
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    word(&frame[l4 + 6..l4 + 8]) == sum
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What the draft says of a datagram to `h3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Routed to the backend of this server ID.
    Routed([u8; 2]),
    /// The server ID's backend is down.
    Down,
    /// Not routable, for this reason.
    Miss(Miss),
}

/// How a test datagram's payload is made.
#[derive(Debug, Clone)]
struct Datagram {
    /// 0 short header, 1 long header v1, 2 v2, 3 another version with
    /// octets appended to the connection ID, 4 codepoint 0b111, 5 an
    /// unconfigured codepoint, 6 a long header cut short, 7 a short
    /// header shorter than its configuration, 8 a long header whose
    /// self-described length is wrong, 9 empty, 10 any octets, 11 an empty
    /// long-header DCID, 12 version 1 or 2 with a 21..40 octet DCID.
    kind: u8,
    /// Backend 0-3's server ID (0001-0004), 4: 0009 (nobody's).
    backend: u8,
    /// Codepoint 0 (self-describing), else 2.
    cp0: bool,
    nonce: [u8; 6],
    low: u8,
    cut: usize,
    extra: usize,
}

fn server_id(backend: u8) -> [u8; 2] {
    if backend < 4 {
        [0, backend + 1]
    } else {
        [0, 9]
    }
}

impl Datagram {
    /// The payload, and the outcome its making implies (`None`: anything
    /// goes, both sides must only agree); `down` is the server ID whose
    /// backend is down, if any.
    fn make(&self, down: Option<[u8; 2]>) -> (Vec<u8>, Option<Outcome>) {
        let conf = encoder(if self.cp0 { 0 } else { 2 });
        let sid = server_id(self.backend);
        let cid = conf
            .encode(&sid, &self.nonce[..conf.nonce_len()], self.low)
            .expect("encode");
        let cid = cid.as_bytes().to_vec();
        let routed = if self.backend == 4 {
            Outcome::Miss(Miss::UnknownServerId)
        } else if down == Some(sid) {
            Outcome::Down
        } else {
            Outcome::Routed(sid)
        };
        let tail: Vec<u8> = (0..self.extra)
            .map(|i| self.nonce[i % 6] ^ i as u8)
            .collect();
        let long = |version: u32, dcid: &[u8]| {
            let mut p = vec![0xc0 | (self.low & 0x3f)];
            p.extend_from_slice(&version.to_be_bytes());
            p.push(dcid.len() as u8);
            p.extend_from_slice(dcid);
            let scid_len = self.extra % 21;
            p.push(scid_len as u8);
            p.extend_from_slice(&tail[..scid_len]);
            p.extend_from_slice(&[0x44, 0x9e, 1, 2, 3]);
            p
        };
        let short = |cid: &[u8]| {
            let mut p = vec![0x40 | (self.low & 0x3f)];
            p.extend_from_slice(cid);
            p.extend_from_slice(&tail);
            p
        };
        match self.kind {
            0 => (short(&cid), Some(routed)),
            1 => (long(1, &cid), Some(routed)),
            2 => (long(0x6b33_43cf, &cid), Some(routed)),
            3 => {
                // Servers may make connection IDs longer than the
                // configuration's: a length-describing one then says so.
                let mut dcid = cid.clone();
                dcid.extend_from_slice(&tail[..self.extra.min(30)]);
                let o = if self.cp0 && dcid.len() != cid.len() {
                    Outcome::Miss(Miss::LengthMismatch)
                } else {
                    routed
                };
                (long(0x1a2a_3a4a, &dcid), Some(o))
            }
            4 => {
                let mut c = cid.clone();
                c[0] |= 0xe0;
                (short(&c), Some(Outcome::Miss(Miss::Reserved)))
            }
            5 => {
                let cp = [1u8, 3, 4, 5, 6][self.cut % 5];
                let mut c = cid.clone();
                c[0] = (cp << 5) | (c[0] & 0x1f);
                let p = if self.extra.is_multiple_of(2) {
                    short(&c)
                } else {
                    long(1, &c)
                };
                (p, Some(Outcome::Miss(Miss::NoConfig)))
            }
            6 => {
                // Cut inside the header (before the SCID's end).
                let p = long(1, &cid);
                let header = 7 + cid.len() + self.extra % 21;
                (
                    p[..self.cut % header].to_vec(),
                    Some(Outcome::Miss(Miss::NotQuic)),
                )
            }
            7 => {
                // At least the first octet: shorter than that is empty.
                let have = 1 + self.cut % (cid.len() - 1);
                let mut p = vec![0x40];
                p.extend_from_slice(&cid[..have]);
                (p, Some(Outcome::Miss(Miss::TooShort)))
            }
            8 => {
                let conf = encoder(0);
                let cid = conf
                    .encode(&sid, &self.nonce[..6], 0)
                    .expect("encode")
                    .as_bytes()
                    .to_vec();
                let mut c = cid.clone();
                let wrong = ((c[0] & 0x1f) + 1 + (self.cut % 12) as u8) & 0x1f;
                c[0] = (c[0] & 0xe0) | wrong;
                (long(1, &c), Some(Outcome::Miss(Miss::LengthMismatch)))
            }
            9 => (Vec::new(), Some(Outcome::Miss(Miss::NotQuic))),
            10 => (tail, None),
            11 => (long(1, &[]), Some(Outcome::Miss(Miss::NotQuic))),
            _ => {
                let mut dcid = cid.clone();
                dcid.resize(21 + self.extra % 20, 0x5a);
                let version = if self.low & 1 == 0 { 1 } else { 0x6b33_43cf };
                (long(version, &dcid), Some(Outcome::Miss(Miss::NotQuic)))
            }
        }
    }
}

fn datagram() -> impl Strategy<Value = Datagram> {
    (
        0u8..13,
        0u8..5,
        any::<bool>(),
        any::<[u8; 6]>(),
        any::<u8>(),
        0usize..64,
        0usize..48,
    )
        .prop_map(|(kind, backend, cp0, nonce, low, cut, extra)| Datagram {
            kind,
            backend,
            cp0,
            nonce,
            low,
            cut,
            extra,
        })
}

/// A UDP frame over IPv4 or IPv6 (etherparse), TTL or hop limit `ttl`.
fn udp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, ttl: u8, payload: &[u8]) -> Vec<u8> {
    let ip = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpHeaders::Ipv4(
            Ipv4Header::new(0, ttl, etherparse::IpNumber::UDP, s.octets(), d.octets())
                .expect("header"),
            Default::default(),
        ),
        (IpAddr::V6(s), IpAddr::V6(d)) => IpHeaders::Ipv6(
            Ipv6Header {
                traffic_class: 0,
                flow_label: Ipv6FlowLabel::ZERO,
                payload_length: 0,
                next_header: etherparse::IpNumber::UDP,
                hop_limit: ttl,
                source: s.octets(),
                destination: d.octets(),
            },
            Default::default(),
        ),
        _ => panic!("one family"),
    };
    let mut out = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 9], [2, 0, 0, 0, 0x0e, 2])
        .ip(ip)
        .udp(sport, dport)
        .write(&mut out, payload)
        .expect("write");
    out
}

/// One step: a datagram, from which client, to which VIP, with what TTL,
/// and a change of the tables before it (1 backend 10.1.0.2 down, 2 up,
/// 3 a reload that swaps the server IDs of 10.1.0.1 and 10.1.0.3).
type Step = (Datagram, u8, bool, bool, bool, u8);

fn step() -> impl Strategy<Value = Step> {
    (
        datagram(),
        // Few clients, so flows repeat and the connection table decides
        // the misses; the last is martian (RFC 1122: 127.0.0.0/8).
        0u8..5,
        // IPv6.
        prop::sample::select(vec![false, false, true]),
        // To another port of h3's address (the any-port VIP).
        prop::sample::select(vec![false, false, false, false, true]),
        // TTL or hop limit 0.
        prop::sample::select(vec![false, false, false, false, false, false, true]),
        prop::sample::select(vec![0u8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3]),
    )
}

fn agree(steps: &[Step]) {
    let mut both = Both::new(config(&[], false));
    let mut down: Option<[u8; 2]> = None;
    let mut swapped = false;
    for (i, (d, client, v6, other_port, ttl0, event)) in steps.iter().enumerate() {
        match event {
            1 => {
                both.control.set_health("10.1.0.2", false);
                both.sync();
                down = Some([0, 2]);
            }
            2 => {
                both.control.set_health("10.1.0.2", true);
                both.sync();
                down = None;
            }
            3 => {
                swapped = !swapped;
                both.control.apply(config(&[], swapped)).expect("apply");
                if down.is_some() {
                    both.control.set_health("10.1.0.2", false);
                }
                both.sync();
            }
            _ => {}
        }
        let (payload, want) = d.make(down);
        let martian = *client == 4;
        let (src, dst) = if *v6 {
            let s: IpAddr = if martian {
                "::1".parse().expect("ip")
            } else {
                format!("2001:db8:19::{}", client + 1).parse().expect("ip")
            };
            (s, "2001:db8::443".parse().expect("ip"))
        } else {
            let s: IpAddr = if martian {
                [127, 0, 0, 5].into()
            } else {
                [198, 19, 0, client + 1].into()
            };
            (s, [198, 18, 0, 10].into())
        };
        let dport = if *other_port { 8443 } else { 443 };
        let sport = 40000 + u16::from(*client);
        let frame = udp(src, dst, sport, dport, if *ttl0 { 0 } else { 64 }, &payload);
        let (x0, w0) = (both.xdp_quic(), both.worker_quic());
        let v = both.xdp.run(&frame).expect("test run");
        let sent = both.worker(&frame);
        let (dx, dw) = (delta(x0, both.xdp_quic()), delta(w0, both.worker_quic()));
        let what = format!("step {i}: {d:?} v6 {v6} port {dport} ttl0 {ttl0} martian {martian}");
        // The worker: what the draft says, counted once. Another port of
        // h3's IPv4 address is the any-port VIP's; of its IPv6 address,
        // no VIP's.
        let reads = !*other_port;
        let decided = !(*v6 && *other_port);
        if let (Some(o), true) = (want, reads) {
            let mut w = [0; 8];
            w[slot(o)] = 1;
            assert_eq!(dw, w, "{what}: the worker's QUIC counters");
        }
        if !reads {
            assert_eq!(dw, [0; 8], "{what}: read a non-quic VIP's datagram");
        }
        match v.action {
            XDP_TX => {
                assert_eq!(
                    Some(hex(&v.frame)),
                    sent.as_deref().map(hex),
                    "{what}: the driver forwarded differently from the worker"
                );
                assert_eq!(dx, dw, "{what}: the driver's QUIC counters");
                if let (Some(Outcome::Routed(sid)), true) = (want, reads) {
                    let d = packet::gre::decapsulate(&v.frame).expect("GRE");
                    let backend = match (sid[1], swapped) {
                        (1, true) => 3,
                        (3, true) => 1,
                        (n, _) => n,
                    };
                    assert_eq!(
                        packet::flow::to_ip(&d.outer_dst),
                        IpAddr::from([10, 1, 0, backend]),
                        "{what}: routed to the server ID's backend"
                    );
                }
            }
            XDP_DROP => {
                assert_eq!(sent, None, "{what}: the driver dropped, the worker sent");
                assert!(martian || *ttl0, "{what}: dropped");
                assert_eq!(dx, dw, "{what}: the driver's QUIC counters");
            }
            _ => {
                // Left to user space: the worker alone counts it.
                assert_eq!(dx, [0; 8], "{what}: the driver counted what it left");
                // Only what must be: a port no VIP serves, or a checksum
                // field that reads as left partial (every pool keeps a
                // healthy backend).
                assert!(
                    !decided || partial(&frame),
                    "{what}: left to user space ({})",
                    v.action
                );
            }
        }
        if let (Some(Outcome::Routed(_)), true, false) = (want, reads, martian || *ttl0) {
            assert_eq!(
                v.action, XDP_TX,
                "{what}: routable, not routed in the driver"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    #[ignore = "system test: root (BPF programs and maps)"]
    fn the_driver_routes_plaintext_quic_as_the_worker_does(steps in prop::collection::vec(step(), 1..60)) {
        agree(&steps);
    }
}

/// A `quic` VIP with an encrypted configuration (alone, or beside a
/// plaintext one) is left to user space whole, and so is every VIP of its
/// address and protocol; other VIPs stay in the driver.
#[test]
#[ignore = "system test: root (BPF programs and maps)"]
fn an_encrypted_configuration_leaves_its_vips_to_user_space() {
    for keys in [&[0u8, 2][..], &[2][..]] {
        let mut both = Both::new(config(keys, false));
        // A routable datagram at the plaintext codepoint (0) where there
        // is one, and at the encrypted one.
        for cp0 in [true, false] {
            let d = Datagram {
                kind: 0,
                backend: 1,
                cp0,
                nonce: [1, 2, 3, 4, 5, 6],
                low: 0,
                cut: 0,
                extra: 20,
            };
            let (payload, _) = d.make(None);
            let src: IpAddr = [198, 19, 0, 1].into();
            let src6: IpAddr = "2001:db8:19::1".parse().expect("ip");
            let v6: IpAddr = "2001:db8::443".parse().expect("ip");
            for f in [
                udp(src, [198, 18, 0, 10].into(), 40000, 443, 64, &payload),
                udp(src, [198, 18, 0, 10].into(), 40000, 8443, 64, &payload),
                udp(src6, v6, 40000, 443, 64, &payload),
                udp(src, [198, 18, 70, 10].into(), 40000, 443, 64, &payload),
                udp(src, [198, 18, 70, 10].into(), 40000, 8443, 64, &payload),
            ] {
                let x0 = both.xdp_quic();
                let v = both.xdp.run(&f).expect("test run");
                assert!(
                    v.action != XDP_TX && v.action != XDP_DROP,
                    "keys {keys:?}: {} decided in the driver ({})",
                    hex(&f),
                    v.action
                );
                assert_eq!(both.xdp_quic(), x0, "counted in the driver");
                assert!(both.worker(&f).is_some(), "the worker forwards it");
            }
        }
        // Another address's VIP is still forwarded in the driver.
        let dns = udp(
            [198, 19, 0, 1].into(),
            [198, 18, 0, 53].into(),
            40000,
            53,
            64,
            b"query",
        );
        assert_eq!(both.xdp.run(&dns).expect("test run").action, XDP_TX);
    }
}

/// A plaintext configuration's VIP is forwarded in the driver (what the
/// program left to user space before), and a reload that changes the
/// server IDs is read at once: the driver routes by the new ones.
#[test]
#[ignore = "system test: root (BPF programs and maps)"]
fn a_reload_rewrites_the_server_ids() {
    let mut both = Both::new(config(&[], false));
    let d = Datagram {
        kind: 0,
        backend: 0,
        cp0: false,
        nonce: [9; 6],
        low: 3,
        cut: 0,
        extra: 10,
    };
    let (payload, _) = d.make(None);
    let f = udp(
        [198, 19, 0, 7].into(),
        [198, 18, 0, 10].into(),
        40000,
        443,
        64,
        &payload,
    );
    let to = |both: &Both| {
        let v = both.xdp.run(&f).expect("test run");
        assert_eq!(v.action, XDP_TX, "not forwarded in the driver");
        let d = packet::gre::decapsulate(&v.frame).expect("GRE");
        packet::flow::to_ip(&d.outer_dst)
    };
    assert_eq!(to(&both), IpAddr::from([10, 1, 0, 1]));
    both.control.apply(config(&[], true)).expect("apply");
    both.sync();
    assert_eq!(to(&both), IpAddr::from([10, 1, 0, 3]));
    let c = both.tables.counters().expect("counters");
    assert_eq!(c.quic_routed, 2);
}

/// A packet-tracer probe to a `quic` VIP (its payload, "FPTRACE1", reads
/// as a short header at codepoint 2) goes to user space, which counts its
/// connection ID once: the driver counts nothing for it.
#[test]
#[ignore = "system test: root (BPF programs and maps)"]
fn a_probe_to_a_quic_vip_is_counted_once_in_user_space() {
    let mut both = Both::new(config(&[], false));
    let mut probe = b"FPTRACE1".to_vec();
    probe.extend_from_slice(&[0; 24]);
    let f = udp(
        [198, 19, 0, 7].into(),
        [198, 18, 0, 10].into(),
        40000,
        443,
        64,
        &probe,
    );
    let x0 = both.xdp_quic();
    let v = both.xdp.run(&f).expect("test run");
    assert!(
        v.action != XDP_TX && v.action != XDP_DROP,
        "decided in the driver"
    );
    assert_eq!(both.xdp_quic(), x0, "counted in the driver");
    let w0 = both.worker_quic();
    both.worker(&f);
    assert_eq!(delta(w0, both.worker_quic()).iter().sum::<u64>(), 1);
}

/// A prefix group's `quic` VIP (matched by suffix) routes by connection ID
/// in the driver as the worker routes it, and the any-port VIP of its
/// suffix takes the other ports there.
#[test]
#[ignore = "system test: root (BPF programs and maps)"]
fn a_prefix_groups_quic_vip_routes_in_the_driver() {
    let mut both = Both::new(config(&[], false));
    for backend in 0..4u8 {
        let d = Datagram {
            kind: 1,
            backend,
            cp0: true,
            nonce: [backend, 2, 3, 4, 5, 6],
            low: 0,
            cut: 0,
            extra: 8,
        };
        let (payload, _) = d.make(None);
        for (cluster, dport) in [(64u8, 443u16), (79, 443), (70, 8443)] {
            let f = udp(
                [198, 19, 0, 1].into(),
                [198, 18, cluster, 10].into(),
                40000,
                dport,
                64,
                &payload,
            );
            let (x0, w0) = (both.xdp_quic(), both.worker_quic());
            let v = both.xdp.run(&f).expect("test run");
            assert_eq!(v.action, XDP_TX, "{}: not forwarded in the driver", hex(&f));
            assert_eq!(Some(hex(&v.frame)), both.worker(&f).as_deref().map(hex));
            let (dx, dw) = (delta(x0, both.xdp_quic()), delta(w0, both.worker_quic()));
            assert_eq!(dx, dw, "the driver's QUIC counters");
            let outer =
                packet::flow::to_ip(&packet::gre::decapsulate(&v.frame).expect("GRE").outer_dst);
            if dport == 443 {
                assert_eq!(dx[0], 1, "routed by connection ID");
                assert_eq!(outer, IpAddr::from([10, 1, 0, backend + 1]));
            } else {
                assert_eq!(dx, [0; 8], "another VIP's datagram read as QUIC");
                assert!(matches!(outer, IpAddr::V4(a) if a.octets()[..3] == [10, 2, 0]));
            }
        }
    }
}
