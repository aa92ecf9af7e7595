//! The memif control protocol, server side: 128-byte messages on a
//! `SOCK_SEQPACKET` socket, descriptors passed with `SCM_RIGHTS`.
//!
//! The server greets with `hello`; the client answers `init`, then
//! `add_region` (with a memfd) and `add_ring` (with an interrupt eventfd) as
//! often as it needs, each acknowledged, then `connect`; the server replies
//! `connected` and the rings become a [`MemifPort`]. Either side may send
//! `disconnect` with a reason. Every value a client sends is checked before
//! it is used; the first refusal disconnects it, naming the reason.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use ring::notify::EventFd;

use super::datapath::{MemifPort, Region, RingError, RingInfo};

/// Errors setting up the memif server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The memif socket could not be bound.
    #[error("memif socket {}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: ring::Error,
    },
}

/// Protocol version 2.0, the only one spoken.
pub const VERSION: u16 = 0x0200;
/// Bytes in every control message.
pub const MSG_SIZE: usize = 128;
/// Regions a client may add (indices `0..MAX_REGIONS`).
pub const MAX_REGIONS: usize = 16;
/// The largest region accepted.
pub const MAX_REGION_SIZE: u64 = 1 << 32;
/// The largest ring accepted: 2^14 descriptors.
pub const MAX_LOG2_RING: u8 = 14;
/// `add_ring` flags: the ring carries frames from client to server.
pub const RING_FLAG_C2S: u16 = 1;
/// Connections the server holds at once (attached or still adding regions
/// and rings). Each holds at most its socket, [`MAX_REGIONS`] memfds and
/// one interrupt eventfd per direction, so the server holds at most this
/// many times `MAX_REGIONS + 3` descriptors, whatever its clients send; a
/// connection beyond it is closed at once. One that has not completed its
/// handshake (`connected`) within [`crate::HANDSHAKE_TIMEOUT`] is closed
/// ([`Server::expire`]), so idle connections hold a place only that long;
/// and when every place is taken, a newcomer takes the place of the oldest
/// connection still in its handshake after [`EVICTABLE_AFTER`].
pub const MAX_CONNECTIONS: usize = 64;

pub use crate::deadlines::EVICTABLE_AFTER;

/// Message types.
pub mod msg_type {
    /// Acknowledges `init`, `add_region`, `add_ring`.
    pub const ACK: u16 = 1;
    /// Server greeting: name, versions, limits.
    pub const HELLO: u16 = 2;
    /// Client: version, interface id, mode, name.
    pub const INIT: u16 = 3;
    /// Client: a memory region (with its memfd).
    pub const ADD_REGION: u16 = 4;
    /// Client: a ring in a region (with its interrupt eventfd).
    pub const ADD_RING: u16 = 5;
    /// Client: everything is added; connect.
    pub const CONNECT: u16 = 6;
    /// Server: connected.
    pub const CONNECTED: u16 = 7;
    /// Either side: closing, with a reason.
    pub const DISCONNECT: u16 = 8;
}

/// Where each field of each message lies (all little-endian), named once.
mod field {
    use std::ops::Range;

    /// A byte range in a message.
    pub type Field = Range<usize>;

    /// Message type, first in every message.
    pub const TYPE: Field = 0..2;

    pub mod hello {
        use super::Field;
        pub const NAME: Field = 2..34;
        pub const MIN_VERSION: Field = 34..36;
        pub const MAX_VERSION: Field = 36..38;
        pub const MAX_REGION: Field = 38..40;
        pub const MAX_C2S_RING: Field = 40..42;
        pub const MAX_S2C_RING: Field = 42..44;
        pub const MAX_LOG2_RING: usize = 44;
    }

    pub mod init {
        use super::Field;
        pub const VERSION: Field = 2..4;
        pub const ID: Field = 4..8;
        pub const MODE: usize = 8;
        pub const NAME: Field = 33..65;
    }

    pub mod add_region {
        use super::Field;
        pub const INDEX: Field = 2..4;
        pub const SIZE: Field = 4..12;
    }

