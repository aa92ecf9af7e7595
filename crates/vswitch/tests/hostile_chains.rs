//! Guests that attack the switch's time and its port security through
//! their virtio rings, written from the virtio 1.x split-ring layout
//! (descriptor table, available ring, used ring; `VIRTQ_DESC_F_NEXT`,
//! `VIRTQ_DESC_F_WRITE`, `VIRTQ_DESC_F_INDIRECT`) with the test frontend
//! of `common` (a memfd as guest memory, no QEMU, no root):
//!
//! - hostile transmit and receive rings (random `next` pointers, loops,
//!   chains as long as the ring, odd lengths and flags, indirect
//!   descriptors) cost the switch a bounded number of descriptor reads per
//!   pass, linear in the ring size, never quadratic;
//! - a guest whose receive chains loop cannot starve another port;
//! - a guest locked to its address cannot get a frame with another source
//!   delivered by rewriting it while the switch forwards it.
//!
//! The property test runs `HOSTILE_CHAINS_CASES` cases (default 10,000).

mod common;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::frontend::{Layout, RawDesc, TestGuest, BUF, MEM, TX_BUFS};
use common::{add_vport, capture, settle, vport, CapturePort, SinkPort};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, TestCaseError, TestRunner};
use ring::Mode;
use vswitch::ports::vhost::datapath::{
    chain_reads, QueueStats, DESC_BUDGET, DESC_RATE, FREE_READS, RXQ, TXQ,
};
use vswitch::{EventLoop, Port};

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;

/// A broadcast frame from `src`, tagged.
fn frame(src: [u8; 6], tag: u64) -> Vec<u8> {
    let mut f = vec![0xffu8; 6];
    f.extend_from_slice(&src);
    f.extend_from_slice(&0x88b5u16.to_be_bytes());
    f.extend_from_slice(&tag.to_le_bytes());
    f.resize(60, 0);
    f
}

const VICTIM_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x1c];

fn sink_frames(sw: &mut EventLoop, i: u16) -> u64 {
    sw.port_mut(i).expect("sink").counters().to_port
}

// ---------------------------------------------------------------------
// Hostile ring layouts.

/// xorshift64: the per-descriptor values of a case, from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// How a ring's descriptors are shaped.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Every field random (mostly plausible).
    Random,
    /// One cycle through the whole table (`i` → `i + 1`, the last back to 0).
    Cycle,
    /// Every descriptor chained to itself.
    SelfLoop,
    /// One legal chain through the whole table, buffers of 0 or 1 bytes.
    Long,
    /// A random prefix, then a jump back into it.
    Lasso,
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        4 => Just(Shape::Random),
        1 => Just(Shape::Cycle),
        1 => Just(Shape::SelfLoop),
        1 => Just(Shape::Long),
        1 => Just(Shape::Lasso),
    ]
}

/// A plausible buffer address inside guest memory (past the rings).
fn buf_addr(r: &mut Rng) -> u64 {
    TX_BUFS + r.below(256) * BUF + r.below(16) * 64
}

/// The descriptor table of one queue (`write`: a receive queue's
/// direction), shaped as `s`.
fn descs(s: Shape, num: u16, write: bool, r: &mut Rng) -> Vec<RawDesc> {
    let dir = if write { F_WRITE } else { 0 };
    let n = u64::from(num);
    let lasso_at = r.below(n) as u16;
    (0..num)
        .map(|i| {
            let mut d = RawDesc {
                addr: buf_addr(r),
                len: [0, 1, 12, 40, 74, 200, 1500][r.below(7) as usize],
                flags: dir | F_NEXT,
                next: (i + 1) % num,
            };
            match s {
                Shape::Random => {
                    d.addr = match r.below(20) {
                        0 => MEM - r.below(64),
                        1 => r.next(),
                        _ => d.addr,
                    };
                    d.len = match r.below(10) {
                        0 => r.next() as u32,
                        1 => 2000 + r.below(200) as u32,
                        _ => d.len,
                    };
                    d.flags = match r.below(12) {
                        0 => dir ^ F_WRITE,
                        1 => dir | F_INDIRECT,
                        2 => r.next() as u16,
                        3..=5 => dir,
                        _ => dir | F_NEXT,
                    };
                    d.next = match r.below(12) {
                        0 => num + r.below(8) as u16,
                        1 => r.next() as u16,
                        _ => r.below(n) as u16,
                    };
                }
                Shape::Cycle => {}
                Shape::SelfLoop => d.next = i,
                Shape::Long => {
                    d.len = r.below(2) as u32;
                    if i == num - 1 {
                        d.flags = dir;
                        d.len = 100;
                    }
                }
                Shape::Lasso => {
                    if i == lasso_at {
                        d.next = r.below(u64::from(i) + 1) as u16;
                    }
                }
            }
            d
        })
        .collect()
}

