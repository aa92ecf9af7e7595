//! A port's shared memory: created (memfd, sized, sealed) by the device,
//! mapped by the driver from the descriptor it is handed.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use memmap2::MmapRaw;
use rustix::fs::{fcntl_add_seals, fcntl_get_seals, memfd_create, MemfdFlags, SealFlags};

use crate::layout::{Csb, Geometry, GeometryError, Header, Offsets, Slot, CSB_OFF, MAGIC};
use crate::{sys, Error, Result};

/// Why a descriptor handed over as a port region was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// Smaller than the header.
    #[error("{size} bytes is too small")]
    TooSmall {
        /// The region's size.
        size: usize,
    },
    /// Its seals could not be read: not a memfd.
    #[error("region is not sealed against shrinking (cannot read its seals: {source})")]
    Seals {
        /// The system's answer to F_GET_SEALS.
        #[source]
        source: std::io::Error,
    },
    /// Not sealed against shrinking: the peer could turn our accesses into
    /// SIGBUS.
    #[error("region is not sealed against shrinking")]
    NotSealed,
    /// The header's magic is not [`MAGIC`] (or not yet written).
    #[error("bad magic")]
    BadMagic,
    /// The header describes an impossible geometry.
    #[error("{0}")]
    Geometry(#[source] GeometryError),
    /// The header's offsets are not those of its geometry, or the region is
    /// shorter than they say.
    #[error("header does not match its {size}-byte region")]
    HeaderMismatch {
        /// The region's size.
        size: usize,
    },
}

/// One mapped port region.
pub struct Region {
    map: MmapRaw,
    file: File,
    geo: Geometry,
    off: Offsets,
}

// SAFETY: the region is plain shared memory; every location another thread or
// process writes is accessed through atomics (slots, CSB) or copied as raw
// bytes (buffers), so sharing the mapping between threads is sound.
unsafe impl Send for Region {}
// SAFETY: as for Send: no method hands out a non-atomic reference into the
// mapping, so concurrent use from several threads is sound.
unsafe impl Sync for Region {}

impl Region {
    /// Create a port region (device side): a memfd sized for `geo`, sealed so
    /// that the peer can neither shrink it (which would turn our accesses into
    /// SIGBUS) nor grow it, with the header written and every slot pointing
    /// at its own buffer.
    pub fn create(name: &str, geo: Geometry) -> Result<Region> {
        geo.validate()?;
        let off = geo.offsets();
        let cname = std::ffi::CString::new(format!("fastpath-port-{name}")).map_err(|_| {
            Error::PortName {
                name: name.to_string(),
            }
        })?;
        let file = File::from(
            memfd_create(
                cname.as_c_str(),
                MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
            )
            .map_err(sys("memfd_create"))?,
        );
        file.set_len(off.len as u64)
            .map_err(sys("ftruncate port region"))?;
        // Sealed before it is mapped or handed out: from here on its size is
        // fixed for every holder of the descriptor.
        fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(sys("seal port region"))?;
        let map = MmapRaw::map_raw(&file).map_err(sys("mmap port region"))?;
        let r = Region {
            map,
            file,
            geo,
            off,
        };
        let h = r.header();
        h.slots.store(geo.slots, Relaxed);
        h.bufs.store(off.bufs, Relaxed);
        h.buf_size.store(geo.buf_size, Relaxed);
        h.tx_off.store(off.tx as u64, Relaxed);
        h.rx_off.store(off.rx as u64, Relaxed);
        h.bufs_off.store(off.bufs_off as u64, Relaxed);
        h.len.store(off.len as u64, Relaxed);
        for i in 0..geo.slots {
            r.tx_slot(i).buf.store(i, Relaxed);
            r.rx_slot(i).buf.store(geo.slots + i, Relaxed);
        }
        h.magic.store(MAGIC, Release);
        Ok(r)
    }

