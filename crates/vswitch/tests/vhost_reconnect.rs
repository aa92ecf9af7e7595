//! A switch that dies with frames in flight and is started again on the
//! same sockets, with frontends of our own that reconnect as QEMU does
//! (same guest memory, each queue started at the used ring's index) and,
//! when they asked for it, hand the in-flight region back
//! (`SET_INFLIGHT_FD`). Every transmitted frame must reach the other guest
//! exactly once, every transmit descriptor must come back exactly once,
//! and no receive buffer may be used twice; a region that lies stops only
//! its own queue.
//!
//! The "crash" is the switch dropped at a chosen point of a forwarding
//! pass, driven step by step from the test: between passes; after taking
//! `k` of the frames the guest published (none forwarded); after copying
//! them into the receiver's buffers (not published); after publishing a
//! batch but before clearing it from the region (the memory state a
//! `SIGKILL` there leaves, written into the region by the test). The
//! property test runs `VHOST_RECONNECT_CASES` cases (default 64).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::frontend::{TestGuest, BUF, RX_BUFS};
use common::{add_vport, settle, vport};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, TestCaseError, TestRunner};
use ring::device::FrameRef;
use ring::Mode;
use vswitch::ports::vhost::datapath::{RXQ, TXQ};
use vswitch::ports::vhost::inflight::queue_bytes;
use vswitch::{EventLoop, Port};

const NUM: u16 = 64;
const HDR: u64 = 12;
/// Frames the sender publishes at once.
const BURST: u16 = 16;

/// A frame from guest A with sequence number `seq`.
fn frame(seq: u64) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x0b, 0x02, 0, 0, 0, 0, 0x0a, 0x88, 0xb5];
    f.extend_from_slice(&seq.to_le_bytes());
    f.resize(60, 0);
    f
}

/// The ports, in order: a (sender), b (receiver), then `extra`.
fn switch(d: &Path, extra: &[&str]) -> EventLoop {
    let mut sw = common::switch();
    for name in ["a", "b"].iter().chain(extra) {
        add_vport(&mut sw, d, name, Mode::Csb, 0);
    }
    sw
}

/// One guest and what the test saw of it.
struct Peer {
    g: TestGuest,
    path: PathBuf,
    /// Transmit heads in posting order, and the used entries seen.
    tx_posted: Vec<u16>,
    tx_used: Vec<u32>,
    /// Receive heads in posting order, and the used entries seen.
    rx_posted: Vec<u16>,
    rx_used: Vec<u32>,
    /// Sequence numbers received, with how often.
    got: BTreeMap<u64, u32>,
}

impl Peer {
    fn attach(sw: &mut EventLoop, d: &Path, name: &str, tracked: bool) -> Peer {
        let path = d.join(format!("{name}.sock"));
        let g = if tracked {
            TestGuest::attach_tracked(sw, &path, NUM)
        } else {
            TestGuest::attach(sw, &path, NUM)
        }
        .expect("attach");
        Peer {
            g,
            path,
            tx_posted: Vec::new(),
            tx_used: Vec::new(),
            rx_posted: Vec::new(),
            rx_used: Vec::new(),
            got: BTreeMap::new(),
        }
    }

    fn send(&mut self, seq: u64) {
        self.tx_posted.push(self.g.avail_idx[TXQ] % NUM);
        self.g.send_frame(&frame(seq));
    }

    fn post(&mut self, n: u16) {
        for k in 0..n {
            self.rx_posted
                .push(self.g.avail_idx[RXQ].wrapping_add(k) % NUM);
        }
        self.g.post_rx(n);
    }

    /// Read both used rings; repost as many receive buffers as came back.
    fn drain(&mut self) {
        for (id, _) in self.g.take_used(TXQ) {
            self.tx_used.push(id);
        }
        let used = self.g.take_used(RXQ);
        for &(id, len) in &used {
            self.rx_used.push(id);
            if u64::from(len) >= HDR + 22 {
                let b = self.g.mem.read(RX_BUFS + u64::from(id) * BUF + HDR + 14, 8);
                let seq = u64::from_le_bytes(b.try_into().expect("8 bytes"));
                *self.got.entry(seq).or_default() += 1;
            }
        }
        self.post(used.len() as u16);
    }

    /// The in-flight region's queue `q`: (offset of its header).
    fn region_at(&self, q: usize) -> u64 {
        q as u64 * queue_bytes(NUM)
    }

