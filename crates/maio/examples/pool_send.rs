//! A MAIO buffer pool, and sends straight from its buffers: allocate,
//! write, hand to the kernel zero-copy through io_uring, get the buffer
//! back when the kernel is done with it.
//!
//! ```sh
//! cargo run -p maio --example pool_send
//! ```
//!
//! The pool sits in reserved 2 MiB hugepages when there are some; without
//! them it says so and uses normal memory (transparent hugepages). Where
//! io_uring is missing (switched off, an old kernel, a sandbox that filters
//! it) the same buffers go out with plain `write` calls. Either way a
//! receiver on the other end of a loopback TCP connection checks every byte.

use std::error::Error;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use maio::uring::{self, Ring};
use maio::{Backing, Config, Hugepages, Pool, State};

/// 1024 buffers of 2 KiB: one hugepage.
const BUFFERS: u32 = 1024;
const BUF_SIZE: usize = 2048;
/// Buffers sent.
const SENDS: usize = 64;

/// What buffer `i` carries: a pattern a misplaced or torn buffer cannot
/// reproduce.
fn fill(i: usize, b: &mut [u8]) {
    for (j, x) in b.iter_mut().enumerate() {
        *x = ((i * 31 + j * 7) % 251) as u8;
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let pool = Pool::new(Config {
        buffers: BUFFERS,
        buf_size: BUF_SIZE,
        hugepages: Hugepages::Auto,
        ..Config::default()
    })?;
    match pool.backing() {
        Backing::Hugetlb => {
            println!("pool: {BUFFERS} buffers of {BUF_SIZE} bytes in reserved 2 MiB hugepages")
        }
        other => println!(
            "warning: no hugepages reserved, so the pool is on normal pages ({other:?}); \
             reserve some with `echo 8 > /proc/sys/vm/nr_hugepages` as root"
        ),
    }

    // The other end: a plain socket that reads until the sender closes.
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let receiver = thread::spawn(move || -> std::io::Result<Vec<u8>> {
        let (mut c, _) = listener.accept()?;
        let mut all = Vec::new();
        c.read_to_end(&mut all)?;
        Ok(all)
    });

    // The ring lends some pool buffers to the kernel for receiving; this
    // example only sends, so a few will do.
    let cfg = uring::Config {
        rx_buffers: 16,
        ..uring::Config::default()
    };
    let want = match Ring::new(&pool, cfg) {
        Ok(ring) => send_with_uring(ring, addr)?,
        Err(e) => {
            println!("io_uring unavailable ({e}); sending with write(2) instead");
            send_with_write(&pool, addr)?
        }
    };

    let got = receiver.join().map_err(|_| "the receiver panicked")??;
    assert_eq!(got.len(), want.len(), "bytes received");
    assert!(got == want, "the receiver got other bytes than were sent");
    println!("the receiver got all {} bytes, in order", got.len());
    let stats = pool.stats();
    println!(
        "pool: {} buffers carved, {} in use, {} depot trips",
        stats.carved, stats.in_use, stats.depot_trips
    );
    assert_eq!(stats.in_use, 0, "every buffer is back in the pool");
    Ok(())
}

/// Zero-copy sends of pool buffers on a ring; returns the bytes sent.
fn send_with_uring(mut ring: Ring, addr: SocketAddr) -> Result<Vec<u8>, Box<dyn Error>> {
    let pool = ring.pool().clone();
    println!(
        "io_uring: submissions {}",
        if ring.sqpoll() {
            "through a kernel polling thread"
        } else {
            "by system call"
        }
    );
    let s = ring.connect_tcp(addr)?;
    let mut want = Vec::new();
    let mut returned = 0;
    let mut copied = 0;
    let mut give_back = |ring: &mut Ring| -> Result<(), Box<dyn Error>> {
        for sent in ring.completions() {
            assert_eq!(sent.result, BUF_SIZE as i32, "a short or failed send");
            // A zero-copy send hands its buffer back when the kernel is
            // done with it; `copied` says the kernel copied it after all,
            // as it must for a local receiver.
            let b = sent.buf.ok_or("a zero-copy send without its buffer")?;
            copied += usize::from(sent.copied);
            returned += 1;
            ring.handle().free(b)?;
        }
        Ok(())
    };
    for i in 0..SENDS {
        let mut b = ring.handle().alloc()?;
        fill(i, pool.data_mut(&mut b));
        want.extend_from_slice(pool.data(&b));
        let idx = b.index();
        ring.send_zc(s, b, BUF_SIZE)?;
        // Until its completion the kernel owns the buffer: freeing or
        // reusing it now would be an error, not a corruption.
        if i == 0 {
            assert_eq!(pool.state(idx), Some(State::InFlight));
        }
        give_back(&mut ring)?;
    }
    // A small message is cheaper copied: copy mode takes a slice.
    let trailer = b"that was all";
    ring.send_copy(s, trailer)?;
    want.extend_from_slice(trailer);
    if !ring.drain(Duration::from_secs(5)) {
        return Err("sends still in flight after 5 s".into());
    }
    // The copy-mode send's completion carries no buffer: it went back to
    // the pool by itself.
    for sent in ring.completions() {
        if let Some(b) = sent.buf {
            copied += usize::from(sent.copied);
            returned += 1;
            ring.handle().free(b)?;
        }
    }
    ring.close(s)?;
    // Requests, not buffers: on TCP, buffers queued while a send is in
    // flight go out together as one message.
    println!(
        "sent {SENDS} buffers in {} requests ({} asking for zero copy, {} ordinary once the kernel \
         said it copies on this route); {returned} buffers came back, {copied} of them copied",
        ring.zc_sends + ring.plain_sends,
        ring.zc_sends,
        ring.plain_sends
    );
    assert_eq!(returned, SENDS, "every buffer came back");
    Ok(want)
}

/// The same buffers written with plain `write` calls; returns the bytes
/// sent.
fn send_with_write(pool: &Pool, addr: SocketAddr) -> Result<Vec<u8>, Box<dyn Error>> {
    let mut handle = pool.handle();
    let mut conn = TcpStream::connect(addr)?;
    let mut want = Vec::new();
    for i in 0..SENDS {
        let mut b = handle.alloc()?;
        fill(i, pool.data_mut(&mut b));
        conn.write_all(pool.data(&b))?;
        want.extend_from_slice(pool.data(&b));
        handle.free(b)?;
    }
    let trailer = b"that was all";
    conn.write_all(trailer)?;
    want.extend_from_slice(trailer);
    println!("sent {SENDS} buffers with write(2)");
    Ok(want)
}
