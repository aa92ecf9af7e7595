//! The load balancer in the driver (`bpf/lb.c`, maps kept by
//! `lb::xdp`) against the packet thread (`lb::worker`), frame by frame:
//! whatever the XDP program transmits, the worker must send byte for byte
//! the same (same backend by the same hash and Maglev slot, same
//! connection-table decisions, same GRE and outer header); what it leaves
//! to user space is only what it must (fragments, ICMP, IPv6, probes,
//! partial checksums). Frames are made by etherparse and proptest, and the
//! sample capture of `lab`, not by the code under test.
//!
//! The program runs through `BPF_PROG_TEST_RUN` (no interface needed);
//! that needs root, as every XDP test here.

mod common;

use std::time::Instant;

use etherparse::{IpHeaders, Ipv4Dscp, Ipv4Ecn, Ipv4Header, PacketBuilder};
use lb::config::Config;
use lb::conntrack::Conntrack;
use lb::frag::FragTable;
use lb::worker::Worker;
use lb::xdp::{Detached, XdpTables, XDP_TX};
use lb::{Control, Mode};
use maio::{Hugepages, Pool};
use proptest::prelude::*;

fn config(extra_encap: &str) -> Config {
    let text = lab::sample::CONFIG.replace(
        "[encap]\n",
        &format!("[encap]\ngateway_mac = \"02:00:00:00:0e:01\"\nmac = \"02:00:00:00:0e:02\"\n{extra_encap}"),
    );
    Config::parse(&text, "test").unwrap()
}

fn pool() -> Pool {
    Pool::new(maio::Config {
        buffers: 256,
        buf_size: 2048,
        hugepages: Hugepages::Never,
        magazine_depth: 16,
    })
    .unwrap()
}

/// Both datapaths over one control plane.
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
        let control = Control::new(cfg.clone()).unwrap();
        let t = control.tables().load_full();
        let xdp = Detached::load(lb::xdp::sizes(&cfg, &t))
            .expect("loading the XDP load balancer (needs root and clang at build time)");
        let mut tables = XdpTables::new(xdp.lb.clone(), &cfg.conntrack);
        let s = tables.sync(&t).unwrap();
        assert!(s.enabled, "{s:?}");
        let pool = pool();
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
        assert!(self.tables.sync(&t).unwrap().enabled);
    }

    /// What the packet thread sends for `frame` (none: dropped or held).
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
            h.free(p.buf).unwrap();
        }
        sent
    }

    /// Runs `frame` through both. Returns whether the driver forwarded it
    /// (and then checks the worker sent the same bytes).
    fn compare(&mut self, frame: &[u8]) -> bool {
        if frame.len() < 14 {
            // No interface delivers less than an Ethernet header to XDP
            // (and a test run refuses it).
            let _ = self.worker(frame);
            return false;
        }
        let v = self.xdp.run(frame).unwrap();
        if v.action != XDP_TX {
            // Left to user space: the worker has it alone (and decides).
            let _ = self.worker(frame);
            return false;
        }
        let w = self.worker(frame);
        assert_eq!(
            Some(hex(&v.frame)),
            w.as_deref().map(hex),
            "the driver forwarded {} differently from the worker",
            hex(frame)
        );
        true
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A TCP or UDP frame over IPv4 made by etherparse.
#[allow(clippy::too_many_arguments)]
fn frame(
    src: [u8; 4],
    dst: [u8; 4],
    tcp: bool,
    sport: u16,
    dport: u16,
    flags: u8,
    tos: u8,
    df: bool,
    payload: &[u8],
    pad: usize,
) -> Vec<u8> {
    let proto = if tcp {
        etherparse::IpNumber::TCP
    } else {
        etherparse::IpNumber::UDP
    };
    let mut ip = Ipv4Header::new(0, 64, proto, src, dst).unwrap();
    ip.dscp = Ipv4Dscp::try_new(tos >> 2).unwrap();
    ip.ecn = Ipv4Ecn::try_new(tos & 3).unwrap();
    ip.dont_fragment = df;
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 9], [2, 0, 0, 0, 0x0e, 2])
        .ip(IpHeaders::Ipv4(ip, Default::default()));
    let mut out = Vec::new();
    if tcp {
        let mut t = b.tcp(sport, dport, 1000, 65535);
        if flags & 0x02 != 0 {
            t = t.syn();
        }
        if flags & 0x01 != 0 {
            t = t.fin();
        }
        if flags & 0x04 != 0 {
            t = t.rst();
        }
        if flags & 0x10 != 0 {
            t = t.ack(7);
        }
        t.write(&mut out, payload).unwrap();
    } else {
        b.udp(sport, dport).write(&mut out, payload).unwrap();
    }
    out.resize(out.len() + pad, 0);
    out
}