    /// Make the region read as if the switch died after publishing the
    /// used entries from `before` on, before clearing them.
    fn unclear(&self, q: usize, before: u16) {
        let Some(r) = &self.g.inflight else { return };
        let l = self.g.q[q];
        let at = self.region_at(q);
        let now = self.g.mem.r16(l.used + 2);
        let mut i = before;
        while i != now {
            let id = self.g.mem.r32(l.used + 4 + 8 * u64::from(i % NUM));
            r.write(at + 16 + 16 * u64::from(id), &[1]);
            i = i.wrapping_add(1);
        }
        r.w16(at + 14, before);
    }

    fn region_used(&self, q: usize) -> u16 {
        self.g
            .inflight
            .as_ref()
            .map_or(0, |r| r.r16(self.region_at(q) + 14))
    }
}

/// Where the switch dies.
#[derive(Clone, Copy, Debug)]
enum Crash {
    /// Between passes: the burst is published, nothing taken.
    Between,
    /// `k` frames taken from the sender, none forwarded.
    Taken(u32),
    /// `k` frames taken and copied into the receiver's buffers, not
    /// published.
    Filled(u32),
    /// A whole pass published, the region not cleared.
    Unclear,
}

fn crash_strategy() -> impl Strategy<Value = Crash> {
    prop_oneof![
        Just(Crash::Between),
        (1..=u32::from(BURST)).prop_map(Crash::Taken),
        (1..=u32::from(BURST)).prop_map(Crash::Filled),
        Just(Crash::Unclear),
    ]
}

/// Run A -> B traffic, kill the switch at `crash` after `before` frames,
/// start another, reconnect, send `after` more; return the peers and the
/// new switch.
fn run(
    tag: &str,
    tracked: bool,
    before: u64,
    crash: Crash,
    after: u64,
) -> (Peer, Peer, EventLoop, PathBuf) {
    let d = common::dir(&format!("reconnect-{tag}"));
    let mut sw = switch(&d, &[]);
    let mut a = Peer::attach(&mut sw, &d, "a", tracked);
    let mut b = Peer::attach(&mut sw, &d, "b", tracked);
    b.post(NUM);
    settle(&mut sw);
    let mut seq = 0u64;
    while seq < before {
        for _ in 0..BURST.min((before - seq) as u16) {
            a.send(seq);
            seq += 1;
        }
        settle(&mut sw);
        a.drain();
        b.drain();
        settle(&mut sw);
    }
    // The burst in flight when the switch dies.
    for _ in 0..BURST {
        a.send(seq);
        seq += 1;
    }
    match crash {
        Crash::Between => {}
        Crash::Taken(k) | Crash::Filled(k) => {
            let mut out: Vec<FrameRef> = Vec::new();
            let pa = vport(&mut sw, 0);
            assert_eq!(pa.rx(k, &mut out), k, "frames taken");
            if let Crash::Filled(_) = crash {
                let pb = vport(&mut sw, 1);
                // SAFETY: the frames point into A's guest memory, mapped
                // by the switch, which is alive here.
                assert_eq!(unsafe { pb.tx_batch(&out) }, u64::from(k));
            }
        }
        Crash::Unclear => {
            let (ta, rb) = (a.region_used(TXQ), b.region_used(RXQ));
            sw.pass();
            a.unclear(TXQ, ta);
            b.unclear(RXQ, rb);
        }
    }
    drop(sw);
    let mut sw = switch(&d, &[]);
    a.g.reconnect(&mut sw, &a.path.clone())
        .expect("a reconnects");
    b.g.reconnect(&mut sw, &b.path.clone())
        .expect("b reconnects");
    settle(&mut sw);
    a.drain();
    b.drain();
    settle(&mut sw);
    let end = seq + after;
    while seq < end {
        for _ in 0..BURST.min((end - seq) as u16) {
            a.send(seq);
            seq += 1;
        }
        settle(&mut sw);
        a.drain();
        b.drain();
        settle(&mut sw);
    }
    for _ in 0..3 {
        settle(&mut sw);
        a.drain();
        b.drain();
    }
    (a, b, sw, d)
}

