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

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::Instant;

use crate::{Error, Op, Target};

const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// An aligned I/O buffer.
struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl AlignedBuf {
    fn new(len: usize, align: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(len.max(align), align).expect("valid layout");
        // SAFETY: non-zero size (at least `align`).
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory for an I/O buffer");
        AlignedBuf { ptr, layout }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

/// An opened device or file.
pub struct Device {
    fd: libc::c_int,
    path: String,
    sector: u64,
    sectors: u64,
    writable: bool,
    buf: AlignedBuf,
    t0: Instant,
    block_device: bool,
}

// SAFETY: the buffer is owned and used only through &mut self.
unsafe impl Send for Device {}

fn io(path: &str, what: &'static str) -> Error {
    Error::Io {
        path: path.into(),
        what,
        err: std::io::Error::last_os_error(),
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

impl Device {
    /// Open `path` for the benchmarks. Writing needs `allow_destructive`
    /// for block devices and is refused for devices in use.
    pub fn open(path: &Path, write: bool, allow_destructive: bool) -> Result<Device, Error> {
        let p = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|e| Error::Io {
            path: p.clone(),
            what: "stat",
            err: e,
        })?;
        let block_device = meta.file_type().is_block_device();
        if !block_device && !meta.is_file() {
            return Err(Error::Invalid(format!(
                "{p} is neither a block device nor a regular file"
            )));
        }
        if write && block_device {
            if let Some(why) = in_use(path) {
                return Err(Error::InUse { path: p, why });
            }
            if !allow_destructive {
                return Err(Error::NeedsDestructive(p));
            }
        }
        let mut flags = libc::O_DIRECT | libc::O_CLOEXEC;
        flags |= if write {
            libc::O_RDWR | libc::O_DSYNC
        } else {
            libc::O_RDONLY
        };
        if block_device && write {
            // The kernel refuses an exclusive open of a mounted or claimed device.
            flags |= libc::O_EXCL;
        }
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Error::Invalid("path has a NUL".into()))?;
        // SAFETY: open(2) with a NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), flags) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EBUSY) {
                return Err(Error::InUse {
                    path: p,
                    why: "in use (the kernel refused exclusive access)".into(),
                });
            }
            if e.raw_os_error() == Some(libc::EINVAL) {
                return Err(Error::Invalid(format!(
                    "{p}: the file system does not support O_DIRECT (the benchmarks must bypass the page cache)"
                )));
            }
            return Err(Error::Io {
                path: p,
                what: "open (O_DIRECT)",
                err: e,
            });
        }
        let (sector, bytes) = if block_device {
            let mut ss: libc::c_int = 0;
            let mut size: u64 = 0;
            // SAFETY: the two ioctls write an int and a u64 we own.
            unsafe {
                if libc::ioctl(fd, BLKSSZGET, &mut ss) < 0
                    || libc::ioctl(fd, BLKGETSIZE64, &mut size) < 0
                {
                    let e = io(&p, "block device size");
                    libc::close(fd);
                    return Err(e);
                }
            }
            ((ss as u64).max(512), size)
        } else {
            (4096, meta.len())
        };
        if bytes < sector * 64 {
            // SAFETY: closing our descriptor.
            unsafe { libc::close(fd) };
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

    pub fn is_block_device(&self) -> bool {
        self.block_device
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: closing our descriptor once.
        unsafe { libc::close(self.fd) };
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
        if len as usize > self.buf.layout.size() {
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
        let off = (lba * self.sector) as libc::off_t;
        let t = Instant::now();
        // SAFETY: the buffer holds at least len bytes and is aligned for O_DIRECT.
        let n = unsafe {
            match op {
                Op::Read => libc::pread(self.fd, self.buf.ptr as *mut _, len as usize, off),
                Op::Write => libc::pwrite(self.fd, self.buf.ptr as *const _, len as usize, off),
            }
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if n != len as isize {
            return Err(io(
                &self.path,
                if op == Op::Read { "read" } else { "write" },
            ));
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
