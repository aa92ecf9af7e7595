//! The forwarder under hostile input: arbitrary sequences of
//! frames built around the sample configuration (TCP and UDP to VIPs and
//! elsewhere, IPv4 and IPv6, fragments of real datagrams in any order,
//! duplicated, overlapping and missing, lone later fragments, ICMP errors
//! quoting VIP flows or anything, 802.1Q tags, truncations, link padding,
//! flipped bytes, garbage; QUIC datagrams to the oracle's `quic` VIPs:
//! connection IDs servers issued under plaintext, single-pass and
//! four-pass configurations for backends and for no backend, every
//! codepoint, self-described lengths that lie, truncated headers,
//! connection IDs over 20 octets, empty datagrams) run through the
//! datapath inline and with two
//! packet threads. Every run must end on its own, return every buffer,
//! forward only valid GRE carrying an input packet to the backend the model
//! names, forward whatever must be, and account for every frame:
//! received = forwarded + dropped by reason (expired included). The checks
//! live in `crates/lb/fuzz/oracle.rs`, shared with the `forward_sequence`
//! fuzz target.
//!
//! 64 cases by default (`PROPTEST_CASES` for more). With
//! `LIVENESS_SEEDS=<dir>` every generated sequence is also written there as
//! a fuzz input (`make fuzz` seeds its corpus so).

#[path = "../fuzz/oracle.rs"]
mod oracle;

use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::Duration;

use packet::build::{Frame, L4};
use packet::proto;
use proptest::prelude::*;

use lb_sample::CONFIG;
use oracle::Oracle;

/// How long a run may take before the watchdog stops it (runs take
/// milliseconds).
const DEADLINE: Duration = Duration::from_secs(10);

/// Most frames in a sequence.
const MAX_SEQUENCE: usize = 60;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test addresses are valid")
}

// The vocabulary: index 0 and 1 of the destinations are VIP addresses of
// the sample configuration (192.0.2.80 TCP port 80, 192.0.2.53 UDP any
// port, 2001:db8::80 TCP port 80), index 3 the oracle's `quic` VIPs (UDP
// port 443, `oracle::QUIC_CONFIG`); the others are not.
const SRC4: [&str; 3] = ["203.0.113.1", "203.0.113.2", "198.51.100.7"];
const SRC6: [&str; 3] = ["2001:db8:1::1", "2001:db8:1::2", "2001:db8:2::9"];
const DST4: [&str; 4] = ["192.0.2.80", "192.0.2.53", "192.0.2.99", "192.0.2.43"];
const DST6: [&str; 4] = [
    "2001:db8::80",
    "2001:db8::53",
    "2001:db8::99",
    "2001:db8::43",
];
/// Index of the `quic` VIPs' addresses in [`DST4`] and [`DST6`].
const QUIC_DST: usize = 3;
/// Server IDs for connection IDs: those of the `quic` pool's backends
/// (`oracle::QUIC_CONFIG`; h3-c drained, h3-d down), then two no backend has.
const SERVER_IDS: [[u8; 5]; 6] = [
    [0xa1; 5],
    [0x00; 5],
    [0xc3; 5],
    [0xff; 5],
    [0xa1, 0xa1, 0xa1, 0xa1, 0xa2],
    [1, 2, 3, 4, 5],
];
/// Long header versions: 1, 2 (both limit connection IDs to 20 octets),
/// version negotiation, a draft version and a greasing one (no limit).
const VERSIONS: [u32; 5] = [1, 0x6b33_43cf, 0, 0xff00_001d, 0x1a2a_3a4a];
const ROUTER4: &str = "198.51.100.1";
const ROUTER6: &str = "2001:db8:ffff::1";
const PORTS: [u16; 5] = [80, 53, 443, 1000, 40_000];
/// Fragment identifications: few, so datagrams and lone fragments collide;
/// the third differs from the first only above 16 bits (equal in IPv4).
const IDENTS: [u32; 3] = [0x1111, 0x2222, 0x1_1111];

/// A 5-tuple from the vocabulary.
#[derive(Debug, Clone, Copy)]
struct Flow {
    v6: bool,
    src: usize,
    dst: usize,
    sport: usize,
    dport: usize,
    udp: bool,
}

