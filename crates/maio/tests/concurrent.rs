//! The pool under concurrent use: buffers cross threads, magazines spill to
//! the depot, and no buffer is ever handed to two owners at once.

use std::sync::mpsc;
use std::thread;

use maio::{Config, Hugepages, Pool};

#[test]
fn buffers_cross_threads_without_double_ownership() {
    let pool = Pool::new(Config {
        buffers: 512,
        buf_size: 256,
        hugepages: Hugepages::Never,
        magazine_depth: 8,
    })
    .unwrap();
    let (tx, rx) = mpsc::sync_channel::<u32>(64);
    let producer = {
        let pool = pool.clone();
        thread::spawn(move || {
            let mut h = pool.handle();
            let mut sent = 0u32;
            let mut stamp = 0u64;
            while sent < 200_000 {
                match h.alloc() {
                    Ok(mut b) => {
                        stamp += 1;
                        // Stamp the buffer; the consumer checks nobody else wrote it.
                        pool.data_mut(&mut b)[..8].copy_from_slice(&stamp.to_le_bytes());
                        pool.data_mut(&mut b)[8..16].copy_from_slice(&stamp.to_le_bytes());
                        tx.send(b.into_raw()).unwrap();
                        sent += 1;
                    }
                    Err(_) => thread::yield_now(), // the consumer holds them all
                }
            }
        })
    };
    let mut h = pool.handle();
    let mut got = 0u32;
    while let Ok(idx) = rx.recv() {
        // SAFETY: each index was given up once by the producer and is taken
        // back once here.
        let b = unsafe { pool.from_raw(idx) }.unwrap();
        let d = pool.data(&b);
        assert_eq!(d[..8], d[8..16], "buffer {idx} was written by two owners");
        h.free(b).unwrap();
        got += 1;
    }
    producer.join().unwrap();
    assert_eq!(got, 200_000);
    drop(h);
    let s = pool.stats();
    assert_eq!(s.in_use, 0);
    assert!(
        s.depot_trips > 0,
        "magazines must have spilled through the depot"
    );
}

#[test]
fn hugepages_when_reserved() {
    let reserved: usize = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let res = Pool::new(Config {
        buffers: 1024,
        buf_size: 2048,
        hugepages: Hugepages::Require,
        magazine_depth: 64,
    });
    if reserved >= 1 {
        let p = res.expect("hugepages are reserved, so Require must succeed");
        assert_eq!(p.backing(), maio::Backing::Hugetlb);
    } else {
        let e = res.unwrap_err().to_string();
        assert!(
            e.contains("nr_hugepages"),
            "the error must say how to reserve them: {e}"
        );
    }
    // Auto always works.
    let p = Pool::new(Config {
        buffers: 1024,
        ..Config::default()
    })
    .unwrap();
    assert!(p.handle().alloc().is_ok());
}
