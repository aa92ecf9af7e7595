//! Fragments among the fleet (Maglev section 4.3), with real forwarders:
//! several load balancers built in-process, each with its own control plane
//! and packet thread, exchange the GRE frames they emit as a network would.
//! A datagram's fragments, delivered to any load balancers in any order,
//! end at one backend through the responsible one; a fragment never travels
//! more than one hop between load balancers, even when their peer lists
//! disagree; a down peer's fragments are dropped by reason. Outputs are
//! read with etherparse.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::AtomicBool;

use etherparse::Ipv4HeaderSlice;
use lb::config::Config;
use lb::conntrack::Conntrack;
use lb::counters::DropReason;
use lb::datapath::{Datapath, Params};
use lb::frag::FragTable;
use lb::worker::{Mode, Worker};
use lb::Control;
use maio::{Hugepages, Pool};
use netio::mem::{MemPort, Vary};
use packet::build::{Frame, L4};
use packet::gre::{Outer, FRAGMENT_REDIRECT_KEY};
use packet::{flow, parse_frame, proto, FlowKey};
use proptest::prelude::*;

const VIP: &str = "198.18.0.53";
const PEERS: [&str; 3] = ["10.10.2.2", "10.10.2.3", "10.10.2.4"];

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The configuration of the load balancer at `me`, listing `peers`.
fn config(me: &str, peers: &[&str]) -> Config {
    let list: Vec<String> = peers.iter().map(|p| format!("\"{p}\"")).collect();
    Config::parse(
        &format!(
            r#"
[encap]
source = "{me}"
gateway_mac = "02:00:00:00:00:fe"
[[pools]]
name = "dns"
table_size = 251
backends = [{{ address = "10.1.0.1" }}, {{ address = "10.1.0.2" }}, {{ address = "10.1.0.3" }}]
[[vips]]
name = "dns"
address = "{VIP}"
protocol = "udp"
pool = "dns"
[fleet]
peers = [{}]
"#,
            list.join(", ")
        ),
        "fleet.toml",
    )
    .unwrap()
}

fn pool() -> Pool {
    Pool::new(maio::Config {
        buffers: 4096,
        buf_size: 2048,
        hugepages: Hugepages::Never,
        magazine_depth: 64,
    })
    .unwrap()
}

/// One load balancer: its control plane and one packet thread.
struct Lb {
    addr: IpAddr,
    control: Control,
    worker: Worker,
}

impl Lb {
    fn new(pool: &Pool, me: &str, peers: &[&str]) -> Self {
        Lb {
            addr: ip(me),
            control: Control::new(config(me, peers)).unwrap(),
            worker: Worker::new(
                pool,
                Mode::Maglev,
                Conntrack::new(1024, 300_000, 30_000),
                FragTable::new(256, 10_000),
            ),
        }
    }

    /// Runs one frame through the packet thread; returns what it sent.
    fn step(&mut self, pool: &Pool, frame: &[u8], now: u64) -> Vec<Vec<u8>> {
        let mut h = pool.handle();
        let mut batch = vec![common::packet(pool, &mut h, frame)];
        let mut out = Vec::new();
        let t = self.control.tables().load_full();
        self.worker.process(&t, &mut batch, &mut out, now);
        out.into_iter()
            .map(|p| {
                let f = p.frame(pool).to_vec();
                h.free(p.buf).unwrap();
                f
            })
            .collect()
    }
}

/// What a load balancer sent, read with etherparse: the outer IPv4
/// addresses, the GRE key, and the inner IP packet.
#[derive(Debug)]
struct Sent {
    src: IpAddr,
    dst: IpAddr,
    key: Option<u32>,
    inner: Vec<u8>,
}