impl Flow {
    fn src(&self) -> IpAddr {
        ip(if self.v6 { SRC6 } else { SRC4 }[self.src])
    }

    fn dst(&self) -> IpAddr {
        ip(if self.v6 { DST6 } else { DST4 }[self.dst])
    }

    fn proto(&self) -> u8 {
        if self.udp {
            proto::UDP
        } else {
            proto::TCP
        }
    }

    /// A whole packet of this flow (from `src` to `dst`, or the reverse).
    fn packet(&self, reverse: bool, flags: u8, payload: &[u8]) -> Frame {
        let (mut s, mut d, mut sp, mut dp) =
            (self.src(), self.dst(), PORTS[self.sport], PORTS[self.dport]);
        if reverse {
            (s, d, sp, dp) = (d, s, dp, sp);
        }
        if self.udp {
            Frame::udp(s, d, sp, dp, payload)
        } else {
            Frame::tcp(s, d, sp, dp, flags, payload)
        }
    }
}

/// What an ICMP error quotes.
#[derive(Debug, Clone)]
enum Quote {
    /// A packet of a flow the other way (VIP to client, as a router sees
    /// the reply it could not forward), cut to `len` bytes.
    Flow(Flow, usize),
    /// Anything.
    Bytes(Vec<u8>),
}

/// A piece of a datagram: from 8-byte unit `start`, `units` long (cut at
/// the datagram's end); `lie` flips its more-fragments flag.
#[derive(Debug, Clone, Copy)]
struct Piece {
    start: u16,
    units: u16,
    lie: bool,
}

/// One item of a sequence: one frame, or the pieces of a datagram.
#[derive(Debug, Clone)]
enum Item {
    /// A whole TCP segment or UDP datagram.
    Plain {
        flow: Flow,
        flags: u8,
        payload: usize,
    },
    /// A real datagram cut at 8-byte multiples, pieces in the order given.
    Datagram {
        flow: Flow,
        ident: usize,
        payload: usize,
        pieces: Vec<Piece>,
    },
    /// A later fragment alone (its first fragment may never come).
    Lone {
        flow: Flow,
        ident: usize,
        offset: u16,
        more: bool,
        len: usize,
    },
    /// An ICMP error (frag-needed, packet-too-big) or another ICMP message
    /// to a destination of the vocabulary.
    Icmp {
        v6: bool,
        dst: usize,
        error: bool,
        quote: Quote,
    },
    /// Bytes, after an Ethernet header of some kind or none.
    Garbage { header: u8, bytes: Vec<u8> },
    /// A UDP datagram to a `quic` VIP (port 443, or another port that no
    /// VIP serves).
    Quic {
        v6: bool,
        src: usize,
        sport: usize,
        served: bool,
        payload: QuicPayload,
    },
}

/// The UDP payload of an [`Item::Quic`].
#[derive(Debug, Clone)]
enum QuicPayload {
    /// A connection ID a server issued under configuration `conf` (of the
    /// oracle's, modulo their number) with server ID `sid` (of
    /// [`SERVER_IDS`]), in a short header or a long one of version
    /// `long` (of [`VERSIONS`]); its first octet's low five bits replaced
    /// by `low` when given (a self-described length that lies), cut to
    /// `cut` octets, `append` octets added (servers may), `tail` octets
    /// after the header.
    Cid {
        long: Option<usize>,
        conf: usize,
        sid: usize,
        nonce: [u8; 19],
        random: u8,
        low: Option<u8>,
        cut: Option<usize>,
        append: usize,
        tail: usize,
    },
    /// A destination connection ID of any first octet (every codepoint,
    /// 0b111 included) and octets.
    AnyCid {
        long: Option<usize>,
        first: u8,
        rest: Vec<u8>,
        tail: usize,
    },
    /// A long header of these lengths (over 20, past the end) of which
    /// `have` octets are present.
    Lengths {
        version: usize,
        dcid_len: u8,
        scid_len: u8,
        have: usize,
    },
    /// An empty datagram.
    Empty,
}

