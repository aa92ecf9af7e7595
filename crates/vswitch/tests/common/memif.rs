//! A memif client written from the protocol (version 2.0): the messages,
//! the shared memory and the handshake, for the tests that attach over
//! memif.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use ring::control::{recv_msg, send_msg, Conn};

/// A ring's bytes: header and 256 descriptors.
pub const RING_BYTES: usize = 128 + 16 * 256;

/// A memfd of `size` bytes, sealed against shrinking or not.
pub fn memfd(size: usize, seal: bool) -> OwnedFd {
    // SAFETY: memfd_create with a NUL-terminated literal name.
    let fd = unsafe {
        libc::memfd_create(
            c"evil".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    assert!(fd >= 0);
    // SAFETY: fd is a fresh descriptor from memfd_create, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on a memfd we own.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) }, 0);
    if seal {
        // SAFETY: fcntl on a memfd we own.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
    }
    fd
}

/// An eventfd.
pub fn eventfd() -> OwnedFd {
    // SAFETY: eventfd returns a fresh descriptor, owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC)) }
}

/// A message of type `ty`, its fields filled by `fill`.
pub fn msg(ty: u16, fill: impl FnOnce(&mut [u8; 128])) -> [u8; 128] {
    let mut m = [0u8; 128];
    m[..2].copy_from_slice(&ty.to_le_bytes());
    fill(&mut m);
    m
}

/// Run the client side of the handshake; returns the last reply type.
pub fn handshake(
    path: &std::path::Path,
    region: OwnedFd,
    size: u64,
    ring_off: [u32; 2],
) -> (Conn, u16) {
    let c = Conn::connect(path).unwrap();
    let (hello, _) = recv_msg(c.fd()).unwrap().unwrap();
    assert_eq!(u16::from_le_bytes([hello[0], hello[1]]), 2, "HELLO first");
    after_hello(c, region, size, ring_off)
}

/// The handshake after the server's `hello`: init, the region, a ring each
/// way, connect; returns the last reply type.
pub fn after_hello(c: Conn, region: OwnedFd, size: u64, ring_off: [u32; 2]) -> (Conn, u16) {
    let reply = |c: &Conn| -> u16 {
        match recv_msg(c.fd()) {
            Ok(Some((m, _))) if m.len() >= 2 => u16::from_le_bytes([m[0], m[1]]),
            _ => 0,
        }
    };
    send_msg(
        c.fd(),
        &msg(3, |m| m[2..4].copy_from_slice(&0x0200u16.to_le_bytes())),
        &[],
    )
    .unwrap();
    assert_eq!(reply(&c), 1, "INIT acked");
    send_msg(
        c.fd(),
        &msg(4, |m| m[4..12].copy_from_slice(&size.to_le_bytes())),
        &[region.as_raw_fd()],
    )
    .unwrap();
    let r = reply(&c);
    if r != 1 {
        return (c, r);
    }
    for (dir, off) in [(1u16, ring_off[0]), (0u16, ring_off[1])] {
        let e = eventfd();
        send_msg(
            c.fd(),
            &msg(5, |m| {
                m[2..4].copy_from_slice(&dir.to_le_bytes());
                m[8..12].copy_from_slice(&off.to_le_bytes());
                m[12] = 8; // 256 descriptors
            }),
            &[e.as_raw_fd()],
        )
        .unwrap();
        let r = reply(&c);
        if r != 1 {
            return (c, r);
        }
    }
    send_msg(c.fd(), &msg(6, |_| ()), &[]).unwrap();
    let r = reply(&c);
    (c, r)
}

/// A well-formed client: a sealed region with both rings' cookies
/// written, through the whole handshake; returns the connection and the
/// last reply's type (7: connected; 8: refused, also in place of the
/// greeting).
pub fn good_client(path: &std::path::Path) -> (Conn, u16) {
    let size = 2 * RING_BYTES + 65536;
    let region = memfd(size, true);
    for off in [0u64, 4352] {
        let cookie = vswitch::ports::memif::COOKIE.to_le_bytes();
        // SAFETY: pwrite of 4 bytes from a live array into a memfd we own.
        let n = unsafe {
            libc::pwrite(
                region.as_raw_fd(),
                cookie.as_ptr().cast(),
                cookie.len(),
                off as libc::off_t,
            )
        };
        assert_eq!(n, 4);
    }
    let c = Conn::connect(path).unwrap();
    let first = match recv_msg(c.fd()) {
        Ok(Some((m, _))) if m.len() >= 2 => u16::from_le_bytes([m[0], m[1]]),
        _ => 0,
    };
    if first != 2 {
        return (c, first);
    }
    after_hello(c, region, size as u64, [0, 4352])
}