fn read(frame: &[u8]) -> Sent {
    assert_eq!(&frame[12..14], &[0x08, 0x00], "IPv4 outside");
    let ip4 = Ipv4HeaderSlice::from_slice(&frame[14..]).unwrap();
    assert_eq!(ip4.protocol(), etherparse::IpNumber::GRE);
    assert_eq!(
        ip4.header_checksum(),
        ip4.to_header().calc_header_checksum()
    );
    let gre = &frame[14 + ip4.slice().len()..14 + usize::from(ip4.total_len())];
    let flags = u16::from_be_bytes([gre[0], gre[1]]);
    assert_eq!(
        flags & !0x2000,
        0,
        "no checksum, routing or sequence; version 0"
    );
    let (key, at) = if flags & 0x2000 != 0 {
        (
            Some(u32::from_be_bytes([gre[4], gre[5], gre[6], gre[7]])),
            8,
        )
    } else {
        (None, 4)
    };
    assert_eq!(u16::from_be_bytes([gre[2], gre[3]]), 0x0800, "IPv4 inside");
    Sent {
        src: IpAddr::V4(Ipv4Addr::from(ip4.source())),
        dst: IpAddr::V4(Ipv4Addr::from(ip4.destination())),
        key,
        inner: gre[at..].to_vec(),
    }
}

/// An Ethernet frame around an inner IP packet (as a peer's decapsulation
/// gives it back), for comparing with what was sent.
fn ip_packet(frame: &[u8]) -> Vec<u8> {
    let p = parse_frame(frame).unwrap();
    frame[p.l3_offset..p.l3_offset + p.l3_len].to_vec()
}

/// The fragments of one UDP datagram to the VIP, cut at 8-byte multiples:
/// (frame, first fragment's 5-tuple).
fn datagram(src: IpAddr, sport: u16, ident: u16, pieces: usize) -> (Vec<Vec<u8>>, FlowKey) {
    let vip = ip(VIP);
    let payload: Vec<u8> = (0..(pieces * 16)).map(|i| i as u8).collect();
    let whole = Frame::udp(src, vip, sport, 53, &payload).to_bytes();
    let flow = parse_frame(&whole).unwrap().flow;
    let l4 = &whole[14 + 20..];
    let step = l4.len().div_ceil(pieces).div_ceil(8) * 8;
    let mut out = Vec::new();
    let mut from = 0;
    while from < l4.len() {
        let to = (from + step).min(l4.len());
        out.push(
            Frame::new(src, vip, L4::Raw(proto::UDP, l4[from..to].to_vec()))
                .fragment(u32::from(ident), from as u16, to < l4.len())
                .to_bytes(),
        );
        from = to;
    }
    (out, flow)
}

/// Delivers `arrivals` (frame, index of the load balancer the router gave
/// it to) and then everything the load balancers send each other, until
/// only frames to backends are left. Returns those, with the number of
/// hops between load balancers each frame made.
fn deliver(lbs: &mut [Lb], pool: &Pool, arrivals: Vec<(Vec<u8>, usize)>) -> Vec<(Sent, u32)> {
    let mut queue: Vec<(Vec<u8>, usize, u32)> =
        arrivals.into_iter().map(|(f, i)| (f, i, 0)).collect();
    let mut done = Vec::new();
    let mut rounds = 0;
    while let Some((frame, at, hops)) = queue.pop() {
        rounds += 1;
        assert!(rounds < 10_000, "frames circulate between load balancers");
        for out in lbs[at].step(pool, &frame, 0) {
            let s = read(&out);
            assert_eq!(
                s.src, lbs[at].addr,
                "outer source is the sender's [encap] source"
            );
            match lbs.iter().position(|l| l.addr == s.dst) {
                Some(peer) => {
                    assert_eq!(s.key, Some(FRAGMENT_REDIRECT_KEY), "redirects are marked");
                    queue.push((out, peer, hops + 1));
                }
                None => {
                    assert_eq!(s.key, None, "frames to backends are not marked");
                    done.push((s, hops));
                }
            }
        }
    }
    done
}

