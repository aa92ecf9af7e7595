//! MAIO's socket I/O over io_uring: what the paper built into the kernel,
//! made of what Linux 6.x ships.
//!
//! | paper                                  | here                                           |
//! |----------------------------------------|------------------------------------------------|
//! | kernel thread polling a shared ring    | `IORING_SETUP_SQPOLL`                          |
//! | I/O pages pre-mapped for the kernel    | the whole pool registered as fixed buffers     |
//! | zero-copy send of an I/O page          | `IORING_OP_SEND_ZC` from a fixed buffer (datagrams); on TCP, every buffer posted while the previous message is in flight as one `SENDMSG_ZC` |
//! | receive into I/O pages, sg list out    | a provided-buffer ring of pool buffers, multishot (bundled) receive |
//! | standard (copy) mode for small sends   | copy into a pool buffer, `IORING_OP_SEND`; batched datagrams of one size to one UDP socket copied end to end into pool buffers and sent as one `SENDMSG` with `UDP_SEGMENT` |
//!
//! One [`Ring`] per thread. Sockets are registered as fixed files and named
//! by a [`SockId`]. Buffers keep their pool state the whole way: a buffer
//! handed to a send is `InFlight` until the kernel's notification says it is
//! done with it, then `User` again (and the caller learns whether the kernel
//! copied it); a received buffer is `Received` until the caller gives it
//! back.
//!
//! Two things the paper's kernel did not need and a stock kernel does: where
//! the kernel copies zero-copy data anyway (delivery to a local socket), a
//! copied zero-copy send costs about twice an ordinary one, so once a
//! socket's notification says "copied" its sends go as ordinary sends from
//! the same buffers, with a zero-copy probe every [`ZC_PROBE_EVERY`]
//! ([`Config::adaptive_zc`]); and a receive that found every pool buffer
//! taken (the paper's starvation) is re-armed only when buffers come back.
//!
//! One thing the paper's figures measured a kernel thread for and a stock
//! kernel does better: the cost of a small datagram is mostly the UDP/IP
//! send path run once per datagram, not the system call (`sendmmsg`, which
//! saves 31 of 32 calls, gains under 10% here). With batched submission,
//! copy-mode datagrams of one size queued for one UDP socket between batch
//! points go out as a single message that the kernel segments (UDP GSO,
//! [`Config::udp_gso`]): one trip down the stack for up to
//! [`GSO_MAX_SEGMENTS`] datagrams, each still its own datagram on the wire.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use memmap2::MmapMut;

use crate::{Buf, Handle, Pool, State};

