//! A thread that waits inside the C API (a receive with no data yet, a
//! connect to a peer that does not answer) must not delay other threads'
//! calls: allocation, freeing and sending go on meanwhile. One process-wide
//! lock held through `tcp_receive_sg` made `alloc_page` in another thread
//! wait 4.8 s, and `create_connected_socket` held it through `connect`.

use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use maio_c::{alloc_page, create_connected_socket, free_page, init_hp_memory, init_tcp_ring};

/// The longest one `alloc_page` + `free_page` pair took in `window`, with
/// another thread inside a waiting call the whole time.
fn slowest_alloc_while(busy: &AtomicBool, cache: *mut std::ffi::c_void) -> (Duration, u32) {
    let mut worst = Duration::ZERO;
    let mut calls = 0;
    let end = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < end && busy.load(Ordering::Acquire) {
        let t = Instant::now();
        let p = alloc_page(cache);
        assert!(!p.is_null(), "alloc_page failed");
        assert_eq!(free_page(cache, p), 0);
        worst = worst.max(t.elapsed());
        calls += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    (worst, calls)
}

/// 127.0.0.1 as `create_connected_socket` takes it (network byte order).
fn loopback() -> u32 {
    u32::from(std::net::Ipv4Addr::LOCALHOST).to_be()
}

#[test]
fn a_receive_waiting_for_data_does_not_hold_up_allocation() {
    let cache = init_hp_memory(2);
    assert!(!cache.is_null());
    // A peer that accepts and then says nothing for 3 s.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let peer = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        std::thread::sleep(Duration::from_secs(3));
        drop(s);
    });
    let idx = create_connected_socket(loopback(), port);
    assert!(idx >= 0, "connect failed: {idx}");
    assert_eq!(init_tcp_ring(idx, cache), 0);

    let busy = Arc::new(AtomicBool::new(true));
    let b = busy.clone();
    let cache_addr = cache as usize;
    let receiver = std::thread::spawn(move || {
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 4];
        let t = Instant::now();
        // SAFETY: iov has the 4 entries we announce.
        let r = unsafe {
            maio_c::tcp_receive_sg(
                idx,
                iov.as_mut_ptr(),
                4,
                cache_addr as *mut std::ffi::c_void,
            )
        };
        b.store(false, Ordering::Release);
        (r, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    let (worst, calls) = slowest_alloc_while(&busy, cache);
    let (r, waited) = receiver.join().unwrap();
    peer.join().unwrap();
    // The receive really waited (the peer was silent), and every
    // allocation meanwhile was quick.
    assert!(
        waited >= Duration::from_millis(1000),
        "the receive returned {r} after {waited:?}: it did not wait, so this test proves nothing"
    );
    assert!(
        calls >= 20,
        "only {calls} allocations while the receive waited"
    );
    assert!(
        worst < Duration::from_millis(200),
        "an allocation took {worst:?} while another thread waited in tcp_receive_sg"
    );
}

#[test]
fn a_slow_connect_does_not_hold_up_allocation() {
    let cache = init_hp_memory(2);
    assert!(!cache.is_null());
    // A listener with a backlog of 0 and one connection it never accepts:
    // its queue is full, so the kernel drops the next SYN and that connect
    // waits (retransmitting) until its timeout.
    // SAFETY: plain socket calls on descriptors this test owns.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert!(fd >= 0);
    // SAFETY: fd was just returned by socket(2) and is owned here only.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: addr is a valid sockaddr_in of `len` bytes.
    let bound_ok = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_in).cast(),
            len,
        )
    };
    assert_eq!(bound_ok, 0);
    // SAFETY: a bound stream socket.
    let listening = unsafe { libc::listen(fd.as_raw_fd(), 0) };
    assert_eq!(listening, 0);
    let mut bound = addr;
    let mut blen = len;
    // SAFETY: bound has room for a sockaddr_in.
    let named = unsafe {
        libc::getsockname(
            fd.as_raw_fd(),
            (&mut bound as *mut libc::sockaddr_in).cast(),
            &mut blen,
        )
    };
    assert_eq!(named, 0);
    let port = u16::from_be(bound.sin_port);
    let _first = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();

    let busy = Arc::new(AtomicBool::new(true));
    let b = busy.clone();
    let connector = std::thread::spawn(move || {
        let t = Instant::now();
        let r = create_connected_socket(loopback(), port);
        b.store(false, Ordering::Release);
        (r, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    let (worst, calls) = slowest_alloc_while(&busy, cache);
    let (r, waited) = connector.join().unwrap();
    drop(fd);
    assert!(
        waited >= Duration::from_millis(1000),
        "the connect returned {r} after {waited:?}: it did not wait, so this test proves nothing"
    );
    assert!(
        calls >= 20,
        "only {calls} allocations while the connect waited"
    );
    assert!(
        worst < Duration::from_millis(200),
        "an allocation took {worst:?} while another thread waited in create_connected_socket"
    );
}
