//! AF_XDP on a veth pair inside a namespace this test creates: frames sent
//! into the interface land in pool buffers through our XDP program and the
//! socket, and frames the socket transmits come out of the peer, intact.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use lab::netns::{self, Netns};
use maio::{Hugepages, Pool};
use netio::afpacket::{self, AfPacketPort};
use netio::afxdp::AfXdpPort;
use netio::{Nic, Slot};
use packet::build::Frame;

mod common;
use common::{frames, receive_all, send_all, slots_with, wait_sleeps_until_a_frame};

/// One receive call: what it got of `ours`.
fn receive_all_once(
    port: &mut dyn Nic,
    pool: &Pool,
    h: &mut maio::Handle,
    ours: &HashSet<Vec<u8>>,
) -> HashSet<Vec<u8>> {
    let mut slots: Vec<Slot> = (0..64)
        .map(|_| Slot {
            buf: Some(h.alloc().unwrap()),
            off: 0,
            len: 0,
        })
        .collect();
    port.receive(pool, &mut slots).unwrap();
    let mut got = HashSet::new();
    for s in slots.iter_mut() {
        let f = s.frame(pool).to_vec();
        if s.len > 0 && ours.contains(&f) {
            got.insert(f);
        }
        h.free(s.buf.take().unwrap()).unwrap();
    }
    got
}

