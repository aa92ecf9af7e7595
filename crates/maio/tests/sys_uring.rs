//! MAIO socket I/O over io_uring against local TCP and UDP peers.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::thread::JoinHandle;
use std::time::Duration;

use maio::uring::{Config, Ring, RxBuf, SockId, UringError, ZC_PROBE_EVERY};
use maio::{Hugepages, Pool, State};

fn pool() -> Pool {
    pool_of(2048, 4096)
}

fn pool_of(buffers: u32, buf_size: usize) -> Pool {
    // The pool and the rings are locked memory.
    systest::require_memlock(buffers as u64 * buf_size as u64 + (8 << 20));
    Pool::new(maio::Config {
        buffers,
        buf_size,
        hugepages: Hugepages::Auto,
        ..Default::default()
    })
    .unwrap()
}

fn pattern(i: usize, n: usize) -> Vec<u8> {
    (0..n).map(|j| ((i * 31 + j * 7) % 251) as u8).collect()
}

#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn zero_copy_tcp_send_returns_every_buffer_and_reports_the_copy() {
    let (ring, (zc_half, plain_half)) = tcp_sends(true);
    // The first send asked for zero copy and was copied (local delivery).
    // Until its notification says so, later batches may still ask for zero
    // copy (how many depends on when the notification comes: two under a
    // loaded CI run); once it has come, the socket's sends are ordinary
    // ones, bar the probes. Half way every notification was in.
    assert!(ring.zc_sends >= 1, "never tried zero copy");
    let (zc, plain) = (ring.zc_sends - zc_half, ring.plain_sends - plain_half);
    assert!(plain > 0, "kept asking for zero copy on a copying route");
    assert!(
        zc <= 1 + plain / (ZC_PROBE_EVERY as u64 - 1),
        "{zc} zero-copy sends for {plain} ordinary ones after the route was known to copy",
    );
}

#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn without_adaptation_every_send_asks_for_zero_copy() {
    let (ring, _) = tcp_sends(false);
    assert_eq!(ring.plain_sends, 0);
    assert!(ring.zc_sends > 0);
}

/// 200 pool buffers sent on a local TCP connection: every one comes back,
/// reported copied, and the receiver gets every byte in order. Returns the
/// ring and its (zero-copy, ordinary) send counts when the first half had
/// been sent and notified.
fn tcp_sends(adaptive_zc: bool) -> (Ring, (u64, u64)) {
    let pool = pool();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    const N: usize = 200;
    let server = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut all = Vec::new();
        c.read_to_end(&mut all).unwrap();
        all
    });
    let mut ring = Ring::new(
        &pool,
        Config {
            adaptive_zc,
            ..Config::default()
        },
    )
    .unwrap();
    let s = ring.connect_tcp(addr).unwrap();
    let before = pool.stats().in_use;
    let mut want = Vec::new();
    let mut returned = 0;
    let mut copied = 0;
    let mut first = None;
    let mut half = (0, 0);
    for i in 0..N {
        let mut b = ring.handle().alloc().unwrap();
        let data = pattern(i, 4096);
        pool.data_mut(&mut b).copy_from_slice(&data);
        want.extend_from_slice(&data);
        let idx = b.index();
        first.get_or_insert(idx);
        ring.send_zc(s, b, 4096).unwrap();
        if i == N / 2 {
            // Let the first half be notified: the ring then knows whether
            // the kernel copies on this route.
            assert!(ring.drain(Duration::from_secs(5)));
            half = (ring.zc_sends, ring.plain_sends);
        }
        if i == 0 {
            assert_eq!(
                pool.state(idx),
                Some(State::InFlight),
                "the kernel owns it now"
            );
        }
        for c in ring.completions() {
            assert_eq!(c.result, 4096);
            let b = c.buf.expect("zero-copy sends hand the buffer back");
            assert_eq!(pool.state(b.index()), Some(State::User));
            copied += c.copied as usize;
            returned += 1;
            ring.handle().free(b).unwrap();
        }
    }
    assert!(ring.drain(Duration::from_secs(5)));
    for c in ring.completions() {
        assert_eq!(c.result, 4096);
        copied += c.copied as usize;
        returned += 1;
        ring.handle().free(c.buf.unwrap()).unwrap();
    }
    assert_eq!(returned, N);
    // Loopback delivers to a local socket, so the kernel copies, and says so.
    assert_eq!(copied, N, "local TCP should report copied sends");
    ring.close(s).unwrap();
    let got = server.join().unwrap();
    assert_eq!(got.len(), want.len());
    if got != want {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        let blk = at / 4096;
        let which = (0..N).find(|&i| got[blk * 4096..blk * 4096 + 4096] == pattern(i, 4096)[..]);
        panic!("bytes differ at {at} (block {blk}); that block holds pattern {which:?}");
    }
    assert_eq!(pool.stats().in_use, before, "a buffer leaked");
    // With SQPOLL a submission is a system call only when the polling
    // thread had gone to sleep: never more than one per send. (How often it
    // sleeps depends on the machine's load: the bench reports it.)
    assert!(ring.sqpoll());
    assert!(
        ring.enters <= N as u64,
        "{} io_uring_enter calls for {N} sends",
        ring.enters
    );
    (ring, half)
}

