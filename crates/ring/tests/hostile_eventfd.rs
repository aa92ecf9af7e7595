//! A peer that shares an eventfd with the switch cannot make the switch's
//! calls on it block.
//!
//! Written from eventfd(2): the counter is a u64 whose largest value is
//! 2^64-2; `write` blocks while adding would pass it, `read` blocks while it
//! is 0, unless the *open file description* has `O_NONBLOCK`, which is
//! shared by every descriptor that came from the same `eventfd()` call
//! (dup, SCM_RIGHTS). The peer here holds such a descriptor, as QEMU holds
//! the call fd of a vhost-user queue, and does what the man page allows.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use ring::EventFd;
use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};

const FULL: u64 = 0xffff_ffff_ffff_fffe;

fn set_blocking(fd: &OwnedFd, blocking: bool) {
    let fl = fcntl_getfl(fd).expect("getfl");
    let fl = if blocking {
        fl - OFlags::NONBLOCK
    } else {
        fl | OFlags::NONBLOCK
    };
    fcntl_setfl(fd, fl).expect("setfl");
}

/// The peer's write, made without blocking the test itself.
fn peer_write(fd: &OwnedFd, v: u64) -> bool {
    let fl = fcntl_getfl(fd).expect("getfl");
    set_blocking(fd, false);
    let ok = rustix::io::write(fd, &v.to_ne_bytes()).is_ok();
    fcntl_setfl(fd, fl).expect("restore flags");
    ok
}

fn peer_read(fd: &OwnedFd) -> u64 {
    let fl = fcntl_getfl(fd).expect("getfl");
    set_blocking(fd, false);
    let mut b = [0u8; 8];
    let v = match rustix::io::read(fd, &mut b) {
        Ok(8) => u64::from_ne_bytes(b),
        _ => 0,
    };
    fcntl_setfl(fd, fl).expect("restore flags");
    v
}

/// Runs `f` on another thread and fails the test if it has not returned
/// within `limit` (a call that blocks for ever would otherwise hang the
/// test run instead of failing it).
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(_) => {
            panic!("{what} did not return within {limit:?}: it blocked on the peer's descriptor")
        }
    }
}

#[test]
fn a_full_counter_on_a_line_made_blocking_does_not_block_signal() {
    let line = EventFd::new().expect("eventfd");
    let peer = line.dup().expect("dup");
    set_blocking(&peer, true);
    assert!(peer_write(&peer, FULL), "peer fills the counter");

    let (line, stats) = within(Duration::from_secs(5), "signal", move || {
        let t = Instant::now();
        for _ in 0..1000 {
            line.signal();
        }
        (line, t.elapsed())
    });
    assert!(
        stats < Duration::from_secs(2),
        "1000 signals took {stats:?}"
    );
    let s = line.stats();
    assert_eq!(
        s.raised + s.in_flight + s.held + s.failed,
        1000,
        "every signal accounted: {s:?}"
    );
    assert_eq!(s.in_flight, 1, "one write in flight at most: {s:?}");
    assert_eq!(s.raised, 0, "{s:?}");
    assert_eq!(s.deferred, 1, "the write waits for the peer: {s:?}");
    assert_eq!(s.held, 999, "{s:?}");

    // The peer reads its counter: the write that waited completes, and the
    // line raises again.
    assert_eq!(peer_read(&peer), FULL);
    let t = Instant::now();
    while line.stats().raised < 2 && t.elapsed() < Duration::from_secs(5) {
        line.signal();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        line.stats().raised >= 2,
        "the line raises again once read: {:?}",
        line.stats()
    );
    assert!(
        peer_read(&peer) >= 2,
        "the waiting write and the new one arrived"
    );
}

#[test]
fn draining_an_empty_line_made_blocking_does_not_block() {
    let line = EventFd::new().expect("eventfd");
    let peer = line.dup().expect("dup");
    set_blocking(&peer, true);
    let (line, got) = within(Duration::from_secs(5), "drain", move || {
        let got = line.drain();
        (line, got)
    });
    assert_eq!(got, 0);
    assert!(peer_write(&peer, 3));
    assert_eq!(line.drain(), 3);
    let got = within(Duration::from_secs(5), "wait", move || {
        line.wait(Duration::from_millis(5))
    });
    assert_eq!(got, 0);
}

#[test]
fn dropping_a_line_with_a_write_in_flight_cancels_it() {
    let line = EventFd::new().expect("eventfd");
    let peer = line.dup().expect("dup");
    set_blocking(&peer, true);
    assert!(peer_write(&peer, FULL));
    line.signal();
    assert_eq!(line.stats().deferred, 1);
    drop(line);
    // The cancelled write never lands: once the peer reads, the counter
    // stays empty.
    assert_eq!(peer_read(&peer), FULL);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(peer_read(&peer), 0, "a cancelled write arrived");
}

/// What the peer does between two of the switch's calls.
#[derive(Clone, Debug)]
enum Peer {
    Blocking(bool),
    Write(u64),
    Read,
}

fn peer_step() -> impl Strategy<Value = Peer> {
    prop_oneof![
        any::<bool>().prop_map(Peer::Blocking),
        prop_oneof![Just(FULL), Just(FULL - 1), Just(1u64), any::<u64>()].prop_map(Peer::Write),
        Just(Peer::Read),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever the peer does to the shared line, every signal and drain of
    /// the switch returns at once and every signal is accounted for.
    #[test]
    fn no_peer_sequence_blocks_the_switch(steps in proptest::collection::vec((peer_step(), any::<bool>()), 1..40)) {
        let line = EventFd::new().expect("eventfd");
        let peer = line.dup().expect("dup");
        let n = steps.len() as u64;
        let signals = steps.iter().filter(|(_, s)| *s).count() as u64;
        let line = within(Duration::from_secs(10), "the switch's calls", move || {
            for (step, signal) in steps {
                match step {
                    Peer::Blocking(b) => set_blocking(&peer, b),
                    Peer::Write(v) => { peer_write(&peer, v); }
                    Peer::Read => { peer_read(&peer); }
                }
                if signal { line.signal(); } else { line.drain(); }
            }
            // The peer's descriptor goes (it detached); a write still in
            // flight is the line's to cancel.
            set_blocking(&peer, false);
            line
        });
        let s = line.stats();
        prop_assert_eq!(s.raised + s.in_flight + s.held + s.failed, signals, "{:?} over {} steps", s, n);
        prop_assert!(s.deferred <= s.raised + s.in_flight + s.failed);
        let _ = line.as_fd();
    }
}
