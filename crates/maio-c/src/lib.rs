//! MAIO's C ABI (`include/maio.h`), with the paper's function names.
//!
//! Process-wide state in two parts, so that no call waits behind another
//! thread's blocking call:
//! - the pool ([`POOL`], set once by `init_hp_memory`): pages are allocated
//!   and freed through a per-thread handle (a magazine over the pool's
//!   depot), with no lock shared between threads;
//! - the I/O state ([`IO`]): one io_uring (SQPOLL) that every socket is
//!   registered on, and the sockets. Its lock is held only for work that
//!   does not wait: `connect` runs before it is taken, and a receive waits
//!   for data on the ring's completion eventfd after releasing it.
//!
//! Pages cross the ABI as pointers; every pointer coming in is checked
//! against the pool ([`maio::Pool::index_of`]) and its ownership state
//! before use, so a foreign pointer, a double free or a free of a page in
//! flight is an error code, never undefined behaviour.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use maio::uring::{Config, Ring, RxBuf, SockId};
use maio::{Handle, Hugepages, Pool, State};

/// Bytes per I/O page.
pub const PAGE: usize = 4096;
/// `MAIO_SEND_COPY`.
pub const SEND_COPY: c_int = 1;
/// How long `tcp_receive_sg` waits for data (see `maio.h`).
const RECEIVE_WAIT: Duration = Duration::from_secs(5);
/// How long `create_connected_socket` waits for the connection.
const CONNECT_WAIT: Duration = Duration::from_secs(5);

/// The pool and the cache handle the C side names it by.
struct Memory {
    pool: Pool,
    cache: usize,
}

/// The ring and the sockets.
#[derive(Default)]
struct Io {
    ring: Option<Ring>,
    /// Signalled by the kernel for every completion on `ring`: a receive
    /// waits on it without holding [`IO`].
    completions: Option<std::sync::Arc<OwnedFd>>,
    socks: Vec<SockSlot>,
}

#[derive(Default)]
struct SockSlot {
    fd: Option<OwnedFd>,
    id: Option<SockId>,
    last_copied: Option<bool>,
}

/// The pool, once `init_hp_memory` made it.
static POOL: OnceLock<Memory> = OnceLock::new();
/// Serializes `init_hp_memory` (the pool is made once).
static INIT: Mutex<()> = Mutex::new(());
/// The I/O state; never held across a call that waits.
static IO: Mutex<Io> = Mutex::new(Io {
    ring: None,
    completions: None,
    socks: Vec::new(),
});

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
    /// This thread's handle on the pool (its magazine of free pages).
    static HANDLE: RefCell<Option<Handle>> = const { RefCell::new(None) };
}

/// Record `msg` for maio_last_error and return `ret` (NULL or a negative
/// errno, as maio.h says).
fn fail<T>(msg: impl Into<String>, ret: T) -> T {
    let s = msg.into().replace('\0', " ");
    LAST.with(|l| *l.borrow_mut() = CString::new(s).unwrap_or_default());
    ret
}

/// The pool, or the error recorded.
fn memory<T>(err: T) -> Result<&'static Memory, T> {
    POOL.get()
        .ok_or_else(|| fail("call init_hp_memory first", err))
}

/// The I/O state's lock (a panic while it was held leaves it usable: every
/// update to it is a single step).
fn io() -> MutexGuard<'static, Io> {
    IO.lock().unwrap_or_else(|p| p.into_inner())
}

/// `f` with this thread's pool handle (made on first use).
fn with_handle<T>(m: &Memory, f: impl FnOnce(&mut Handle) -> T) -> T {
    HANDLE.with(|h| {
        let mut h = h.borrow_mut();
        f(h.get_or_insert_with(|| m.pool.handle()))
    })
}

/// Take back the buffers of finished sends: they are the C caller's again.
fn collect(io: &mut Io) {
    let Some(ring) = io.ring.as_mut() else {
        return;
    };
    for c in ring.completions() {
        if let Some(slot) = io.socks.iter_mut().find(|s| s.id == Some(c.sock)) {
            slot.last_copied = Some(c.copied);
        }
        if let Some(b) = c.buf {
            // The page stays the caller's (state User); the C side names it
            // by pointer, so the token is given up again.
            let _ = b.into_raw();
        }
    }
}

