//! The forwarder end to end: mixed traffic through the datapath (inline and
//! with packet threads), checked packet by packet against an independent
//! Maglev computation; connection persistence across backend changes;
//! conntrack full; a SYN flood; malformed input counted by reason.

mod common;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::AtomicBool;

use lb::config::Config;
use lb::conntrack::Conntrack;
use lb::counters::DropReason;
use lb::datapath::{Datapath, Params};
use lb::frag::FragTable;
use lb::worker::{Mode, Worker};
use lb::Control;
use maio::{Hugepages, Pool};
use netio::mem::{MemPort, Vary};
use packet::build::Frame;
use packet::gre::decapsulate;
use packet::{flow, parse_frame, FlowKey};

use lb_sample::{expected_backend, flow_of, ip, mixed_traffic, tcp, Expect, CONFIG};

fn backend(cfg: &Config, pool: &str, flow: &FlowKey) -> IpAddr {
    expected_backend(cfg, pool, flow).unwrap()
}

fn run_mixed(threads: usize) {
    let mut cfg = Config::parse(CONFIG, "test").unwrap();
    cfg.forwarder.threads = threads;
    let cases = mixed_traffic();
    let control = Control::new(cfg.clone()).unwrap();
    let mut params = Params::from_config(&cfg);
    params.hugepages = Hugepages::Auto;
    let dp = Datapath::new(params, control.tables()).unwrap();
    let frames: Vec<Vec<u8>> = cases.iter().map(|c| c.frame.clone()).collect();
    let mut port = MemPort::new(frames, Vary::None, Some(cases.len() as u64)).capture();
    let stats = dp.run(&mut port, &AtomicBool::new(false)).unwrap();

    // Expected: inner IP packet bytes -> expected backend address; drops by reason.
    let mut want: HashMap<Vec<u8>, IpAddr> = HashMap::new();
    let mut drops: HashMap<usize, u64> = HashMap::new();
    let mut forwarded = 0;
    // Refusals: the reply each refused frame gets (RST or port
    // unreachable, checked field by field in refusals.rs and packet's
    // tests), each sent once.
    let mut replies: HashMap<Vec<u8>, usize> = HashMap::new();
    let (mut rsts, mut unreachables) = (0, 0);
    for c in &cases {
        match c.expect {
            Expect::Forward { pool, flow } => {
                let p = parse_frame(&c.frame).unwrap();
                want.insert(
                    c.frame[p.l3_offset..p.l3_offset + p.l3_len].to_vec(),
                    backend(&cfg, pool, &flow),
                );
                forwarded += 1;
            }
            Expect::Drop(r) => *drops.entry(r.index()).or_insert(0) += 1,
            Expect::Refused(kind) => {
                *drops
                    .entry(DropReason::VipPortNotServed.index())
                    .or_insert(0) += 1;
                let p = parse_frame(&c.frame).unwrap();
                let mut reply = Vec::new();
                assert_eq!(packet::reply::refusal(&c.frame, &p, &mut reply), Some(kind));
                *replies.entry(reply).or_insert(0) += 1;
                match kind {
                    packet::reply::Refusal::TcpReset => rsts += 1,
                    packet::reply::Refusal::PortUnreachable => unreachables += 1,
                }
            }
        }
    }
    let mut out = port.captured.take().unwrap();
    out.retain(|f| match replies.get_mut(f) {
        Some(n) if *n > 0 => {
            *n -= 1;
            false
        }
        _ => true,
    });
    assert!(
        replies.values().all(|&n| n == 0),
        "threads={threads}: a refused frame got no reply"
    );
    assert_eq!(
        out.len(),
        forwarded,
        "threads={threads}: forwarded count; drops {:?}",
        stats.counters.drop_table()
    );
    for frame in &out {
        let d = decapsulate(frame).expect("every output is GRE");
        let inner = &frame[d.inner.clone()];
        let backend = want
            .get(inner)
            .unwrap_or_else(|| panic!("output carries a packet that was not sent: {inner:02x?}"));
        assert_eq!(
            flow::to_ip(&d.outer_dst),
            *backend,
            "wrong backend for {:?}",
            parse_frame(&[&[0u8; 12][..], &d.ethertype.to_be_bytes(), inner].concat())
                .map(|p| p.flow)
        );
        let src = if backend.is_ipv4() {
            "10.0.0.1"
        } else {
            "fd00::1"
        };
        assert_eq!(flow::to_ip(&d.outer_src), ip(src));
    }
    let c = &stats.counters;
    for (i, n) in c.drops.iter().enumerate() {
        assert_eq!(
            *n,
            drops.get(&i).copied().unwrap_or(0),
            "drops for {}",
            lb::counters::DropReason::name_of(i)
        );
    }
    assert_eq!(c.rx, cases.len() as u64);
    assert_eq!(c.tx as usize, forwarded);
    assert_eq!(c.icmp_to_backend, 6);
    assert_eq!(
        (c.refused_tcp_rst, c.refused_icmp_unreachable),
        (rsts, unreachables)
    );
    assert_eq!(
        (c.frag_held, c.frag_released),
        (2, 2),
        "datagram 2's two early fragments wait for the first"
    );
    assert_eq!(stats.pool.in_use, 0, "every buffer returned to the pool");
    // Per-VIP counters add up.
    let per_vip: u64 = c.per_vip.iter().map(|t| t.packets).sum();
    assert_eq!(per_vip, c.tx);
}

