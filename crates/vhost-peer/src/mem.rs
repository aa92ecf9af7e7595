//! Guest memory: a memfd shared with the backend over `SET_MEM_TABLE`,
//! mapped here too.

use std::fs::File;
use std::os::fd::FromRawFd;

/// A memfd shared as guest memory, mapped here too.
pub struct SharedMem {
    /// The memfd.
    pub file: File,
    map: memmap2::MmapRaw,
    /// Its size.
    pub size: u64,
    /// The guest-physical address of its first byte.
    pub gpa: u64,
    /// The "frontend virtual address" of its first byte (what ring
    /// addresses are given as).
    pub uaddr: u64,
}

impl SharedMem {
    /// A memfd of `size` bytes; `seal`: sealed against shrinking and
    /// growing, as QEMU's memfd backend does by default.
    pub fn new(size: u64, seal: bool) -> std::io::Result<SharedMem> {
        // SAFETY: memfd_create with a NUL-terminated literal name.
        let fd = unsafe {
            libc::memfd_create(
                c"fastpath-frontend".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size)?;
        if seal {
            // SAFETY: fcntl on our own descriptor with an integer argument.
            if unsafe {
                libc::fcntl(
                    fd,
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
                )
            } != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        let len = usize::try_from(size).map_err(std::io::Error::other)?;
        let map = memmap2::MmapOptions::new().len(len).map_raw(&file)?;
        Ok(SharedMem {
            file,
            map,
            size,
            gpa: 0,
            uaddr: 0x7f00_0000_0000,
        })
    }

    /// Map `size` bytes of a file someone else made (the backend's
    /// in-flight region).
    pub fn from_file(file: File, size: u64) -> std::io::Result<SharedMem> {
        let len = usize::try_from(size).map_err(std::io::Error::other)?;
        let map = memmap2::MmapOptions::new().len(len).map_raw(&file)?;
        Ok(SharedMem {
            file,
            map,
            size,
            gpa: 0,
            uaddr: 0,
        })
    }

    /// Write `b` at offset `off` (ignored where it does not fit).
    pub fn write(&self, off: u64, b: &[u8]) {
        if off
            .checked_add(b.len() as u64)
            .is_some_and(|e| e <= self.size)
        {
            // SAFETY: the range lies inside our own mapping (checked); the
            // backend may read it at the same time, which is the point of
            // shared guest memory and no Rust reference covers it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    b.as_ptr(),
                    self.map.as_mut_ptr().add(off as usize),
                    b.len(),
                )
            };
        }
    }

    /// Read `n` bytes at `off` (zeros where outside).
    pub fn read(&self, off: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        if off.checked_add(n as u64).is_some_and(|e| e <= self.size) {
            // SAFETY: the range lies inside our own mapping (checked).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.map.as_ptr().add(off as usize),
                    v.as_mut_ptr(),
                    n,
                )
            };
        }
        v
    }

    /// A little-endian u16 at `off`.
    pub fn r16(&self, off: u64) -> u16 {
        let b = self.read(off, 2);
        u16::from_le_bytes([b[0], b[1]])
    }

    /// A little-endian u32 at `off`.
    pub fn r32(&self, off: u64) -> u32 {
        let b = self.read(off, 4);
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Write a little-endian u16 at `off`.
    pub fn w16(&self, off: u64, v: u16) {
        self.write(off, &v.to_le_bytes());
    }
}