/// Exactly once, per frame and per descriptor.
fn check(a: &Peer, b: &Peer, total: u64) -> Result<(), TestCaseError> {
    let dup: Vec<_> = b.got.iter().filter(|(_, &n)| n != 1).collect();
    prop_assert!(dup.is_empty(), "frames delivered more than once: {dup:?}");
    let missing: Vec<u64> = (0..total).filter(|s| !b.got.contains_key(s)).collect();
    prop_assert!(missing.is_empty(), "frames lost: {missing:?}");
    let posted: Vec<u32> = a.tx_posted.iter().map(|&h| u32::from(h)).collect();
    prop_assert_eq!(
        &a.tx_used,
        &posted,
        "every transmit head back once, in order"
    );
    let rx: Vec<u32> = b.rx_posted.iter().map(|&h| u32::from(h)).collect();
    prop_assert!(
        b.rx_used.len() <= rx.len() && b.rx_used[..] == rx[..b.rx_used.len()],
        "receive buffers used in posting order, none twice: used {:?}, posted {:?}",
        b.rx_used,
        rx
    );
    Ok(())
}

fn cases() -> u32 {
    std::env::var("VHOST_RECONNECT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

#[test]
fn a_restarted_switch_loses_and_repeats_nothing() {
    let mut runner = TestRunner::new(PtConfig {
        cases: cases(),
        failure_persistence: None,
        ..PtConfig::default()
    });
    let n = std::cell::Cell::new(0u32);
    runner
        .run(
            &(any::<bool>(), 0..40u64, crash_strategy(), 1..40u64),
            |(tracked, before, crash, after)| {
                n.set(n.get() + 1);
                let (a, b, mut sw, d) =
                    run(&format!("p{}", n.get()), tracked, before, crash, after);
                let total = before + u64::from(BURST) + after;
                let r = check(&a, &b, total);
                if tracked {
                    // The heads the dead switch held were found in flight
                    // and taken again.
                    let held = match crash {
                        Crash::Taken(k) | Crash::Filled(k) => u64::from(k),
                        _ => 0,
                    };
                    let ra = vport(&mut sw, 0).queue_stats()[TXQ].resubmitted;
                    prop_assert_eq!(ra, held, "sender's heads resubmitted");
                    let rb = vport(&mut sw, 1).queue_stats()[RXQ].resubmitted;
                    let filled = if let Crash::Filled(k) = crash {
                        u64::from(k)
                    } else {
                        0
                    };
                    prop_assert_eq!(rb, filled, "receiver's buffers resubmitted");
                }
                let _ = std::fs::remove_dir_all(&d);
                r
            },
        )
        .expect("property");
}

#[test]
fn each_crash_point_tracked_and_untracked() {
    // The property test's corners, always run: every crash point, with the
    // region (a frontend that asks for it) and without (QEMU's network
    // device, which restarts each queue at the used index).
    for tracked in [true, false] {
        for crash in [
            Crash::Between,
            Crash::Taken(1),
            Crash::Taken(u32::from(BURST)),
            Crash::Filled(7),
            Crash::Unclear,
        ] {
            let tag = format!("c-{tracked}-{crash:?}").replace(['(', ')'], "");
            let (a, b, _sw, d) = run(&tag, tracked, 20, crash, 20);
            check(&a, &b, 20 + u64::from(BURST) + 20)
                .unwrap_or_else(|e| panic!("{crash:?}, tracked {tracked}: {e}"));
            let _ = std::fs::remove_dir_all(&d);
        }
    }
}

/// A region the frontend rewrote, and what a hostile one does.
#[derive(Clone, Debug)]
enum Lie {
    Version(u16),
    DescNum(u16),
    /// The region's used index far from the ring's.
    UsedIdx(u16),
    /// An inflight byte neither 0 nor 1.
    Flag(u16, u8),
    /// A head in flight the guest never made available.
    Phantom(u16),
    /// Counters that put the heads in flight out of ring order.
    Counters,
    /// Anything at all.
    Bytes(Vec<u8>),
}

fn lie_strategy() -> impl Strategy<Value = Lie> {
    prop_oneof![
        (2..u16::MAX).prop_map(Lie::Version),
        (0..u16::MAX)
            .prop_filter("not the ring's", |n| *n != NUM)
            .prop_map(Lie::DescNum),
        (NUM + 1..u16::MAX - NUM).prop_map(Lie::UsedIdx),
        (0..NUM, 2..=u8::MAX).prop_map(|(h, v)| Lie::Flag(h, v)),
        (32..NUM).prop_map(Lie::Phantom),
        Just(Lie::Counters),
        proptest::collection::vec(any::<u8>(), 16..(queue_bytes(NUM) as usize))
            .prop_map(Lie::Bytes),
    ]
}

/// Apply `lie` to queue `q` of A's region.
fn tell(a: &Peer, q: usize, lie: &Lie) {
    let r = a.g.inflight.as_ref().expect("a tracked guest");
    let at = a.region_at(q);
    match lie {
        Lie::Version(v) => r.w16(at + 8, *v),
        Lie::DescNum(n) => r.w16(at + 10, *n),
        Lie::UsedIdx(d) => {
            let u = r.r16(at + 14);
            r.w16(at + 14, u.wrapping_add(*d));
        }
        Lie::Flag(h, v) => r.write(at + 16 + 16 * u64::from(*h), &[*v]),
        Lie::Phantom(h) => r.write(at + 16 + 16 * u64::from(*h), &[1]),
        Lie::Counters => {
            // The first two heads in flight swap counters.
            let heads: Vec<u64> = (0..NUM)
                .map(u64::from)
                .filter(|h| r.read(at + 16 + 16 * h, 1)[0] == 1)
                .take(2)
                .collect();
            if let [x, y] = heads[..] {
                let cx = r.read(at + 16 + 16 * x + 8, 8);
                let cy = r.read(at + 16 + 16 * y + 8, 8);
                r.write(at + 16 + 16 * x + 8, &cy);
                r.write(at + 16 + 16 * y + 8, &cx);
            }
        }
        Lie::Bytes(b) => r.write(at, b),
    }
}

/// A (hostile: its region lies), B (receiver), C (a second sender, no
/// region); A's transmit queue dies holding 4 frames.
fn hostile_case(tag: &str, lie: &Lie) -> Result<(), TestCaseError> {
    let d = common::dir(&format!("reconnect-lie-{tag}"));
    let mut sw = switch(&d, &["c"]);
    let mut a = Peer::attach(&mut sw, &d, "a", true);
    let mut b = Peer::attach(&mut sw, &d, "b", true);
    let mut c = Peer::attach(&mut sw, &d, "c", false);
    a.post(NUM);
    b.post(NUM);
    settle(&mut sw);
    for s in 0..8 {
        a.send(s);
    }
    let mut out = Vec::new();
    vport(&mut sw, 0).rx(4, &mut out);
    drop(out);
    drop(sw);
    tell(&a, TXQ, lie);
    let mut sw = switch(&d, &["c"]);
    for p in [&mut a, &mut b, &mut c] {
        let path = p.path.clone();
        p.g.reconnect(&mut sw, &path).expect("reconnect");
    }
    settle(&mut sw);
    b.drain();
    b.got.clear();
    // C's frames reach B whatever A's region said.
    for s in 1000..1016 {
        c.send(s);
    }
    for _ in 0..3 {
        settle(&mut sw);
        b.drain();
        c.drain();
    }
    let from_c: Vec<u64> = b.got.keys().copied().filter(|s| *s >= 1000).collect();
    prop_assert_eq!(from_c, (1000..1016).collect::<Vec<u64>>(), "C to B");
    prop_assert!(vport(&mut sw, 1).running(), "B runs");
    prop_assert!(vport(&mut sw, 2).running(), "C runs");
    let pa = vport(&mut sw, 0);
    let st = pa.queue_stats()[TXQ];
    match lie {
        // A region made of random bytes may happen to read as fresh
        // (version 0): then it is laid out again and the queue runs.
        Lie::Bytes(_) => {}
        _ => {
            prop_assert!(
                st.broke >= 1,
                "{lie:?}: A's transmit queue stopped, counted"
            );
            let why = format!("{:?}", pa.status());
            prop_assert!(why.contains("in-flight region"), "{lie:?}: {why}");
        }
    }
    let _ = std::fs::remove_dir_all(&d);
    Ok(())
}

#[test]
fn a_lying_region_stops_only_its_queue() {
    for (i, lie) in [
        Lie::Version(9),
        Lie::DescNum(NUM / 2),
        Lie::UsedIdx(1000),
        Lie::Flag(3, 7),
        Lie::Phantom(40),
        Lie::Counters,
    ]
    .iter()
    .enumerate()
    {
        hostile_case(&format!("fixed{i}"), lie).unwrap_or_else(|e| panic!("{lie:?}: {e}"));
    }
    let mut runner = TestRunner::new(PtConfig {
        cases: cases(),
        failure_persistence: None,
        ..PtConfig::default()
    });
    let n = std::cell::Cell::new(0u32);
    runner
        .run(&lie_strategy(), |lie| {
            n.set(n.get() + 1);
            hostile_case(&format!("p{}", n.get()), &lie)
        })
        .expect("property");
}