fn fleet(pool: &Pool) -> Vec<Lb> {
    // Each load balancer lists the peers in its own order.
    let orders = [
        [PEERS[0], PEERS[1], PEERS[2]],
        [PEERS[2], PEERS[0], PEERS[1]],
        [PEERS[1], PEERS[2], PEERS[0]],
    ];
    PEERS
        .iter()
        .zip(orders)
        .map(|(me, list)| Lb::new(pool, me, &list))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Datagrams whose fragments the router spreads over the load
    /// balancers at random, in any order: each arrives whole at one
    /// backend, the one Maglev picks for its first fragment's 5-tuple,
    /// sent by the responsible load balancer; every fragment makes at most
    /// one hop between load balancers.
    #[test]
    fn fragments_spread_over_the_fleet_meet_at_one_backend(
        datagrams in proptest::collection::vec(
            (any::<[u8; 4]>(), 1024u16.., any::<u16>(), 2usize..6, any::<u64>()),
            1..6,
        ),
    ) {
        let pool = pool();
        let mut lbs = fleet(&pool);
        let cfg = config(PEERS[0], &PEERS);
        for (k, (src, sport, ident, pieces, spread)) in datagrams.into_iter().enumerate() {
            // A client's address: outside the blocks no packet may come
            // from (0/8, 127/8, 224/4 and up), which the load balancers
            // drop as martians.
            let first = match src[0] % 222 + 1 {
                127 => 128,
                o => o,
            };
            let src = IpAddr::from([first, src[1], src[2], src[3]]);
            let (frags, flow) = datagram(src, sport, ident.wrapping_add(k as u16), pieces);
            // The router's choice per fragment, and a reversed order now
            // and then (later fragments first).
            let mut arrivals: Vec<(Vec<u8>, usize)> = frags
                .iter()
                .enumerate()
                .map(|(i, f)| (f.clone(), ((spread >> (2 * i)) % 3) as usize))
                .collect();
            if spread & 1 == 1 {
                arrivals.reverse();
            }
            let done = deliver(&mut lbs, &pool, arrivals);
            let responsible = lb::frag_redirect::responsible(&cfg.fleet.as_ref().unwrap().peers, &flow).unwrap();
            let backend = lb_sample::expected_backend(&cfg, "dns", &flow).unwrap();
            prop_assert_eq!(done.len(), frags.len(), "every fragment forwarded once");
            let mut inner: Vec<Vec<u8>> = done.iter().map(|(s, _)| s.inner.clone()).collect();
            let mut want: Vec<Vec<u8>> = frags.iter().map(|f| ip_packet(f)).collect();
            inner.sort();
            want.sort();
            prop_assert_eq!(inner, want, "the fragments, byte for byte");
            for (s, hops) in &done {
                prop_assert_eq!(s.dst, backend);
                prop_assert_eq!(s.src, responsible);
                prop_assert!(*hops <= 1);
            }
        }
        let (mut out, mut received) = (0, 0);
        for l in &lbs {
            let c = &l.worker.counters;
            prop_assert_eq!(c.dropped(), 0, "{:?}", c.drop_table());
            out += c.frag_redirected;
            received += c.frag_redirect_received;
            prop_assert_eq!(c.frag_redirected_to.iter().sum::<u64>(), c.frag_redirected);
        }
        prop_assert_eq!(out, received);
    }
}

/// Two load balancers whose peer lists disagree so that each thinks the
/// other responsible for a datagram: a fragment sent to either goes over
/// once and is handled there, never sent back.
#[test]
fn disagreeing_peer_lists_cannot_bounce_a_fragment() {
    let pool = pool();
    let (a, b, c) = (PEERS[0], PEERS[1], PEERS[2]);
    // A knows A and B; B also knows C.
    let la = lb::frag_redirect::Peers::new(&[ip(a), ip(b)], ip(a)).unwrap();
    let lb_ = lb::frag_redirect::Peers::new(&[ip(a), ip(b), ip(c)], ip(b)).unwrap();
    let mut found = 0;
    for i in 0..60_000u32 {
        let src = IpAddr::from([203, 0, (i >> 8) as u8, i as u8]);
        let three = FlowKey {
            src: flow::from_ip(src),
            dst: flow::from_ip(ip(VIP)),
            src_port: 0,
            dst_port: 0,
            proto: proto::UDP,
        };
        let to_b = la.addrs()[la.responsible(&three) as usize] == ip(b);
        let to_a = lb_.addrs()[lb_.responsible(&three) as usize] == ip(a);
        if !(to_a && to_b) {
            continue;
        }
        let (frags, _) = datagram(src, 1024, i as u16, 3);
        found += 1;
        for first_at in [0, 1] {
            let mut lbs = vec![Lb::new(&pool, a, &[a, b]), Lb::new(&pool, b, &[a, b, c])];
            let arrivals = frags.iter().map(|f| (f.clone(), first_at)).collect();
            let done = deliver(&mut lbs, &pool, arrivals);
            assert_eq!(done.len(), frags.len());
            let backend = done[0].0.dst;
            for (s, hops) in &done {
                assert_eq!(*hops, 1, "sent over once, handled there");
                assert_eq!(s.dst, backend, "one backend for the datagram");
                assert_eq!(s.src, lbs[1 - first_at].addr);
            }
            assert_eq!(lbs[first_at].worker.counters.frag_redirected, 3);
            assert_eq!(lbs[1 - first_at].worker.counters.frag_redirect_received, 3);
            assert_eq!(lbs[1 - first_at].worker.counters.frag_redirected, 0);
        }
        if found == 5 {
            break;
        }
    }
    assert!(
        found > 0,
        "no 3-tuple on which the lists disagree both ways"
    );
}

