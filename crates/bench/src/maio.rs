//! `fastpath maio bench`: the paper's Figures 2-4, every method in one run.
//!
//! CPU cost is CPU time (getrusage, every thread of the process, which
//! includes io_uring's SQPOLL thread) times the clock rate in /proc/cpuinfo,
//! minus the CPU time of the helper threads that play the peers (measured by
//! each on itself). `perf` counters are not available on this VM, so these
//! are cycles estimated from time, not counted.
//!
//! The sockets, rings and pools a measurement needs are local resources
//! (loopback, a namespace of our own); a measurement that cannot make one
//! panics saying which. What can fail for reasons outside this process
//! (namespaces, nftables) is an [`Error`], or a figure marked skipped.

use std::io::{IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, types, IoUring};
use rustix::net::{MMsgHdr, SendAncillaryBuffer, SendFlags};
use serde_json::{json, Value};

use lab::netns::{self, Netns};
use maio::uring::{Config as RingConfig, Ring, RxBuf};
use maio::{Hugepages, Pool};

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Figure 3's UDP variant could not run inside its namespace (its
    /// thread could not enter it, or panicked).
    #[error("Figure 3 (UDP into a dropping veth): {0}")]
    Namespace(#[source] lab::Error),
}

/// Bench settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Seconds per measurement.
    pub seconds: f64,
    /// Repetitions per method (the median is reported).
    pub reps: usize,
    /// The figures to run (2, 3, 4); empty means all.
    pub figures: Vec<u8>,
}

/// One measurement.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    units: f64,
    bytes: f64,
    wall: f64,
    cpu: f64,
    copied: Option<bool>,
    /// System calls per operation (MAIO: SQPOLL wake-ups per send).
    syscalls_per_op: Option<f64>,
}

impl Run {
    /// `n` units since `t0`, CPU since `c0` (the whole process).
    fn count(t0: Instant, c0: f64, n: u64) -> Run {
        Run {
            units: n as f64,
            wall: t0.elapsed().as_secs_f64(),
            cpu: cpu_process() - c0,
            ..Default::default()
        }
    }

    /// `bytes` moved since `t0`, CPU since `c0` (the whole process).
    fn volume(t0: Instant, c0: f64, bytes: u64, copied: Option<bool>) -> Run {
        Run {
            bytes: bytes as f64,
            copied,
            ..Run::count(t0, c0, bytes)
        }
    }
}