/// Run `f` on a thread inside a namespace this test creates, holding the
/// veth pair `a`-`b` (name, MAC; `queues` queues each, both up), with a
/// fresh pool. The namespace is removed when `f` has returned.
fn in_veth_ns(
    tag: &str,
    a: (&str, &str),
    b: (&str, &str),
    queues: u32,
    f: impl FnOnce(Pool) + Send + 'static,
) {
    assert!(
        netns::available(),
        "this test needs root and iproute2 (run scripts/setup.sh as root)"
    );
    let ns = Netns::new(&format!("{tag}-{}", std::process::id())).unwrap();
    ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        .unwrap();
    netns::veth_multiqueue(&ns, a.0, a.1, &ns, b.0, b.1, queues).unwrap();
    let name = ns.name().to_string();
    std::thread::spawn(move || {
        let ns = std::mem::ManuallyDrop::new(Netns::new_handle(&name));
        ns.enter().unwrap();
        let pool = Pool::new(maio::Config {
            buffers: 8192,
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
fn veth_receive_and_transmit() {
    in_veth_ns(
        "fp-xdp",
        ("x0", "02:00:00:00:0c:01"),
        ("x1", "02:00:00:00:0c:02"),
        1,
        |pool| {
            let mut h = pool.handle();
            let vip = packet::flow::mapped([10, 9, 0, 2]);
            let mut xdp = AfXdpPort::open("x0", &pool, &[vip]).unwrap();
            let mut peer = AfPacketPort::open(afpacket::Config::new("x1")).unwrap();

            // Into the interface: peer -> x0 -> XDP -> our socket.
            let sent = frames(300, 1000);
            let ours: HashSet<Vec<u8>> = sent.iter().cloned().collect();
            let slots = slots_with(&pool, &mut h, &sent);
            send_all(&mut peer, &pool, &slots);
            let got = receive_all(&mut xdp, &pool, &mut h, &ours);
            assert_eq!(
                got.len(),
                sent.len(),
                "every frame arrives through AF_XDP ({:?} mode)",
                xdp.mode()
            );
            for mut s in slots {
                h.free(s.buf.take().unwrap()).unwrap();
            }
            // Frames for an address that is not a VIP stay with the kernel.
            let (s3, d3): (IpAddr, IpAddr) =
                ("10.9.0.1".parse().unwrap(), "10.9.0.3".parse().unwrap());
            let other: Vec<Vec<u8>> = (0..50u16)
                .map(|i| Frame::udp(s3, d3, 7000 + i, 9, b"x").to_bytes())
                .collect();
            let slots = slots_with(&pool, &mut h, &other);
            send_all(&mut peer, &pool, &slots);
            std::thread::sleep(Duration::from_millis(200));
            let not_ours: HashSet<Vec<u8>> = other.iter().cloned().collect();
            let mut leak = HashSet::new();
            for _ in 0..5 {
                leak.extend(receive_all_once(&mut xdp, &pool, &mut h, &not_ours));
            }
            assert!(
                leak.is_empty(),
                "{} non-VIP frames were taken from the kernel",
                leak.len()
            );
            for mut s in slots {
                h.free(s.buf.take().unwrap()).unwrap();
            }
            // Updating the VIP set takes effect at once.
            xdp.vip_filter()
                .set(&[vip, packet::flow::mapped([10, 9, 0, 3])])
                .unwrap();
            let slots = slots_with(&pool, &mut h, &other);
            send_all(&mut peer, &pool, &slots);
            assert_eq!(
                receive_all(&mut xdp, &pool, &mut h, &not_ours).len(),
                other.len()
            );
            for mut s in slots {
                h.free(s.buf.take().unwrap()).unwrap();
            }

            // Out of the interface: our socket -> x0 -> peer.
            let sent = frames(300, 5000);
            let ours: HashSet<Vec<u8>> = sent.iter().cloned().collect();
            let slots = slots_with(&pool, &mut h, &sent);
            send_all(&mut xdp, &pool, &slots);
            let got = receive_all(&mut peer, &pool, &mut h, &ours);
            assert_eq!(got.len(), sent.len(), "every frame leaves through AF_XDP");
            for mut s in slots {
                h.free(s.buf.take().unwrap()).unwrap();
            }
            assert_eq!(xdp.bad_addresses, 0);
            drop(xdp);
            drop(h);
            assert_eq!(pool.stats().in_use, 0, "every buffer is back in the pool");
        },
    );
}

#[test]
fn one_socket_per_queue() {
    in_veth_ns(
        "fp-xdq",
        ("q0", "02:00:00:00:0d:01"),
        ("q1", "02:00:00:00:0d:02"),
        2,
        |pool| {
            let mut h = pool.handle();
            let vip = packet::flow::mapped([10, 9, 0, 2]);
            let mut ports = AfXdpPort::open_queues("q0", &pool, &[vip], 2).unwrap();
            assert_eq!(ports.len(), 2);
            let mut peer = AfPacketPort::open(afpacket::Config::new("q1")).unwrap();
            let sent = frames(400, 1000);
            let ours: HashSet<Vec<u8>> = sent.iter().cloned().collect();
            let slots = slots_with(&pool, &mut h, &sent);
            send_all(&mut peer, &pool, &slots);
            std::thread::sleep(Duration::from_millis(200));
            let mut per = Vec::new();
            let mut all = HashSet::new();
            for p in ports.iter_mut() {
                let mut got = HashSet::new();
                for _ in 0..20 {
                    got.extend(receive_all_once(p, &pool, &mut h, &ours));
                }
                per.push(got.len());
                assert!(all.is_disjoint(&got), "a frame arrived on two queues");
                all.extend(got);
            }
            assert_eq!(
                all.len(),
                sent.len(),
                "every frame arrives on one of the queues: {per:?}"
            );
            // (Which queue: AF_PACKET picks the sender's queue by CPU, not by
            // flow, so a one-thread sender fills one queue; forwarded traffic
            // and NICs with RSS spread by flow.)
            for mut s in slots {
                h.free(s.buf.take().unwrap()).unwrap();
            }
        },
    );
}

/// An idle AF_XDP port sleeps in `wait` (poll on the socket, the rings
/// bound with need_wakeup) and wakes for a frame.
#[test]
fn wait_sleeps_until_a_frame_arrives() {
    in_veth_ns(
        "fp-xdw",
        ("w0", "02:00:00:00:0c:03"),
        ("w1", "02:00:00:00:0c:04"),
        1,
        |pool| {
            let vip = packet::flow::mapped([10, 9, 0, 2]);
            let mut xdp = AfXdpPort::open("w0", &pool, &[vip]).unwrap();
            let mut peer = AfPacketPort::open(afpacket::Config::new("w1")).unwrap();
            let sent = frames(1, 3000);
            let ours: HashSet<Vec<u8>> = sent.iter().cloned().collect();
            let p = pool.clone();
            wait_sleeps_until_a_frame(&mut xdp, &pool, &ours, move || {
                let mut h = p.handle();
                let slots = slots_with(&p, &mut h, &sent);
                send_all(&mut peer, &p, &slots);
                for mut s in slots {
                    h.free(s.buf.take().unwrap()).unwrap();
                }
            });
        },
    );
}
