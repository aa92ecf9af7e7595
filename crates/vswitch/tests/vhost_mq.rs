//! VM ports with several queue pairs (`VIRTIO_NET_F_MQ`), driven by the
//! project's own frontend with its pairs set up as QEMU sets them up
//! (`vhost_peer::MqGuest`): traffic on every pair both ways, each flow in
//! order on one receive queue, a pair the guest turns off mid-traffic
//! receives nothing more, and a transmit queue flooded by the guest does
//! not hold back another.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{add_mq_port, dir, settle, vport};
use vhost_peer::{MqGuest, REPLY_TIMEOUT};
use vswitch::status::PortDetail;
use vswitch::EventLoop;

fn attach(sw: &mut EventLoop, d: &Path, name: &str, nums: &[u16], enabled: usize) -> MqGuest {
    let g = MqGuest::attach_pumped(
        &d.join(format!("{name}.sock")),
        nums,
        enabled,
        REPLY_TIMEOUT,
        &mut || sw.poll_events(),
    )
    .expect("attach");
    sw.poll_events();
    g
}

/// A UDP frame of flow `flow` carrying `seq`, from host `src` to `dst`.
fn frame(src: u8, dst: u8, flow: u16, seq: u32) -> Vec<u8> {
    let mut f = vec![0u8; 64];
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, dst]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, src]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&50u16.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&[198, 18, 0, src]);
    f[30..34].copy_from_slice(&[198, 18, 0, dst]);
    f[34..36].copy_from_slice(&(10_000 + flow).to_be_bytes());
    f[36..38].copy_from_slice(&5201u16.to_be_bytes());
    f[42..46].copy_from_slice(&seq.to_le_bytes());
    f
}

fn flow_seq(f: &[u8]) -> (u16, u32) {
    (
        u16::from_be_bytes([f[34], f[35]]) - 10_000,
        u32::from_le_bytes([f[42], f[43], f[44], f[45]]),
    )
}

/// What a receiver saw: per flow, the receive queues it came on and its
/// sequence numbers in arrival order.
#[derive(Default)]
struct Seen {
    queues: BTreeMap<u16, Vec<usize>>,
    seqs: BTreeMap<u16, Vec<u32>>,
    per_pair: BTreeMap<usize, u32>,
}

impl Seen {
    fn take(&mut self, g: &mut MqGuest) {
        for p in 0..g.pairs() {
            for f in g.received(p) {
                let (flow, seq) = flow_seq(&f);
                let q = self.queues.entry(flow).or_default();
                if !q.contains(&p) {
                    q.push(p);
                }
                self.seqs.entry(flow).or_default().push(seq);
                *self.per_pair.entry(p).or_default() += 1;
            }
        }
    }

    /// Every flow on one queue, in order, all `per_flow` frames there.
    fn check(&self, flows: u16, per_flow: u32) {
        for flow in 0..flows {
            let q = &self.queues[&flow];
            assert_eq!(q.len(), 1, "flow {flow} came on queues {q:?}");
            let s = &self.seqs[&flow];
            assert_eq!(
                *s,
                (0..per_flow).collect::<Vec<_>>(),
                "flow {flow}: in order, none lost"
            );
        }
    }
}

/// `flows` flows of `per_flow` frames from `a` (flow `f` on pair
/// `f % pairs`) to `b`, in rounds that fit the rings.
fn run(
    sw: &mut EventLoop,
    a: &mut MqGuest,
    b: &mut MqGuest,
    src: u8,
    dst: u8,
    flows: u16,
    per_flow: u32,
) -> Seen {
    let mut seen = Seen::default();
    let pairs = a.pairs();
    for seq in 0..per_flow {
        for flow in 0..flows {
            a.send_frame(usize::from(flow) % pairs, &frame(src, dst, flow, seq));
        }
        settle(sw);
        seen.take(b);
        for q in 0..a.q.len() {
            a.take_used(q);
        }
    }
    settle(sw);
    seen.take(b);
    seen
}

fn detail(sw: &mut EventLoop, port: u16) -> Box<vswitch::status::VhostDetail> {
    let st = sw.status();
    match &st.ports[usize::from(port)].detail {
        PortDetail::Vhost(d) => d.clone(),
        other => panic!("not a vhost-user port: {other:?}"),
    }
}