/// A datagram whose responsible peer is `want` (by searching sources).
fn datagram_for(want: &str, peers: &[&str], ident: u16) -> (Vec<Vec<u8>>, FlowKey) {
    let list: Vec<IpAddr> = peers.iter().map(|p| ip(p)).collect();
    (0..1000u16)
        .map(|i| {
            datagram(
                IpAddr::from([203, 0, 113, (i % 250) as u8]),
                2000 + i,
                ident,
                2,
            )
        })
        .find(|(_, f)| lb::frag_redirect::responsible(&list, f) == Some(ip(want)))
        .unwrap()
}

/// A peer known to be down: fragments it is responsible for are dropped
/// and counted as `fragment_peer_down` (not sent to another peer); the
/// others still go where they belong; up again, they go to it again.
#[test]
fn a_down_peers_fragments_are_dropped_by_reason() {
    let pool = pool();
    let mut a = Lb::new(&pool, PEERS[0], &PEERS);
    assert!(a.control.set_peer_up(ip(PEERS[1]), false));
    assert!(!a.control.set_peer_up(ip(PEERS[0]), false), "not itself");
    assert!(
        !a.control.set_peer_up(ip("10.10.2.99"), false),
        "not a peer"
    );
    let (to_b, _) = datagram_for(PEERS[1], &PEERS, 1);
    let (to_c, _) = datagram_for(PEERS[2], &PEERS, 2);
    for f in &to_b {
        assert!(a.step(&pool, f, 0).is_empty());
    }
    let c = &a.worker.counters;
    assert_eq!(c.drops_for(DropReason::FragmentPeerDown), to_b.len() as u64);
    assert_eq!(
        DropReason::name_of(DropReason::FragmentPeerDown.index()),
        "fragment_peer_down"
    );
    for f in &to_c {
        let out = a.step(&pool, f, 0);
        assert_eq!(read(&out[0]).dst, ip(PEERS[2]));
    }
    assert!(a.control.set_peer_up(ip(PEERS[1]), true));
    let out = a.step(&pool, &to_b[0], 0);
    assert_eq!(read(&out[0]).dst, ip(PEERS[1]));
    let c = &a.worker.counters;
    assert_eq!(c.frag_redirected, to_c.len() as u64 + 1);
    assert_eq!(c.drops_for(DropReason::FragmentPeerDown), to_b.len() as u64);
}

