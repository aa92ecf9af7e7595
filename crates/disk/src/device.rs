//! Real block devices and files, for the benchmarks.
//!
//! O_DIRECT with buffers aligned to what the device asks for (its logical
//! block size, at least 512; 4096 for files), O_DSYNC for writes so a write
//! returns when the data is on the medium (as far as the device admits), a
//! monotonic clock, and the size from the kernel (BLKGETSIZE64 for block
//! devices).
//!
//! Safety by construction: the path is resolved once and opened once
//! (O_NOFOLLOW on the resolved path, so a symlink swapped in afterwards is
//! refused), and every decision is made on that descriptor, the one the
//! benchmarks then write through: `fstat` says what it is, and
//! [`crate::holders`] who holds it. Whatever the path pointed to while it
//! was being checked, what is written is what was checked.
//!
//! - A block device (whole disk, partition, loop device) is written only
//!   with `allow_destructive`, and never while it, one of its partitions,
//!   its disk, or a loop device it backs (loop on loop, partitions, to the
//!   end of the chain) is mounted, swapped to or held by another driver: it is
//!   opened exclusively (the kernel refuses that with EBUSY while it is
//!   mounted or claimed, in any mount namespace), and the mounts, swap
//!   areas and holders are checked to say which.
//! - A regular file is the user's scratch space and needs no flag, unless
//!   it is not only that: a file backing a loop device that is mounted or
//!   in use, a file mounted somewhere (a bind mount) or swapped to is
//!   refused whatever the flag; a file backing an idle loop device needs
//!   the flag.
//! - Anything else (a directory, a character device) is refused.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::Instant;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::ioctl::{opcode, Getter, Opcode};

use crate::holders::{self, FileUse};
use crate::{Error, Op, Target};

/// The block-device ioctl group of `<linux/fs.h>`.
const BLK_IOCTL_GROUP: u8 = 0x12;
/// `BLKGETSIZE64`, `_IOR(0x12, 114, size_t)`: the device's size in bytes.
/// The opcode encodes `size_t`, but the kernel writes a `u64` whatever the
/// word size. rustix has no wrapper for it (it has `BLKSSZGET`).
const BLKGETSIZE64: Opcode = opcode::read::<usize>(BLK_IOCTL_GROUP, 114);

/// The size of a block device in bytes.
fn block_device_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: BLKGETSIZE64 is a getter that writes exactly one u64 through
    // the pointer it is given and reads nothing; Getter supplies a u64.
    let size = unsafe { rustix::ioctl::ioctl(fd, Getter::<BLKGETSIZE64, u64>::new()) }?;
    Ok(size)
}