#[test]
fn mixed_traffic_inline() {
    run_mixed(0);
}

#[test]
fn mixed_traffic_two_packet_threads() {
    run_mixed(2);
}

// --- packet-thread level tests --------------------------------------------

fn worker(pool: &Pool, ct_size: usize) -> Worker {
    Worker::new(
        pool,
        Mode::Maglev,
        Conntrack::new(ct_size, 300_000, 30_000),
        FragTable::new(64, 1000),
    )
}

fn small_pool() -> Pool {
    Pool::new(maio::Config {
        buffers: 4096,
        buf_size: 2048,
        hugepages: Hugepages::Never,
        magazine_depth: 64,
    })
    .unwrap()
}

/// Runs frames through a worker; returns the backend address per frame
/// (None if dropped), in order.
fn through(
    w: &mut Worker,
    pool: &Pool,
    control: &Control,
    frames: &[Vec<u8>],
    now: u64,
) -> Vec<Option<IpAddr>> {
    let mut h = pool.handle();
    let t = control.tables().load_full();
    let mut res = Vec::new();
    for f in frames {
        let mut batch = vec![common::packet(pool, &mut h, f)];
        let mut out = Vec::new();
        w.process(&t, &mut batch, &mut out, now);
        res.push(out.pop().map(|p| {
            let d = decapsulate(p.frame(pool)).unwrap();
            let a = flow::to_ip(&d.outer_dst);
            h.free(p.buf).unwrap();
            a
        }));
    }
    res
}

#[test]
fn connections_persist_when_backends_are_added_and_removed() {
    let cfg = Config::parse(CONFIG, "test").unwrap();
    let mut control = Control::new(cfg.clone()).unwrap();
    let pool = small_pool();
    let mut w = worker(&pool, 4096);
    let syns: Vec<Vec<u8>> = (0..800u16)
        .map(|i| {
            tcp(
                &format!("198.18.{}.{}", i / 200, i % 200 + 1),
                10_000 + i,
                "192.0.2.80",
                80,
                2,
            )
        })
        .collect();
    let before = through(&mut w, &pool, &control, &syns, 0);
    assert!(before.iter().all(Option::is_some));

    // Add a backend and remove another.
    let mut next = cfg.clone();
    let web = next.pools.iter_mut().find(|p| p.name == "web").unwrap();
    web.backends.retain(|b| b.address != ip("10.1.0.2"));
    web.backends.push(lb::config::BackendConf {
        address: ip("10.1.0.9"),
        name: None,
        weight: 1,
        quic_server_id: None,
    });
    control.apply(next.clone()).unwrap();

    let acks: Vec<Vec<u8>> = (0..800u16)
        .map(|i| {
            tcp(
                &format!("198.18.{}.{}", i / 200, i % 200 + 1),
                10_000 + i,
                "192.0.2.80",
                80,
                0x10,
            )
        })
        .collect();
    let after = through(&mut w, &pool, &control, &acks, 1000);
    let mut moved = 0;
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        if *b == Some(ip("10.1.0.2")) {
            // Its backend is gone: the flow moves to Maglev's new choice.
            assert_eq!(*a, Some(backend(&next, "web", &flow_of(&acks[i]))));
            moved += 1;
        } else {
            assert_eq!(
                a, b,
                "flow {i} kept by conntrack although its backend is healthy"
            );
        }
    }
    assert!(moved > 100, "the removed backend held flows ({moved})");
    // A fresh load balancer (no conntrack) follows the new table, which is
    // the same as the old one for most flows (Maglev's minimal disruption).
    let mut fresh = worker(&pool, 4096);
    let fresh_after = through(&mut fresh, &pool, &control, &acks, 0);
    let same = before
        .iter()
        .zip(&fresh_after)
        .filter(|(b, a)| b == a)
        .count();
    assert!(same > 500, "Maglev kept most flows in place: {same}/800");
    // Marking a backend unhealthy moves its flows even with conntrack.
    assert!(control.set_health("10.1.0.1", false));
    let unhealthy = through(&mut w, &pool, &control, &acks, 2000);
    assert!(unhealthy.iter().all(|a| *a != Some(ip("10.1.0.1"))));
    assert!(!control.set_health("nonexistent", false));
}