/// GRE to this load balancer with the redirect mark that holds no fragment
/// for a VIP is dropped by reason; GRE without the mark is not taken in.
#[test]
fn bad_redirects_are_dropped_by_reason() {
    let pool = pool();
    let mut a = Lb::new(&pool, PEERS[0], &PEERS);
    let wrap_from = |inner: &[u8], key: Option<u32>, to: &str, from: &str| {
        let p = parse_frame(inner).unwrap();
        let mut buf = vec![0u8; 64];
        buf.extend_from_slice(inner);
        let outer = Outer {
            eth_src: [2, 0, 0, 0, 0, 2],
            eth_dst: [2, 0, 0, 0, 0, 1],
            src: flow::from_ip(ip(from)),
            dst: flow::from_ip(ip(to)),
            ttl: 64,
        };
        let r = packet::gre::encapsulate_keyed(&mut buf, 64, &p, &outer, 0, key).unwrap();
        buf[r].to_vec()
    };
    let wrap = |inner: &[u8], key: Option<u32>, to: &str| wrap_from(inner, key, to, PEERS[1]);
    let key = Some(FRAGMENT_REDIRECT_KEY);
    // A fragment for an address that is not a VIP.
    let other = Frame::new(
        ip("203.0.113.1"),
        ip("198.18.9.9"),
        L4::Raw(proto::UDP, vec![0; 16]),
    )
    .fragment(7, 8, false)
    .to_bytes();
    assert!(a.step(&pool, &wrap(&other, key, PEERS[0]), 0).is_empty());
    // A whole datagram (not a fragment), even for the VIP.
    let whole = Frame::udp(ip("203.0.113.1"), ip(VIP), 5, 53, b"x").to_bytes();
    assert!(a.step(&pool, &wrap(&whole, key, PEERS[0]), 0).is_empty());
    // Unmarked GRE, or marked GRE for another address: not a redirect.
    let (frags, _) = datagram_for(PEERS[0], &PEERS, 3);
    assert!(a
        .step(&pool, &wrap(&frags[0], None, PEERS[0]), 0)
        .is_empty());
    assert!(a
        .step(&pool, &wrap(&frags[0], key, "10.10.2.77"), 0)
        .is_empty());
    let c = &a.worker.counters;
    assert_eq!(c.drops_for(DropReason::FragmentRedirectNoVip), 1);
    assert_eq!(c.drops_for(DropReason::FragmentRedirectMalformed), 1);
    assert_eq!(c.drops_for(DropReason::NoVip), 2);
    assert_eq!(c.frag_redirect_received, 1);
    // The same fragment, marked, to us: taken in and forwarded.
    let out = a.step(&pool, &wrap(&frags[0], key, PEERS[0]), 0);
    assert_eq!(read(&out[0]).inner, ip_packet(&frags[0]));
    assert_eq!(a.worker.counters.frag_redirect_received, 2);
    // The same, marked and to us, from outside the fleet: a forgery.
    assert!(a
        .step(
            &pool,
            &wrap_from(&frags[0], key, PEERS[0], "203.0.113.66"),
            0
        )
        .is_empty());
    let c = &a.worker.counters;
    assert_eq!(c.drops_for(DropReason::FragmentRedirectNotPeer), 1);
    assert_eq!(c.frag_redirect_received, 2);
    // The same from this load balancer's own address (in the peer list,
    // but it never redirects to itself): a forgery too.
    assert!(a
        .step(&pool, &wrap_from(&frags[0], key, PEERS[0], PEERS[0]), 0)
        .is_empty());
    let c = &a.worker.counters;
    assert_eq!(c.drops_for(DropReason::FragmentRedirectNotPeer), 2);
    assert_eq!(c.frag_redirect_received, 2);
}

/// `n` datagrams of three fragments, from different sources, whose
/// responsible peer is `me`.
fn owned_by(me: &str, n: usize) -> impl Iterator<Item = (Vec<Vec<u8>>, FlowKey)> {
    let list: Vec<IpAddr> = PEERS.iter().map(|p| ip(p)).collect();
    let me = ip(me);
    (0..2000u16)
        .map(|i| {
            datagram(
                IpAddr::from([198, 51, (i / 250) as u8, (i % 250) as u8]),
                3000 + i,
                i,
                3,
            )
        })
        .filter(move |(_, f)| lb::frag_redirect::responsible(&list, f) == Some(me))
        .take(n)
}

/// With packet threads, a fragment that arrives redirected is steered by
/// its inner 3-tuple, to the thread the rest of its datagram (arriving
/// directly) goes to: the first fragments come from a peer, the later ones
/// straight from the router, and every datagram still meets at one backend.
#[test]
fn redirected_fragments_meet_their_datagram_on_one_packet_thread() {
    let pool = pool();
    let me = PEERS[1];
    let mut peer = Lb::new(&pool, PEERS[0], &PEERS);
    let mut frames = Vec::new();
    let mut want = std::collections::HashMap::new();
    let cfg = config(me, &PEERS);
    let datagrams = owned_by(me, 24);
    for (frags, flow) in datagrams {
        let redirected = peer.step(&pool, &frags[0], 0);
        assert_eq!(read(&redirected[0]).dst, ip(me));
        frames.push(redirected[0].clone());
        frames.extend(frags[1..].iter().cloned());
        let backend = lb_sample::expected_backend(&cfg, "dns", &flow).unwrap();
        for f in &frags {
            want.insert(ip_packet(f), backend);
        }
    }
    let mut c = cfg.clone();
    c.forwarder.threads = 2;
    let control = Control::new(c.clone()).unwrap();
    let dp = Datapath::new(Params::from_config(&c), control.tables()).unwrap();
    let n = frames.len();
    let mut port = MemPort::new(frames, Vary::None, Some(n as u64)).capture();
    let stats = dp.run(&mut port, &AtomicBool::new(false)).unwrap();
    let out = port.captured.take().unwrap();
    assert_eq!(out.len(), n, "drops: {:?}", stats.counters.drop_table());
    for f in &out {
        let s = read(f);
        assert_eq!(
            Some(&s.dst),
            want.get(&s.inner),
            "each fragment to its datagram's backend"
        );
    }
    assert_eq!(stats.counters.frag_redirect_received, 24);
}