/// Maps `page_cnt` 2 MiB hugepages as the process's pool (once) and
/// returns the cache handle, or NULL (see `maio.h`).
#[no_mangle]
pub extern "C" fn init_hp_memory(page_cnt: c_int) -> *mut c_void {
    let _once = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = POOL.get() {
        return m.cache as *mut c_void;
    }
    if page_cnt <= 0 || page_cnt > 4096 {
        return fail(
            format!("page_cnt {page_cnt} must be 1..=4096 (2 MiB pages)"),
            std::ptr::null_mut(),
        );
    }
    let pool = match Pool::new(maio::Config {
        buffers: (page_cnt as usize * maio::HUGEPAGE_SIZE / PAGE) as u32,
        buf_size: PAGE,
        hugepages: Hugepages::Auto,
        ..Default::default()
    }) {
        Ok(p) => p,
        Err(e) => return fail(e.to_string(), std::ptr::null_mut()),
    };
    let cache = pool.region().0 as usize;
    let _ = POOL.set(Memory { pool, cache });
    cache as *mut c_void
}

/// `Some(ret)`, with the error recorded, unless `cache` is the one
/// init_hp_memory returned.
fn wrong_cache<T>(m: &Memory, cache: *mut c_void, ret: T) -> Option<T> {
    (cache as usize != m.cache).then(|| fail("not the cache init_hp_memory returned", ret))
}

/// One 4 KiB I/O page (state `MAIO_USER`), or NULL when the pool is
/// exhausted (see `maio.h`). Takes no lock shared with other threads.
#[no_mangle]
pub extern "C" fn alloc_page(cache: *mut c_void) -> *mut c_void {
    let m = match memory(std::ptr::null_mut()) {
        Ok(m) => m,
        Err(e) => return e,
    };
    if let Some(r) = wrong_cache(m, cache, std::ptr::null_mut()) {
        return r;
    }
    match with_handle(m, |h| h.alloc()) {
        Ok(b) => {
            let idx = b.into_raw();
            (m.pool.region().0 as usize + idx as usize * PAGE) as *mut c_void
        }
        Err(e) => fail(e.to_string(), std::ptr::null_mut()),
    }
}

/// Gives a page back: a user page to the pool, a received page to the
/// kernel's receive ring; 0 or a negative errno (see `maio.h`).
#[no_mangle]
pub extern "C" fn free_page(cache: *mut c_void, page: *mut c_void) -> c_int {
    let m = match memory(-libc::EINVAL) {
        Ok(m) => m,
        Err(e) => return e,
    };
    if let Some(r) = wrong_cache(m, cache, -libc::EINVAL) {
        return r;
    }
    let idx = match m.pool.index_of(page as *const u8) {
        Ok(i) => i,
        Err(e) => return fail(e.to_string(), -libc::EINVAL),
    };
    if m.pool.state(idx) == Some(State::InFlight) {
        // Its send may have finished: take the finished sends first.
        collect(&mut io());
    }
    match m.pool.state(idx) {
        Some(State::Free) => fail(format!("double free of page {page:p}"), -libc::EALREADY),
        Some(State::InFlight) => fail(
            format!("page {page:p} is in flight to the kernel; wait until get_buffer_state says MAIO_USER"),
            -libc::EBUSY,
        ),
        Some(State::User) => {
            // SAFETY: the page is the caller's (state User) and the C side
            // holds no token: this is the only one.
            match unsafe { m.pool.from_raw(idx) }.and_then(|b| with_handle(m, |h| h.free(b))) {
                Ok(()) => 0,
                Err(e) => fail(e.to_string(), -libc::EINVAL),
            }
        }
        Some(State::Received) => {
            let mut io = io();
            // SAFETY: as above; a received page goes back to the kernel.
            let r = unsafe { m.pool.from_raw(idx) }
                .map_err(maio::uring::UringError::from)
                .and_then(|buf| match io.ring.as_mut() {
                    Some(ring) => ring.recycle(RxBuf { buf, len: 0 }),
                    None => Ok(()),
                });
            match r {
                Ok(()) => 0,
                Err(e) => fail(e.to_string(), -libc::EINVAL),
            }
        }
        None => fail("not a pool page", -libc::EINVAL),
    }
}