/// Write a queue's table and `published` available entries, and publish.
fn lay_ring(g: &mut TestGuest, q: usize, s: Shape, published: u16, r: &mut Rng) {
    let num = g.q[q].num;
    for (i, d) in descs(s, num, q == RXQ, r).into_iter().enumerate() {
        g.put_desc(q, i as u16, d);
    }
    for k in 0..num {
        // Heads: random (repeats included: one long chain offered many
        // times), or the chain's start.
        let head = match s {
            Shape::Random | Shape::SelfLoop => r.below(u64::from(num)) as u16,
            _ if r.below(2) == 0 => 0,
            _ => r.below(u64::from(num)) as u16,
        };
        g.push_avail(q, k, head);
    }
    let idx = g.avail_idx[q].wrapping_add(published);
    g.publish(q, idx);
}

fn cases() -> u32 {
    std::env::var("HOSTILE_CHAINS_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(10_000)
}

/// Hostile transmit and receive rings of 8 to 256 entries; the switch runs
/// a few passes, a victim's frame delivered (also to the hostile guest's
/// receive ring) in each. Per pass, each hostile queue reads at most
/// `DESC_BUDGET + FREE_READS x num + chain_reads(num)` descriptors (the
/// budget; the free first reads of each chain, at most one chain per ring
/// entry; and the one chain under way when the budget runs out: at most the
/// ring); over a case, at most the passes times
/// `DESC_BUDGET + FREE_READS x num`, plus `chain_reads(num)` (the overrun
/// is paid for in later passes): linear in the ring size. The victim's frames all reach the sink.
/// (`FREE_READS` went from 2 to 21 when the device began to offer TCP
/// segmentation: an honest 64 KB segment is up to 19 descriptors, 21
/// reads with the fast paths' looks, and must not meet the budget; the
/// bound's form is unchanged.)
#[test]
fn descriptor_reads_per_pass_are_linear_in_the_ring_size() {
    let d = common::dir("chains-prop");
    let mut sw = common::switch();
    let hostile = add_vport(&mut sw, &d, "hostile", Mode::Csb, 0);
    add_vport(&mut sw, &d, "victim", Mode::Csb, 0);
    let sink = sw.add_port(Box::new(SinkPort::new("sink"))).expect("sink");
    let victim = TestGuest::attach(&mut sw, &d.join("victim.sock"), 256).expect("victim");
    settle(&mut sw);
    let sw = RefCell::new(sw);
    let victim = RefCell::new(victim);
    let cases = cases();
    let mut runner = TestRunner::new(PtConfig {
        cases,
        failure_persistence: None,
        max_shrink_iters: 64,
        ..PtConfig::default()
    });
    const PASSES: u64 = 6;
    let most = RefCell::new([0u64; 2]);
    let total_reads = Cell::new(0u64);
    let tag = Cell::new(0u64);
    let t0 = Instant::now();
    let res = runner.run(
        &(
            prop_oneof![Just(8u16), Just(64u16), Just(256u16)],
            shape(),
            shape(),
            any::<u64>(),
            0u16..=256,
            0u16..=256,
        ),
        |(num, tx_shape, rx_shape, seed, tx_pub, rx_pub)| {
            let mut sw = sw.borrow_mut();
            let mut victim = victim.borrow_mut();
            let mut most = most.borrow_mut();
            let mut r = Rng(seed | 1);
            let mut g = TestGuest::attach(&mut sw, &d.join("hostile.sock"), num)
                .map_err(|e| TestCaseError::fail(format!("attach: {e}")))?;
            settle(&mut sw);
            prop_assert!(vport(&mut sw, hostile).running(), "hostile attached");
            lay_ring(&mut g, RXQ, rx_shape, rx_pub.min(num), &mut r);
            lay_ring(&mut g, TXQ, tx_shape, tx_pub.min(num), &mut r);
            let per_pass = DESC_BUDGET + FREE_READS * u64::from(num);
            let bound = per_pass + chain_reads(num);
            let start: [QueueStats; 2] = vport(&mut sw, hostile).queue_stats();
            let sunk = sink_frames(&mut sw, sink);
            for _ in 0..PASSES {
                victim.send_frame(&frame(VICTIM_MAC, tag.get()));
                tag.set(tag.get() + 1);
                let before = vport(&mut sw, hostile).queue_stats();
                sw.poll_events();
                sw.pass();
                let after = vport(&mut sw, hostile).queue_stats();
                for q in [RXQ, TXQ] {
                    let reads = after[q].desc_reads - before[q].desc_reads;
                    most[q] = most[q].max(reads);
                    prop_assert!(
                        reads <= bound,
                        "queue {q}: {reads} descriptor reads in one pass (ring of {num}, bound {bound})"
                    );
                }
            }
            let end = vport(&mut sw, hostile).queue_stats();
            for q in [RXQ, TXQ] {
                let reads = end[q].desc_reads - start[q].desc_reads;
                total_reads.set(total_reads.get() + reads);
                prop_assert!(
                    reads <= PASSES * per_pass + chain_reads(num),
                    "queue {q}: {reads} descriptor reads in {PASSES} passes (ring of {num})"
                );
            }
            // The sink takes the hostile guest's flooded frames as well.
            prop_assert!(
                sink_frames(&mut sw, sink) - sunk >= PASSES,
                "the victim's frames reach the sink"
            );
            victim.take_used(1);
            g.wire.shutdown();
            drop(g);
            settle(&mut sw);
            Ok(())
        },
    );
    if let Err(e) = res {
        panic!("{e}");
    }
    println!(
        "{cases} cases in {:.1}s: most descriptor reads in one pass: rx {}, tx {} (budget {DESC_BUDGET}); {} in all",
        t0.elapsed().as_secs_f64(),
        most.borrow()[RXQ],
        most.borrow()[TXQ],
        total_reads.get(),
    );
    let _ = std::fs::remove_dir_all(&d);
}

// ---------------------------------------------------------------------
// A receive ring of looping chains.

/// Rings of 32,768 entries (the largest a split queue may have), queue `q`
/// from `q` MiB: table 512 KiB, available ring 64 KiB, used ring 256 KiB.
fn big(q: u64, num: u16) -> Layout {
    let base = q << 20;
    Layout {
        num,
        desc: base,
        avail: base + 0x8_0000,
        used: base + 0x9_1000,
    }
}
const BIG_MEM: u64 = 4 << 20;
const BIG_BUFS: u64 = 2 << 20;

/// Frames per second the sink receives from the sender over `dur`, the
/// sender sending bursts of 32; `between` runs after every burst.
fn sink_rate(
    sw: &mut EventLoop,
    sender: &mut TestGuest,
    sink: u16,
    dur: Duration,
    mut between: impl FnMut(&mut EventLoop),
) -> f64 {
    let t = Instant::now();
    let before = sink_frames(sw, sink);
    let mut tag = 0;
    while t.elapsed() < dur {
        for _ in 0..32 {
            sender.send_frame(&frame(VICTIM_MAC, tag));
            tag += 1;
        }
        settle(sw);
        sender.take_used(1);
        between(sw);
    }
    (sink_frames(sw, sink) - before) as f64 / t.elapsed().as_secs_f64()
}

/// A guest posts receive chains that loop (every descriptor chained to
/// itself, all 32,768 of them available, offered again whenever the switch
/// returns them): the switch stops that queue at the first loop, instead of
/// walking 32,768 chains of 32,768 descriptors for every frame, and the
/// sink keeps receiving the sender's frames at the rate it had without the
/// attack (at least half of it here, for a loaded machine). The queue is
/// counted as stopped, and a new frontend on the port gets frames again.
#[test]
fn looping_receive_chains_stop_that_queue_not_the_switch() {
    const NUM: u16 = 32768;
    let d = common::dir("chains-rxloop");
    let mut sw = common::switch();
    let hostile = add_vport(&mut sw, &d, "hostile", Mode::Csb, 0);
    add_vport(&mut sw, &d, "sender", Mode::Csb, 0);
    let sink = sw.add_port(Box::new(SinkPort::new("sink"))).expect("sink");
    let mut h = TestGuest::attach_with(
        &mut sw,
        &d.join("hostile.sock"),
        BIG_MEM,
        [big(0, NUM), big(1, NUM)],
    )
    .expect("hostile");
    let mut sender = TestGuest::attach(&mut sw, &d.join("sender.sock"), 256).expect("sender");
    settle(&mut sw);
    assert!(vport(&mut sw, hostile).running());
    let dur = Duration::from_millis(1500);
    let calm = sink_rate(&mut sw, &mut sender, sink, dur, |_| {});
    for i in 0..NUM {
        h.put_desc(
            RXQ,
            i,
            RawDesc {
                addr: BIG_BUFS + u64::from(i % 64) * BUF,
                len: 64,
                flags: F_WRITE | F_NEXT,
                next: i,
            },
        );
        h.push_avail(RXQ, i, i);
    }
    h.publish(RXQ, NUM);
    let attacked = sink_rate(&mut sw, &mut sender, sink, dur, |_| {
        // Offer every chain again once the switch has returned them.
        if h.take_used(RXQ).len() as u16 == NUM {
            let idx = h.avail_idx[RXQ].wrapping_add(NUM);
            h.publish(RXQ, idx);
        }
    });
    let st = vport(&mut sw, hostile).queue_stats();
    println!(
        "sink: {calm:.0} frames/s without the attack, {attacked:.0} with it; hostile rx queue: {} descriptor reads, broke {}",
        st[RXQ].desc_reads, st[RXQ].broke
    );
    assert!(
        attacked >= calm / 2.0,
        "the sink got {attacked:.0} frames/s under attack, {calm:.0} without"
    );
    assert_eq!(st[RXQ].broke, 1, "the looping queue stopped, counted");
    let status = vport(&mut sw, hostile).status();
    let text = serde_json::to_string(&status).expect("json");
    assert!(text.contains("a loop"), "{text}");
    // The frontend's reset (a new connection) recovers the port.
    h.wire.shutdown();
    drop(h);
    settle(&mut sw);
    let mut h = TestGuest::attach(&mut sw, &d.join("hostile.sock"), 64).expect("reattach");
    settle(&mut sw);
    h.post_rx(8);
    settle(&mut sw);
    sender.send_frame(&frame(VICTIM_MAC, u64::MAX));
    settle(&mut sw);
    assert_eq!(h.received().len(), 1, "the port receives again");
    let _ = std::fs::remove_dir_all(&d);
}

/// A guest transmits chains of 32,768 descriptors (one legal chain through
/// the whole table, offered again and again): the switch reads from that
/// queue at most its budget per second beyond the free reads of each chain
/// (`DESC_RATE`, plus the one budget it starts with and the one chain under
/// way when the window ends), however short its passes are, so the other
/// port's frames are still taken at, here, at least 70% of the rate they
/// had without it (the issue measured a quarter before any budget, and a
/// budget per pass alone let the attacker have about 143 million reads a
/// second); the long chains, legal, are still taken. The rate without the
/// attack is measured before and after it, and the lower taken. The bound
/// on reads holds in every try; the timed ratio, measured in the thread
/// that also generates, is given up to three tries on fresh switches (a
/// loaded machine's one slow window is not the attacker's doing; an
/// attacker that really slowed the switch fails all three).
#[test]
fn long_transmit_chains_do_not_slow_the_other_ports() {
    let mut tries = Vec::new();
    for attempt in 1..=3 {
        let (calm, attacked) = long_chains_try(attempt);
        tries.push((calm, attacked));
        if attacked >= calm * 0.7 {
            return;
        }
        println!("try {attempt}: {attacked:.0} frames/s under attack, {calm:.0} without");
    }
    panic!("the sender's frames were taken at under 70% of the rate without the attack in three tries (with, without): {tries:?}");
}

/// Lays one legal chain through the whole descriptor table of `h`'s
/// transmit queue (`num` descriptors, the last holding a frame) and offers
/// it in every entry of the available ring (head 0, over and over).
fn offer_whole_table_chain(h: &mut TestGuest, num: u16) {
    let src = VICTIM_MAC.map(|b| b ^ 0x40);
    h.mem.write(BIG_BUFS, &[0u8; 12]);
    h.mem.write(BIG_BUFS + 12, &frame(src, 0));
    for i in 0..num {
        let last = i == num - 1;
        h.put_desc(
            TXQ,
            i,
            RawDesc {
                addr: if last { BIG_BUFS } else { BIG_BUFS + BUF },
                len: if last { 72 } else { 0 },
                flags: if last { 0 } else { F_NEXT },
                next: i.wrapping_add(1) % num,
            },
        );
    }
    for k in 0..num {
        h.push_avail(TXQ, k, 0);
    }
    h.publish(TXQ, num);
}

/// One try of the test above: (frames/s taken without the attack, with it).
fn long_chains_try(attempt: u32) -> (f64, f64) {
    const NUM: u16 = 32768;
    let d = common::dir(&format!("chains-txlong-{attempt}"));
    let mut sw = common::switch();
    let hostile = add_vport(&mut sw, &d, "hostile", Mode::Csb, 0);
    add_vport(&mut sw, &d, "sender", Mode::Csb, 0);
    sw.add_port(Box::new(SinkPort::new("sink"))).expect("sink");
    let mut h = TestGuest::attach_with(
        &mut sw,
        &d.join("hostile.sock"),
        BIG_MEM,
        [big(0, NUM), big(1, NUM)],
    )
    .expect("hostile");
    let mut sender = TestGuest::attach(&mut sw, &d.join("sender.sock"), 256).expect("sender");
    settle(&mut sw);
    // Frames per second the switch takes from the sender.
    let taken = |sw: &mut EventLoop,
                 sender: &mut TestGuest,
                 mut between: Box<dyn FnMut(&mut EventLoop) + '_>| {
        let t = Instant::now();
        let (mut n, mut tag) = (0u64, 0u64);
        while t.elapsed() < Duration::from_millis(1500) {
            for _ in 0..32 {
                sender.send_frame(&frame(VICTIM_MAC, tag));
                tag += 1;
            }
            settle(sw);
            n += sender.take_used(1).len() as u64;
            between(sw);
            // Passes as short as a busy switch's (a few microseconds):
            // a budget per pass alone would pay the attacker per pass.
            for _ in 0..16 {
                sw.pass();
            }
        }
        n as f64 / t.elapsed().as_secs_f64()
    };
    let calm = taken(&mut sw, &mut sender, Box::new(|_| {}));
    offer_whole_table_chain(&mut h, NUM);
    let before = vport(&mut sw, hostile).queue_stats()[TXQ];
    let t = Instant::now();
    let attacked = taken(
        &mut sw,
        &mut sender,
        Box::new(|_| {
            let back = h.take_used(TXQ).len() as u16;
            if back > 0 {
                let idx = h.avail_idx[TXQ].wrapping_add(back);
                h.publish(TXQ, idx);
            }
        }),
    );
    let st = vport(&mut sw, hostile).queue_stats()[TXQ];
    let secs = t.elapsed().as_secs_f64();
    let (chains, reads) = (st.chains - before.chains, st.desc_reads - before.desc_reads);
    // The rate without the attack again, once the attacker has gone: the
    // lower of the two calm windows is the reference (the load of a shared
    // machine drifts).
    h.wire.shutdown();
    drop(h);
    settle(&mut sw);
    let calm_after = taken(&mut sw, &mut sender, Box::new(|_| {}));
    let calm = calm.min(calm_after);
    println!(
        "sender: {calm:.0} frames/s taken without the attack (the lower of before and after), {attacked:.0} with it; hostile tx queue: {chains} chains, {reads} descriptor reads in {secs:.2}s ({:.0}/s, bound {DESC_RATE}/s beyond {FREE_READS} a chain), {} passes over budget, held back {:.0} ms",
        reads as f64 / secs,
        st.over_budget - before.over_budget,
        (st.held_ns - before.held_ns) as f64 / 1e6,
    );
    assert_reads_within_rate(reads, chains, secs, NUM, "");
    let _ = std::fs::remove_dir_all(&d);
    (calm, attacked)
}