#[test]
fn conntrack_full_still_forwards_by_maglev() {
    let cfg = Config::parse(CONFIG, "test").unwrap();
    let control = Control::new(cfg.clone()).unwrap();
    let pool = small_pool();
    let mut w = worker(&pool, 4); // one bucket of four
    let frames: Vec<Vec<u8>> = (0..100u16)
        .map(|i| tcp("198.51.100.7", 20_000 + i, "192.0.2.80", 80, 2))
        .collect();
    let got = through(&mut w, &pool, &control, &frames, 0);
    for (f, g) in frames.iter().zip(&got) {
        assert_eq!(*g, Some(backend(&cfg, "web", &flow_of(f))));
    }
    let ct = w.counters.conntrack;
    assert_eq!((ct.inserts, ct.insert_failures), (4, 96));
    assert_eq!(w.counters.tx, 100);
}

#[test]
fn no_healthy_backend_drops_and_counts() {
    let cfg = Config::parse(CONFIG, "test").unwrap();
    let mut control = Control::new(cfg).unwrap();
    for b in ["10.2.0.1", "10.2.0.2"] {
        assert!(control.set_health(b, false));
    }
    let pool = small_pool();
    let mut w = worker(&pool, 64);
    let f = Frame::udp(ip("203.0.113.1"), ip("192.0.2.53"), 1, 53, b"q").to_bytes();
    assert_eq!(through(&mut w, &pool, &control, &[f], 0), vec![None]);
    assert_eq!(w.counters.drops_for(DropReason::NoHealthyBackend), 1);
}

#[test]
fn syn_flood_from_random_sources() {
    let mut cfg = Config::parse(CONFIG, "test").unwrap();
    cfg.conntrack.size = 1024;
    cfg.forwarder.threads = 2;
    let control = Control::new(cfg.clone()).unwrap();
    let dp = Datapath::new(Params::from_config(&cfg), control.tables()).unwrap();
    // 256 random sources; the generator rewrites the source port of every
    // packet, so each of the 60,000 SYNs is a new flow.
    let mut rng = maglev::eval::SplitMix::new(99);
    let templates: Vec<Vec<u8>> = (0..256)
        .map(|_| {
            let a = rng.next_u64().to_be_bytes();
            // Clients' addresses: outside the blocks no packet may come
            // from (0/8, 127/8, 224/4 and up: dropped as martians).
            let first = match a[0] % 222 + 1 {
                127 => 128,
                o => o,
            };
            let src = IpAddr::from([first, a[1], a[2], a[3] | 1]);
            Frame::tcp(src, ip("192.0.2.80"), 1, 80, 0x02, b"").to_bytes()
        })
        .collect();
    let n = 60_000u64;
    let mut port = MemPort::new(templates, Vary::SourcePort { at: 14 + 20 }, Some(n)).capture();
    let stats = dp.run(&mut port, &AtomicBool::new(false)).unwrap();
    let c = &stats.counters;
    assert_eq!(c.tx, n, "every SYN is forwarded: {:?}", c.drop_table());
    assert!(c.conntrack.insert_failures > 0, "the tables filled up");
    assert_eq!(
        c.conntrack.inserts + c.conntrack.insert_failures + c.conntrack.hits,
        n
    );
    assert_eq!(stats.pool.in_use, 0);
    // Spot-check backends against Maglev.
    for frame in port.captured.unwrap().iter().step_by(997) {
        let d = decapsulate(frame).unwrap();
        let inner_flow =
            parse_frame(&[&frame[..12], &[0x08, 0x00], &frame[d.inner.clone()]].concat())
                .unwrap()
                .flow;
        assert_eq!(flow::to_ip(&d.outer_dst), backend(&cfg, "web", &inner_flow));
    }
}

// --- held fragments always end ---------------------------------------------

