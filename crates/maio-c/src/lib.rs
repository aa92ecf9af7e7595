//! MAIO's C ABI (`include/maio.h`), with the paper's function names.
//!
//! One process-wide state behind a mutex: the pool, one io_uring (SQPOLL)
//! that every socket is registered on, and the sockets. Pages cross the ABI
//! as pointers; every pointer coming in is checked against the pool
//! ([`maio::Pool::index_of`]) and its ownership state before use, so a
//! foreign pointer, a double free or a free of a page in flight is an error
//! code, never undefined behaviour.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::Duration;

use maio::uring::{Config, Ring, RxBuf, SockId};
use maio::{Handle, Hugepages, Pool, State};

/// Bytes per I/O page.
pub const PAGE: usize = 4096;
/// `MAIO_SEND_COPY`.
pub const SEND_COPY: c_int = 1;

struct Global {
    pool: Pool,
    handle: Handle,
    ring: Option<Ring>,
    cache: usize,
    socks: Vec<SockSlot>,
}

#[derive(Default)]
struct SockSlot {
    fd: Option<OwnedFd>,
    id: Option<SockId>,
    last_copied: Option<bool>,
}

static G: Mutex<Option<Global>> = Mutex::new(None);

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Record `msg` for maio_last_error and return `ret` (NULL or a negative
/// errno, as maio.h says).
fn fail<T>(msg: impl Into<String>, ret: T) -> T {
    let s = msg.into().replace('\0', " ");
    LAST.with(|l| *l.borrow_mut() = CString::new(s).unwrap_or_default());
    ret
}

fn with<T>(err: T, f: impl FnOnce(&mut Global) -> T) -> T {
    let mut g = G.lock().unwrap_or_else(|p| p.into_inner());
    match g.as_mut() {
        Some(g) => f(g),
        None => fail("call init_hp_memory first", err),
    }
}

/// Take back the buffers of finished sends: they are the C caller's again.
fn collect(g: &mut Global) {
    let Some(ring) = g.ring.as_mut() else {
        return;
    };
    for c in ring.completions() {
        if let Some(slot) = g.socks.iter_mut().find(|s| s.id == Some(c.sock)) {
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
    let mut g = G.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(g) = g.as_ref() {
        return g.cache as *mut c_void;
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
    *g = Some(Global {
        handle: pool.handle(),
        pool,
        ring: None,
        cache,
        socks: Vec::new(),
    });
    cache as *mut c_void
}

/// `Some(ret)`, with the error recorded, unless `cache` is the one
/// init_hp_memory returned.
fn wrong_cache<T>(g: &Global, cache: *mut c_void, ret: T) -> Option<T> {
    (cache as usize != g.cache).then(|| fail("not the cache init_hp_memory returned", ret))
}

/// One 4 KiB I/O page (state `MAIO_USER`), or NULL when the pool is
/// exhausted (see `maio.h`).
#[no_mangle]
pub extern "C" fn alloc_page(cache: *mut c_void) -> *mut c_void {
    with(std::ptr::null_mut(), |g| {
        if let Some(r) = wrong_cache(g, cache, std::ptr::null_mut()) {
            return r;
        }
        match g.handle.alloc() {
            Ok(b) => {
                let idx = b.into_raw();
                (g.pool.region().0 as usize + idx as usize * PAGE) as *mut c_void
            }
            Err(e) => fail(e.to_string(), std::ptr::null_mut()),
        }
    })
}

/// Gives a page back: a user page to the pool, a received page to the
/// kernel's receive ring; 0 or a negative errno (see `maio.h`).
#[no_mangle]
pub extern "C" fn free_page(cache: *mut c_void, page: *mut c_void) -> c_int {
    with(-libc::EINVAL, |g| {
        if let Some(r) = wrong_cache(g, cache, -libc::EINVAL) {
            return r;
        }
        collect(g);
        let idx = match g.pool.index_of(page as *const u8) {
            Ok(i) => i,
            Err(e) => return fail(e.to_string(), -libc::EINVAL),
        };
        match g.pool.state(idx) {
            Some(State::Free) => fail(format!("double free of page {page:p}"), -libc::EALREADY),
            Some(State::InFlight) => fail(format!("page {page:p} is in flight to the kernel; wait until get_buffer_state says MAIO_USER"),
                -libc::EBUSY,
            ),
            Some(State::User) => {
                // SAFETY: the page is the caller's (state User) and the C side
                // holds no token: this is the only one.
                match unsafe { g.pool.from_raw(idx) }.and_then(|b| g.handle.free(b)) {
                    Ok(()) => 0,
                    Err(e) => fail(e.to_string(), -libc::EINVAL),
                }
            }
            Some(State::Received) => {
                // SAFETY: as above; a received page goes back to the kernel.
                let r = unsafe { g.pool.from_raw(idx) }
                    .map_err(maio::uring::UringError::from)
                    .and_then(|buf| match g.ring.as_mut() {
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
    })
}

/// Connects a TCP socket to `dip`:`port` and returns its MAIO socket index,
/// or a negative errno (see `maio.h`).
#[no_mangle]
pub extern "C" fn create_connected_socket(dip: u32, port: u16) -> c_int {
    with(-libc::EINVAL, |g| {
        let addr = std::net::SocketAddrV4::new(std::net::Ipv4Addr::from(u32::from_be(dip)), port);
        match std::net::TcpStream::connect_timeout(&addr.into(), Duration::from_secs(5)) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                g.socks.push(SockSlot {
                    fd: Some(OwnedFd::from(s)),
                    ..Default::default()
                });
                (g.socks.len() - 1) as c_int
            }
            Err(e) => {
                let code = e.raw_os_error().unwrap_or(libc::EIO);
                fail(format!("connect to {addr}: {e}"), -code)
            }
        }
    })
}

/// Registers socket `idx` on the process's io_uring (created on first use);
/// 0 or a negative errno (see `maio.h`).
#[no_mangle]
pub extern "C" fn init_tcp_ring(idx: c_int, cache: *mut c_void) -> c_int {
    with(-libc::EINVAL, |g| {
        if let Some(r) = wrong_cache(g, cache, -libc::EINVAL) {
            return r;
        }
        if g.ring.is_none() {
            match Ring::new(&g.pool, Config::default()) {
                Ok(r) => g.ring = Some(r),
                Err(e) => return fail(e.to_string(), -libc::EIO),
            }
        }
        let Some(slot) = usize::try_from(idx).ok().and_then(|i| g.socks.get_mut(i)) else {
            return fail(format!("no socket {idx}"), -libc::EBADF);
        };
        if slot.id.is_some() {
            return 0;
        }
        let Some(fd) = slot.fd.take() else {
            return fail(format!("socket {idx} is closed"), -libc::EBADF);
        };
        match g.ring.as_mut().expect("created above").add_socket(fd) {
            Ok(id) => {
                slot.id = Some(id);
                0
            }
            Err(e) => fail(e.to_string(), -libc::EIO),
        }
    })
}

fn sock_of(g: &Global, idx: c_int) -> Option<SockId> {
    usize::try_from(idx)
        .ok()
        .and_then(|i| g.socks.get(i))
        .and_then(|s| s.id)
}

/// Posts `len` bytes of a pool page for sending on `idx`, zero-copy unless
/// `flags` has `MAIO_SEND_COPY`; 0 or a negative errno (see `maio.h`).
#[no_mangle]
pub extern "C" fn send_buffer(idx: c_int, buffer: *mut c_void, len: usize, flags: c_int) -> c_int {
    with(-libc::EINVAL, |g| {
        collect(g);
        let Some(s) = sock_of(g, idx) else {
            return fail(
                format!("socket {idx} has no ring: call init_tcp_ring"),
                -libc::EBADF,
            );
        };
        let pidx = match g.pool.index_of(buffer as *const u8) {
            Ok(i) => i,
            Err(e) => return fail(e.to_string(), -libc::EINVAL),
        };
        if len > PAGE {
            return fail(format!("{len} bytes is more than a page"), -libc::EMSGSIZE);
        }
        if g.pool.state(pidx) != Some(State::User) {
            return fail(
                format!(
                    "page {buffer:p} is {:?}, not the caller's",
                    g.pool.state(pidx)
                ),
                -libc::EBUSY,
            );
        }
        let ring = g.ring.as_mut().expect("a socket with an id has a ring");
        let r = if flags & SEND_COPY != 0 {
            // SAFETY: state User checked above; we only read the bytes.
            let data = unsafe { std::slice::from_raw_parts(buffer as *const u8, len) };
            ring.send_copy(s, data)
        } else {
            // SAFETY: state User checked above; the C side holds no token.
            match unsafe { g.pool.from_raw(pidx) } {
                Ok(b) => ring.send_zc(s, b, len),
                Err(e) => Err(e.into()),
            }
        };
        match r {
            Ok(()) => 0,
            Err(e) => fail(e.to_string(), -libc::EIO),
        }
    })
}

/// The page's state (`enum maio_buffer_state`), or -EINVAL; collects
/// completions on the way (see `maio.h`).
#[no_mangle]
pub extern "C" fn get_buffer_state(buffer: *mut c_void) -> c_int {
    with(-libc::EINVAL, |g| {
        collect(g);
        match g.pool.index_of(buffer as *const u8) {
            Ok(i) => g.pool.state(i).map(|s| s as c_int).unwrap_or(-libc::EINVAL),
            Err(e) => fail(e.to_string(), -libc::EINVAL),
        }
    })
}

/// Waits up to 5 s for data on `idx` and describes up to `n` received pages
/// in `io_vec`; the number filled, 0 at end of stream, or a negative errno
/// (see `maio.h`).
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
    with(-libc::EINVAL, |g| {
        if let Some(r) = wrong_cache(g, cache, -libc::EINVAL) {
            return r;
        }
        if io_vec.is_null() || n <= 0 {
            return fail("io_vec must hold at least one entry", -libc::EINVAL);
        }
        let Some(s) = sock_of(g, idx) else {
            return fail(
                format!("socket {idx} has no ring: call init_tcp_ring"),
                -libc::EBADF,
            );
        };
        let base = g.pool.region().0 as usize;
        let ring = g.ring.as_mut().expect("a socket with an id has a ring");
        let mut out = Vec::new();
        match ring.recv_sg_wait(s, n as usize, &mut out, Duration::from_secs(5)) {
            Ok(0) if ring.eof(s) => 0,
            Ok(0) => fail("nothing received within 5 s", -libc::EAGAIN),
            Ok(k) => {
                for (i, rb) in out.into_iter().enumerate() {
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
                k as c_int
            }
            Err(e) => fail(e.to_string(), -libc::EIO),
        }
    })
}

/// Whether the kernel copied the last zero-copy send on `idx`: 1, 0, or
/// -EINVAL (see `maio.h`).
#[no_mangle]
pub extern "C" fn maio_last_send_copied(idx: c_int) -> c_int {
    with(-libc::EINVAL, |g| {
        collect(g);
        match usize::try_from(idx).ok().and_then(|i| g.socks.get(i)) {
            Some(SockSlot {
                last_copied: Some(c),
                ..
            }) => *c as c_int,
            _ => -libc::EINVAL,
        }
    })
}

/// The description of this thread's last error ("" if none); valid until
/// this thread's next failing call.
#[no_mangle]
pub extern "C" fn maio_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}
