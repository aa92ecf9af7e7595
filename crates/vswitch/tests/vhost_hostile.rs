//! Hostile frontends against a vhost-user port, with a frontend of our own
//! (not QEMU): impossible ring contents, protocol abuse, memory tricks,
//! disconnects and reconnects. The port runs in the switch, driven step by
//! step from the test's thread, beside a well-behaved "victim" frontend on
//! another port, whose traffic must flow through every case; what the
//! hostile port refuses is checked against an independent model of the
//! rules.
//!
//! The two property tests run `VHOST_HOSTILE_CASES` cases each (default
//! 10,000: about 20 s for both on a loaded two-core machine);
//! `PROPTEST_CASES` is not read here, so that a setting meant for other
//! property tests does not shrink these.

mod common;

use std::cell::RefCell;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use common::frontend::{
    eventfd, mem_table, req, state, u64p, vring_addr, Layout, Pumped, RawDesc, SharedMem,
    TestGuest, Wire, BUF, MEM, RX_BUFS, TX_BUFS, VERSION,
};
use common::{add_vport, capture, settle, vport, CapturePort, SinkPort};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, TestCaseError, TestRunner};
use ring::Mode;
use vswitch::ports::vhost::control::PARTIAL_TIMEOUT;
use vswitch::ports::vhost::datapath::{ChainError, QueueStats, MAX_FRAME, RXQ, TXQ};
use vswitch::EventLoop;

const HOSTILE: u16 = 0;
const VICTIM: u16 = 1;
const CAPTURE: u16 = 2;
const HDR: usize = 12;

fn dir(name: &str) -> std::path::PathBuf {
    common::dir(&format!("hostile-{name}"))
}

/// hostile (0), victim (1), capture (2); no learning: every frame goes to
/// every other port.
fn switch(d: &std::path::Path) -> EventLoop {
    let mut sw = common::switch();
    for name in ["hostile", "victim"] {
        add_vport(&mut sw, d, name, Mode::Csb, 0);
    }
    sw.add_port(Box::new(CapturePort::new("capture")))
        .expect("add");
    sw
}

fn hostile(sw: &mut EventLoop) -> &mut vswitch::VhostPort {
    vport(sw, HOSTILE)
}

/// A victim frame: recognisable by its ethertype and marker.
fn victim_frame(seq: u64) -> Vec<u8> {
    let mut f = vec![0xffu8; 6];
    f.extend_from_slice(&[2, 0, 0, 0, 0, 0x1c]);
    f.extend_from_slice(&0x88b5u16.to_be_bytes());
    f.extend_from_slice(b"VICTIM");
    f.extend_from_slice(&seq.to_le_bytes());
    f.resize(60, 0);
    f
}

fn is_victim(f: &[u8]) -> bool {
    f.len() >= 20 && f[12..14] == [0x88, 0xb5] && &f[14..20] == b"VICTIM"
}

/// The victim sends `n` frames; they must reach the capture port, and the
/// victim must get all its chains back.
fn victim_sends(
    sw: &mut EventLoop,
    v: &mut TestGuest,
    seq: &mut u64,
    n: u64,
) -> Result<(), String> {
    let before = capture(sw, CAPTURE)
        .frames
        .iter()
        .filter(|f| is_victim(f))
        .count();
    for _ in 0..n {
        v.send_frame(&victim_frame(*seq));
        *seq += 1;
    }
    settle(sw);
    let after = capture(sw, CAPTURE)
        .frames
        .iter()
        .filter(|f| is_victim(f))
        .count();
    let used = v.take_used(1).len() as u64;
    if after - before != n as usize || used != n {
        return Err(format!(
            "victim sent {n}: capture got {}, {used} chains returned",
            after - before
        ));
    }
    Ok(())
}

/// Cases per property test: `VHOST_HOSTILE_CASES`, default 10,000.
fn cases() -> u32 {
    std::env::var("VHOST_HOSTILE_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(10_000)
}

// ---------------------------------------------------------------------
// The model: what the rules say should happen to a transmit ring.

/// A chain's fate in the model.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fate {
    Frame(Vec<u8>),
    Refused(ChainError),
    /// Refused for its virtio-net header: it asks for an offload this
    /// guest did not negotiate (it negotiated none), or sets a flag only
    /// the device may set (virtio 1.2, 5.1.6.2.1).
    HdrRefused,
}

fn inside(addr: u64, len: u64) -> bool {
    addr.checked_add(len).is_some_and(|e| e <= MEM)
}

/// Walk a chain as the rules say: the first structural fault, or the bytes.
fn model_walk(
    mem: &SharedMem,
    l: &Layout,
    head: u16,
    write: bool,
) -> Result<Vec<(u64, u32)>, ChainError> {
    let mut segs = Vec::new();
    model_walk_into(mem, l, head, write, &mut segs).map(|()| segs)
}

