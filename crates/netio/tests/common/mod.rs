//! Helpers shared by the port tests: frames, slots, and send/receive loops
//! bounded in time.
#![allow(dead_code)]

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use maio::Pool;
use netio::{Nic, Slot};
use packet::build::Frame;

/// `n` UDP frames 10.9.0.1 -> 10.9.0.2, source ports from `sport_base`.
pub fn frames(n: u16, sport_base: u16) -> Vec<Vec<u8>> {
    let (s, d): (IpAddr, IpAddr) = ("10.9.0.1".parse().unwrap(), "10.9.0.2".parse().unwrap());
    (0..n)
        .map(|i| Frame::udp(s, d, sport_base + i, 9, &i.to_be_bytes()).to_bytes())
        .collect()
}

/// Pool buffers holding `fr`, as slots.
pub fn slots_with(pool: &Pool, h: &mut maio::Handle, fr: &[Vec<u8>]) -> Vec<Slot> {
    fr.iter()
        .map(|f| {
            let mut b = h.alloc().unwrap();
            pool.data_mut(&mut b)[128..128 + f.len()].copy_from_slice(f);
            Slot {
                buf: Some(b),
                off: 128,
                len: f.len() as u16,
            }
        })
        .collect()
}

/// Transmits every slot (5 s at most).
pub fn send_all(port: &mut dyn Nic, pool: &Pool, slots: &[Slot]) {
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while sent < slots.len() && Instant::now() < deadline {
        sent += port.transmit(pool, &slots[sent..]).unwrap();
    }
    assert_eq!(sent, slots.len());
}

/// One receive call into 32 fresh buffers: the frames of `ours` that came
/// (waits briefly if the port had nothing).
pub fn receive_batch(
    port: &mut dyn Nic,
    pool: &Pool,
    h: &mut maio::Handle,
    ours: &HashSet<Vec<u8>>,
) -> Vec<Vec<u8>> {
    let mut slots: Vec<Slot> = (0..32)
        .map(|_| Slot {
            buf: Some(h.alloc().unwrap()),
            off: 0,
            len: 0,
        })
        .collect();
    let n = port.receive(pool, &mut slots).unwrap();
    let mut got = Vec::new();
    for s in slots.iter_mut() {
        let f = s.frame(pool).to_vec();
        let filled = s.len > 0;
        h.free(s.buf.take().unwrap()).unwrap();
        if filled && ours.contains(&f) {
            got.push(f);
        }
    }
    if n == 0 {
        port.wait(10);
    }
    got
}

/// Receives until every frame of `ours` arrived (5 s at most).
pub fn receive_all(
    port: &mut dyn Nic,
    pool: &Pool,
    h: &mut maio::Handle,
    ours: &HashSet<Vec<u8>>,
) -> HashSet<Vec<u8>> {
    let mut got = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < ours.len() && Instant::now() < deadline {
        got.extend(receive_batch(port, pool, h, ours));
    }
    got
}

/// Returns the slots' buffers to the pool.
pub fn free_slots(h: &mut maio::Handle, slots: Vec<Slot>) {
    for mut s in slots {
        if let Some(b) = s.buf.take() {
            h.free(b).unwrap();
        }
    }
}

/// `wait` on an idle port sleeps and wakes for a frame: with nothing
/// coming it returns after its timeout, not at once (so an idle datapath
/// sleeps instead of spinning); with a frame sent by `send` on another
/// thread 100 ms into a long wait, it returns soon after the frame, which
/// is then received. `ours` is what `send` sends.
pub fn wait_sleeps_until_a_frame(
    port: &mut dyn Nic,
    pool: &Pool,
    ours: &HashSet<Vec<u8>>,
    send: impl FnOnce() + Send + 'static,
) {
    let t = Instant::now();
    port.wait(200);
    let slept = t.elapsed();
    assert!(
        slept >= Duration::from_millis(150),
        "wait(200) on an idle port returned after {slept:?}"
    );
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        send();
    });
    let t = Instant::now();
    port.wait(5_000);
    let woke = t.elapsed();
    sender.join().unwrap();
    assert!(
        woke >= Duration::from_millis(90) && woke < Duration::from_millis(2_000),
        "wait(5000) returned after {woke:?} for a frame sent after 100 ms"
    );
    let mut h = pool.handle();
    let got = receive_all(port, pool, &mut h, ours);
    assert_eq!(
        got.len(),
        ours.len(),
        "the frame that woke the wait arrives"
    );
}