/// Asserts that the attacker's transmit queue, offered chains through its
/// whole table of `num` descriptors, took `chains` of them (the chains are
/// legal) and was read `reads` times in `secs` at most: the one budget it
/// starts with, `DESC_RATE` a second, the free reads of each chain taken
/// and the one chain under way when the window ends. `what` goes after
/// the window in the failure message.
fn assert_reads_within_rate(reads: u64, chains: u64, secs: f64, num: u16, what: &str) {
    assert!(chains > 0, "the long chains are legal and taken");
    let bound = DESC_BUDGET as f64
        + DESC_RATE as f64 * secs
        + (FREE_READS * chains + chain_reads(num)) as f64;
    assert!(
        reads as f64 <= bound,
        "{reads} descriptor reads of the attacker's queue in {secs:.2}s{what} (bound {bound:.0})"
    );
}

/// The same attacker sends the switch a message between passes, each of
/// which rebuilds its queues (`SET_VRING_ENABLE` on its enabled transmit
/// queue, as the vhost-user protocol lets a frontend send at any time):
/// the rebuilt queue goes on with what the old one had left of its budget,
/// so the reads stay within `DESC_RATE` a second. A rebuilt queue that
/// started with a full budget let the guest buy one more chain of 32,768
/// reads with every message.
#[test]
fn messages_that_rebuild_the_queues_do_not_refill_the_budget() {
    const NUM: u16 = 32768;
    let d = common::dir("chains-rebuild");
    let mut sw = common::switch();
    let hostile = add_vport(&mut sw, &d, "hostile", Mode::Csb, 0);
    sw.add_port(Box::new(SinkPort::new("sink"))).expect("sink");
    let mut h = TestGuest::attach_with(
        &mut sw,
        &d.join("hostile.sock"),
        BIG_MEM,
        [big(0, NUM), big(1, NUM)],
    )
    .expect("hostile");
    settle(&mut sw);
    offer_whole_table_chain(&mut h, NUM);
    let before = vport(&mut sw, hostile).queue_stats()[TXQ];
    let rebuilds_before = vport(&mut sw, hostile).conn_stats().rebuilds;
    let t = Instant::now();
    let mut sent = 0u64;
    while t.elapsed() < Duration::from_millis(1500) {
        let enable = vhost_peer::wire::state(TXQ as u32, 1);
        if h.wire
            .send(
                vhost_peer::wire::req::SET_VRING_ENABLE,
                vhost_peer::wire::VERSION,
                &enable,
                &[],
            )
            .is_ok()
        {
            sent += 1;
        }
        settle(&mut sw);
        let back = h.take_used(TXQ).len() as u16;
        if back > 0 {
            let idx = h.avail_idx[TXQ].wrapping_add(back);
            h.publish(TXQ, idx);
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let st = vport(&mut sw, hostile).queue_stats()[TXQ];
    let rebuilds = vport(&mut sw, hostile).conn_stats().rebuilds - rebuilds_before;
    let (chains, reads) = (st.chains - before.chains, st.desc_reads - before.desc_reads);
    println!(
        "{sent} messages, {rebuilds} rebuilds, {chains} chains, {reads} descriptor reads in {secs:.2}s ({:.0}/s, bound {DESC_RATE}/s beyond {FREE_READS} a chain)",
        reads as f64 / secs
    );
    // The attack took place: the messages were served and rebuilt the
    // queues many times, and the legal chains were taken.
    assert!(rebuilds > 100, "{rebuilds} rebuilds of {sent} messages");
    assert_reads_within_rate(
        reads,
        chains,
        secs,
        NUM,
        &format!(" over {rebuilds} rebuilds"),
    );
    let _ = std::fs::remove_dir_all(&d);
}

// ---------------------------------------------------------------------
// A frame rewritten between the check and the delivery.

/// A guest locked to its address sends frames from it while a second
/// thread rewrites their source address in guest memory (its own, and a
/// forged one, in turn, as fast as it can). Whatever the guest writes, no
/// frame with another source address than its own is delivered: the switch
/// checks and delivers one copy.
#[test]
fn a_frame_rewritten_after_its_check_is_not_delivered_forged() {
    const VM: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0x01];
    const FORGED: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0x66];
    const SLOTS: u16 = 8;
    let d = common::dir("chains-forge");
    let mut sw = common::switch();
    let mut c = vswitch::ports::vhost::Config::new("vm", &d.join("vm.sock"));
    c.mac = Some(VM);
    assert!(c.port_security, "on by default");
    sw.add_port(Box::new(vswitch::VhostPort::bind(c).expect("bind")))
        .expect("add");
    let cap = sw
        .add_port(Box::new(CapturePort::new("capture")))
        .expect("capture");
    let mut vm = TestGuest::attach(&mut sw, &d.join("vm.sock"), SLOTS).expect("vm");
    settle(&mut sw);
    // The rewriting thread maps the guest's memory itself, as a vCPU would.
    let file = vm.mem.file.try_clone().expect("memfd");
    let map = memmap2::MmapOptions::new()
        .len(MEM as usize)
        .map_raw(&file)
        .expect("map");
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let base = map.as_mut_ptr();
            while !stop.load(Ordering::Relaxed) {
                for mac in [FORGED, VM] {
                    for slot in 0..u64::from(SLOTS) {
                        // The source address of the frame in this slot
                        // (header of 12 bytes, then destination, source).
                        let at = (TX_BUFS + slot * BUF + 12 + 6) as usize;
                        // SAFETY: at + 6 lies inside the MEM-byte mapping
                        // this thread owns; the switch reads these bytes
                        // only by copying them.
                        unsafe { std::ptr::copy_nonoverlapping(mac.as_ptr(), base.add(at), 6) };
                    }
                }
            }
        })
    };
    let t = Instant::now();
    let (mut delivered, mut forged, mut sent) = (0u64, 0u64, 0u64);
    while t.elapsed() < Duration::from_secs(3) && forged < 100 {
        vm.send_frame(&frame(VM, sent));
        sent += 1;
        sw.poll_events();
        sw.pass();
        vm.take_used(1);
        let c = capture(&mut sw, cap);
        for f in c.frames.drain(..) {
            delivered += 1;
            if f[6..12] != VM {
                forged += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().expect("flipper");
    let spoofed = sw.port_mut(0).expect("vm").counters().spoofed;
    println!(
        "{sent} frames sent in {:.1}s: {delivered} delivered, {forged} with a forged source, {spoofed} refused as spoofed",
        t.elapsed().as_secs_f64()
    );
    assert!(delivered > 0, "frames from the guest's own address pass");
    assert_eq!(forged, 0, "frames delivered with a forged source");
    let _ = std::fs::remove_dir_all(&d);
}

// ---------------------------------------------------------------------
// A port that keeps sending from an address it may not use.

/// A port inside the switch that always has a full batch: frames from
/// `src` (its peer writing as fast as the switch takes, faster than any
/// real peer), and counts the frames the switch took. `locked`: the
/// address the port is locked to.
struct Flood {
    name: &'static str,
    locked: Option<[u8; 6]>,
    frames: Vec<Vec<u8>>,
    on: bool,
    taken: u64,
    c: vswitch::Counters,
}

impl Flood {
    fn new(name: &'static str, locked: Option<[u8; 6]>, src: [u8; 6], dst: [u8; 6]) -> Flood {
        let mut f = frame(src, 0);
        f[..6].copy_from_slice(&dst);
        Flood {
            name,
            locked,
            frames: vec![f; vswitch::BATCH as usize],
            on: true,
            taken: 0,
            c: vswitch::Counters::default(),
        }
    }
}

impl Port for Flood {
    fn name(&self) -> &str {
        self.name
    }
    fn kind(&self) -> &'static str {
        "flood"
    }
    fn pending(&mut self) -> bool {
        self.on
    }
    fn rx(&mut self, max: u32, out: &mut Vec<ring::device::FrameRef>) -> u32 {
        if !self.on {
            return 0;
        }
        for f in self.frames.iter().take(max as usize) {
            out.push(ring::device::FrameRef {
                ptr: f.as_ptr(),
                len: f.len() as u32,
            });
        }
        self.taken += u64::from(max).min(self.frames.len() as u64);
        0
    }
    fn rx_done(&mut self, _token: u32, frames: u64, _now: Instant) {
        self.c.from_port += frames;
    }
    unsafe fn tx(&mut self, _f: ring::device::FrameRef) -> bool {
        true
    }
    fn locked_mac(&self) -> Option<[u8; 6]> {
        self.locked
    }
    fn counters(&mut self) -> &mut vswitch::Counters {
        &mut self.c
    }
    fn as_any(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
}

/// A port locked to its own address sends every frame from the victim's,
/// as fast as the switch takes them, beside a victim port that sends to a
/// sink as fast. The thief's frames are refused, and the switch takes them
/// at a bounded rate (each refused frame holds the port back for
/// `SPOOF_HOLD_PER_FRAME`, so at most about one frame a microsecond, plus
/// a batch), so that the victim keeps forwarding, here at least half the
/// rate it has while the thief is quiet (windows alternated, for a loaded
/// machine; the 0.9 goal is the isolation benchmark's).
/// Before the hold, the switch took the thief's batch on every pass, each
/// frame copied and checked.
#[test]
fn a_spoofing_port_is_served_at_a_bounded_rate() {
    const THIEF: [u8; 6] = [2, 0, 0, 0, 0, 0x7f];
    const SINK: [u8; 6] = [2, 0, 0, 0, 0, 0x5c];
    let mut sw = common::switch();
    let victim = sw
        .add_port(Box::new(Flood::new(
            "victim",
            Some(VICTIM_MAC),
            VICTIM_MAC,
            SINK,
        )))
        .expect("victim");
    let thief = sw
        .add_port(Box::new(Flood::new("thief", Some(THIEF), VICTIM_MAC, SINK)))
        .expect("thief");
    let sink = sw.add_port(Box::new(SinkPort::new("sink"))).expect("sink");
    let window = Duration::from_millis(150);
    let (mut calm, mut attacked) = ((0u64, 0f64), (0u64, 0f64));
    let (mut stolen, mut thief_secs) = (0u64, 0f64);
    for round in 0..8 {
        let attack = round % 2 == 1;
        sw.port_as::<Flood>(thief).expect("thief").on = attack;
        let got = sink_frames(&mut sw, sink);
        let taken = sw.port_as::<Flood>(thief).expect("thief").taken;
        let t = Instant::now();
        while t.elapsed() < window {
            sw.pass();
        }
        let secs = t.elapsed().as_secs_f64();
        let n = sink_frames(&mut sw, sink) - got;
        if attack {
            attacked.0 += n;
            attacked.1 += secs;
            stolen += sw.port_as::<Flood>(thief).expect("thief").taken - taken;
            thief_secs += secs;
        } else {
            calm.0 += n;
            calm.1 += secs;
        }
    }
    let (calm, attacked) = (calm.0 as f64 / calm.1, attacked.0 as f64 / attacked.1);
    let status = sw.status();
    let thief_status = status
        .ports
        .iter()
        .find(|p| p.name == "thief")
        .expect("thief's status");
    println!(
        "victim: {calm:.0} frames/s with the thief quiet, {attacked:.0} with it sending; the switch took {:.0} of the thief's frames/s, {} refused, held back {} µs",
        stolen as f64 / thief_secs,
        thief_status.spoofed,
        thief_status.spoof_held_us
    );
    assert_eq!(
        sw.port_mut(victim).expect("victim").counters().spoofed,
        0,
        "the victim's own frames pass"
    );
    assert!(stolen > 0, "the thief is still served");
    assert_eq!(
        thief_status.spoofed, stolen,
        "every frame of the thief refused"
    );
    let per_us = vswitch::SPOOF_HOLD_PER_FRAME.as_secs_f64() * 1e6;
    let bound = thief_secs * 1e6 / per_us + 8.0 * f64::from(vswitch::BATCH);
    assert!(
        (stolen as f64) <= bound,
        "the switch took {stolen} of the thief's frames in {thief_secs:.2}s (bound {bound:.0})"
    );
    // The switch's share is the bound above; this one is timed, in the
    // same thread as the generators, and a loaded CI machine gave 0.71
    // once (0.94-0.99 quiet): it asks only that the victim keeps
    // forwarding, as `make test` must on a loaded machine. The 0.9 goal
    // is the isolation benchmark's.
    assert!(
        attacked >= calm * 0.5,
        "the victim sent {attacked:.0} frames/s beside the thief, {calm:.0} without"
    );
}
