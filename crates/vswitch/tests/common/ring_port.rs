//! A ring port's driver side as the tests use it: station addresses,
//! sending and receiving frames.

use std::time::{Duration, Instant};

use ring::control::Attached;
use vswitch::pktgen::udp_frame;

/// Station `n`'s address (locally administered, unicast).
pub fn mac(n: u8) -> [u8; 6] {
    [2, 0, 0, 0, 0, n]
}

/// Send `n` frames from station `src` to station `dst` (within 5 s);
/// returns how many went.
pub fn send(p: &mut Attached, n: usize, src: u8, dst: u8) -> usize {
    let f = udp_frame(60, mac(src), mac(dst));
    let mut sent = 0;
    let end = Instant::now() + Duration::from_secs(5);
    while sent < n && Instant::now() < end {
        let k = p.driver.send(n - sent, |_, b| {
            b[..60].copy_from_slice(&f);
            60
        });
        if k == 0 {
            p.driver.wait_tx(Duration::from_millis(5));
        }
        sent += k;
    }
    p.driver.flush(Duration::from_secs(2));
    sent
}

/// Receive until `n` frames came or `quiet` passes with nothing new.
pub fn recv(p: &mut Attached, n: usize, quiet: Duration) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut last = Instant::now();
    while got.len() < n && last.elapsed() < quiet {
        let k = p.driver.recv(256, |f| got.push(f.to_vec()));
        if k > 0 {
            last = Instant::now();
        } else {
            p.driver.wait_rx(Duration::from_millis(2));
        }
    }
    got
}
