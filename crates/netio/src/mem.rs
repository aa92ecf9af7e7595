//! An in-memory generator and sink: the generator "receives" copies of
//! template frames (as a NIC's DMA would write them), rewriting the TCP/UDP
//! source port per packet when asked, so each packet can be a new flow.

use maio::Pool;

use crate::{Error, Nic, PortStats, Slot, HEADROOM};

/// How the generator varies packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vary {
    /// Send the templates as they are, round robin.
    None,
    /// Overwrite the transport source port with a running counter (a new
    /// 5-tuple per packet for up to 65536 x templates packets).
    SourcePort {
        /// Offset of the source port in each template frame.
        at: usize,
    },
}

/// A generator of frames from templates, and a sink for transmitted frames.
pub struct MemPort {
    templates: Vec<Vec<u8>>,
    vary: Vary,
    next: usize,
    counter: u64,
    limit: Option<u64>,
    stats: PortStats,
    /// Copies of transmitted frames, if capture is on.
    pub captured: Option<Vec<Vec<u8>>>,
}

impl MemPort {
    /// A generator cycling over `templates`, producing `limit` frames (or
    /// forever).
    pub fn new(templates: Vec<Vec<u8>>, vary: Vary, limit: Option<u64>) -> Self {
        MemPort {
            templates,
            vary,
            next: 0,
            counter: 0,
            limit,
            stats: PortStats::default(),
            captured: None,
        }
    }

    /// Keep a copy of every transmitted frame (for tests).
    pub fn capture(mut self) -> Self {
        self.captured = Some(Vec::new());
        self
    }
}

impl Nic for MemPort {
    fn receive(&mut self, pool: &Pool, slots: &mut [Slot]) -> Result<usize, Error> {
        if self.templates.is_empty() {
            return Ok(0);
        }
        let mut n = 0;
        for slot in slots.iter_mut() {
            if self.limit.is_some_and(|l| self.counter >= l) {
                break;
            }
            let Some(buf) = slot.buf.as_mut() else { break };
            let t = &self.templates[self.next];
            self.next += 1;
            if self.next == self.templates.len() {
                self.next = 0;
            }
            let data = pool.data_mut(buf);
            let len = t.len().min(data.len() - HEADROOM);
            data[HEADROOM..HEADROOM + len].copy_from_slice(&t[..len]);
            if let Vary::SourcePort { at } = self.vary {
                if at + 2 <= len {
                    let port = (self.counter / self.templates.len() as u64) as u16;
                    data[HEADROOM + at..HEADROOM + at + 2].copy_from_slice(&port.to_be_bytes());
                }
            }
            self.counter += 1;
            self.stats.rx += 1;
            self.stats.rx_bytes += len as u64;
            slot.off = HEADROOM as u16;
            slot.len = len as u16;
            n += 1;
        }
        Ok(n)
    }

    fn transmit(&mut self, pool: &Pool, slots: &[Slot]) -> Result<usize, Error> {
        for s in slots {
            self.stats.tx_bytes += u64::from(s.len);
            if let Some(c) = self.captured.as_mut() {
                c.push(s.frame(pool).to_vec());
            }
        }
        self.stats.tx += slots.len() as u64;
        Ok(slots.len())
    }

    fn exhausted(&self) -> bool {
        self.limit.is_some_and(|l| self.counter >= l)
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}
