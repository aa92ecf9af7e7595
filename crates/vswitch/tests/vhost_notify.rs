//! The notification schemes on a vhost-user port, seen from a frontend of
//! our own: where the device asks the guest to kick (`avail_event`), when it
//! calls (the guest's `used_event`), and moderation holding calls.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::frontend::TestGuest;
use common::{add_vport, settle, vport, SinkPort};
use ring::device::FrameRef;
use ring::Mode;
use vswitch::ports::vhost::datapath::{RXQ, TXQ, TX_CALL_HOLD, TX_CALL_HOLD_MAX};
use vswitch::{EventLoop, Port};

const NUM: u16 = 64;

fn setup(name: &str, mode: Mode, itr: u32) -> (std::path::PathBuf, EventLoop, TestGuest) {
    let d = common::dir(&format!("notify-{name}"));
    let mut sw = common::switch();
    add_vport(&mut sw, &d, "vm", mode, itr);
    sw.add_port(Box::new(SinkPort::new("sink"))).expect("add");
    let g = TestGuest::attach(&mut sw, &d.join("vm.sock"), NUM).expect("attach");
    settle(&mut sw);
    (d, sw, g)
}

fn avail_event(g: &TestGuest, q: usize) -> u16 {
    g.mem.r16(g.q[q].used + 4 + 8 * u64::from(g.q[q].num))
}

fn set_used_event(g: &TestGuest, q: usize, v: u16) {
    g.mem.w16(g.q[q].avail + 4 + 2 * u64::from(g.q[q].num), v);
}

fn frame() -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x99, 0x02, 0, 0, 0, 0, 0x01, 0x88, 0xb5];
    f.resize(60, 0);
    f
}

fn cleanup(d: &Path) {
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn csb_asks_for_no_kick_while_polling_and_one_before_sleeping() {
    let (d, mut sw, mut g) = setup("csb-kicks", Mode::Csb, 0);
    // The switch woke up (kicks are asked for until it has).
    vport(&mut sw, 0).wake();
    for _ in 0..5 {
        g.send_frame(&frame());
    }
    settle(&mut sw);
    // Polling: avail_event half the index space from what was consumed: no
    // batch the guest publishes crosses it.
    assert_eq!(avail_event(&g, TXQ), 5 + 0x8000, "transmit: consumed 5");
    // About to sleep: at the guest's index, so its next entry kicks.
    assert!(vport(&mut sw, 0).prepare_sleep());
    assert_eq!(avail_event(&g, TXQ), 5);
    vport(&mut sw, 0).wake();
    assert_eq!(avail_event(&g, TXQ), 5 + 0x8000);
    // Receive buffers never ask for a kick: the switch looks for them when
    // it has frames.
    g.post_rx(8);
    let from: Vec<u8> = {
        let mut f = vec![0x02, 0, 0, 0, 0, 0x01];
        f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x77, 0x88, 0xb5]);
        f.resize(60, 0);
        f
    };
    let fr = FrameRef {
        ptr: from.as_ptr(),
        len: from.len() as u32,
    };
    let p = vport(&mut sw, 0);
    // SAFETY: fr points at a live Vec of its length.
    assert_eq!(unsafe { p.tx_batch(&[fr, fr, fr]) }, 3);
    p.tx_flush(Instant::now());
    assert_eq!(avail_event(&g, RXQ), 3 + 0x8000, "receive: consumed 3");
    assert_eq!(g.received().len(), 3);
    cleanup(&d);
}

#[test]
fn base_asks_for_a_kick_at_every_publish_and_calls_every_time() {
    let (d, mut sw, mut g) = setup("base", Mode::Base, 0);
    set_used_event(&g, TXQ, 1000);
    let c0 = vport(&mut sw, 0).queue_stats()[TXQ].calls;
    for i in 0..4u16 {
        g.send_frame(&frame());
        settle(&mut sw);
        assert_eq!(avail_event(&g, TXQ), i + 1, "kick asked at the next entry");
    }
    let c1 = vport(&mut sw, 0).queue_stats()[TXQ].calls;
    assert_eq!(c1 - c0, 4, "a call per publish whatever used_event says");
    assert_eq!(g.call[TXQ].drain(), 4);
    cleanup(&d);
}

/// Let a held transmit-completion call come due, and fire it.
fn pause(sw: &mut EventLoop) {
    std::thread::sleep(TX_CALL_HOLD + Duration::from_micros(50));
    settle(sw);
}

