//! Who holds a block device or a file: what must never be written.
//!
//! Everything is keyed by device and inode numbers, never by names: a
//! block device by its `st_rdev` (the mounts' `major:minor`, the swap
//! areas', partitions' and holders' numbers from sysfs), a file by its
//! `st_dev` and `st_ino` (the files backing loop devices, as the loop
//! driver reports them; the files mounted somewhere by a bind mount; swap
//! files). The kernel's own refusal of an exclusive open is the last word
//! on a block device that is claimed in a way none of these show (a mount
//! in another mount namespace, a driver's claim).

use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::fs::{major, minor, Mode, OFlags};
use rustix::io::Errno;
use rustix::ioctl::{Getter, Opcode};

/// Why it could not be told whether a device or file is in use.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A table of the kernel's (mounts, swap areas, sysfs) could not be
    /// read: nothing is written without it.
    #[error("cannot tell whether it is in use: reading {path}")]
    Read {
        /// The table.
        path: PathBuf,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
}

fn read(path: &Path) -> Result<String, Error> {
    fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// A path from the kernel's tables, its `\040`-style escapes undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One line of `/proc/self/mountinfo`.
struct Mount {
    /// `st_dev` of the files in it (for a block-device file system, the
    /// device's number).
    dev: (u32, u32),
    /// The directory or file of its file system mounted here.
    root: String,
    /// Where it is mounted.
    at: String,
    /// What was mounted (a device's path, or a name).
    source: String,
}

fn mounts() -> Result<Vec<Mount>, Error> {
    let text = read(Path::new("/proc/self/mountinfo"))?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let (maj, min) = f.get(2)?.split_once(':')?;
            Some(Mount {
                dev: (maj.parse().ok()?, min.parse().ok()?),
                root: unescape(f.get(3)?),
                at: unescape(f.get(4)?),
                source: unescape(right.split(' ').nth(1).unwrap_or("")),
            })
        })
        .collect())
}

/// The files and devices swapped to.
fn swaps() -> Result<Vec<String>, Error> {
    let path = Path::new("/proc/swaps");
    match fs::read_to_string(path) {
        Ok(t) => Ok(t
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(unescape))
            .collect()),
        // A kernel without swap has no table.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(Error::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn split(rdev: u64) -> (u32, u32) {
    (major(rdev), minor(rdev))
}

/// A block device's directory in sysfs, and its name.
fn sysfs(rdev: u64) -> Result<(PathBuf, String), Error> {
    let (maj, min) = split(rdev);
    let link = PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
    let dir = fs::canonicalize(&link).map_err(|source| Error::Read { path: link, source })?;
    let name = dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    Ok((dir, name))
}

/// The number in a sysfs `dev` file (`major:minor`).
fn dev_file(dir: &Path) -> Option<u64> {
    let t = fs::read_to_string(dir.join("dev")).ok()?;
    let (maj, min) = t.trim().split_once(':')?;
    Some(rustix::fs::makedev(maj.parse().ok()?, min.parse().ok()?))
}

/// Where a block device is mounted or swapped to, or what holds it (not
/// looking at its partitions or its disk).
fn block_direct(rdev: u64, mounts: &[Mount], swaps: &[String], dir: &Path) -> Option<String> {
    let dev = split(rdev);
    let same = |p: &str| {
        fs::metadata(p).is_ok_and(|m| {
            use std::os::unix::fs::{FileTypeExt, MetadataExt};
            m.file_type().is_block_device() && m.rdev() == rdev
        })
    };
    if let Some(m) = mounts
        .iter()
        .find(|m| m.dev == dev || (m.source.starts_with('/') && same(&m.source)))
    {
        return Some(format!("mounted at {}", m.at));
    }
    if swaps.iter().any(|s| same(s)) {
        return Some("in use as swap".into());
    }
    let holder = fs::read_dir(dir.join("holders"))
        .ok()?
        .flatten()
        .next()
        .map(|h| h.file_name().to_string_lossy().into_owned());
    holder.map(|h| format!("held by {h} (device-mapper, md or another driver)"))
}

/// Why the block device `rdev` must not be written, if it must not: it is
/// mounted, swapped to or held, or one of its partitions is, or (for a
/// partition) its disk is. A clause to follow "it is".
pub fn block(rdev: u64) -> Result<Option<String>, Error> {
    block_with(rdev, &mounts()?, &swaps()?)
}

fn block_with(rdev: u64, mounts: &[Mount], swaps: &[String]) -> Result<Option<String>, Error> {
    let (dir, _) = sysfs(rdev)?;
    if let Some(why) = block_direct(rdev, mounts, swaps, &dir) {
        return Ok(Some(why));
    }
    // Its partitions: directories of its own with a `partition` file.
    let entries = fs::read_dir(&dir).map_err(|source| Error::Read {
        path: dir.clone(),
        source,
    })?;
    for e in entries.flatten() {
        let p = e.path();
        let Some(part) = dev_file(&p).filter(|_| p.join("partition").exists()) else {
            continue;
        };
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(why) = block_direct(part, mounts, swaps, &p) {
            return Ok(Some(format!(
                "the disk of partition {name}, which is {why}"
            )));
        }
        if claimed(&name, part) {
            return Ok(Some(format!(
                "the disk of partition {name}, which is in use (the kernel refused an exclusive open)"
            )));
        }
    }
    // A partition: its disk.
    if dir.join("partition").exists() {
        if let Some(disk_dir) = dir.parent() {
            if let Some(disk) = dev_file(disk_dir) {
                if let Some(why) = block_direct(disk, mounts, swaps, disk_dir) {
                    let name = disk_dir
                        .file_name()
                        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
                    return Ok(Some(format!("a partition of {name}, which is {why}")));
                }
            }
        }
    }
    Ok(None)
}

