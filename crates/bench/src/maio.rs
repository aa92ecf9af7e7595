//! `fastpath maio bench`: the paper's Figures 2-4, every method in one run.
//!
//! CPU cost is CPU time (getrusage, every thread of the process, which
//! includes io_uring's SQPOLL thread) times the clock rate in /proc/cpuinfo,
//! minus the CPU time of the helper threads that play the peers (measured by
//! each on itself). `perf` counters are not available on this VM, so these
//! are cycles estimated from time, not counted. The application thread's
//! own CPU time is measured too (`RUSAGE_THREAD`): the paper's kernel thread
//! runs on a core of its own, so its Figure 2 is a rate per application
//! core, which is reported beside the rate per CPU second of every thread.
//!
//! Methods run in rounds (every method once per round, in turn), so a
//! burst of load on a shared machine hits every method of a round alike;
//! each figure reports min/median/max over the rounds, and ratios to the
//! baseline are taken within a round.
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
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use maio::uring::{Config as RingConfig, Ring, RxBuf};
use maio::{Hugepages, Pool};
use netns::Netns;

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Figure 3's UDP variant could not run inside its namespace (its
    /// thread could not enter it, or panicked).
    #[error("Figure 3 (UDP into a dropping veth): {0}")]
    Namespace(#[source] netns::Error),
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
    /// CPU seconds of every thread doing the method's work (the process,
    /// SQPOLL thread included, minus the peers).
    cpu: f64,
    /// CPU seconds of the application thread alone (not the SQPOLL thread).
    app_cpu: f64,
    /// CPU seconds of the peer threads (client, server), excluded from
    /// `cpu`. On loopback the kernel runs part of one socket's work on
    /// whichever thread's system call triggered it (a receiver's protocol
    /// processing on the sender's), so `cpu + peer_cpu` is the figure that
    /// does not depend on that split.
    peer_cpu: f64,
    /// CPU seconds every CPU of the machine was busy (user, system, hard
    /// and soft interrupts; `/proc/stat`): what `cpu + peer_cpu` misses,
    /// protocol work the kernel deferred to `ksoftirqd` or a worker,
    /// included. Exact only on an otherwise quiet machine.
    all_cpu: f64,
    copied: Option<bool>,
    /// System calls per operation (MAIO: SQPOLL wake-ups per send).
    syscalls_per_op: Option<f64>,
    /// Frames the dropping veth's far end counted per datagram sent (Figure
    /// 2 into the veth): 1 when every datagram reached the device as a
    /// frame of its own, segmented sends included.
    frames_per_op: Option<f64>,
}

/// Where a measurement started: wall clock, process CPU, thread CPU.
#[derive(Debug, Clone, Copy)]
struct Meter {
    t0: Instant,
    cpu0: f64,
    app0: f64,
    all0: f64,
}

impl Meter {
    fn start() -> Meter {
        Meter {
            t0: Instant::now(),
            cpu0: cpu_process(),
            app0: cpu_thread(),
            all0: cpu_machine(),
        }
    }

    fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    /// `n` units since the start.
    fn count(&self, n: u64) -> Run {
        Run {
            units: n as f64,
            wall: self.t0.elapsed().as_secs_f64(),
            cpu: cpu_process() - self.cpu0,
            app_cpu: cpu_thread() - self.app0,
            all_cpu: cpu_machine() - self.all0,
            ..Default::default()
        }
    }