    pub mod add_ring {
        use super::Field;
        pub const FLAGS: Field = 2..4;
        pub const INDEX: Field = 4..6;
        pub const REGION: Field = 6..8;
        pub const OFFSET: Field = 8..12;
        pub const LOG2_RING: usize = 12;
    }

    pub mod connect {
        use super::Field;
        pub const NAME: Field = 2..34;
    }

    pub mod connected {
        use super::Field;
        pub const NAME: Field = 2..34;
    }

    pub mod disconnect {
        use super::Field;
        pub const REASON: Field = 6..102;
    }
}

/// One control message.
struct Msg([u8; MSG_SIZE]);

impl Msg {
    /// An all-zero message of type `ty`.
    fn new(ty: u16) -> Msg {
        let mut m = Msg([0; MSG_SIZE]);
        m.set16(field::TYPE, ty);
        m
    }

    /// A received message: shorter ones are zero-filled, longer ones cut.
    fn parse(bytes: &[u8]) -> Result<Msg, Refusal> {
        if bytes.len() < field::TYPE.end {
            return Err(Refusal::Short);
        }
        let mut m = [0u8; MSG_SIZE];
        let n = bytes.len().min(MSG_SIZE);
        m[..n].copy_from_slice(&bytes[..n]);
        Ok(Msg(m))
    }

    fn ty(&self) -> u16 {
        self.get16(field::TYPE)
    }
    fn get8(&self, at: usize) -> u8 {
        self.0[at]
    }
    fn get16(&self, f: field::Field) -> u16 {
        u16::from_le_bytes(self.array(f))
    }
    fn get32(&self, f: field::Field) -> u32 {
        u32::from_le_bytes(self.array(f))
    }
    fn get64(&self, f: field::Field) -> u64 {
        u64::from_le_bytes(self.array(f))
    }
    fn array<const N: usize>(&self, f: field::Field) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(&self.0[f]);
        a
    }
    /// A NUL-terminated string field.
    fn string(&self, f: field::Field) -> String {
        let b = &self.0[f];
        let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    }

    fn set8(&mut self, at: usize, v: u8) {
        self.0[at] = v;
    }
    fn set16(&mut self, f: field::Field, v: u16) {
        self.0[f].copy_from_slice(&v.to_le_bytes());
    }
    /// A string field, cut to fit and NUL-terminated when there is room.
    fn set_string(&mut self, f: field::Field, s: &[u8]) {
        let dst = &mut self.0[f];
        let n = s.len().min(dst.len().saturating_sub(1));
        dst[..n].copy_from_slice(&s[..n]);
    }

    fn send(&self, fd: BorrowedFd<'_>) -> Result<(), ring::Error> {
        ring::control::send_fds(fd, &self.0, &[])
    }
}

/// The server's greeting: what it speaks and the most it accepts.
fn hello() -> Msg {
    use field::hello as f;
    let mut m = Msg::new(msg_type::HELLO);
    m.set_string(f::NAME, b"fastpath");
    m.set16(f::MIN_VERSION, VERSION);
    m.set16(f::MAX_VERSION, VERSION);
    m.set16(f::MAX_REGION, (MAX_REGIONS - 1) as u16);
    m.set16(f::MAX_C2S_RING, 0); // one ring each way (highest index 0)
    m.set16(f::MAX_S2C_RING, 0);
    m.set8(f::MAX_LOG2_RING, MAX_LOG2_RING);
    m
}

/// `init`: the client's version, interface id, mode and name.
struct Init {
    version: u16,
    id: u32,
    mode: u8,
    name: String,
}

impl Init {
    fn parse(m: &Msg) -> Init {
        use field::init as f;
        Init {
            version: m.get16(f::VERSION),
            id: m.get32(f::ID),
            mode: m.get8(f::MODE),
            name: m.string(f::NAME),
        }
    }
}

/// `add_region`: region `index` of `size` bytes (the memfd rides along).
struct AddRegion {
    index: u16,
    size: u64,
}

impl AddRegion {
    fn parse(m: &Msg) -> AddRegion {
        use field::add_region as f;
        AddRegion {
            index: m.get16(f::INDEX),
            size: m.get64(f::SIZE),
        }
    }
}

