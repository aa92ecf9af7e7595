//! Helpers shared by the load balancer's tests.

use maio::{Handle, Pool};
use netio::{Packet, HEADROOM};

/// `frame` in a fresh buffer from `h` (of `pool`) after the headroom, as a
/// receive ring leaves it for the packet thread.
pub fn packet(pool: &Pool, h: &mut Handle, frame: &[u8]) -> Packet {
    let mut b = h.alloc().unwrap();
    pool.data_mut(&mut b)[HEADROOM..HEADROOM + frame.len()].copy_from_slice(frame);
    Packet {
        buf: b,
        off: HEADROOM as u16,
        len: frame.len() as u16,
    }
}