impl QuicPayload {
    fn bytes(&self) -> Vec<u8> {
        // A long header around `dcid` (an 8-octet SCID), or a short one.
        let header = |long: Option<usize>, dcid: &[u8], tail: usize| {
            let mut b = match long {
                Some(v) => {
                    let mut b = vec![0xc3];
                    b.extend_from_slice(&VERSIONS[v % VERSIONS.len()].to_be_bytes());
                    b.push(dcid.len() as u8);
                    b.extend_from_slice(dcid);
                    b.push(8);
                    b.extend_from_slice(&[0x5c; 8]);
                    b
                }
                None => {
                    let mut b = vec![0x41];
                    b.extend_from_slice(dcid);
                    b
                }
            };
            b.resize(b.len() + tail, 0x70);
            b
        };
        match self {
            QuicPayload::Cid {
                long,
                conf,
                sid,
                nonce,
                random,
                low,
                cut,
                append,
                tail,
            } => {
                let confs = oracle().quic_configs();
                let c = &confs[conf % confs.len()];
                let mut cid = c
                    .encode(&SERVER_IDS[*sid], &nonce[..c.nonce_len()], *random)
                    .expect("lengths as configured")
                    .as_bytes()
                    .to_vec();
                if let Some(low) = low {
                    cid[0] = (cid[0] & 0xe0) | (low & 0x1f);
                }
                if let Some(cut) = cut {
                    cid.truncate(*cut);
                }
                cid.resize(cid.len() + append, 0x3d);
                header(*long, &cid, *tail)
            }
            QuicPayload::AnyCid {
                long,
                first,
                rest,
                tail,
            } => {
                let mut cid = vec![*first];
                cid.extend_from_slice(rest);
                header(*long, &cid, *tail)
            }
            QuicPayload::Lengths {
                version,
                dcid_len,
                scid_len,
                have,
            } => {
                let mut b = vec![0xc0];
                b.extend_from_slice(&VERSIONS[version % VERSIONS.len()].to_be_bytes());
                b.push(*dcid_len);
                b.extend((0..*dcid_len).map(|i| i.wrapping_mul(37)));
                b.push(*scid_len);
                b.resize(b.len() + usize::from(*scid_len) + 4, 0x5c);
                b.truncate(*have);
                b
            }
            QuicPayload::Empty => Vec::new(),
        }
    }
}

/// What is done to one frame of an item.
#[derive(Debug, Clone, Copy)]
enum Mutation {
    /// Cut to this fraction (in 256ths) of its length.
    Truncate(u8),
    /// Link padding of this many zero bytes.
    Pad(u8),
    /// A byte (position modulo the length) xored.
    Flip(u16, u8),
}

/// An item with a possible 802.1Q tag on its frames and a possible
/// mutation of one of them.
#[derive(Debug, Clone)]
struct Wrapped {
    item: Item,
    vlan: Option<u16>,
    mutation: Option<(usize, Mutation)>,
}