/// Later fragments whose first fragment never comes, and later fragments
/// of a datagram whose first fragment is dropped (UDP to a TCP-only VIP):
/// every one is held, none can ever be released. The run must still end,
/// with every frame accounted for and every buffer back in the pool.
fn lone_later_fragments(threads: usize) {
    use packet::build::L4;
    let mut cfg = Config::parse(CONFIG, "test").unwrap();
    cfg.forwarder.threads = threads;
    let control = Control::new(cfg.clone()).unwrap();
    let dp = Datapath::new(Params::from_config(&cfg), control.tables()).unwrap();
    let (src, udp_vip, tcp_vip) = (ip("203.0.113.9"), ip("192.0.2.53"), ip("192.0.2.80"));
    let mut frames = Vec::new();
    for ident in 0..20u32 {
        // A lone later fragment to the UDP VIP.
        frames.push(
            Frame::new(src, udp_vip, L4::Raw(packet::proto::UDP, vec![1; 16]))
                .fragment(0x500 + ident, 24, ident % 2 == 0)
                .to_bytes(),
        );
    }
    for ident in 0..5u32 {
        // A UDP datagram to the TCP-only VIP: its first fragment is
        // dropped (no VIP), so its later fragments wait in vain.
        let whole = Frame::udp(src, tcp_vip, 4000, 80, &[3; 40]).to_bytes();
        let l4 = &whole[14 + 20..];
        for (from, to, more) in [(24, 48, false), (0, 24, true)] {
            frames.push(
                Frame::new(
                    src,
                    tcp_vip,
                    L4::Raw(packet::proto::UDP, l4[from..to].to_vec()),
                )
                .fragment(0x900 + ident, from as u16, more)
                .to_bytes(),
            );
        }
    }
    let n = frames.len() as u64;
    let mut port = MemPort::new(frames, Vary::None, Some(n)).capture();
    // A watchdog: the run must end on its own; if it does not, stop it so
    // the test fails instead of hanging.
    let stop = AtomicBool::new(false);
    let started = std::time::Instant::now();
    let stats = std::thread::scope(|s| {
        let run = s.spawn(|| dp.run(&mut port, &stop));
        while !run.is_finished() && started.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        run.join().unwrap().unwrap()
    });
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "threads={threads}: held fragments kept the run alive for {:?}",
        started.elapsed()
    );
    let c = &stats.counters;
    assert_eq!(c.rx, n, "threads={threads}");
    assert_eq!(c.tx, 0, "threads={threads}: nothing can be forwarded");
    assert_eq!(
        c.drops_for(DropReason::FragExpired),
        25,
        "threads={threads}: every held fragment ends as expired; drops {:?}",
        c.drop_table()
    );
    assert_eq!(
        c.rx,
        c.tx + c.dropped(),
        "threads={threads}: every frame accounted for"
    );
    assert_eq!(
        stats.pool.in_use, 0,
        "threads={threads}: every buffer returned"
    );
}

#[test]
fn lone_later_fragments_end_inline() {
    lone_later_fragments(0);
}

#[test]
fn lone_later_fragments_end_with_packet_threads() {
    lone_later_fragments(2);
}

// --- conntrack that follows TCP --------------------------------------------

/// A drained backend (weight 0) keeps its established connections, but a
/// new connection on a recently used 5-tuple (a SYN that finds the old
/// entry) never reaches it; a FIN ends an entry after a short linger.
#[test]
fn drain_applies_to_reused_client_ports() {
    use lb::worker::CLOSE_LINGER_MS;
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    const FIN_ACK: u8 = 0x11;
    let cfg = Config::parse(CONFIG, "test").unwrap();
    let mut control = Control::new(cfg.clone()).unwrap();
    let pool = small_pool();
    let mut w = worker(&pool, 4096);
    let frames = |flags: u8| -> Vec<Vec<u8>> {
        (0..400u16)
            .map(|i| {
                tcp(
                    &format!("198.18.7.{}", i % 250 + 1),
                    20_000 + i,
                    "192.0.2.80",
                    80,
                    flags,
                )
            })
            .collect()
    };
    let first = through(&mut w, &pool, &control, &frames(SYN), 0);
    through(&mut w, &pool, &control, &frames(ACK), 10);
    let drained = ip("10.1.0.2");
    let on_drained: Vec<usize> = (0..400).filter(|&i| first[i] == Some(drained)).collect();
    assert!(
        on_drained.len() > 50,
        "the backend held flows: {}",
        on_drained.len()
    );

    // Drain it: weight 0.
    let mut next = cfg.clone();
    let web = next.pools.iter_mut().find(|p| p.name == "web").unwrap();
    web.backends
        .iter_mut()
        .find(|b| b.address == drained)
        .unwrap()
        .weight = 0;
    control.apply(next).unwrap();

    // Established connections keep working on it.
    let acks = through(&mut w, &pool, &control, &frames(ACK), 1_000);
    for &i in &on_drained {
        assert_eq!(
            acks[i],
            Some(drained),
            "established flow {i} moved off a drained backend"
        );
    }
    // The same client ports open new connections (the entries are still
    // live): none of them reaches the drained backend.
    let syns = through(&mut w, &pool, &control, &frames(SYN), 2_000);
    let reached = syns.iter().filter(|b| **b == Some(drained)).count();
    assert_eq!(
        reached, 0,
        "{reached} new connections reached a drained backend"
    );
    assert!(syns.iter().all(Option::is_some));

    // A FIN ends an entry after the linger: the flow's later packets
    // follow the table, not the old entry.
    let mut w = worker(&pool, 4096);
    let mut control = Control::new(cfg.clone()).unwrap();
    let before = through(&mut w, &pool, &control, &frames(SYN), 0);
    through(&mut w, &pool, &control, &frames(FIN_ACK), 100);
    let mut next = cfg.clone();
    let web = next.pools.iter_mut().find(|p| p.name == "web").unwrap();
    web.backends.push(lb::config::BackendConf {
        address: ip("10.1.0.9"),
        name: None,
        weight: 5,
        quic_server_id: None,
    });
    control.apply(next.clone()).unwrap();
    // Within the linger, the close still reaches the old backend.
    let during = through(
        &mut w,
        &pool,
        &control,
        &frames(ACK),
        100 + CLOSE_LINGER_MS / 2,
    );
    assert_eq!(during, before);
    // After it, the entry is gone: each flow goes where the table says.
    let after = through(&mut w, &pool, &control, &frames(ACK), 200 + CLOSE_LINGER_MS);
    let moved = (0..400).filter(|&i| after[i] != before[i]).count();
    assert!(moved > 0, "no flow followed the new table after its FIN");
    for (i, a) in after.iter().enumerate() {
        let f = flow_of(&frames(ACK)[i]);
        assert_eq!(*a, Some(backend(&next, "web", &f)), "flow {i}");
    }
}

