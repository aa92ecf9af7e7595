//! AF_XDP on a veth pair inside a namespace this test creates: frames sent
//! into the interface land in pool buffers through our XDP program and the
//! socket, and frames the socket transmits come out of the peer, intact.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use maio::{Hugepages, Pool};
use netio::afpacket::{self, AfPacketPort};
use netio::afxdp::AfXdpPort;
use netio::{Nic, Slot};
use netns::Netns;
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

/// The name [`in_veth_ns`] gives the namespace it makes for `tag`.
fn veth_ns_name(tag: &str) -> String {
    format!("{tag}-{}", std::process::id())
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
    systest::require_netns();
    let ns = Netns::new(&veth_ns_name(tag)).unwrap();
    ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        .unwrap();
    netns::veth_multiqueue(&ns, a.0, a.1, &ns, b.0, b.1, queues).unwrap();
    let name = ns.name().to_string();
    std::thread::spawn(move || {
        let ns = std::mem::ManuallyDrop::new(Netns::new_handle(&name));
        ns.enter().unwrap();
        // Each port keeps `BUFFERS_NEEDED` for its rings; the tests' own
        // frames and slots come on top.
        let pool = Pool::new(maio::Config {
            buffers: queues.max(1) * netio::afxdp::BUFFERS_NEEDED + 8192,
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
#[ignore = "system test: root, namespaces"]
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
#[ignore = "system test: root, namespaces"]
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
#[ignore = "system test: root, namespaces"]
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

/// An Ethernet/IPv4/GRE frame from 10.9.0.1 to `to` around a UDP packet,
/// with `key` in the GRE header if given.
fn gre_frame(to: [u8; 4], key: Option<u32>, n: u16) -> Vec<u8> {
    let s: IpAddr = "203.0.113.7".parse().unwrap();
    let d: IpAddr = "198.18.0.80".parse().unwrap();
    let inner = Frame::udp(s, d, 9000 + n, 53, b"fragment").to_bytes();
    let p = packet::parse_frame(&inner).unwrap();
    let mut buf = vec![0u8; 64];
    buf.extend_from_slice(&inner);
    let outer = packet::gre::Outer {
        eth_src: [2, 0, 0, 0, 0x0c, 0x04],
        eth_dst: [2, 0, 0, 0, 0x0c, 0x03],
        src: packet::flow::mapped([10, 9, 0, 1]),
        dst: packet::flow::mapped(to),
        ttl: 64,
    };
    let r = packet::gre::encapsulate_keyed(&mut buf, 64, &p, &outer, 0, key).unwrap();
    buf[r].to_vec()
}

/// A load balancer's own address (set with `set_redirects`): fragments
/// redirected by a fleet peer (GRE with the redirect key) reach the socket;
/// other GRE and other traffic to that address stay with the kernel (BGP,
/// health checks), and so does redirect-keyed GRE to another address.
#[test]
#[ignore = "system test: root, namespaces"]
fn redirected_fragments_to_our_own_address_reach_the_socket() {
    in_veth_ns(
        "fp-xdpr",
        ("x2", "02:00:00:00:0c:03"),
        ("x3", "02:00:00:00:0c:04"),
        1,
        |pool| {
            let mut h = pool.handle();
            let own = [10, 9, 0, 2];
            let mut xdp =
                AfXdpPort::open("x2", &pool, &[packet::flow::mapped([198, 18, 0, 80])]).unwrap();
            xdp.vip_filter()
                .set_redirects(&[packet::flow::mapped(own)])
                .unwrap();
            // A VIP update keeps the own address.
            xdp.vip_filter()
                .set(&[packet::flow::mapped([198, 18, 0, 81])])
                .unwrap();
            let mut peer = AfPacketPort::open(afpacket::Config::new("x3")).unwrap();
            let key = Some(packet::gre::FRAGMENT_REDIRECT_KEY);
            let redirects: Vec<Vec<u8>> = (0..40).map(|i| gre_frame(own, key, i)).collect();
            let ours: HashSet<Vec<u8>> = redirects.iter().cloned().collect();
            let slots = slots_with(&pool, &mut h, &redirects);
            send_all(&mut peer, &pool, &slots);
            assert_eq!(
                receive_all(&mut xdp, &pool, &mut h, &ours).len(),
                redirects.len(),
                "keyed GRE to our own address arrives through AF_XDP"
            );
            for mut s in slots {
                h.free(s.buf.take().unwrap()).unwrap();
            }
            let s3: IpAddr = "10.9.0.1".parse().unwrap();
            let own_ip: IpAddr = IpAddr::from(own);
            let mut others: Vec<Vec<u8>> = (0..20).map(|i| gre_frame(own, None, i)).collect();
            others.extend((0..20).map(|i| gre_frame(own, Some(7), i)));
            others.extend((0..20).map(|i| gre_frame([10, 9, 0, 9], key, i)));
            others
                .extend((0..20u16).map(|i| Frame::udp(s3, own_ip, 7000 + i, 179, b"x").to_bytes()));
            let not_ours: HashSet<Vec<u8>> = others.iter().cloned().collect();
            let slots = slots_with(&pool, &mut h, &others);
            send_all(&mut peer, &pool, &slots);
            std::thread::sleep(Duration::from_millis(200));
            let mut leak = HashSet::new();
            for _ in 0..5 {
                leak.extend(receive_all_once(&mut xdp, &pool, &mut h, &not_ours));
            }
            assert!(
                leak.is_empty(),
                "{} frames that are not redirects were taken from the kernel",
                leak.len()
            );
            for mut s in slots {
                h.free(s.buf.take().unwrap()).unwrap();
            }
        },
    );
}

/// Prefixes (a prefix group's address space, set with `set_prefixes`):
/// every frame to an address within one reaches the socket, IPv4 and IPv6
/// alike, frames outside stay with the kernel; a bad set is refused whole
/// and the steering stays as it was; an empty set steers nothing more.
#[test]
#[ignore = "system test: root, namespaces"]
fn frames_within_steered_prefixes_reach_the_socket() {
    in_veth_ns(
        "fp-xdpp",
        ("x4", "02:00:00:00:0c:05"),
        ("x5", "02:00:00:00:0c:06"),
        1,
        |pool| {
            let mut h = pool.handle();
            let mut xdp = AfXdpPort::open("x4", &pool, &[]).unwrap();
            let v6 = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap().octets();
            let prefixes = [
                (packet::flow::mapped([198, 18, 4, 0]), 96 + 24),
                (v6("2001:db8:5::"), 48),
            ];
            xdp.vip_filter().set_prefixes(&prefixes).unwrap();
            let mut peer = AfPacketPort::open(afpacket::Config::new("x5")).unwrap();
            let src4: IpAddr = "10.9.0.1".parse().unwrap();
            let src6: IpAddr = "2001:db8:1::1".parse().unwrap();
            let to = |dsts: &[&str]| -> Vec<Vec<u8>> {
                dsts.iter()
                    .flat_map(|d| {
                        let d: IpAddr = d.parse().unwrap();
                        let s = if d.is_ipv4() { src4 } else { src6 };
                        (0..10u16).map(move |i| Frame::udp(s, d, 7000 + i, 443, b"x").to_bytes())
                    })
                    .collect()
            };
            let inside = to(&[
                "198.18.4.0",
                "198.18.4.7",
                "198.18.4.255",
                "2001:db8:5::1",
                "2001:db8:5:ffff::9",
            ]);
            let outside = to(&[
                "198.18.5.7",
                "198.18.3.255",
                "2001:db8:6::1",
                "2001:db8:4:ffff::1",
            ]);
            let mut arrive = |port: &mut AfXdpPort, h: &mut maio::Handle, frames: &[Vec<u8>]| {
                let set: HashSet<Vec<u8>> = frames.iter().cloned().collect();
                let slots = slots_with(&pool, h, frames);
                send_all(&mut peer, &pool, &slots);
                std::thread::sleep(Duration::from_millis(200));
                let mut got = HashSet::new();
                for _ in 0..8 {
                    got.extend(receive_all_once(port, &pool, h, &set));
                }
                for mut s in slots {
                    h.free(s.buf.take().unwrap()).unwrap();
                }
                got.len()
            };
            assert_eq!(
                arrive(&mut xdp, &mut h, &inside),
                inside.len(),
                "frames within the prefixes"
            );
            assert_eq!(
                arrive(&mut xdp, &mut h, &outside),
                0,
                "frames outside stay with the kernel"
            );
            // Refused whole: a length over 128, too many prefixes.
            let bad = [prefixes[0], (v6("2001:db8:7::"), 129)];
            assert!(xdp.vip_filter().set_prefixes(&bad).is_err());
            let too_many: Vec<([u8; 16], u8)> = (0..=netio::afxdp::MAX_VIP_PREFIXES as u32)
                .map(|i| {
                    (
                        packet::flow::mapped((0x0a00_0000 + (i << 8)).to_be_bytes()),
                        120,
                    )
                })
                .collect();
            let e = xdp.vip_filter().set_prefixes(&too_many).unwrap_err();
            assert!(e.to_string().contains("more than"), "{e}");
            assert_eq!(
                arrive(&mut xdp, &mut h, &inside),
                inside.len(),
                "the set stayed"
            );
            // A full trie replaced by another full one (their union is
            // twice what it holds), then the set before them again.
            let full = |base: u32| -> Vec<([u8; 16], u8)> {
                (0..netio::afxdp::MAX_VIP_PREFIXES as u32)
                    .map(|i| (packet::flow::mapped((base + (i << 8)).to_be_bytes()), 120))
                    .collect()
            };
            xdp.vip_filter().set_prefixes(&full(0x0a00_0000)).unwrap();
            xdp.vip_filter().set_prefixes(&full(0x0b00_0000)).unwrap();
            assert_eq!(arrive(&mut xdp, &mut h, &inside), 0, "not in the full sets");
            xdp.vip_filter().set_prefixes(&prefixes).unwrap();
            assert_eq!(arrive(&mut xdp, &mut h, &inside), inside.len(), "back");
            // One prefix left: the other's frames go back to the kernel.
            xdp.vip_filter().set_prefixes(&prefixes[1..]).unwrap();
            assert_eq!(
                arrive(&mut xdp, &mut h, &inside),
                20,
                "only the IPv6 prefix's"
            );
            xdp.vip_filter().set_prefixes(&[]).unwrap();
            assert_eq!(arrive(&mut xdp, &mut h, &inside), 0, "nothing steered");
        },
    );
}

/// Receives up to `want` frames (for up to 5 s) into slots of their own.
fn receive_slots(port: &mut dyn Nic, pool: &Pool, h: &mut maio::Handle, want: usize) -> Vec<Slot> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.len() < want && std::time::Instant::now() < deadline {
        let mut slots: Vec<Slot> = (0..64)
            .map(|_| Slot {
                buf: Some(h.alloc().unwrap()),
                off: 0,
                len: 0,
            })
            .collect();
        let n = port.receive(pool, &mut slots).unwrap();
        for (i, mut s) in slots.into_iter().enumerate() {
            if i < n {
                got.push(s);
            } else {
                h.free(s.buf.take().unwrap()).unwrap();
            }
        }
        if n == 0 {
            port.wait(10);
        }
    }
    got
}

#[test]
#[ignore = "system test: root, namespaces"]
fn forwarding_in_place_sends_the_received_buffer_without_a_copy() {
    in_veth_ns(
        "fp-xdpzc",
        ("z0", "02:00:00:00:0c:11"),
        ("z1", "02:00:00:00:0c:12"),
        1,
        |pool| {
            let mut h = pool.handle();
            let vip = packet::flow::mapped([10, 9, 0, 2]);
            let mut xdp = AfXdpPort::open("z0", &pool, &[vip]).unwrap();
            let mut peer = AfPacketPort::open(afpacket::Config::new("z1")).unwrap();
            let sent = frames(200, 3000);
            let slots = slots_with(&pool, &mut h, &sent);
            send_all(&mut peer, &pool, &slots);
            common::free_slots(&mut h, slots);
            let mut got = receive_slots(&mut xdp, &pool, &mut h, sent.len());
            assert_eq!(got.len(), sent.len());
            // Rewrite in place: an outer Ethernet header written into the
            // headroom in front of the frame (as GRE encapsulation writes
            // its outer headers), the frame its payload.
            let mut want = HashSet::new();
            for s in got.iter_mut() {
                let (off, len) = (usize::from(s.off), usize::from(s.len));
                assert!(off >= 14, "the received frame has headroom");
                let data = pool.data_mut(s.buf.as_mut().unwrap());
                data[off - 14..off - 2]
                    .copy_from_slice(&[2, 0, 0, 0, 0x0c, 0x12, 2, 0, 0, 0, 0x0c, 0x11]);
                data[off - 2..off].copy_from_slice(&0x88b5u16.to_be_bytes());
                s.off -= 14;
                s.len += 14;
                want.insert(data[off - 14..off + len].to_vec());
            }
            let idx: Vec<u32> = got
                .iter()
                .map(|s| s.buf.as_ref().unwrap().index())
                .collect();
            let mut sent_n = 0;
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while sent_n < got.len() && std::time::Instant::now() < deadline {
                sent_n += xdp.transmit_owned(&pool, &mut got[sent_n..]).unwrap();
            }
            assert_eq!(sent_n, got.len());
            assert!(
                got.iter().all(|s| s.buf.is_none()),
                "the port took every buffer to send from"
            );
            let out = receive_all(&mut peer, &pool, &mut h, &want);
            assert_eq!(out.len(), want.len(), "every rewritten frame leaves intact");
            let st = xdp.stats();
            assert_eq!((st.rx_copies, st.tx_copies), (0, 0), "{st:?}");
            assert_eq!(st.tx, got.len() as u64);
            // Sent from the very buffers received into: they come back to
            // the pool once the kernel completes them (the next transmit
            // takes completions in).
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while idx
                .iter()
                .any(|&i| pool.state(i) != Some(maio::State::Free))
                && std::time::Instant::now() < deadline
            {
                xdp.transmit_owned(&pool, &mut []).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(
                idx.iter()
                    .all(|&i| pool.state(i) == Some(maio::State::Free)),
                "completed buffers go back to the pool"
            );
            // The copying path says it copied.
            let more = frames(10, 6000);
            let slots = slots_with(&pool, &mut h, &more);
            send_all(&mut xdp, &pool, &slots);
            assert_eq!(xdp.stats().tx_copies, 10);
            common::free_slots(&mut h, slots);
            assert_eq!(xdp.bad_addresses, 0);
            drop(xdp);
            drop(h);
            assert_eq!(pool.stats().in_use, 0, "every buffer is back in the pool");
        },
    );
}

#[test]
#[ignore = "system test: root, namespaces"]
fn busy_polling_stops_where_the_queue_has_no_napi_instance() {
    let tag = "fp-bpoll";
    let name = veth_ns_name(tag);
    in_veth_ns(
        tag,
        ("y0", "02:00:00:00:0d:01"),
        ("y1", "02:00:00:00:0d:02"),
        1,
        move |pool| {
            // Set y0 up for preferred busy polling, as `lb bench --busy-poll`
            // does, and let this thread see the namespace's interfaces in
            // sysfs, where the port reads that setting, as a process
            // started by `ip netns exec` would.
            let ns = std::mem::ManuallyDrop::new(Netns::new_handle(&name));
            ns.exec(&[
                "sh",
                "-c",
                "echo 2 > /sys/class/net/y0/napi_defer_hard_irqs && \
                 echo 200000 > /sys/class/net/y0/gro_flush_timeout",
            ])
            .unwrap();
            namespace_sysfs();
            assert!(std::path::Path::new("/sys/class/net/y0").exists());
            let mut h = pool.handle();
            let vip = packet::flow::mapped([10, 9, 0, 2]);
            let mut xdp = AfXdpPort::open("y0", &pool, &[vip]).unwrap();
            assert!(
                xdp.busy_polls(),
                "set up for busy polling, the port polls until frames say otherwise"
            );
            let mut peer = AfPacketPort::open(afpacket::Config::new("y1")).unwrap();
            let sent = frames(50, 1000);
            let ours: HashSet<Vec<u8>> = sent.iter().cloned().collect();
            let slots = slots_with(&pool, &mut h, &sent);
            send_all(&mut peer, &pool, &slots);
            let got = receive_all(&mut xdp, &pool, &mut h, &ours);
            assert_eq!(got.len(), sent.len(), "every frame arrives");
            // veth gives its XDP receive queue no NAPI id: nothing to poll.
            assert!(
                !xdp.busy_polls(),
                "a veth queue has no NAPI instance, so polling it would do nothing"
            );
            common::free_slots(&mut h, slots);
        },
    );
}

/// Gives the calling thread a mount namespace of its own with sysfs
/// mounted anew on /sys, so that /sys/class/net lists the interfaces of
/// the network namespace the thread is in (what `ip netns exec` does for a
/// process). Other threads keep the host's mounts.
fn namespace_sysfs() {
    // SAFETY: unshare takes no pointers; CLONE_NEWNS (which implies
    // CLONE_FS) gives only this thread a copy of the mount table.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNS) }, 0, "unshare");
    // SAFETY: the strings are NUL-terminated literals that outlive the
    // calls; the data arguments are null, which both mounts allow. The
    // first keeps what follows from propagating to the host's mounts.
    unsafe {
        assert_eq!(
            libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null()
            ),
            0,
            "making / private"
        );
        assert_eq!(
            libc::mount(
                c"sysfs".as_ptr(),
                c"/sys".as_ptr(),
                c"sysfs".as_ptr(),
                0,
                std::ptr::null()
            ),
            0,
            "mounting sysfs"
        );
    }
}
