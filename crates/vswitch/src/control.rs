//! The control server: the socket where a driver attaches a ring port (the
//! paravirtual NIC's attach protocol, [`ring::control`]) and where anyone may
//! ask for the status document (in pages that each fit one message). A ring
//! port belongs to the connection that asked for it and goes when that
//! connection closes. A connection without a port that asks nothing for
//! [`HANDSHAKE_TIMEOUT`] is closed: an idle one holds nothing for ever.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Instant;

use ring::control::{Conn, Listener, Request};
use ring::device::DevicePort;
use serde::Serialize;

use crate::attach::{Attach, Served};
use crate::deadlines::HANDSHAKE_TIMEOUT;
use crate::ports::ring::RingPort;
use crate::ports::Counters;
use crate::status::{Reply, Status};
use crate::{chain, Error};

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
    #[error(
        "port {0:?} names no MAC address: ring ports are locked to their address \
         (fastpath pktgen --src-mac); one that bridges other stations must be let \
         through by the switch (fastpath switch run --ring-unlocked {0})"
    )]
    Unlocked(String),
    #[error(
        "port {0:?}: {} is a group address (its first byte is odd): a port is locked to a station's unicast address",
        crate::bridge::mac_text(.1)
    )]
    GroupMac(String, crate::bridge::Mac),
    #[error("creating the port")]
    Device(#[source] ring::Error),
    #[error("handing out the port's descriptors")]
    DriverFds(#[source] ring::Error),
    #[error(transparent)]
    Switch(#[from] Error),
}

/// One connection to the control socket.
struct Client {
    conn: Conn,
    /// Whether a port it asked for is in the switch (one per connection;
    /// it goes when the connection closes).
    has_port: bool,
    /// The reply to an attach request whose port the event loop is adding,
    /// and the driver's descriptors that go with it.
    pending: Option<(Attached, Vec<OwnedFd>)>,
    /// When it connected or last asked something: one without a port is
    /// closed [`HANDSHAKE_TIMEOUT`] after that.
    since: Instant,
}

/// The control socket and its connections.
pub(crate) struct ControlServer {
    listener: Listener,
    conns: HashMap<u32, Client>,
    next: u32,
    /// Ring ports that may attach without a MAC ([`crate::Config::ring_unlocked`]).
    unlocked: Vec<String>,
}

impl ControlServer {
    /// Listen on `path` (a stale socket file from a dead switch is
    /// replaced); the ring ports named in `unlocked` (`*`: all) may attach
    /// without a MAC to be locked to.
    pub(crate) fn bind(path: &Path, unlocked: &[String]) -> Result<ControlServer, Error> {
        let listener = Listener::bind(path).map_err(|source| Error::Control {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(ControlServer {
            listener,
            conns: HashMap::new(),
            next: 0,
            unlocked: unlocked.to_vec(),
        })
    }

    /// Forget connection `id`: its descriptor, for the event loop to stop
    /// watching.
    fn close(&mut self, id: u32) -> Served {
        match self.conns.remove(&id) {
            Some(c) => Served::Closed(c.conn.into_fd()),
            None => Served::Open,
        }
    }

    /// Send connection `id` a reply with descriptors; a connection that
    /// cannot take it is closed.
    fn reply(&mut self, id: u32, bytes: &[u8], fds: &[OwnedFd]) -> Served {
        let fds: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        if let Some(c) = self.conns.get(&id) {
            if ring::control::send_fds(c.conn.as_fd(), bytes, &fds).is_err() {
                return self.close(id);
            }
        }
        Served::Open
    }
}

impl Attach for ControlServer {
    fn listen_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    fn accept_all(&mut self, watch: &mut dyn FnMut(u32, BorrowedFd<'_>) -> bool) {
        while let Some(conn) = self.listener.accept() {
            let id = self.next;
            self.next = self.next.wrapping_add(1) & 0xff_ffff;
            if watch(id, conn.as_fd()) {
                self.conns.insert(
                    id,
                    Client {
                        conn,
                        has_port: false,
                        pending: None,
                        since: Instant::now(),
                    },
                );
            }
        }
    }

    fn serve_conn(&mut self, id: u32) -> Served {
        let Some(client) = self.conns.get_mut(&id) else {
            return Served::Open;
        };
        let msg = match client.conn.recv() {
            Ok(Some((m, _fds))) => m,
            Ok(None) | Err(_) => return self.close(id),
        };
        client.since = Instant::now();
        let bytes = match serde_json::from_slice::<Request>(&msg) {
            Err(e) => Reply::refused(format!("bad request: {e}")).bytes(),
            Ok(Request::Status) => return Served::Status(0),
            Ok(Request::StatusPage(p)) => return Served::Status(p.from as usize),
            Ok(Request::Attach(req)) => match make_port(client.has_port, &self.unlocked, &req) {
                Ok((port, attached, fds)) => {
                    client.pending = Some((attached, fds));
                    return Served::Port(port);
                }
                Err(e) => Reply::refused(chain(&e)).bytes(),
            },
        };
        self.reply(id, &bytes, &[])
    }

    fn added(&mut self, id: u32, result: Result<u16, Error>) -> Served {
        let Some(client) = self.conns.get_mut(&id) else {
            return Served::Open;
        };
        let Some((mut attached, fds)) = client.pending.take() else {
            return Served::Open;
        };
        match result {
            Ok(idx) => {
                client.has_port = true;
                attached.port = idx;
                self.reply(id, &Reply::ok(attached).bytes(), &fds)
            }
            Err(e) => {
                let e = AttachError::from(e);
                self.reply(id, &Reply::refused(chain(&e)).bytes(), &[])
            }
        }
    }

    fn status(&mut self, id: u32, page: Status) -> Served {
        self.reply(id, &Reply::ok(page).bytes(), &[])
    }

    fn expire(&mut self, now: Instant) -> Vec<(u32, OwnedFd)> {
        let overdue: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                !c.has_port && c.pending.is_none() && now >= c.since + HANDSHAKE_TIMEOUT
            })
            .map(|(&id, _)| id)
            .collect();
        overdue
            .into_iter()
            .filter_map(|id| Some((id, self.conns.remove(&id)?.conn.into_fd())))
            .collect()
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

/// Make the ring port `req` asks for, for a connection that already has
/// one (`has_port`: refused) or not; one without a MAC is refused unless
/// its name is in `unlocked`. Returns the port, the reply once it is in the
/// switch (its index still to fill in) and the driver's descriptors.
fn make_port(
    has_port: bool,
    unlocked: &[String],
    req: &ring::control::AttachRequest,
) -> Result<(Box<RingPort>, Attached, Vec<OwnedFd>), AttachError> {
    if req.name.is_empty() || req.name.len() > 64 {
        return Err(AttachError::Name);
    }
    if has_port {
        return Err(AttachError::SecondPort);
    }
    if req.itr > 65535 {
        return Err(AttachError::Itr(req.itr));
    }
    match req.mac {
        // Pinned to one port, a group address (broadcast, say) would be
        // delivered to that port alone.
        Some(m) if m[0] & 1 != 0 => return Err(AttachError::GroupMac(req.name.clone(), m)),
        Some(_) => {}
        None if unlocked.iter().any(|n| n == "*" || *n == req.name) => {}
        None => return Err(AttachError::Unlocked(req.name.clone())),
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
    Ok((
        Box::new(port),
        Attached {
            port: 0,
            name: req.name.clone(),
            slots: req.slots,
            buf_size: req.buf_size,
        },
        fds.into(),
    ))
}