/// The sample capture: everything the driver forwards, the worker forwards
/// the same; the common case is forwarded there; fragments, ICMP errors
/// and IPv6 are not.
#[test]
fn the_driver_forwards_the_sample_capture_as_the_worker_does() {
    let mut both = Both::new(config(""));
    let mut forwarded = 0;
    for s in lab::sample::mixed_traffic() {
        let p = packet::parse_frame(&s.frame);
        let fast = both.compare(&s.frame);
        if let Ok(p) = p {
            if p.fragment.is_some() || p.icmp_quote.is_some() || !p.flow.is_v4() {
                assert!(!fast, "{} went through the driver", p.flow);
            }
        }
        forwarded += usize::from(fast);
    }
    assert!(
        forwarded >= 4,
        "only {forwarded} sample frames in the driver"
    );
}

/// One frame of a generated sequence: source address, source port, TCP
/// (else UDP), TCP flags, TOS, DF, payload length, Ethernet padding, and a
/// change of the tables before it (1 a backend down, 2 up, 3 another
/// drained, 4 undrained).
type Case = (u32, u16, bool, u8, u8, bool, usize, usize, u8);

/// Flows of every kind, and the tables changing under them (a backend down
/// and up again, another drained and back): frame for frame, the same bytes.
fn flows_agree(extra: &str, cases: &[Case]) {
    let mut both = Both::new(config(extra));
    let mut fast = 0;
    for (i, &(src, sport, tcp, flags, tos, df, len, pad, event)) in cases.iter().enumerate() {
        match event {
            1 => {
                both.control.set_health("10.1.0.2", false);
                both.sync();
            }
            2 => {
                both.control.set_health("10.1.0.2", true);
                both.sync();
            }
            // Drained: established flows stay, new connections move.
            3 => {
                let mut c = both.control.config().clone();
                c.pools[0].drained = vec!["10.1.0.3".into()];
                both.control.apply(c).unwrap();
                both.sync();
            }
            4 => {
                let mut c = both.control.config().clone();
                c.pools[0].drained.clear();
                both.control.apply(c).unwrap();
                both.sync();
            }
            _ => {}
        }
        let (dst, dport) = if tcp {
            ([192, 0, 2, 80], 80)
        } else {
            ([192, 0, 2, 53], sport ^ 0x5a5a)
        };
        let payload: Vec<u8> = (0..len).map(|j| (i + j) as u8).collect();
        let f = frame(
            src.to_be_bytes(),
            dst,
            tcp,
            sport,
            dport,
            flags,
            tos,
            df,
            &payload,
            pad,
        );
        fast += usize::from(both.compare(&f));
    }
    assert!(
        fast * 2 >= cases.len(),
        "{fast} of {} in the driver",
        cases.len()
    );
}

