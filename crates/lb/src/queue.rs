//! Single-producer single-consumer queues of 64-bit descriptors between the
//! steering/muxing thread and the packet threads.
//!
//! Each side owns one index (netmap's rule): the producer writes `tail`, the
//! consumer writes `head`. The producer makes its writes visible in batches
//! ([`Producer::publish`]), so a consumer sees a batch at once: that is how
//! "a batch is processed when full or when a timer expires" is realized.
//! Both sides cache the other's index and only re-read it when they run out,
//! so in the steady state a batch costs two shared cache-line transfers.
//! Slots are atomics, so this is safe code throughout.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

#[repr(align(64))]
#[derive(Debug, Default)]
struct Padded(AtomicUsize);

#[derive(Debug)]
struct Shared {
    slots: Box<[AtomicU64]>,
    mask: usize,
    head: Padded,
    tail: Padded,
}

/// The producing end.
#[derive(Debug)]
pub struct Producer {
    q: Arc<Shared>,
    tail: usize,
    head_cache: usize,
}

/// The consuming end.
#[derive(Debug)]
pub struct Consumer {
    q: Arc<Shared>,
    head: usize,
    tail_cache: usize,
}

/// A queue of `size` slots (a power of two).
pub fn queue(size: usize) -> (Producer, Consumer) {
    let size = size.max(2).next_power_of_two();
    let q = Arc::new(Shared {
        slots: (0..size).map(|_| AtomicU64::new(0)).collect(),
        mask: size - 1,
        head: Padded::default(),
        tail: Padded::default(),
    });
    (
        Producer {
            q: Arc::clone(&q),
            tail: 0,
            head_cache: 0,
        },
        Consumer {
            q,
            head: 0,
            tail_cache: 0,
        },
    )
}

impl Producer {
    /// Appends a descriptor (not yet visible); false if the queue is full.
    #[inline]
    pub fn push(&mut self, v: u64) -> bool {
        let cap = self.q.mask + 1;
        if self.tail - self.head_cache == cap {
            self.head_cache = self.q.head.0.load(Ordering::Acquire);
            if self.tail - self.head_cache == cap {
                return false;
            }
        }
        self.q.slots[self.tail & self.q.mask].store(v, Ordering::Relaxed);
        self.tail += 1;
        true
    }

    /// Makes every pushed descriptor visible to the consumer.
    #[inline]
    pub fn publish(&mut self) {
        self.q.tail.0.store(self.tail, Ordering::Release);
    }

    /// Pushed but not yet published.
    pub fn unpublished(&self) -> usize {
        self.tail - self.q.tail.0.load(Ordering::Relaxed)
    }

    /// Whether the consumer has taken everything published.
    pub fn is_drained(&self) -> bool {
        self.q.head.0.load(Ordering::Acquire) == self.tail
    }
}

impl Consumer {
    /// Takes the next published descriptor.
    #[inline]
    pub fn pop(&mut self) -> Option<u64> {
        if self.head == self.tail_cache {
            self.tail_cache = self.q.tail.0.load(Ordering::Acquire);
            if self.head == self.tail_cache {
                return None;
            }
        }
        let v = self.q.slots[self.head & self.q.mask].load(Ordering::Relaxed);
        self.head += 1;
        Some(v)
    }

    /// Whether nothing published is left to pop.
    pub fn is_empty(&mut self) -> bool {
        self.tail_cache = self.q.tail.0.load(Ordering::Acquire);
        self.head == self.tail_cache
    }

    /// Gives the popped slots back to the producer.
    #[inline]
    pub fn release(&mut self) {
        self.q.head.0.store(self.head, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_capacity_and_publication() {
        let (mut p, mut c) = queue(4);
        for i in 0..4 {
            assert!(p.push(i));
        }
        assert!(!p.push(9), "full at capacity");
        assert_eq!(c.pop(), None, "nothing visible before publish");
        p.publish();
        assert_eq!(p.unpublished(), 0);
        assert_eq!((c.pop(), c.pop()), (Some(0), Some(1)));
        assert!(!p.push(9), "popped slots are not free until released");
        c.release();
        assert!(p.push(4));
        p.publish();
        assert_eq!(
            (c.pop(), c.pop(), c.pop(), c.pop()),
            (Some(2), Some(3), Some(4), None)
        );
    }

    #[test]
    fn across_threads_in_order() {
        let (mut p, mut c) = queue(64);
        let t = std::thread::spawn(move || {
            let mut next = 0u64;
            while next < 100_000 {
                while let Some(v) = c.pop() {
                    assert_eq!(v, next);
                    next += 1;
                }
                c.release();
                std::hint::spin_loop();
            }
        });
        let mut i = 0u64;
        while i < 100_000 {
            if p.push(i) {
                i += 1;
                if i.is_multiple_of(16) {
                    p.publish();
                }
            } else {
                p.publish();
                std::thread::yield_now();
            }
        }
        p.publish();
        t.join().unwrap();
    }
}