#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn receive_into_pool_buffers_as_a_scatter_gather_list() {
    let pool = pool();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let data = pattern(3, 3_000_000);
    let d2 = data.clone();
    let server = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        c.write_all(&d2).unwrap();
    });
    let mut ring = Ring::new(&pool, Config::default()).unwrap();
    let s = ring.connect_tcp(addr).unwrap();
    let mut got = Vec::new();
    let mut sg: Vec<RxBuf> = Vec::new();
    let mut max_sg = 0;
    for _ in 0..100_000 {
        sg.clear();
        let n = ring
            .recv_sg_wait(s, 16, &mut sg, Duration::from_millis(100))
            .unwrap();
        max_sg = max_sg.max(n);
        for b in sg.drain(..) {
            assert_eq!(pool.state(b.buf.index()), Some(State::Received));
            got.extend_from_slice(&pool.data(&b.buf)[..b.len]);
            ring.recycle(b).unwrap();
        }
        if ring.eof(s) {
            break;
        }
    }
    server.join().unwrap();
    assert!(ring.eof(s));
    assert_eq!(got.len(), data.len());
    assert!(got == data);
    assert!(max_sg > 1, "never more than one buffer per call");
}

#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn copy_mode_and_udp() {
    let pool = pool();
    let (mut ring, s, rx, _tx) = udp_ring(&pool, Config::default());
    let before = pool.stats().in_use;
    // Zero-copy datagram. Read it before sending the next: delivered
    // locally, a zero-copy datagram is charged to the receiver for the
    // pinned memory behind it, and the receive buffer overflows (the next
    // datagrams are dropped, counted in UdpRcvbufErrors).
    let mut buf = [0u8; 2048];
    let mut seen = Vec::new();
    let mut b = ring.handle().alloc().unwrap();
    pool.data_mut(&mut b)[..64].copy_from_slice(&pattern(1, 64));
    ring.send_zc(s, b, 64).unwrap();
    assert!(ring.drain(Duration::from_secs(2)));
    let n = rx.recv(&mut buf).unwrap();
    seen.push(buf[..n].to_vec());
    // Copy-mode datagram.
    ring.send_copy(s, &pattern(2, 100)).unwrap();
    assert!(ring.drain(Duration::from_secs(2)));
    let n = rx.recv(&mut buf).unwrap();
    seen.push(buf[..n].to_vec());
    let done = ring.completions();
    assert_eq!(done.len(), 2);
    for c in &done {
        assert!(c.result > 0, "send failed: {c:?}");
    }
    seen.sort_by_key(|v| v.len());
    assert_eq!(seen, vec![pattern(1, 64), pattern(2, 100)]);
    for c in done {
        if let Some(b) = c.buf {
            ring.handle().free(b).unwrap();
        }
    }
    assert_eq!(
        pool.stats().in_use,
        before,
        "copy-mode buffers go back to the pool"
    );
}

#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn misuse_is_an_error() {
    let pool = pool();
    let mut ring = Ring::new(
        &pool,
        Config {
            sqpoll: false,
            ..Config::default()
        },
    )
    .unwrap();
    let bogus = maio::uring::SockId(5);
    let b = ring.handle().alloc().unwrap();
    match ring.send_zc(bogus, b, 10) {
        Err(UringError::BadSocket(5)) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ring.send_copy(bogus, b"x"),
        Err(UringError::BadSocket(5))
    ));
    let mut sg = Vec::new();
    assert!(ring.recv_sg(bogus, 4, &mut sg).is_err());
}

#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn a_proxy_forwards_received_buffers_without_copying_them_in_order() {
    let ring = proxy(false);
    assert_eq!(ring.plain_sends, 0);
}

