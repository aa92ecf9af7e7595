//! The attach protocol: how a process gets a switch port.
//!
//! The switch listens on a Unix `SOCK_SEQPACKET` socket. A client sends one
//! JSON request per packet; the reply is one JSON packet, and an `attach`
//! reply carries three descriptors (region, kick, interrupt) as
//! `SCM_RIGHTS`. The attaching connection stays open for the life of the
//! port: closing it (or dying) detaches the port.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use serde::{Deserialize, Serialize};

use crate::driver::Driver;
use crate::sockpath::{claim, BoundPath};
use crate::{sys, Error, Geometry, Mode, Result};

/// Largest control message.
pub const MAX_MSG: usize = 64 * 1024;

/// Most descriptors sent with one message.
pub const MAX_SEND_FDS: usize = 8;

/// Most descriptors taken from one received message (what a 128-byte control
/// buffer holds); the kernel closes any beyond them.
pub const MAX_RECV_FDS: usize = 28;

/// Longest socket path, in bytes (`sun_path` less its terminating NUL).
const MAX_PATH: usize = 107;

/// Ways the peer on a control socket, or the socket's own set-up, breaks the
/// protocol.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The switch closed the connection before replying.
    #[error("switch closed the connection")]
    Closed,
    /// The reply is not a JSON document.
    #[error("reply is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// An attach reply without exactly its three descriptors.
    #[error("expected 3 descriptors, got {got}")]
    Descriptors {
        /// How many came.
        got: usize,
    },
    /// The socket path does not fit a `sockaddr_un`.
    #[error("socket path {} must be 1..{} bytes", path.display(), MAX_PATH + 1)]
    SocketPath {
        /// The socket path.
        path: PathBuf,
    },
    /// More descriptors than one message carries.
    #[error("{got} descriptors in one message: at most {MAX_SEND_FDS}")]
    TooManyFds {
        /// How many were to be sent.
        got: usize,
    },
}

/// A request to attach a new ring port.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AttachRequest {
    /// Port name (unique on the switch).
    pub name: String,
    /// How driver and device notify each other.
    pub mode: Mode,
    /// Interrupt moderation interval in 250 ns units (0: none).
    #[serde(default)]
    pub itr: u32,
    /// Slots per ring, a power of two.
    #[serde(default = "default_slots")]
    pub slots: u32,
    /// Bytes per buffer, a multiple of 64.
    #[serde(default = "default_buf")]
    pub buf_size: u32,
    /// Lock the port to this source address (port security): the switch
    /// drops the port's frames from any other address, and no other port
    /// can take this one's traffic by sending from it.
    #[serde(default)]
    pub mac: Option<[u8; 6]>,
}

fn default_slots() -> u32 {
    Geometry::default().slots
}
fn default_buf() -> u32 {
    Geometry::default().buf_size
}

impl AttachRequest {
    /// The ring geometry asked for.
    pub fn geometry(&self) -> Geometry {
        Geometry {
            slots: self.slots,
            buf_size: self.buf_size,
        }
    }
}

/// A request on the control socket: one JSON packet.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Request {
    /// Create a port; the reply carries its region, kick and interrupt.
    Attach(AttachRequest),
    /// Report the switch's status document: its first page when the ports
    /// do not fit one message (the reply's `next` says where the next page
    /// starts).
    Status,
    /// The status document's page from port index `from` on.
    StatusPage(StatusPage),
}

/// Which page of the status document to send.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatusPage {
    /// The first port index of the page (the previous page's `next`).
    pub from: u32,
}

/// A connected control socket.
pub struct Conn(OwnedFd);

impl Conn {
    /// Connect to the switch listening on `path`.
    pub fn connect(path: &Path) -> Result<Conn> {
        let fd = seqpacket(SocketFlags::CLOEXEC)?;
        rustix::net::connect(&fd, &sockaddr(path)?)
            .map_err(sys("connect to switch control socket"))?;
        Ok(Conn(fd))
    }

    /// Adopt a connected `SOCK_SEQPACKET` socket.
    pub fn from_fd(fd: OwnedFd) -> Conn {
        Conn(fd)
    }

    /// The descriptor number, e.g. to register with epoll.
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// The connected socket itself.
    pub fn into_fd(self) -> OwnedFd {
        self.0
    }

