//! Frontends that misuse several queue pairs, written from the vhost-user
//! specification ("Multiple queue support": the backend says how many
//! queues it has with `GET_QUEUE_NUM`; the frontend sets each ring up and
//! enables it with `SET_VRING_ENABLE`; a ring is served only once enabled)
//! rather than from what the switch does: a ring index beyond the queues
//! offered (in every request that names one, and in the enable QEMU sends
//! before `SET_FEATURES`), kicks and frames on a pair that is set up but
//! not enabled, an enable before the ring exists, rings of different
//! sizes, an in-flight region for more queues than offered, and one guest
//! with long chains on two queues against the port's descriptor budget.
//! Each is refused and counted, or served without harm, and the switch
//! goes on.

mod common;

use std::os::fd::AsFd;
use std::path::Path;

use common::{add_mq_port, dir, settle, vport};
use vhost_peer::{
    eventfd, inflight, req, state, u64p, vring_addr, MqGuest, RawDesc, Wire, FEATURES, F_NEXT,
    PROTOCOL_F_INFLIGHT_SHMFD, PROTOCOL_F_MQ, REPLY_TIMEOUT, VERSION,
};
use vswitch::ports::vhost::datapath::{chain_reads, DESC_BUDGET, FREE_READS};
use vswitch::EventLoop;

/// `VIRTIO_NET_F_MQ`.
const F_MQ: u64 = 1 << 22;

/// Connect and get through the handshake (features read, `MQ` and
/// `proto` acknowledged, owner, features set unless `early`).
fn handshake(sw: &mut EventLoop, path: &Path, proto: u64, early: bool) -> (Wire, u64, u64) {
    let mut w = Wire::connect(path).expect("connect");
    let mut pump = || sw.poll_events();
    let features = w
        .request_pumped(req::GET_FEATURES, &[], REPLY_TIMEOUT, &mut pump)
        .expect("GET_FEATURES");
    w.request_pumped(req::GET_PROTOCOL_FEATURES, &[], REPLY_TIMEOUT, &mut pump)
        .expect("GET_PROTOCOL_FEATURES");
    w.send(
        req::SET_PROTOCOL_FEATURES,
        VERSION,
        &u64p(PROTOCOL_F_MQ | proto),
        &[],
    )
    .unwrap();
    let queues = w
        .request_pumped(req::GET_QUEUE_NUM, &[], REPLY_TIMEOUT, &mut pump)
        .expect("GET_QUEUE_NUM");
    w.send(req::SET_OWNER, VERSION, &[], &[]).unwrap();
    if !early {
        w.send(req::SET_FEATURES, VERSION, &u64p(FEATURES), &[])
            .unwrap();
    }
    (w, features, queues)
}