    /// `bytes` moved since the start.
    fn volume(&self, bytes: u64, copied: Option<bool>) -> Run {
        Run {
            bytes: bytes as f64,
            copied,
            ..self.count(bytes)
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

/// CPU seconds the whole machine has been busy since boot, summed over
/// CPUs: the first line of `/proc/stat` less idle and I/O wait (guest time
/// is already inside user time). NaN where it cannot be read.
fn cpu_machine() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    busy_ticks(&stat).map_or(f64::NAN, |t| {
        t as f64 / rustix::param::clock_ticks_per_second() as f64
    })
}

/// Busy clock ticks from the text of `/proc/stat`: user, nice, system,
/// irq, softirq and steal of the `cpu` line.
fn busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().next()?;
    let mut f = line.split_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal
    (v.len() == 8).then(|| v[0] + v[1] + v[2] + v[5] + v[6] + v[7])
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

/// Min, median and max of `v` (not empty).
fn spread(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    json!({ "min": v[0], "median": v[v.len() / 2], "max": v[v.len() - 1] })
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

/// Where Figure 2's datagrams go.
#[derive(Debug, Clone, Copy)]
enum Dest {
    /// A local UDP socket that is never read: the kernel's receive path
    /// (delivery to the socket, dropped there once its buffer is full) runs
    /// on the sending thread, as loopback delivery does.
    Loopback,
    /// The veth of Figure 3 whose far end drops at ingress (call from inside
    /// its namespace): no socket delivery.
    Veth,
}

fn udp_pair() -> (UdpSocket, UdpSocket) {
    let sink = UdpSocket::bind("127.0.0.1:0").expect("bind sink");
    let tx = UdpSocket::bind("127.0.0.1:0").expect("bind sender");
    tx.connect(sink.local_addr().expect("addr"))
        .expect("connect");
    (tx, sink)
}

/// The sending socket, and the never-read receiver it must outlive.
fn fig2_socket(dest: Dest) -> (UdpSocket, Option<UdpSocket>) {
    match dest {
        Dest::Loopback => {
            let (tx, sink) = udp_pair();
            (tx, Some(sink))
        }
        Dest::Veth => (udp_to_sink(), None),
    }
}

fn fig2_sendmsg(d: Duration, dest: Dest) -> Run {
    let (tx, _sink) = fig2_socket(dest);
    let buf = [0x5au8; 64];
    let m = Meter::start();
    let mut n = 0u64;
    while m.elapsed() < d {
        for _ in 0..64 {
            if tx.send(&buf).is_ok() {
                n += 1;
            }
        }
    }
    m.count(n)
}

fn fig2_sendmmsg(d: Duration, dest: Dest) -> Run {
    let (tx, _sink) = fig2_socket(dest);
    let buf = [0x5au8; 64];
    let iov = [IoSlice::new(&buf)];
    // 32 messages of the one 64-byte buffer, without ancillary data.
    let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> =
        (0..32).map(|_| SendAncillaryBuffer::default()).collect();
    let mut msgs: Vec<MMsgHdr<'_>> = controls.iter_mut().map(|c| MMsgHdr::new(&iov, c)).collect();
    let m = Meter::start();
    let mut n = 0u64;
    while m.elapsed() < d {
        if let Ok(r) = rustix::net::sendmmsg(&tx, &mut msgs, SendFlags::empty()) {
            n += r as u64;
        }
    }
    m.count(n)
}

/// `sendmsg` with the kernel's UDP segmentation (`UDP_SEGMENT` = 64 on the
/// socket): one call carries 32 datagrams, which the kernel cuts apart
/// after one trip down the UDP/IP send path. The peer that shows what MAIO's
/// segmented sends owe to the kernel.
fn fig2_sendmsg_gso(d: Duration, dest: Dest) -> Run {
    let (tx, _sink) = fig2_socket(dest);
    let segmented = netio::set_int_option(tx.as_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, 64);
    let buf = [0x5au8; 64 * 32];
    let m = Meter::start();
    let mut n = 0u64;
    while segmented && m.elapsed() < d {
        for _ in 0..2 {
            if tx.send(&buf).is_ok() {
                n += 32;
            }
        }
    }
    m.count(n)
}

fn fig2_uring(d: Duration, dest: Dest) -> Run {
    let (tx, _sink) = fig2_socket(dest);
    let buf = [0x5au8; 64];
    let mut ring = IoUring::new(256).expect("io_uring");
    let fd = types::Fd(tx.as_raw_fd());
    let m = Meter::start();
    let mut n = 0u64;
    while m.elapsed() < d {
        for _ in 0..32 {
            let e = opcode::Send::new(fd, buf.as_ptr(), 64).build();
            // SAFETY: buf outlives the wait below, which reaps all 32.
            let _ = unsafe { ring.submission().push(&e) };
        }
        let _ = ring.submit_and_wait(32);
        n += ring.completion().filter(|c| c.result() > 0).count() as u64;
    }
    m.count(n)
}

/// How MAIO's ring hands requests to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Submit {
    /// A kernel polling thread (SQPOLL), the paper's kernel thread.
    Sqpoll,
    /// No polling thread: every request queued since the last batch point
    /// goes in one io_uring_enter from the application thread.
    Batched,
}

impl Submit {
    fn name(self) -> &'static str {
        match self {
            Submit::Sqpoll => "sqpoll",
            Submit::Batched => "batched",
        }
    }
}

/// Pins the calling thread to one CPU until dropped (then restores its
/// previous CPU set).
struct Pin(Option<rustix::thread::CpuSet>);

impl Pin {
    /// Pins the caller to the first CPU it may run on and returns the
    /// second (for the polling thread), when it may run on two or more.
    fn apart() -> (Pin, Option<u32>) {
        let Some(old) = crate::cpus::affinity() else {
            return (Pin(None), None);
        };
        let cpus = crate::cpus::allowed();
        if cpus.len() < 2 || !crate::cpus::pin_current(cpus[0]) {
            return (Pin(None), None);
        }
        (Pin(Some(old)), Some(cpus[1] as u32))
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            crate::cpus::set_affinity(old);
        }
    }
}

