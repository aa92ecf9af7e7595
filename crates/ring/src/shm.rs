//! A port's shared memory: created (memfd, sized, sealed) by the device,
//! mapped by the driver from the descriptor it is handed.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use memmap2::MmapRaw;

use crate::layout::{Csb, Geometry, Header, Offsets, Slot, CSB_OFF, MAGIC};
use crate::{sys, Error, Result};

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
unsafe impl Sync for Region {}

impl Region {
    /// Create a port region (device side): a memfd sized for `geo`, sealed so
    /// that the peer can neither shrink it (which would turn our accesses into
    /// SIGBUS) nor grow it, with the header written and every slot pointing
    /// at its own buffer.
    pub fn create(name: &str, geo: Geometry) -> Result<Region> {
        geo.validate()?;
        let off = geo.offsets();
        let cname = std::ffi::CString::new(format!("fastpath-port-{name}"))
            .map_err(|_| Error::Geometry("port name contains NUL".into()))?;
        // SAFETY: memfd_create reads a NUL-terminated string we own.
        let fd = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if fd < 0 {
            return Err(sys("memfd_create"));
        }
        // SAFETY: fd was just returned to us and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(off.len as u64).map_err(|e| Error::Sys {
            what: "ftruncate port region",
            source: e,
        })?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor we own.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(sys("seal port region"));
        }
        let map = MmapRaw::map_raw(&file).map_err(|e| Error::Sys {
            what: "mmap port region",
            source: e,
        })?;
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
        let size = file
            .metadata()
            .map_err(|e| Error::Sys {
                what: "fstat port region",
                source: e,
            })?
            .len() as usize;
        if size < PAGE_MIN {
            return Err(Error::BadRegion(format!("{size} bytes is too small")));
        }
        // SAFETY: fcntl on a descriptor we own.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(Error::BadRegion(
                "region is not sealed against shrinking".into(),
            ));
        }
        let map = MmapRaw::map_raw(&file).map_err(|e| Error::Sys {
            what: "mmap port region",
            source: e,
        })?;
        // SAFETY: the mapping is at least PAGE_MIN bytes, so the header is in it.
        let h = unsafe { &*(map.as_ptr() as *const Header) };
        if h.magic.load(Acquire) != MAGIC {
            return Err(Error::BadRegion("bad magic".into()));
        }
        let geo = Geometry {
            slots: h.slots.load(Relaxed),
            buf_size: h.buf_size.load(Relaxed),
        };
        geo.validate()
            .map_err(|e| Error::BadRegion(e.to_string()))?;
        let off = geo.offsets();
        let same = h.tx_off.load(Relaxed) == off.tx as u64
            && h.rx_off.load(Relaxed) == off.rx as u64
            && h.bufs_off.load(Relaxed) == off.bufs_off as u64
            && h.bufs.load(Relaxed) == off.bufs
            && h.len.load(Relaxed) == off.len as u64;
        if !same || size < off.len {
            return Err(Error::BadRegion(format!(
                "header does not match its {size}-byte region"
            )));
        }
        Ok(Region {
            map,
            file,
            geo,
            off,
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    pub fn offsets(&self) -> Offsets {
        self.off
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    fn header(&self) -> &Header {
        // SAFETY: offset 0 of a mapping of at least off.len bytes; Header is
        // all atomics, valid for any bit pattern.
        unsafe { &*(self.map.as_ptr() as *const Header) }
    }

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

    pub fn dup_fd(&self) -> Result<OwnedFd> {
        self.file
            .try_clone()
            .map(OwnedFd::from)
            .map_err(|e| Error::Sys {
                what: "dup port region",
                source: e,
            })
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
        let fd = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(1 << 20).unwrap();
        let e = Region::open(f.into()).err().unwrap();
        assert!(e.to_string().contains("sealed"), "{e}");

        let fd = unsafe {
            libc::memfd_create(c"y".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(1 << 20).unwrap();
        unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
        let e = Region::open(f.into()).err().unwrap();
        assert!(e.to_string().contains("magic"), "{e}");
    }
}
