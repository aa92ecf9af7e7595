//! The adaptive polling window seen from a guest: a frontend of our own
//! (`vhost-peer`) sends one frame every few hundred microseconds to a
//! switch running on its own thread, and kicks only where the device's
//! `avail_event` says it must (as a virtio driver with `EVENT_IDX` does).
//! Once the port's window has learned the gaps, the switch keeps polling
//! through them and asks for no kicks; with windows off (`poll_us` alone,
//! shorter than the gaps) it sleeps between frames and asks for a kick at
//! nearly every one. When the frames stop, the switch asks for kicks and
//! sleeps: its passes stop.
//!
//! What is counted is the ring state the guest reads (whether publishing
//! the next entry crosses `avail_event`), not time; the gaps are ten to a
//! hundred times shorter than the window, so a loaded machine's late
//! wake-ups do not change the outcome.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use common::SinkPort;
use vhost_peer::{Guest, Layout, RawDesc, BUF, HDR, MEM, REPLY_TIMEOUT, TX_BUFS};
use vswitch::ports::vhost::datapath::{need_event, TXQ};
use vswitch::ports::vhost::Config as VhostConfig;
use vswitch::{Config, Switch};

const NUM: u16 = 256;
/// The gap between frames.
const GAP: Duration = Duration::from_micros(200);
/// The longest window: ten gaps and more, so that a late sender thread on
/// a loaded machine is still inside it.
const MAX_WINDOW_US: u64 = 5000;

fn avail_event(g: &Guest) -> u16 {
    g.mem.r16(g.q[TXQ].used + 4 + 8 * u64::from(g.q[TXQ].num))
}

fn used_idx(g: &Guest) -> u16 {
    g.mem.r16(g.q[TXQ].used + 2)
}

/// Publish one frame on the transmit queue and kick only if the device
/// asked for it (publishing crosses `avail_event`); returns whether it
/// kicked.
fn send(g: &mut Guest) -> bool {
    let l = g.q[TXQ];
    let old = g.avail_idx[TXQ];
    let slot = old % l.num;
    let off = TX_BUFS + u64::from(slot) * BUF;
    let mut frame = vec![0x02, 0, 0, 0, 0, 0x99, 0x02, 0, 0, 0, 0, 0x01, 0x88, 0xb5];
    frame.resize(60, 0);
    g.mem.write(off, &[0u8; HDR as usize]);
    g.mem.write(off + HDR, &frame);
    g.put_desc(
        TXQ,
        slot,
        RawDesc {
            addr: g.mem.gpa + off,
            len: HDR as u32 + frame.len() as u32,
            flags: 0,
            next: 0,
        },
    );
    g.push_avail(TXQ, 0, slot);
    let new = old.wrapping_add(1);
    g.avail_idx[TXQ] = new;
    g.mem.w16(l.avail + 2, new);
    // virtio: the index is visible before the device's request is read.
    fence(Ordering::SeqCst);
    let kick = need_event(avail_event(g), new, old);
    if kick {
        g.kick[TXQ].signal();
    }
    kick
}

fn status(ctl: &Path) -> vswitch::Status {
    vswitch::status::ask(ctl).expect("status")
}

struct Run {
    /// Kicks the guest made while sending paced frames, after learning.
    kicks: u64,
    frames: u64,
    /// Whether the switch asked for a kick once the frames stopped (in most
    /// of the samples taken while it was idle).
    kick_asked_when_idle: bool,
    /// Passes the switch made in 300 ms once idle.
    idle_passes: u64,
    window_us: u64,
    sleeps_while_sending: u64,
}