/// Errors of the socket layer; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum UringError {
    /// io_uring is switched off by the administrator.
    #[error("io_uring is disabled on this system (kernel.io_uring_disabled = {0}); enable it with `sysctl -w kernel.io_uring_disabled=0` as root")]
    Disabled(String),
    /// Locked memory limit too low for registering the pool.
    #[error("cannot register {bytes} bytes of buffers with io_uring: RLIMIT_MEMLOCK is {limit}; raise it (`ulimit -l unlimited`, or LimitMEMLOCK= in a systemd unit) or run with CAP_IPC_LOCK")]
    Memlock {
        /// Bytes to register.
        bytes: usize,
        /// The current limit, as text.
        limit: String,
    },
    /// The kernel lacks an operation.
    #[error("this kernel does not support {what} (needs Linux {needs} or later): {source}")]
    TooOld {
        /// The operation.
        what: &'static str,
        /// Minimum kernel.
        needs: &'static str,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// Any other system error.
    #[error("{what}: {source}")]
    Sys {
        /// What failed.
        what: &'static str,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// A pool error (exhaustion, ownership).
    #[error(transparent)]
    Pool(#[from] crate::Error),
    /// An unknown or closed socket id.
    #[error("socket {0} is not open on this ring")]
    BadSocket(u32),
    /// The submission queue stayed full.
    #[error("submission queue full")]
    Busy,
}

/// Result alias.
pub type Result<T> = std::result::Result<T, UringError>;

fn sys(what: &'static str) -> impl FnOnce(std::io::Error) -> UringError {
    move |source| UringError::Sys { what, source }
}

/// A socket registered on a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SockId(pub u32);

/// Ring settings.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Submission queue entries.
    pub entries: u32,
    /// Use a kernel polling thread for submissions (no system call per send).
    pub sqpoll: bool,
    /// How long the polling thread spins before it sleeps, in milliseconds
    /// (the kernel's minimum is one tick).
    pub sqpoll_idle_ms: u32,
    /// Pin the polling thread to this CPU (`IORING_SETUP_SQ_AFF`), so that
    /// it does not share a core with the application thread.
    pub sqpoll_cpu: Option<u32>,
    /// Without SQPOLL: leave requests in the submission queue and hand them
    /// to the kernel together, in one `io_uring_enter`, at the next
    /// [`Ring::completions`], [`Ring::recv_sg`], [`Ring::wait`] or
    /// [`Ring::submit`] (or when the queue is full), instead of one system
    /// call per request. Ignored with SQPOLL, which never needs the call.
    pub batch_submit: bool,
    /// Pool buffers lent to the kernel for receiving (a power of two).
    pub rx_buffers: u16,
    /// Most sockets on one ring.
    pub max_sockets: u32,
    /// Stop asking for zero copy on a socket whose zero-copy data the
    /// kernel copies anyway (a local destination): later sends from the
    /// same buffers go as ordinary sends, with a zero-copy probe every
    /// [`ZC_PROBE_EVERY`] sends to notice a change of route.
    pub adaptive_zc: bool,
    /// With [`Config::batch_submit`]: copy-mode datagrams of one size sent
    /// to one UDP socket before a batch point go as one `SENDMSG` with a
    /// `UDP_SEGMENT` control message (the kernel cuts it into the same
    /// datagrams, after the UDP/IP send path ran once for all). A socket on
    /// which the kernel refuses segmentation (`SO_NO_CHECK`, a route through
    /// IPsec, a datagram larger than the path MTU) gets its refused batch
    /// resent datagram by datagram and sends that way from then on.
    pub udp_gso: bool,
}

/// Most datagrams in one segmented send (the kernel's `UDP_MAX_SEGMENTS`:
/// 64 in older kernels, more in newer ones; 64 works on all).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most payload bytes in one segmented send (an IPv4 datagram's limit,
/// less headers).
const GSO_MAX_BYTES: u32 = 65_000;

/// On a socket whose zero-copy sends the kernel copied, one send in this
/// many is still sent zero-copy, to find out whether it still copies.
pub const ZC_PROBE_EVERY: u32 = 128;

impl Default for Config {
    fn default() -> Self {
        Config {
            entries: 256,
            sqpoll: true,
            sqpoll_idle_ms: 50,
            sqpoll_cpu: None,
            batch_submit: false,
            rx_buffers: 256,
            max_sockets: 64,
            adaptive_zc: true,
            udp_gso: true,
        }
    }
}

/// A send that the kernel has finished with.
#[derive(Debug)]
pub struct Sent {
    /// The socket.
    pub sock: SockId,
    /// The buffer, back in the caller's hands (state `User`); `None` for
    /// copy-mode sends, whose buffer went back to the pool.
    pub buf: Option<Buf>,
    /// Bytes sent, or a negative errno.
    pub result: i32,
    /// The kernel copied the data after all (a zero-copy send to a local
    /// socket, for example).
    pub copied: bool,
}

/// A received buffer: `len` bytes at the start of `buf` (state `Received`).
#[derive(Debug)]
pub struct RxBuf {
    /// The buffer.
    pub buf: Buf,
    /// Bytes in it.
    pub len: usize,
}

const OP_SEND_ZC: u64 = 1;
const OP_SEND: u64 = 2;
const OP_RECV: u64 = 3;
const OP_SENDMSG_ZC: u64 = 4;
/// An ordinary send of the caller's buffer (the kernel copies on this route).
const OP_SEND_PLAIN: u64 = 5;
/// An ordinary SENDMSG of a scatter-gather list (same reason).
const OP_SENDMSG: u64 = 6;
/// Copy-mode datagrams sent as one segmented SENDMSG (UDP GSO).
const OP_SENDMSG_GSO: u64 = 8;
const BGID: u16 = 7;
/// `IORING_SEND_ZC_REPORT_USAGE` (linux/io_uring.h): report in the
/// notification whether the kernel copied after all.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED`.
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

fn ud(op: u64, sock: u32, idx: u32) -> u64 {
    (op << 56) | ((sock as u64 & 0xff_ffff) << 32) | idx as u64
}

#[derive(Debug, Default)]
struct Sock {
    fd: Option<OwnedFd>,
    /// A byte stream (TCP): its sends must stay in order.
    stream: bool,
    /// Sends waiting for the chain in flight to finish.
    queued: VecDeque<Pending>,
    /// Sends of the chain in flight whose first completion has not come.
    chain: u32,
    recv_armed: bool,
    rx: VecDeque<(u32, usize)>,
    eof: bool,
    error: Option<i32>,
    /// The kernel reported copying this socket's last zero-copy send.
    kernel_copies: bool,
    /// Ordinary sends since the last zero-copy probe.
    since_probe: u32,
    /// The last receive stopped because every receive buffer was taken
    /// (the paper's starvation): re-arm only when buffers come back.
    starved: bool,
    /// A UDP socket whose copy-mode datagrams may be sent segmented.
    gso: bool,
    /// Copy-mode datagrams waiting for the batch point.
    run: Run,
}

/// Copy-mode datagrams for one segmented send, copied end to end into pool
/// buffers (the kernel reads a few large pieces, not one per datagram):
/// all of the first one's length but the last, which may be shorter.
#[derive(Debug, Default)]
struct Run {
    /// Pool buffers (index, bytes used).
    bufs: Vec<(u32, u32)>,
    /// The segment size: the first datagram's length.
    seg: u32,
    datagrams: u32,
    bytes: u32,
    /// A datagram shorter than `seg` came: it must be the last.
    closed: bool,
}

/// A send waiting its turn on a stream socket.
#[derive(Debug)]
enum Pending {
    /// A prepared request (copy mode, a forwarded list).
    Entry(squeue::Entry),
    /// A zero-copy send of the caller's buffer: consecutive ones go out
    /// together as one SENDMSG_ZC.
    Zc { idx: u32, len: u32 },
}

/// Whose buffers a scatter-gather message carries.
#[derive(Clone, Copy)]
enum MsgKind {
    /// Received buffers forwarded: back to the receive ring when done.
    Forward,
    /// The caller's buffers (`send_zc`): back to the caller, each with its
    /// own completion.
    User,
    /// Copy-mode datagrams sent segmented: back to the pool, each with its
    /// own completion.
    Datagrams,
}

/// A scatter-gather message whose memory must stay put while the kernel
/// reads it.
struct SgMsg {
    hdr: libc::msghdr,
    iov: Vec<libc::iovec>,
    /// Room for one control message with a u16 (`UDP_SEGMENT`), 8-aligned
    /// as `cmsghdr` wants.
    ctrl: [u64; 4],
    /// A segmented send's segment size (0 otherwise).
    seg: u32,
}

// SAFETY: the raw pointers in an SgMsg point into its own `iov` and into the
// pool's region; it moves between threads only together with the Ring that
// owns both, and is never read by us after it is built.
unsafe impl Send for SgMsg {}

/// The provided-buffer ring: entries of {addr, len, bid}; the tail is the
/// last 16 bits of entry 0.
struct BufRing {
    mem: MmapMut,
    mask: u16,
    tail: u16,
    head: u16,
    /// bid -> pool index
    bids: Vec<u32>,
}

impl BufRing {
    fn push(&mut self, bid: u16, addr: u64, len: u32) {
        let at = (self.tail & self.mask) as usize * 16;
        let e = &mut self.mem[at..at + 16];
        e[0..8].copy_from_slice(&addr.to_ne_bytes());
        e[8..12].copy_from_slice(&len.to_ne_bytes());
        e[12..14].copy_from_slice(&bid.to_ne_bytes());
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish(&mut self) {
        // SAFETY: offset 14 of entry 0 is the ring tail the kernel reads; it
        // is 2-byte aligned inside our page-aligned mapping.
        let t = unsafe { &*(self.mem.as_ptr().add(14) as *const AtomicU16) };
        t.store(self.tail, Ordering::Release);
    }

    fn bid_at(&self, pos: u16) -> u16 {
        let at = (pos & self.mask) as usize * 16;
        u16::from_ne_bytes([self.mem[at + 12], self.mem[at + 13]])
    }
}

/// One thread's io_uring with the pool registered, its sockets and its
/// receive buffers.
pub struct Ring {
    ring: IoUring,
    pool: Pool,
    handle: Handle,
    socks: Vec<Sock>,
    bufring: BufRing,
    done: VecDeque<Sent>,
    zc_results: std::collections::HashMap<u32, i32>,
    /// Scatter-gather sends in flight: their msghdr and iovecs (which the
    /// kernel reads until the send completes) and the buffers they carry.
    msgs: std::collections::HashMap<u32, (Box<SgMsg>, Vec<u32>, i32, MsgKind)>,
    next_msg: u32,
    region: (usize, usize),
    in_flight: u32,
    sqpoll: bool,
    /// Requests wait in the submission queue for the next batch point.
    batch_submit: bool,
    bundles: bool,
    adaptive_zc: bool,
    udp_gso: bool,
    /// Sends (requests) that asked the kernel for zero copy.
    pub zc_sends: u64,
    /// Sends of pool buffers made as ordinary sends because the kernel
    /// copies on that socket's route anyway (see [`Config::adaptive_zc`]).
    pub plain_sends: u64,
    /// Submissions that needed a system call (SQPOLL asleep, or no SQPOLL).
    pub enters: u64,
    /// Segmented sends (UDP GSO, [`Config::udp_gso`]) and the datagrams
    /// they carried.
    pub gso_sends: u64,
    /// Datagrams carried by [`Ring::gso_sends`].
    pub gso_datagrams: u64,
    /// Segmented sends the kernel refused, resent datagram by datagram
    /// (their sockets send unsegmented from then on).
    pub gso_refused: u64,
    /// System calls made to wait for completions.
    pub waits: u64,
}

fn check_disabled() -> Option<UringError> {
    let v = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").ok()?;
    let v = v.trim().to_string();
    (v != "0").then_some(UringError::Disabled(v))
}

fn memlock() -> String {
    match rustix::process::getrlimit(rustix::process::Resource::Memlock).current {
        None => "unlimited".into(),
        Some(cur) => format!("{} KiB", cur / 1024),
    }
}

impl Ring {
    /// Set up a ring over `pool`: SQPOLL if asked, the pool registered as
    /// fixed buffers, a sparse fixed-file table, and `rx_buffers` pool
    /// buffers lent to the kernel for receiving.
    pub fn new(pool: &Pool, cfg: Config) -> Result<Ring> {
        let mut b = IoUring::builder();
        if cfg.sqpoll {
            b.setup_sqpoll(cfg.sqpoll_idle_ms);
            if let Some(cpu) = cfg.sqpoll_cpu {
                b.setup_sqpoll_cpu(cpu);
            }
        } else {
            // Completions of requests that finish later (a multishot
            // receive) are posted at our next system call instead of
            // interrupting us.
            b.setup_coop_taskrun();
        }
        let ring = b.build(cfg.entries).map_err(|e| {
            if let Some(d) = check_disabled() {
                return d;
            }
            match e.raw_os_error() {
                Some(libc::ENOMEM) => UringError::Memlock {
                    bytes: 0,
                    limit: memlock(),
                },
                Some(libc::ENOSYS) => UringError::TooOld {
                    what: "io_uring",
                    needs: "5.1",
                    source: e,
                },
                _ => UringError::Sys {
                    what: "io_uring_setup",
                    source: e,
                },
            }
        })?;
        let (base, len) = pool.region();
        // One iovec per GiB: the kernel's limit per registered buffer.
        let iovs: Vec<libc::iovec> = (0..len.div_ceil(1 << 30))
            .map(|i| libc::iovec {
                // Inside the region: i * 1 GiB < len.
                iov_base: base.wrapping_add(i << 30).cast(),
                iov_len: (len - (i << 30)).min(1 << 30),
            })
            .collect();
        // SAFETY: the region outlives the ring: we hold a clone of the pool,
        // and the ring is dropped (unregistering) before it.
        unsafe { ring.submitter().register_buffers(&iovs) }.map_err(|e| {
            match e.raw_os_error() {
                Some(libc::ENOMEM) | Some(libc::EPERM) => UringError::Memlock {
                    bytes: len,
                    limit: memlock(),
                },
                _ => UringError::Sys {
                    what: "register the pool as fixed buffers",
                    source: e,
                },
            }
        })?;
        ring.submitter()
            .register_files_sparse(cfg.max_sockets)
            .map_err(|e| UringError::TooOld {
                what: "sparse fixed files",
                needs: "5.19",
                source: e,
            })?;
        let n = cfg.rx_buffers.max(2).next_power_of_two();
        let mem = MmapMut::map_anon((n as usize * 16).max(4096)).map_err(sys("map buffer ring"))?;
        // SAFETY: the mapping lives in `bufring`, owned by the returned Ring,
        // which unregisters the group when the io_uring is dropped with it.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(mem.as_ptr() as u64, n, BGID, 0)
        }
        .map_err(|e| UringError::TooOld {
            what: "provided buffer rings",
            needs: "5.19",
            source: e,
        })?;
        let mut r = Ring {
            ring,
            pool: pool.clone(),
            handle: pool.handle(),
            socks: (0..cfg.max_sockets).map(|_| Sock::default()).collect(),
            bufring: BufRing {
                mem,
                mask: n - 1,
                tail: 0,
                head: 0,
                bids: Vec::with_capacity(n as usize),
            },
            done: VecDeque::new(),
            zc_results: Default::default(),
            msgs: Default::default(),
            next_msg: 0,
            region: (base as usize, len),
            in_flight: 0,
            sqpoll: cfg.sqpoll,
            batch_submit: cfg.batch_submit && !cfg.sqpoll,
            bundles: true,
            adaptive_zc: cfg.adaptive_zc,
            udp_gso: cfg.udp_gso && cfg.batch_submit && !cfg.sqpoll,
            zc_sends: 0,
            plain_sends: 0,
            enters: 0,
            gso_sends: 0,
            gso_datagrams: 0,
            gso_refused: 0,
            waits: 0,
        };
        for bid in 0..n {
            let b = r.handle.alloc()?;
            r.pool.transition(&b, State::User, State::InFlight)?;
            let idx = b.into_raw();
            r.bufring.bids.push(idx);
            let addr = r.addr_of(idx);
            r.bufring.push(bid, addr, r.pool.buf_size() as u32);
        }
        r.bufring.publish();
        Ok(r)
    }

    /// The pool this ring sends from and receives into.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// This ring's allocation handle (its magazines).
    pub fn handle(&mut self) -> &mut Handle {
        &mut self.handle
    }

    /// Whether submissions go through a kernel polling thread.
    pub fn sqpoll(&self) -> bool {
        self.sqpoll
    }

    fn addr_of(&self, idx: u32) -> u64 {
        (self.region.0 + idx as usize * self.pool.buf_size()) as u64
    }

    /// Register a connected socket; the ring owns it from now on.
    pub fn add_socket(&mut self, fd: OwnedFd) -> Result<SockId> {
        let slot = self
            .socks
            .iter()
            .position(|s| s.fd.is_none())
            .ok_or(UringError::Sys {
                what: "register socket",
                source: std::io::Error::other("fixed file table full"),
            })?;
        self.ring
            .submitter()
            .register_files_update(slot as u32, &[fd.as_raw_fd()])
            .map_err(sys("register socket as a fixed file"))?;
        let kind = rustix::net::sockopt::socket_type(&fd).ok();
        let stream = kind == Some(rustix::net::SocketType::STREAM);
        let udp = kind == Some(rustix::net::SocketType::DGRAM)
            && rustix::net::sockopt::socket_protocol(&fd)
                .is_ok_and(|p| p == Some(rustix::net::ipproto::UDP));
        self.socks[slot] = Sock {
            fd: Some(fd),
            stream,
            gso: udp && self.udp_gso,
            ..Sock::default()
        };
        Ok(SockId(slot as u32))
    }

    /// Connect a TCP socket (blocking) and register it.
    pub fn connect_tcp(&mut self, addr: std::net::SocketAddr) -> Result<SockId> {
        let s = std::net::TcpStream::connect(addr).map_err(sys("connect"))?;
        let _ = s.set_nodelay(true);
        self.add_socket(OwnedFd::from(s))
    }

    /// Unregister and close a socket.
    pub fn close(&mut self, s: SockId) -> Result<()> {
        let sock = self.sock(s)?;
        sock.fd = None;
        let _ = self.ring.submitter().register_files_update(s.0, &[-1]);
        Ok(())
    }

    fn sock(&mut self, s: SockId) -> Result<&mut Sock> {
        match self.socks.get_mut(s.0 as usize) {
            Some(x) if x.fd.is_some() => Ok(x),
            _ => Err(UringError::BadSocket(s.0)),
        }
    }

    fn push(&mut self, e: squeue::Entry) -> Result<()> {
        // SAFETY: every entry we build points at pool memory (registered and
        // alive while the ring lives) or at nothing; buffers in flight are
        // marked InFlight so safe code cannot touch or free them.
        if unsafe { self.ring.submission().push(&e) }.is_err() {
            self.enter()?;
            self.reap();
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&e) }.map_err(|_| UringError::Busy)?;
        }
        Ok(())
    }

    /// Whether requests are handed to the kernel in batches (see
    /// [`Config::batch_submit`]).
    pub fn batch_submit(&self) -> bool {
        self.batch_submit
    }

    /// A request was queued: hand it over now, unless requests are batched
    /// (then the next batch point does, see [`Config::batch_submit`]).
    fn kick(&mut self) -> Result<()> {
        if self.batch_submit {
            return Ok(());
        }
        self.enter()
    }

    /// Hand queued submissions to the kernel. With SQPOLL this is a memory
    /// write unless the polling thread went to sleep; without, one
    /// `io_uring_enter` for everything queued (datagrams waiting to be sent
    /// segmented included).
    pub fn submit(&mut self) -> Result<()> {
        self.flush_runs()?;
        self.enter()
    }

    fn enter(&mut self) -> Result<()> {
        if self.sqpoll {
            self.ring.submission().sync();
            if !self.ring.submission().need_wakeup() {
                return Ok(());
            }
        } else if self.ring.submission().is_empty() {
            return Ok(());
        }
        self.enters += 1;
        self.ring.submit().map_err(sys("io_uring_enter"))?;
        Ok(())
    }

    /// Zero-copy send of `len` bytes of `buf` (a fixed buffer). The buffer
    /// is `InFlight` until [`Ring::completions`] hands it back.
    pub fn send_zc(&mut self, s: SockId, buf: Buf, len: usize) -> Result<()> {
        self.sock(s)?;
        let len = len.min(self.pool.buf_size());
        self.pool.transition(&buf, State::User, State::InFlight)?;
        let idx = buf.into_raw();
        self.in_flight += 1;
        if self.sock(s)?.stream {
            self.sock(s)?.queued.push_back(Pending::Zc {
                idx,
                len: len as u32,
            });
            self.flush_sends(s)?;
            return self.kick();
        }
        let addr = self.addr_of(idx) as *const u8;
        let e = if self.want_zc(s)? {
            opcode::SendZc::new(types::Fixed(s.0), addr, len as u32)
                .buf_index(Some(0))
                .flags(libc::MSG_WAITALL)
                .zc_flags(SEND_ZC_REPORT_USAGE)
                .build()
                .user_data(ud(OP_SEND_ZC, s.0, idx))
        } else {
            opcode::Send::new(types::Fixed(s.0), addr, len as u32)
                .flags(libc::MSG_WAITALL)
                .build()
                .user_data(ud(OP_SEND_PLAIN, s.0, idx))
        };
        self.sock(s)?.queued.push_back(Pending::Entry(e));
        self.flush_sends(s)?;
        self.kick()
    }

    /// Whether the next send of pool buffers on `s` asks for zero copy:
    /// yes unless the kernel copied this socket's last zero-copy send, and
    /// then still once every [`ZC_PROBE_EVERY`] sends. A zero-copy send
    /// that the kernel ends up copying costs more than an ordinary one (it
    /// is set up for zero copy, copied later and notified separately), so
    /// on a route that copies anyway the ordinary send is the cheaper way
    /// to send the same buffers. Linux's MSG_ZEROCOPY documentation gives
    /// the same advice.
    fn want_zc(&mut self, s: SockId) -> Result<bool> {
        let adaptive = self.adaptive_zc;
        let sock = self.sock(s)?;
        let zc = if !adaptive || !sock.kernel_copies || sock.since_probe + 1 >= ZC_PROBE_EVERY {
            sock.since_probe = 0;
            true
        } else {
            sock.since_probe += 1;
            false
        };
        if zc {
            self.zc_sends += 1;
        } else {
            self.plain_sends += 1;
        }
        Ok(zc)
    }

    /// A zero-copy notification for socket `sock` said whether the kernel
    /// copied.
    fn note_copied(&mut self, sock: u32, copied: bool) {
        if let Some(s) = self.socks.get_mut(sock as usize) {
            s.kernel_copies = copied;
        }
    }

    /// Sends on one stream socket must reach it in order, but io_uring
    /// lets a later send pass an earlier one that had to wait for socket
    /// space. So a socket has one batch in flight at a time: the caller's
    /// zero-copy buffers as one SENDMSG_ZC, or prepared requests as one
    /// linked chain (IOSQE_IO_LINK: each starts when the previous finished);
    /// the next batch goes when this one has completed.
    fn flush_sends(&mut self, s: SockId) -> Result<()> {
        let sock = self.sock(s)?;
        if !sock.stream {
            // Datagrams carry their own boundaries: no ordering to keep.
            let all: Vec<Pending> = sock.queued.drain(..).collect();
            for p in all {
                if let Pending::Entry(e) = p {
                    self.push(e)?;
                }
            }
            return Ok(());
        }
        if sock.chain > 0 || sock.queued.is_empty() {
            return Ok(());
        }
        // Zero-copy sends of the caller's buffers at the head of the queue
        // go out together as one message, as the paper's kernel thread takes
        // every buffer posted to the ring at once.
        if matches!(sock.queued.front(), Some(Pending::Zc { .. })) {
            let mut items = Vec::new();
            while items.len() < 64 {
                match sock.queued.front() {
                    Some(&Pending::Zc { idx, len }) => {
                        items.push((idx, len));
                        sock.queued.pop_front();
                    }
                    _ => break,
                }
            }
            sock.chain = 1;
            let e = self.sg_message(s, &items, MsgKind::User)?;
            return self.push_chain(vec![e]);
        }
        let mut chain: Vec<squeue::Entry> = Vec::new();
        while chain.len() < 32 && matches!(sock.queued.front(), Some(Pending::Entry(_))) {
            if let Some(Pending::Entry(e)) = sock.queued.pop_front() {
                chain.push(e);
            }
        }
        sock.chain = chain.len() as u32;
        let last = chain.len().saturating_sub(1);
        let chain: Vec<squeue::Entry> = chain
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                if i < last {
                    e.flags(squeue::Flags::IO_LINK)
                } else {
                    e
                }
            })
            .collect();
        self.push_chain(chain)
    }

    /// Build the SENDMSG_ZC (or, where the kernel copies anyway, the
    /// SENDMSG) carrying pool buffers `items` (index, length) to socket `s`;
    /// the message stays in `msgs` until the kernel is done with it.
    fn sg_message(
        &mut self,
        s: SockId,
        items: &[(u32, u32)],
        kind: MsgKind,
    ) -> Result<squeue::Entry> {
        let zc = self.want_zc(s)?;
        let m = self.sg_msg(items);
        let id = self.keep_msg(m, items, kind);
        let m = &self.msgs[&id].0;
        let e = if zc {
            opcode::SendMsgZc::new(types::Fixed(s.0), &m.hdr)
                .flags(libc::MSG_WAITALL as u32)
                .ioprio(SEND_ZC_REPORT_USAGE)
                .build()
                .user_data(ud(OP_SENDMSG_ZC, s.0, id))
        } else {
            opcode::SendMsg::new(types::Fixed(s.0), &m.hdr)
                .flags(libc::MSG_WAITALL as u32)
                .build()
                .user_data(ud(OP_SENDMSG, s.0, id))
        };
        Ok(e)
    }

    /// A message (no name, no control data yet) whose iovecs are pool
    /// buffers `items` (index, length).
    fn sg_msg(&self, items: &[(u32, u32)]) -> Box<SgMsg> {
        let iov: Vec<libc::iovec> = items
            .iter()
            .map(|&(idx, len)| libc::iovec {
                iov_base: self.addr_of(idx) as *mut _,
                iov_len: len as usize,
            })
            .collect();
        let mut m = Box::new(SgMsg {
            // SAFETY: msghdr is plain data (integers and raw pointers), for
            // which all-zero is a valid value: no name, no control data.
            hdr: unsafe { std::mem::zeroed() },
            iov,
            ctrl: [0; 4],
            seg: 0,
        });
        m.hdr.msg_iov = m.iov.as_mut_ptr();
        m.hdr.msg_iovlen = m.iov.len();
        m
    }

    /// Keep message `m` (carrying buffers `items`) until its completion;
    /// returns its id.
    fn keep_msg(&mut self, m: Box<SgMsg>, items: &[(u32, u32)], kind: MsgKind) -> u32 {
        let id = self.next_msg;
        self.next_msg = self.next_msg.wrapping_add(1);
        let idxs = items.iter().map(|x| x.0).collect();
        self.msgs.insert(id, (m, idxs, 0, kind));
        id
    }

    /// Publish entries in one step: with SQPOLL the kernel thread could
    /// otherwise take the first half of a chain alone and break the link.
    fn push_chain(&mut self, chain: Vec<squeue::Entry>) -> Result<()> {
        if chain.is_empty() {
            return Ok(());
        }
        let free = {
            let sq = self.ring.submission();
            sq.capacity() - sq.len()
        };
        if free < chain.len() {
            self.enter()?;
            while {
                let sq = self.ring.submission();
                sq.capacity() - sq.len() < chain.len()
            } {
                self.wait(Duration::from_micros(100));
                self.ring.submission().sync();
            }
        }
        // SAFETY: as in `push`: the entries point at registered pool memory
        // whose buffers are marked InFlight, and at messages kept in `msgs`
        // until their completion.
        unsafe { self.ring.submission().push_multiple(&chain) }.map_err(|_| UringError::Busy)?;
        Ok(())
    }

    fn send_done(&mut self, sock: u32) {
        if let Some(s) = self.socks.get_mut(sock as usize) {
            if s.stream {
                s.chain = s.chain.saturating_sub(1);
            }
        }
    }

    /// Copy-mode send (the paper's standard mode, for small messages): the
    /// bytes are copied into pool buffers and sent; those buffers go back to
    /// the pool on completion. On a datagram socket each buffer's worth is a
    /// datagram, and an empty message an empty datagram.
    pub fn send_copy(&mut self, s: SockId, data: &[u8]) -> Result<()> {
        let sock = self.sock(s)?;
        let gso = sock.gso;
        // On a datagram socket an empty message is an empty datagram (which
        // `chunks` would not yield); on a stream it is nothing.
        let empty_datagram = (data.is_empty() && !sock.stream).then_some(data);
        for chunk in data.chunks(self.pool.buf_size()).chain(empty_datagram) {
            if gso && !chunk.is_empty() {
                self.add_to_run(s, chunk)?;
                continue;
            }
            if gso {
                // An empty datagram cannot be a segment: it goes alone,
                // after the run before it.
                self.send_run(s)?;
            }
            let idx = self.copy_out(chunk)?;
            let e = self.plain_send(s.0, idx, chunk.len() as u32);
            self.sock(s)?.queued.push_back(Pending::Entry(e));
        }
        if gso && !data.is_empty() {
            // Held for the batch point.
            return Ok(());
        }
        self.flush_sends(s)?;
        self.kick()
    }

    /// A pool buffer holding a copy of `data`, handed to the kernel
    /// (`InFlight`, counted in flight); returns its index.
    fn copy_out(&mut self, data: &[u8]) -> Result<u32> {
        let mut b = self.handle.alloc()?;
        self.pool.data_mut(&mut b)[..data.len()].copy_from_slice(data);
        self.lend(b)
    }

    /// Hand pool buffer `b` to the kernel: `InFlight`, counted in flight,
    /// known by its index until its completion.
    fn lend(&mut self, b: Buf) -> Result<u32> {
        self.pool.transition(&b, State::User, State::InFlight)?;
        self.in_flight += 1;
        Ok(b.into_raw())
    }

    /// An ordinary send of `len` bytes of pool buffer `idx`, which goes back
    /// to the pool on completion.
    fn plain_send(&self, sock: u32, idx: u32, len: u32) -> squeue::Entry {
        opcode::Send::new(types::Fixed(sock), self.addr_of(idx) as *const u8, len)
            .flags(libc::MSG_WAITALL)
            .build()
            .user_data(ud(OP_SEND, sock, idx))
    }

    /// Copy a datagram (not empty, at most a buffer) onto the end of socket
    /// `s`'s run, sending the run first if it cannot join it (longer than
    /// the first, after a shorter one, or the run is full).
    fn add_to_run(&mut self, s: SockId, data: &[u8]) -> Result<()> {
        let len = data.len() as u32;
        let r = &self.sock(s)?.run;
        if r.datagrams > 0
            && (len > r.seg
                || r.closed
                || r.datagrams as usize >= GSO_MAX_SEGMENTS
                || r.bytes + len > GSO_MAX_BYTES)
        {
            self.send_run(s)?;
        }
        let bs = self.pool.buf_size() as u32;
        let (idx, at) = match self.sock(s)?.run.bufs.last() {
            Some(&(idx, used)) if used + len <= bs => (idx, used),
            _ => {
                let b = self.handle.alloc()?;
                let idx = self.lend(b)?;
                self.sock(s)?.run.bufs.push((idx, 0));
                (idx, 0)
            }
        };
        // SAFETY: `idx` is a pool buffer of this run, InFlight but not yet
        // handed to the kernel (the run's send is not queued), so nothing
        // else reads or writes it; at + len <= buf_size keeps the copy
        // inside it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.addr_of(idx) as *mut u8).add(at as usize),
                data.len(),
            );
        }
        let r = &mut self.sock(s)?.run;
        if let Some(last) = r.bufs.last_mut() {
            last.1 += len;
        }
        if r.datagrams == 0 {
            r.seg = len;
        } else if len < r.seg {
            r.closed = true;
        }
        r.datagrams += 1;
        r.bytes += len;
        Ok(())
    }

    /// Send every socket's waiting datagrams (a batch point).
    fn flush_runs(&mut self) -> Result<()> {
        if !self.udp_gso {
            return Ok(());
        }
        for i in 0..self.socks.len() {
            if self.socks[i].run.datagrams > 0 {
                self.send_run(SockId(i as u32))?;
            }
        }
        Ok(())
    }

    /// Queue socket `s`'s run: one datagram as an ordinary send, more as one
    /// SENDMSG whose `UDP_SEGMENT` is the first datagram's length.
    fn send_run(&mut self, s: SockId) -> Result<()> {
        let run = std::mem::take(&mut self.sock(s)?.run);
        let e = match (run.datagrams, &run.bufs[..]) {
            (0, _) | (_, []) => return Ok(()),
            (1, &[(idx, len)]) => self.plain_send(s.0, idx, len),
            _ => {
                let mut m = self.sg_msg(&run.bufs);
                m.seg = run.seg;
                // At least two datagrams within GSO_MAX_BYTES: seg < 2^16.
                let seg = run.seg as u16;
                // SAFETY: `ctrl` is 32 bytes, 8-aligned, inside the boxed
                // message (which stays put until the completion), and
                // CMSG_SPACE(2) = 24 of them hold one cmsghdr and its u16;
                // msg_control/msg_controllen describe exactly that space, so
                // CMSG_FIRSTHDR returns `ctrl`'s start and CMSG_DATA a
                // pointer inside it.
                unsafe {
                    m.hdr.msg_control = m.ctrl.as_mut_ptr().cast();
                    m.hdr.msg_controllen = libc::CMSG_SPACE(2) as usize;
                    let c = libc::CMSG_FIRSTHDR(&m.hdr);
                    (*c).cmsg_level = libc::SOL_UDP;
                    // UDP_SEGMENT's data is the segment size as a u16.
                    (*c).cmsg_type = libc::UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                    libc::CMSG_DATA(c).cast::<u16>().write_unaligned(seg);
                }
                let id = self.keep_msg(m, &run.bufs, MsgKind::Datagrams);
                self.gso_sends += 1;
                self.gso_datagrams += run.datagrams as u64;
                opcode::SendMsg::new(types::Fixed(s.0), &self.msgs[&id].0.hdr)
                    .build()
                    .user_data(ud(OP_SENDMSG_GSO, s.0, id))
            }
        };
        self.push(e)
    }

    fn arm_recv(&mut self, s: SockId) -> Result<()> {
        let sock = self.sock(s)?;
        if sock.recv_armed || sock.starved || sock.eof || sock.error.is_some() {
            return Ok(());
        }
        sock.recv_armed = true;
        let e = if self.bundles {
            opcode::RecvMultiBundle::new(types::Fixed(s.0), BGID).build()
        } else {
            opcode::RecvMulti::new(types::Fixed(s.0), BGID).build()
        };
        self.push(e.user_data(ud(OP_RECV, s.0, 0)))?;
        self.kick()
    }

    /// Process every completion waiting in the completion queue (no system
    /// call). Returns how many.
    pub fn reap(&mut self) -> usize {
        let mut n = 0;
        let cqes: Vec<(u64, i32, u32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result(), c.flags()))
            .collect();
        for (u, res, flags) in cqes {
            n += 1;
            let op = u >> 56;
            let sock = ((u >> 32) & 0xff_ffff) as u32;
            let idx = u as u32;
            match op {
                OP_SEND_ZC => {
                    if cqueue::notif(flags) {
                        let copied = res as u32 & NOTIF_USAGE_ZC_COPIED != 0;
                        self.note_copied(sock, copied);
                        let result = self.zc_results.remove(&idx).unwrap_or(0);
                        self.finish_send(sock, idx, result, copied);
                    } else if cqueue::more(flags) {
                        // Bytes sent; the buffer comes back with the notification.
                        self.zc_results.insert(idx, res);
                        self.send_done(sock);
                    } else {
                        // No notification follows (the send failed early).
                        self.send_done(sock);
                        self.finish_send(sock, idx, res, false);
                    }
                }
                OP_SEND => {
                    self.send_done(sock);
                    self.free_sent(sock, idx, res);
                }
                OP_SEND_PLAIN => {
                    // The kernel copied the bytes during the send: the
                    // buffer is the caller's again.
                    self.send_done(sock);
                    self.finish_send(sock, idx, res, true);
                }
                OP_SENDMSG => {
                    self.send_done(sock);
                    self.finish_sg(sock, idx, Some(res), true);
                }
                OP_SENDMSG_GSO => self.finish_gso(sock, idx, res),
                OP_RECV => self.on_recv(sock, res, flags),
                OP_SENDMSG_ZC => {
                    if cqueue::notif(flags) {
                        let copied = res as u32 & NOTIF_USAGE_ZC_COPIED != 0;
                        self.note_copied(sock, copied);
                        self.finish_sg(sock, idx, None, copied);
                    } else {
                        self.send_done(sock);
                        if cqueue::more(flags) {
                            if let Some(m) = self.msgs.get_mut(&idx) {
                                m.2 = res;
                            }
                        } else {
                            self.finish_sg(sock, idx, Some(res), false);
                        }
                    }
                }
                _ => {}
            }
        }
        if n > 0 {
            let mut more = false;
            for i in 0..self.socks.len() {
                let s = &self.socks[i];
                if s.fd.is_some() && s.chain == 0 && !s.queued.is_empty() {
                    let _ = self.flush_sends(SockId(i as u32));
                    more = true;
                }
            }
            if more {
                let _ = self.kick();
            }
        }
        n
    }

    /// A copy-mode send of pool buffer `idx` finished: the buffer goes back
    /// to the pool, the caller gets a completion without it.
    fn free_sent(&mut self, sock: u32, idx: u32, result: i32) {
        self.release_sent(idx);
        self.copy_done(sock, result);
    }

    /// A copy-mode send's completion (its buffer went back to the pool).
    fn copy_done(&mut self, sock: u32, result: i32) {
        self.done.push_back(Sent {
            sock: SockId(sock),
            buf: None,
            result,
            copied: true,
        });
    }

    /// The kernel is done with copy-mode buffer `idx`: back to the pool.
    fn release_sent(&mut self, idx: u32) {
        // SAFETY: idx came from into_raw of a buffer we sent, taken back
        // exactly once (here, on its completion).
        if let Ok(b) = unsafe { self.pool.from_raw(idx) } {
            let _ = self.pool.transition(&b, State::InFlight, State::User);
            let _ = self.handle.free(b);
        }
        self.in_flight -= 1;
    }

    /// A segmented send finished. If the kernel refused to segment it
    /// (rather than failing the send), its datagrams go again one by one,
    /// and so do the socket's later ones.
    fn finish_gso(&mut self, sock: u32, id: u32, res: i32) {
        let refused = [libc::EIO, libc::EINVAL, libc::EMSGSIZE, libc::EOPNOTSUPP];
        if res < 0 && refused.contains(&-res) {
            if let Some((m, idxs, _, _)) = self.msgs.remove(&id) {
                self.gso_refused += 1;
                if let Some(s) = self.socks.get_mut(sock as usize) {
                    s.gso = false;
                }
                // The run's bytes, cut at its segment size, each datagram
                // copied into a buffer of its own and sent alone.
                let seg = m.seg.max(1) as usize;
                let mut bytes = Vec::new();
                for v in &m.iov {
                    // SAFETY: each iovec is a run buffer's used part, inside
                    // the pool region, InFlight and no longer read by the
                    // kernel (its send completed).
                    bytes.extend_from_slice(unsafe {
                        std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                    });
                }
                for idx in idxs {
                    self.release_sent(idx);
                }
                for d in bytes.chunks(seg) {
                    match self.copy_out(d) {
                        Ok(idx) => {
                            let e = self.plain_send(sock, idx, d.len() as u32);
                            if self.push(e).is_err() {
                                self.free_sent(sock, idx, -libc::EBUSY);
                            }
                        }
                        Err(_) => self.copy_done(sock, -libc::ENOBUFS),
                    }
                }
                return;
            }
        }
        self.finish_sg(sock, id, Some(res), true);
    }

    fn finish_send(&mut self, sock: u32, idx: u32, result: i32, copied: bool) {
        self.in_flight -= 1;
        // SAFETY: idx came from into_raw of the buffer handed to this send,
        // taken back exactly once (here, on its final completion).
        let buf = unsafe { self.pool.from_raw(idx) }.ok();
        if let Some(b) = &buf {
            let _ = self.pool.transition(b, State::InFlight, State::User);
        }
        self.done.push_back(Sent {
            sock: SockId(sock),
            buf,
            result,
            copied,
        });
    }

    fn on_recv(&mut self, sock: u32, res: i32, flags: u32) {
        let more = cqueue::more(flags);
        let bs = self.pool.buf_size();
        if res > 0 {
            let Some(bid) = cqueue::buffer_select(flags) else {
                return;
            };
            // The kernel consumes ring entries in order: this CQE's buffers
            // start at our head (a bundle spans several).
            debug_assert_eq!(self.bufring.bid_at(self.bufring.head), bid);
            let mut left = res as usize;
            while left > 0 {
                let b = self.bufring.bid_at(self.bufring.head);
                self.bufring.head = self.bufring.head.wrapping_add(1);
                let idx = self.bufring.bids[b as usize];
                let len = left.min(bs);
                left -= len;
                // SAFETY: `idx` was given up with into_raw when its buffer
                // went into the receive ring; this bundle entry is its one
                // return from the kernel, and the token is given up again
                // at once (the socket's rx queue holds the index).
                if let Ok(buf) = unsafe { self.pool.from_raw(idx) } {
                    let _ = self.pool.transition(&buf, State::InFlight, State::Received);
                    let _ = buf.into_raw();
                }
                if let Some(s) = self.socks.get_mut(sock as usize) {
                    s.rx.push_back((idx, len));
                }
            }
        }
        // Our head is the kernel's once this completion is taken: entries
        // between it and the tail were given back since the kernel found
        // the ring empty (those sends may have been reaped just before this
        // completion, their publish_rx already done).
        let ring_empty = self.bufring.head == self.bufring.tail;
        let Some(s) = self.socks.get_mut(sock as usize) else {
            return;
        };
        if res == 0 {
            s.eof = true;
        } else if res == -libc::ENOBUFS {
            // Starved only while nothing came back: otherwise nothing would
            // ever call publish_rx again and the receive would stay off.
            s.starved = ring_empty;
        } else if res < 0 {
            if res == -libc::EINVAL && self.bundles {
                // No bundles on this kernel: plain multishot instead.
                self.bundles = false;
            } else {
                s.error = Some(-res);
            }
        }
        if !more {
            s.recv_armed = false;
        }
    }

    /// Sends the kernel has finished with, in the order it finished.
    pub fn completions(&mut self) -> Vec<Sent> {
        self.flush_batch();
        self.reap();
        self.done.drain(..).collect()
    }

    /// Buffers still owned by the kernel (sends not yet notified).
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Collect up to `max` received buffers of socket `s` (a scatter-gather
    /// list). Returns 0 with nothing waiting; see [`Ring::eof`].
    pub fn recv_sg(&mut self, s: SockId, max: usize, out: &mut Vec<RxBuf>) -> Result<usize> {
        self.arm_recv(s)?;
        self.flush_batch();
        self.reap();
        if let Some(e) = self.sock(s)?.error {
            return Err(UringError::Sys {
                what: "receive",
                source: std::io::Error::from_raw_os_error(e),
            });
        }
        let mut n = 0;
        while n < max {
            let Some((idx, len)) = self.sock(s)?.rx.pop_front() else {
                break;
            };
            // SAFETY: idx was recorded once, when the kernel filled it.
            let buf = unsafe { self.pool.from_raw(idx) }?;
            out.push(RxBuf { buf, len });
            n += 1;
        }
        if n == 0 && !self.sock(s)?.recv_armed {
            self.arm_recv(s)?;
        }
        Ok(n)
    }

    /// Like [`Ring::recv_sg`], waiting up to `timeout` for data.
    pub fn recv_sg_wait(
        &mut self,
        s: SockId,
        max: usize,
        out: &mut Vec<RxBuf>,
        timeout: Duration,
    ) -> Result<usize> {
        let end = Instant::now() + timeout;
        loop {
            let n = self.recv_sg(s, max, out)?;
            if n > 0 || self.eof(s) || Instant::now() >= end {
                return Ok(n);
            }
            self.wait(Duration::from_millis(1));
        }
    }

    /// The peer closed the connection and everything before it was taken.
    pub fn eof(&self, s: SockId) -> bool {
        self.socks
            .get(s.0 as usize)
            .is_some_and(|x| x.eof && x.rx.is_empty())
    }

    /// Give a received buffer back: it returns to the kernel's receive ring.
    pub fn recycle(&mut self, b: RxBuf) -> Result<()> {
        self.pool
            .transition(&b.buf, State::Received, State::InFlight)?;
        let idx = b.buf.into_raw();
        let bid = self
            .bufring
            .bids
            .iter()
            .position(|&x| x == idx)
            .ok_or_else(|| crate::Error::Foreign(format!("index {idx} (not a receive buffer)")))?;
        let addr = self.addr_of(idx);
        self.bufring
            .push(bid as u16, addr, self.pool.buf_size() as u32);
        self.publish_rx();
        Ok(())
    }

    /// Send a received buffer onward without copying it (a proxy's
    /// forwarding step): it becomes the caller's and goes out zero-copy;
    /// when [`Ring::completions`] returns it, hand it back with
    /// [`Ring::give_back`].
    pub fn forward(&mut self, rx: RxBuf, to: SockId) -> Result<()> {
        self.pool
            .transition(&rx.buf, State::Received, State::User)?;
        self.send_zc(to, rx.buf, rx.len)
    }

    /// Send a whole scatter-gather list of received buffers onward as one
    /// zero-copy message (IORING_OP_SENDMSG_ZC): one request, one
    /// completion and one notification for the lot, in order with the
    /// socket's other sends. The buffers go straight back to the receive
    /// ring when the kernel is done with them.
    pub fn forward_sg(&mut self, bufs: &mut Vec<RxBuf>, to: SockId) -> Result<usize> {
        self.sock(to)?;
        if bufs.is_empty() {
            return Ok(0);
        }
        let mut items = Vec::with_capacity(bufs.len());
        let mut total = 0;
        for rb in bufs.drain(..) {
            self.pool
                .transition(&rb.buf, State::Received, State::InFlight)?;
            items.push((rb.buf.into_raw(), rb.len as u32));
            total += rb.len;
        }
        let e = self.sg_message(to, &items, MsgKind::Forward)?;
        self.in_flight += 1;
        self.sock(to)?.queued.push_back(Pending::Entry(e));
        self.flush_sends(to)?;
        self.kick()?;
        Ok(total)
    }

    fn finish_sg(&mut self, sock: u32, id: u32, res: Option<i32>, copied: bool) {
        let Some((m, idxs, first, kind)) = self.msgs.remove(&id) else {
            return;
        };
        let result = res.unwrap_or(first);
        match kind {
            MsgKind::Forward => {
                self.in_flight -= 1;
                for idx in idxs {
                    let addr = self.addr_of(idx);
                    if let Some(bid) = self.bufring.bids.iter().position(|&x| x == idx) {
                        // Still InFlight: straight back into the kernel's receive ring.
                        self.bufring
                            .push(bid as u16, addr, self.pool.buf_size() as u32);
                    }
                }
                self.publish_rx();
                self.done.push_back(Sent {
                    sock: SockId(sock),
                    buf: None,
                    result,
                    copied,
                });
            }
            MsgKind::Datagrams => {
                // One completion per datagram, each with its length.
                let total: usize = m.iov.iter().map(|v| v.iov_len).sum();
                let seg = m.seg.max(1) as usize;
                for k in 0..total.div_ceil(seg) {
                    let r = if result < 0 {
                        result
                    } else {
                        seg.min(total - k * seg) as i32
                    };
                    self.copy_done(sock, r);
                }
                for idx in idxs {
                    self.release_sent(idx);
                }
            }
            MsgKind::User => {
                // One completion per buffer, as if each had gone alone
                // (MSG_WAITALL: all of the message went, or it failed).
                for (idx, v) in idxs.into_iter().zip(&m.iov) {
                    let r = if result < 0 { result } else { v.iov_len as i32 };
                    self.finish_send(sock, idx, r, copied);
                }
            }
        }
    }

    /// Hand the buffers pushed since the last call to the kernel; sockets
    /// whose receive starved may receive again.
    fn publish_rx(&mut self) {
        self.bufring.publish();
        for s in &mut self.socks {
            s.starved = false;
        }
    }

    /// Return a buffer that came from the receive ring (and was forwarded)
    /// to the receive ring; any other buffer goes back to the pool.
    pub fn give_back(&mut self, buf: Buf) -> Result<()> {
        let idx = buf.index();
        match self.bufring.bids.iter().position(|&x| x == idx) {
            Some(bid) => {
                self.pool.transition(&buf, State::User, State::InFlight)?;
                let _ = buf.into_raw();
                let addr = self.addr_of(idx);
                self.bufring
                    .push(bid as u16, addr, self.pool.buf_size() as u32);
                self.publish_rx();
                Ok(())
            }
            None => Ok(self.handle.free(buf)?),
        }
    }

    /// Wait for at least one completion (a system call), up to `timeout`.
    pub fn wait(&mut self, timeout: Duration) {
        self.wait_for(1, timeout);
    }

    /// Wait until at least `want` completions are waiting (one system
    /// call), up to `timeout`: a sender with many requests in flight sleeps
    /// through a whole batch of them instead of waking for each.
    ///
    /// `want` counts the kernel's completion entries, not [`Sent`]s: a
    /// segmented run of datagrams (see [`Config::udp_gso`]) is one entry
    /// that [`Ring::completions`] turns into a `Sent` per datagram, so a
    /// caller waiting for "n datagrams" after batched sends should ask for
    /// one entry and count what `completions` yields.
    pub fn wait_for(&mut self, want: usize, timeout: Duration) {
        self.flush_batch();
        if self.ring.completion().len() >= want.max(1) {
            return;
        }
        let ts = types::Timespec::new()
            .sec(timeout.as_secs())
            .nsec(timeout.subsec_nanos());
        let args = types::SubmitArgs::new().timespec(&ts);
        self.waits += 1;
        let _ = self.ring.submitter().submit_with_args(want.max(1), &args);
    }

    /// A batch point: with [`Config::batch_submit`], hand everything queued
    /// to the kernel in one system call.
    fn flush_batch(&mut self) {
        if !self.batch_submit {
            return;
        }
        let _ = self.flush_runs();
        if !self.ring.submission().is_empty() {
            let _ = self.enter();
        }
    }

    /// Wait until every send has been notified (bounded).
    pub fn drain(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while self.in_flight > 0 {
            if Instant::now() >= end {
                return false;
            }
            self.reap();
            if self.in_flight > 0 {
                self.wait(Duration::from_millis(1));
            }
        }
        self.reap();
        true
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Let the kernel finish with our buffers before the pool can reuse
        // them; then the receive buffers go back to the pool.
        self.drain(Duration::from_secs(2));
        let _ = self.ring.submitter().unregister_buf_ring(BGID);
        for &idx in &self.bufring.bids {
            // SAFETY: each receive buffer's index was given up once, at setup.
            if let Ok(b) = unsafe { self.pool.from_raw(idx) } {
                let st = self.pool.state(idx);
                if st == Some(State::InFlight) {
                    let _ = self.pool.transition(&b, State::InFlight, State::User);
                    let _ = self.handle.free(b);
                } else {
                    // Still held by the caller as a received buffer.
                    let _ = b.into_raw();
                }
            }
        }
    }
}
