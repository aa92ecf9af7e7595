//! pcap files as a port: frames are received from one file and transmitted
//! into another.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::Path;
use std::time::Duration;

use maio::Pool;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::DataLink;

use crate::{Error, Nic, PortStats, Slot, HEADROOM};

/// Reads frames from a pcap file and writes transmitted frames to another.
pub struct PcapPort {
    reader: Option<PcapReader<BufReader<File>>>,
    writer: Option<PcapWriter<BufWriter<File>>>,
    in_path: String,
    out_path: String,
    stats: PortStats,
    clock: Duration,
}

fn err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Pcap {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

impl PcapPort {
    /// Opens `input` for reading (Ethernet link type) and, if given, creates
    /// `output` for writing.
    pub fn open(input: &Path, output: Option<&Path>) -> Result<Self, Error> {
        let f = File::open(input).map_err(|e| err(input, e))?;
        let reader = PcapReader::new(BufReader::new(f)).map_err(|e| err(input, e))?;
        if reader.header().datalink != DataLink::ETHERNET {
            return Err(err(
                input,
                format!("link type {:?} is not Ethernet", reader.header().datalink),
            ));
        }
        let writer = match output {
            Some(o) => {
                let f = File::create(o).map_err(|e| err(o, e))?;
                let hdr = PcapHeader {
                    datalink: DataLink::ETHERNET,
                    snaplen: 65_535,
                    ..PcapHeader::default()
                };
                Some(PcapWriter::with_header(BufWriter::new(f), hdr).map_err(|e| err(o, e))?)
            }
            None => None,
        };
        Ok(PcapPort {
            reader: Some(reader),
            writer,
            in_path: input.display().to_string(),
            out_path: output.map(|o| o.display().to_string()).unwrap_or_default(),
            stats: PortStats::default(),
            clock: Duration::ZERO,
        })
    }

    /// Flushes the output file.
    pub fn finish(&mut self) -> Result<(), Error> {
        if let Some(w) = self.writer.take() {
            let mut inner = w.into_writer();
            std::io::Write::flush(&mut inner).map_err(|e| err(Path::new(&self.out_path), e))?;
        }
        Ok(())
    }
}

impl Nic for PcapPort {
    fn receive(&mut self, pool: &Pool, slots: &mut [Slot]) -> Result<usize, Error> {
        let mut n = 0;
        let room = pool.buf_size() - HEADROOM;
        while n < slots.len() {
            let Some(reader) = self.reader.as_mut() else {
                break;
            };
            let pkt = match reader.next_packet() {
                None => {
                    self.reader = None;
                    break;
                }
                Some(Err(e)) => return Err(err(Path::new(&self.in_path), e)),
                Some(Ok(p)) => p,
            };
            self.clock = pkt.timestamp;
            self.stats.rx += 1;
            let data = &pkt.data;
            if data.len() > room || data.is_empty() {
                self.stats.rx_too_big += u64::from(!data.is_empty());
                continue;
            }
            let slot = &mut slots[n];
            let Some(buf) = slot.buf.as_mut() else { break };
            pool.data_mut(buf)[HEADROOM..HEADROOM + data.len()].copy_from_slice(data);
            self.stats.rx_bytes += data.len() as u64;
            slot.off = HEADROOM as u16;
            slot.len = data.len() as u16;
            n += 1;
        }
        Ok(n)
    }

    fn transmit(&mut self, pool: &Pool, slots: &[Slot]) -> Result<usize, Error> {
        let Some(w) = self.writer.as_mut() else {
            self.stats.tx += slots.len() as u64;
            return Ok(slots.len());
        };
        for s in slots {
            let frame = s.frame(pool);
            let rec = PcapPacket::new(self.clock, frame.len() as u32, frame);
            w.write_packet(&rec)
                .map_err(|e| err(Path::new(&self.out_path), e))?;
            self.stats.tx += 1;
            self.stats.tx_bytes += frame.len() as u64;
        }
        Ok(slots.len())
    }

    fn exhausted(&self) -> bool {
        self.reader.is_none()
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}

/// Writes frames to a pcap file (for building test inputs).
pub fn write_frames(path: &Path, frames: &[Vec<u8>]) -> Result<(), Error> {
    let f = File::create(path).map_err(|e| err(path, e))?;
    let hdr = PcapHeader {
        datalink: DataLink::ETHERNET,
        snaplen: 65_535,
        ..PcapHeader::default()
    };
    let mut w = PcapWriter::with_header(BufWriter::new(f), hdr).map_err(|e| err(path, e))?;
    for (i, fr) in frames.iter().enumerate() {
        let ts = Duration::from_micros(i as u64);
        w.write_packet(&PcapPacket::new(ts, fr.len() as u32, fr))
            .map_err(|e| err(path, e))?;
    }
    Ok(())
}

/// Reads every frame of a pcap file.
pub fn read_frames(path: &Path) -> Result<Vec<Vec<u8>>, Error> {
    let f = File::open(path).map_err(|e| err(path, e))?;
    let mut r = PcapReader::new(BufReader::new(f)).map_err(|e| err(path, e))?;
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        out.push(p.map_err(|e| err(path, e))?.data.into_owned());
    }
    Ok(out)
}