/// The same walk, leaving in `segs` the buffers it passed (a receive chain
/// refused at its n-th descriptor has had the ones before written).
fn model_walk_into(
    mem: &SharedMem,
    l: &Layout,
    head: u16,
    write: bool,
    segs: &mut Vec<(u64, u32)>,
) -> Result<(), ChainError> {
    let mut i = head;
    for _ in 0..l.num {
        let at = l.desc_at(i);
        let b = mem.read(at, 16);
        let addr = u64::from_le_bytes(b[0..8].try_into().expect("8"));
        let len = u32::from_le_bytes(b[8..12].try_into().expect("4"));
        let flags = u16::from_le_bytes([b[12], b[13]]);
        let next = u16::from_le_bytes([b[14], b[15]]);
        if flags & 4 != 0 {
            return Err(ChainError::Indirect);
        }
        if (flags & 2 != 0) != write {
            return Err(ChainError::Direction);
        }
        if !inside(addr, u64::from(len)) {
            return Err(ChainError::Outside);
        }
        segs.push((addr, len));
        if flags & 1 == 0 {
            return Ok(());
        }
        if next >= l.num {
            return Err(ChainError::NextOutOfRange);
        }
        i = next;
    }
    Err(ChainError::Loop)
}

fn model_tx_chain(mem: &SharedMem, l: &Layout, head: u16) -> Fate {
    let segs = match model_walk(mem, l, head, false) {
        Ok(s) => s,
        Err(e) => return Fate::Refused(e),
    };
    let mut bytes = Vec::new();
    for (a, n) in segs {
        bytes.extend(mem.read(a, n as usize));
    }
    if bytes.len() < HDR + 14 {
        return Fate::Refused(ChainError::Short);
    }
    let frame = bytes[HDR..].to_vec();
    // Longer than any frame a header may describe (an IP datagram's
    // 65,535 bytes behind an Ethernet header and a VLAN tag).
    if frame.len() > 65_535 + 18 {
        return Fate::Refused(ChainError::Long);
    }
    // flags (the three virtio defines; the device ignores the others,
    // 5.1.6.2.2) and gso_type: anything but 0 asks for what was not
    // negotiated, or sets what only the device may.
    if bytes[0] & 7 != 0 || bytes[1] != 0 {
        return Fate::HdrRefused;
    }
    if frame.len() > MAX_FRAME as usize {
        return Fate::Refused(ChainError::Long);
    }
    Fate::Frame(frame)
}

/// The model's account of one transmit ring: broken, heads consumed (in
/// order), each chain's fate.
#[derive(Debug, Default)]
struct TxModel {
    broken: bool,
    heads: Vec<u16>,
    fates: Vec<Fate>,
}

fn model_tx(mem: &SharedMem, l: &Layout, published: u16) -> TxModel {
    let mut m = TxModel::default();
    if published > l.num {
        m.broken = true;
        return m;
    }
    for k in 0..published {
        let head = mem.r16(l.avail + 4 + 2 * u64::from(k % l.num));
        if head >= l.num {
            m.broken = true;
            return m;
        }
        m.heads.push(head);
        let fate = model_tx_chain(mem, l, head);
        // A chain longer than the ring loops: refused, and the queue stops.
        let looped = fate == Fate::Refused(ChainError::Loop);
        m.fates.push(fate);
        if looped {
            m.broken = true;
            return m;
        }
    }
    m
}

/// The model of a receive ring given frames in order: per frame the entries
/// consumed, and for the one that took it its head and segments.
#[derive(Debug, Default)]
struct RxModel {
    broken: bool,
    /// (head, used length) per entry consumed, in order.
    used: Vec<(u16, u32)>,
    refused: [u64; 8],
    /// For each frame delivered: (frame index, its segments).
    placed: Vec<(usize, Vec<(u64, u32)>)>,
    /// Every buffer written, in order: (entry number, buffer).
    written: Vec<(usize, (u64, u32))>,
}

fn model_rx(mem: &SharedMem, l: &Layout, published: u16, frames: &[Vec<u8>]) -> RxModel {
    let mut m = RxModel::default();
    if published > l.num {
        m.broken = true;
        return m;
    }
    let mut k = 0u16;
    'frames: for (fi, f) in frames.iter().enumerate() {
        loop {
            if k == published {
                break 'frames;
            }
            let head = mem.r16(l.avail + 4 + 2 * u64::from(k % l.num));
            if head >= l.num {
                m.broken = true;
                break 'frames;
            }
            k += 1;
            let need = (HDR + f.len()) as u64;
            let mut segs = Vec::new();
            let r = model_walk_into(mem, l, head, true, &mut segs);
            // A single buffer is checked whole before it is written; a
            // chain is written as it is walked.
            let single = segs.len() == 1 && r.is_ok();
            let room: u64 = segs.iter().map(|s| u64::from(s.1)).sum();
            if !(single && room < need) {
                for sg in &segs {
                    m.written.push((m.used.len(), *sg));
                }
            }
            match r {
                Ok(()) if room >= need => {
                    m.used.push((head, need as u32));
                    m.placed.push((m.used.len() - 1, segs));
                    let _ = fi;
                    break;
                }
                Ok(()) => {
                    m.used.push((head, 0));
                    m.refused[ChainError::Small as usize] += 1;
                }
                Err(e) => {
                    m.used.push((head, 0));
                    m.refused[e as usize] += 1;
                    // A looping chain stops the queue.
                    if e == ChainError::Loop {
                        m.broken = true;
                        break 'frames;
                    }
                }
            }
        }
    }
    m
}

