//! Packet ports. A port is a [`Nic`]: it fills buffers the caller reserved
//! from a [`maio::Pool`] with received frames, and transmits frames that sit
//! in pool buffers. Frames are placed [`HEADROOM`] bytes into their buffer so
//! that a forwarder can prepend headers without moving the packet.
//!
//! - [`afxdp`]: AF_XDP, its frames steered to the socket by our XDP program
//!   (`bpf/xsk.c`, `bpf/steer.h`) or by one the caller brings
//!   ([`afxdp::Program::Custom`]: the load balancer's own, in `lb::xdp`);
//!   the pieces it is made of ([`afxdp::XdpProgram`], [`afxdp::XskSocket`])
//!   are public for sockets and programs of other kinds.
//! - [`afpacket`]: AF_PACKET through a ring shared with the kernel.
//! - [`tap`]: TAP and TUN devices.
//! - [`pcap`]: pcap files, read as a port and written.
//! - [`mem`]: an in-memory port that repeats template frames and counts,
//!   or keeps, what it is sent (the forwarder's tests and benchmarks).
//! - [`neigh`]: the kernel's neighbour table and routes (next-hop MACs).
//! - [`policy`]: policy routing (a mark's rule, its table's default route).
//!
//! Nothing here knows about load balancing, and nothing is a benchmark's:
//! the veth bench's traffic generators and XDP programs are in `bench`.

pub mod afpacket;
pub mod afxdp;
pub mod mem;
pub mod neigh;
pub mod pcap;
pub mod policy;
mod rtnl;
pub mod tap;

use std::os::fd::BorrowedFd;

use maio::{Buf, Pool};

/// Bytes left free in front of every received frame.
pub const HEADROOM: usize = 128;

/// A frame in a pool buffer: where it starts and how long it is.
#[derive(Debug, PartialEq, Eq)]
pub struct Packet {
    /// The buffer (owned).
    pub buf: Buf,
    /// Offset of the frame in the buffer.
    pub off: u16,
    /// Length of the frame.
    pub len: u16,
}

impl Packet {
    /// Packs the descriptor into 64 bits (buffer index, offset, length) to
    /// move it through a ring of integers; [`Packet::unpack`] reverses it.
    pub fn pack(self) -> u64 {
        (u64::from(self.buf.into_raw()) << 32) | (u64::from(self.off) << 16) | u64::from(self.len)
    }

    /// Takes back a packed descriptor.
    ///
    /// # Safety
    /// `word` must come from [`Packet::pack`] of a packet of `pool`, and be
    /// unpacked at most once (see [`maio::Pool::from_raw`]).
    pub unsafe fn unpack(pool: &Pool, word: u64) -> Result<Packet, maio::Error> {
        // SAFETY: forwarded to the caller's contract.
        let buf = unsafe { pool.from_raw((word >> 32) as u32) }?;
        Ok(Packet {
            buf,
            off: (word >> 16) as u16,
            len: word as u16,
        })
    }

    /// The frame's bytes.
    pub fn frame<'a>(&'a self, pool: &'a Pool) -> &'a [u8] {
        &pool.data(&self.buf)[usize::from(self.off)..usize::from(self.off) + usize::from(self.len)]
    }
}

/// Why a port failed: the error of the kind of port that failed, which
/// keeps the system's answer (an [`std::io::Error`] stays one) as its source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An AF_PACKET port could not be opened or used.
    #[error(transparent)]
    AfPacket(#[from] afpacket::Error),
    /// An AF_XDP port, or one of its XDP programs, could not be set up or used.
    #[error(transparent)]
    AfXdp(#[from] afxdp::Error),
    /// A TAP or TUN device could not be opened.
    #[error(transparent)]
    Tap(#[from] tap::Error),
    /// A pcap file could not be read or written.
    #[error(transparent)]
    Pcap(#[from] pcap::Error),
}

impl Error {
    /// The system's answer, where the failure was a system call: match its
    /// [`std::io::Error::kind`] or [`std::io::Error::raw_os_error`].
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match self {
            Error::AfPacket(afpacket::Error::Sys { source, .. })
            | Error::AfXdp(afxdp::Error::Sys { source, .. })
            | Error::Tap(tap::Error::Sys { source, .. })
            | Error::Pcap(pcap::Error::Io { source, .. }) => Some(source),
            _ => None,
        }
    }
}

/// What to do about a failed system call, printed after the system's answer
/// as " (hint)"; nothing when there is no hint.
pub(crate) struct Hint(pub(crate) Option<&'static str>);

impl std::fmt::Display for Hint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(h) => write!(f, " ({h})"),
            None => Ok(()),
        }
    }
}

/// Port counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames received.
    pub rx: u64,
    /// Frames transmitted.
    pub tx: u64,
    /// Received frames dropped because they do not fit a buffer after the
    /// headroom.
    pub rx_too_big: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes transmitted.
    pub tx_bytes: u64,
    /// Received frames user space copied into pool buffers (AF_PACKET's
    /// ring, a pcap file); 0 where the kernel writes into the pool.
    pub rx_copies: u64,
    /// Transmitted frames user space copied out of the caller's buffer
    /// (AF_XDP's [`Nic::transmit`]); 0 for frames sent from the buffer
    /// they sit in ([`Nic::transmit_owned`] on AF_XDP, `sendmmsg`).
    pub tx_copies: u64,
}

