//! The veth bench's XDP harness on a veth pair inside a namespace this
//! test creates: the AF_XDP generator offers its frames round and round,
//! and the XDP forwarder rewrites frames and sends them back out. Needs
//! root: system tests.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use bench::xdp::{attach_forwarder, attach_pass, Generator};
use maio::{Hugepages, Pool};
use netio::afpacket::{self, AfPacketPort};
use netns::Netns;
use packet::build::Frame;

// The port tests' helpers (frames, slots, bounded send and receive loops):
// one copy for both crates' tests.
#[path = "../../netio/tests/common/mod.rs"]
mod common;
use common::{frames, receive_all, send_all, slots_with};

/// Run `f` on a thread inside a namespace this test creates, holding the
/// veth pair `a`-`b` (name, MAC; both up), with a fresh pool. The
/// namespace is removed when `f` has returned.
fn in_veth_ns(tag: &str, a: (&str, &str), b: (&str, &str), f: impl FnOnce(Pool) + Send + 'static) {
    systest::require_netns();
    let ns = Netns::new(&format!("{tag}-{}", std::process::id())).unwrap();
    ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        .unwrap();
    netns::veth(&ns, a.0, a.1, &ns, b.0, b.1).unwrap();
    let name = ns.name().to_string();
    std::thread::spawn(move || {
        let ns = std::mem::ManuallyDrop::new(Netns::new_handle(&name));
        ns.enter().unwrap();
        let pool = Pool::new(maio::Config {
            buffers: netio::afxdp::BUFFERS_NEEDED + 8192,
            buf_size: 2048,
            hugepages: Hugepages::Auto,
            magazine_depth: 64,
        })
        .unwrap();
        f(pool);
    })
    .join()
    .unwrap();
}

#[test]
#[ignore = "system test: root, namespaces, XDP"]
fn the_generator_offers_its_frames_round_and_round() {
    in_veth_ns(
        "fp-xdpgen",
        ("q0", "02:00:00:00:0c:21"),
        ("q1", "02:00:00:00:0c:22"),
        |pool| {
            let mut h = pool.handle();
            let mut peer = AfPacketPort::open(afpacket::Config::new("q1")).unwrap();
            let sent = frames(7, 4000);
            let ours: HashSet<Vec<u8>> = sent.iter().cloned().collect();
            let mut g = Generator::open("q0", 0, &sent).unwrap();
            assert_eq!(g.send(), 1024, "a whole ring at a time");
            assert_eq!(
                g.flush(Duration::from_secs(2)),
                0,
                "the kernel takes them all"
            );
            assert_eq!(g.completed(), 1024);
            // Copy mode: at most the socket's budget a wake-up (a whole
            // ring on Linux 6.17 and later, else 32).
            assert!(
                [32, 1024].contains(&g.tx_budget()),
                "budget {}",
                g.tx_budget()
            );
            assert!(
                g.kicks() >= u64::from(1024 / g.tx_budget()),
                "{} wake-ups for 1024 frames at {} a wake-up",
                g.kicks(),
                g.tx_budget()
            );
            let got = receive_all(&mut peer, &pool, &mut h, &ours);
            assert_eq!(got, ours, "every frame, intact");
        },
    );
}

#[test]
#[ignore = "system test: root, namespaces, XDP"]
fn the_xdp_forwarder_rewrites_and_sends_back_out() {
    in_veth_ns(
        "fp-xdpfwd",
        ("w0", "02:00:00:00:0c:31"),
        ("w1", "02:00:00:00:0c:32"),
        |pool| {
            let mut h = pool.handle();
            // w0 runs an XDP program, so it accepts what w1 redirects.
            let _pass = attach_pass("w0").unwrap();
            let mut peer = AfPacketPort::open(afpacket::Config::new("w0")).unwrap();
            let gw = [2, 0, 0, 0, 0x0c, 0x31];
            let me = [2, 0, 0, 0, 0x0c, 0x32];
            let backends: Vec<std::net::Ipv4Addr> =
                vec!["10.20.0.1".parse().unwrap(), "10.20.0.2".parse().unwrap()];
            let (_fwd, _mode) = attach_forwarder("w1", gw, me, &backends).unwrap();
            let (s, d): (IpAddr, IpAddr) =
                ("10.9.0.1".parse().unwrap(), "198.18.0.1".parse().unwrap());
            let want: HashSet<Vec<u8>> = (0..100u16)
                .flat_map(|i| {
                    backends.iter().map(move |b| {
                        let mut f = Frame::udp(s, IpAddr::V4(*b), 5000 + i, 9, b"payload");
                        f.eth.dst = gw;
                        f.eth.src = me;
                        f.to_bytes()
                    })
                })
                .collect();
            let input: Vec<Vec<u8>> = (0..100u16)
                .map(|i| {
                    let mut f = Frame::udp(s, d, 5000 + i, 9, b"payload");
                    f.eth.dst = me;
                    f.eth.src = gw;
                    f.to_bytes()
                })
                .collect();
            let slots = slots_with(&pool, &mut h, &input);
            send_all(&mut peer, &pool, &slots);
            common::free_slots(&mut h, slots);
            // Each frame comes back to one of the backends, with correct
            // checksums (the expected frames are built afresh).
            let got = receive_all(&mut peer, &pool, &mut h, &want);
            assert_eq!(got.len(), input.len());
        },
    );
}