/// MAIO's copy mode (the paper's standard mode for small sends): each
/// datagram copied into a pool buffer and posted; with SQPOLL the polling
/// thread is pinned to another CPU than the application thread (where the
/// machine has two), as the paper's kernel thread has a core of its own.
fn fig2_maio(d: Duration, dest: Dest, pool: &Pool, submit: Submit, udp_gso: bool) -> Run {
    let (tx, _sink) = fig2_socket(dest);
    let (_pin, poll_cpu) = match submit {
        Submit::Sqpoll => Pin::apart(),
        Submit::Batched => (Pin(None), None),
    };
    let mut ring = Ring::new(
        pool,
        RingConfig {
            sqpoll: submit == Submit::Sqpoll,
            sqpoll_cpu: poll_cpu,
            batch_submit: true,
            udp_gso,
            ..RingConfig::default()
        },
    )
    .expect("MAIO ring");
    let s = ring.add_socket(dup(&tx)).expect("register");
    let msg = [0x5au8; 64];
    let m = Meter::start();
    let mut n = 0u64;
    while m.elapsed() < d {
        for _ in 0..32 {
            if ring.in_flight() >= 192 {
                // Sleep through half the window rather than wake per send.
                ring.wait_for(96, Duration::from_millis(1));
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
        ..m.count(n)
    }
}

/// The run-time choice between SQPOLL and batched submission: a short
/// probe of each, kept is the one that sends more datagrams per CPU second
/// of all its threads (the polling thread's included). Returns the choice
/// and the two probes' rates.
fn fig2_choose(dest: Dest, pool: &Pool) -> (Submit, f64, f64) {
    let probe = Duration::from_millis(150);
    let rate = |r: Run| r.units / r.cpu.max(1e-9);
    let sq = rate(fig2_maio(probe, dest, pool, Submit::Sqpoll, true));
    let batched = rate(fig2_maio(probe, dest, pool, Submit::Batched, true));
    let pick = if sq > batched {
        Submit::Sqpoll
    } else {
        Submit::Batched
    };
    (pick, sq, batched)
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

/// Closes a Figure 3 run: the sink is joined first (it has read the last
/// byte and seen the end of file), so that the meter's window, the
/// machine-wide figure included, holds the whole transfer, as Figure 4's
/// does.
fn finish(m: Meter, bytes: u64, sink: std::thread::JoinHandle<f64>, copied: Option<bool>) -> Run {
    let helper = sink.join().unwrap_or(0.0);
    let r = m.volume(bytes, copied);
    Run {
        cpu: (r.cpu - helper).max(1e-9),
        peer_cpu: helper,
        ..r
    }
}

/// Plain `write`s of `chunk` bytes into a fresh [`tcp_sink`] for `d`, then
/// the connection closed: the meter (started once connected), the bytes
/// written, and the sink to join.
fn write_to_sink(d: Duration, chunk: usize) -> (Meter, u64, std::thread::JoinHandle<f64>) {
    let (addr, sink) = tcp_sink();
    let mut s = TcpStream::connect(addr).expect("connect");
    let buf = vec![0x5au8; chunk];
    let m = Meter::start();
    let mut bytes = 0u64;
    while m.elapsed() < d {
        s.write_all(&buf).expect("send");
        bytes += chunk as u64;
    }
    (m, bytes, sink)
}

fn fig3_send(d: Duration) -> Run {
    let (m, bytes, sink) = write_to_sink(d, CHUNK);
    finish(m, bytes, sink, Some(true))
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
/// kernel copied). MSG_ZEROCOPY is raw libc: rustix lacks it, and a
/// zero-copy send must not look like a safe call (the kernel reads the
/// buffer after it returns).
fn zerocopy_loop(fd: BorrowedFd<'_>, d: Duration, len: usize) -> (u64, bool) {
    let _ = netio::set_int_option(fd, libc::SOL_SOCKET, libc::SO_ZEROCOPY, 1);
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
    let m = Meter::start();
    let (bytes, copied) = zerocopy_loop(s.as_fd(), d, CHUNK);
    drop(s);
    finish(m, bytes, sink, Some(copied))
}

fn fig3_sendfile(d: Duration) -> Run {
    let (addr, sink) = tcp_sink();
    let s = TcpStream::connect(addr).expect("connect");
    let mfd = rustix::fs::memfd_create("maio-bench", rustix::fs::MemfdFlags::CLOEXEC)
        .expect("memfd_create");
    let mut file = std::fs::File::from(mfd);
    file.write_all(&vec![0x5au8; 16 << 20]).expect("fill memfd");
    let m = Meter::start();
    let mut bytes = 0u64;
    let mut off: u64 = 0;
    while m.elapsed() < d {
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
    finish(m, bytes, sink, None)
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
    let m = Meter::start();
    let (bytes, copied) = uring_zc_loop(s.as_fd(), d, CHUNK);
    drop(s);
    finish(m, bytes, sink, Some(copied))
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
    let m = Meter::start();
    let (bytes, copied) = maio_zc_loop(&mut ring, s, d, CHUNK);
    let _ = ring.close(s);
    finish(m, bytes, sink, Some(copied))
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
    fn new() -> Result<VethSink, netns::Error> {
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
        // Segmented sends (UDP GSO) are cut into datagrams before `za`, not
        // carried whole across the pair: each datagram reaches `zb` as a
        // frame of its own and is dropped there alone, as on a NIC without
        // segmentation offload. The counter checks it.
        ns.exec(&["ethtool", "-K", "za", "tx-udp-segmentation", "off"])?;
        ns.exec_input(
            &["nft", "-f", "-"],
            b"table netdev sink {\n  chain in {\n    type filter hook ingress device zb priority 0; policy drop;\n    counter\n  }\n}\n",
        )?;
        Ok(VethSink { ns })
    }

    /// Run `f` on a thread inside the namespace.
    fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, netns::Error> {
        self.ns.inside(f)
    }
}

/// Frames the sink's far end has dropped so far (call from inside its
/// namespace); `None` elsewhere.
fn sink_frames() -> Option<u64> {
    let out = std::process::Command::new("nft")
        .args(["list", "chain", "netdev", "sink", "in"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    words.find(|w| *w == "packets")?;
    words.next()?.parse().ok()
}

/// Runs `f` and, into the dropping veth, records how many frames reached
/// its far end per datagram sent.
fn counting_frames(dest: Dest, f: impl Fn() -> Run) -> Run {
    if !matches!(dest, Dest::Veth) {
        return f();
    }
    let before = sink_frames();
    let r = f();
    let after = sink_frames();
    let frames_per_op = match (before, after) {
        (Some(b), Some(a)) => Some((a - b) as f64 / r.units.max(1.0)),
        _ => None,
    };
    Run { frames_per_op, ..r }
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
    let m = Meter::start();
    let mut bytes = 0u64;
    while m.elapsed() < d {
        if let Ok(n) = s.send(&buf) {
            bytes += n as u64;
        }
    }
    m.volume(bytes, Some(true))
}

fn fig3u_with(d: Duration, f: fn(BorrowedFd<'_>, Duration, usize) -> (u64, bool)) -> Run {
    let s = udp_to_sink();
    let m = Meter::start();
    let (bytes, copied) = f(s.as_fd(), d, CHUNK);
    m.volume(bytes, Some(copied))
}

fn fig3u_maio(d: Duration, pool: Pool) -> Run {
    let s = udp_to_sink();
    let mut ring = Ring::new(&pool, RingConfig::default()).expect("MAIO ring");
    let id = ring.add_socket(dup(&s)).expect("register");
    let m = Meter::start();
    let (bytes, copied) = maio_zc_loop(&mut ring, id, d, CHUNK);
    m.volume(bytes, Some(copied))
}

// ---------------------------------------------------------------- Figure 4

const PROXY_BUF: usize = 256 * 1024;

/// Figure 4's row without a proxy: the floor of `added_cycles_per_byte`.
pub const NO_PROXY: &str = "no_proxy";

/// How long a proxy may go without progress before its run fails (the
/// client writes until it closes, so a quiet proxy is stuck, and a short
/// run would read as a measurement).
const PROXY_STALL: Duration = Duration::from_secs(10);

/// A Figure 4 proxy's receive or send failed (a timeout included): the run
/// cannot be a measurement.
fn proxy_failed(proxy: &str, what: &str, e: impl std::fmt::Display, bytes: u64) -> ! {
    panic!(
        "{proxy} proxy: {what} failed after {bytes} bytes forwarded: {e} (a proxy fails after \
         {PROXY_STALL:?} without progress; the client writes until it closes)"
    )
}

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
    // Blocking proxies fail after PROXY_STALL without progress instead of
    // waiting for ever (std's timeouts; splice honours them too).
    for s in [&inbound, &outbound] {
        s.set_read_timeout(Some(PROXY_STALL)).expect("SO_RCVTIMEO");
        s.set_write_timeout(Some(PROXY_STALL)).expect("SO_SNDTIMEO");
    }
    let m = Meter::start();
    let (bytes, copied) = proxy(inbound, outbound, m.t0);
    // The server drains what the proxy sent last before the measurement
    // ends: the machine-wide figure then covers every byte counted.
    let helpers = client.join().unwrap_or(0.0) + sink.join().unwrap_or(0.0);
    let r = m.volume(bytes, copied);
    Run {
        cpu: (r.cpu - helpers).max(1e-9),
        peer_cpu: helpers,
        ..r
    }
}

/// The client writing straight to the server, no proxy between them: what
/// the two peers and one loopback TCP connection cost the machine. A
/// proxy's machine-wide cycles per byte less this, in the same round, is
/// what the proxy added, wherever the kernel ran it (on loopback a socket's
/// protocol work runs on whichever thread's system call or soft interrupt
/// reached it, so the proxy thread's own CPU time is only part of its cost,
/// and a varying part).
fn fig4_no_proxy(d: Duration) -> Run {
    let (m, bytes, sink) = write_to_sink(d, PROXY_BUF);
    let _ = sink.join();
    let r = m.volume(bytes, None);
    // Everything here is the peers' work: no proxy, no proxy cycles.
    Run {
        cpu: 0.0,
        app_cpu: 0.0,
        peer_cpu: r.cpu,
        ..r
    }
}

fn fig4_copy(d: Duration) -> Run {
    proxied(d, |mut i, mut o, _| {
        let mut buf = vec![0u8; PROXY_BUF];
        let mut bytes = 0u64;
        loop {
            let n = match i.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => proxy_failed("read/write", "read", e, bytes),
            };
            if let Err(e) = o.write_all(&buf[..n]) {
                proxy_failed("read/write", "write", e, bytes);
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
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => proxy_failed("splice", "splice from the client", e, bytes),
            };
            let mut left = n;
            while left > 0 {
                match splice(&rd, None, &o, None, left, SpliceFlags::MOVE) {
                    Ok(0) => proxy_failed("splice", "splice to the server", "wrote 0", bytes),
                    Ok(m) => left -= m,
                    Err(e) => proxy_failed("splice", "splice to the server", e, bytes),
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
        // One request at a time: submit it and wait at most PROXY_STALL.
        // Err(true): no completion came, the request may still write into
        // buf, so buf must not be freed.
        let ts = types::Timespec::from(PROXY_STALL);
        let args = types::SubmitArgs::new().timespec(&ts);
        let one = |ring: &mut IoUring, e: io_uring::squeue::Entry| -> Result<u32, (bool, String)> {
            // SAFETY: buf outlives the request: it is dropped only after its
            // completion was reaped, or leaked when none came.
            let _ = unsafe { ring.submission().push(&e) };
            let _ = ring.submitter().submit_with_args(1, &args);
            match ring.completion().next().map(|c| c.result()) {
                Some(r) if r >= 0 => Ok(r as u32),
                Some(r) => Err((false, std::io::Error::from_raw_os_error(-r).to_string())),
                None => Err((true, format!("no completion in {PROXY_STALL:?}"))),
            }
        };
        let failed = |buf: Vec<u8>, what: &str, (pending, e): (bool, String), bytes: u64| -> ! {
            if pending {
                std::mem::forget(buf);
            }
            proxy_failed("io_uring", what, e, bytes)
        };
        loop {
            let e = opcode::Recv::new(types::Fd(i.as_raw_fd()), buf.as_mut_ptr(), PROXY_BUF as u32)
                .build();
            let n = match one(&mut ring, e) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => failed(buf, "receive", e, bytes),
            };
            let e = opcode::Send::new(types::Fd(o.as_raw_fd()), buf.as_ptr(), n)
                .flags(libc::MSG_WAITALL)
                .build();
            match one(&mut ring, e) {
                Ok(m) if m == n => {}
                Ok(_) => failed(buf, "send", (false, "short with MSG_WAITALL".into()), bytes),
                Err(e) => failed(buf, "send", e, bytes),
            }
            bytes += u64::from(n);
        }
        (bytes, Some(true))
    })
}

/// The proxy's pool: 64 KiB buffers (the largest a pool has), so that a
/// 256 KiB burst is four buffers to receive, recycle and send, not sixteen
/// (16 KiB buffers cost the proxy about a fifth more per byte).
fn proxy_pool() -> Pool {
    pool(maio::CHUNK_SIZE, 1024)
}

/// How the MAIO proxy submits.
#[derive(Debug, Clone, Copy)]
enum ProxySubmit {
    /// A polling thread that sleeps after `idle_ms` without submissions.
    Sqpoll { idle_ms: u32 },
    /// No polling thread: each batch in one io_uring_enter.
    Batched,
}

/// The MAIO proxy: receive into pool buffers (bundled multishot), send the
/// same buffers onward as one message per batch. With SQPOLL the polling
/// thread spins while the proxy works (the proxy submits a batch every few
/// hundred microseconds, more often than the thread's idle time, so it
/// never sleeps); batched, the proxy thread enters the kernel once per
/// batch.
fn fig4_maio(d: Duration, pool: Pool, submit: ProxySubmit) -> Run {
    proxied(d, move |i, o, _| {
        // Batched: 1 MiB of receive buffers, four client bursts, so the
        // bytes are copied in and read out again while still in cache (512
        // buffers, 32 MiB, cost 0.1-0.15 cycles per byte more in the
        // machine-wide figure: the plain io_uring proxy's 256 KiB buffer's
        // advantage). With SQPOLL 16 buffers starve the receive (1.3-1.5
        // cycles per byte in the proxy, against 0.97-1.01 with 512).
        let (sqpoll, idle, rx_buffers) = match submit {
            ProxySubmit::Sqpoll { idle_ms } => (true, idle_ms, 512),
            ProxySubmit::Batched => (false, 0, 16),
        };
        let mut ring = Ring::new(
            &pool,
            RingConfig {
                rx_buffers,
                sqpoll,
                sqpoll_idle_ms: idle,
                batch_submit: true,
                ..RingConfig::default()
            },
        )
        .expect("MAIO ring");
        let si = ring.add_socket(OwnedFd::from(i)).expect("register");
        let so = ring.add_socket(OwnedFd::from(o)).expect("register");
        let mut sg: Vec<RxBuf> = Vec::new();
        let (mut bytes, mut copied) = (0u64, false);
        let mut last_data = Instant::now();
        loop {
            sg.clear();
            let n = ring
                .recv_sg_wait(si, 64, &mut sg, Duration::from_millis(200))
                .unwrap_or_else(|e| panic!("MAIO proxy: receive failed: {e}"));
            // The client writes until it closes: a receive that goes quiet
            // before its end of file is a stuck ring, not a measurement.
            if n > 0 {
                last_data = Instant::now();
            } else if last_data.elapsed() > PROXY_STALL {
                panic!(
                    "MAIO proxy: nothing received for {PROXY_STALL:?} before the client's end \
                     of file ({bytes} bytes forwarded)"
                );
            }
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

/// What a figure compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    /// Datagrams per second: wall clock, per application core, per CPU.
    Pps,
    /// CPU cycles per byte moved.
    CyclesPerByte,
}

/// A figure's measures of one run: (name, value).
type Measure = (&'static str, fn(&Run, f64) -> f64);

const PPS_MEASURES: [Measure; 3] = [
    ("pps", |r, _| r.units / r.wall.max(1e-9)),
    ("pps_per_app_core", |r, _| r.units / r.app_cpu.max(1e-9)),
    ("pps_per_cpu", |r, _| r.units / r.cpu.max(1e-9)),
];

/// Every CPU's busy cycles per byte moved.
fn machine_cycles_per_byte(r: &Run, hz: f64) -> f64 {
    r.all_cpu * hz / r.bytes.max(1.0)
}

const CPB_MEASURES: [Measure; 5] = [
    ("cycles_per_byte", |r, hz| r.cpu * hz / r.bytes.max(1.0)),
    ("app_cycles_per_byte", |r, hz| {
        r.app_cpu * hz / r.bytes.max(1.0)
    }),
    ("with_peers_cycles_per_byte", |r, hz| {
        (r.cpu + r.peer_cpu) * hz / r.bytes.max(1.0)
    }),
    ("machine_cycles_per_byte", machine_cycles_per_byte),
    ("gbps", |r, _| r.bytes * 8.0 / r.wall.max(1e-9) / 1e9),
];

type Method<'a> = (&'static str, Box<dyn Fn() -> Run + 'a>);

/// The 1, 5 and 15 minute load averages (other work on the machine).
pub fn loadavg() -> [f64; 3] {
    crate::proc::load_averages_figures()
}

/// Runs every method once per round for `reps` rounds and reports, per
/// method, min/median/max of each measure and of its ratio to `baseline`'s
/// run in the same round. With `floor` (a method that does the peers' work
/// alone), each method's machine-wide cycles per byte less the floor's in
/// the same round are reported too, as `added_cycles_per_byte`.
fn figure(
    methods: Vec<Method<'_>>,
    reps: usize,
    metric: Metric,
    baseline: &str,
    floor: Option<&str>,
    hz: f64,
    progress: &dyn Fn(&str),
) -> Value {
    let load_before = loadavg();
    let mut runs: Vec<Vec<Run>> = vec![Vec::with_capacity(reps); methods.len()];
    for _ in 0..reps {
        for (i, (_, f)) in methods.iter().enumerate() {
            runs[i].push(f());
        }
    }
    let measures: &[Measure] = match metric {
        Metric::Pps => &PPS_MEASURES,
        Metric::CyclesPerByte => &CPB_MEASURES,
    };
    let base = methods.iter().position(|(n, _)| *n == baseline);
    let floor = floor.and_then(|f| methods.iter().position(|(n, _)| *n == f));
    let machine = |r: &Run| machine_cycles_per_byte(r, hz);
    // Per round: a method's machine-wide cycles per byte above the floor's.
    let added = |i: usize| -> Option<Vec<f64>> {
        let f = floor?;
        Some(
            runs[i]
                .iter()
                .zip(&runs[f])
                .map(|(a, b)| machine(a) - machine(b))
                .collect(),
        )
    };
    let mut out = serde_json::Map::new();
    for (i, (name, _)) in methods.iter().enumerate() {
        let mut v = json!({ "rounds": reps });
        // The floor runs no proxy: its proxy cycles are 0 by construction,
        // so ratios of them to the baseline's say nothing.
        let is_floor = Some(i) == floor;
        if is_floor {
            v["floor"] = json!(true);
        }
        // The baseline this row is compared with: none for the floor.
        let base = base.filter(|_| !is_floor);
        let mut ratios = serde_json::Map::new();
        if let Some(a) = added(i).filter(|_| !is_floor) {
            if let Some(b) = base.and_then(added) {
                let r = a.iter().zip(&b).map(|(x, y)| x / y).collect();
                ratios.insert("added_cycles_per_byte".into(), spread(r));
            }
            v["added_cycles_per_byte"] = spread(a);
        }
        for &(k, f) in measures {
            v[k] = spread(runs[i].iter().map(|r| f(r, hz)).collect());
            if let Some(b) = base {
                let r = runs[i]
                    .iter()
                    .zip(&runs[b])
                    .map(|(a, b)| f(a, hz) / f(b, hz).max(1e-12))
                    .collect();
                ratios.insert(k.to_string(), spread(r));
            }
        }
        if base.is_some() {
            v[format!("vs_{baseline}")] = Value::Object(ratios);
        }
        if runs[i].iter().any(|r| r.copied.is_some()) {
            v["copied"] = json!(runs[i].iter().any(|r| r.copied == Some(true)));
        }
        let sc: Vec<f64> = runs[i].iter().filter_map(|r| r.syscalls_per_op).collect();
        if !sc.is_empty() {
            v["syscalls_per_send"] = spread(sc)["median"].clone();
        }
        let fr: Vec<f64> = runs[i].iter().filter_map(|r| r.frames_per_op).collect();
        if !fr.is_empty() {
            v["frames_per_send"] = spread(fr);
        }
        progress(&format!("  {name}: {}", summarize(&v, baseline)));
        out.insert(name.to_string(), v);
    }
    out.insert(
        "load_average".into(),
        json!({ "before": load_before, "after": loadavg() }),
    );
    Value::Object(out)
}

/// `min/median/max` of a spread, scaled.
fn mmm(v: &Value, scale: f64, digits: usize) -> String {
    let g = |k: &str| v[k].as_f64().unwrap_or(f64::NAN) * scale;
    format!(
        "{:.digits$}/{:.digits$}/{:.digits$}",
        g("min"),
        g("median"),
        g("max")
    )
}

/// One method's line: each measure as min/median/max over the rounds.
pub fn summarize(e: &Value, baseline: &str) -> String {
    let vs = &e[format!("vs_{baseline}")];
    let mut s = if e.get("pps").is_some() {
        let mut s = format!(
            "Mpps {} | per app core {} | per CPU {}",
            mmm(&e["pps"], 1e-6, 3),
            mmm(&e["pps_per_app_core"], 1e-6, 3),
            mmm(&e["pps_per_cpu"], 1e-6, 3),
        );
        if !vs.is_null() {
            s += &format!(
                " | x {baseline}: wall {}, per app core {}, per CPU {}",
                mmm(&vs["pps"], 1.0, 2),
                mmm(&vs["pps_per_app_core"], 1.0, 2),
                mmm(&vs["pps_per_cpu"], 1.0, 2),
            );
        }
        if let Some(x) = e["syscalls_per_send"].as_f64() {
            s += &format!(" | {x:.4} system calls per send");
        }
        if e["frames_per_send"].is_object() {
            let f = &e["frames_per_send"];
            s += &format!(" | frames at the sink per send {}", mmm(f, 1.0, 3));
            let off = |k: &str| (f[k].as_f64().unwrap_or(0.0) - 1.0).abs() > 0.01;
            if off("min") || off("max") {
                s += " (NOT 1: the figure counts datagrams the device did not see)";
            }
        }
        s
    } else {
        if e["floor"] == true {
            return format!(
                "no proxy, the floor every 'added by the proxy' subtracts: machine-wide cycles/byte {} (peers {}) | Gbit/s {}",
                mmm(&e["machine_cycles_per_byte"], 1.0, 3),
                mmm(&e["with_peers_cycles_per_byte"], 1.0, 3),
                mmm(&e["gbps"], 1.0, 1),
            );
        }
        let mut s = format!(
            "cycles/byte {} (app thread {}; with peers {}) | Gbit/s {}",
            mmm(&e["cycles_per_byte"], 1.0, 3),
            mmm(&e["app_cycles_per_byte"], 1.0, 3),
            mmm(&e["with_peers_cycles_per_byte"], 1.0, 3),
            mmm(&e["gbps"], 1.0, 1),
        );
        if e["added_cycles_per_byte"].is_object() {
            s += &format!(
                " | machine-wide {}, added by the proxy {}",
                mmm(&e["machine_cycles_per_byte"], 1.0, 3),
                mmm(&e["added_cycles_per_byte"], 1.0, 3),
            );
        }
        if !vs.is_null() {
            s += &format!(
                " | x {baseline}: {} (with peers {}",
                mmm(&vs["cycles_per_byte"], 1.0, 2),
                mmm(&vs["with_peers_cycles_per_byte"], 1.0, 2)
            );
            if vs["added_cycles_per_byte"].is_object() {
                s += &format!(
                    "; added by the proxy {}",
                    mmm(&vs["added_cycles_per_byte"], 1.0, 2)
                );
            }
            s += ")";
        }
        s
    };
    if let Some(c) = e["copied"].as_bool() {
        s += &format!(" | copied={c}");
    }
    s
}

fn load_line(f: &Value) -> String {
    let l = |k: &str| {
        f["load_average"][k]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|x| format!("{:.2}", x.as_f64().unwrap_or(f64::NAN)))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default()
    };
    format!(
        "  load average: {} before, {} after",
        l("before"),
        l("after")
    )
}

/// Figure 2's methods, in the order they run.
const FIG2_METHODS: [&str; 7] = [
    "sendmsg",
    "sendmmsg",
    "sendmsg_udp_gso",
    "io_uring",
    "maio",
    "maio_no_sqpoll",
    "maio_no_sqpoll_unsegmented",
];

/// Figure 2 towards one destination: every method, then the run-time
/// choice of MAIO's submission mode.
fn figure2(d: Duration, dest: Dest, reps: usize, hz: f64, progress: &dyn Fn(&str)) -> Value {
    let small = pool(2048, 4096);
    let (pick, sq, batched) = fig2_choose(dest, &small);
    let mut f = figure(
        vec![
            (
                "sendmsg",
                Box::new(|| counting_frames(dest, || fig2_sendmsg(d, dest))),
            ),
            (
                "sendmmsg",
                Box::new(|| counting_frames(dest, || fig2_sendmmsg(d, dest))),
            ),
            (
                "sendmsg_udp_gso",
                Box::new(|| counting_frames(dest, || fig2_sendmsg_gso(d, dest))),
            ),
            (
                "io_uring",
                Box::new(|| counting_frames(dest, || fig2_uring(d, dest))),
            ),
            (
                "maio",
                Box::new(|| {
                    counting_frames(dest, || fig2_maio(d, dest, &small, Submit::Sqpoll, true))
                }),
            ),
            (
                "maio_no_sqpoll",
                Box::new(|| {
                    counting_frames(dest, || fig2_maio(d, dest, &small, Submit::Batched, true))
                }),
            ),
            (
                "maio_no_sqpoll_unsegmented",
                Box::new(|| {
                    counting_frames(dest, || fig2_maio(d, dest, &small, Submit::Batched, false))
                }),
            ),
        ],
        reps,
        Metric::Pps,
        "sendmsg",
        None,
        hz,
        progress,
    );
    let line = format!(
        "  run-time choice: {} (a 0.15 s probe of each: {:.3} Mpps per CPU with SQPOLL, {:.3} batched)",
        pick.name(),
        sq / 1e6,
        batched / 1e6
    );
    progress(&line);
    progress(&load_line(&f));
    f["maio_choice"] = json!({
        "mode": pick.name(),
        "method": if pick == Submit::Sqpoll { "maio" } else { "maio_no_sqpoll" },
        "probe_pps_per_cpu": { "sqpoll": sq, "batched": batched },
    });
    f
}

/// Run the chosen figures (all when `o.figures` is empty); `progress`
/// gets a line per method.
pub fn run(o: Options, progress: &dyn Fn(&str)) -> Result<Report, Error> {
    let d = Duration::from_secs_f64(o.seconds);
    let hz = hz();
    let big = pool(CHUNK, 1024);
    let want = |f: u8| o.figures.is_empty() || o.figures.contains(&f);
    let reps = o.reps;
    let mut doc = serde_json::Map::new();
    // The veth whose far end drops (Figures 2 and 3): made once, if it can be.
    let sink = if want(2) || want(3) {
        Some(VethSink::new())
    } else {
        None
    };
    if want(2) {
        progress(&format!(
            "Figure 2: 64-byte UDP datagrams per second, one application thread, {reps} rounds, min/median/max"
        ));
        progress(" to a local socket that is never read (its drops run on the sender):");
        doc.insert(
            "figure2".into(),
            figure2(d, Dest::Loopback, reps, hz, progress),
        );
        progress(" into a veth whose far end drops at ingress (no socket delivery):");
        let f = match &sink {
            Some(Ok(v)) => {
                let r = v
                    .run(move || figure2(d, Dest::Veth, reps, hz, &|_: &str| {}))
                    .map_err(Error::Namespace)?;
                for k in FIG2_METHODS {
                    progress(&format!("  {k}: {}", summarize(&r[k], "sendmsg")));
                }
                progress(&format!(
                    "  run-time choice: {}",
                    r["maio_choice"]["mode"].as_str().unwrap_or("?")
                ));
                progress(&load_line(&r));
                r
            }
            Some(Err(e)) => {
                progress(&format!(
                    "  skipped: {e} (needs root, iproute2 and nftables)"
                ));
                json!({ "skipped": e.to_string() })
            }
            None => Value::Null,
        };
        doc.insert("figure2_veth".into(), f);
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
            reps,
            Metric::CyclesPerByte,
            "send",
            None,
            hz,
            progress,
        );
        progress(&load_line(&fig3));
        progress("Figure 3 (no local delivery): 16 KiB UDP datagrams into a veth that drops them");
        let fig3u = match &sink {
            Some(Ok(v)) => {
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
                            Metric::CyclesPerByte,
                            "send",
                            None,
                            hz,
                            &quiet,
                        )
                    })
                    .map_err(Error::Namespace)?;
                for k in ["send", "msg_zerocopy", "io_uring_send_zc", "maio"] {
                    progress(&format!("  {k}: {}", summarize(&r[k], "send")));
                }
                progress(&load_line(&r));
                r
            }
            Some(Err(e)) => {
                progress(&format!(
                    "  skipped: {e} (needs root, iproute2 and nftables)"
                ));
                json!({ "skipped": e.to_string() })
            }
            None => Value::Null,
        };
        doc.insert("figure3".into(), fig3);
        doc.insert("figure3_udp_veth".into(), fig3u);
    }
    if want(4) {
        progress("Figure 4: TCP splicing proxy, CPU cycles per byte moved (proxy thread + SQPOLL thread)");
        let fig4 = figure(
            vec![
                (NO_PROXY, Box::new(|| fig4_no_proxy(d))),
                ("read_write", Box::new(|| fig4_copy(d))),
                ("splice", Box::new(|| fig4_splice(d))),
                ("io_uring", Box::new(|| fig4_uring(d))),
                (
                    "maio",
                    Box::new(|| fig4_maio(d, proxy_pool(), ProxySubmit::Sqpoll { idle_ms: 50 })),
                ),
                (
                    "maio_sqpoll_idle_1ms",
                    Box::new(|| fig4_maio(d, proxy_pool(), ProxySubmit::Sqpoll { idle_ms: 1 })),
                ),
                (
                    "maio_no_sqpoll",
                    Box::new(|| fig4_maio(d, proxy_pool(), ProxySubmit::Batched)),
                ),
            ],
            reps,
            Metric::CyclesPerByte,
            "splice",
            Some(NO_PROXY),
            hz,
            progress,
        );
        progress(&load_line(&fig4));
        doc.insert("figure4".into(), fig4);
    }
    let mut figure = |k: &str| doc.remove(k).filter(|v| !v.is_null());
    Ok(Report {
        seconds_per_run: o.seconds,
        repetitions: reps,
        cpu_hz: hz,
        cycles: CYCLES.to_string(),
        figure2: figure("figure2"),
        figure2_veth: figure("figure2_veth"),
        figure3: figure("figure3"),
        figure3_udp_veth: figure("figure3_udp_veth"),
        figure4: figure("figure4"),
    })
}

/// How the cycle figures of a [`Report`] are estimated.
const CYCLES: &str = "estimated: CPU seconds (getrusage, all threads incl. SQPOLL, minus the peer threads) x clock rate; app: the application thread alone; machine: every CPU's busy time in /proc/stat (needs a quiet machine); added (Figure 4): machine less no_proxy's in the same round";

/// What [`run`] measured: the settings, and one document per figure run (a
/// figure not asked for is absent). A figure's document is a row per method
/// (min/median/max over the rounds, and the ratios to the figure's base),
/// its load average, and for Figure 2 which MAIO mode the run-time probe
/// chose; or `skipped` with the reason when its veth could not be made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Seconds per run.
    pub seconds_per_run: f64,
    /// Rounds per figure.
    pub repetitions: usize,
    /// The clock rate cycles are estimated with.
    pub cpu_hz: f64,
    /// How the cycles are estimated.
    pub cycles: String,
    /// Figure 2 to a never-read local socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figure2: Option<Value>,
    /// Figure 2 into the veth whose far end drops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figure2_veth: Option<Value>,
    /// Figure 3: 16 KiB TCP sends to a local receiver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figure3: Option<Value>,
    /// Figure 3 with no local delivery: 16 KiB UDP datagrams into the veth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figure3_udp_veth: Option<Value>,
    /// Figure 4: the TCP splicing proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figure4: Option<Value>,
}

impl Report {
    /// The summary printed after the progress lines: MAIO against sendmsg
    /// in Figure 2, and the lowest cycles per byte of Figures 3 and 4.
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let median = |v: &Value| v["median"].as_f64();
        let mut out = String::from("\n");
        for (fig, to) in [
            (&self.figure2, "to a never-read local socket"),
            (&self.figure2_veth, "into the dropping veth"),
        ] {
            let Some(fig) = fig else { continue };
            let Some(method) = fig["maio_choice"]["method"].as_str() else {
                continue;
            };
            let vs = &fig[method]["vs_sendmsg"];
            let (Some(app), Some(cpu), Some(wall)) = (
                median(&vs["pps_per_app_core"]),
                median(&vs["pps_per_cpu"]),
                median(&vs["pps"]),
            ) else {
                continue;
            };
            let _ = writeln!(
                out,
                "Figure 2 {to}: MAIO ({}) / sendmsg, medians: {app:.2}x per application core, \
                 {cpu:.2}x per CPU second of all threads, {wall:.2}x wall clock (the paper: 1.2x)",
                fig["maio_choice"]["mode"].as_str().unwrap_or("?")
            );
            if let (Some(m), Some(g)) = (
                median(&fig[method]["pps_per_cpu"]),
                median(&fig["sendmsg_udp_gso"]["pps_per_cpu"]),
            ) {
                let _ = writeln!(
                    out,
                    "  (MAIO / sendmsg with UDP_SEGMENT, the kernel's segmentation that MAIO's \
                     batches use: {:.2}x per CPU second, medians)",
                    m / g.max(1e-9)
                );
            }
        }
        for (f, fig, base) in [
            ("figure3", &self.figure3, "send"),
            ("figure3_udp_veth", &self.figure3_udp_veth, "send"),
            ("figure4", &self.figure4, "splice"),
        ] {
            let Some(m) = fig.as_ref().and_then(Value::as_object) else {
                continue;
            };
            // The no_proxy row moves the bytes without a proxy: no proxy
            // cycles to compare.
            let lowest = |key: &str| {
                m.iter()
                    .filter(|(k, _)| k.as_str() != NO_PROXY)
                    .filter_map(|(k, v)| Some((k, median(&v[key])?)))
                    .min_by(|a, b| a.1.total_cmp(&b.1))
            };
            if let Some((k, v)) = lowest("cycles_per_byte") {
                let _ = writeln!(
                    out,
                    "{f}: lowest cycles/byte (median): {k} ({v:.3}); ratios are to {base}"
                );
            }
            if let Some((k, v)) = lowest("added_cycles_per_byte") {
                let _ = writeln!(
                    out,
                    "{f}: lowest machine-wide cycles/byte added by the proxy (median): {k} ({v:.3})"
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::busy_ticks;

    #[test]
    fn report_reads_back_from_its_document_and_summarizes_it() {
        let doc = serde_json::json!({
            "seconds_per_run": 0.05,
            "repetitions": 1,
            "cpu_hz": 3.0e9,
            "cycles": "estimated",
            "figure4": {
                "no_proxy": {"cycles_per_byte": {"median": 0.0}},
                "splice": {"cycles_per_byte": {"median": 0.5}},
                "maio": {"cycles_per_byte": {"median": 0.25}},
            },
        });
        let r: super::Report = serde_json::from_value(doc.clone()).expect("a report");
        assert!(r.figure2.is_none() && r.figure3.is_none());
        // A figure not run stays absent, not null, in the document.
        assert_eq!(serde_json::to_value(&r).expect("serializes"), doc);
        let text = r.to_text();
        assert!(
            text.contains(
                "figure4: lowest cycles/byte (median): maio (0.250); ratios are to splice"
            ),
            "{text}"
        );
    }

    #[test]
    fn busy_time_counts_interrupts_not_idle_or_guest_twice() {
        // The example line of proc(5), then per-CPU lines the sum ignores.
        let stat = "cpu  10132153 290696 3084719 46828483 16683 0 25195 0 175628 0\n\
                    cpu0 1393280 32966 572056 13343292 6130 0 17875 0 23933 0\n";
        // user + nice + system + irq + softirq + steal; guest is in user.
        assert_eq!(busy_ticks(stat), Some(10132153 + 290696 + 3084719 + 25195));
        // A kernel before steal time (2.6.11) has seven fields: unknown.
        assert_eq!(busy_ticks("cpu  1 2 3 4 5 6 7\n"), None);
        assert_eq!(busy_ticks("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(busy_ticks("cpu  1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(busy_ticks(""), None);
        let live = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
        assert!(busy_ticks(&live).is_some_and(|t| t > 0), "{live}");
    }
}
