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
//!
//! Writing a block device reaches further than the device: its partitions,
//! its disk (for a partition), and every loop device it backs, whether
//! the loop device's backing file is the device node itself or a file on
//! a file system of the device (one still alive after a lazy unmount). A
//! loop device is a block device like any other, so the same holds for it
//! in turn: loop on loop on loop, each with partitions. The walk follows
//! all of these, [`MAX_DEPTH`] loop devices deep at most, each device once
//! (a cycle ends there), and refuses at the first device in use on the
//! way, naming the chain that leads to it. The loop driver does not claim
//! the device under a loop device, so nothing else would refuse it.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::fs::{major, minor, Mode, OFlags};
use rustix::io::Errno;
use rustix::ioctl::{Getter, Opcode};

/// How many loop devices deep a chain is followed. A longer chain is
/// refused rather than followed further: no setup needs one, and the walk
/// must end.
pub const MAX_DEPTH: usize = 16;

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

/// The lines of a `mountinfo` table.
fn parse_mounts(text: &str) -> Vec<Mount> {
    text.lines()
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
        .collect()
}

/// The files and devices of a `/proc/swaps` table.
fn parse_swaps(text: &str) -> Vec<String> {
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(unescape))
        .collect()
}

fn mounts() -> Result<Vec<Mount>, Error> {
    Ok(parse_mounts(&read(Path::new("/proc/self/mountinfo"))?))
}