/// `LOOP_GET_STATUS64` (`<linux/loop.h>`): the loop device's status. A
/// plain number, not an `_IOR` encoding; rustix has no wrapper for it.
const LOOP_GET_STATUS64: Opcode = 0x4C05;

/// `struct loop_info64` of `<linux/loop.h>`; only the backing file's
/// device and inode are read.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// The device and inode of the file backing the loop device `name`
/// (`/dev/<name>`, whose number is `rdev`): from the loop driver, or, when
/// the device node cannot be opened, from the path sysfs names (which goes
/// stale when the file is renamed).
fn loop_backing(name: &str, rdev: u64, dir: &Path) -> Option<(u64, u64)> {
    let node = PathBuf::from("/dev").join(name);
    let fd = rustix::fs::open(
        &node,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()
    .filter(|fd| rustix::fs::fstat(fd).is_ok_and(|st| st.st_rdev == rdev));
    if let Some(fd) = fd {
        // SAFETY: LOOP_GET_STATUS64 is a getter: the driver writes one
        // struct loop_info64 through the pointer and reads nothing;
        // LoopInfo64 has its layout (repr(C), the same fields).
        let info = unsafe {
            rustix::ioctl::ioctl(fd.as_fd(), Getter::<LOOP_GET_STATUS64, LoopInfo64>::new())
        };
        if let Ok(i) = info {
            return Some((i.lo_device, i.lo_inode));
        }
    }
    let file = fs::read_to_string(dir.join("loop/backing_file")).ok()?;
    let m = fs::metadata(file.trim_end_matches('\n')).ok()?;
    use std::os::unix::fs::MetadataExt;
    Some((m.dev(), m.ino()))
}

/// Whether the kernel refuses an exclusive open of `/dev/<name>` (number
/// `rdev`): it is mounted (in any mount namespace) or claimed. The open is
/// read-only and closed at once.
fn claimed(name: &str, rdev: u64) -> bool {
    let node = PathBuf::from("/dev").join(name);
    if !fs::metadata(&node).is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.rdev() == rdev
    }) {
        return false;
    }
    matches!(
        rustix::fs::open(
            &node,
            OFlags::RDONLY | OFlags::EXCL | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ),
        Err(Errno::BUSY)
    )
}

/// What holds a regular file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileUse {
    /// Writing it would write to something in use (a mounted loop device,
    /// a bind mount, swap): the reason, a whole clause.
    Busy(String),
    /// It backs this loop device, which nothing uses now: writing it
    /// changes what the device reads.
    Backs(String),
}

/// Who holds the regular file with device `dev` and inode `ino`: a loop
/// device it backs (mounted or in use, or idle), a mount of it (a bind
/// mount onto a path, or a path mounted onto it), swap.
pub fn file(dev: u64, ino: u64) -> Result<Option<FileUse>, Error> {
    let mounts = mounts()?;
    let swaps = swaps()?;
    let here = split(dev);
    for m in mounts.iter().filter(|m| m.dev == here && m.root != "/") {
        let same = fs::metadata(&m.at).is_ok_and(|x| {
            use std::os::unix::fs::MetadataExt;
            x.dev() == dev && x.ino() == ino
        });
        if same {
            return Ok(Some(FileUse::Busy(format!(
                "it is mounted at {} (a bind mount of this file)",
                m.at
            ))));
        }
    }
    let is_it = |p: &str| {
        fs::metadata(p).is_ok_and(|x| {
            use std::os::unix::fs::MetadataExt;
            x.dev() == dev && x.ino() == ino
        })
    };
    if swaps.iter().any(|s| is_it(s)) {
        return Ok(Some(FileUse::Busy("it is in use as swap".into())));
    }
    let sys = Path::new("/sys/block");
    let entries = fs::read_dir(sys).map_err(|source| Error::Read {
        path: sys.to_path_buf(),
        source,
    })?;
    let mut idle = None;
    for e in entries.flatten() {
        let dir = e.path();
        if !dir.join("loop").is_dir() {
            continue; // not a loop device, or one with no file bound
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rdev) = dev_file(&dir) else { continue };
        if loop_backing(&name, rdev, &dir) != Some((dev, ino)) {
            continue;
        }
        let node = format!("/dev/{name}");
        if let Some(why) = block_with(rdev, &mounts, &swaps)? {
            return Ok(Some(FileUse::Busy(format!(
                "{node} ({why}) is backed by this file"
            ))));
        }
        if claimed(&name, rdev) {
            return Ok(Some(FileUse::Busy(format!(
                "{node} (in use: the kernel refused an exclusive open; mounted elsewhere or claimed) is backed by this file"
            ))));
        }
        idle.get_or_insert(node);
    }
    Ok(idle.map(FileUse::Backs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_table_escapes_are_undone() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape(r"/tmp/x\134y"), r"/tmp/x\y");
        assert_eq!(unescape(r"plain\04"), r"plain\04");
    }

    #[test]
    fn loop_info64_has_the_kernels_size() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
    }

    #[test]
    fn the_root_file_system_is_mounted() {
        let m = mounts().unwrap();
        assert!(m.iter().any(|m| m.at == "/"));
    }
}
