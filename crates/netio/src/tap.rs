//! TAP devices: the kernel path a virtual machine's NIC backend takes when it
//! is not attached to a software switch (the paper's TAP backend).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An open TAP device (frames without the packet-information header).
/// The device disappears when this is dropped unless it was made persistent
/// by someone else.
#[derive(Debug)]
pub struct Tap {
    fd: OwnedFd,
    name: String,
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

impl Tap {
    /// Create (or attach to) TAP device `name`, non-blocking, and bring it up.
    pub fn open(name: &str) -> std::io::Result<Tap> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "interface name {name:?} must be 1..{} bytes",
                    libc::IFNAMSIZ
                ),
            ));
        }
        // SAFETY: open(2) of a fixed NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ifreq is plain data; the name fits (checked above).
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF takes a pointer to a live ifreq.
        if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut ifr) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        set_up(name)?;
        Ok(Tap {
            fd,
            name: name.to_string(),
        })
    }

    /// Interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The descriptor (for epoll).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Read one frame; `None` when nothing is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: reads at most buf.len() bytes into buf.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr() as *mut _, buf.len()) };
        (n > 0).then_some(n as usize)
    }

    /// Write one frame; false if the kernel would not take it now.
    ///
    /// # Safety
    /// `ptr` must be readable for `len` bytes.
    pub unsafe fn send_raw(&self, ptr: *const u8, len: usize) -> bool {
        // SAFETY: the caller guarantees ptr/len.
        unsafe { libc::write(self.fd.as_raw_fd(), ptr as *const _, len) == len as isize }
    }
}

/// Set IFF_UP on an interface.
fn set_up(name: &str) -> std::io::Result<()> {
    // SAFETY: a datagram socket only to carry the ioctl.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: ifreq is plain data.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, c) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = c as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS / SIOCSIFFLAGS with a live ifreq naming the device.
    unsafe {
        if libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &mut ifr) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