// ---------------------------------------------------------------------
// Generators of hostile rings.

#[derive(Clone, Debug)]
enum Addr {
    /// Inside the buffer area: slot and offset (multiples of 64).
    Buf(u16, u16),
    /// Crossing the end of guest memory.
    PastEnd(u16),
    /// Far outside.
    Far(u64),
}

fn addr_of(a: &Addr, base: u64) -> u64 {
    match *a {
        Addr::Buf(slot, off) => base + u64::from(slot) * BUF + u64::from(off),
        Addr::PastEnd(back) => MEM - u64::from(back),
        Addr::Far(x) => x,
    }
}

fn addr() -> impl Strategy<Value = Addr> {
    prop_oneof![
        12 => (0u16..32, (0u16..16).prop_map(|o| o * 64)).prop_map(|(s, o)| Addr::Buf(s, o)),
        1 => (1u16..64).prop_map(Addr::PastEnd),
        1 => prop_oneof![Just(u64::MAX - 8), Just(1u64 << 62), any::<u64>()].prop_map(Addr::Far),
    ]
}

fn len() -> impl Strategy<Value = u32> {
    prop_oneof![
        6 => 26u32..200,
        2 => 0u32..30,
        1 => 1000u32..2100,
        1 => 2000u32..2200,
        1 => Just(12u32),
        1 => any::<u32>(),
    ]
}

fn flags(write: bool) -> impl Strategy<Value = u16> {
    let w: u16 = if write { 2 } else { 0 };
    prop_oneof![
        10 => Just(w),
        5 => Just(w | 1),
        1 => Just(w ^ 2),
        1 => Just(w | 4),
        1 => any::<u16>(),
    ]
}

#[derive(Clone, Debug)]
struct HDesc {
    addr: Addr,
    len: u32,
    flags: u16,
    next: u16,
}

fn hdesc(num: u16, write: bool) -> impl Strategy<Value = HDesc> {
    (
        addr(),
        len(),
        flags(write),
        prop_oneof![8 => 0..num, 1 => num..num + 8, 1 => any::<u16>()],
    )
        .prop_map(|(addr, len, flags, next)| HDesc {
            addr,
            len,
            flags,
            next,
        })
}

#[derive(Clone, Debug)]
struct HRing {
    descs: Vec<HDesc>,
    heads: Vec<u16>,
    published: u16,
}

fn hring(num: u16, write: bool) -> impl Strategy<Value = HRing> {
    (
        proptest::collection::vec(hdesc(num, write), num as usize),
        proptest::collection::vec(prop_oneof![20 => 0..num, 1 => num..u16::MAX], num as usize),
        prop_oneof![20 => 0..=num, 1 => num + 1..=u16::MAX],
    )
        .prop_map(|(descs, heads, published)| HRing {
            descs,
            heads,
            published,
        })
}

fn write_ring(g: &mut TestGuest, q: usize, r: &HRing, base: u64) {
    for (i, d) in r.descs.iter().enumerate() {
        g.put_desc(
            q,
            i as u16,
            RawDesc {
                addr: addr_of(&d.addr, base),
                len: d.len,
                flags: d.flags,
                next: d.next,
            },
        );
    }
    for (k, &h) in r.heads.iter().enumerate() {
        g.push_avail(q, k as u16, h);
    }
}

/// Fill the transmit buffer area with bytes that never look like a victim
/// frame, and whose first byte is odd (group address: flooded).
fn fill_tx_area(g: &TestGuest, seed: u64) {
    let mut x = seed | 1;
    let mut b = vec![0u8; (32 * BUF) as usize];
    for v in b.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *v = (x as u8) | 0x01;
    }
    g.mem.write(TX_BUFS, &b);
}

fn delta(a: &QueueStats, b: &QueueStats) -> [u64; 8] {
    std::array::from_fn(|i| b.refused[i] - a.refused[i])
}

// ---------------------------------------------------------------------

