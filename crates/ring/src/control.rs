//! The attach protocol: how a process gets a switch port.
//!
//! The switch listens on a Unix `SOCK_SEQPACKET` socket. A client sends one
//! JSON request per packet; the reply is one JSON packet, and an `attach`
//! reply carries three descriptors (region, kick, interrupt) as
//! `SCM_RIGHTS`. The attaching connection stays open for the life of the
//! port: closing it (or dying) detaches the port.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::driver::Driver;
use crate::{sys, Error, Geometry, Mode, Result};

/// Largest control message.
pub const MAX_MSG: usize = 64 * 1024;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AttachRequest {
    /// Port name (unique on the switch).
    pub name: String,
    pub mode: Mode,
    /// Interrupt moderation interval in 250 ns units (0: none).
    #[serde(default)]
    pub itr: u32,
    #[serde(default = "default_slots")]
    pub slots: u32,
    #[serde(default = "default_buf")]
    pub buf_size: u32,
}

fn default_slots() -> u32 {
    Geometry::default().slots
}
fn default_buf() -> u32 {
    Geometry::default().buf_size
}

impl AttachRequest {
    pub fn geometry(&self) -> Geometry {
        Geometry {
            slots: self.slots,
            buf_size: self.buf_size,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Request {
    Attach(AttachRequest),
    Status,
}

/// A connected control socket.
pub struct Conn(OwnedFd);

impl Conn {
    pub fn connect(path: &Path) -> Result<Conn> {
        let fd = seqpacket()?;
        let (addr, len) = sockaddr(path)?;
        // SAFETY: addr is a valid sockaddr_un of length len.
        let r = unsafe { libc::connect(fd.as_raw_fd(), &addr as *const _ as *const _, len) };
        if r < 0 {
            return Err(Error::Sys {
                what: "connect to switch control socket",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Conn(fd))
    }

    pub fn from_fd(fd: OwnedFd) -> Conn {
        Conn(fd)
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// The connected socket itself.
    pub fn into_fd(self) -> OwnedFd {
        self.0
    }

    pub fn send(&self, msg: &[u8], fds: &[RawFd]) -> Result<()> {
        send_msg(self.0.as_raw_fd(), msg, fds)
    }

    /// Receive one message; `Ok(None)` when the peer closed.
    pub fn recv(&self) -> Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
        recv_msg(self.0.as_raw_fd())
    }

    pub fn request(&self, req: &Request) -> Result<(serde_json::Value, Vec<OwnedFd>)> {
        self.send(&serde_json::to_vec(req).expect("requests serialize"), &[])?;
        let Some((bytes, fds)) = self.recv()? else {
            return Err(Error::Protocol("switch closed the connection".into()));
        };
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Protocol(format!("reply is not JSON: {e}")))?;
        if v.get("ok").and_then(|o| o.as_bool()) != Some(true) {
            let why = v
                .get("error")
                .and_then(|e| e.as_str())
                .unwrap_or("no reason given");
            return Err(Error::Refused(why.to_string()));
        }
        Ok((v, fds))
    }
}

/// A port attached to a switch: the driver and the connection that keeps the
/// port alive.
pub struct Attached {
    pub driver: Driver,
    pub info: serde_json::Value,
    _conn: Conn,
}

/// Attach to the switch listening on `path`.
pub fn attach(path: &Path, req: &AttachRequest) -> Result<Attached> {
    let conn = Conn::connect(path)?;
    let (info, fds) = conn.request(&Request::Attach(req.clone()))?;
    let [region, kick, irq]: [OwnedFd; 3] = fds.try_into().map_err(|v: Vec<OwnedFd>| {
        Error::Protocol(format!("expected 3 descriptors, got {}", v.len()))
    })?;
    let driver = Driver::new(region, kick, irq, req.mode)?;
    Ok(Attached {
        driver,
        info,
        _conn: conn,
    })
}

/// Ask a switch for its status document.
pub fn status(path: &Path) -> Result<serde_json::Value> {
    let conn = Conn::connect(path)?;
    Ok(conn.request(&Request::Status)?.0)
}

/// A listening control socket (non-blocking accept).
pub struct Listener(OwnedFd);

impl Listener {
    pub fn bind(path: &Path) -> Result<Listener> {
        // A stale socket file from a dead switch would make bind fail.
        if path.exists() {
            if Conn::connect(path).is_ok() {
                return Err(Error::Protocol(format!(
                    "{} is in use by a running switch",
                    path.display()
                )));
            }
            let _ = std::fs::remove_file(path);
        }
        let fd = seqpacket()?;
        let (addr, len) = sockaddr(path)?;
        // SAFETY: addr is a valid sockaddr_un of length len; fd is ours.
        unsafe {
            if libc::bind(fd.as_raw_fd(), &addr as *const _ as *const _, len) < 0 {
                return Err(Error::Sys {
                    what: "bind switch control socket",
                    source: std::io::Error::last_os_error(),
                });
            }
            if libc::listen(fd.as_raw_fd(), 64) < 0 {
                return Err(sys("listen"));
            }
            let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        Ok(Listener(fd))
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    pub fn accept(&self) -> Option<Conn> {
        // SAFETY: accept4 on our listening socket; NULL address is allowed.
        let fd = unsafe {
            libc::accept4(
                self.0.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: fresh descriptor from accept4.
        Some(Conn(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

fn seqpacket() -> Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(sys("socket(AF_UNIX, SOCK_SEQPACKET)"));
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A `sockaddr_un` for a filesystem path.
pub fn sockaddr(path: &Path) -> Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.is_empty() {
        return Err(Error::Protocol(format!(
            "socket path {} must be 1..{} bytes",
            path.display(),
            addr.sun_path.len()
        )));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// Send one packet with optional descriptors.
pub fn send_msg(fd: RawFd, msg: &[u8], fds: &[RawFd]) -> Result<()> {
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr() as *mut _,
        iov_len: msg.len(),
    };
    let mut cbuf = [0u64; 8]; // room for up to 8 descriptors, aligned
                              // SAFETY: msghdr is plain data.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    assert!(fds.len() <= 8);
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE of at most 8 ints fits the 64-byte buffer; the
        // header pointer is the buffer's start and data are copied within it.
        unsafe {
            mh.msg_control = cbuf.as_mut_ptr() as *mut _;
            mh.msg_controllen = libc::CMSG_SPACE(bytes) as _;
            let c = libc::CMSG_FIRSTHDR(&mh);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c) as *mut RawFd,
                fds.len(),
            );
        }
    }
    // SAFETY: mh points at live iovec and control buffers.
    let r = unsafe { libc::sendmsg(fd, &mh, libc::MSG_NOSIGNAL) };
    if r < 0 {
        return Err(sys("sendmsg on control socket"));
    }
    Ok(())
}

/// Receive one packet and any descriptors; `Ok(None)` on orderly close.
pub fn recv_msg(fd: RawFd) -> Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_MSG];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut _,
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: msghdr is plain data.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr() as *mut _;
    mh.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: mh points at live buffers of the sizes given.
    let n = unsafe { libc::recvmsg(fd, &mut mh, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(sys("recvmsg on control socket"));
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into cbuf, within
    // msg_controllen; each SCM_RIGHTS payload is an array of ints we now own.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    buf.truncate(n as usize);
    Ok(Some((buf, fds)))
}