/// An I/O buffer whose start is aligned as O_DIRECT needs: a zeroed
/// allocation `align` bytes longer than asked for, used from its first
/// aligned byte.
struct AlignedBuf {
    mem: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize, align: usize) -> AlignedBuf {
        let len = len.max(align);
        let mem = vec![0u8; len + align];
        let addr = mem.as_ptr() as usize;
        AlignedBuf {
            start: addr.next_multiple_of(align) - addr,
            mem,
            len,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// The first `n` bytes (at most [`AlignedBuf::len`]).
    fn head(&self, n: usize) -> &[u8] {
        &self.mem[self.start..self.start + n]
    }

    /// The first `n` bytes, to read into.
    fn head_mut(&mut self, n: usize) -> &mut [u8] {
        &mut self.mem[self.start..self.start + n]
    }
}

/// An opened device or file, with an I/O buffer aligned for it.
pub struct Device {
    fd: OwnedFd,
    path: String,
    sector: u64,
    sectors: u64,
    writable: bool,
    buf: AlignedBuf,
    t0: Instant,
    block_device: bool,
}

fn io(path: &str, what: &'static str, err: impl Into<io::Error>) -> Error {
    Error::Io {
        path: path.into(),
        what,
        err: err.into(),
    }
}

/// What an open descriptor is.
enum Kind {
    /// A block device, with its number.
    Block { rdev: u64 },
    /// A regular file: its device and inode, and its length.
    File { dev: u64, ino: u64, len: u64 },
}

/// What `fd` is (from `fstat`): a block device or a regular file.
fn kind(fd: BorrowedFd<'_>, p: &str) -> Result<Kind, Error> {
    let st = rustix::fs::fstat(fd).map_err(|e| io(p, "fstat", e))?;
    match rustix::fs::FileType::from_raw_mode(st.st_mode) {
        rustix::fs::FileType::BlockDevice => Ok(Kind::Block { rdev: st.st_rdev }),
        rustix::fs::FileType::RegularFile => Ok(Kind::File {
            dev: st.st_dev,
            ino: st.st_ino,
            len: st.st_size.max(0) as u64,
        }),
        _ => Err(Error::Invalid(format!(
            "{p} is neither a block device nor a regular file"
        ))),
    }
}

/// Apply the safety rules for writing to what `fd` is.
fn may_write(kind: &Kind, p: &str, allow_destructive: bool) -> Result<(), Error> {
    match *kind {
        Kind::Block { rdev } => {
            if let Some(why) = holders::block(rdev)? {
                return Err(Error::InUse {
                    path: p.into(),
                    why: format!("it {why}"),
                });
            }
            if !allow_destructive {
                return Err(Error::NeedsDestructive(p.into()));
            }
        }
        Kind::File { dev, ino, .. } => match holders::file(dev, ino)? {
            Some(FileUse::Busy(why)) => {
                return Err(Error::InUse {
                    path: p.into(),
                    why,
                })
            }
            Some(FileUse::Backs(device)) if !allow_destructive => {
                return Err(Error::BacksLoop {
                    path: p.into(),
                    device,
                })
            }
            _ => {}
        },
    }
    Ok(())
}

/// Open `real` (the resolved path; `p` as the user gave it) with O_DIRECT,
/// and O_RDWR | O_DSYNC | O_EXCL to write: a block device is then opened
/// exclusively, which the kernel refuses (EBUSY) while it is mounted or
/// claimed (on a regular file O_EXCL without O_CREAT does nothing).
/// O_NOFOLLOW: a symlink put in the resolved path's place is refused.
fn open_direct(real: &Path, p: &str, write: bool) -> Result<OwnedFd, Error> {
    let mut flags = OFlags::DIRECT | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    if write {
        // rustix's OFlags::DSYNC is O_SYNC on Linux (data and metadata);
        // the benchmarks want O_DSYNC (the data only), so take libc's bit.
        flags |= OFlags::RDWR | OFlags::EXCL | OFlags::from_bits_retain(libc::O_DSYNC as u32);
    } else {
        flags |= OFlags::RDONLY;
    }
    rustix::fs::open(real, flags, Mode::empty()).map_err(|e| match e {
        Errno::BUSY => {
            // Nothing was opened. Which holder, for the message: looked up
            // by the path, which only words the refusal.
            let detail = std::fs::metadata(real)
                .ok()
                .filter(|m| m.file_type().is_block_device())
                .and_then(|m| {
                    use std::os::unix::fs::MetadataExt;
                    holders::block(m.rdev()).ok().flatten()
                });
            Error::InUse {
                path: p.into(),
                why: match detail {
                    Some(d) => format!("it {d} (the kernel refused exclusive access)"),
                    None => "it is in use (the kernel refused exclusive access)".into(),
                },
            }
        }
        Errno::LOOP => Error::Invalid(format!(
            "{p}: it resolved to {}, which was a symbolic link by the time it was opened: the path changed while being opened",
            real.display()
        )),
        Errno::INVAL => Error::Invalid(format!(
            "{p}: the file system does not support O_DIRECT (the benchmarks must bypass the page cache)"
        )),
        e => io(p, "open (O_DIRECT)", e),
    })
}

/// The logical sector size (at least 512) and the size in bytes of an
/// open block device.
fn block_geometry(fd: BorrowedFd<'_>, p: &str) -> Result<(u64, u64), Error> {
    let sector = rustix::fs::ioctl_blksszget(fd).map_err(|e| io(p, "block device size", e))?;
    let bytes = block_device_bytes(fd).map_err(|e| io(p, "block device size", e))?;
    Ok((u64::from(sector).max(512), bytes))
}

impl Device {
    /// Open `path` for the benchmarks. Writing needs `allow_destructive`
    /// for block devices (and files backing a loop device) and is refused
    /// for anything in use (see the module's rules), decided on the
    /// descriptor opened.
    pub fn open(path: &Path, write: bool, allow_destructive: bool) -> Result<Device, Error> {
        let p = path.display().to_string();
        // Symlinks resolved once; from here on only the descriptor counts.
        let real = std::fs::canonicalize(path).map_err(|e| io(&p, "resolve", e))?;
        if write {
            // A block device that is in use, or is to be written without
            // the flag, is refused before it is even opened for writing.
            // Looked up by the path: a refusal needs no protection from a
            // race; what is allowed is decided on the descriptor below.
            if let Ok(m) = std::fs::metadata(&real) {
                if m.file_type().is_block_device() {
                    use std::os::unix::fs::MetadataExt;
                    may_write(&Kind::Block { rdev: m.rdev() }, &p, allow_destructive)?;
                }
            }
        }
        let fd = open_direct(&real, &p, write)?;
        let kind = kind(fd.as_fd(), &p)?;
        if write {
            may_write(&kind, &p, allow_destructive)?;
        }
        let (sector, bytes, block_device) = match kind {
            Kind::Block { .. } => {
                let (s, b) = block_geometry(fd.as_fd(), &p)?;
                (s, b, true)
            }
            Kind::File { len, .. } => (4096, len, false),
        };
        if bytes < sector * 64 {
            return Err(Error::Invalid(format!(
                "{p} is too small ({bytes} bytes) to measure"
            )));
        }
        Ok(Device {
            fd,
            path: p,
            sector,
            sectors: bytes / sector,
            writable: write,
            buf: AlignedBuf::new(16 << 20, sector.max(4096) as usize),
            t0: Instant::now(),
            block_device,
        })
    }

    /// Whether this is a block device (rather than a regular file).
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }
}