#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn a_proxy_on_a_copying_route_forwards_with_ordinary_sends_in_order() {
    let ring = proxy(true);
    assert!(
        ring.zc_sends >= 1 && ring.plain_sends > 0,
        "zc {} plain {}",
        ring.zc_sends,
        ring.plain_sends
    );
}

/// Loopback TCP ends for a proxy under test: the proxy's socket from the
/// client and its socket to the server; the client thread runs `client` on
/// its connection, the server thread reads everything until end of file.
struct ProxyEnds {
    inbound: TcpStream,
    outbound: TcpStream,
    client: JoinHandle<()>,
    server: JoinHandle<Vec<u8>>,
}

fn proxy_ends(client: impl FnOnce(TcpStream) + Send + 'static) -> ProxyEnds {
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let saddr = server.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut c, _) = server.accept().unwrap();
        let mut all = Vec::new();
        c.read_to_end(&mut all).unwrap();
        all
    });
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let faddr = front.local_addr().unwrap();
    let client = std::thread::spawn(move || client(TcpStream::connect(faddr).unwrap()));
    let (inbound, _) = front.accept().unwrap();
    let outbound = TcpStream::connect(saddr).unwrap();
    ProxyEnds {
        inbound,
        outbound,
        client,
        server,
    }
}

/// The proxy's loop: received buffers forwarded from `si` to `so` until the
/// client's end of file, every completion checked; `after` runs after each
/// forward with the bytes moved so far. Fails when it takes over 30 s.
fn forward_until_eof(
    ring: &mut Ring,
    si: SockId,
    so: SockId,
    what: &str,
    mut after: impl FnMut(&mut Ring, usize),
) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut sg = Vec::new();
    let mut moved = 0;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: receiving stopped after {moved} bytes"
        );
        sg.clear();
        let n = ring
            .recv_sg_wait(si, 64, &mut sg, Duration::from_millis(50))
            .unwrap();
        if n > 0 {
            moved += ring.forward_sg(&mut sg, so).unwrap();
            after(ring, moved);
        }
        for c in ring.completions() {
            assert!(c.result > 0, "{what}: {c:?}");
        }
        if n == 0 && ring.eof(si) {
            break;
        }
    }
    assert!(
        ring.drain(Duration::from_secs(5)),
        "{what}: sends not drained"
    );
    moved
}

/// 8 MB through a MAIO proxy between two local TCP connections: the same
/// bytes arrive in order and every buffer returns to the receive ring. The
/// client sends the second half only when the first has been forwarded and
/// its sends notified, so the ring knows by then whether the kernel copies.
fn proxy(adaptive_zc: bool) -> Ring {
    let pool = pool_of(1024, 16384);
    let data = pattern(9, 8_000_000);
    let d2 = data.clone();
    let half = data.len() / 2;
    let (go, wait_go) = std::sync::mpsc::channel::<()>();
    let ProxyEnds {
        inbound,
        outbound,
        client,
        server: sink,
    } = proxy_ends(move |mut c| {
        c.write_all(&d2[..half]).unwrap();
        wait_go.recv_timeout(Duration::from_secs(10)).unwrap();
        for chunk in d2[half..].chunks(100_000) {
            c.write_all(chunk).unwrap();
        }
    });
    let mut ring = Ring::new(
        &pool,
        Config {
            rx_buffers: 512,
            adaptive_zc,
            ..Config::default()
        },
    )
    .unwrap();
    let si = ring.add_socket(OwnedFd::from(inbound)).unwrap();
    let so = ring.add_socket(OwnedFd::from(outbound)).unwrap();
    let before = pool.stats().in_use;
    let moved = forward_until_eof(&mut ring, si, so, "the proxy", |ring, moved| {
        if moved == half {
            assert!(ring.drain(Duration::from_secs(5)));
            go.send(()).unwrap();
        }
    });
    assert_eq!(moved, data.len());
    ring.close(so).unwrap();
    client.join().unwrap();
    let got = sink.join().unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "the proxy reordered or corrupted bytes");
    assert_eq!(
        pool.stats().in_use,
        before,
        "forwarded buffers did not all come back"
    );
    ring
}

