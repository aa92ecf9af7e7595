//! AF_PACKET ports: receive through a TPACKET_V3 ring of blocks shared with
//! the kernel, transmit with `sendmmsg` (qdisc bypassed), several sockets on
//! one interface spread by `PACKET_FANOUT` (hash).
//!
//! The kernel fills a block with frames and hands it over by setting
//! `TP_STATUS_USER` in the block header; we copy each frame into a pool
//! buffer (this is the kernel path: the copy is the price of not bypassing
//! the kernel) and hand the block back by writing `TP_STATUS_KERNEL`. Every
//! offset and length the kernel writes is checked against the block before
//! it is used.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use maio::Pool;
use memmap2::{MmapMut, MmapOptions};
use rustix::event::{PollFd, PollFlags};
use rustix::net::{AddressFamily, SocketFlags, SocketType};

use crate::{Hint, Nic, PortStats, Slot, HEADROOM};

/// Why an AF_PACKET port failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The interface does not exist here.
    #[error("AF_PACKET on {iface}: no such interface in this network namespace")]
    NoInterface {
        /// The interface.
        iface: String,
    },
    /// A system call failed.
    #[error("AF_PACKET on {iface}: {op}: {source}{}", hint(source))]
    Sys {
        /// The interface.
        iface: String,
        /// What was being done.
        op: &'static str,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
}

/// What to do about a failed system call of an AF_PACKET port.
fn hint(e: &io::Error) -> Hint {
    Hint(match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => Some("needs root or CAP_NET_RAW"),
        Some(libc::ENODEV) => Some("no such interface in this network namespace"),
        _ => None,
    })
}

/// AF_PACKET port parameters.
#[derive(Debug, Clone)]
pub struct Config {
    /// Interface name.
    pub interface: String,
    /// Fanout group id, to share the interface's traffic with other sockets
    /// of the same group by flow hash.
    pub fanout: Option<u16>,
    /// Bytes per ring block (a multiple of the page size).
    pub block_size: u32,
    /// Blocks in the ring.
    pub blocks: u32,
    /// Milliseconds after which the kernel hands over a partly filled block.
    pub block_timeout_ms: u32,
}

impl Config {
    /// Defaults for an interface: 16 blocks of 256 KiB, 1 ms block timeout.
    pub fn new(interface: &str) -> Self {
        Config {
            interface: interface.to_string(),
            fanout: None,
            block_size: 1 << 18,
            blocks: 16,
            block_timeout_ms: 1,
        }
    }
}

/// The AF_PACKET socket options this port sets, each with the value type
/// the kernel expects for it (rustix has none of them).
enum PacketOpt {
    /// `PACKET_VERSION`: an int.
    Version(libc::c_int),
    /// `PACKET_RX_RING`: a `tpacket_req3` (with TPACKET_V3).
    RxRing(libc::tpacket_req3),
    /// `PACKET_IGNORE_OUTGOING`: an int, 1.
    IgnoreOutgoing,
    /// `PACKET_QDISC_BYPASS`: an int, 1.
    QdiscBypass,
    /// `PACKET_FANOUT`: an int, group id and mode.
    Fanout(u32),
}