impl Target for Device {
    fn sector_size(&self) -> u64 {
        self.sector
    }
    fn sectors(&self) -> u64 {
        self.sectors
    }
    fn access(&mut self, op: Op, lba: u64, count: u32) -> Result<f64, Error> {
        let len = count as u64 * self.sector;
        if len as usize > self.buf.len() {
            return Err(Error::Invalid(format!(
                "{len} bytes is more than one access may move"
            )));
        }
        if lba + count as u64 > self.sectors {
            return Err(Error::Invalid(format!(
                "sector {lba} is past the end of {}",
                self.path
            )));
        }
        if op == Op::Write && !self.writable {
            return Err(Error::Invalid(format!(
                "{} was opened read-only",
                self.path
            )));
        }
        let off = lba * self.sector;
        let len = len as usize;
        let t = Instant::now();
        let n = match op {
            Op::Read => rustix::io::pread(&self.fd, self.buf.head_mut(len), off),
            Op::Write => rustix::io::pwrite(&self.fd, self.buf.head(len), off),
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let what = if op == Op::Read { "read" } else { "write" };
        match n {
            Ok(n) if n == len => {}
            Ok(n) => {
                return Err(io(
                    &self.path,
                    what,
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("moved {n} of {len} bytes"),
                    ),
                ))
            }
            Err(e) => return Err(io(&self.path, what, e)),
        }
        Ok(ms)
    }
    fn elapsed_ms(&self) -> f64 {
        self.t0.elapsed().as_secs_f64() * 1e3
    }
    fn describe(&self) -> String {
        format!(
            "{} ({}, {}-byte sectors, {} MiB)",
            self.path,
            if self.block_device {
                "block device"
            } else {
                "file"
            },
            self.sector,
            (self.sectors * self.sector) >> 20
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn blkgetsize64_is_the_kernels_opcode() {
        // _IOR(0x12, 114, size_t) with an 8-byte size_t.
        assert_eq!(BLKGETSIZE64 as u64, 0x8008_1272);
    }

    #[test]
    fn buffers_are_aligned_for_o_direct() {
        for align in [512, 4096, 65536] {
            let mut b = AlignedBuf::new(16 << 10, align);
            assert!(b.len() >= 16 << 10);
            assert_eq!(b.head(1).as_ptr() as usize % align, 0);
            assert_eq!(b.head_mut(b.len()).len(), b.len());
        }
    }

    #[test]
    fn writes_are_data_synchronous_not_fully_synchronous() {
        let f = std::env::temp_dir().join(format!("fp-disk-dsync-{}", std::process::id()));
        std::fs::write(&f, vec![0u8; 1 << 20]).unwrap();
        let d = Device::open(&f, true, false).unwrap();
        let flags = rustix::fs::fcntl_getfl(&d.fd).unwrap().bits();
        let sync = libc::O_SYNC as u32;
        assert_eq!(flags & sync, libc::O_DSYNC as u32, "O_DSYNC without O_SYNC");
        assert_ne!(flags & libc::O_DIRECT as u32, 0);
        drop(d);
        let r = Device::open(&f, false, false).unwrap();
        assert_eq!(rustix::fs::fcntl_getfl(&r.fd).unwrap().bits() & sync, 0);
        drop(r);
        std::fs::remove_file(&f).unwrap();
    }
}