/// On a quiet port, held fragments expire by the clock, not only when the
/// next packet arrives.
#[test]
fn held_fragments_expire_without_traffic() {
    use packet::build::L4;
    let cfg = Config::parse(CONFIG, "test").unwrap();
    let control = Control::new(cfg).unwrap();
    let pool = small_pool();
    let mut w = worker(&pool, 4096); // fragments wait 1000 ms
    let lone = Frame::new(
        ip("203.0.113.9"),
        ip("192.0.2.53"),
        L4::Raw(packet::proto::UDP, vec![1; 16]),
    )
    .fragment(0x777, 24, false)
    .to_bytes();
    assert_eq!(through(&mut w, &pool, &control, &[lone], 0), [None]);
    assert_eq!((w.counters.frag_held, w.holding()), (1, 1));
    w.tick(500);
    assert_eq!(w.holding(), 1, "expired before its time");
    for now in [1_001, 1_002, 1_003] {
        w.tick(now);
    }
    assert_eq!(w.holding(), 0, "a held fragment outlived its timeout");
    assert_eq!(w.counters.drops_for(DropReason::FragExpired), 1);
    assert_eq!(pool.stats().in_use, 0, "its buffer went back to the pool");
}

/// Found by the soak: a client that reuses a port at once (its previous
/// connection was closed, so it keeps no TIME_WAIT) sends a SYN that finds
/// the old connection's closing entry. Kept on the same backend, the new
/// connection must own the entry afresh: not end with the old one's linger
/// and then follow a table that changed meanwhile.
#[test]
fn a_reused_port_keeps_its_backend_after_the_old_connections_linger() {
    use lb::worker::CLOSE_LINGER_MS;
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    const FIN_ACK: u8 = 0x11;
    let cfg = Config::parse(CONFIG, "test").unwrap();
    let mut control = Control::new(cfg.clone()).unwrap();
    let pool = small_pool();
    let mut w = worker(&pool, 4096);
    let frames = |flags: u8| -> Vec<Vec<u8>> {
        (0..400u16)
            .map(|i| {
                tcp(
                    &format!("198.18.9.{}", i % 250 + 1),
                    30_000 + i,
                    "192.0.2.80",
                    80,
                    flags,
                )
            })
            .collect()
    };
    // The old connections, closed.
    let first = through(&mut w, &pool, &control, &frames(SYN), 0);
    through(&mut w, &pool, &control, &frames(FIN_ACK), 100);
    // New connections on the same ports at once, then the table changes.
    let again = through(&mut w, &pool, &control, &frames(SYN), 200);
    assert_eq!(
        again, first,
        "a reused port with an accepting backend keeps it"
    );
    let mut next = cfg.clone();
    let web = next.pools.iter_mut().find(|p| p.name == "web").unwrap();
    web.backends.push(lb::config::BackendConf {
        address: ip("10.1.0.9"),
        name: None,
        weight: 5,
        quic_server_id: None,
    });
    control.apply(next).unwrap();
    // Long after the old connection's linger, the new ones are still
    // established on their backend.
    let later = through(
        &mut w,
        &pool,
        &control,
        &frames(ACK),
        200 + 2 * CLOSE_LINGER_MS,
    );
    let moved = (0..400).filter(|&i| later[i] != first[i]).count();
    assert_eq!(moved, 0, "{moved} of 400 established connections moved");
}