impl Wrapped {
    fn frames(&self) -> Vec<Vec<u8>> {
        let mut frames: Vec<Frame> = Vec::new();
        let mut raw: Vec<Vec<u8>> = Vec::new();
        match &self.item {
            Item::Plain {
                flow,
                flags,
                payload,
            } => frames.push(flow.packet(false, *flags, &vec![0x61; *payload])),
            Item::Datagram {
                flow,
                ident,
                payload,
                pieces,
            } => {
                let whole = flow.packet(false, 0x18, &vec![0x62; *payload]);
                let bytes = whole.to_bytes();
                let l4_at = bytes.len() - l4_len(&whole);
                let l4 = &bytes[l4_at..];
                for p in pieces {
                    let from = (usize::from(p.start) * 8).min((l4.len() - 1) / 8 * 8);
                    let to = (from + usize::from(p.units.max(1)) * 8).min(l4.len());
                    let more = (to < l4.len()) != p.lie;
                    frames.push(
                        Frame::new(
                            flow.src(),
                            flow.dst(),
                            L4::Raw(flow.proto(), l4[from..to].to_vec()),
                        )
                        .fragment(IDENTS[*ident], from as u16, more),
                    );
                }
            }
            Item::Lone {
                flow,
                ident,
                offset,
                more,
                len,
            } => frames.push(
                Frame::new(
                    flow.src(),
                    flow.dst(),
                    L4::Raw(flow.proto(), vec![0x63; *len]),
                )
                .fragment(IDENTS[*ident], offset * 8, *more),
            ),
            Item::Icmp {
                v6,
                dst,
                error,
                quote,
            } => {
                let quoted = match quote {
                    Quote::Flow(f, len) => {
                        let b = Flow { v6: *v6, ..*f }
                            .packet(true, 0x10, b"reply")
                            .to_bytes();
                        b[14..].iter().copied().take(*len).collect()
                    }
                    Quote::Bytes(b) => b.clone(),
                };
                let (router, to) = if *v6 {
                    (ip(ROUTER6), ip(DST6[*dst]))
                } else {
                    (ip(ROUTER4), ip(DST4[*dst]))
                };
                // Frag-needed (3/4) or packet-too-big (2/0); else an echo
                // request, which quotes nothing.
                let (kind, code) = match (*v6, *error) {
                    (false, true) => (3, 4),
                    (true, true) => (2, 0),
                    (false, false) => (8, 0),
                    (true, false) => (128, 0),
                };
                frames.push(Frame::icmp(router, to, kind, code, 1280, &quoted));
            }
            Item::Garbage { header, bytes } => {
                let mut f = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01];
                match header % 4 {
                    0 => f.clear(),
                    1 => f.extend_from_slice(&[0x08, 0x00]),
                    2 => f.extend_from_slice(&[0x86, 0xdd]),
                    _ => f.extend_from_slice(&[0x81, 0x00, 0x00, 0x07, 0x08, 0x00]),
                }
                f.extend_from_slice(bytes);
                raw.push(f);
            }
            Item::Quic {
                v6,
                src,
                sport,
                served,
                payload,
            } => {
                let (s, d) = if *v6 {
                    (ip(SRC6[*src]), ip(DST6[QUIC_DST]))
                } else {
                    (ip(SRC4[*src]), ip(DST4[QUIC_DST]))
                };
                let dport = if *served { 443 } else { 8443 };
                frames.push(Frame::udp(s, d, PORTS[*sport], dport, &payload.bytes()));
            }
        }
        let mut out: Vec<Vec<u8>> = frames
            .into_iter()
            .map(|mut f| {
                f.eth.vlan = self.vlan;
                f.to_bytes()
            })
            .chain(raw)
            .collect();
        if let Some((which, m)) = self.mutation {
            if !out.is_empty() {
                let k = which % out.len();
                let f = &mut out[k];
                match m {
                    Mutation::Truncate(frac) => {
                        f.truncate(f.len() * usize::from(frac) / 256);
                    }
                    Mutation::Pad(n) => f.resize(f.len() + usize::from(n), 0),
                    Mutation::Flip(at, x) => {
                        if !f.is_empty() {
                            let i = usize::from(at) % f.len();
                            f[i] ^= x.max(1);
                        }
                    }
                }
            }
        }
        out
    }
}

/// Bytes of a frame's transport layer.
fn l4_len(f: &Frame) -> usize {
    match &f.l4 {
        L4::Tcp(t) => t.buffer_len(),
        L4::Udp(u) => u.buffer_len(),
        L4::Icmp(i) => i.buffer_len(),
        L4::Raw(_, b) => b.len(),
    }
}

/// A flow to one of the sample's VIPs most of the time, else any flow of
/// the vocabulary (mostly not for a VIP).
fn flow() -> impl Strategy<Value = Flow> {
    let any_flow = (
        any::<bool>(),
        0..SRC4.len(),
        0..DST4.len(),
        0..PORTS.len(),
        0..PORTS.len(),
        any::<bool>(),
    )
        .prop_map(|(v6, src, dst, sport, dport, udp)| Flow {
            v6,
            src,
            dst,
            sport,
            dport,
            udp,
        });
    // 192.0.2.80 TCP port 80, 192.0.2.53 UDP any port, 2001:db8::80 TCP
    // port 80.
    let vip_flow = (0..3usize, 0..SRC4.len(), 0..PORTS.len(), 0..PORTS.len()).prop_map(
        |(vip, src, sport, any_port)| Flow {
            v6: vip == 2,
            src,
            dst: usize::from(vip == 1),
            sport,
            dport: if vip == 1 { any_port } else { 0 },
            udp: vip == 1,
        },
    );
    prop_oneof![3 => vip_flow, 2 => any_flow]
}