/// The files and devices swapped to.
fn swaps() -> Result<Vec<String>, Error> {
    let path = Path::new("/proc/swaps");
    match fs::read_to_string(path) {
        Ok(t) => Ok(parse_swaps(&t)),
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

/// A file's last path component, as text.
fn base(p: &Path) -> String {
    p.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// The number in a sysfs `dev` file (`major:minor`).
fn dev_file(dir: &Path) -> Option<u64> {
    let t = fs::read_to_string(dir.join("dev")).ok()?;
    let (maj, min) = t.trim().split_once(':')?;
    Some(rustix::fs::makedev(maj.parse().ok()?, min.parse().ok()?))
}

/// What `stat` says of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Node {
    /// The device of the file system it is on.
    dev: u64,
    /// Its inode there.
    ino: u64,
    /// Its number, if it is a block device node.
    rdev: Option<u64>,
}

/// The file backing a loop device, as the loop driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Backing {
    /// The device of the file system the file is on.
    dev: u64,
    /// Its inode there.
    ino: u64,
    /// Its number when it is a block device node (the loop device is
    /// backed by that block device), 0 for a regular file.
    rdev: u64,
}

/// What is asked of the system beyond the tables read from files: the
/// live system, or (in the tests) a made-up one.
trait Probe {
    /// What `path` is.
    fn stat(&self, path: &Path) -> Option<Node>;
    /// The backing file of the loop device `name` (number `rdev`), from
    /// the driver; `None` sends the caller to sysfs's `backing_file`.
    fn loop_status(&self, name: &str, rdev: u64) -> Option<Backing>;
    /// Whether the kernel refuses an exclusive open of the block device
    /// `name` (number `rdev`).
    fn claimed(&self, name: &str, rdev: u64) -> bool;
}

/// The running system.
struct Live;

impl Probe for Live {
    fn stat(&self, path: &Path) -> Option<Node> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let m = fs::metadata(path).ok()?;
        Some(Node {
            dev: m.dev(),
            ino: m.ino(),
            rdev: m.file_type().is_block_device().then(|| m.rdev()),
        })
    }

    fn loop_status(&self, name: &str, rdev: u64) -> Option<Backing> {
        let node = PathBuf::from("/dev").join(name);
        let fd = rustix::fs::open(
            &node,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()
        .filter(|fd| rustix::fs::fstat(fd).is_ok_and(|st| st.st_rdev == rdev))?;
        // SAFETY: LOOP_GET_STATUS64 is a getter: the driver writes one
        // struct loop_info64 through the pointer and reads nothing;
        // LoopInfo64 has its layout (repr(C), the same fields).
        let info = unsafe {
            rustix::ioctl::ioctl(fd.as_fd(), Getter::<LOOP_GET_STATUS64, LoopInfo64>::new())
        }
        .ok()?;
        Some(Backing {
            dev: info.lo_device,
            ino: info.lo_inode,
            rdev: info.lo_rdevice,
        })
    }

    /// The open is read-only and closed at once.
    fn claimed(&self, name: &str, rdev: u64) -> bool {
        let node = PathBuf::from("/dev").join(name);
        if self.stat(&node).and_then(|n| n.rdev) != Some(rdev) {
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
}

/// `LOOP_GET_STATUS64` (`<linux/loop.h>`): the loop device's status. A
/// plain number, not an `_IOR` encoding; rustix has no wrapper for it.
const LOOP_GET_STATUS64: Opcode = 0x4C05;

/// `struct loop_info64` of `<linux/loop.h>`; only the backing file's
/// device, inode and number are read.
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

/// A loop device with a file bound.
struct Loop {
    /// Its name (`loop4`).
    name: String,
    /// Its number.
    rdev: u64,
    /// Its backing file.
    backing: Backing,
}

/// The kernel's tables, read once for one decision.
struct Host<'a> {
    /// Where sysfs is (`/sys`).
    sys: PathBuf,
    mounts: Vec<Mount>,
    swaps: Vec<String>,
    /// Every loop device with a file bound.
    loops: Vec<Loop>,
    probe: &'a dyn Probe,
}

/// The state that refuses a device, when one does: a clause to follow
/// "which is".
type Why = String;

impl<'a> Host<'a> {
    fn live() -> Result<Host<'static>, Error> {
        Host::new(Path::new("/sys"), mounts()?, swaps()?, &Live)
    }

    fn new(
        sys: &Path,
        mounts: Vec<Mount>,
        swaps: Vec<String>,
        probe: &'a dyn Probe,
    ) -> Result<Host<'a>, Error> {
        let mut host = Host {
            sys: sys.to_path_buf(),
            mounts,
            swaps,
            loops: Vec::new(),
            probe,
        };
        host.loops = host.read_loops()?;
        Ok(host)
    }

    /// Every loop device with a file bound, and its backing file: from the
    /// loop driver, or, when the device node cannot be asked, from the
    /// path sysfs names (which goes stale when the file is renamed).
    fn read_loops(&self) -> Result<Vec<Loop>, Error> {
        let block = self.sys.join("block");
        let entries = fs::read_dir(&block).map_err(|source| Error::Read {
            path: block.clone(),
            source,
        })?;
        let mut loops = Vec::new();
        for e in entries.flatten() {
            let dir = e.path();
            if !dir.join("loop").is_dir() {
                continue; // not a loop device, or one with no file bound
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rdev) = dev_file(&dir) else { continue };
            let backing = self.probe.loop_status(&name, rdev).or_else(|| {
                let file = fs::read_to_string(dir.join("loop/backing_file")).ok()?;
                let n = self.probe.stat(Path::new(file.trim_end_matches('\n')))?;
                Some(Backing {
                    dev: n.dev,
                    ino: n.ino,
                    rdev: n.rdev.unwrap_or(0),
                })
            });
            if let Some(backing) = backing {
                loops.push(Loop {
                    name,
                    rdev,
                    backing,
                });
            }
        }
        Ok(loops)
    }

    /// A block device's directory in sysfs, and its name.
    fn sysfs(&self, rdev: u64) -> Result<(PathBuf, String), Error> {
        let (maj, min) = split(rdev);
        let link = self.sys.join(format!("dev/block/{maj}:{min}"));
        let dir = fs::canonicalize(&link).map_err(|source| Error::Read { path: link, source })?;
        let name = base(&dir);
        Ok((dir, name))
    }

    /// Its partitions: directories of its own with a `partition` file.
    fn partitions(&self, dir: &Path) -> Result<Vec<(String, u64, PathBuf)>, Error> {
        let entries = fs::read_dir(dir).map_err(|source| Error::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut parts: Vec<_> = entries
            .flatten()
            .filter_map(|e| {
                let p = e.path();
                let rdev = dev_file(&p).filter(|_| p.join("partition").exists())?;
                Some((base(&p), rdev, p))
            })
            .collect();
        parts.sort_by_key(|p| p.1);
        Ok(parts)
    }

    /// Where a block device is mounted or swapped to, or what holds it
    /// (not looking at its partitions, its disk or what it backs).
    fn direct(&self, rdev: u64, dir: &Path) -> Option<Why> {
        let dev = split(rdev);
        let same = |p: &str| {
            self.probe
                .stat(Path::new(p))
                .is_some_and(|n| n.rdev == Some(rdev))
        };
        if let Some(m) = self
            .mounts
            .iter()
            .find(|m| m.dev == dev || (m.source.starts_with('/') && same(&m.source)))
        {
            return Some(format!("mounted at {}", m.at));
        }
        if self.swaps.iter().any(|s| same(s)) {
            return Some("in use as swap".into());
        }
        let mut holders: Vec<String> = fs::read_dir(dir.join("holders"))
            .ok()?
            .flatten()
            .map(|h| h.file_name().to_string_lossy().into_owned())
            .collect();
        holders.sort();
        holders
            .first()
            .map(|h| format!("held by {h} (device-mapper, md or another driver)"))
    }

    /// Why writing the block device `rdev` would reach something in use: a
    /// predicate to follow "it" ("is mounted at /mnt", "backs /dev/loop4,
    /// which is mounted at /mnt").
    ///
    /// `start` is the device to be written: the kernel's exclusive open of
    /// it answers for it and its partitions (a claimed partition makes the
    /// disk's exclusive open fail, and ours makes theirs fail), so they are
    /// not opened here; for a partition, its disk is looked at too. The
    /// devices further down the chain are not ours, and are asked.
    fn walk(
        &self,
        rdev: u64,
        start: bool,
        depth: usize,
        seen: &mut HashSet<u64>,
    ) -> Result<Option<String>, Error> {
        if !seen.insert(rdev) {
            return Ok(None); // on the chain already: a cycle ends here
        }
        let (dir, name) = self.sysfs(rdev)?;
        if let Some(why) = self.direct(rdev, &dir) {
            return Ok(Some(format!("is {why}")));
        }
        for (part, prdev, pdir) in self.partitions(&dir)? {
            if let Some(why) = self.direct(prdev, &pdir) {
                return Ok(Some(format!(
                    "is the disk of partition {part}, which is {why}"
                )));
            }
            if let Some(p) = self.backed_by(prdev, depth, seen)? {
                return Ok(Some(format!("is the disk of partition {part}, which {p}")));
            }
        }
        if start && dir.join("partition").exists() {
            if let Some(disk_dir) = dir.parent() {
                if let Some(disk) = dev_file(disk_dir) {
                    let dname = base(disk_dir);
                    if let Some(why) = self.direct(disk, disk_dir) {
                        return Ok(Some(format!("is a partition of {dname}, which is {why}")));
                    }
                    if let Some(p) = self.backed_by(disk, depth, seen)? {
                        return Ok(Some(format!("is a partition of {dname}, which {p}")));
                    }
                }
            }
        }
        if let Some(p) = self.backed_by(rdev, depth, seen)? {
            return Ok(Some(p));
        }
        // Asked last, as it names no holder. A claimed partition makes the
        // disk's exclusive open fail too, so this covers them.
        if !start && self.probe.claimed(&name, rdev) {
            return Ok(Some(
                "is in use: the kernel refused an exclusive open; mounted elsewhere or claimed"
                    .into(),
            ));
        }
        Ok(None)
    }

    /// Why writing the block device `rdev` would reach something in use
    /// through the loop devices it backs: the device node itself, or a
    /// file on a file system of it. `depth`: how many loop devices deep
    /// `rdev` is.
    fn backed_by(
        &self,
        rdev: u64,
        depth: usize,
        seen: &mut HashSet<u64>,
    ) -> Result<Option<String>, Error> {
        for l in &self.loops {
            let link = if l.backing.rdev == rdev {
                format!("backs /dev/{}", l.name)
            } else if l.backing.dev == rdev {
                format!(
                    "holds the file system of the file that backs /dev/{}",
                    l.name
                )
            } else {
                continue;
            };
            if seen.contains(&l.rdev) {
                continue; // on the chain already: a cycle ends here
            }
            if depth >= MAX_DEPTH {
                return Ok(Some(format!(
                    "{link}, which begins a chain of loop devices more than {MAX_DEPTH} deep (not followed)"
                )));
            }
            if let Some(p) = self.walk(l.rdev, false, depth + 1, seen)? {
                return Ok(Some(format!("{link}, which {p}")));
            }
        }
        Ok(None)
    }

    /// See [`block`].
    fn block(&self, rdev: u64) -> Result<Option<String>, Error> {
        self.walk(rdev, true, 0, &mut HashSet::new())
    }

    /// See [`file`].
    fn file(&self, dev: u64, ino: u64) -> Result<Option<FileUse>, Error> {
        let here = split(dev);
        let is_it = |p: &str| {
            self.probe
                .stat(Path::new(p))
                .is_some_and(|n| n.dev == dev && n.ino == ino)
        };
        if let Some(m) = self
            .mounts
            .iter()
            .find(|m| m.dev == here && m.root != "/" && is_it(&m.at))
        {
            return Ok(Some(FileUse::Busy(format!(
                "it is mounted at {} (a bind mount of this file)",
                m.at
            ))));
        }
        if self.swaps.iter().any(|s| is_it(s)) {
            return Ok(Some(FileUse::Busy("it is in use as swap".into())));
        }
        let mut idle = None;
        for l in &self.loops {
            if (l.backing.dev, l.backing.ino) != (dev, ino) {
                continue;
            }
            let node = format!("/dev/{}", l.name);
            if let Some(p) = self.walk(l.rdev, false, 1, &mut HashSet::new())? {
                let about = match p.strip_prefix("is ") {
                    Some(state) => format!("{node} ({state})"),
                    None => format!("{node}, which {p},"),
                };
                return Ok(Some(FileUse::Busy(format!(
                    "{about} is backed by this file"
                ))));
            }
            idle.get_or_insert(node);
        }
        Ok(idle.map(FileUse::Backs))
    }
}

/// Why the block device `rdev` must not be written, if it must not: it is
/// mounted, swapped to or held, or one of its partitions is, or (for a
/// partition) its disk is, or a loop device it backs (through its node, a
/// partition's, or a file on its file system) is in use in any of these
/// ways, loop on loop. A predicate to follow "it", naming the chain:
/// "is mounted at /mnt", "backs /dev/loop4, which is mounted at /mnt".
pub fn block(rdev: u64) -> Result<Option<String>, Error> {
    Host::live()?.block(rdev)
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
/// device it backs (in use, directly or down a chain of loop devices, or
/// idle), a mount of it (a bind mount onto a path, or a path mounted onto
/// it), swap.
pub fn file(dev: u64, ino: u64) -> Result<Option<FileUse>, Error> {
    Host::live()?.file(dev, ino)
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

    /// A made-up system: a sysfs tree in a scratch directory, and a table
    /// in place of `stat` (the loop devices' backing files are then read
    /// from sysfs's `backing_file`, as on a system whose `/dev` nodes
    /// cannot be opened).
    struct Fake {
        root: PathBuf,
        stats: std::collections::HashMap<PathBuf, Node>,
        claimed: HashSet<u64>,
        mountinfo: String,
        swaps: String,
    }

    /// The device number of `/dev`'s own file system in these tests.
    const DEVTMPFS: (u32, u32) = (0, 5);

    fn num(maj: u32, min: u32) -> u64 {
        rustix::fs::makedev(maj, min)
    }

    impl Fake {
        fn new(test: &str) -> Fake {
            let root = std::env::temp_dir()
                .join(format!("fp-disk-fake-sysfs-{test}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&root);
            for d in ["sys/block", "sys/dev/block", "sys/devices/virtual/block"] {
                fs::create_dir_all(root.join(d)).unwrap();
            }
            Fake {
                root,
                stats: Default::default(),
                claimed: Default::default(),
                mountinfo: "22 1 252:1 / / rw - ext4 /dev/vda1 rw\n".into(),
                swaps: "Filename Type Size Used Priority\n".into(),
            }
        }

        fn sys(&self) -> PathBuf {
            self.root.join("sys")
        }

        /// A block device `name` with number `maj:min`, its `/dev` node,
        /// and (for a partition) its disk.
        fn device(&mut self, name: &str, (maj, min): (u32, u32), disk: Option<&str>) -> &mut Self {
            let rel = match disk {
                Some(d) => format!("devices/virtual/block/{d}/{name}"),
                None => format!("devices/virtual/block/{name}"),
            };
            let dir = self.sys().join(&rel);
            fs::create_dir_all(dir.join("holders")).unwrap();
            fs::write(dir.join("dev"), format!("{maj}:{min}\n")).unwrap();
            if disk.is_some() {
                fs::write(dir.join("partition"), "1\n").unwrap();
            } else {
                std::os::unix::fs::symlink(
                    format!("../{rel}"),
                    self.sys().join("block").join(name),
                )
                .unwrap();
            }
            std::os::unix::fs::symlink(
                format!("../../{rel}"),
                self.sys().join(format!("dev/block/{maj}:{min}")),
            )
            .unwrap();
            self.stats.insert(
                PathBuf::from("/dev").join(name),
                Node {
                    dev: num(DEVTMPFS.0, DEVTMPFS.1),
                    ino: 1000 + u64::from(maj) * 1000 + u64::from(min),
                    rdev: Some(num(maj, min)),
                },
            );
            self
        }

        /// The loop device `loopN` (7:N) bound to `backing`.
        fn loop_dev(&mut self, n: u32, backing: &str) -> &mut Self {
            let name = format!("loop{n}");
            self.device(&name, (7, n), None);
            let dir = self
                .sys()
                .join("devices/virtual/block")
                .join(&name)
                .join("loop");
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("backing_file"), format!("{backing}\n")).unwrap();
            self
        }

        /// A regular file on the file system of device `dev`.
        fn file(&mut self, path: &str, dev: (u32, u32), ino: u64) -> &mut Self {
            self.stats.insert(
                PathBuf::from(path),
                Node {
                    dev: num(dev.0, dev.1),
                    ino,
                    rdev: None,
                },
            );
            self
        }

        fn mount(&mut self, (maj, min): (u32, u32), source: &str, at: &str) -> &mut Self {
            self.mountinfo += &format!("40 22 {maj}:{min} / {at} rw - ext4 {source} rw\n");
            self
        }

        fn host(&self) -> Host<'_> {
            Host::new(
                &self.sys(),
                parse_mounts(&self.mountinfo),
                parse_swaps(&self.swaps),
                self,
            )
            .unwrap()
        }

        fn block(&self, dev: (u32, u32)) -> Option<String> {
            self.host().block(num(dev.0, dev.1)).unwrap()
        }
    }

    impl Probe for Fake {
        fn stat(&self, path: &Path) -> Option<Node> {
            self.stats.get(path).copied()
        }
        fn loop_status(&self, _: &str, _: u64) -> Option<Backing> {
            None
        }
        fn claimed(&self, _: &str, rdev: u64) -> bool {
            self.claimed.contains(&rdev)
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    /// `/dev/loop3` (the device to write) under `/dev/loop4`: the image
    /// file, loop3 over it, loop4 over loop3.
    fn loop4_on_loop3(test: &str) -> Fake {
        let mut f = Fake::new(test);
        f.file("/srv/lower.img", (252, 1), 77)
            .loop_dev(3, "/srv/lower.img")
            .loop_dev(4, "/dev/loop3");
        f
    }

    #[test]
    fn a_device_backing_a_mounted_loop_device_is_refused_naming_the_chain() {
        let mut f = loop4_on_loop3("mounted");
        assert_eq!(f.block((7, 3)), None, "nothing in use yet");
        f.mount((7, 4), "/dev/loop4", "/mnt/x");
        assert_eq!(
            f.block((7, 3)).as_deref(),
            Some("backs /dev/loop4, which is mounted at /mnt/x")
        );
        // Its file, one link further down.
        let host = f.host();
        let why = host.file(num(252, 1), 77).unwrap();
        assert_eq!(
            why,
            Some(FileUse::Busy(
                "/dev/loop3, which backs /dev/loop4, which is mounted at /mnt/x, is backed by this file"
                    .into()
            ))
        );
    }

    #[test]
    fn a_loop_device_down_the_chain_in_use_otherwise_is_refused() {
        let mut f = loop4_on_loop3("otherwise");
        f.swaps += "/dev/loop4 partition 65532 0 -2\n";
        assert_eq!(
            f.block((7, 3)).as_deref(),
            Some("backs /dev/loop4, which is in use as swap")
        );
        let f = loop4_on_loop3("held");
        fs::create_dir_all(f.sys().join("devices/virtual/block/loop4/holders/dm-0")).unwrap();
        assert!(f
            .block((7, 3))
            .is_some_and(|w| w.starts_with("backs /dev/loop4, which is held by dm-0")));
        let mut f = loop4_on_loop3("claimed");
        f.claimed.insert(num(7, 4));
        assert!(f.block((7, 3)).is_some_and(|w| w.starts_with(
            "backs /dev/loop4, which is in use: the kernel refused an exclusive open"
        )));
        // The device to write is not asked: the exclusive open answers
        // for it (and, once it is ours, would answer "claimed").
        let mut f = loop4_on_loop3("self");
        f.claimed.insert(num(7, 3));
        assert_eq!(f.block((7, 3)), None);
    }

    #[test]
    fn loop_on_loop_on_loop_is_followed_to_the_mount() {
        let mut f = loop4_on_loop3("deep");
        f.loop_dev(5, "/dev/loop4")
            .mount((7, 5), "/dev/loop5", "/mnt/deep");
        assert_eq!(
            f.block((7, 3)).as_deref(),
            Some("backs /dev/loop4, which backs /dev/loop5, which is mounted at /mnt/deep")
        );
        assert_eq!(
            f.block((7, 4)).as_deref(),
            Some("backs /dev/loop5, which is mounted at /mnt/deep")
        );
    }

    #[test]
    fn a_chain_deeper_than_the_bound_is_refused_unfollowed() {
        let mut f = Fake::new("bound");
        f.file("/srv/img", (252, 1), 5).loop_dev(100, "/srv/img");
        for n in 101..=100 + MAX_DEPTH as u32 + 1 {
            f.loop_dev(n, &format!("/dev/loop{}", n - 1));
        }
        let why = f.block((7, 100)).unwrap();
        assert!(
            why.starts_with("backs /dev/loop101, which backs /dev/loop102,"),
            "{why}"
        );
        assert!(why.ends_with(&format!(
            "backs /dev/loop117, which begins a chain of loop devices more than {MAX_DEPTH} deep (not followed)"
        )), "{why}");
        // Within the bound, an idle chain is no reason.
        assert_eq!(f.block((7, 102)), None);
    }

    #[test]
    fn a_cycle_ends_and_what_hangs_off_it_is_still_found() {
        let mut f = Fake::new("cycle");
        // The loop driver refuses this; a made-up table need not.
        f.loop_dev(3, "/dev/loop4").loop_dev(4, "/dev/loop3");
        assert_eq!(f.block((7, 3)), None);
        assert_eq!(f.block((7, 4)), None);
        f.loop_dev(6, "/dev/loop4")
            .mount((7, 6), "/dev/loop6", "/mnt/c");
        assert_eq!(
            f.block((7, 3)).as_deref(),
            Some("backs /dev/loop4, which backs /dev/loop6, which is mounted at /mnt/c")
        );
    }

    #[test]
    fn partitions_are_followed_both_ways() {
        let mut f = Fake::new("part");
        f.file("/srv/disk.img", (252, 1), 9)
            .loop_dev(3, "/srv/disk.img")
            .device("loop3p1", (259, 0), Some("loop3"))
            .loop_dev(4, "/dev/loop3p1")
            .mount((7, 4), "/dev/loop4", "/mnt/p");
        // The disk: writing it writes the partition, which backs loop4.
        assert_eq!(
            f.block((7, 3)).as_deref(),
            Some("is the disk of partition loop3p1, which backs /dev/loop4, which is mounted at /mnt/p")
        );
        // The partition itself.
        assert_eq!(
            f.block((259, 0)).as_deref(),
            Some("backs /dev/loop4, which is mounted at /mnt/p")
        );
        // A partition of a disk that backs a loop device in use.
        let mut f = Fake::new("part-of");
        f.file("/srv/disk.img", (252, 1), 9)
            .loop_dev(3, "/srv/disk.img")
            .device("loop3p1", (259, 0), Some("loop3"))
            .loop_dev(4, "/dev/loop3")
            .mount((7, 4), "/dev/loop4", "/mnt/q");
        assert_eq!(
            f.block((259, 0)).as_deref(),
            Some("is a partition of loop3, which backs /dev/loop4, which is mounted at /mnt/q")
        );
        // A partitioned loop device down the chain, its partition mounted.
        let mut f = loop4_on_loop3("part-down");
        f.device("loop4p1", (259, 1), Some("loop4"))
            .mount((259, 1), "/dev/loop4p1", "/mnt/r");
        assert_eq!(
            f.block((7, 3)).as_deref(),
            Some("backs /dev/loop4, which is the disk of partition loop4p1, which is mounted at /mnt/r")
        );
    }

    #[test]
    fn a_file_on_its_file_system_backing_a_loop_device_is_followed() {
        // The file system of loop3 unmounted lazily: gone from the mount
        // table, alive while loop4 keeps its file open.
        let mut f = Fake::new("lazy");
        f.file("/srv/lower.img", (252, 1), 77)
            .loop_dev(3, "/srv/lower.img")
            .file("/mnt/gone/inner.img", (7, 3), 12)
            .loop_dev(4, "/mnt/gone/inner.img")
            .mount((7, 4), "/dev/loop4", "/mnt/inner");
        assert_eq!(
            f.block((7, 3)).as_deref(),
            Some("holds the file system of the file that backs /dev/loop4, which is mounted at /mnt/inner")
        );
    }

    #[test]
    fn loop_devices_over_other_devices_are_no_reason() {
        let mut f = Fake::new("other");
        f.device("sda", (8, 0), None)
            .file("/srv/lower.img", (252, 1), 77)
            .file("/srv/other.img", (252, 1), 78)
            .loop_dev(3, "/srv/lower.img")
            .loop_dev(4, "/dev/sda")
            .loop_dev(5, "/srv/other.img")
            .mount((7, 4), "/dev/loop4", "/mnt/a")
            .mount((7, 5), "/dev/loop5", "/mnt/b");
        assert_eq!(f.block((7, 3)), None);
        assert_eq!(
            f.block((8, 0)).as_deref(),
            Some("backs /dev/loop4, which is mounted at /mnt/a")
        );
        assert_eq!(
            f.host().file(num(252, 1), 77).unwrap(),
            Some(FileUse::Backs("/dev/loop3".into()))
        );
    }
}