#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn batched_submission_sends_a_batch_per_system_call() {
    let pool = pool();
    let (mut ring, s, rx, _tx) = batched_udp(&pool);
    assert!(ring.batch_submit() && !ring.sqpoll());
    let mut buf = [0u8; 2048];
    let (batches, per_batch) = (4, 16);
    for b in 0..batches {
        for i in 0..per_batch {
            ring.send_copy(s, &pattern(b * per_batch + i, 40 + i))
                .unwrap();
        }
        assert_eq!(
            ring.enters, b as u64,
            "nothing entered before the batch point"
        );
        // Nothing was handed to the kernel yet: nothing arrives.
        rx.set_nonblocking(true).unwrap();
        assert!(
            rx.recv(&mut buf).is_err(),
            "a datagram left before its batch"
        );
        rx.set_nonblocking(false).unwrap();
        let mut done = ring.completions();
        assert_eq!(ring.enters, b as u64 + 1, "one system call per batch");
        while done.len() < per_batch {
            ring.wait_for(per_batch - done.len(), Duration::from_millis(100));
            done.extend(ring.completions());
        }
        assert!(done.iter().all(|c| c.result > 0), "{done:?}");
        for i in 0..per_batch {
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(buf[..n], pattern(b * per_batch + i, 40 + i)[..]);
        }
    }
}

/// A ring configured by `cfg` and a connected UDP pair on loopback (the
/// receiver waits up to 2 s per datagram); the sender is registered with
/// the ring, and a second handle on it returned.
fn udp_ring(pool: &Pool, cfg: Config) -> (Ring, maio::uring::SockId, UdpSocket, UdpSocket) {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.connect(rx.local_addr().unwrap()).unwrap();
    let mut ring = Ring::new(pool, cfg).unwrap();
    let s = ring
        .add_socket(OwnedFd::from(tx.try_clone().unwrap()))
        .unwrap();
    (ring, s, rx, tx)
}

/// [`udp_ring`] with batched submission and no polling thread.
fn batched_udp(pool: &Pool) -> (Ring, maio::uring::SockId, UdpSocket, UdpSocket) {
    udp_ring(
        pool,
        Config {
            sqpoll: false,
            batch_submit: true,
            ..Config::default()
        },
    )
}

/// Send `batches` of datagrams (their lengths) through `ring`, reading
/// each batch back before the next: every datagram arrives whole, in
/// order, exactly once, and every send completes with its length.
fn send_and_check(ring: &mut Ring, s: maio::uring::SockId, rx: &UdpSocket, batches: &[Vec<usize>]) {
    let mut buf = vec![0u8; 65536];
    let mut k = 0;
    for batch in batches {
        for (i, &n) in batch.iter().enumerate() {
            ring.send_copy(s, &pattern(k + i, n)).unwrap();
        }
        let mut done = ring.completions();
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while done.len() < batch.len() && std::time::Instant::now() < end {
            ring.wait_for(batch.len() - done.len(), Duration::from_millis(100));
            done.extend(ring.completions());
        }
        let results: Vec<i32> = done.iter().map(|c| c.result).collect();
        let want: Vec<i32> = batch.iter().map(|&n| n as i32).collect();
        assert_eq!(results, want, "completions, in order, with each length");
        for (i, &n) in batch.iter().enumerate() {
            let got = rx.recv(&mut buf).expect("a datagram that never came");
            assert_eq!(
                &buf[..got],
                &pattern(k + i, n)[..],
                "datagram {i} of {batch:?}"
            );
        }
        k += batch.len();
    }
    rx.set_nonblocking(true).unwrap();
    assert!(rx.recv(&mut buf).is_err(), "a datagram arrived twice");
    rx.set_nonblocking(false).unwrap();
}

#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn batched_datagrams_of_one_size_go_segmented_and_arrive_one_by_one() {
    let pool = pool();
    let (mut ring, s, rx, _tx) = batched_udp(&pool);
    // Runs of 64-byte datagrams (one short last one), then one of 100
    // (larger than the run: a new run), then 100 datagrams (more than one
    // segmented send can carry).
    let mut batch = vec![64; 10];
    batch.push(20);
    batch.extend([100, 100, 7]);
    send_and_check(&mut ring, s, &rx, &[batch, vec![64; 100]]);
    assert!(
        ring.gso_sends >= 3,
        "{} segmented sends for runs of 11, 3 and 100 datagrams",
        ring.gso_sends
    );
    assert_eq!(ring.gso_datagrams, 114);
    assert_eq!(ring.gso_refused, 0);
    assert_eq!(ring.in_flight(), 0);
}