#[test]
fn two_pairs_carry_traffic_both_ways_and_keep_each_flow_in_order() {
    let d = dir("mq-both");
    let mut sw = common::switch();
    let pa = add_mq_port(&mut sw, &d, "a", 2);
    let pb = add_mq_port(&mut sw, &d, "b", 2);
    let mut a = attach(&mut sw, &d, "a", &[64; 4], 2);
    let mut b = attach(&mut sw, &d, "b", &[64; 4], 2);
    assert_eq!((a.queue_num, b.queue_num), (2, 2), "GET_QUEUE_NUM");
    for g in [&mut a, &mut b] {
        g.post_rx(0, 64);
        g.post_rx(1, 64);
    }
    settle(&mut sw);
    let da = detail(&mut sw, pa);
    assert_eq!(da.queue_pairs, 2);
    assert!(
        da.pairs.iter().all(|p| p.running),
        "both pairs run: {:?}",
        da.pairs.iter().map(|p| p.running).collect::<Vec<_>>()
    );

    // 16 flows of 20 frames each way.
    let ab = run(&mut sw, &mut a, &mut b, 1, 2, 16, 20);
    ab.check(16, 20);
    assert!(
        ab.per_pair.len() == 2 && ab.per_pair.values().all(|&n| n >= 40),
        "both of b's receive queues used: {:?}",
        ab.per_pair
    );
    let ba = run(&mut sw, &mut b, &mut a, 2, 1, 16, 20);
    ba.check(16, 20);
    assert!(
        ba.per_pair.len() == 2 && ba.per_pair.values().all(|&n| n >= 40),
        "both of a's receive queues used: {:?}",
        ba.per_pair
    );
    // Both transmit queues of each guest were served, half the frames
    // each (flow f went out on pair f % 2).
    for port in [pa, pb] {
        let st = vport(&mut sw, port).all_queue_stats();
        assert_eq!((st[1].chains, st[3].chains), (160, 160), "port {port}");
    }
    let db = detail(&mut sw, pb);
    assert_eq!(db.pairs[1].queues.tx.chains, 160);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_pair_turned_off_mid_traffic_receives_nothing_more() {
    let d = dir("mq-off");
    let mut sw = common::switch();
    add_mq_port(&mut sw, &d, "a", 2);
    let pb = add_mq_port(&mut sw, &d, "b", 2);
    let mut a = attach(&mut sw, &d, "a", &[64; 4], 2);
    let mut b = attach(&mut sw, &d, "b", &[64; 4], 2);
    b.post_rx(0, 64);
    b.post_rx(1, 64);
    settle(&mut sw);
    let on = run(&mut sw, &mut a, &mut b, 1, 2, 16, 4);
    on.check(16, 4);
    assert_eq!(
        on.per_pair.len(),
        2,
        "both pairs received: {:?}",
        on.per_pair
    );

    // The guest turns pair 1 off (ethtool -L eth0 combined 1): QEMU
    // disables both its queues.
    b.enable_pair(1, false).expect("disable");
    settle(&mut sw);
    let used_before = b.mem.r16(b.q[2].used + 2);
    let off = run(&mut sw, &mut a, &mut b, 1, 2, 16, 4);
    assert_eq!(
        off.per_pair.keys().copied().collect::<Vec<_>>(),
        vec![0],
        "only pair 0 receives: {:?}",
        off.per_pair
    );
    off.check(16, 4);
    assert_eq!(b.mem.r16(b.q[2].used + 2), used_before, "queue 2 untouched");
    let db = detail(&mut sw, pb);
    assert!(db.pairs[0].running && !db.pairs[1].running);
    assert!(db.running, "the port runs on its first pair");

    // And on again: both pairs receive.
    b.enable_pair(1, true).expect("enable");
    settle(&mut sw);
    let again = run(&mut sw, &mut a, &mut b, 1, 2, 16, 4);
    again.check(16, 4);
    assert_eq!(again.per_pair.len(), 2, "{:?}", again.per_pair);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_flooded_transmit_queue_does_not_hold_back_another() {
    let d = dir("mq-fair");
    let mut sw = common::switch();
    let pa = add_mq_port(&mut sw, &d, "a", 2);
    let mut a = attach(&mut sw, &d, "a", &[256; 4], 2);
    settle(&mut sw);
    // Pair 0 fills its whole ring; pair 1 has a few frames. One pass
    // (a batch of 256 from the port) must take pair 1's frames too.
    for seq in 0..256 {
        a.send_frame(0, &frame(1, 2, 0, seq));
    }
    for seq in 0..8 {
        a.send_frame(1, &frame(1, 2, 1, seq));
    }
    sw.poll_events();
    sw.pass();
    let st = vport(&mut sw, pa).all_queue_stats();
    assert_eq!(st[3].chains, 8, "pair 1's frames taken in the first pass");
    assert!(
        st[1].chains > 0 && st[1].chains <= 128,
        "pair 0 got its share of the batch, no more: {}",
        st[1].chains
    );
    // The rest of pair 0's frames follow in the next passes.
    settle(&mut sw);
    settle(&mut sw);
    let st = vport(&mut sw, pa).all_queue_stats();
    assert_eq!(st[1].chains, 256);
    let _ = std::fs::remove_dir_all(&d);
}