#[test]
fn the_queue_count_offered_is_the_port_s() {
    let d = dir("hmq-num");
    let mut sw = common::switch();
    add_mq_port(&mut sw, &d, "one", 1);
    add_mq_port(&mut sw, &d, "three", 3);
    let (_w, f1, q1) = handshake(&mut sw, &d.join("one.sock"), 0, false);
    assert_eq!(q1, 1);
    assert_eq!(f1 & F_MQ, 0, "one pair: VIRTIO_NET_F_MQ not offered");
    let (_w3, f3, q3) = handshake(&mut sw, &d.join("three.sock"), 0, false);
    assert_eq!(q3, 3, "GET_QUEUE_NUM answers the configured pairs");
    assert_ne!(f3 & F_MQ, 0, "VIRTIO_NET_F_MQ offered");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn every_request_naming_a_queue_beyond_those_offered_is_refused_and_counted() {
    let d = dir("hmq-index");
    let mut sw = common::switch();
    let p = add_mq_port(&mut sw, &d, "a", 2);
    let path = d.join("a.sock");
    let ev = eventfd().expect("eventfd");
    // (what, request, payload, with an eventfd); the port has queues 0..4.
    let bad: Vec<(&str, u32, Vec<u8>, bool)> = vec![
        ("SET_VRING_NUM", req::SET_VRING_NUM, state(4, 64), false),
        ("SET_VRING_BASE", req::SET_VRING_BASE, state(5, 0), false),
        (
            "SET_VRING_ADDR",
            req::SET_VRING_ADDR,
            vring_addr(4, 0, 0, 0),
            false,
        ),
        ("SET_VRING_KICK", req::SET_VRING_KICK, u64p(4), true),
        ("SET_VRING_CALL", req::SET_VRING_CALL, u64p(255), true),
        ("GET_VRING_BASE", req::GET_VRING_BASE, state(7, 0), false),
        (
            "SET_VRING_ENABLE",
            req::SET_VRING_ENABLE,
            state(4, 1),
            false,
        ),
        (
            "SET_VRING_ENABLE",
            req::SET_VRING_ENABLE,
            state(u32::MAX, 1),
            false,
        ),
    ];
    for (k, (what, code, payload, fd)) in bad.iter().enumerate() {
        let (w, _, _) = handshake(&mut sw, &path, 0, false);
        let fds = if *fd { vec![ev.as_fd()] } else { vec![] };
        w.send(*code, VERSION, payload, &fds).unwrap();
        settle(&mut sw);
        let cs = vport(&mut sw, p).conn_stats().clone();
        assert_eq!(cs.closed, k as u64 + 1, "{what}: the connection closed");
        let why = cs.last_close.unwrap_or_default();
        assert!(
            why.contains("does not exist (2 queue pairs offered: queues 0..4)"),
            "{what}: {why}"
        );
    }
    // The enable QEMU sends before SET_FEATURES, for a pair not offered
    // (a guest enabling more pairs than the port has).
    let (w, _, _) = handshake(&mut sw, &path, 0, true);
    w.send(
        req::SET_VRING_ENABLE,
        VERSION | vhost_peer::NEED_REPLY,
        &state(6, 1),
        &[],
    )
    .unwrap();
    settle(&mut sw);
    let cs = vport(&mut sw, p).conn_stats().clone();
    assert_eq!(cs.closed, bad.len() as u64 + 1);
    assert!(cs
        .last_close
        .unwrap_or_default()
        .contains("queue 6 does not exist"));
    // And a frontend that keeps to the offer is served.
    let g = MqGuest::attach_pumped(&path, &[64; 4], 2, REPLY_TIMEOUT, &mut || sw.poll_events())
        .expect("attach");
    settle(&mut sw);
    assert!(vport(&mut sw, p).queues_running().iter().all(|&r| r));
    drop(g);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn kicks_and_frames_on_a_pair_not_enabled_cause_no_work() {
    let d = dir("hmq-disabled");
    let mut sw = common::switch();
    let pa = add_mq_port(&mut sw, &d, "a", 2);
    let mut g = MqGuest::attach_pumped(&d.join("a.sock"), &[64; 4], 1, REPLY_TIMEOUT, &mut || {
        sw.poll_events()
    })
    .expect("attach");
    settle(&mut sw);
    // Pair 1 is set up (rings, kick, call) but the guest never enabled
    // it: frames published on it and 500 kicks are not served.
    let f = {
        let mut f = vec![0u8; 60];
        f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]);
        f
    };
    for _ in 0..50 {
        g.send_frame(1, &f);
    }
    for _ in 0..450 {
        g.kick[3].signal();
        g.kick[2].signal();
        sw.poll_events();
    }
    settle(&mut sw);
    let st = vport(&mut sw, pa).all_queue_stats();
    assert_eq!((st[3].chains, st[3].desc_reads), (0, 0), "nothing taken");
    assert_eq!((st[2].chains, st[2].desc_reads), (0, 0));
    assert!(st[3].kicks > 0, "its kicks are drained and counted");
    assert!(!vport(&mut sw, pa).queues_running()[3]);
    // Enabled, the pair's frames are taken where it stood.
    g.enable_pair(1, true).unwrap();
    settle(&mut sw);
    let st = vport(&mut sw, pa).all_queue_stats();
    assert_eq!(st[3].chains, 50);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_enable_before_the_ring_exists_waits_for_it() {
    let d = dir("hmq-early");
    let mut sw = common::switch();
    let pa = add_mq_port(&mut sw, &d, "a", 2);
    let mut g = MqGuest::connect_pumped(&d.join("a.sock"), &[64; 4], REPLY_TIMEOUT, &mut || {
        sw.poll_events()
    })
    .expect("connect");
    // Pair 1 enabled first, pair 0 set up and enabled as usual.
    g.enable_pair(1, true).unwrap();
    g.setup_queue(0, 0).unwrap();
    g.setup_queue(1, 0).unwrap();
    g.enable_pair(0, true).unwrap();
    settle(&mut sw);
    assert_eq!(
        vport(&mut sw, pa).queues_running(),
        vec![true, true, false, false],
        "an enabled queue with no ring is not served"
    );
    // A size and a kick (the queue started) but no addresses yet: still
    // nothing.
    g.send(req::SET_VRING_NUM, &state(2, 64)).unwrap();
    g.wire
        .send(req::SET_VRING_KICK, VERSION, &u64p(2), &[g.kick[2].as_fd()])
        .unwrap();
    settle(&mut sw);
    assert!(!vport(&mut sw, pa).queues_running()[2]);
    g.setup_queue(2, 0).unwrap();
    g.setup_queue(3, 0).unwrap();
    settle(&mut sw);
    assert_eq!(vport(&mut sw, pa).queues_running(), vec![true; 4]);
    g.send_frame(1, &[0u8; 60]);
    settle(&mut sw);
    assert_eq!(vport(&mut sw, pa).all_queue_stats()[3].chains, 1);
    assert_eq!(vport(&mut sw, pa).conn_stats().closed, 0);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn rings_of_different_sizes_each_run_at_their_own() {
    let d = dir("hmq-sizes");
    let mut sw = common::switch();
    let pa = add_mq_port(&mut sw, &d, "a", 2);
    let pb = add_mq_port(&mut sw, &d, "b", 2);
    let mut a = MqGuest::attach_pumped(
        &d.join("a.sock"),
        &[32, 256, 128, 16],
        2,
        REPLY_TIMEOUT,
        &mut || sw.poll_events(),
    )
    .expect("attach a");
    let mut b = MqGuest::attach_pumped(
        &d.join("b.sock"),
        &[256, 16, 32, 64],
        2,
        REPLY_TIMEOUT,
        &mut || sw.poll_events(),
    )
    .expect("attach b");
    b.post_rx(0, 256);
    b.post_rx(1, 32);
    settle(&mut sw);
    // More frames on a's 16-entry transmit queue than it holds, over
    // several rounds, and on its 256-entry one.
    let mut got = 0;
    for round in 0..8u8 {
        for k in 0..16u8 {
            let mut f = vec![0u8; 60];
            f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, round, k]);
            a.send_frame(1, &f);
            a.send_frame(0, &f);
        }
        settle(&mut sw);
        for q in 0..4 {
            a.take_used(q);
        }
        got += b.received(0).len() + b.received(1).len();
    }
    let st = vport(&mut sw, pa).all_queue_stats();
    assert_eq!((st[1].chains, st[3].chains), (128, 128));
    assert_eq!(got, 256, "every frame reached b");
    let sizes: Vec<_> = {
        let st = sw.status();
        match &st.ports[usize::from(pb)].detail {
            vswitch::status::PortDetail::Vhost(d) => d
                .pairs
                .iter()
                .flat_map(|p| [p.queues.rx.size, p.queues.tx.size])
                .collect(),
            _ => panic!("not a VM port"),
        }
    };
    assert_eq!(sizes, vec![Some(256), Some(16), Some(32), Some(64)]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_in_flight_region_covers_every_queue_offered_and_no_more() {
    let d = dir("hmq-inflight");
    let mut sw = common::switch();
    let pa = add_mq_port(&mut sw, &d, "a", 2);
    let path = d.join("a.sock");
    // All four queues of the two pairs: a region comes back.
    let (mut w, _, _) = handshake(&mut sw, &path, PROTOCOL_F_INFLIGHT_SHMFD, false);
    w.send(req::GET_INFLIGHT_FD, VERSION, &inflight(0, 0, 4, 256), &[])
        .unwrap();
    let (reply, fd) = w
        .await_reply_fd(REPLY_TIMEOUT, Some(&mut || sw.poll_events()))
        .expect("GET_INFLIGHT_FD answered");
    assert!(fd.is_some());
    let size = u64::from_le_bytes(reply[..8].try_into().unwrap());
    assert!(size >= 4 * vswitch::ports::vhost::inflight::queue_bytes(256));
    drop(w);
    settle(&mut sw);
    // Five: refused, the connection closed.
    let closed = vport(&mut sw, pa).conn_stats().closed;
    let (w, _, _) = handshake(&mut sw, &path, PROTOCOL_F_INFLIGHT_SHMFD, false);
    w.send(req::GET_INFLIGHT_FD, VERSION, &inflight(0, 0, 5, 256), &[])
        .unwrap();
    settle(&mut sw);
    let cs = vport(&mut sw, pa).conn_stats().clone();
    assert_eq!(cs.closed, closed + 1);
    assert!(
        cs.last_close
            .unwrap_or_default()
            .contains("5 queues of 256"),
        "refused for its shape"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Put a transmit chain of `n` descriptors (the header, then `n - 1`
/// one-byte pieces) at descriptors `first..first + n` of queue `q` and
/// make it available.
fn long_chain(g: &mut MqGuest, q: usize, first: u16, n: u16) {
    let l = g.q[q];
    let base = g.buf(q, 0);
    g.mem.write(base, &[0u8; 12 + 255]);
    for k in 0..n {
        let i = first + k;
        let last = k + 1 == n;
        let (addr, len) = if k == 0 {
            (base, 12)
        } else {
            (base + 12 + u64::from(k), 1)
        };
        g.mem.write(
            l.desc_at(i),
            &RawDesc {
                addr: g.mem.gpa + addr,
                len,
                flags: if last { 0 } else { F_NEXT },
                next: if last { 0 } else { i + 1 },
            }
            .bytes(),
        );
    }
    let slot = g.avail_idx[q] % l.num;
    g.mem.w16(l.avail + 4 + 2 * u64::from(slot), first);
    g.publish(q, g.avail_idx[q].wrapping_add(1));
}

#[test]
fn two_queues_of_long_chains_share_the_port_s_descriptor_budget() {
    let d = dir("hmq-budget");
    let mut sw = common::switch();
    let pa = add_mq_port(&mut sw, &d, "a", 2);
    let mut g = MqGuest::attach_pumped(&d.join("a.sock"), &[256; 4], 2, REPLY_TIMEOUT, &mut || {
        sw.poll_events()
    })
    .expect("attach");
    settle(&mut sw);
    // Three chains of 84 descriptors on each transmit queue. Each costs
    // 84 + 2 reads, FREE_READS of them free: 65 from the budget. With the
    // budget shared (DESC_BUDGET / 2 per queue) a queue takes two chains
    // in its first pass, the second running it into debt; a queue with
    // the whole budget would take all three.
    let n = 84u16;
    let cost = chain_reads(n) - FREE_READS;
    let share = DESC_BUDGET / 2;
    assert!(share.div_ceil(cost) == 2 && DESC_BUDGET.div_ceil(cost) >= 3);
    for q in [1, 3] {
        for c in 0..3 {
            long_chain(&mut g, q, c * n, n);
        }
    }
    sw.poll_events();
    sw.pass();
    let st = vport(&mut sw, pa).all_queue_stats();
    assert_eq!(
        (st[1].chains, st[3].chains),
        (2, 2),
        "each queue's share of the budget"
    );
    let reads = st[1].desc_reads + st[3].desc_reads;
    assert!(
        reads <= DESC_BUDGET + 2 * (chain_reads(n) + FREE_READS) * 2,
        "{reads} reads in one pass"
    );
    assert!(st[1].over_budget > 0 && st[3].over_budget > 0);
    let _ = std::fs::remove_dir_all(&d);
}
