//! Real block devices and files, for the benchmarks.
//!
//! O_DIRECT with buffers aligned to what the device asks for (its logical
//! block size, at least 512; 4096 for files), O_DSYNC for writes so a write
//! returns when the data is on the medium (as far as the device admits), a
//! monotonic clock, and the size from the kernel (BLKGETSIZE64 for block
//! devices).
//!
//! Safety: a block device is opened for writing only with
//! `allow_destructive`, and never when it is mounted or otherwise in use
//! (the kernel's O_EXCL open of a block device fails with EBUSY then; the
//! mount table is checked too, for a clearer message). Regular files are
//! always allowed: they are the user's own scratch space.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::Instant;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::ioctl::{opcode, Getter, Opcode};

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

/// Why a block device must not be written, if it must not.
pub fn in_use(path: &Path) -> Option<String> {
    let canon = std::fs::canonicalize(path).ok()?;
    let name = canon.file_name()?.to_string_lossy().to_string();
    // Mounted directly?
    if let Ok(m) = std::fs::read_to_string("/proc/self/mounts") {
        for line in m.lines() {
            let dev = line.split_whitespace().next().unwrap_or("");
            if let Ok(c) = std::fs::canonicalize(dev) {
                if c == canon {
                    let at = line.split_whitespace().nth(1).unwrap_or("?");
                    return Some(format!("mounted on {at}"));
                }
            }
        }
    }
    // A partition of it mounted, or a holder (device-mapper, md, ...)?
    let sys = Path::new("/sys/class/block").join(&name);
    if let Ok(entries) = std::fs::read_dir(sys.join("holders")) {
        if let Some(h) = entries.flatten().next() {
            return Some(format!("held by {}", h.file_name().to_string_lossy()));
        }
    }
    if let Ok(entries) = std::fs::read_dir(&sys) {
        for e in entries.flatten() {
            let part = e.file_name().to_string_lossy().to_string();
            if part.starts_with(&name) {
                if let Some(why) = in_use(&Path::new("/dev").join(&part)) {
                    return Some(format!("partition {part} is {why}"));
                }
            }
        }
    }
    None
}

/// What `open` found out about a path before opening it.
struct Kind {
    block_device: bool,
    /// The length of a regular file.
    file_len: u64,
}

/// Stat `path` and apply the safety rules for writing it.
fn check(path: &Path, p: &str, write: bool, allow_destructive: bool) -> Result<Kind, Error> {
    let meta = std::fs::metadata(path).map_err(|e| io(p, "stat", e))?;
    let block_device = meta.file_type().is_block_device();
    if !block_device && !meta.is_file() {
        return Err(Error::Invalid(format!(
            "{p} is neither a block device nor a regular file"
        )));
    }
    if write && block_device {
        if let Some(why) = in_use(path) {
            return Err(Error::InUse {
                path: p.into(),
                why,
            });
        }
        if !allow_destructive {
            return Err(Error::NeedsDestructive(p.into()));
        }
    }
    Ok(Kind {
        block_device,
        file_len: meta.len(),
    })
}

/// Open with O_DIRECT (and O_DSYNC to write); a block device opened for
/// writing is opened exclusively, which the kernel refuses (EBUSY) while
/// it is mounted or claimed.
fn open_direct(path: &Path, p: &str, write: bool, block_device: bool) -> Result<OwnedFd, Error> {
    let mut flags = OFlags::DIRECT | OFlags::CLOEXEC;
    if write {
        // rustix's OFlags::DSYNC is O_SYNC on Linux (data and metadata);
        // the benchmarks want O_DSYNC (the data only), so take libc's bit.
        flags |= OFlags::RDWR | OFlags::from_bits_retain(libc::O_DSYNC as u32);
    } else {
        flags |= OFlags::RDONLY;
    }
    if block_device && write {
        // The kernel refuses an exclusive open of a mounted or claimed device.
        flags |= OFlags::EXCL;
    }
    rustix::fs::open(path, flags, Mode::empty()).map_err(|e| match e {
        Errno::BUSY => Error::InUse {
            path: p.into(),
            why: "in use (the kernel refused exclusive access)".into(),
        },
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
    /// for block devices and is refused for devices in use.
    pub fn open(path: &Path, write: bool, allow_destructive: bool) -> Result<Device, Error> {
        let p = path.display().to_string();
        let kind = check(path, &p, write, allow_destructive)?;
        let fd = open_direct(path, &p, write, kind.block_device)?;
        let (sector, bytes) = if kind.block_device {
            block_geometry(fd.as_fd(), &p)?
        } else {
            (4096, kind.file_len)
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
            block_device: kind.block_device,
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
