//! pcap files as a port: frames are received from one file and transmitted
//! into another.

use std::fs::File;
use std::io::{self, BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::time::Duration;

use maio::Pool;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::{DataLink, PcapError};

use crate::{Nic, PortStats, Slot, HEADROOM};

/// Why a pcap file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened, created or flushed.
    #[error("pcap {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// The file is not a pcap file, or a record could not be read or
    /// written.
    #[error("pcap {}: {source}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// The pcap library's answer.
        #[source]
        source: PcapError,
    },
    /// The file holds frames of another link type.
    #[error("pcap {}: link type {link:?} is not Ethernet", path.display())]
    NotEthernet {
        /// The file.
        path: PathBuf,
        /// Its link type.
        link: DataLink,
    },
}

/// Reads frames from a pcap file and writes transmitted frames to another.
pub struct PcapPort {
    reader: Option<PcapReader<BufReader<File>>>,
    writer: Option<PcapWriter<BufWriter<File>>>,
    in_path: PathBuf,
    out_path: PathBuf,
    stats: PortStats,
    clock: Duration,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> crate::Error + '_ {
    move |source| {
        Error::Io {
            path: path.into(),
            source,
        }
        .into()
    }
}

fn format_err(path: &Path) -> impl FnOnce(PcapError) -> crate::Error + '_ {
    move |source| {
        Error::Format {
            path: path.into(),
            source,
        }
        .into()
    }
}

impl PcapPort {
    /// Opens `input` for reading (Ethernet link type) and, if given, creates
    /// `output` for writing.
    pub fn open(input: &Path, output: Option<&Path>) -> Result<Self, crate::Error> {
        let f = File::open(input).map_err(io_err(input))?;
        let reader = PcapReader::new(BufReader::new(f)).map_err(format_err(input))?;
        if reader.header().datalink != DataLink::ETHERNET {
            return Err(Error::NotEthernet {
                path: input.into(),
                link: reader.header().datalink,
            }
            .into());
        }
        let writer = match output {
            Some(o) => {
                let f = File::create(o).map_err(io_err(o))?;
                let hdr = PcapHeader {
                    datalink: DataLink::ETHERNET,
                    snaplen: 65_535,
                    ..PcapHeader::default()
                };
                Some(PcapWriter::with_header(BufWriter::new(f), hdr).map_err(format_err(o))?)
            }
            None => None,
        };
        Ok(PcapPort {
            reader: Some(reader),
            writer,
            in_path: input.into(),
            out_path: output.map(Path::to_path_buf).unwrap_or_default(),
            stats: PortStats::default(),
            clock: Duration::ZERO,
        })
    }

    /// Flushes the output file.
    pub fn finish(&mut self) -> Result<(), crate::Error> {
        if let Some(w) = self.writer.take() {
            let mut inner = w.into_writer();
            io::Write::flush(&mut inner).map_err(io_err(&self.out_path))?;
        }
        Ok(())
    }
}

impl Nic for PcapPort {
    fn receive(&mut self, pool: &Pool, slots: &mut [Slot]) -> Result<usize, crate::Error> {
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
                Some(Err(e)) => return Err(format_err(&self.in_path)(e)),
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
            self.stats.rx_copies += 1;
            slot.off = HEADROOM as u16;
            slot.len = data.len() as u16;
            n += 1;
        }
        Ok(n)
    }

    fn transmit(&mut self, pool: &Pool, slots: &[Slot]) -> Result<usize, crate::Error> {
        let Some(w) = self.writer.as_mut() else {
            self.stats.tx += slots.len() as u64;
            return Ok(slots.len());
        };
        for s in slots {
            let frame = s.frame(pool);
            let rec = PcapPacket::new(self.clock, frame.len() as u32, frame);
            w.write_packet(&rec).map_err(format_err(&self.out_path))?;
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
pub fn write_frames(path: &Path, frames: &[Vec<u8>]) -> Result<(), crate::Error> {
    let f = File::create(path).map_err(io_err(path))?;
    let hdr = PcapHeader {
        datalink: DataLink::ETHERNET,
        snaplen: 65_535,
        ..PcapHeader::default()
    };
    let mut w = PcapWriter::with_header(BufWriter::new(f), hdr).map_err(format_err(path))?;
    for (i, fr) in frames.iter().enumerate() {
        let ts = Duration::from_micros(i as u64);
        w.write_packet(&PcapPacket::new(ts, fr.len() as u32, fr))
            .map_err(format_err(path))?;
    }
    Ok(())
}

/// Reads every frame of a pcap file.
pub fn read_frames(path: &Path) -> Result<Vec<Vec<u8>>, crate::Error> {
    let f = File::open(path).map_err(io_err(path))?;
    let mut r = PcapReader::new(BufReader::new(f)).map_err(format_err(path))?;
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        out.push(p.map_err(format_err(path))?.data.into_owned());
    }
    Ok(out)
}
