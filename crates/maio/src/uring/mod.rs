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
//!
//! # Where things are
//!
//! - this file: [`Ring`]'s set-up, sockets, the completion loop
//!   ([`Ring::reap`]) and waiting, with the settings and [`UringError`];
//! - `submit.rs`: submission: the io_uring and SQPOLL, each request's
//!   operation and user_data, batching, in-order sends on streams, and the
//!   scatter-gather messages requests point at;
//! - `recv.rs`: receive buffers: the provided-buffer ring, multishot
//!   receive, the scatter-gather lists handed to the caller, recycling and
//!   forwarding them;
//! - `zerocopy.rs`: zero-copy send accounting: SEND_ZC and its
//!   notifications, detecting that the kernel copied anyway, and the
//!   adaptive probing that follows;
//! - `copy.rs`: copy mode: sends copied into pool buffers, and UDP
//!   segmentation of datagram runs.

mod copy;
mod recv;
mod submit;
mod zerocopy;

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use io_uring::{types, IoUring};
use memmap2::MmapMut;

use crate::{Buf, Handle, Pool, State};

pub use copy::GSO_MAX_SEGMENTS;
pub use zerocopy::ZC_PROBE_EVERY;

use copy::Run;
use recv::{BufRing, BGID};
use submit::{
    MsgKind, Pending, SgMsg, OP_RECV, OP_SEND, OP_SENDMSG, OP_SENDMSG_GSO, OP_SENDMSG_ZC,
    OP_SEND_PLAIN, OP_SEND_ZC,
};

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
        let ring = submit::build(&cfg)?;
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
            let (op, sock, idx) = submit::ud_parts(u);
            match op {
                OP_SEND_ZC => self.on_send_zc(sock, idx, res, flags),
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
                OP_SENDMSG_ZC => self.on_sendmsg_zc(sock, idx, res, flags),
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

    /// An eventfd the kernel signals for every completion it posts to this
    /// ring, for a thread that must wait for completions without holding
    /// the ring (behind a lock shared with other threads, say): read it to
    /// reset it, take the ring and [`Ring::reap`] (or `recv_sg`), release
    /// the ring, and `poll` the eventfd until it is readable again. A
    /// completion posted after the read leaves it readable, so no wake-up
    /// is lost. The descriptor is the caller's; the kernel keeps its own
    /// reference for as long as the ring lives.
    pub fn completion_eventfd(&mut self) -> Result<OwnedFd> {
        let fd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| UringError::Sys {
            what: "eventfd",
            source: e.into(),
        })?;
        self.ring
            .submitter()
            .register_eventfd(fd.as_raw_fd())
            .map_err(sys("IORING_REGISTER_EVENTFD"))?;
        Ok(fd)
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