// --- live counters exact once traffic stops ----------------------------------

/// A port that offers as many frames as `allowed` says (bursts released by
/// the test) and is otherwise open and quiet, as an interface between
/// bursts; it counts what the datapath transmitted through it.
struct Gated {
    port: MemPort,
    received: u64,
    allowed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl netio::Nic for Gated {
    fn receive(&mut self, pool: &Pool, slots: &mut [netio::Slot]) -> Result<usize, netio::Error> {
        let allowed = self.allowed.load(std::sync::atomic::Ordering::Acquire);
        let room = allowed
            .saturating_sub(self.received)
            .min(slots.len() as u64) as usize;
        let n = self.port.receive(pool, &mut slots[..room])?;
        self.received += n as u64;
        Ok(n)
    }

    fn transmit(&mut self, pool: &Pool, slots: &[netio::Slot]) -> Result<usize, netio::Error> {
        let n = self.port.transmit(pool, slots)?;
        self.sent
            .fetch_add(n as u64, std::sync::atomic::Ordering::Release);
        Ok(n)
    }

    /// Sleeps as a kernel port does in `poll(2)` (briefly: a burst may be
    /// released meanwhile), so that the idle I/O thread does not spin on
    /// the cores the packet threads need.
    fn wait(&mut self, timeout_ms: i32) {
        std::thread::sleep(std::time::Duration::from_millis(
            timeout_ms.clamp(0, 1) as u64
        ));
    }

    fn stats(&self) -> netio::PortStats {
        self.port.stats()
    }
}

/// What `/status` shows is the datapath's live view. After a burst, that
/// view must hold the burst's counts as soon as the forwarder goes idle,
/// not one publishing interval or idle tick (100 ms each) later: an
/// operator (or a test) that read counters right after traffic stopped saw
/// none of it. Seven bursts start at different offsets from the last
/// publication; the median burst must be visible within 30 ms of its last
/// frame leaving (it took 53-110 ms before). The median, not every burst:
/// on a loaded machine a thread may wait that long for a core.
fn live_counters_follow_bursts(threads: usize) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    const BURST: u64 = 500;
    let mut cfg = Config::parse(CONFIG, "test").unwrap();
    cfg.forwarder.threads = threads;
    let control = Control::new(cfg.clone()).unwrap();
    let dp = Datapath::new(Params::from_config(&cfg), control.tables()).unwrap();
    let frame = tcp("203.0.113.7", 40000, "192.0.2.80", 80, 0x10);
    let stop = AtomicBool::new(false);
    let allowed = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let live_tx = || -> u64 { dp.live.lock().unwrap().iter().map(|c| c.tx).sum() };
    std::thread::scope(|s| {
        let mut port = Gated {
            port: MemPort::new(vec![frame], Vary::SourcePort { at: 34 }, None),
            received: 0,
            allowed: Arc::clone(&allowed),
            sent: Arc::clone(&sent),
        };
        let (dp, stop) = (&dp, &stop);
        let run = s.spawn(move || dp.run(&mut port, stop));
        let mut lags = Vec::new();
        for (round, offset_ms) in [130u64, 35, 60, 85, 110, 45, 95].into_iter().enumerate() {
            std::thread::sleep(Duration::from_millis(offset_ms));
            let want = (round as u64 + 1) * BURST;
            allowed.store(want, Ordering::Release);
            let deadline = Instant::now() + Duration::from_secs(10);
            while sent.load(Ordering::Acquire) < want {
                assert!(
                    Instant::now() < deadline,
                    "threads={threads}: burst {round} was not forwarded"
                );
                std::thread::sleep(Duration::from_micros(100));
            }
            let done = Instant::now();
            while live_tx() < want && done.elapsed() < Duration::from_secs(1) {
                std::thread::sleep(Duration::from_micros(100));
            }
            lags.push(done.elapsed());
        }
        stop.store(true, Ordering::Release);
        run.join().unwrap().unwrap();
        assert_eq!(live_tx(), 7 * BURST, "threads={threads}");
        let mut sorted = lags.clone();
        sorted.sort();
        assert!(
            sorted[sorted.len() / 2] < Duration::from_millis(30),
            "threads={threads}: the live counters held the bursts only {lags:?} after they were sent"
        );
    });
}