impl PortStats {
    /// Adds another port's counters to these.
    pub fn add(&mut self, o: &PortStats) {
        self.rx += o.rx;
        self.tx += o.tx;
        self.rx_too_big += o.rx_too_big;
        self.rx_bytes += o.rx_bytes;
        self.tx_bytes += o.tx_bytes;
        self.rx_copies += o.rx_copies;
        self.tx_copies += o.tx_copies;
    }

    /// User-space copies (received and transmitted) per transmitted frame:
    /// for a forwarder, the copies each forwarded packet cost (0 when no
    /// frame was transmitted).
    pub fn copies_per_tx(&self) -> f64 {
        if self.tx == 0 {
            0.0
        } else {
            (self.rx_copies + self.tx_copies) as f64 / self.tx as f64
        }
    }
}

/// A ring slot: a buffer reserved for receiving, or holding a frame.
#[derive(Debug, Default)]
pub struct Slot {
    /// The buffer, if the slot holds one.
    pub buf: Option<Buf>,
    /// Offset of the frame in the buffer.
    pub off: u16,
    /// Length of the frame (0 for a reserved, empty buffer).
    pub len: u16,
}

impl Slot {
    /// The frame's bytes (empty without a buffer).
    pub fn frame<'a>(&'a self, pool: &'a Pool) -> &'a [u8] {
        match &self.buf {
            Some(b) => {
                &pool.data(b)[usize::from(self.off)..usize::from(self.off) + usize::from(self.len)]
            }
            None => &[],
        }
    }
}

/// A network interface as the forwarder sees it: descriptor slots, as a NIC
/// has.
pub trait Nic {
    /// Fills slots in order, each holding a reserved buffer, with received
    /// frames placed at [`HEADROOM`]; sets `off` and `len` and returns how
    /// many slots were filled (a prefix of `slots`).
    fn receive(&mut self, pool: &Pool, slots: &mut [Slot]) -> Result<usize, Error>;

    /// Transmits frames in order and returns how many were sent (a prefix;
    /// the rest may be retried). The buffers stay with the caller, who
    /// recycles them.
    fn transmit(&mut self, pool: &Pool, slots: &[Slot]) -> Result<usize, Error>;

    /// Transmits frames in order like [`Nic::transmit`], but may take a
    /// slot's buffer and send the frame from it without a copy: such a slot
    /// is left with `buf: None`, and the port gives the buffer back to the
    /// pool when the kernel is done with it. Slots that keep their buffer
    /// are the caller's to recycle, as after [`Nic::transmit`]. The frame
    /// must lie within the buffer as `off` and `len` say. By default, this
    /// is [`Nic::transmit`].
    fn transmit_owned(&mut self, pool: &Pool, slots: &mut [Slot]) -> Result<usize, Error> {
        self.transmit(pool, slots)
    }

    /// Blocks up to `timeout_ms` until frames may be ready: a datapath with
    /// nothing to do calls this instead of spinning, so an idle forwarder
    /// sleeps. Kernel ports sleep in `poll(2)` and wake as soon as a frame
    /// is ready (AF_PACKET: when the kernel hands over a block of its ring,
    /// at the latest after the block timeout). The default returns at once.
    fn wait(&mut self, timeout_ms: i32) {
        let _ = timeout_ms;
    }

    /// Whether no more frames will ever be received (end of a file).
    fn exhausted(&self) -> bool {
        false
    }

    /// Counters.
    fn stats(&self) -> PortStats;
}

/// Sets an integer socket option (one rustix lacks); whether the kernel
/// took it (errno says why not).
pub fn set_int_option(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: u32,
) -> bool {
    let v: libc::c_uint = value;
    // SAFETY: `fd` is a live socket; the option value is a `c_uint` (the
    // kernel reads an int for each option set here) that outlives the
    // call, passed with its exact size.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            level,
            name,
            std::ptr::from_ref(&v).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    r == 0
}

/// Reads an integer socket option (one rustix lacks); `None` where the
/// kernel refused (errno says why).
pub fn get_int_option(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> Option<u32> {
    let mut v: libc::c_uint = 0;
    let mut len = std::mem::size_of::<libc::c_uint>() as libc::socklen_t;
    // SAFETY: `fd` is a live socket; the kernel writes at most `len` bytes
    // (the size of the `c_uint` it points at, which outlives the call) and
    // stores the length it wrote in `len`.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            level,
            name,
            std::ptr::from_mut(&mut v).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_the_system_answer_and_the_hint() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<Error>();
        let e: Error = afpacket::Error::Sys {
            iface: "veth0".into(),
            op: "socket",
            source: std::io::Error::from_raw_os_error(libc::EPERM),
        }
        .into();
        assert_eq!(
            e.io_error().and_then(std::io::Error::raw_os_error),
            Some(libc::EPERM)
        );
        assert!(std::error::Error::source(&e).is_some());
        let text = e.to_string();
        assert!(text.starts_with("AF_PACKET on veth0: socket: "), "{text}");
        assert!(text.ends_with(" (needs root or CAP_NET_RAW)"), "{text}");
    }
}