/// `add_ring`: ring `index` in one direction, at `offset` in `region`.
struct AddRing {
    flags: u16,
    index: u16,
    region: u16,
    offset: u32,
    log2: u8,
}

impl AddRing {
    fn parse(m: &Msg) -> AddRing {
        use field::add_ring as f;
        AddRing {
            flags: m.get16(f::FLAGS),
            index: m.get16(f::INDEX),
            region: m.get16(f::REGION),
            offset: m.get32(f::OFFSET),
            log2: m.get8(f::LOG2_RING),
        }
    }
}

/// Why a client was disconnected; the text (with its sources) is sent to it
/// in the `disconnect` message.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// Fewer bytes than a message type.
    #[error("short message")]
    Short,
    /// Anything but `disconnect` once connected.
    #[error("message type {0} after connect")]
    AfterConnect(u16),
    /// `init` twice.
    #[error("second init")]
    SecondInit,
    /// A protocol version other than [`VERSION`].
    #[error("unsupported version {0:#x}")]
    Version(u16),
    /// A mode other than Ethernet (IP and punt/inject are not spoken).
    #[error("only ethernet mode is supported")]
    Mode,
    /// `add_region` before `init`.
    #[error("add_region before init")]
    RegionBeforeInit,
    /// `add_region` without its memfd.
    #[error("add_region without a descriptor")]
    RegionWithoutFd,
    /// A region index or size out of range.
    #[error("region {index} of {size} bytes refused")]
    RegionRefused {
        /// Region index.
        index: usize,
        /// Bytes claimed.
        size: u64,
    },
    /// The region's file could not be examined.
    #[error("region {index}: reading its size")]
    RegionStat {
        /// Region index.
        index: usize,
        /// Why `fstat` failed.
        #[source]
        source: std::io::Error,
    },
    /// The region's file is shorter than the size claimed.
    #[error("region {index}: file is {have} bytes, {size} claimed")]
    RegionShort {
        /// Region index.
        index: usize,
        /// Bytes in the file.
        have: u64,
        /// Bytes claimed.
        size: u64,
    },
    /// The region's file could shrink under us, turning our reads into
    /// SIGBUS.
    #[error("region {index} is not sealed against shrinking (a peer could make our reads fault)")]
    Unsealed {
        /// Region index.
        index: usize,
    },
    /// The region's seals could not be read (not a memfd?).
    #[error("region {index} is not sealed against shrinking (a peer could make our reads fault): reading its seals")]
    Seals {
        /// Region index.
        index: usize,
        /// Why `fcntl(F_GET_SEALS)` failed.
        #[source]
        source: std::io::Error,
    },
    /// Mapping the region failed.
    #[error("mmap region {index}")]
    Mmap {
        /// Region index.
        index: usize,
        /// Why mmap failed.
        #[source]
        source: std::io::Error,
    },
    /// `add_ring` before `init`.
    #[error("add_ring before init")]
    RingBeforeInit,
    /// `add_ring` without its interrupt eventfd.
    #[error("add_ring without an interrupt descriptor")]
    RingWithoutFd,
    /// A ring size out of range.
    #[error("ring size 2^{0} refused")]
    RingSize(u8),
    /// A ring index other than 0 (the greeting offers one ring each way).
    #[error("ring index {0} refused: one ring each way, index 0")]
    RingIndex(u16),
    /// A second ring in one direction (each holds a descriptor: a client
    /// adding rings without end would exhaust the switch's descriptors).
    #[error("a second {0} ring refused: one ring each way")]
    SecondRing(&'static str),
    /// A ring in a region never added.
    #[error("ring {index} names unknown region {region}")]
    UnknownRegion {
        /// Ring index.
        index: u16,
        /// Region index.
        region: u16,
    },
    /// A ring outside its region or not cache-line aligned.
    #[error("ring {0} does not fit its region")]
    RingMisfit(u16),
    /// `connect` without ring 0 in one direction.
    #[error("no {0} ring 0")]
    NoRing0(&'static str),
    /// The rings cannot be used.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// Replying to the client failed.
    #[error("replying to the peer")]
    Reply(#[source] ring::Error),
    /// The client disconnected, giving this reason.
    #[error("peer disconnected: {0}")]
    PeerDisconnected(String),
    /// A message type the server does not expect from a client.
    #[error("unexpected message type {0}")]
    Unexpected(u16),
}

/// What serving a connection produced.
pub enum Event {
    /// Nothing for the switch to do.
    None,
    /// The client connected: a new port.
    Connected(Box<MemifPort>),
    /// The connection ended: its descriptor, for the switch to stop watching
    /// before it drops (closes) it.
    Closed(OwnedFd),
}

/// One client connection and what it has added so far.
struct MConn {
    fd: OwnedFd,
    id: u32,
    inited: bool,
    peer_name: String,
    regions: Vec<Option<Region>>,
    c2s: Vec<(u16, RingInfo)>,
    s2c: Vec<(u16, RingInfo)>,
    connected: bool,
    /// When it was accepted: closed [`crate::HANDSHAKE_TIMEOUT`] after,
    /// unless connected by then.
    since: Instant,
}

/// The memif listener and its connections.
pub struct Server {
    listen: ring::control::Listener,
    path: PathBuf,
    conns: HashMap<u32, MConn>,
    next: u32,
    /// Connections closed at once because [`MAX_CONNECTIONS`] were held.
    turned_away: u64,
    /// Connections closed for not completing the handshake in time.
    expired: u64,
    /// Connections closed to make room ([`Server::evict_idle`]), until the
    /// event loop takes them ([`Server::expire`]).
    evicted: Vec<(u32, OwnedFd)>,
}

impl Server {
    /// Listen on `path` (a stale socket file from a dead switch is replaced).
    pub fn bind(path: &Path) -> Result<Server, Error> {
        let listen = ring::control::Listener::bind(path).map_err(|source| Error::Bind {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Server {
            listen,
            path: path.to_path_buf(),
            conns: HashMap::new(),
            next: 0,
            turned_away: 0,
            expired: 0,
            evicted: Vec::new(),
        })
    }

    /// Connections held (attached or being set up).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Connections closed at once because [`MAX_CONNECTIONS`] were held.
    pub fn turned_away(&self) -> u64 {
        self.turned_away
    }

    /// The listening socket, readable when a client is waiting.
    pub fn listen_fd(&self) -> BorrowedFd<'_> {
        self.listen.as_fd()
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accept one connection and greet it; returns its id and descriptor.
    /// Beyond [`MAX_CONNECTIONS`] a connection is told why and closed (and
    /// the next one waiting is looked at).
    pub fn accept(&mut self) -> Option<(u32, BorrowedFd<'_>)> {
        let fd = loop {
            let fd = self.listen.accept()?.into_fd();
            if self.conns.len() < MAX_CONNECTIONS || self.evict_idle(Instant::now()) {
                break fd;
            }
            self.turned_away += 1;
            let _ = disconnect_msg(&format!(
                "too many memif connections (at most {MAX_CONNECTIONS})"
            ))
            .send(fd.as_fd());
        };
        if hello().send(fd.as_fd()).is_err() {
            return None;
        }
        let id = self.next;
        self.next = self.next.wrapping_add(1) & 0xff_ffff;
        let c = self.conns.entry(id).insert_entry(MConn {
            fd,
            id,
            inited: false,
            peer_name: String::new(),
            regions: Vec::new(),
            c2s: Vec::new(),
            s2c: Vec::new(),
            connected: false,
            since: Instant::now(),
        });
        Some((id, c.into_mut().fd.as_fd()))
    }

    /// Close a connection; returns its descriptor (to forget in epoll before
    /// dropping it).
    pub fn close(&mut self, id: u32) -> Option<OwnedFd> {
        self.conns.remove(&id).map(|c| c.fd)
    }

    /// Handle one message on connection `id`.
    pub fn serve(&mut self, id: u32) -> Event {
        let Some(c) = self.conns.get_mut(&id) else {
            return Event::None;
        };
        let (msg, fds) = match ring::control::recv_fds(c.fd.as_fd()) {
            Ok(Some(m)) => m,
            Ok(None) | Err(_) => return self.closed(id),
        };
        match handle(c, &msg, fds) {
            Ok(ev) => ev,
            Err(why) => {
                let why = crate::chain(&why);
                tracing::warn!(conn = id, "memif: {why}");
                let _ = disconnect_msg(&why).send(c.fd.as_fd());
                self.closed(id)
            }
        }
    }

    /// Close every connection that has not completed its handshake within
    /// [`crate::HANDSHAKE_TIMEOUT`] of being accepted, telling it why;
    /// returns their ids and descriptors, and those of the connections
    /// that gave their place to a newcomer since (to forget in epoll before
    /// dropping them).
    pub fn expire(&mut self, now: Instant) -> Vec<(u32, OwnedFd)> {
        let overdue: Vec<u32> = self
            .conns
            .values()
            .filter(|c| !c.connected && now >= c.since + crate::HANDSHAKE_TIMEOUT)
            .map(|c| c.id)
            .collect();
        let mut closed = std::mem::take(&mut self.evicted);
        for id in overdue {
            if let Some(c) = self.conns.remove(&id) {
                self.expired += 1;
                let _ = disconnect_msg(&format!(
                    "handshake not completed within {:?}",
                    crate::HANDSHAKE_TIMEOUT
                ))
                .send(c.fd.as_fd());
                closed.push((id, c.fd));
            }
        }
        closed
    }

    /// Connections closed because they had not completed their handshake
    /// in time, or gave their place to a newcomer.
    pub fn expired(&self) -> u64 {
        self.expired
    }

    /// Close the oldest connection still in its handshake after
    /// [`EVICTABLE_AFTER`], telling it why, to make room for a newcomer;
    /// false if there is none. Its descriptor waits in `evicted` for
    /// [`Server::expire`] to hand to the event loop.
    fn evict_idle(&mut self, now: Instant) -> bool {
        let oldest = self
            .conns
            .values()
            .filter(|c| !c.connected && now >= c.since + EVICTABLE_AFTER)
            .min_by_key(|c| c.since)
            .map(|c| c.id);
        let Some(c) = oldest.and_then(|id| self.conns.remove(&id)) else {
            return false;
        };
        self.expired += 1;
        let _ =
            disconnect_msg("handshake not completed: place given to a newcomer").send(c.fd.as_fd());
        self.evicted.push((c.id, c.fd));
        true
    }

    fn closed(&mut self, id: u32) -> Event {
        match self.close(id) {
            Some(fd) => Event::Closed(fd),
            None => Event::None,
        }
    }
}

/// A `disconnect` message giving `why` (cut to fit).
fn disconnect_msg(why: &str) -> Msg {
    let mut m = Msg::new(msg_type::DISCONNECT);
    let b = why.as_bytes();
    let reason = field::disconnect::REASON;
    let n = b.len().min(reason.len() - 1);
    m.0[reason.start..reason.start + n].copy_from_slice(&b[..n]);
    m
}

fn ack(c: &MConn) -> Result<Event, Refusal> {
    Msg::new(msg_type::ACK)
        .send(c.fd.as_fd())
        .map_err(Refusal::Reply)?;
    Ok(Event::None)
}

fn handle(c: &mut MConn, msg: &[u8], mut fds: Vec<OwnedFd>) -> Result<Event, Refusal> {
    let m = Msg::parse(msg)?;
    let ty = m.ty();
    if c.connected && ty != msg_type::DISCONNECT {
        return Err(Refusal::AfterConnect(ty));
    }
    match ty {
        msg_type::INIT => {
            if c.inited {
                return Err(Refusal::SecondInit);
            }
            let init = Init::parse(&m);
            if init.version != VERSION {
                return Err(Refusal::Version(init.version));
            }
            if init.mode != 0 {
                return Err(Refusal::Mode);
            }
            c.id = init.id;
            c.peer_name = init.name;
            c.inited = true;
            ack(c)
        }
        msg_type::ADD_REGION => {
            if !c.inited {
                return Err(Refusal::RegionBeforeInit);
            }
            let r = AddRegion::parse(&m);
            let (index, size) = (r.index as usize, r.size);
            let fd = fds.pop().ok_or(Refusal::RegionWithoutFd)?;
            if index >= MAX_REGIONS || size == 0 || size > MAX_REGION_SIZE {
                return Err(Refusal::RegionRefused { index, size });
            }
            let file = File::from(fd);
            // The seal first, then the size: until the file is sealed
            // against shrinking, a size read from it can be made false the
            // moment after (truncated between our fstat and our reads);
            // once sealed, it can only grow.
            let seals = rustix::fs::fcntl_get_seals(&file).map_err(|e| Refusal::Seals {
                index,
                source: e.into(),
            })?;
            if !seals.contains(rustix::fs::SealFlags::SHRINK) {
                return Err(Refusal::Unsealed { index });
            }
            let have = file
                .metadata()
                .map_err(|source| Refusal::RegionStat { index, source })?
                .len();
            if have < size {
                return Err(Refusal::RegionShort { index, have, size });
            }
            let region = Region::map(&file, size as usize)
                .map_err(|source| Refusal::Mmap { index, source })?;
            if c.regions.len() <= index {
                c.regions.resize_with(index + 1, || None);
            }
            c.regions[index] = Some(region);
            ack(c)
        }
        msg_type::ADD_RING => {
            if !c.inited {
                return Err(Refusal::RingBeforeInit);
            }
            let r = AddRing::parse(&m);
            let int = fds.pop().ok_or(Refusal::RingWithoutFd)?;
            if r.log2 > MAX_LOG2_RING || r.log2 == 0 {
                return Err(Refusal::RingSize(r.log2));
            }
            if r.index != 0 {
                return Err(Refusal::RingIndex(r.index));
            }
            let (dir, held) = if r.flags & RING_FLAG_C2S != 0 {
                ("client-to-server", &c.c2s)
            } else {
                ("server-to-client", &c.s2c)
            };
            if !held.is_empty() {
                return Err(Refusal::SecondRing(dir));
            }
            let region = c
                .regions
                .get(r.region as usize)
                .and_then(|x| x.as_ref())
                .ok_or(Refusal::UnknownRegion {
                    index: r.index,
                    region: r.region,
                })?;
            if !region.fits_ring(r.offset, r.log2) {
                return Err(Refusal::RingMisfit(r.index));
            }
            let info = RingInfo {
                region: r.region,
                offset: r.offset,
                log2: r.log2,
                int: EventFd::from_fd(int),
            };
            if r.flags & RING_FLAG_C2S != 0 {
                c.c2s.push((r.index, info));
            } else {
                c.s2c.push((r.index, info));
            }
            ack(c)
        }
        msg_type::CONNECT => {
            let name = m.string(field::connect::NAME);
            let c2s = take_ring0(&mut c.c2s).ok_or(Refusal::NoRing0("client-to-server"))?;
            let s2c = take_ring0(&mut c.s2c).ok_or(Refusal::NoRing0("server-to-client"))?;
            let regions = std::mem::take(&mut c.regions);
            let port = MemifPort::new(
                format!("memif{}", c.id),
                format!("{} ({})", name, c.peer_name),
                regions,
                c2s,
                s2c,
            )?;
            let mut r = Msg::new(msg_type::CONNECTED);
            r.set_string(field::connected::NAME, b"fastpath");
            r.send(c.fd.as_fd()).map_err(Refusal::Reply)?;
            c.connected = true;
            Ok(Event::Connected(Box::new(port)))
        }
        msg_type::DISCONNECT => Err(Refusal::PeerDisconnected(
            m.string(field::disconnect::REASON),
        )),
        _ => Err(Refusal::Unexpected(ty)),
    }
}

fn take_ring0(v: &mut Vec<(u16, RingInfo)>) -> Option<RingInfo> {
    let i = v.iter().position(|(idx, _)| *idx == 0)?;
    Some(v.swap_remove(i).1)
}