#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn a_socket_that_refuses_segmentation_loses_nothing() {
    let pool = pool();
    let (mut ring, s, rx, tx) = batched_udp(&pool);
    // SO_NO_CHECK (no UDP checksums) makes the kernel refuse UDP_SEGMENT
    // with EINVAL: the refused batch is resent datagram by datagram.
    let one: libc::c_int = 1;
    // SAFETY: a setsockopt with a c_int option value that lives across the call.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&tx),
            libc::SOL_SOCKET,
            libc::SO_NO_CHECK,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    assert_eq!(r, 0, "SO_NO_CHECK");
    send_and_check(&mut ring, s, &rx, &[vec![64; 16], vec![64; 16]]);
    assert_eq!(ring.gso_refused, 1, "refused once, then not asked again");
    assert_eq!(ring.gso_sends, 1);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
    /// Any sequence of datagram lengths (runs of repeats, as a sender of
    /// fixed-size messages makes them, broken by other lengths) arrives as
    /// sent.
    #[test]
    #[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
    fn any_datagram_lengths_arrive_as_sent(
        batches in proptest::collection::vec(
            proptest::collection::vec((0usize..1500, 1usize..40), 1..6),
            1..4,
        )
    ) {
        let pool = pool();
        let (mut ring, s, rx, _tx) = batched_udp(&pool);
        let batches: Vec<Vec<usize>> = batches
            .iter()
            .map(|runs| {
                // Within the receiver's default buffer (each datagram costs
                // it about twice its length plus a kilobyte).
                let mut room = 180_000usize;
                runs.iter()
                    .flat_map(|&(n, k)| std::iter::repeat_n(n, k))
                    .take_while(|&n| {
                        room = room.saturating_sub(2 * n + 1024);
                        room > 0
                    })
                    .collect()
            })
            .collect();
        send_and_check(&mut ring, s, &rx, &batches);
        proptest::prop_assert_eq!(ring.in_flight(), 0);
        proptest::prop_assert_eq!(ring.gso_refused, 0);
    }
}

/// An empty message on a datagram socket is an empty datagram, alone or
/// between segmented runs, batched or not.
#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn an_empty_copy_mode_send_is_an_empty_datagram() {
    let pool = pool();
    let (mut ring, s, rx, _tx) = batched_udp(&pool);
    send_and_check(&mut ring, s, &rx, &[vec![0], vec![64, 64, 0, 64, 64]]);
    let (mut plain, s2, rx2, _tx2) = udp_ring(
        &pool,
        Config {
            sqpoll: false,
            ..Config::default()
        },
    );
    send_and_check(&mut plain, s2, &rx2, &[vec![0, 10, 0]]);
}

/// A proxy whose receive ring is small runs out of receive buffers all the
/// time: the kernel ends the multishot receive with ENOBUFS while the
/// buffers are out being forwarded. When the sends that return them were
/// reaped in the same batch as (and before) that ENOBUFS, the ring used to
/// believe it was still starved with every buffer back, never received
/// again, and the proxy waited for ever with megabytes in the socket (the
/// Figure 4 benchmark hung with 64 buffers, stalled with 16). Each configuration
/// must move all of its bytes, in order, before a deadline.
#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn a_proxy_with_few_receive_buffers_never_stops_receiving() {
    let pool = pool_of(256, 65536);
    let data = std::sync::Arc::new(pattern(5, 24 << 20));
    for (rx_buffers, batch_submit) in [(2, true), (4, true), (8, true), (4, false), (16, true)] {
        let d2 = data.clone();
        let ProxyEnds {
            inbound,
            outbound,
            client,
            server: sink,
        } = proxy_ends(move |mut c| {
            for chunk in d2.chunks(256 << 10) {
                c.write_all(chunk).unwrap();
            }
        });
        let mut ring = Ring::new(
            &pool,
            Config {
                rx_buffers,
                batch_submit,
                ..Config::default()
            },
        )
        .unwrap();
        let si = ring.add_socket(OwnedFd::from(inbound)).unwrap();
        let so = ring.add_socket(OwnedFd::from(outbound)).unwrap();
        let label = format!("{rx_buffers} receive buffers (batched {batch_submit})");
        let moved = forward_until_eof(&mut ring, si, so, &label, |_, _| {});
        assert_eq!(moved, data.len(), "{label}");
        ring.close(so).unwrap();
        client.join().unwrap();
        let got = sink.join().unwrap();
        assert!(
            got == *data,
            "{rx_buffers} buffers: bytes reordered or lost"
        );
    }
}
