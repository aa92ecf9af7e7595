//! TAP and TUN devices, the one place this workspace opens them.
//!
//! - A [`Tap`] carries Ethernet frames: the kernel path a virtual machine's
//!   NIC backend takes when it is not attached to a software switch (the
//!   paper's TAP backend).
//! - A [`Tun`] carries IP packets: what the backend's GRE decapsulation
//!   agent writes inner packets into, so that the kernel receives them as
//!   if they had arrived on an interface.
//!
//! Both are opened without the packet-information header and brought up.
//! A device disappears when its handle is dropped unless someone else made
//! it persistent.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::fs::{Mode, OFlags};
use rustix::ioctl::{opcode, Opcode, Updater};
use rustix::net::{AddressFamily, SocketFlags, SocketType};

use crate::Hint;

/// `TUNSETIFF`: `_IOW('T', 202, int)` in `linux/if_tun.h` (the kernel reads
/// a whole `struct ifreq` despite the `int` in the encoding).
const TUNSETIFF: Opcode = opcode::write::<libc::c_int>(b'T', 202);
const _: () = assert!(TUNSETIFF as libc::Ioctl == libc::TUNSETIFF);
/// `SIOCGIFFLAGS` (a socket ioctl from before the `_IOC` encoding).
const SIOCGIFFLAGS: Opcode = libc::SIOCGIFFLAGS as Opcode;
/// `SIOCSIFFLAGS`.
const SIOCSIFFLAGS: Opcode = libc::SIOCSIFFLAGS as Opcode;

/// Why a TAP or TUN device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The name cannot be an interface name.
    #[error("interface name {name:?} must be 1 to {} bytes, without NUL", libc::IFNAMSIZ - 1)]
    BadName {
        /// The name asked for.
        name: String,
    },
    /// A system call failed.
    #[error("{kind} {name}: {op}: {source}{}", hint(source))]
    Sys {
        /// "TAP" or "TUN".
        kind: &'static str,
        /// The interface.
        name: String,
        /// What was being done.
        op: &'static str,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
}

/// What to do about a failed system call while opening a device.
fn hint(e: &io::Error) -> Hint {
    Hint(match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => Some("needs root, or CAP_NET_ADMIN"),
        Some(libc::ENOENT) => Some("is /dev/net/tun present?"),
        _ => None,
    })
}

/// The two kinds of device `/dev/net/tun` makes.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Tap,
    Tun,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Tap => "TAP",
            Kind::Tun => "TUN",
        }
    }

    fn flag(self) -> libc::c_int {
        match self {
            Kind::Tap => libc::IFF_TAP,
            Kind::Tun => libc::IFF_TUN,
        }
    }
}

/// An open device of either kind.
#[derive(Debug)]
struct Device {
    fd: OwnedFd,
    name: String,
}

impl Device {
    /// Creates (or attaches to) device `name` of `kind` without the
    /// packet-information header, and brings it up.
    fn open(name: &str, kind: Kind, nonblocking: bool) -> Result<Device, Error> {
        let sys = |op: &'static str| {
            move |e: rustix::io::Errno| Error::Sys {
                kind: kind.name(),
                name: name.to_string(),
                op,
                source: e.into(),
            }
        };
        let mut req = ifreq(name)?;
        let mut flags = OFlags::RDWR | OFlags::CLOEXEC;
        if nonblocking {
            flags |= OFlags::NONBLOCK;
        }
        let fd = rustix::fs::open("/dev/net/tun", flags, Mode::empty())
            .map_err(sys("open /dev/net/tun"))?;
        req.ifr_ifru.ifru_flags = (kind.flag() | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `req`
        // is, and which lives across the call.
        unsafe { rustix::ioctl::ioctl(&fd, Updater::<TUNSETIFF, _>::new(&mut req)) }
            .map_err(sys("TUNSETIFF"))?;
        set_up(&mut req).map_err(|(op, e)| sys(op)(e))?;
        Ok(Device {
            fd,
            name: name.to_string(),
        })
    }

    fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        rustix::io::read(&self.fd, buf).ok().filter(|&n| n > 0)
    }

    fn send(&self, frame: &[u8]) -> bool {
        rustix::io::write(&self.fd, frame) == Ok(frame.len())
    }
}

/// A `struct ifreq` naming interface `name`, everything else zero.
fn ifreq(name: &str) -> Result<libc::ifreq, Error> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(Error::BadName { name: name.into() });
    }
    // SAFETY: ifreq is plain data (bytes, and a union of integers and
    // structs of integers), for which all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(req)
}

/// Sets IFF_UP on the interface `req` names; on failure, says which step
/// failed.
fn set_up(req: &mut libc::ifreq) -> Result<(), (&'static str, rustix::io::Errno)> {
    // Interface flags are set through any socket.
    let s = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| ("socket for ioctl", e))?;
    // SAFETY: SIOCGIFFLAGS reads the name from and writes the flags into a
    // `struct ifreq`, which `req` is, and which lives across the call.
    unsafe { rustix::ioctl::ioctl(&s, Updater::<SIOCGIFFLAGS, _>::new(req)) }
        .map_err(|e| ("SIOCGIFFLAGS", e))?;
    // SAFETY: SIOCGIFFLAGS filled `ifru_flags`; every bit pattern is a
    // valid c_short.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads a `struct ifreq`, which `req` is, and which
    // lives across the call.
    unsafe { rustix::ioctl::ioctl(&s, Updater::<SIOCSIFFLAGS, _>::new(req)) }
        .map_err(|e| ("SIOCSIFFLAGS", e))?;
    Ok(())
}

/// An open TAP device (Ethernet frames, non-blocking).
#[derive(Debug)]
pub struct Tap(Device);

impl Tap {
    /// Creates (or attaches to) TAP device `name`, non-blocking, and brings
    /// it up.
    pub fn open(name: &str) -> Result<Tap, Error> {
        Device::open(name, Kind::Tap, true).map(Tap)
    }

    /// Interface name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The descriptor (for epoll).
    pub fn raw_fd(&self) -> RawFd {
        self.0.fd.as_raw_fd()
    }

    /// Reads one frame; `None` when nothing is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        self.0.recv(buf)
    }

    /// Writes one frame; false if the kernel would not take it now.
    pub fn send(&self, frame: &[u8]) -> bool {
        self.0.send(frame)
    }

    /// Writes one frame given by pointer and length (a frame in shared
    /// memory); false if the kernel would not take it now.
    ///
    /// # Safety
    /// `ptr` must be non-null and readable for `len` bytes, which nobody
    /// writes during the call.
    pub unsafe fn send_raw(&self, ptr: *const u8, len: usize) -> bool {
        // SAFETY: the caller guarantees ptr/len.
        self.send(unsafe { std::slice::from_raw_parts(ptr, len) })
    }
}

impl AsFd for Tap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.fd.as_fd()
    }
}

/// An open TUN device (IP packets, blocking).
#[derive(Debug)]
pub struct Tun(Device);

impl Tun {
    /// Creates (or attaches to) TUN device `name`, blocking, and brings it
    /// up.
    pub fn open(name: &str) -> Result<Tun, Error> {
        Device::open(name, Kind::Tun, false).map(Tun)
    }

    /// Interface name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Reads one packet (waits for one); `None` on failure.
    pub fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        self.0.recv(buf)
    }

    /// Writes one packet into the kernel; false if it was not taken whole.
    pub fn send(&self, packet: &[u8]) -> bool {
        self.0.send(packet)
    }
}

impl AsFd for Tun {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_before_any_system_call() {
        for bad in ["", "0123456789abcdef", "a\0b"] {
            assert!(
                matches!(Tap::open(bad), Err(Error::BadName { .. })),
                "{bad:?}"
            );
            assert!(
                matches!(Tun::open(bad), Err(Error::BadName { .. })),
                "{bad:?}"
            );
        }
    }
}