    /// Send one packet carrying the descriptors `fds`.
    pub fn send(&self, msg: &[u8], fds: &[RawFd]) -> Result<()> {
        with_borrowed(fds, |fds| send_fds(self.0.as_fd(), msg, fds))
    }

    /// Receive one message; `Ok(None)` when the peer closed.
    pub fn recv(&self) -> Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
        recv_fds(self.0.as_fd())
    }

    /// Send a request and wait for its reply: the reply document and the
    /// descriptors it carries. A reply without `"ok": true` is
    /// [`Error::Refused`].
    pub fn request(&self, req: &Request) -> Result<(serde_json::Value, Vec<OwnedFd>)> {
        self.send(&serde_json::to_vec(req).expect("requests serialize"), &[])?;
        let Some((bytes, fds)) = self.recv()? else {
            return Err(ProtocolError::Closed.into());
        };
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(ProtocolError::NotJson)?;
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

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// A port attached to a switch: the driver and the connection that keeps the
/// port alive.
pub struct Attached {
    /// The driver side of the port.
    pub driver: Driver,
    /// The switch's reply (port index, name, geometry).
    pub info: serde_json::Value,
    _conn: Conn,
}

/// Attach to the switch listening on `path`.
pub fn attach(path: &Path, req: &AttachRequest) -> Result<Attached> {
    let conn = Conn::connect(path)?;
    let (info, fds) = conn.request(&Request::Attach(req.clone()))?;
    let [region, kick, irq]: [OwnedFd; 3] = fds
        .try_into()
        .map_err(|v: Vec<OwnedFd>| ProtocolError::Descriptors { got: v.len() })?;
    let driver = Driver::new(region, kick, irq, req.mode)?;
    Ok(Attached {
        driver,
        info,
        _conn: conn,
    })
}

/// Ask a switch for its status document, every page of it (a switch with
/// many ports sends them in pages that each fit one message).
pub fn status(path: &Path) -> Result<serde_json::Value> {
    let conn = Conn::connect(path)?;
    let mut doc = conn.request(&Request::Status)?.0;
    while let Some(from) = doc.get("next").and_then(|n| n.as_u64()) {
        let Ok(from) = u32::try_from(from) else {
            break;
        };
        let page = conn.request(&Request::StatusPage(StatusPage { from }))?.0;
        let more: Vec<serde_json::Value> = page["ports"].as_array().cloned().unwrap_or_default();
        if let Some(ports) = doc["ports"].as_array_mut() {
            ports.extend(more);
        }
        // A page must move on; a switch that answers the same page again
        // would otherwise keep us here.
        match page.get("next").and_then(|n| n.as_u64()) {
            Some(n) if n > u64::from(from) => doc["next"] = n.into(),
            _ => {
                doc["switch"] = page["switch"].clone();
                if let Some(o) = doc.as_object_mut() {
                    o.remove("next");
                }
            }
        }
    }
    Ok(doc)
}

/// A listening control socket (non-blocking accept). Its path is taken as
/// [`crate::sockpath`] says (a stale socket replaced; a live socket or
/// anything not a socket refused, never deleted) and removed when it
/// drops, only if it is still the socket this listener made.
pub struct Listener {
    fd: OwnedFd,
    _made: Option<BoundPath>,
}

impl Listener {
    /// Listen on `path`: see [`Listener`] for what may be there already.
    pub fn bind(path: &Path) -> Result<Listener> {
        let addr = sockaddr(path)?;
        claim(path)?;
        let fd = seqpacket(SocketFlags::CLOEXEC | SocketFlags::NONBLOCK)?;
        rustix::net::bind(&fd, &addr).map_err(sys("bind switch control socket"))?;
        let made = BoundPath::note(path);
        rustix::net::listen(&fd, 64).map_err(sys("listen"))?;
        Ok(Listener { fd, _made: made })
    }

    /// The descriptor number, e.g. to register with epoll.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Accept one pending connection (non-blocking, close-on-exec), if any.
    pub fn accept(&self) -> Option<Conn> {
        rustix::net::accept_with(&self.fd, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK)
            .ok()
            .map(Conn)
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn seqpacket(flags: SocketFlags) -> Result<OwnedFd> {
    rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, flags, None)
        .map_err(sys("socket(AF_UNIX, SOCK_SEQPACKET)"))
}

/// The Unix socket address of a filesystem path of 1..=107 bytes.
pub fn sockaddr(path: &Path) -> Result<SocketAddrUnix> {
    use std::os::unix::ffi::OsStrExt;
    let len = path.as_os_str().as_bytes().len();
    if len == 0 || len > MAX_PATH {
        return Err(ProtocolError::SocketPath {
            path: path.to_path_buf(),
        }
        .into());
    }
    SocketAddrUnix::new(path).map_err(|_| {
        // Only a NUL byte inside the path is left to refuse.
        ProtocolError::SocketPath {
            path: path.to_path_buf(),
        }
        .into()
    })
}

/// Send one packet carrying the descriptors `fds` (at most
/// [`MAX_SEND_FDS`]) on a connected control socket.
pub fn send_fds(sock: BorrowedFd<'_>, msg: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    if fds.len() > MAX_SEND_FDS {
        return Err(ProtocolError::TooManyFds { got: fds.len() }.into());
    }
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_SEND_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    // The buffer has room for MAX_SEND_FDS descriptors: push fails only if
    // that sum is wrong.
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(ProtocolError::TooManyFds { got: fds.len() }.into());
    }
    rustix::net::sendmsg(
        sock,
        &[IoSlice::new(msg)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(sys("sendmsg on control socket"))?;
    Ok(())
}

/// Receive one packet and the descriptors it carries (close-on-exec, at most
/// [`MAX_RECV_FDS`]); `Ok(None)` on orderly close.
pub fn recv_fds(sock: BorrowedFd<'_>) -> Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_MSG];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_RECV_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(sys("recvmsg on control socket"))?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if got.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    buf.truncate(got.bytes);
    Ok(Some((buf, fds)))
}

/// [`send_fds`] for callers holding descriptor numbers: send one packet with
/// optional descriptors on the socket `fd`.
pub fn send_msg(fd: RawFd, msg: &[u8], fds: &[RawFd]) -> Result<()> {
    with_borrowed(&[fd], |sock| {
        with_borrowed(fds, |fds| send_fds(sock[0], msg, fds))
    })
}

/// [`recv_fds`] for callers holding descriptor numbers: receive one packet
/// and any descriptors on the socket `fd`; `Ok(None)` on orderly close.
pub fn recv_msg(fd: RawFd) -> Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    with_borrowed(&[fd], |sock| recv_fds(sock[0]))
}

/// Run `f` on the descriptor numbers `raw` as borrowed descriptors, for the
/// duration of the call only. A negative number is EBADF, as the kernel would
/// have said.
fn with_borrowed<T>(raw: &[RawFd], f: impl FnOnce(&[BorrowedFd<'_>]) -> Result<T>) -> Result<T> {
    if raw.iter().any(|&fd| fd < 0) {
        return Err(sys("control socket descriptor")(rustix::io::Errno::BADF));
    }
    let fds: Vec<BorrowedFd<'_>> = raw
        .iter()
        // SAFETY: the raw-number entry points (`send_msg`, `recv_msg`,
        // `Conn::send`) take numbers the caller holds open across the call,
        // as the sendmsg/recvmsg they wrap always did; the borrows live only
        // inside `f`, within that call, and are never stored. Negative
        // numbers were refused above.
        .map(|&fd| unsafe { BorrowedFd::borrow_raw(fd) })
        .collect();
    f(&fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sockpath::SocketPathError;
    use crate::EventFd;

    fn temp_socket(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("ring-ctl-{tag}-{}.sock", std::process::id()))
    }

    #[test]
    fn messages_and_descriptors_cross_a_control_socket() {
        let path = temp_socket("cross");
        let l = Listener::bind(&path).unwrap();
        assert!(l.accept().is_none(), "accept must not block");
        let client = Conn::connect(&path).unwrap();
        let server = l.accept().expect("a pending connection");

        let e = EventFd::new().unwrap();
        server.send(b"hello", &[e.raw(), e.raw()]).unwrap();
        let (msg, fds) = client.recv().unwrap().unwrap();
        assert_eq!(msg, b"hello");
        assert_eq!(fds.len(), 2);
        // The received descriptor is the same eventfd.
        let got = EventFd::from_fd(fds.into_iter().next().unwrap());
        got.signal();
        assert_eq!(e.drain(), 1);

        // The raw-number entry points reach the same socket.
        send_msg(client.fd(), b"ping", &[]).unwrap();
        let (msg, fds) = recv_msg(server.fd()).unwrap().unwrap();
        assert_eq!((msg.as_slice(), fds.len()), (&b"ping"[..], 0));

        // A running switch's socket is not taken over; closing ends the peer.
        let e = Listener::bind(&path).err().unwrap();
        assert!(
            matches!(e, Error::Path(SocketPathError::Live { .. })),
            "{e}"
        );
        drop(client);
        assert!(server.recv().unwrap().is_none());
        drop(l);
        assert!(!path.exists(), "a listener removes the socket it made");
    }

    #[test]
    fn a_listener_takes_only_a_stale_socket_and_removes_only_its_own() {
        let path = temp_socket("claim");
        let _ = std::fs::remove_file(&path);
        // A stale socket file (its program died) is replaced.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let l = Listener::bind(&path).unwrap();
        assert!(Conn::connect(&path).is_ok(), "listening on the path");
        // Replaced by another program while we listen: that one's file
        // stays when we go.
        let aside = temp_socket("claim-aside");
        std::fs::rename(&path, &aside).unwrap();
        let other = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(l);
        assert!(path.exists(), "another program's socket is not removed");
        drop(other);
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&aside).unwrap();
        // A regular file is refused and left as it was.
        std::fs::write(&path, b"not a socket").unwrap();
        let e = Listener::bind(&path).err().unwrap();
        assert!(
            matches!(e, Error::Path(SocketPathError::NotSocket { .. })),
            "{e}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn bad_paths_and_descriptor_numbers_are_errors() {
        for p in ["".to_string(), format!("/tmp/{}", "x".repeat(103))] {
            let e = sockaddr(Path::new(&p)).err().unwrap();
            assert!(e.to_string().contains("must be 1..108 bytes"), "{e}");
        }
        sockaddr(Path::new(&format!("/tmp/{}", "x".repeat(102)))).unwrap();

        let e = send_msg(-1, b"x", &[]).err().unwrap();
        let Error::Sys { source, .. } = &e else {
            panic!("{e}");
        };
        assert_eq!(
            source.raw_os_error(),
            Some(rustix::io::Errno::BADF.raw_os_error())
        );

        let path = temp_socket("many");
        let l = Listener::bind(&path).unwrap();
        let c = Conn::connect(&path).unwrap();
        let e = c.send(b"x", &[c.fd(); MAX_SEND_FDS + 1]).err().unwrap();
        assert!(
            matches!(e, Error::Protocol(ProtocolError::TooManyFds { got: 9 })),
            "{e}"
        );
        drop(l);
        assert!(!path.exists());
    }

    #[test]
    fn refusals_and_bad_replies_are_told_apart() {
        let path = temp_socket("refuse");
        let l = Listener::bind(&path).unwrap();
        let c = Conn::connect(&path).unwrap();
        let s = l.accept().unwrap();
        // Accepted connections are non-blocking; this one plays a switch that
        // waits for each request.
        rustix::io::ioctl_fionbio(&s, false).unwrap();
        let t = std::thread::spawn(move || {
            s.recv().unwrap().unwrap();
            s.send(br#"{"ok": false, "error": "name taken"}"#, &[])
                .unwrap();
            s.recv().unwrap().unwrap();
            s.send(b"not json", &[]).unwrap();
            s.recv().unwrap().unwrap();
        });
        let e = c.request(&Request::Status).err().unwrap();
        assert!(
            matches!(&e, Error::Refused(why) if why == "name taken"),
            "{e}"
        );
        let e = c.request(&Request::Status).err().unwrap();
        assert!(
            matches!(e, Error::Protocol(ProtocolError::NotJson(_))),
            "{e}"
        );
        let e = c.request(&Request::Status).err().unwrap();
        assert!(matches!(e, Error::Protocol(ProtocolError::Closed)), "{e}");
        t.join().unwrap();
        drop(l);
        assert!(!path.exists());
    }
}