#[test]
fn live_counters_follow_bursts_inline() {
    live_counters_follow_bursts(0);
}

#[test]
fn live_counters_follow_bursts_with_packet_threads() {
    live_counters_follow_bursts(2);
}

// --- the heartbeat with one loop per queue -------------------------------------

/// A receive queue whose `receive` blocks while `hang` is set: a queue
/// whose loop hung (a driver stuck in a call, a thread stopped). Its idle
/// wait lasts `idle_ms`: queues whose loops go round at different paces.
struct Hanging {
    hang: std::sync::Arc<AtomicBool>,
    idle_ms: u64,
    stats: netio::PortStats,
}

impl netio::Nic for Hanging {
    fn receive(&mut self, _: &Pool, _: &mut [netio::Slot]) -> Result<usize, netio::Error> {
        while self.hang.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(0)
    }

    fn transmit(&mut self, _: &Pool, slots: &[netio::Slot]) -> Result<usize, netio::Error> {
        Ok(slots.len())
    }

    fn wait(&mut self, timeout_ms: i32) {
        let ms = self.idle_ms.min(timeout_ms.max(0) as u64);
        if ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }

    fn stats(&self) -> netio::PortStats {
        self.stats
    }
}

/// The heartbeat (what the watchdog, BGP and the peers go by) must stand
/// still while any one queue's loop hangs, though the other queues' loops
/// run on: otherwise a load balancer with a hung queue keeps its ECMP
/// share and black-holes that queue's flows for ever. The hung queue is
/// the one whose loop goes round faster (a heartbeat made of the slowest
/// loop's count would keep moving until the other caught up). It beats
/// again once the queue does.
#[test]
fn the_heartbeat_stops_when_one_queue_hangs() {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;
    let hang = Arc::new(AtomicBool::new(false));
    let ports: Vec<Box<dyn netio::Nic + Send>> = vec![
        Box::new(Hanging {
            hang: Arc::clone(&hang),
            idle_ms: 0,
            stats: Default::default(),
        }),
        Box::new(Hanging {
            hang: Arc::new(AtomicBool::new(false)),
            idle_ms: 5,
            stats: Default::default(),
        }),
    ];
    let ((stood_still, again), result) = with_queue_loops(ports, |moves| {
        assert!(
            moves(Duration::from_secs(2)),
            "no heartbeat with both queues running"
        );
        hang.store(true, Ordering::Release);
        // The hung loop's last beat may still be published once.
        std::thread::sleep(Duration::from_millis(100));
        let stood_still = !moves(Duration::from_millis(300));
        hang.store(false, Ordering::Release);
        (stood_still, moves(Duration::from_secs(2)))
    });
    result.unwrap();
    assert!(stood_still, "the heartbeat kept beating with queue 0 hung");
    assert!(again, "the heartbeat did not come back with queue 0");
}

