//! AF_PACKET on a veth pair inside a namespace this test creates: frames
//! sent from one end arrive intact at the other; a fanout group splits
//! flows between sockets without losing or duplicating any.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use maio::{Hugepages, Pool};
use netio::afpacket::{AfPacketPort, Config};
use netio::Nic;
use netns::Netns;

mod common;
use common::{
    frames as udp_frames, free_slots, receive_batch, send_all, slots_with,
    wait_sleeps_until_a_frame,
};

fn pool() -> Pool {
    Pool::new(maio::Config {
        buffers: 2048,
        buf_size: 2048,
        hugepages: Hugepages::Never,
        magazine_depth: 64,
    })
    .unwrap()
}

fn send(port: &mut AfPacketPort, pool: &Pool, frames: &[Vec<u8>]) {
    let mut h = pool.handle();
    let slots = slots_with(pool, &mut h, frames);
    send_all(port, pool, &slots);
    free_slots(&mut h, slots);
}

/// Receives on all ports until `want` frames of ours arrived or 5 s passed;
/// returns the frames each port got.
fn receive(
    ports: &mut [AfPacketPort],
    pool: &Pool,
    ours: &HashSet<Vec<u8>>,
    want: usize,
) -> Vec<Vec<Vec<u8>>> {
    let mut h = pool.handle();
    let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(); ports.len()];
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.iter().map(Vec::len).sum::<usize>() < want && Instant::now() < deadline {
        for (i, p) in ports.iter_mut().enumerate() {
            got[i].extend(receive_batch(p, pool, &mut h, ours));
        }
    }
    got
}

#[test]
#[ignore = "system test: root, namespaces"]
fn veth_round_trip_and_fanout() {
    systest::require_netns();
    let ns = Netns::new(&format!("fp-afp-{}", std::process::id())).unwrap();
    ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        .unwrap();
    netns::veth(&ns, "a", "02:00:00:00:0a:01", &ns, "b", "02:00:00:00:0b:01").unwrap();
    let name = ns.name().to_string();
    std::thread::spawn(move || {
        let ns = std::mem::ManuallyDrop::new(Netns::new_handle(&name));
        ns.enter().unwrap();
        let pool = pool();
        let mut a = AfPacketPort::open(Config::new("a")).unwrap();
        let mut b = AfPacketPort::open(Config::new("b")).unwrap();
        let sent = udp_frames(300, 1000);
        let ours: HashSet<Vec<u8>> = sent.iter().cloned().collect();
        send(&mut a, &pool, &sent);
        let got = receive(std::slice::from_mut(&mut b), &pool, &ours, sent.len());
        let got: HashSet<Vec<u8>> = got.into_iter().flatten().collect();
        assert_eq!(got.len(), sent.len(), "every frame arrives intact");
        assert!(b.stats().rx >= 300 && a.stats().tx == 300);
        drop(b);

        // Fanout: two sockets in one group share the flows.
        let mut c = Config::new("b");
        c.fanout = Some(42);
        let mut ports = vec![
            AfPacketPort::open(c.clone()).unwrap(),
            AfPacketPort::open(c).unwrap(),
        ];
        send(&mut a, &pool, &sent);
        let got = receive(&mut ports, &pool, &ours, sent.len());
        let (x, y) = (got[0].len(), got[1].len());
        assert_eq!(
            x + y,
            sent.len(),
            "no frame lost or duplicated across the group"
        );
        assert!(x > 50 && y > 50, "flows are spread: {x} / {y}");
        let (sx, sy): (HashSet<_>, HashSet<_>) = (got[0].iter().collect(), got[1].iter().collect());
        assert!(sx.is_disjoint(&sy));
    })
    .join()
    .unwrap();
}

/// An idle port sleeps in `wait` and wakes for a frame (after the block
/// timeout, when the kernel hands the block over).
#[test]
#[ignore = "system test: root, namespaces"]
fn wait_sleeps_until_a_frame_arrives() {
    systest::require_netns();
    let ns = Netns::new(&format!("fp-afw-{}", std::process::id())).unwrap();
    ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        .unwrap();
    netns::veth(&ns, "a", "02:00:00:00:0a:03", &ns, "b", "02:00:00:00:0b:03").unwrap();
    let name = ns.name().to_string();
    std::thread::spawn(move || {
        let ns = std::mem::ManuallyDrop::new(Netns::new_handle(&name));
        ns.enter().unwrap();
        let pool = pool();
        let mut a = AfPacketPort::open(Config::new("a")).unwrap();
        let mut b = AfPacketPort::open(Config::new("b")).unwrap();
        let sent = udp_frames(1, 3000);
        let ours: HashSet<Vec<u8>> = sent.iter().cloned().collect();
        let p = pool.clone();
        wait_sleeps_until_a_frame(&mut b, &pool, &ours, move || send(&mut a, &p, &sent));
    })
    .join()
    .unwrap();
}

#[test]
#[ignore = "system test: root, namespaces"]
fn missing_interface_is_a_clear_error() {
    let e = AfPacketPort::open(Config::new("no-such-if0"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("no-such-if0") && e.contains("no such interface"),
        "{e}"
    );
}
