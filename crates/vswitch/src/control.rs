//! The control server: the socket where a driver attaches a ring port (the
//! paravirtual NIC's attach protocol, [`ring::control`]) and where anyone may
//! ask for the status document (in pages that each fit one message). A ring
//! port belongs to the connection that asked for it and goes when that
//! connection closes.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use ring::control::{Conn, Listener, Request};
use ring::device::DevicePort;
use serde::Serialize;

use crate::ports::{Attach, Counters, Owner, RingPort, Served};
use crate::status::Reply;
use crate::switch::STATUS_PAGE_BYTES;
use crate::{chain, Error, Switch};

/// Why the switch refused a port asked for on the control socket (the text
/// goes back in the reply).
#[derive(Debug, thiserror::Error)]
enum AttachError {
    #[error("port name must be 1..=64 bytes")]
    Name,
    #[error("this connection already owns a port")]
    SecondPort,
    #[error("itr {0} is out of range 0..=65535")]
    Itr(u32),
    #[error("creating the port")]
    Device(#[source] ring::Error),
    #[error("handing out the port's descriptors")]
    DriverFds(#[source] ring::Error),
    #[error(transparent)]
    Switch(#[from] Error),
}

/// The control socket and its connections.
pub(crate) struct ControlServer {
    listener: Listener,
    conns: HashMap<u32, Conn>,
    next: u32,
}

impl ControlServer {
    /// Listen on `path` (a stale socket file from a dead switch is replaced).
    pub(crate) fn bind(path: &Path) -> Result<ControlServer, Error> {
        let listener = Listener::bind(path).map_err(|source| Error::Control {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(ControlServer {
            listener,
            conns: HashMap::new(),
            next: 0,
        })
    }

    /// Forget connection `id`: its descriptor, for the event loop to stop
    /// watching.
    fn close(&mut self, id: u32) -> Served {
        match self.conns.remove(&id) {
            Some(c) => Served::Closed(c.into_fd()),
            None => Served::Open,
        }
    }
}

impl Attach for ControlServer {
    fn listen_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    fn accept_all(&mut self, watch: &mut dyn FnMut(u32, BorrowedFd<'_>) -> bool) {
        while let Some(c) = self.listener.accept() {
            let id = self.next;
            self.next = self.next.wrapping_add(1) & 0xff_ffff;
            if watch(id, c.as_fd()) {
                self.conns.insert(id, c);
            }
        }
    }

    fn serve_conn(&mut self, id: u32, owner: Owner, sw: &mut Switch) -> Served {
        let Some(conn) = self.conns.get(&id) else {
            return Served::Open;
        };
        let msg = match conn.recv() {
            Ok(Some((m, _fds))) => m,
            Ok(None) | Err(_) => return self.close(id),
        };
        let (bytes, fds) = match serde_json::from_slice::<Request>(&msg) {
            Err(e) => (Reply::refused(format!("bad request: {e}")).bytes(), vec![]),
            Ok(Request::Status) => (
                Reply::ok(sw.status_page(0, STATUS_PAGE_BYTES)).bytes(),
                vec![],
            ),
            Ok(Request::StatusPage(p)) => (
                Reply::ok(sw.status_page(p.from as usize, STATUS_PAGE_BYTES)).bytes(),
                vec![],
            ),
            Ok(Request::Attach(req)) => match attach(sw, owner, &req) {
                Ok((v, fds)) => (Reply::ok(v).bytes(), fds),
                Err(e) => (Reply::refused(chain(&e)).bytes(), vec![]),
            },
        };
        let fds: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        if let Some(conn) = self.conns.get(&id) {
            if ring::control::send_fds(conn.as_fd(), &bytes, &fds).is_err() {
                return self.close(id);
            }
        }
        Served::Open
    }
}

/// The reply to an attach request that succeeded: the port's index and
/// what it was made with.
#[derive(Serialize)]
struct Attached {
    port: u16,
    name: String,
    slots: u32,
    buf_size: u32,
}

/// Make the ring port `req` asks for and add it to `sw` as `owner`'s;
/// returns the reply and the driver's descriptors.
fn attach(
    sw: &mut Switch,
    owner: Owner,
    req: &ring::control::AttachRequest,
) -> Result<(Attached, Vec<OwnedFd>), AttachError> {
    if req.name.is_empty() || req.name.len() > 64 {
        return Err(AttachError::Name);
    }
    if sw.owns(owner) {
        return Err(AttachError::SecondPort);
    }
    if req.itr > 65535 {
        return Err(AttachError::Itr(req.itr));
    }
    let dev = DevicePort::create(&req.name, req.geometry(), req.mode, req.itr)
        .map_err(AttachError::Device)?;
    let fds = dev.driver_fds().map_err(AttachError::DriverFds)?;
    let port = RingPort {
        name: req.name.clone(),
        dev,
        c: Counters::default(),
        mac: req.mac,
    };
    let idx = sw.add_owned(Box::new(port), Some(owner))?;
    Ok((
        Attached {
            port: idx,
            name: req.name.clone(),
            slots: req.slots,
            buf_size: req.buf_size,
        },
        fds.into(),
    ))
}