/// Runs `ports` one loop per queue (as `lb run` with two packet threads on
/// two queues) while `check` looks at the heartbeat through the probe it is
/// given (whether the heartbeat moves within a time); then stops the run.
/// What `check` returned, and the run's result.
fn with_queue_loops<R>(
    ports: Vec<Box<dyn netio::Nic + Send>>,
    check: impl FnOnce(&dyn Fn(std::time::Duration) -> bool) -> R,
) -> (R, Result<lb::datapath::RunStats, lb::datapath::Error>) {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    let mut cfg = Config::parse(CONFIG, "test").unwrap();
    cfg.forwarder.threads = 2;
    let control = Control::new(cfg.clone()).unwrap();
    let dp = Datapath::new(Params::from_config(&cfg), control.tables()).unwrap();
    let stop = AtomicBool::new(false);
    let beat = || dp.heartbeat.load(Ordering::Relaxed);
    let moves = |within: Duration| {
        let (before, start) = (beat(), Instant::now());
        while start.elapsed() < within {
            if beat() != before {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    };
    std::thread::scope(|s| {
        let (dp, stop) = (&dp, &stop);
        let run = s.spawn(move || dp.run_queues(ports, stop));
        let checked = check(&moves);
        stop.store(true, Ordering::Release);
        (checked, run.join().unwrap())
    })
}

/// A receive queue whose `receive` panics once `panic` is set: a bug in a
/// queue's loop.
struct Panicking {
    panic: std::sync::Arc<AtomicBool>,
    stats: netio::PortStats,
}

impl netio::Nic for Panicking {
    fn receive(&mut self, _: &Pool, _: &mut [netio::Slot]) -> Result<usize, netio::Error> {
        assert!(
            !self.panic.load(std::sync::atomic::Ordering::Acquire),
            "a queue's loop panics (on purpose)"
        );
        Ok(0)
    }

    fn transmit(&mut self, _: &Pool, slots: &[netio::Slot]) -> Result<usize, netio::Error> {
        Ok(slots.len())
    }

    fn wait(&mut self, _: i32) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }

    fn stats(&self) -> netio::PortStats {
        self.stats
    }
}

/// A queue whose loop panics while the other queue runs on: the heartbeat
/// stands still from then on (the watchdog and BGP take the load balancer
/// out), and the run, once stopped, says which queue panicked.
#[test]
fn the_heartbeat_stops_when_one_queue_panics() {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;
    let panic = Arc::new(AtomicBool::new(false));
    let ports: Vec<Box<dyn netio::Nic + Send>> = vec![
        Box::new(Panicking {
            panic: Arc::clone(&panic),
            stats: Default::default(),
        }),
        Box::new(Hanging {
            hang: Arc::new(AtomicBool::new(false)),
            idle_ms: 1,
            stats: Default::default(),
        }),
    ];
    let (stood_still, result) = with_queue_loops(ports, |moves| {
        assert!(
            moves(Duration::from_secs(2)),
            "no heartbeat with both queues running"
        );
        panic.store(true, Ordering::Release);
        std::thread::sleep(Duration::from_millis(100));
        !moves(Duration::from_millis(300))
    });
    assert!(stood_still, "the heartbeat kept beating with queue 0 dead");
    assert!(
        matches!(result, Err(lb::datapath::Error::QueueThreadPanicked(0))),
        "{:?}",
        result.map(|r| r.counters.rx)
    );
}

// The forwarder adds a batch's traffic for one VIP to the counters once
// (when another VIP's packet comes, and when the batch ends): whatever the
// order of VIPs and the cut into batches, each VIP's packets and bytes
// are those of the frames forwarded for it, and they add up to `tx`.
proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn per_vip_counters_match_the_frames_in_any_order_and_batching(
        frames in proptest::collection::vec((0usize..3, 1024u16..65_000, 0usize..400), 1..200),
        cuts in proptest::collection::vec(1usize..40, 1..20),
    ) {
        use packet::tcp::flags::ACK;
        let cfg = Config::parse(CONFIG, "test").unwrap();
        let control = Control::new(cfg).unwrap();
        let t = control.tables().load_full();
        let pool = small_pool();
        let mut h = pool.handle();
        let mut w = worker(&pool, 4096);
        // The sample's three VIPs by name, and a frame for each.
        let vips = ["http", "dns-any-port", "http6"];
        let frame = |v: usize, sport: u16, n: usize| -> Vec<u8> {
            let payload = vec![0x5a; n];
            match v {
                0 => Frame::tcp(ip("203.0.113.7"), ip("192.0.2.80"), sport, 80, ACK, &payload),
                1 => Frame::udp(ip("203.0.113.7"), ip("192.0.2.53"), sport, 53, &payload),
                _ => Frame::tcp(ip("2001:db8:1::7"), ip("2001:db8::80"), sport, 80, ACK, &payload),
            }
            .to_bytes()
        };
        let mut want: HashMap<&str, (u64, u64)> = HashMap::new();
        let mut all: Vec<Vec<u8>> = Vec::new();
        for &(v, sport, n) in &frames {
            let f = frame(v, sport, n);
            let e = want.entry(vips[v]).or_default();
            e.0 += 1;
            e.1 += f.len() as u64;
            all.push(f);
        }
        let mut at = 0;
        let mut k = 0;
        let mut out = Vec::new();
        while at < all.len() {
            let n = cuts[k % cuts.len()].min(all.len() - at);
            k += 1;
            let mut batch: Vec<_> = all[at..at + n].iter().map(|f| common::packet(&pool, &mut h, f)).collect();
            w.process(&t, &mut batch, &mut out, 0);
            at += n;
            // The counters are read between batches: what was forwarded
            // so far is in them already.
            let per: u64 = w.counters.per_vip.iter().map(|x| x.packets).sum();
            proptest::prop_assert_eq!(per, w.counters.tx);
            proptest::prop_assert_eq!(w.counters.tx, out.len() as u64);
        }
        proptest::prop_assert_eq!(out.len(), all.len(), "every frame is for a served VIP with healthy backends");
        for p in out.drain(..) {
            h.free(p.buf).unwrap();
        }
        for (i, vip) in t.vips.iter().enumerate() {
            let got = w.counters.per_vip.get(i).copied().unwrap_or_default();
            let (packets, bytes) = want.get(vip.name.as_str()).copied().unwrap_or((0, 0));
            proptest::prop_assert_eq!((got.packets, got.bytes), (packets, bytes), "VIP {}", vip.name);
        }
    }
}