/// One receive queue of a NIC, as `Datapath::run_queues` serves it: a
/// memory port whose transmitted frames are collected with every other
/// queue's.
struct Queue {
    port: MemPort,
    out: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl netio::Nic for Queue {
    fn receive(&mut self, pool: &Pool, slots: &mut [netio::Slot]) -> Result<usize, netio::Error> {
        self.port.receive(pool, slots)
    }

    fn transmit(&mut self, pool: &Pool, slots: &[netio::Slot]) -> Result<usize, netio::Error> {
        let mut out = self.out.lock().unwrap();
        out.extend(slots.iter().map(|s| s.frame(pool).to_vec()));
        self.port.transmit(pool, slots)
    }

    fn exhausted(&self) -> bool {
        self.port.exhausted()
    }

    fn stats(&self) -> netio::PortStats {
        self.port.stats()
    }
}

/// One worker per receive queue, no steering (AF_XDP with a socket per
/// queue): the NIC hashes a peer's redirected fragments on their outer GRE
/// header, so they land on another queue than the fragments the router
/// sent straight here. Half the datagrams have their first fragment
/// redirected (queue 0) and the rest direct (queue 1), the other half the
/// reverse; every fragment must still reach its datagram's backend, none
/// held until it expires.
#[test]
fn redirected_fragments_meet_their_datagram_across_receive_queues() {
    let pool = pool();
    let me = PEERS[1];
    let mut peer = Lb::new(&pool, PEERS[0], &PEERS);
    let (mut q0, mut q1) = (Vec::new(), Vec::new());
    let mut want = std::collections::HashMap::new();
    let cfg = config(me, &PEERS);
    let datagrams = owned_by(me, 32);
    for (i, (frags, flow)) in datagrams.enumerate() {
        let redirect = |f: &Vec<u8>, peer: &mut Lb| {
            let r = peer.step(&pool, f, 0);
            assert_eq!(read(&r[0]).dst, ip(me));
            r[0].clone()
        };
        if i % 2 == 0 {
            q0.push(redirect(&frags[0], &mut peer));
            q1.extend(frags[1..].iter().cloned());
        } else {
            q1.push(frags[0].clone());
            for f in &frags[1..] {
                q0.push(redirect(f, &mut peer));
            }
        }
        let backend = lb_sample::expected_backend(&cfg, "dns", &flow).unwrap();
        for f in &frags {
            want.insert(ip_packet(f), backend);
        }
    }
    let n = q0.len() + q1.len();
    let redirected = q0.len() as u64;
    let mut c = cfg.clone();
    c.forwarder.threads = 2;
    let control = Control::new(c.clone()).unwrap();
    let dp = Datapath::new(Params::from_config(&c), control.tables()).unwrap();
    let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let ports: Vec<Box<dyn netio::Nic + Send>> = [q0, q1]
        .into_iter()
        .map(|frames| {
            let k = frames.len() as u64;
            Box::new(Queue {
                port: MemPort::new(frames, Vary::None, Some(k)),
                out: std::sync::Arc::clone(&out),
            }) as Box<dyn netio::Nic + Send>
        })
        .collect();
    let stats = dp.run_queues(ports, &AtomicBool::new(false)).unwrap();
    let out = out.lock().unwrap();
    assert_eq!(
        out.len(),
        n,
        "every fragment forwarded; drops: {:?}",
        stats.counters.drop_table()
    );
    for f in out.iter() {
        let s = read(f);
        assert_eq!(
            Some(&s.dst),
            want.get(&s.inner),
            "each fragment to its datagram's backend"
        );
    }
    assert_eq!(stats.counters.frag_redirect_received, redirected);
    assert_eq!(
        stats.counters.rx,
        stats.counters.tx + stats.counters.dropped()
    );
    assert_eq!(stats.pool.in_use, 0, "every buffer back in the pool");
}