/// Hostile transmit and receive rings ([`cases`]), each
/// from a fresh connection on the same port, each checked against the model;
/// the victim's frames flow through every case.
#[test]
fn hostile_rings_are_refused_as_the_model_says_and_the_victim_is_served() {
    let d = dir("rings");
    let sw = RefCell::new(switch(&d));
    let victim = {
        let mut s = sw.borrow_mut();
        let v = TestGuest::attach(&mut s, &d.join("victim.sock"), 256).expect("victim");
        settle(&mut s);
        assert!(vport(&mut s, VICTIM).running(), "victim running");
        v
    };
    let victim = RefCell::new(victim);
    let seq = RefCell::new(0u64);
    let cases = cases();
    let mut runner = TestRunner::new(PtConfig {
        cases,
        failure_persistence: None,
        ..PtConfig::default()
    });
    const NUM: u16 = 16;
    let counted = RefCell::new([0u64; 8]);
    let broke = RefCell::new(0u64);
    let t0 = Instant::now();
    let res = runner.run(
        &(hring(NUM, false), hring(NUM, true), 1u64..8, any::<u64>()),
        |(tx, rx, nframes, seed)| {
            let mut sw = sw.borrow_mut();
            let sw = &mut *sw;
            let mut g = TestGuest::attach(sw, &d.join("hostile.sock"), NUM)
                .map_err(|e| TestCaseError::fail(format!("attach: {e}")))?;
            settle(sw);
            prop_assert!(hostile(sw).running(), "hostile attached");
            fill_tx_area(&g, seed);
            write_ring(&mut g, 1, &tx, TX_BUFS);
            write_ring(&mut g, 0, &rx, RX_BUFS);
            let txm = model_tx(&g.mem, &g.q[1], tx.published);
            let frames: Vec<Vec<u8>> = (0..nframes).map(|i| victim_frame(1_000_000 + i)).collect();
            let rxm = model_rx(&g.mem, &g.q[0], rx.published, &frames);
            let s0 = hostile(sw).queue_stats();
            let cap0 = capture(sw, CAPTURE).frames.len();
            // The hostile guest's rings first (one pass takes them all),
            // then the victim's frames, which reach the hostile guest's
            // receive ring too.
            g.mem.w16(g.q[0].avail + 2, rx.published);
            g.mem.w16(g.q[1].avail + 2, tx.published);
            g.kick[1].signal();
            settle(sw);
            let got: Vec<Vec<u8>> = capture(sw, CAPTURE).frames[cap0..].to_vec();
            let hostile_frames: Vec<&Vec<u8>> = got.iter().filter(|f| !is_victim(f)).collect();
            let want: Vec<&Vec<u8>> = txm
                .fates
                .iter()
                .filter_map(|f| match f {
                    Fate::Frame(b) => Some(b),
                    Fate::Refused(_) | Fate::HdrRefused => None,
                })
                .collect();
            prop_assert_eq!(&hostile_frames, &want, "frames taken from the hostile ring");
            let s1 = hostile(sw).queue_stats();
            let mut want_refused = [0u64; 8];
            for f in &txm.fates {
                if let Fate::Refused(e) = f {
                    want_refused[*e as usize] += 1;
                }
            }
            prop_assert_eq!(delta(&s0[TXQ], &s1[TXQ]), want_refused, "tx refusals");
            let hdr_refused = |s: &QueueStats| s.hdr_refused.iter().sum::<u64>();
            prop_assert_eq!(
                hdr_refused(&s1[TXQ]) - hdr_refused(&s0[TXQ]),
                txm.fates.iter().filter(|f| **f == Fate::HdrRefused).count() as u64,
                "tx refusals for the header"
            );
            prop_assert_eq!(
                s1[TXQ].broke - s0[TXQ].broke,
                u64::from(txm.broken),
                "tx broke"
            );
            let used: Vec<u16> = g.take_used(1).iter().map(|&(id, _)| id as u16).collect();
            prop_assert_eq!(&used, &txm.heads, "tx chains returned in order");

            // Receive: the victim's frames into the hostile ring.
            {
                let mut v = victim.borrow_mut();
                let mut sq = seq.borrow_mut();
                for f in &frames {
                    v.send_frame(f);
                    *sq += 1;
                }
            }
            settle(sw);
            let back = victim.borrow_mut().take_used(1).len() as u64;
            prop_assert_eq!(back, nframes, "victim's chains returned");
            let s2 = hostile(sw).queue_stats();
            prop_assert_eq!(delta(&s1[RXQ], &s2[RXQ]), rxm.refused, "rx refusals");
            prop_assert_eq!(
                s2[RXQ].broke - s1[RXQ].broke,
                u64::from(rxm.broken),
                "rx broke"
            );
            let used = g.take_used(0);
            let want_used: Vec<(u32, u32)> =
                rxm.used.iter().map(|&(h, l)| (u32::from(h), l)).collect();
            prop_assert_eq!(&used, &want_used, "rx used entries");
            // Where a delivered frame's buffers are not reused by a later
            // one, the header and frame are there.
            for (fi, (entry, segs)) in rxm.placed.iter().enumerate() {
                let hit = |a: &(u64, u32), b: &(u64, u32)| {
                    a.0 < b.0 + u64::from(b.1) && b.0 < a.0 + u64::from(a.1)
                };
                let overlaps = |a: &(u64, u32)| {
                    rxm.written.iter().any(|(e, b)| e > entry && hit(a, b))
                        || segs.iter().filter(|c| *c != a).any(|b| hit(a, b))
                };
                if segs.iter().any(overlaps) {
                    continue;
                }
                let mut bytes = Vec::new();
                for (a, l) in segs {
                    bytes.extend(g.mem.read(*a, *l as usize));
                }
                let f = &frames[fi];
                prop_assert_eq!(bytes[10], 1, "num_buffers");
                prop_assert_eq!(&bytes[HDR..HDR + f.len()], &f[..], "frame placed");
            }
            {
                let mut c = counted.borrow_mut();
                for (i, n) in c.iter_mut().enumerate() {
                    *n += want_refused[i] + rxm.refused[i];
                }
                *broke.borrow_mut() += u64::from(txm.broken) + u64::from(rxm.broken);
            }
            // The victim is served whatever the hostile guest did.
            {
                let mut v = victim.borrow_mut();
                let mut sq = seq.borrow_mut();
                victim_sends(sw, &mut v, &mut sq, 3).map_err(TestCaseError::fail)?;
            }
            // Gone (the next case connects again).
            g.wire.shutdown();
            drop(g);
            settle(sw);
            prop_assert!(!hostile(sw).connected(), "hostile gone");
            // What was captured is checked; keep the capture short.
            capture(sw, CAPTURE).frames.clear();
            Ok(())
        },
    );
    if let Err(e) = res {
        panic!("{e}");
    }
    let c = counted.borrow();
    let names: Vec<String> = ChainError::ALL
        .iter()
        .map(|e| format!("{}={}", e.name(), c[*e as usize]))
        .collect();
    println!(
        "{cases} cases in {:.1}s: refused {}, queues broken {}",
        t0.elapsed().as_secs_f64(),
        names.join(" "),
        broke.borrow()
    );
    // Every kind of refusal was exercised.
    for e in ChainError::ALL {
        assert!(
            c[e as usize] > 0 || cases < 1000,
            "{} never exercised",
            e.name()
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Random protocol messages (codes, sizes, payloads, descriptors, half
/// messages): the switch never stops, the victim is served, and after the
/// hostile frontend is gone a good one attaches and passes traffic.
#[test]
fn hostile_protocol_messages_never_stop_the_switch() {
    let d = dir("proto");
    let sw = RefCell::new(switch(&d));
    let victim = {
        let mut s = sw.borrow_mut();
        TestGuest::attach(&mut s, &d.join("victim.sock"), 256).expect("victim")
    };
    let victim = RefCell::new(victim);
    let seq = RefCell::new(0u64);
    let n = RefCell::new(0u64);
    let cases = cases();
    let mut runner = TestRunner::new(PtConfig {
        cases,
        failure_persistence: None,
        ..PtConfig::default()
    });
    #[derive(Clone, Debug)]
    enum Msg {
        /// A message: code, flags, payload, descriptors to attach.
        Whole(u32, u32, Vec<u8>, u8),
        /// The first bytes of one.
        Cut(u32, Vec<u8>, usize),
        /// A header announcing more than the protocol allows.
        Oversized(u32, u32),
        /// A plausible setup message with hostile values.
        Known(u32, u32, u64, u64),
    }
    let msg = prop_oneof![
        3 => (0u32..45, prop_oneof![Just(1u32), Just(9u32), any::<u32>()], proptest::collection::vec(any::<u8>(), 0..80), 0u8..3)
            .prop_map(|(c, f, p, fds)| Msg::Whole(c, f, p, fds)),
        1 => (0u32..45, proptest::collection::vec(any::<u8>(), 0..40), 1usize..40).prop_map(|(c, p, k)| Msg::Cut(c, p, k)),
        1 => (0u32..45, 0x1001u32..).prop_map(|(c, s)| Msg::Oversized(c, s)),
        6 => (prop_oneof![Just(2u32), Just(5u32), Just(8u32), Just(9u32), Just(10u32), Just(11u32), Just(12u32), Just(13u32), Just(16u32), Just(18u32)],
              prop_oneof![0u32..4, any::<u32>()], any::<u64>(), prop_oneof![0u64..0x10_0000, any::<u64>()])
            .prop_map(|(c, i, a, b)| Msg::Known(c, i, a, b)),
    ];
    let res = runner.run(&proptest::collection::vec(msg, 1..12), |msgs| {
        let mut sw = sw.borrow_mut();
        let sw = &mut *sw;
        let mem = SharedMem::new(MEM, true).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let ev = eventfd().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let w = Wire::connect(&d.join("hostile.sock"))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for m in &msgs {
            let r = match m {
                Msg::Whole(c, f, p, fds) => {
                    let fds: Vec<_> = (0..*fds)
                        .map(|i| if i == 0 { mem.file.as_fd() } else { ev.as_fd() })
                        .collect();
                    w.send(*c, *f, p, &fds)
                }
                Msg::Cut(c, p, k) => {
                    let mut b = c.to_le_bytes().to_vec();
                    b.extend_from_slice(&VERSION.to_le_bytes());
                    b.extend_from_slice(&(p.len() as u32).to_le_bytes());
                    b.extend_from_slice(p);
                    b.truncate(*k);
                    w.send_raw(&b, &[])
                }
                Msg::Oversized(c, s) => {
                    let mut b = c.to_le_bytes().to_vec();
                    b.extend_from_slice(&VERSION.to_le_bytes());
                    b.extend_from_slice(&s.to_le_bytes());
                    w.send_raw(&b, &[])
                }
                Msg::Known(c, i, a, b) => match *c {
                    req::SET_MEM_TABLE => {
                        let t =
                            mem_table(&[(*a & 0xffff_f000, (*b % (2 * MEM)) | 1, mem.uaddr, 0)]);
                        w.send(*c, VERSION, &t, &[mem.file.as_fd()])
                    }
                    req::SET_VRING_ADDR => w.send(
                        *c,
                        VERSION,
                        &vring_addr(*i, *a, *b, a.wrapping_add(*b)),
                        &[],
                    ),
                    req::SET_VRING_KICK | req::SET_VRING_CALL => {
                        w.send(*c, VERSION, &u64p(u64::from(*i)), &[ev.as_fd()])
                    }
                    req::SET_FEATURES | req::SET_PROTOCOL_FEATURES => {
                        w.send(*c, VERSION, &u64p(*a), &[])
                    }
                    _ => w.send(*c, VERSION, &state(*i, *b as u32), &[]),
                },
            };
            // The port may have closed the connection already.
            if r.is_err() {
                break;
            }
            sw.poll_events();
            sw.pass();
        }
        settle(sw);
        {
            let mut v = victim.borrow_mut();
            let mut sq = seq.borrow_mut();
            victim_sends(sw, &mut v, &mut sq, 2).map_err(TestCaseError::fail)?;
        }
        w.shutdown();
        drop(w);
        settle(sw);
        // Every 100th case, a good frontend attaches and sends.
        let mut k = n.borrow_mut();
        *k += 1;
        if *k % 100 == 1 {
            prop_assert!(!hostile(sw).connected(), "hostile gone");
            let mut g = TestGuest::attach(sw, &d.join("hostile.sock"), 64)
                .map_err(|e| TestCaseError::fail(format!("good attach: {e}")))?;
            settle(sw);
            prop_assert!(hostile(sw).running(), "good frontend running");
            let before = capture(sw, CAPTURE).frames.len();
            g.send_frame(&victim_frame(u64::MAX));
            settle(sw);
            prop_assert_eq!(capture(sw, CAPTURE).frames.len(), before + 1);
            g.wire.shutdown();
            drop(g);
            settle(sw);
        }
        capture(sw, CAPTURE).frames.clear();
        Ok(())
    });
    if let Err(e) = res {
        panic!("{e}");
    }
    let cs = sw
        .borrow_mut()
        .port_as::<vswitch::VhostPort>(HOSTILE)
        .expect("hostile port")
        .conn_stats()
        .clone();
    println!(
        "{cases} cases: {} connections, last close: {:?}",
        cs.accepted, cs.last_close
    );
    let _ = std::fs::remove_dir_all(&d);
}

// ---------------------------------------------------------------------
// Named attacks, one each.

fn two_port_setup(name: &str) -> (std::path::PathBuf, EventLoop, TestGuest) {
    let d = dir(name);
    let mut sw = switch(&d);
    let v = TestGuest::attach(&mut sw, &d.join("victim.sock"), 256).expect("victim");
    settle(&mut sw);
    (d, sw, v)
}

#[test]
fn unsealed_memory_is_refused_with_the_reason() {
    let (d, mut sw, mut v) = two_port_setup("unsealed");
    let mem = SharedMem::new(MEM, false).expect("memfd");
    let w = Wire::connect(&d.join("hostile.sock")).expect("connect");
    w.send(
        req::SET_MEM_TABLE,
        VERSION,
        &mem_table(&[(0, MEM, mem.uaddr, 0)]),
        &[mem.file.as_fd()],
    )
    .expect("send");
    settle(&mut sw);
    let cs = hostile(&mut sw).conn_stats().clone();
    let why = cs.last_close.unwrap_or_default();
    assert!(why.contains("F_SEAL_SHRINK"), "{why}");
    assert!(!hostile(&mut sw).connected());
    let mut seq = 0;
    victim_sends(&mut sw, &mut v, &mut seq, 5).expect("victim served");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn sealed_memory_cannot_be_shrunk_under_the_port() {
    let (d, mut sw, mut v) = two_port_setup("shrink");
    let mut g = TestGuest::attach(&mut sw, &d.join("hostile.sock"), 64).expect("attach");
    settle(&mut sw);
    assert!(hostile(&mut sw).running());
    // The frontend tries to pull the memory from under the port.
    let e = g
        .mem
        .file
        .set_len(4096)
        .expect_err("shrinking a sealed memfd");
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
    // Punching a hole is allowed (the pages read as zeros again, no fault).
    // SAFETY: fallocate on our own memfd; the range lies inside it.
    let rc = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&g.mem.file),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            MEM as i64,
        )
    };
    assert_eq!(rc, 0, "punch hole");
    settle(&mut sw);
    // Rings of zeros: nothing available, nothing taken, no fault.
    g.avail_idx = [0, 0];
    g.send_frame(&victim_frame(7));
    settle(&mut sw);
    let mut seq = 0;
    victim_sends(&mut sw, &mut v, &mut seq, 5).expect("victim served");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn half_a_message_does_not_hold_the_switch() {
    let (d, mut sw, mut v) = two_port_setup("half");
    let w = Wire::connect(&d.join("hostile.sock")).expect("connect");
    // A header announcing 8 bytes, and 3 of them.
    let mut b = req::SET_FEATURES.to_le_bytes().to_vec();
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&[1, 2, 3]);
    w.send_raw(&b, &[]).expect("send");
    let t = Instant::now();
    let mut seq = 0;
    // The switch goes on serving the victim meanwhile.
    while t.elapsed() < PARTIAL_TIMEOUT + Duration::from_millis(300) {
        victim_sends(&mut sw, &mut v, &mut seq, 1).expect("victim served");
        std::thread::sleep(Duration::from_millis(20));
    }
    settle(&mut sw);
    let cs = hostile(&mut sw).conn_stats().clone();
    assert!(!hostile(&mut sw).connected(), "closed after the timeout");
    assert!(cs.last_close.unwrap_or_default().contains("half a message"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn disconnect_mid_transfer_then_reconnect() {
    let (d, mut sw, mut v) = two_port_setup("reconnect");
    let mut g = TestGuest::attach(&mut sw, &d.join("hostile.sock"), 64).expect("attach");
    settle(&mut sw);
    // Frames published, then the frontend vanishes before the switch runs.
    for i in 0..10 {
        g.send_frame(&victim_frame(500 + i));
    }
    g.wire.shutdown();
    drop(g);
    settle(&mut sw);
    assert!(!hostile(&mut sw).connected());
    let mut seq = 0;
    victim_sends(&mut sw, &mut v, &mut seq, 5).expect("victim served");
    // A second frontend while one is attached is turned away.
    let mut g = TestGuest::attach(&mut sw, &d.join("hostile.sock"), 64).expect("reattach");
    let intruder = Wire::connect(&d.join("hostile.sock")).expect("connect");
    settle(&mut sw);
    assert!(intruder.closed_by_peer(), "second frontend closed");
    assert_eq!(hostile(&mut sw).conn_stats().turned_away, 1);
    // The reconnected one works, both ways.
    let before = capture(&mut sw, CAPTURE).frames.len();
    g.send_frame(&victim_frame(900));
    g.post_rx(8);
    settle(&mut sw);
    assert_eq!(capture(&mut sw, CAPTURE).frames.len(), before + 1);
    victim_sends(&mut sw, &mut v, &mut seq, 3).expect("victim served");
    let got = g.received();
    assert!(
        got.iter().filter(|f| is_victim(f)).count() >= 3,
        "{}",
        got.len()
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn memory_table_replaced_while_running() {
    let (d, mut sw, mut v) = two_port_setup("memswap");
    let mut g = TestGuest::attach(&mut sw, &d.join("hostile.sock"), 64).expect("attach");
    settle(&mut sw);
    g.send_frame(&victim_frame(1));
    settle(&mut sw);
    // Same rings, new memory: a copy of the old one, mapped at the same
    // addresses; the queues restart where they stood.
    let copy = SharedMem::new(MEM, true).expect("memfd");
    copy.write(0, &g.mem.read(0, MEM as usize));
    g.set_mem_table(&[(0, MEM, g.mem.uaddr, 0)], &[copy.file.as_fd()])
        .expect("send");
    g.mem = copy;
    settle(&mut sw);
    assert!(hostile(&mut sw).running(), "running on the new memory");
    let before = capture(&mut sw, CAPTURE).frames.len();
    g.send_frame(&victim_frame(2));
    settle(&mut sw);
    assert_eq!(capture(&mut sw, CAPTURE).frames.len(), before + 1);
    // A table that no longer holds the rings: refused, connection closed.
    let small = SharedMem::new(0x1000, true).expect("memfd");
    g.set_mem_table(&[(0, 0x1000, g.mem.uaddr, 0)], &[small.file.as_fd()])
        .expect("send");
    settle(&mut sw);
    let why = hostile(&mut sw)
        .conn_stats()
        .last_close
        .clone()
        .unwrap_or_default();
    assert!(why.contains("outside guest memory"), "{why}");
    let mut seq = 0;
    victim_sends(&mut sw, &mut v, &mut seq, 5).expect("victim served");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn used_index_scribbled_by_the_guest_is_never_read() {
    let (d, mut sw, mut v) = two_port_setup("usedidx");
    let mut g = TestGuest::attach(&mut sw, &d.join("hostile.sock"), 64).expect("attach");
    settle(&mut sw);
    g.send_frame(&victim_frame(1));
    settle(&mut sw);
    assert_eq!(g.take_used(1).len(), 1);
    // The guest writes the device's used index and avail_event.
    g.mem.w16(g.q[1].used + 2, 40000);
    g.mem.w16(g.q[1].used + 4 + 8 * 64, 1234);
    g.send_frame(&victim_frame(2));
    settle(&mut sw);
    // The port wrote its own next index (2), not 40001.
    assert_eq!(g.mem.r16(g.q[1].used + 2), 2);
    assert!(hostile(&mut sw).running());
    let mut seq = 0;
    victim_sends(&mut sw, &mut v, &mut seq, 5).expect("victim served");
    // And GET_VRING_BASE answers where the queue stopped.
    let base = g.wire.ask(&mut sw, req::GET_VRING_BASE, &state(1, 0));
    assert_eq!(base.map(|b| b >> 32), Some(2), "index 1, num 2");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_second_attached_sink_sees_nothing_of_the_hostile_guest_s_refusals() {
    // Refused chains never reach another port: a ring of nothing but
    // faults forwards nothing.
    let (d, mut sw, _v) = two_port_setup("nothing");
    sw.add_port(Box::new(SinkPort::new("sink"))).expect("sink");
    let mut g = TestGuest::attach(&mut sw, &d.join("hostile.sock"), 16).expect("attach");
    settle(&mut sw);
    for i in 0..16u16 {
        g.put_desc(
            1,
            i,
            RawDesc {
                addr: MEM - 8,
                len: 64,
                flags: 0,
                next: 0,
            },
        );
        g.push_avail(1, i, i);
    }
    g.publish(1, 16);
    settle(&mut sw);
    let st = hostile(&mut sw).queue_stats()[TXQ];
    assert_eq!(st.refused[ChainError::Outside as usize], 16);
    assert_eq!(sw.port_mut(3).expect("sink").counters().to_port, 0);
    assert_eq!(g.take_used(1).len(), 16, "all returned to the guest");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_kick_descriptor_that_is_no_eventfd_is_refused() {
    let (d, mut sw, mut v) = two_port_setup("pipe");
    let (r, _w) = rustix::pipe::pipe().expect("pipe");
    let w = Wire::connect(&d.join("hostile.sock")).expect("connect");
    w.send(req::SET_VRING_KICK, VERSION, &u64p(1), &[r.as_fd()])
        .expect("send");
    settle(&mut sw);
    let why = hostile(&mut sw)
        .conn_stats()
        .last_close
        .clone()
        .unwrap_or_default();
    assert!(why.contains("not an eventfd"), "{why}");
    let mut seq = 0;
    victim_sends(&mut sw, &mut v, &mut seq, 2).expect("victim served");
    let _ = std::fs::remove_dir_all(&d);
}

/// Port security is on by default for a VM port whose guest's MAC the
/// switch knows: the guest cannot send from another address, another port
/// cannot send from the guest's, and frames for the guest reach it alone
/// (its address is pinned, never learned elsewhere).
#[test]
fn a_vm_port_given_its_guest_s_mac_is_locked_to_it() {
    const VM: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0x01];
    const THIEF: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0x66];
    let frame = |dst: [u8; 6], src: [u8; 6], tag: u8| {
        let mut f = dst.to_vec();
        f.extend_from_slice(&src);
        f.extend_from_slice(&[0x88, 0xb5, tag]);
        f.resize(60, 0);
        f
    };
    let d = dir("locked");
    let mut sw = common::switch();
    let mut c = vswitch::ports::vhost::Config::new("vm", &d.join("vm.sock"));
    c.mac = Some(VM);
    assert!(c.port_security, "on by default");
    let vm_idx = sw
        .add_port(Box::new(vswitch::VhostPort::bind(c).expect("bind")))
        .expect("add");
    let thief_idx = add_vport(&mut sw, &d, "thief", Mode::Csb, 0);
    let cap = sw
        .add_port(Box::new(CapturePort::new("capture")))
        .expect("add");
    let mut vm = TestGuest::attach(&mut sw, &d.join("vm.sock"), 64).expect("vm");
    let mut thief = TestGuest::attach(&mut sw, &d.join("thief.sock"), 64).expect("thief");
    settle(&mut sw);
    vm.post_rx(32);
    thief.post_rx(32);
    settle(&mut sw);
    let spoofed = |sw: &mut EventLoop, i: u16| sw.port_mut(i).expect("port").counters().spoofed;
    // The thief sends from the guest's address: dropped, counted.
    thief.send_frame(&frame([0xff; 6], VM, 1));
    settle(&mut sw);
    assert!(capture(&mut sw, cap).frames.is_empty());
    assert!(vm.received().is_empty());
    assert_eq!(spoofed(&mut sw, thief_idx), 1);
    // A frame for the guest reaches it alone, not flooded.
    thief.send_frame(&frame(VM, THIEF, 2));
    settle(&mut sw);
    let got = vm.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0][14], 2);
    assert!(capture(&mut sw, cap).frames.is_empty(), "flooded");
    // The guest sending from another address: dropped, counted.
    vm.send_frame(&frame([0xff; 6], THIEF, 3));
    settle(&mut sw);
    assert!(capture(&mut sw, cap).frames.is_empty());
    assert_eq!(spoofed(&mut sw, vm_idx), 1);
    // From its own: delivered.
    vm.send_frame(&frame([0xff; 6], VM, 4));
    settle(&mut sw);
    assert_eq!(capture(&mut sw, cap).frames.len(), 1);
    assert_eq!(sw.stats.spoofed, 2);
    let _ = std::fs::remove_dir_all(&d);
}