#[test]
fn csb_calls_only_when_the_used_index_crosses_used_event() {
    let (d, mut sw, mut g) = setup("csb-calls", Mode::Csb, 0);
    // First publish after start always calls (no window known yet), once
    // the guest pauses.
    g.send_frame(&frame());
    settle(&mut sw);
    pause(&mut sw);
    assert_eq!(g.call[TXQ].drain(), 1);
    // The guest asks to be woken when entry 5 is used (used_event 5: call
    // when the used index passes 5).
    set_used_event(&g, TXQ, 5);
    let mut calls = Vec::new();
    for _ in 0..8 {
        g.send_frame(&frame());
        settle(&mut sw);
        pause(&mut sw);
        calls.push(g.call[TXQ].drain());
    }
    // Used index goes 2, 3, ..., 9: it crosses 5 going from 5 to 6.
    assert_eq!(
        calls,
        vec![0, 0, 0, 0, 1, 0, 0, 0],
        "one call, at the crossing"
    );
    let st = vport(&mut sw, 0).queue_stats()[TXQ];
    assert_eq!(st.calls_suppressed, 7);
    cleanup(&d);
}

#[test]
fn moderation_holds_calls_and_the_timer_fires_one() {
    // itr 4000 x 250 ns = 1 ms.
    let (d, mut sw, mut g) = setup("itr", Mode::Base, 4000);
    g.send_frame(&frame());
    settle(&mut sw);
    assert_eq!(g.call[TXQ].drain(), 1, "the first call goes at once");
    for _ in 0..5 {
        g.send_frame(&frame());
        settle(&mut sw);
    }
    assert_eq!(g.call[TXQ].drain(), 0, "held inside the interval");
    let due = vport(&mut sw, 0).deadline().expect("a held call");
    assert!(due <= Instant::now() + Duration::from_millis(1));
    std::thread::sleep(Duration::from_millis(2));
    settle(&mut sw);
    assert_eq!(g.call[TXQ].drain(), 1, "one call for the five publishes");
    let st = vport(&mut sw, 0).queue_stats()[TXQ];
    assert_eq!((st.calls, st.calls_held), (2, 5));
    cleanup(&d);
}

#[test]
fn transmit_completion_calls_wait_for_the_guest_to_pause() {
    let (d, mut sw, mut g) = setup("tx-hold", Mode::Csb, 0);
    // The guest asks for a call at every completion (used_event at the
    // index it has seen), as Linux does when little is in flight.
    let mut held = 0;
    for i in 0..10u16 {
        set_used_event(&g, TXQ, i);
        g.send_frame(&frame());
        settle(&mut sw);
        held += g.call[TXQ].drain();
    }
    // Back to back (well inside the hold): no interrupt while it sends,
    // unless the machine stalled the test past the hold.
    let st = vport(&mut sw, 0).queue_stats()[TXQ];
    assert!(held <= 2, "{held} calls while the guest sent");
    assert!(st.calls_held >= 8, "{st:?}");
    // It pauses: one call, whatever it missed.
    let due = vport(&mut sw, 0).deadline().expect("a held call");
    assert!(due <= Instant::now() + TX_CALL_HOLD);
    pause(&mut sw);
    assert_eq!(g.call[TXQ].drain(), 1, "one call once the guest paused");
    assert_eq!(vport(&mut sw, 0).deadline(), None);
    // A guest that never pauses still gets its completions, at least once
    // per TX_CALL_HOLD_MAX: 20 frames over four times that long.
    let t = Instant::now();
    let mut calls = 0;
    let mut frames = 0u16;
    while t.elapsed() < 4 * TX_CALL_HOLD_MAX {
        set_used_event(&g, TXQ, 10 + frames);
        g.send_frame(&frame());
        frames += 1;
        settle(&mut sw);
        calls += g.call[TXQ].drain();
        std::thread::sleep(TX_CALL_HOLD_MAX / 10);
    }
    pause(&mut sw);
    calls += g.call[TXQ].drain();
    assert!(
        calls >= 2 && calls <= u64::from(frames),
        "{calls} calls for {frames} frames"
    );
    cleanup(&d);
}

#[test]
fn receive_calls_and_base_mode_are_not_held() {
    // Base: a call at every publish, at once.
    let (d, mut sw, mut g) = setup("tx-hold-base", Mode::Base, 0);
    g.send_frame(&frame());
    settle(&mut sw);
    assert_eq!(g.call[TXQ].drain(), 1);
    cleanup(&d);
    // Csb receive queue: the call goes with the publish.
    let (d, mut sw, mut g) = setup("rx-no-hold", Mode::Csb, 0);
    g.post_rx(4);
    let f = frame();
    let fr = FrameRef {
        ptr: f.as_ptr(),
        len: f.len() as u32,
    };
    let p = vport(&mut sw, 0);
    // SAFETY: fr points at a live Vec of its length.
    assert_eq!(unsafe { p.tx_batch(&[fr]) }, 1);
    p.tx_flush(Instant::now());
    assert_eq!(g.call[RXQ].drain(), 1);
    cleanup(&d);
}