fn piece() -> impl Strategy<Value = Piece> {
    (
        prop_oneof![2 => Just(0u16), 3 => 0u16..32],
        1u16..12,
        prop::bool::weighted(0.1),
    )
        .prop_map(|(start, units, lie)| Piece { start, units, lie })
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        3 => (flow(), prop_oneof![Just(0x02u8), Just(0x10), Just(0x18), Just(0x11), Just(0x04), any::<u8>()], 0usize..80)
            .prop_map(|(flow, flags, payload)| Item::Plain { flow, flags, payload }),
        4 => (flow(), 0..IDENTS.len(), 0usize..200, prop::collection::vec(piece(), 1..8))
            .prop_map(|(flow, ident, payload, pieces)| Item::Datagram { flow, ident, payload, pieces }),
        2 => (flow(), 0..IDENTS.len(), 1u16..64, any::<bool>(), 1usize..64)
            .prop_map(|(flow, ident, offset, more, len)| Item::Lone { flow, ident, offset, more, len }),
        2 => (
            any::<bool>(),
            0..DST4.len(),
            prop::bool::weighted(0.85),
            prop_oneof![
                3 => (flow(), prop_oneof![Just(28usize), Just(48), 0usize..120])
                    .prop_map(|(f, len)| Quote::Flow(f, len)),
                1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Quote::Bytes),
            ],
        )
            .prop_map(|(v6, dst, error, quote)| Item::Icmp { v6, dst, error, quote }),
        1 => (any::<u8>(), prop::collection::vec(any::<u8>(), 0..100))
            .prop_map(|(header, bytes)| Item::Garbage { header, bytes }),
        3 => (
            any::<bool>(),
            0..SRC4.len(),
            0..PORTS.len(),
            prop::bool::weighted(0.9),
            quic_payload(),
        )
            .prop_map(|(v6, src, sport, served, payload)| Item::Quic { v6, src, sport, served, payload }),
    ]
}

/// A UDP payload for a `quic` VIP: mostly connection IDs the servers
/// issued (under every configuration, for backends and for no backend),
/// else any first octet, header lengths that lie, nothing.
fn quic_payload() -> impl Strategy<Value = QuicPayload> {
    let long = prop::option::weighted(0.4, 0..VERSIONS.len());
    prop_oneof![
        6 => (
            long.clone(),
            0usize..4,
            0..SERVER_IDS.len(),
            any::<[u8; 19]>(),
            any::<u8>(),
            prop::option::weighted(0.15, any::<u8>()),
            prop::option::weighted(0.15, 0usize..20),
            prop_oneof![4 => Just(0usize), 1 => 1usize..6],
            0usize..40,
        )
            .prop_map(|(long, conf, sid, nonce, random, low, cut, append, tail)| QuicPayload::Cid {
                long, conf, sid, nonce, random, low, cut, append, tail,
            }),
        2 => (long, any::<u8>(), prop::collection::vec(any::<u8>(), 0..24), 0usize..40)
            .prop_map(|(long, first, rest, tail)| QuicPayload::AnyCid { long, first, rest, tail }),
        2 => (
            0..VERSIONS.len(),
            prop_oneof![3 => 0u8..=22, 1 => any::<u8>()],
            prop_oneof![3 => 0u8..=22, 1 => any::<u8>()],
            0usize..80,
        )
            .prop_map(|(version, dcid_len, scid_len, have)| QuicPayload::Lengths {
                version, dcid_len, scid_len, have,
            }),
        1 => Just(QuicPayload::Empty),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0u8..=255).prop_map(Mutation::Truncate),
        (1u8..64).prop_map(Mutation::Pad),
        (any::<u16>(), any::<u8>()).prop_map(|(at, x)| Mutation::Flip(at, x)),
    ]
}