/// `setsockopt(fd, SOL_PACKET, ...)`.
fn set_packet_opt(fd: BorrowedFd<'_>, opt: PacketOpt) -> io::Result<()> {
    let one: libc::c_int = 1;
    let int = std::mem::size_of::<libc::c_int>();
    let (name, value, len): (_, *const libc::c_void, usize) = match &opt {
        PacketOpt::Version(v) => (libc::PACKET_VERSION, (v as *const libc::c_int).cast(), int),
        PacketOpt::RxRing(r) => (
            libc::PACKET_RX_RING,
            (r as *const libc::tpacket_req3).cast(),
            std::mem::size_of::<libc::tpacket_req3>(),
        ),
        PacketOpt::IgnoreOutgoing => (
            libc::PACKET_IGNORE_OUTGOING,
            (&one as *const libc::c_int).cast(),
            int,
        ),
        PacketOpt::QdiscBypass => (
            libc::PACKET_QDISC_BYPASS,
            (&one as *const libc::c_int).cast(),
            int,
        ),
        PacketOpt::Fanout(v) => (libc::PACKET_FANOUT, (v as *const u32).cast(), int),
    };
    // SAFETY: `value` points at `len` bytes of the type option `name` takes
    // (each variant of PacketOpt carries that type), alive for the call; the
    // kernel only reads them.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            name,
            value,
            len as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Waits up to `timeout_ms` (negative: without limit) for `fd` to be
/// readable; one `poll`, whose outcome the caller learns by looking.
pub(crate) fn poll_in(fd: BorrowedFd<'_>, timeout_ms: i32) {
    let timeout = (timeout_ms >= 0).then(|| rustix::event::Timespec {
        tv_sec: i64::from(timeout_ms / 1000),
        tv_nsec: i64::from(timeout_ms % 1000) * 1_000_000,
    });
    let mut p = [PollFd::new(&fd, PollFlags::IN)];
    let _ = rustix::event::poll(&mut p, timeout.as_ref());
}

/// Binds an AF_PACKET socket to every protocol (`ETH_P_ALL`) on the
/// interface with index `index`.
pub fn bind_all(fd: BorrowedFd<'_>, index: u32) -> io::Result<()> {
    let sll = libc::sockaddr_ll {
        sll_family: libc::AF_PACKET as u16,
        sll_protocol: (libc::ETH_P_ALL as u16).to_be(),
        sll_ifindex: index as i32,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 0,
        sll_addr: [0; 8],
    };
    // rustix has no AF_PACKET address type.
    // SAFETY: `sll` is a valid sockaddr_ll that lives across the call, and
    // its size is passed.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The index of an interface in this network namespace.
pub fn ifindex(name: &str) -> Option<u32> {
    // SIOCGIFINDEX needs some socket to carry it, as if_nametoindex(3) does.
    let s = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .ok()?;
    rustix::net::netdevice::name_to_index(&s, name).ok()
}

/// The MAC address of an interface (from sysfs).
pub fn mac_address(name: &str) -> Option<[u8; 6]> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{name}/address")).ok()?;
    let mut m = [0u8; 6];
    let mut parts = s.trim().split(':');
    for b in &mut m {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    Some(m)
}

/// An AF_PACKET port.
pub struct AfPacketPort {
    fd: OwnedFd,
    ring: MmapMut,
    cfg: Config,
    /// Block being read.
    block: u32,
    /// Frames of the current block already taken, and the offset of the next.
    taken: u32,
    next_off: usize,
    stats: PortStats,
    /// Frames the kernel reported dropped (ring full) at the last check.
    pub kernel_drops: u64,
    /// Frames whose transport checksum we completed (the sender left it to
    /// offload).
    pub csum_completed: u64,
    iov: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers inside `iov`/`msgs` are scratch space rebuilt on
// every transmit call and never dereferenced outside it; the port is used by
// one thread at a time (it is `Send`, not `Sync`).
unsafe impl Send for AfPacketPort {}

const BLOCK_STATUS_OFF: usize = 8; // tpacket_block_desc: version, offset_to_priv, then hdr.bh1.block_status
const NUM_PKTS_OFF: usize = 12;
const FIRST_PKT_OFF: usize = 16;

impl AfPacketPort {
    /// Opens, configures and binds the socket and maps its ring.
    pub fn open(cfg: Config) -> Result<Self, crate::Error> {
        let iface = cfg.interface.clone();
        let index = ifindex(&iface).ok_or_else(|| Error::NoInterface {
            iface: iface.clone(),
        })?;
        let sys = |op: &'static str| {
            let iface = iface.clone();
            move |source| Error::Sys { iface, op, source }
        };
        let fd = rustix::net::socket_with(
            AddressFamily::PACKET,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            Some(rustix::net::eth::ALL),
        )
        .map_err(|e| sys("socket")(e.into()))?;
        let s = fd.as_fd();
        let version = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
        set_packet_opt(s, PacketOpt::Version(version)).map_err(sys("PACKET_VERSION v3"))?;
        let req = libc::tpacket_req3 {
            tp_block_size: cfg.block_size,
            tp_block_nr: cfg.blocks,
            tp_frame_size: 2048,
            tp_frame_nr: cfg.block_size / 2048 * cfg.blocks,
            tp_retire_blk_tov: cfg.block_timeout_ms,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        set_packet_opt(s, PacketOpt::RxRing(req)).map_err(sys("PACKET_RX_RING"))?;
        // Our own transmissions must not come back as receptions.
        set_packet_opt(s, PacketOpt::IgnoreOutgoing).map_err(sys("PACKET_IGNORE_OUTGOING"))?;
        set_packet_opt(s, PacketOpt::QdiscBypass).map_err(sys("PACKET_QDISC_BYPASS"))?;
        let len = cfg.block_size as usize * cfg.blocks as usize;
        // SAFETY: maps the ring the kernel allocated for this socket, at
        // offset 0 with the length it was set up with. The kernel writes
        // blocks only while their status says it owns them; we read a block
        // only after seeing TP_STATUS_USER with acquire ordering.
        let ring = unsafe { MmapOptions::new().len(len).map_mut(s.as_raw_fd()) }
            .map_err(sys("mmap ring"))?;
        bind_all(s, index).map_err(sys("bind"))?;
        if let Some(group) = cfg.fanout {
            let arg: u32 = u32::from(group) | (libc::PACKET_FANOUT_HASH << 16);
            set_packet_opt(s, PacketOpt::Fanout(arg)).map_err(sys("PACKET_FANOUT"))?;
        }
        Ok(AfPacketPort {
            fd,
            ring,
            cfg,
            block: 0,
            taken: 0,
            next_off: 0,
            stats: PortStats::default(),
            kernel_drops: 0,
            csum_completed: 0,
            iov: Vec::new(),
            msgs: Vec::new(),
        })
    }

    fn status(&self, block: u32) -> &AtomicU32 {
        let at = block as usize * self.cfg.block_size as usize + BLOCK_STATUS_OFF;
        let p = self.ring[at..at + 4].as_ptr();
        // SAFETY: `p` is 4-byte aligned (blocks are page aligned, the field
        // is at offset 8) and inside the mapping, which lives as long as
        // `self`; the kernel and we access this word only atomically.
        unsafe { &*p.cast::<AtomicU32>() }
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_ne_bytes([
            self.ring[at],
            self.ring[at + 1],
            self.ring[at + 2],
            self.ring[at + 3],
        ])
    }

    fn u16_at(&self, at: usize) -> u16 {
        u16::from_ne_bytes([self.ring[at], self.ring[at + 1]])
    }

    /// Gives the current block back to the kernel and moves to the next.
    fn release_block(&mut self) {
        self.status(self.block)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.block = (self.block + 1) % self.cfg.blocks;
        self.taken = 0;
        self.next_off = 0;
    }

    /// Waits up to `timeout_ms` for a block to be ready.
    pub fn wait(&self, timeout_ms: i32) {
        if self.status(self.block).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0 {
            return;
        }
        poll_in(self.fd.as_fd(), timeout_ms);
    }
}

impl Nic for AfPacketPort {
    fn receive(&mut self, pool: &Pool, slots: &mut [Slot]) -> Result<usize, crate::Error> {
        let bs = self.cfg.block_size as usize;
        let room = pool.buf_size() - HEADROOM;
        let mut n = 0;
        while n < slots.len() {
            if self.status(self.block).load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                break;
            }
            let base = self.block as usize * bs;
            let num = self.u32_at(base + NUM_PKTS_OFF);
            if self.taken == 0 {
                self.next_off = self.u32_at(base + FIRST_PKT_OFF) as usize;
            }
            if self.taken >= num || self.next_off < 24 || self.next_off + 32 > bs {
                self.release_block();
                continue;
            }
            let off = self.next_off;
            let h = base + off;
            // tpacket3_hdr: next_offset, sec, nsec, snaplen, len, status, mac (u16), net (u16).
            let next = self.u32_at(h) as usize;
            let snap = self.u32_at(h + 12) as usize;
            let status = self.u32_at(h + 20);
            let mac = usize::from(self.u16_at(h + 24));
            self.taken += 1;
            self.next_off = if next == 0 { bs } else { off + next };
            self.stats.rx += 1;
            if off + mac + snap > bs || snap == 0 {
                continue; // inconsistent with the block: skip it
            }
            if snap > room {
                self.stats.rx_too_big += 1;
                continue;
            }
            let slot = &mut slots[n];
            let Some(buf) = slot.buf.as_mut() else { break };
            let frame = &self.ring[h + mac..h + mac + snap];
            let dst = &mut pool.data_mut(buf)[HEADROOM..HEADROOM + snap];
            dst.copy_from_slice(frame);
            if status & libc::TP_STATUS_CSUMNOTREADY != 0 {
                // A local sender (a veth peer) left the transport checksum
                // to offload; what leaves us must carry a complete one.
                packet::checksum::complete_transport(dst);
                self.csum_completed += 1;
            }
            slot.off = HEADROOM as u16;
            slot.len = snap as u16;
            self.stats.rx_bytes += snap as u64;
            self.stats.rx_copies += 1;
            n += 1;
            if self.taken >= num {
                self.release_block();
            }
        }
        Ok(n)
    }

    fn transmit(&mut self, pool: &Pool, slots: &[Slot]) -> Result<usize, crate::Error> {
        let batch = slots.len().min(64);
        self.iov.clear();
        for s in &slots[..batch] {
            let f = s.frame(pool);
            self.iov.push(libc::iovec {
                iov_base: f.as_ptr() as *mut libc::c_void,
                iov_len: f.len(),
            });
        }
        self.msgs.clear();
        for v in self.iov.iter_mut() {
            // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
            self.msgs.push(m);
        }
        if self.msgs.is_empty() {
            return Ok(0);
        }
        // SAFETY: each mmsghdr points at one iovec in `self.iov`, which
        // points at a frame in a pool buffer the caller owns; all outlive
        // the call, and the kernel only reads them.
        let r = unsafe {
            libc::sendmmsg(
                self.fd.as_raw_fd(),
                self.msgs.as_mut_ptr(),
                self.msgs.len() as u32,
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => Ok(0),
                _ => Err(Error::Sys {
                    iface: self.cfg.interface.clone(),
                    op: "sendmmsg",
                    source: e,
                }
                .into()),
            };
        }
        let sent = r as usize;
        for s in &slots[..sent] {
            self.stats.tx += 1;
            self.stats.tx_bytes += u64::from(s.len);
        }
        Ok(sent)
    }

    fn wait(&mut self, timeout_ms: i32) {
        AfPacketPort::wait(self, timeout_ms);
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}