/// Connects a TCP socket to `dip`:`port` and returns its MAIO socket index,
/// or a negative errno (see `maio.h`). The connection is made before any
/// shared state is locked: a slow peer delays only this caller.
#[no_mangle]
pub extern "C" fn create_connected_socket(dip: u32, port: u16) -> c_int {
    if let Err(e) = memory(-libc::EINVAL) {
        return e;
    }
    let addr = std::net::SocketAddrV4::new(std::net::Ipv4Addr::from(u32::from_be(dip)), port);
    match std::net::TcpStream::connect_timeout(&addr.into(), CONNECT_WAIT) {
        Ok(s) => {
            let _ = s.set_nodelay(true);
            let mut io = io();
            io.socks.push(SockSlot {
                fd: Some(OwnedFd::from(s)),
                ..Default::default()
            });
            (io.socks.len() - 1) as c_int
        }
        Err(e) => {
            let code = e.raw_os_error().unwrap_or(libc::EIO);
            fail(format!("connect to {addr}: {e}"), -code)
        }
    }
}

/// Registers socket `idx` on the process's io_uring (created on first use);
/// 0 or a negative errno (see `maio.h`).
#[no_mangle]
pub extern "C" fn init_tcp_ring(idx: c_int, cache: *mut c_void) -> c_int {
    let m = match memory(-libc::EINVAL) {
        Ok(m) => m,
        Err(e) => return e,
    };
    if let Some(r) = wrong_cache(m, cache, -libc::EINVAL) {
        return r;
    }
    let mut io = io();
    if io.ring.is_none() {
        let made = Ring::new(&m.pool, Config::default())
            .and_then(|mut r| r.completion_eventfd().map(|fd| (r, fd)));
        match made {
            Ok((r, fd)) => {
                io.ring = Some(r);
                io.completions = Some(std::sync::Arc::new(fd));
            }
            Err(e) => return fail(e.to_string(), -libc::EIO),
        }
    }
    let io = &mut *io;
    let Some(slot) = usize::try_from(idx).ok().and_then(|i| io.socks.get_mut(i)) else {
        return fail(format!("no socket {idx}"), -libc::EBADF);
    };
    if slot.id.is_some() {
        return 0;
    }
    let Some(fd) = slot.fd.take() else {
        return fail(format!("socket {idx} is closed"), -libc::EBADF);
    };
    match io.ring.as_mut().expect("created above").add_socket(fd) {
        Ok(id) => {
            slot.id = Some(id);
            0
        }
        Err(e) => fail(e.to_string(), -libc::EIO),
    }
}

fn sock_of(io: &Io, idx: c_int) -> Option<SockId> {
    usize::try_from(idx)
        .ok()
        .and_then(|i| io.socks.get(i))
        .and_then(|s| s.id)
}

/// Posts `len` bytes of a pool page for sending on `idx`, zero-copy unless
/// `flags` has `MAIO_SEND_COPY`; 0 or a negative errno (see `maio.h`).
#[no_mangle]
pub extern "C" fn send_buffer(idx: c_int, buffer: *mut c_void, len: usize, flags: c_int) -> c_int {
    let m = match memory(-libc::EINVAL) {
        Ok(m) => m,
        Err(e) => return e,
    };
    let mut io = io();
    collect(&mut io);
    let Some(s) = sock_of(&io, idx) else {
        return fail(
            format!("socket {idx} has no ring: call init_tcp_ring"),
            -libc::EBADF,
        );
    };
    let pidx = match m.pool.index_of(buffer as *const u8) {
        Ok(i) => i,
        Err(e) => return fail(e.to_string(), -libc::EINVAL),
    };
    if len > PAGE {
        return fail(format!("{len} bytes is more than a page"), -libc::EMSGSIZE);
    }
    if m.pool.state(pidx) != Some(State::User) {
        return fail(
            format!(
                "page {buffer:p} is {:?}, not the caller's",
                m.pool.state(pidx)
            ),
            -libc::EBUSY,
        );
    }
    let ring = io.ring.as_mut().expect("a socket with an id has a ring");
    let r = if flags & SEND_COPY != 0 {
        // SAFETY: state User checked above; we only read the bytes.
        let data = unsafe { std::slice::from_raw_parts(buffer as *const u8, len) };
        ring.send_copy(s, data)
    } else {
        // SAFETY: state User checked above; the C side holds no token.
        match unsafe { m.pool.from_raw(pidx) } {
            Ok(b) => ring.send_zc(s, b, len),
            Err(e) => Err(e.into()),
        }
    };
    match r {
        Ok(()) => 0,
        Err(e) => fail(e.to_string(), -libc::EIO),
    }
}