/// CPU seconds (user and system) of `who`: `RUSAGE_SELF` or
/// `RUSAGE_THREAD` (rustix has no getrusage).
fn rusage(who: libc::c_int) -> f64 {
    let mut r = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage(2) writes one struct rusage into memory we own; a
    // zeroed rusage is a valid value, whether or not the call succeeds.
    let r = unsafe {
        libc::getrusage(who, r.as_mut_ptr());
        r.assume_init()
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(r.ru_utime) + tv(r.ru_stime)
}

fn cpu_process() -> f64 {
    rusage(libc::RUSAGE_SELF)
}

fn cpu_thread() -> f64 {
    rusage(libc::RUSAGE_THREAD)
}

/// The clock rate, from /proc/cpuinfo (cycles = CPU seconds x this).
pub fn hz() -> f64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("cpu MHz"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .unwrap_or(2000.0)
        * 1e6
}

fn median(mut v: Vec<Run>, key: impl Fn(&Run) -> f64) -> Run {
    v.sort_by(|a, b| key(a).total_cmp(&key(b)));
    v[v.len() / 2]
}

fn pool(buf_size: usize, buffers: u32) -> Pool {
    Pool::new(maio::Config {
        buffers,
        buf_size,
        hugepages: Hugepages::Auto,
        ..Default::default()
    })
    .expect("benchmark pool")
}

/// A second descriptor for `fd`, for a ring to own.
fn dup(fd: impl AsFd) -> OwnedFd {
    rustix::io::dup(fd).expect("dup a benchmark socket")
}

// ---------------------------------------------------------------- Figure 2

fn udp_pair() -> (UdpSocket, UdpSocket) {
    let sink = UdpSocket::bind("127.0.0.1:0").expect("bind sink");
    let tx = UdpSocket::bind("127.0.0.1:0").expect("bind sender");
    tx.connect(sink.local_addr().expect("addr"))
        .expect("connect");
    (tx, sink)
}

fn fig2_sendmsg(d: Duration) -> Run {
    let (tx, _sink) = udp_pair();
    let buf = [0x5au8; 64];
    let (t0, c0) = (Instant::now(), cpu_process());
    let mut n = 0u64;
    while t0.elapsed() < d {
        for _ in 0..64 {
            if tx.send(&buf).is_ok() {
                n += 1;
            }
        }
    }
    Run::count(t0, c0, n)
}

fn fig2_sendmmsg(d: Duration) -> Run {
    let (tx, _sink) = udp_pair();
    let buf = [0x5au8; 64];
    let iov = [IoSlice::new(&buf)];
    // 32 messages of the one 64-byte buffer, without ancillary data.
    let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> =
        (0..32).map(|_| SendAncillaryBuffer::default()).collect();
    let mut msgs: Vec<MMsgHdr<'_>> = controls.iter_mut().map(|c| MMsgHdr::new(&iov, c)).collect();
    let (t0, c0) = (Instant::now(), cpu_process());
    let mut n = 0u64;
    while t0.elapsed() < d {
        if let Ok(r) = rustix::net::sendmmsg(&tx, &mut msgs, SendFlags::empty()) {
            n += r as u64;
        }
    }
    Run::count(t0, c0, n)
}

fn fig2_uring(d: Duration) -> Run {
    let (tx, _sink) = udp_pair();
    let buf = [0x5au8; 64];
    let mut ring = IoUring::new(256).expect("io_uring");
    let fd = types::Fd(tx.as_raw_fd());
    let (t0, c0) = (Instant::now(), cpu_process());
    let mut n = 0u64;
    while t0.elapsed() < d {
        for _ in 0..32 {
            let e = opcode::Send::new(fd, buf.as_ptr(), 64).build();
            // SAFETY: buf outlives the wait below, which reaps all 32.
            let _ = unsafe { ring.submission().push(&e) };
        }
        let _ = ring.submit_and_wait(32);
        n += ring.completion().filter(|c| c.result() > 0).count() as u64;
    }
    Run::count(t0, c0, n)
}

fn fig2_maio(d: Duration, pool: &Pool) -> Run {
    let (tx, _sink) = udp_pair();
    let mut ring = Ring::new(pool, RingConfig::default()).expect("MAIO ring");
    let s = ring.add_socket(dup(&tx)).expect("register");
    let msg = [0x5au8; 64];
    let (t0, c0) = (Instant::now(), cpu_process());
    let mut n = 0u64;
    while t0.elapsed() < d {
        for _ in 0..32 {
            if ring.in_flight() >= 192 {
                ring.wait(Duration::from_millis(1));
                break;
            }
            let _ = ring.send_copy(s, &msg);
        }
        n += ring.completions().iter().filter(|c| c.result > 0).count() as u64;
    }
    ring.drain(Duration::from_secs(1));
    n += ring.completions().iter().filter(|c| c.result > 0).count() as u64;
    Run {
        syscalls_per_op: Some(ring.enters as f64 / n.max(1) as f64),
        ..Run::count(t0, c0, n)
    }
}

// ---------------------------------------------------------------- Figure 3

const CHUNK: usize = 16 * 1024;
/// `SO_EE_ORIGIN_ZEROCOPY` (linux/errqueue.h): a MSG_ZEROCOPY completion.
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED` (linux/errqueue.h): the kernel copied after
/// all.
const SO_EE_CODE_ZEROCOPY_COPIED: u32 = 1;
/// `IORING_SEND_ZC_REPORT_USAGE` (linux/io_uring.h): say in the
/// notification whether the kernel copied.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED` (linux/io_uring.h): the kernel copied.
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

/// A TCP sink that discards without copying (MSG_TRUNC); returns its own
/// CPU seconds when the sender closes.
fn tcp_sink() -> (std::net::SocketAddr, std::thread::JoinHandle<f64>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let h = std::thread::spawn(move || {
        let (c, _) = l.accept().expect("accept");
        let c0 = cpu_thread();
        loop {
            // SAFETY: with MSG_TRUNC, TCP discards up to len bytes without
            // writing to the buffer, so a null buffer is never touched
            // (rustix's recv needs a real buffer of len bytes).
            let n = unsafe {
                libc::recv(
                    c.as_raw_fd(),
                    std::ptr::null_mut(),
                    1 << 20,
                    libc::MSG_TRUNC,
                )
            };
            if n <= 0 {
                break;
            }
        }
        cpu_thread() - c0
    });
    (addr, h)
}

fn finish(
    t0: Instant,
    c0: f64,
    bytes: u64,
    sink: std::thread::JoinHandle<f64>,
    copied: Option<bool>,
) -> Run {
    let wall = t0.elapsed().as_secs_f64();
    let total = cpu_process() - c0;
    let helper = sink.join().unwrap_or(0.0);
    Run {
        units: bytes as f64,
        bytes: bytes as f64,
        wall,
        cpu: (total - helper).max(1e-9),
        copied,
        syscalls_per_op: None,
    }
}

fn fig3_send(d: Duration) -> Run {
    let (addr, sink) = tcp_sink();
    let mut s = TcpStream::connect(addr).expect("connect");
    let buf = vec![0x5au8; CHUNK];
    let (t0, c0) = (Instant::now(), cpu_process());
    let mut bytes = 0u64;
    while t0.elapsed() < d {
        s.write_all(&buf).expect("send");
        bytes += CHUNK as u64;
    }
    drop(s);
    finish(t0, c0, bytes, sink, Some(true))
}

/// Read MSG_ZEROCOPY completions from the error queue: (completed sends,
/// whether the kernel copied). The error queue's `sock_extended_err`
/// messages are raw libc: rustix's ancillary parser does not decode them.
fn zc_errqueue(fd: BorrowedFd<'_>, block: bool) -> (u64, bool) {
    let mut done = 0u64;
    let mut copied = false;
    loop {
        if block && done == 0 {
            // POLLERR is always reported, so no events are asked for.
            let mut p = [rustix::event::PollFd::from_borrowed_fd(
                fd,
                rustix::event::PollFlags::empty(),
            )];
            let _ = rustix::event::poll(
                &mut p,
                Some(&rustix::event::Timespec {
                    tv_sec: 0,
                    tv_nsec: 100_000_000,
                }),
            );
        }
        let mut cbuf = [0u64; 16];
        // SAFETY: msghdr is plain data for which all zeroes is valid.
        let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
        mh.msg_control = cbuf.as_mut_ptr() as *mut _;
        mh.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        // SAFETY: the msghdr points only at cbuf, which lives to the end of
        // this iteration; no data buffers (msg_iovlen 0).
        let r = unsafe {
            libc::recvmsg(
                fd.as_raw_fd(),
                &mut mh,
                libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            return (done, copied);
        }
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR walk the control messages the
        // kernel wrote into cbuf within msg_controllen and return null past
        // the last; an IP_RECVERR message's data is a sock_extended_err.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&mh);
            while !c.is_null() {
                let ee = libc::CMSG_DATA(c) as *const libc::sock_extended_err;
                if (*ee).ee_origin == SO_EE_ORIGIN_ZEROCOPY {
                    let lo = (*ee).ee_info;
                    let hi = (*ee).ee_data;
                    done += (hi.wrapping_sub(lo) as u64) + 1;
                    copied |= (*ee).ee_code as u32 & SO_EE_CODE_ZEROCOPY_COPIED != 0;
                }
                c = libc::CMSG_NXTHDR(&mh, c);
            }
        }
    }
}

/// MSG_ZEROCOPY sends of `len` bytes on `fd` for `d`: (bytes, whether the
/// kernel copied). SO_ZEROCOPY and MSG_ZEROCOPY are raw libc: rustix has
/// neither, and a zero-copy send must not look like a safe call (the
/// kernel reads the buffer after it returns).
fn zerocopy_loop(fd: BorrowedFd<'_>, d: Duration, len: usize) -> (u64, bool) {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt(2) reads one c_int from a live local, with its
    // size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ZEROCOPY,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let bufs: Vec<Vec<u8>> = (0..64).map(|_| vec![0x5au8; len]).collect();
    let t0 = Instant::now();
    let (mut sent, mut completed, mut bytes) = (0u64, 0u64, 0u64);
    let mut copied = false;
    while t0.elapsed() < d {
        if sent - completed >= 64 {
            let (k, c) = zc_errqueue(fd, true);
            completed += k;
            copied |= c;
            continue;
        }
        let b = &bufs[(sent % 64) as usize];
        // SAFETY: sends from a live buffer that is not reused until its
        // completion arrives (at most 64 outstanding, 64 buffers).
        let r = unsafe {
            libc::send(
                fd.as_raw_fd(),
                b.as_ptr() as *const libc::c_void,
                len,
                libc::MSG_ZEROCOPY,
            )
        };
        if r > 0 {
            sent += 1;
            bytes += r as u64;
        } else {
            let (k, c) = zc_errqueue(fd, true);
            completed += k;
            copied |= c;
        }
    }
    let end = Instant::now() + Duration::from_secs(2);
    while completed < sent && Instant::now() < end {
        let (k, c) = zc_errqueue(fd, true);
        completed += k;
        copied |= c;
    }
    (bytes, copied)
}

fn fig3_msg_zerocopy(d: Duration) -> Run {
    let (addr, sink) = tcp_sink();
    let s = TcpStream::connect(addr).expect("connect");
    let (t0, c0) = (Instant::now(), cpu_process());
    let (bytes, copied) = zerocopy_loop(s.as_fd(), d, CHUNK);
    drop(s);
    finish(t0, c0, bytes, sink, Some(copied))
}

fn fig3_sendfile(d: Duration) -> Run {
    let (addr, sink) = tcp_sink();
    let s = TcpStream::connect(addr).expect("connect");
    let mfd = rustix::fs::memfd_create("maio-bench", rustix::fs::MemfdFlags::CLOEXEC)
        .expect("memfd_create");
    let mut file = std::fs::File::from(mfd);
    file.write_all(&vec![0x5au8; 16 << 20]).expect("fill memfd");
    let (t0, c0) = (Instant::now(), cpu_process());
    let mut bytes = 0u64;
    let mut off: u64 = 0;
    while t0.elapsed() < d {
        if off as usize + CHUNK > 16 << 20 {
            off = 0;
        }
        let r = match rustix::fs::sendfile(&s, &file, Some(&mut off), CHUNK) {
            Ok(0) | Err(_) => break,
            Ok(r) => r,
        };
        bytes += r as u64;
    }
    drop(s);
    finish(t0, c0, bytes, sink, None)
}

/// io_uring SEND_ZC from ordinary memory, no SQPOLL, no fixed buffers.
fn uring_zc_loop(fd: BorrowedFd<'_>, d: Duration, len: usize) -> (u64, bool) {
    let mut ring = IoUring::new(256).expect("io_uring");
    let bufs: Vec<Vec<u8>> = (0..64).map(|_| vec![0x5au8; len]).collect();
    let mut free: Vec<usize> = (0..64).collect();
    let t0 = Instant::now();
    let (mut bytes, mut copied, mut outstanding) = (0u64, false, 0usize);
    while t0.elapsed() < d || outstanding > 0 {
        if t0.elapsed() < d {
            while let Some(i) = free.pop() {
                let e =
                    opcode::SendZc::new(types::Fd(fd.as_raw_fd()), bufs[i].as_ptr(), len as u32)
                        .zc_flags(SEND_ZC_REPORT_USAGE)
                        .build()
                        .user_data(i as u64);
                // SAFETY: the buffer is not reused until its notification.
                if unsafe { ring.submission().push(&e) }.is_err() {
                    free.push(i);
                    break;
                }
                outstanding += 1;
            }
        }
        let _ = ring.submit_and_wait(1);
        for c in ring.completion() {
            if cqueue::notif(c.flags()) {
                copied |= c.result() as u32 & NOTIF_USAGE_ZC_COPIED != 0;
                free.push(c.user_data() as usize);
                outstanding -= 1;
            } else {
                if c.result() > 0 {
                    bytes += c.result() as u64;
                }
                if !cqueue::more(c.flags()) {
                    free.push(c.user_data() as usize);
                    outstanding -= 1;
                }
            }
        }
        if t0.elapsed() > d + Duration::from_secs(2) {
            break;
        }
    }
    (bytes, copied)
}

fn fig3_uring_zc(d: Duration) -> Run {
    let (addr, sink) = tcp_sink();
    let s = TcpStream::connect(addr).expect("connect");
    let (t0, c0) = (Instant::now(), cpu_process());
    let (bytes, copied) = uring_zc_loop(s.as_fd(), d, CHUNK);
    drop(s);
    finish(t0, c0, bytes, sink, Some(copied))
}

/// MAIO: SQPOLL, the pool registered, SEND_ZC from fixed buffers.
fn maio_zc_loop(ring: &mut Ring, s: maio::uring::SockId, d: Duration, len: usize) -> (u64, bool) {
    let t0 = Instant::now();
    let mut spare = Vec::new();
    for _ in 0..64 {
        spare.push(ring.handle().alloc().expect("pool buffer"));
    }
    let (mut bytes, mut copied) = (0u64, false);
    while t0.elapsed() < d {
        while let Some(b) = spare.pop() {
            if ring.send_zc(s, b, len).is_err() {
                break;
            }
        }
        for c in ring.completions() {
            if c.result > 0 {
                bytes += c.result as u64;
            }
            copied |= c.copied;
            if let Some(b) = c.buf {
                spare.push(b);
            }
        }
        if spare.is_empty() {
            // Nothing to send until the kernel gives buffers back: sleep in
            // the kernel rather than spin (on two cores a spinning
            // application steals the polling thread's core).
            ring.wait(Duration::from_millis(1));
        }
    }
    ring.drain(Duration::from_secs(2));
    for c in ring.completions() {
        if c.result > 0 {
            bytes += c.result as u64;
        }
        copied |= c.copied;
        if let Some(b) = c.buf {
            spare.push(b);
        }
    }
    for b in spare {
        let _ = ring.handle().free(b);
    }
    (bytes, copied)
}

fn fig3_maio(d: Duration, pool: &Pool) -> Run {
    let (addr, sink) = tcp_sink();
    let mut ring = Ring::new(pool, RingConfig::default()).expect("MAIO ring");
    let s = ring.connect_tcp(addr).expect("connect");
    let (t0, c0) = (Instant::now(), cpu_process());
    let (bytes, copied) = maio_zc_loop(&mut ring, s, d, CHUNK);
    let _ = ring.close(s);
    finish(t0, c0, bytes, sink, Some(copied))
}

// --------------------------------------- Figure 3, UDP into a dropping veth

/// A veth pair in a namespace of its own whose far end drops everything at
/// ingress (nftables), so nothing is delivered to a local socket. The
/// namespace (and so the pair) goes when this drops.
struct VethSink {
    ns: Netns,
}

impl VethSink {
    /// The sender's end, `za`, is 10.201.0.1/30 with a static neighbour
    /// 10.201.0.2 (`zb`'s MAC), so datagrams leave without ARP; `zb` drops
    /// them at ingress. Both ends have a 65000-byte MTU, so a 16 KiB
    /// datagram is one frame.
    fn new() -> Result<VethSink, lab::Error> {
        let ns = Netns::new(&format!("fpmaio{}", std::process::id()))?;
        netns::veth(&ns, "za", SINK_SRC_MAC, &ns, "zb", SINK_DST_MAC)?;
        ns.ip(&["addr", "add", "10.201.0.1/30", "dev", "za"])?;
        ns.ip(&["link", "set", "za", "mtu", "65000"])?;
        ns.ip(&["link", "set", "zb", "mtu", "65000"])?;
        ns.ip(&[
            "neigh",
            "add",
            "10.201.0.2",
            "lladdr",
            SINK_DST_MAC,
            "dev",
            "za",
        ])?;
        ns.exec_input(
            &["nft", "-f", "-"],
            b"table netdev sink {\n  chain in {\n    type filter hook ingress device zb priority 0; policy drop;\n  }\n}\n",
        )?;
        Ok(VethSink { ns })
    }

    /// Run `f` on a thread inside the namespace.
    fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, lab::Error> {
        self.ns.inside(f)
    }
}

/// The MAC of the sink's sending end, `za`.
const SINK_SRC_MAC: &str = "02:00:00:00:00:01";
/// The MAC of the sink's dropping end, `zb`.
const SINK_DST_MAC: &str = "02:00:00:00:00:02";

fn udp_to_sink() -> UdpSocket {
    let s = UdpSocket::bind("10.201.0.1:0").expect("bind in namespace");
    s.connect("10.201.0.2:9").expect("connect");
    s
}

fn fig3u_send(d: Duration) -> Run {
    let s = udp_to_sink();
    let buf = vec![0x5au8; CHUNK];
    let (t0, c0) = (Instant::now(), cpu_process());
    let mut bytes = 0u64;
    while t0.elapsed() < d {
        if let Ok(n) = s.send(&buf) {
            bytes += n as u64;
        }
    }
    Run::volume(t0, c0, bytes, Some(true))
}

fn fig3u_with(d: Duration, f: fn(BorrowedFd<'_>, Duration, usize) -> (u64, bool)) -> Run {
    let s = udp_to_sink();
    let (t0, c0) = (Instant::now(), cpu_process());
    let (bytes, copied) = f(s.as_fd(), d, CHUNK);
    Run::volume(t0, c0, bytes, Some(copied))
}

fn fig3u_maio(d: Duration, pool: Pool) -> Run {
    let s = udp_to_sink();
    let mut ring = Ring::new(&pool, RingConfig::default()).expect("MAIO ring");
    let id = ring.add_socket(dup(&s)).expect("register");
    let (t0, c0) = (Instant::now(), cpu_process());
    let (bytes, copied) = maio_zc_loop(&mut ring, id, d, CHUNK);
    Run::volume(t0, c0, bytes, Some(copied))
}

// ---------------------------------------------------------------- Figure 4

const PROXY_BUF: usize = 256 * 1024;

/// Client -> proxy -> server over loopback TCP. The client writes as fast as
/// it can, the server discards (MSG_TRUNC); `proxy` moves bytes from its
/// first socket to its second. Returns the proxy's cost.
fn proxied(
    d: Duration,
    proxy: impl FnOnce(TcpStream, TcpStream, Instant) -> (u64, Option<bool>),
) -> Run {
    let (saddr, sink) = tcp_sink();
    let l = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let paddr = l.local_addr().expect("addr");
    let client = std::thread::spawn(move || {
        let mut c = TcpStream::connect(paddr).expect("connect proxy");
        let c0 = cpu_thread();
        let buf = vec![0x5au8; PROXY_BUF];
        let t0 = Instant::now();
        while t0.elapsed() < d {
            if c.write_all(&buf).is_err() {
                break;
            }
        }
        cpu_thread() - c0
    });
    let (inbound, _) = l.accept().expect("accept");
    let outbound = TcpStream::connect(saddr).expect("connect server");
    let (t0, c0) = (Instant::now(), cpu_process());
    let (bytes, copied) = proxy(inbound, outbound, t0);
    let wall = t0.elapsed().as_secs_f64();
    let total = cpu_process() - c0;
    let helpers = client.join().unwrap_or(0.0) + sink.join().unwrap_or(0.0);
    Run {
        units: bytes as f64,
        bytes: bytes as f64,
        wall,
        cpu: (total - helpers).max(1e-9),
        copied,
        syscalls_per_op: None,
    }
}

fn fig4_copy(d: Duration) -> Run {
    proxied(d, |mut i, mut o, _| {
        let mut buf = vec![0u8; PROXY_BUF];
        let mut bytes = 0u64;
        loop {
            let n = match i.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if o.write_all(&buf[..n]).is_err() {
                break;
            }
            bytes += n as u64;
        }
        (bytes, Some(true))
    })
}

fn fig4_splice(d: Duration) -> Run {
    use rustix::pipe::{fcntl_setpipe_size, pipe_with, splice, PipeFlags, SpliceFlags};
    proxied(d, |i, o, _| {
        let (rd, wr) = pipe_with(PipeFlags::CLOEXEC).expect("pipe2");
        let _ = fcntl_setpipe_size(&wr, PROXY_BUF);
        let mut bytes = 0u64;
        loop {
            let n = match splice(&i, None, &wr, None, PROXY_BUF, SpliceFlags::MOVE) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut left = n;
            while left > 0 {
                match splice(&rd, None, &o, None, left, SpliceFlags::MOVE) {
                    Ok(0) | Err(_) => break,
                    Ok(m) => left -= m,
                }
            }
            bytes += n as u64;
        }
        (bytes, None)
    })
}

fn fig4_uring(d: Duration) -> Run {
    proxied(d, |i, o, _| {
        let mut ring = IoUring::new(8).expect("io_uring");
        let mut buf = vec![0u8; PROXY_BUF];
        let mut bytes = 0u64;
        loop {
            let e = opcode::Recv::new(types::Fd(i.as_raw_fd()), buf.as_mut_ptr(), PROXY_BUF as u32)
                .build();
            // SAFETY: buf outlives the wait for this one request.
            let _ = unsafe { ring.submission().push(&e) };
            let _ = ring.submit_and_wait(1);
            let n = ring.completion().next().map(|c| c.result()).unwrap_or(-1);
            if n <= 0 {
                break;
            }
            let e = opcode::Send::new(types::Fd(o.as_raw_fd()), buf.as_ptr(), n as u32)
                .flags(libc::MSG_WAITALL)
                .build();
            // SAFETY: as above.
            let _ = unsafe { ring.submission().push(&e) };
            let _ = ring.submit_and_wait(1);
            if ring.completion().next().map(|c| c.result()).unwrap_or(-1) <= 0 {
                break;
            }
            bytes += n as u64;
        }
        (bytes, Some(true))
    })
}

/// The MAIO proxy: receive into pool buffers (bundled multishot), send the
/// same buffers onward as one message per batch. `sqpoll`: submissions by
/// the kernel's polling thread (no system calls, but a thread that spins
/// while the proxy works), or by io_uring_enter from the proxy thread.
fn fig4_maio(d: Duration, pool: Pool, sqpoll: bool) -> Run {
    proxied(d, move |i, o, _| {
        let mut ring = Ring::new(
            &pool,
            RingConfig {
                rx_buffers: 1024,
                sqpoll,
                ..RingConfig::default()
            },
        )
        .expect("MAIO ring");
        let si = ring.add_socket(OwnedFd::from(i)).expect("register");
        let so = ring.add_socket(OwnedFd::from(o)).expect("register");
        let mut sg: Vec<RxBuf> = Vec::new();
        let (mut bytes, mut copied) = (0u64, false);
        loop {
            sg.clear();
            let n = ring
                .recv_sg_wait(si, 64, &mut sg, Duration::from_millis(200))
                .unwrap_or(0);
            let _ = ring.forward_sg(&mut sg, so);
            for c in ring.completions() {
                if c.result > 0 {
                    bytes += c.result as u64;
                }
                copied |= c.copied;
                if let Some(b) = c.buf {
                    let _ = ring.give_back(b);
                }
            }
            if n == 0 && ring.eof(si) {
                break;
            }
        }
        ring.drain(Duration::from_secs(2));
        for c in ring.completions() {
            if c.result > 0 {
                bytes += c.result as u64;
            }
            if let Some(b) = c.buf {
                let _ = ring.give_back(b);
            }
        }
        (bytes, Some(copied))
    })
}

// ---------------------------------------------------------------- driver

fn entry(name: &str, r: &Run, metric: &str, hz: f64) -> Value {
    let mut v = json!({
        "method": name,
        "seconds": r.wall,
        "cpu_seconds": r.cpu,
    });
    if metric == "pps" {
        v["pps"] = json!(r.units / r.wall);
        v["cpu_pps"] = json!(r.units / r.cpu.max(1e-9));
    } else {
        v["cycles_per_byte"] = json!(r.cpu * hz / r.bytes.max(1.0));
        v["gbps"] = json!(r.bytes * 8.0 / r.wall / 1e9);
    }
    if let Some(c) = r.copied {
        v["copied"] = json!(c);
    }
    if let Some(x) = r.syscalls_per_op {
        v["syscalls_per_send"] = json!(x);
    }
    v
}

type Method<'a> = (&'static str, Box<dyn Fn() -> Run + 'a>);

fn figure(
    methods: Vec<Method<'_>>,
    reps: usize,
    metric: &str,
    hz: f64,
    progress: &dyn Fn(&str),
) -> Value {
    let mut out = serde_json::Map::new();
    for (name, f) in methods {
        let runs: Vec<Run> = (0..reps).map(|_| f()).collect();
        let m = if metric == "pps" {
            median(runs, |r| r.units / r.wall)
        } else {
            median(runs, |r| r.cpu / r.bytes.max(1.0))
        };
        let e = entry(name, &m, metric, hz);
        progress(&format!("  {name}: {}", summarize(&e)));
        out.insert(name.to_string(), e);
    }
    Value::Object(out)
}

fn summarize(e: &Value) -> String {
    if let Some(p) = e["pps"].as_f64() {
        let sc = e["syscalls_per_send"]
            .as_f64()
            .map(|x| format!(", {x:.4} system calls per send"))
            .unwrap_or_default();
        format!("{:.3} Mpps{sc}", p / 1e6)
    } else {
        format!(
            "{:.3} cycles/byte, {:.1} Gbit/s{}",
            e["cycles_per_byte"].as_f64().unwrap_or(0.0),
            e["gbps"].as_f64().unwrap_or(0.0),
            e["copied"]
                .as_bool()
                .map(|c| format!(", copied={c}"))
                .unwrap_or_default()
        )
    }
}

/// Run the chosen figures (all when `o.figures` is empty); `progress`
/// gets a line per method.
pub fn run(o: Options, progress: &dyn Fn(&str)) -> Result<Value, Error> {
    let d = Duration::from_secs_f64(o.seconds);
    let hz = hz();
    let small = pool(2048, 4096);
    let big = pool(CHUNK, 1024);
    let want = |f: u8| o.figures.is_empty() || o.figures.contains(&f);
    let mut doc = serde_json::Map::new();
    if want(2) {
        progress("Figure 2: 64-byte UDP datagrams per second, one application thread");
        let fig2 = figure(
            vec![
                ("sendmsg", Box::new(|| fig2_sendmsg(d))),
                ("sendmmsg", Box::new(|| fig2_sendmmsg(d))),
                ("io_uring", Box::new(|| fig2_uring(d))),
                ("maio", Box::new(|| fig2_maio(d, &small))),
            ],
            o.reps,
            "pps",
            hz,
            progress,
        );
        doc.insert("figure2".into(), fig2);
    }
    if want(3) {
        progress("Figure 3: CPU cycles per byte, 16 KiB TCP sends to a local receiver");
        let fig3 = figure(
            vec![
                ("send", Box::new(|| fig3_send(d))),
                ("msg_zerocopy", Box::new(|| fig3_msg_zerocopy(d))),
                ("sendfile", Box::new(|| fig3_sendfile(d))),
                ("io_uring_send_zc", Box::new(|| fig3_uring_zc(d))),
                ("maio", Box::new(|| fig3_maio(d, &big))),
            ],
            o.reps,
            "cycles_per_byte",
            hz,
            progress,
        );
        progress("Figure 3 (no local delivery): 16 KiB UDP datagrams into a veth that drops them");
        let fig3u = match VethSink::new() {
            Ok(v) => {
                let reps = o.reps;
                let big2 = big.clone();
                let r = v
                    .run(move || {
                        let quiet = |_: &str| {};
                        figure(
                            vec![
                                ("send", Box::new(move || fig3u_send(d))),
                                (
                                    "msg_zerocopy",
                                    Box::new(move || fig3u_with(d, zerocopy_loop)),
                                ),
                                (
                                    "io_uring_send_zc",
                                    Box::new(move || fig3u_with(d, uring_zc_loop)),
                                ),
                                ("maio", Box::new(move || fig3u_maio(d, big2.clone()))),
                            ],
                            reps,
                            "cycles_per_byte",
                            hz,
                            &quiet,
                        )
                    })
                    .map_err(Error::Namespace)?;
                for (k, e) in r.as_object().into_iter().flatten() {
                    progress(&format!("  {k}: {}", summarize(e)));
                }
                r
            }
            Err(e) => {
                progress(&format!(
                    "  skipped: {e} (needs root, iproute2 and nftables)"
                ));
                json!({ "skipped": e.to_string() })
            }
        };
        doc.insert("figure3".into(), fig3);
        doc.insert("figure3_udp_veth".into(), fig3u);
    }
    if want(4) {
        progress("Figure 4: TCP splicing proxy, CPU cycles per byte moved");
        let fig4 = figure(
            vec![
                ("read_write", Box::new(|| fig4_copy(d))),
                ("splice", Box::new(|| fig4_splice(d))),
                ("io_uring", Box::new(|| fig4_uring(d))),
                ("maio", Box::new(|| fig4_maio(d, pool(CHUNK, 2048), true))),
                (
                    "maio_no_sqpoll",
                    Box::new(|| fig4_maio(d, pool(CHUNK, 2048), false)),
                ),
            ],
            o.reps,
            "cycles_per_byte",
            hz,
            progress,
        );
        doc.insert("figure4".into(), fig4);
    }
    let mut out = json!({
        "seconds_per_run": o.seconds,
        "repetitions": o.reps,
        "cpu_hz": hz,
        "cycles": "estimated: CPU seconds (getrusage, all threads incl. SQPOLL, minus the peer threads) x clock rate",
    });
    out.as_object_mut().expect("object").extend(doc);
    Ok(out)
}