fn wrapped() -> impl Strategy<Value = Wrapped> {
    (
        item(),
        prop::option::weighted(0.15, 0u16..4096),
        prop::option::weighted(0.15, (0usize..8, mutation())),
    )
        .prop_map(|(item, vlan, mutation)| Wrapped {
            item,
            vlan,
            mutation,
        })
}

/// A sequence: items, and whether (with which seed) their frames are
/// interleaved at random rather than kept item by item.
#[derive(Debug, Clone)]
struct Sequence {
    items: Vec<Wrapped>,
    shuffle: Option<u64>,
}

impl Sequence {
    fn frames(&self) -> Vec<Vec<u8>> {
        let mut frames: Vec<Vec<u8>> = self.items.iter().flat_map(Wrapped::frames).collect();
        frames.truncate(MAX_SEQUENCE);
        if let Some(seed) = self.shuffle {
            // Fisher-Yates with a splitmix64 stream: deterministic per seed.
            let mut x = seed;
            for i in (1..frames.len()).rev() {
                x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                frames.swap(i, (z % (i as u64 + 1)) as usize);
            }
        }
        frames
    }
}

fn sequence() -> impl Strategy<Value = Sequence> {
    (
        prop::collection::vec(wrapped(), 0..24),
        prop::option::of(any::<u64>()),
    )
        .prop_map(|(items, shuffle)| Sequence { items, shuffle })
}

fn oracle() -> &'static Oracle {
    static ORACLE: OnceLock<Oracle> = OnceLock::new();
    ORACLE.get_or_init(|| Oracle::new(&oracle::with_quic(CONFIG)))
}

/// Runs one sequence inline and with two packet threads, each on a fresh
/// datapath (so a leak in one case cannot fail the next).
fn check(frames: &[Vec<u8>]) -> Result<(), TestCaseError> {
    let o = oracle();
    for threads in [0, 2] {
        let dp = o.datapath(threads);
        o.check(&dp, frames, DEADLINE).map_err(|e| {
            TestCaseError::fail(format!(
                "threads={threads}: {e}\nframes (hex):\n{}",
                frames
                    .iter()
                    .map(|f| oracle::hex(f))
                    .collect::<Vec<_>>()
                    .join("\n")
            ))
        })?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64),
        // A hang costs the watchdog's deadline per shrinking step.
        max_shrink_time: 120_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_sequence_ends_with_every_frame_accounted_for(s in sequence()) {
        let frames = s.frames();
        if let Some(dir) = std::env::var_os("LIVENESS_SEEDS") {
            write_seed(std::path::Path::new(&dir), &frames);
        }
        check(&frames)?;
    }
}

/// Writes a sequence as a fuzz input named by its contents.
fn write_seed(dir: &std::path::Path, frames: &[Vec<u8>]) {
    use std::hash::{Hash, Hasher};
    let data = oracle::encode(frames);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    data.hash(&mut h);
    std::fs::create_dir_all(dir).expect("creating the seed directory");
    std::fs::write(dir.join(format!("liveness-{:016x}", h.finish())), data)
        .expect("writing a seed");
}