    /// Map a region handed over by the device (driver side), checking that
    /// the header describes exactly this region and that it is sealed.
    pub fn open(fd: OwnedFd) -> Result<Region> {
        let file = File::from(fd);
        let size = file.metadata().map_err(sys("fstat port region"))?.len() as usize;
        if size < PAGE_MIN {
            return Err(RegionError::TooSmall { size }.into());
        }
        // The seal is checked before the mapping: a region the peer may shrink
        // would turn our accesses into SIGBUS.
        let seals = fcntl_get_seals(&file).map_err(|e| RegionError::Seals { source: e.into() })?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(RegionError::NotSealed.into());
        }
        let map = MmapRaw::map_raw(&file).map_err(sys("mmap port region"))?;
        // SAFETY: the mapping is at least PAGE_MIN bytes, so the header is in it.
        let h = unsafe { &*(map.as_ptr() as *const Header) };
        if h.magic.load(Acquire) != MAGIC {
            return Err(RegionError::BadMagic.into());
        }
        let geo = Geometry {
            slots: h.slots.load(Relaxed),
            buf_size: h.buf_size.load(Relaxed),
        };
        geo.validate().map_err(RegionError::Geometry)?;
        let off = geo.offsets();
        let same = h.tx_off.load(Relaxed) == off.tx as u64
            && h.rx_off.load(Relaxed) == off.rx as u64
            && h.bufs_off.load(Relaxed) == off.bufs_off as u64
            && h.bufs.load(Relaxed) == off.bufs
            && h.len.load(Relaxed) == off.len as u64;
        if !same || size < off.len {
            return Err(RegionError::HeaderMismatch { size }.into());
        }
        Ok(Region {
            map,
            file,
            geo,
            off,
        })
    }

    /// The region's ring and buffer dimensions.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Where each part of the region lies.
    pub fn offsets(&self) -> Offsets {
        self.off
    }

    /// The memfd behind the mapping.
    pub fn file(&self) -> &File {
        &self.file
    }

    fn header(&self) -> &Header {
        // SAFETY: offset 0 of a mapping of at least off.len bytes; Header is
        // all atomics, valid for any bit pattern.
        unsafe { &*(self.map.as_ptr() as *const Header) }
    }

    /// The Communication Status Block.
    pub fn csb(&self) -> &Csb {
        // SAFETY: CSB_OFF + size_of::<Csb>() <= off.tx <= off.len; all atomics.
        unsafe { &*(self.map.as_ptr().add(CSB_OFF) as *const Csb) }
    }

    /// TX slot `i & (slots - 1)`.
    #[inline]
    pub fn tx_slot(&self, i: u32) -> &Slot {
        let i = (i & (self.geo.slots - 1)) as usize;
        // SAFETY: i < slots and the TX ring spans slots * 8 bytes from off.tx.
        unsafe { &*(self.map.as_ptr().add(self.off.tx + i * 8) as *const Slot) }
    }

    /// RX slot `i & (slots - 1)`.
    #[inline]
    pub fn rx_slot(&self, i: u32) -> &Slot {
        let i = (i & (self.geo.slots - 1)) as usize;
        // SAFETY: i < slots and the RX ring spans slots * 8 bytes from off.rx.
        unsafe { &*(self.map.as_ptr().add(self.off.rx + i * 8) as *const Slot) }
    }

    /// Start of buffer `idx`, or None if the index is out of range. The bytes
    /// may be written by the peer at any time: use them only through raw
    /// copies, never as a Rust reference.
    #[inline]
    pub fn buf_ptr(&self, idx: u32) -> Option<*mut u8> {
        if idx >= self.off.bufs {
            return None;
        }
        let at = self.off.bufs_off + idx as usize * self.geo.buf_size as usize;
        // SAFETY: idx < bufs, so [at, at + buf_size) lies inside the mapping.
        Some(unsafe { self.map.as_mut_ptr().add(at) })
    }

    /// A second descriptor for the region, to hand to the driver.
    pub fn dup_fd(&self) -> Result<OwnedFd> {
        self.file
            .try_clone()
            .map(OwnedFd::from)
            .map_err(sys("dup port region"))
    }
}

const PAGE_MIN: usize = crate::layout::PAGE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_then_open_agree() {
        let geo = Geometry {
            slots: 64,
            buf_size: 2048,
        };
        let dev = Region::create("t", geo).unwrap();
        let drv = Region::open(dev.dup_fd().unwrap()).unwrap();
        assert_eq!(drv.geometry(), geo);
        assert_eq!(drv.tx_slot(3).buf.load(Relaxed), 3);
        assert_eq!(drv.rx_slot(3).buf.load(Relaxed), 67);
        assert!(drv.buf_ptr(127).is_some());
        assert!(drv.buf_ptr(128).is_none());
        // The peer cannot shrink the region under us.
        assert!(drv.file().set_len(4096).is_err());
        // Writes through one mapping show through the other.
        dev.csb().host.tx_tail.store(7, Release);
        assert_eq!(drv.csb().host.tx_tail.load(Acquire), 7);
    }

    #[test]
    fn open_rejects_unsealed_and_garbage() {
        let fd = memfd_create(c"x", MemfdFlags::CLOEXEC).unwrap();
        let f = File::from(fd);
        f.set_len(1 << 20).unwrap();
        let e = Region::open(f.into()).err().unwrap();
        assert!(e.to_string().contains("sealed"), "{e}");

        let fd = memfd_create(c"y", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        let f = File::from(fd);
        f.set_len(1 << 20).unwrap();
        fcntl_add_seals(&f, SealFlags::SHRINK).unwrap();
        let e = Region::open(f.into()).err().unwrap();
        assert!(e.to_string().contains("magic"), "{e}");
    }

    #[test]
    fn open_rejects_what_is_not_a_memfd() {
        let path = std::env::temp_dir().join(format!("ring-shm-test-{}", std::process::id()));
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.set_len(1 << 20).unwrap();
        let e = Region::open(f.into()).err().unwrap();
        assert!(e.to_string().contains("sealed"), "{e}");
        let Error::BadRegion(RegionError::Seals { source }) = e else {
            panic!("{e}");
        };
        assert_eq!(
            source.raw_os_error(),
            Some(rustix::io::Errno::INVAL.raw_os_error())
        );
    }
}