/// The page's state (`enum maio_buffer_state`), or -EINVAL; collects
/// completions on the way (see `maio.h`).
#[no_mangle]
pub extern "C" fn get_buffer_state(buffer: *mut c_void) -> c_int {
    let m = match memory(-libc::EINVAL) {
        Ok(m) => m,
        Err(e) => return e,
    };
    collect(&mut io());
    match m.pool.index_of(buffer as *const u8) {
        Ok(i) => m.pool.state(i).map(|s| s as c_int).unwrap_or(-libc::EINVAL),
        Err(e) => fail(e.to_string(), -libc::EINVAL),
    }
}

/// Waits until the ring's completion eventfd is readable or `until`.
fn wait_completion(fd: &OwnedFd, until: Instant) {
    let left = until.saturating_duration_since(Instant::now());
    let ts = rustix::event::Timespec {
        tv_sec: left.as_secs() as i64,
        tv_nsec: left.subsec_nanos() as i64,
    };
    let mut p = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
    let _ = rustix::event::poll(&mut p, Some(&ts));
}

/// Waits up to 5 s for data on `idx` and describes up to `n` received pages
/// in `io_vec`; the number filled, 0 at end of stream, or a negative errno
/// (see `maio.h`). The wait holds no lock: other threads allocate, send
/// and receive meanwhile.
///
/// # Safety
/// `io_vec` must point at `n` writable `struct iovec`s.
#[no_mangle]
pub unsafe extern "C" fn tcp_receive_sg(
    idx: c_int,
    io_vec: *mut libc::iovec,
    n: c_int,
    cache: *mut c_void,
) -> c_int {
    let m = match memory(-libc::EINVAL) {
        Ok(m) => m,
        Err(e) => return e,
    };
    if let Some(r) = wrong_cache(m, cache, -libc::EINVAL) {
        return r;
    }
    if io_vec.is_null() || n <= 0 {
        return fail("io_vec must hold at least one entry", -libc::EINVAL);
    }
    let until = Instant::now() + RECEIVE_WAIT;
    let base = m.pool.region().0 as usize;
    let mut out = Vec::new();
    loop {
        let completions = {
            let mut io = io();
            let Some(s) = sock_of(&io, idx) else {
                return fail(
                    format!("socket {idx} has no ring: call init_tcp_ring"),
                    -libc::EBADF,
                );
            };
            let completions = io.completions.clone().expect("a ring has its eventfd");
            // Reset the eventfd before looking, so a completion posted after
            // the look wakes the wait below.
            let mut count = [0u8; 8];
            let _ = rustix::io::read(completions.as_fd(), &mut count);
            let ring = io.ring.as_mut().expect("a socket with an id has a ring");
            match ring.recv_sg(s, n as usize, &mut out) {
                Ok(0) if ring.eof(s) => return 0,
                Ok(0) if Instant::now() >= until => {
                    return fail("nothing received within 5 s", -libc::EAGAIN)
                }
                Ok(0) => completions,
                Ok(k) => {
                    for (i, rb) in out.drain(..).enumerate() {
                        let len = rb.len;
                        let p = base + rb.buf.into_raw() as usize * PAGE;
                        // SAFETY: the caller provides n >= k entries.
                        unsafe {
                            *io_vec.add(i) = libc::iovec {
                                iov_base: p as *mut c_void,
                                iov_len: len,
                            }
                        };
                    }
                    return k as c_int;
                }
                Err(e) => return fail(e.to_string(), -libc::EIO),
            }
        };
        wait_completion(&completions, until);
    }
}

/// Whether the kernel copied the last zero-copy send on `idx`: 1, 0, or
/// -EINVAL (see `maio.h`).
#[no_mangle]
pub extern "C" fn maio_last_send_copied(idx: c_int) -> c_int {
    if let Err(e) = memory(-libc::EINVAL) {
        return e;
    }
    let mut io = io();
    collect(&mut io);
    match usize::try_from(idx).ok().and_then(|i| io.socks.get(i)) {
        Some(SockSlot {
            last_copied: Some(c),
            ..
        }) => *c as c_int,
        _ => -libc::EINVAL,
    }
}

/// The description of this thread's last error ("" if none); valid until
/// this thread's next failing call.
#[no_mangle]
pub extern "C" fn maio_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}