/// Hand-picked sequences the generator reaches only by chance.
#[test]
fn known_hostile_sequences() {
    let (src, dns, web) = (ip("203.0.113.9"), ip("192.0.2.53"), ip("192.0.2.80"));
    let frag = |dst: IpAddr, ident: u32, off: u16, more: bool, data: &[u8]| {
        Frame::new(src, dst, L4::Raw(proto::UDP, data.to_vec()))
            .fragment(ident, off, more)
            .to_bytes()
    };
    let whole = Frame::udp(src, dns, 4000, 53, &[9; 40]).to_bytes();
    let l4 = whole[14 + 20..].to_vec();
    let cases: Vec<Vec<Vec<u8>>> = vec![
        // Nothing at all.
        vec![],
        // One lone later fragment.
        vec![frag(dns, 7, 8, false, &[1; 8])],
        // Nine later fragments of one datagram (more than the table holds
        // per datagram), then its first fragment twice.
        (0..9)
            .map(|k| frag(dns, 8, 8 * (k + 1), k < 8, &[2; 8]))
            .chain([
                frag(dns, 8, 0, true, &l4[..8]),
                frag(dns, 8, 0, true, &l4[..8]),
            ])
            .collect(),
        // Overlapping pieces, a duplicate, the last first.
        vec![
            frag(dns, 9, 40, false, &l4[40..]),
            frag(dns, 9, 16, true, &l4[16..40]),
            frag(dns, 9, 8, true, &l4[8..32]),
            frag(dns, 9, 16, true, &l4[16..40]),
            frag(dns, 9, 0, true, &l4[..16]),
        ],
        // UDP to the TCP-only VIP: the first fragment is dropped, the later
        // one waits in vain.
        vec![
            frag(web, 10, 24, false, &[3; 8]),
            frag(web, 10, 0, true, &l4[..24]),
        ],
        // A tagged ICMP error quoting a VIP flow, then one quoting garbage.
        {
            let q = Frame::tcp(web, src, 80, 1234, 0x10, b"").to_bytes();
            let mut e = Frame::icmp(ip("198.51.100.1"), web, 3, 4, 1400, &q[14..14 + 28]);
            e.eth.vlan = Some(42);
            vec![
                e.to_bytes(),
                Frame::icmp(ip("198.51.100.1"), web, 3, 4, 1400, &[0x45; 30]).to_bytes(),
            ]
        },
    ];
    for frames in &cases {
        check(frames).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A datagram to a `quic` VIP whose UDP length says less than its IP
/// packet holds: its payload ends where the UDP header says (RFC 768), so
/// a connection ID in the octets after it is not the datagram's and routes
/// nothing (IPv4 and IPv6; the model reads only what the UDP length covers).
#[test]
fn a_quic_payload_ends_where_its_udp_length_says() {
    let confs = oracle().quic_configs();
    let mut cases = Vec::new();
    for v6 in [false, true] {
        let (src, vip) = if v6 {
            (ip(SRC6[0]), ip(DST6[QUIC_DST]))
        } else {
            (ip(SRC4[0]), ip(DST4[QUIC_DST]))
        };
        for c in &confs {
            let cid = c
                .encode(&SERVER_IDS[0], &[7; 19][..c.nonce_len()], 0)
                .expect("lengths as configured");
            let mut payload = vec![0x41];
            payload.extend_from_slice(cid.as_bytes());
            payload.extend_from_slice(&[0x70; 24]);
            let whole = Frame::udp(src, vip, 40_000, 443, &payload).to_bytes();
            let udp_at = 14 + if v6 { 40 } else { 20 };
            // Nothing, the first octet and 3 of the connection ID (short
            // for every configuration), all but the last octet of it.
            for covers in [0, 4, cid.as_bytes().len()] {
                let mut f = whole.clone();
                f[udp_at + 4..udp_at + 6].copy_from_slice(&(8 + covers as u16).to_be_bytes());
                cases.push(f);
            }
        }
    }
    check(&cases).unwrap_or_else(|e| panic!("{e}"));
}

/// The fuzz input format round-trips.
#[test]
fn fuzz_encoding_round_trips() {
    let frames = vec![vec![], vec![1, 2, 3], vec![7; 1500]];
    assert_eq!(oracle::decode(&oracle::encode(&frames)), frames);
}

/// The fuzz target's body in `make test` (a short, random, not
/// coverage-guided run; `make fuzz` runs the real thing): raw bytes decoded
/// as the fuzzer decodes them, through one long-lived datapath per mode as
/// in `crates/lb/fuzz/fuzz_targets/forward_sequence.rs`, so a buffer leaked
/// by one input shows on that input.
fn fuzz_body(data: &[u8]) -> Result<(), TestCaseError> {
    static DPS: OnceLock<[std::sync::Arc<lb::datapath::Datapath>; 2]> = OnceLock::new();
    let o = oracle();
    let dps = DPS.get_or_init(|| [o.datapath(0), o.datapath(2)]);
    let frames = oracle::decode(data);
    for (dp, threads) in dps.iter().zip([0, 2]) {
        o.check(dp, &frames, DEADLINE).map_err(|e| {
            TestCaseError::fail(format!(
                "threads={threads}: {e}\ninput: {}",
                oracle::hex(data)
            ))
        })?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_fuzz_target_on_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        fuzz_body(&data)?;
    }
}