fn case() -> impl Strategy<Value = Case> {
    (
        // Few sources and ports, so flows repeat and the connection table
        // decides.
        prop::sample::select(vec![0xc633_6401u32, 0xc633_6402, 0x0a09_0001, 0xcb00_7107]),
        prop::sample::select(vec![1024u16, 1025, 40000, 65535]),
        any::<bool>(),
        prop::sample::select(vec![0x02u8, 0x10, 0x12, 0x11, 0x04, 0x18, 0x01]),
        any::<u8>(),
        any::<bool>(),
        0usize..300,
        prop::sample::select(vec![0usize, 0, 0, 4, 18]),
        prop::sample::select(vec![0u8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_driver_and_the_worker_agree_on_every_frame(cases in prop::collection::vec(case(), 1..40)) {
        flows_agree("", &cases);
    }

    #[test]
    fn they_agree_with_source_prefixes_too(cases in prop::collection::vec(case(), 1..20)) {
        flows_agree("source_prefix = \"198.18.100.0/24\"\n", &cases);
    }
}

/// A packet-tracer probe and a checksum left partial go to user space.
#[test]
fn probes_and_partial_checksums_are_left_to_user_space() {
    let both = Both::new(config(""));
    let mut probe = b"FPTRACE1".to_vec();
    probe.extend_from_slice(&[0; 24]);
    let f = frame(
        [198, 51, 100, 1],
        [192, 0, 2, 80],
        true,
        1024,
        80,
        0x02,
        0,
        true,
        &probe,
        0,
    );
    assert_ne!(both.xdp.run(&f).unwrap().action, XDP_TX);
    // The same frame without the magic goes through the driver.
    let plain = frame(
        [198, 51, 100, 1],
        [192, 0, 2, 80],
        true,
        1024,
        80,
        0x02,
        0,
        true,
        &[0; 32],
        0,
    );
    assert_eq!(both.xdp.run(&plain).unwrap().action, XDP_TX);
    // A UDP checksum field holding the pseudo-header sum (what a local
    // sender leaves for offload).
    let mut u = frame(
        [198, 51, 100, 1],
        [192, 0, 2, 53],
        false,
        5000,
        53,
        0,
        0,
        false,
        &[1; 20],
        0,
    );
    let l4 = packet::parse_frame(&u).unwrap().l4_offset;
    // The folded, uncomplemented pseudo-header sum (8 + 20 bytes of UDP).
    let pseudo = !packet::checksum::finish(packet::checksum::pseudo_v4(
        [198, 51, 100, 1],
        [192, 0, 2, 53],
        17,
        28,
    ));
    u[l4 + 6..l4 + 8].copy_from_slice(&pseudo.to_be_bytes());
    assert_ne!(both.xdp.run(&u).unwrap().action, XDP_TX);
}

/// What the driver forwarded shows in the counters, per VIP and backend.
#[test]
fn the_driver_counts_what_it_forwards() {
    let mut both = Both::new(config(""));
    let mut n = 0;
    for i in 0..50u16 {
        let f = frame(
            [198, 51, 100, 7],
            [192, 0, 2, 80],
            true,
            2000 + i,
            80,
            0x02,
            0,
            true,
            &[],
            0,
        );
        n += usize::from(both.compare(&f));
    }
    assert_eq!(n, 50);
    let c = both.tables.counters().unwrap();
    assert_eq!((c.rx, c.tx), (50, 50));
    assert_eq!(c.per_vip.first().map(|t| t.packets), Some(50));
    assert_eq!(c.per_backend.iter().map(|t| t.packets).sum::<u64>(), 50);
    assert_eq!(c.conntrack.inserts, 50);
}

/// A slot array too small for the tables: the driver turns itself off
/// (frames go to user space) and says why; once a reload drops a VIP so
/// that the rest fits, it starts over and forwards again.
#[test]
fn maps_too_small_turn_the_driver_off_until_the_tables_fit() {
    let cfg = config("");
    let mut control = Control::new(cfg.clone()).unwrap();
    let t = control.tables().load_full();
    let mut sizes = lb::xdp::sizes(&cfg, &t);
    // The IPv4 VIPs' tables: 65,537 (web) and 1,009 (dns) slots.
    // (Rounded up to even by the loader.)
    sizes.slots = 65_537 + 1_009 - 2;
    let xdp = Detached::load(sizes).unwrap();
    let mut tables = XdpTables::new(xdp.lb.clone(), &cfg.conntrack);
    let s = tables.sync(&t).unwrap();
    assert!(!s.enabled, "{s:?}");
    assert!(
        s.reason.as_deref().unwrap_or("").contains("no room"),
        "{s:?}"
    );
    let f = frame(
        [198, 51, 100, 1],
        [192, 0, 2, 80],
        true,
        1024,
        80,
        0x02,
        0,
        true,
        &[],
        0,
    );
    assert_ne!(xdp.run(&f).unwrap().action, XDP_TX);
    // Without the DNS VIP the web table fits (after starting over: the
    // DNS table may have taken its room).
    let mut smaller = cfg.clone();
    smaller.vips.retain(|v| v.name != "dns-any-port");
    control.apply(smaller).unwrap();
    let s = tables.sync(&control.tables().load_full()).unwrap();
    assert!(s.enabled && s.reason.is_none(), "{s:?}");
    assert_eq!(xdp.run(&f).unwrap().action, XDP_TX);
}