/// A switch with windows up to `max_window_us` (at or below `poll_us`:
/// off) and a guest sending paced frames to it.
fn run(tag: &str, max_window_us: u64) -> Run {
    let d = common::dir(&format!("poll-{tag}"));
    let ctl = d.join("ctl.sock");
    let vm = d.join("vm.sock");
    let mut sw = Switch::new(Config {
        socket: Some(ctl.clone()),
        max_macs: 0,
        log_ports: false,
        poll_us: 20,
        poll_max_us: max_window_us,
        poll_budget_pct: 10,
        vhost_user: vec![VhostConfig::new("vm", &vm)],
        ..Config::default()
    })
    .expect("switch");
    sw.add_port(Box::new(SinkPort::new("sink"))).expect("sink");
    let (stop, h) = vswitch::spawn(sw).expect("event loop");
    let _stop = StopOnDrop(Some((stop, h)), d.clone());
    let q = [Layout::standard(0, NUM), Layout::standard(1, NUM)];
    let mut g = Guest::attach(&vm, MEM, q, REPLY_TIMEOUT).expect("attach");
    // The first frame kicks (the switch sleeps); wait until it is taken,
    // so that the queues run.
    let deadline = Instant::now() + Duration::from_secs(10);
    send(&mut g);
    g.kick[TXQ].signal();
    while used_idx(&g) != 1 {
        assert!(Instant::now() < deadline, "the switch never took a frame");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Learn: a few hundred gaps.
    for _ in 0..300 {
        std::thread::sleep(GAP);
        send(&mut g);
    }
    let sleeps0 = status(&ctl).switch.sleeps;
    let mut kicks = 0u64;
    let frames = 1000u64;
    for _ in 0..frames {
        std::thread::sleep(GAP);
        kicks += u64::from(send(&mut g));
    }
    let s = status(&ctl);
    let sleeps_while_sending = s.switch.sleeps - sleeps0;
    let window_us = s
        .ports
        .iter()
        .find(|p| p.name == "vm")
        .and_then(|p| p.polling.as_ref())
        .map_or(0, |w| w.window_us);
    // Every frame was taken.
    let want = g.avail_idx[TXQ];
    while used_idx(&g) != want {
        assert!(
            Instant::now() < deadline + Duration::from_secs(20),
            "frames left"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Idle: after the window and the floor, kicks are asked for (the next
    // entry crosses avail_event) and the switch sleeps. It still wakes for
    // its timers (every 100 ms at most) and polls its floor each time with
    // kicks off, as it does after any wake-up; so the request is sampled
    // over a while, not read once: a single read that fell into such a
    // wake-up (longer on a loaded machine, where the switch's thread can
    // be preempted while awake) saw no request, and the test failed.
    std::thread::sleep(Duration::from_millis(100));
    let idx = g.avail_idx[TXQ];
    let samples = 50;
    let asked = (0..samples)
        .filter(|_| {
            std::thread::sleep(Duration::from_millis(2));
            need_event(avail_event(&g), idx.wrapping_add(1), idx)
        })
        .count();
    // Asleep most of the time, so asking for kicks most of the time; a
    // switch that never (or seldom) asks would leave a guest's next frame
    // unkicked.
    let kick_asked_when_idle = asked * 2 > samples;
    eprintln!("{tag}: kicks asked in {asked} of {samples} idle samples");
    let p0 = status(&ctl).switch.passes;
    std::thread::sleep(Duration::from_millis(300));
    let idle_passes = status(&ctl).switch.passes - p0;
    eprintln!(
        "{tag}: {kicks} kicks for {frames} frames, window {window_us} us, \
         {sleeps_while_sending} sleeps while sending, {idle_passes} passes idle"
    );
    Run {
        kicks,
        frames,
        kick_asked_when_idle,
        idle_passes,
        window_us,
        sleeps_while_sending,
    }
}

/// Stops the switch's thread (by its flag) and removes the socket
/// directory, also when an assertion fails.
struct StopOnDrop(
    Option<(
        std::sync::Arc<std::sync::atomic::AtomicBool>,
        std::thread::JoinHandle<Switch>,
    )>,
    PathBuf,
);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some((stop, h)) = self.0.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = h.join();
        }
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

#[test]
fn a_paced_guest_is_asked_for_no_kicks_once_the_window_learned_and_an_idle_switch_sleeps() {
    let r = run("adaptive", MAX_WINDOW_US);
    assert!(
        r.kicks * 20 <= r.frames,
        "{} kicks for {} frames sent {GAP:?} apart (window {} us, {} sleeps)",
        r.kicks,
        r.frames,
        r.window_us,
        r.sleeps_while_sending
    );
    assert!(
        r.window_us >= 256 && r.window_us <= MAX_WINDOW_US,
        "window {} us for gaps of {GAP:?}",
        r.window_us
    );
    assert!(
        r.kick_asked_when_idle,
        "idle, the switch must ask for kicks"
    );
    // Asleep, the switch wakes for its timers and the status requests
    // (100 ms apart at most), not thousands of times.
    assert!(
        r.idle_passes < 200,
        "{} passes in 300 ms idle",
        r.idle_passes
    );
}

#[test]
fn with_windows_off_the_same_guest_kicks_for_most_frames() {
    // poll_max_us at poll_us: the fixed 20 µs of polling, shorter than the
    // gaps; the switch sleeps between frames and the guest kicks.
    let r = run("fixed", 20);
    assert_eq!(r.window_us, 0);
    assert!(
        r.kicks * 2 >= r.frames,
        "{} kicks for {} frames",
        r.kicks,
        r.frames
    );
    assert!(r.kick_asked_when_idle);
    assert!(
        r.idle_passes < 200,
        "{} passes in 300 ms idle",
        r.idle_passes
    );
}
