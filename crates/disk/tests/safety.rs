//! Writing is destructive: a block device needs --allow-destructive, and
//! anything in use is refused whatever the flag: a mounted (or partly
//! mounted) device, swap, a file backing a loop device in use, a file with
//! a bind mount; a file that is only the user's scratch space needs no
//! flag. The decision is made on the descriptor written through, so a
//! symlink swapped under the path cannot send a write elsewhere. (Loop
//! devices, mounts in a mount namespace of each test's own, swap: system
//! tests that need root and fail without it; the file cases are hermetic.)

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use disk::device::Device;
use disk::{Error, Op, Target};

mod common;
use common::*;

struct Loop {
    dev: String,
    file: PathBuf,
    mnt: PathBuf,
    mounted: bool,
}

impl Drop for Loop {
    fn drop(&mut self) {
        if self.mounted {
            let _ = sh(&["umount", self.mnt.to_str().unwrap()]);
        }
        let _ = sh(&["losetup", "-d", &self.dev]);
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_dir(&self.mnt);
    }
}

#[test]
fn files_are_writable_without_the_flag() {
    let f = std::env::temp_dir().join(format!("fp-disk-file-{}", std::process::id()));
    std::fs::write(&f, vec![0u8; 4 << 20]).unwrap();
    let mut d = Device::open(&f, true, false).expect("a file needs no flag");
    assert!(d.access(Op::Write, 10, 1).unwrap() >= 0.0);
    assert!(d.access(Op::Read, 10, 1).unwrap() >= 0.0);
    assert!(matches!(
        d.access(Op::Read, d.sectors(), 1),
        Err(Error::Invalid(_))
    ));
    drop(d);
    std::fs::remove_file(&f).unwrap();
}

#[test]
#[ignore = "system test: root, loop devices, mounts"]
fn block_devices_need_the_flag_and_mounted_ones_are_refused() {
    systest::require_root();
    let pid = std::process::id();
    let file = std::env::temp_dir().join(format!("fp-disk-loop-{pid}.img"));
    std::fs::write(&file, vec![0u8; 32 << 20]).unwrap();
    let dev =
        sh(&["losetup", "-f", "--show", file.to_str().unwrap()]).expect("losetup (util-linux)");
    let mnt = std::env::temp_dir().join(format!("fp-disk-mnt-{pid}"));
    std::fs::create_dir_all(&mnt).unwrap();
    let mut lo = Loop {
        dev: dev.clone(),
        file,
        mnt: mnt.clone(),
        mounted: false,
    };
    let p = Path::new(&dev);

    // Reading is always fine.
    let mut r = Device::open(p, false, false).unwrap();
    assert!(r.is_block_device());
    assert!(r.access(Op::Read, 0, 1).is_ok());
    assert!(r.access(Op::Write, 0, 1).is_err(), "opened read-only");
    drop(r);
    // Writing needs the flag.
    match Device::open(p, true, false) {
        Err(Error::NeedsDestructive(_)) => {}
        other => panic!("{:?}", other.map(|_| ())),
    }
    let mut w = Device::open(p, true, true).expect("allowed with the flag");
    assert!(w.access(Op::Write, 100, 1).is_ok());
    drop(w);
    // Claimed exclusively by someone else (not mounted, no holder): the
    // kernel's answer to our exclusive open refuses it, flag or not.
    let claim = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(p)
        .expect("exclusive open of the loop device");
    for flag in [false, true] {
        match Device::open(p, true, flag) {
            Err(Error::InUse { why, .. }) if flag => assert!(why.contains("in use"), "{why}"),
            Err(Error::NeedsDestructive(_)) if !flag => {}
            other => panic!(
                "claimed device opened for writing (flag {flag}): {:?}",
                other.map(|_| ())
            ),
        }
    }
    assert!(Device::open(p, false, false).is_ok(), "reading stays fine");
    drop(claim);
    // Mounted: refused, flag or not.
    sh(&["mkfs.ext4", "-q", "-F", &dev]).expect("mkfs.ext4 (e2fsprogs)");
    sh(&["mount", &dev, mnt.to_str().unwrap()]).expect("mount");
    lo.mounted = true;
    for flag in [false, true] {
        match Device::open(p, true, flag) {
            Err(Error::InUse { why, .. }) => assert!(why.contains("mounted"), "{why}"),
            other => panic!(
                "mounted device opened for writing (flag {flag}): {:?}",
                other.map(|_| ())
            ),
        }
    }
    // Reading a mounted device is harmless and allowed.
    assert!(Device::open(p, false, false).is_ok());
    drop(lo);
}

#[test]
#[ignore = "system test: root, loop devices, mounts"]
fn a_file_backing_a_mounted_loop_device_is_refused() {
    if !root() || !in_private_mounts("a_file_backing_a_mounted_loop_device_is_refused") {
        return;
    }
    let s = Scratch::new("backing");
    let img = s.file("fs.img", 32 << 20);
    let lo = LoopDev::over(&img, false);
    let mnt = s.dir("mnt");
    let (m, data) = ext4_with_data(&lo.0, &mnt);
    for flag in [false, true] {
        let why = refusal(Device::open(&img, true, flag));
        let want = format!(
            "{} (mounted at {}) is backed by this file",
            lo.0,
            mnt.display()
        );
        assert!(why.contains(&want), "{why}");
    }
    // Through another name for the same file too: a hard link.
    let other = s.0.join("other-name.img");
    std::fs::hard_link(&img, &other).unwrap();
    assert!(refusal(Device::open(&other, true, true)).contains("is backed by this file"));
    // Reading it is harmless.
    assert!(Device::open(&img, false, false).is_ok());
    drop(m);
    // Attached, not mounted: the flag is needed.
    match Device::open(&img, true, false) {
        Err(e @ Error::BacksLoop { .. }) => {
            assert!(e.to_string().contains(&lo.0), "{e}")
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    intact(&lo.0, &mnt, &data);
}

#[test]
#[ignore = "system test: root, loop devices, mounts"]
fn a_file_with_a_bind_mount_is_refused() {
    if !root() || !in_private_mounts("a_file_with_a_bind_mount_is_refused") {
        return;
    }
    let s = Scratch::new("bind");
    let scratch = s.file("scratch.img", 4 << 20);
    let target = s.file("target.img", 4 << 20);
    let _m = Mounted::new(&["--bind", scratch.to_str().unwrap()], &target);
    for path in [&scratch, &target] {
        for flag in [false, true] {
            let why = refusal(Device::open(path, true, flag));
            assert!(
                why.contains(&format!("mounted at {}", target.display())),
                "{why}"
            );
        }
    }
}

#[test]
#[ignore = "system test: root, loop devices, mounts"]
fn a_mounted_loop_device_and_its_file_are_refused() {
    if !root() || !in_private_mounts("a_mounted_loop_device_and_its_file_are_refused") {
        return;
    }
    let s = Scratch::new("mounted");
    let img = s.file("fs.img", 32 << 20);
    let lo = LoopDev::over(&img, false);
    let mnt = s.dir("mnt");
    let (m, data) = ext4_with_data(&lo.0, &mnt);
    for flag in [false, true] {
        let why = refusal(Device::open(lo.path(), true, flag));
        assert!(
            why.contains(&format!("it is mounted at {}", mnt.display())),
            "{why}"
        );
    }
    drop(m);
    intact(&lo.0, &mnt, &data);
}

#[test]
#[ignore = "system test: root, loop devices, mounts"]
fn a_loop_device_with_a_mounted_partition_is_refused() {
    if !root() || !in_private_mounts("a_loop_device_with_a_mounted_partition_is_refused") {
        return;
    }
    let s = Scratch::new("part");
    let img = s.file("disk.img", 32 << 20);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all(&mbr((32 << 20) / 512)).unwrap();
    }
    let lo = LoopDev::over(&img, true);
    let part = format!("{}p1", lo.name());
    let sys = Path::new("/sys/class/block").join(&part);
    if !sys.exists() {
        // The loop driver's own scan may be off here: add them by hand.
        let _ = sh(&["partx", "-a", &lo.0]);
    }
    if !sys.exists() {
        systest::missing(&format!(
            "a partition device for {} (the loop driver's partition scan or partx)",
            lo.0
        ));
    }
    // No udev in a container: the partition's node is made here.
    let dev = std::fs::read_to_string(sys.join("dev")).unwrap();
    let node = s.0.join(&part);
    let (maj, min) = dev.trim().split_once(':').unwrap();
    sh(&["mknod", node.to_str().unwrap(), "b", maj, min]).expect("mknod");
    let mnt = s.dir("mnt");
    let (m, data) = ext4_with_data(node.to_str().unwrap(), &mnt);
    for flag in [false, true] {
        let why = refusal(Device::open(lo.path(), true, flag));
        assert!(
            why.contains(&format!(
                "partition {part}, which is mounted at {}",
                mnt.display()
            )),
            "{why}"
        );
        let why = refusal(Device::open(&img, true, flag));
        assert!(
            why.contains("is backed by this file") && why.contains(&part),
            "{why}"
        );
    }
    drop(m);
    intact(node.to_str().unwrap(), &mnt, &data);
}

#[test]
#[ignore = "system test: root, loop devices, mounts"]
fn swap_is_refused() {
    systest::require_root();
    let s = Scratch::new("swap");
    let img = s.file("swap.img", 16 << 20);
    let lo = LoopDev::over(&img, false);
    sh(&["mkswap", &lo.0]).expect("mkswap");
    let on = match sh(&["swapon", &lo.0]) {
        Ok(_) => Swap(lo.0.clone()),
        Err(e) => systest::missing(&format!("swapon on a loop device ({e})")),
    };
    for flag in [false, true] {
        let why = refusal(Device::open(lo.path(), true, flag));
        assert!(why.contains("swap"), "{why}");
        let why = refusal(Device::open(&img, true, flag));
        assert!(why.contains("swap") && why.contains(&lo.0), "{why}");
    }
    drop(on);
}

#[test]
#[ignore = "system test: root, loop devices, mounts"]
fn a_symlink_swapped_to_a_mounted_device_never_gets_written() {
    if !root() || !in_private_mounts("a_symlink_swapped_to_a_mounted_device_never_gets_written") {
        return;
    }
    let s = Scratch::new("race");
    let img = s.file("fs.img", 32 << 20);
    let scratch = s.file("scratch.img", 4 << 20);
    let lo = LoopDev::over(&img, false);
    let mnt = s.dir("mnt");
    let (m, data) = ext4_with_data(&lo.0, &mnt);
    let link = s.0.join("target");
    std::os::unix::fs::symlink(&scratch, &link).unwrap();
    // Flip the link between the scratch file and the mounted device as
    // fast as it goes (rename over it: the link always exists).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (stop, link, dir) = (stop.clone(), link.clone(), s.0.clone());
        let targets = [scratch.clone(), lo.path().to_path_buf()];
        std::thread::spawn(move || {
            let mut flips = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let tmp = dir.join("target.new");
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(&targets[(flips % 2) as usize], &tmp).unwrap();
                std::fs::rename(&tmp, &link).unwrap();
                flips += 1;
            }
            flips
        })
    };
    let (mut to_file, mut refused, mut to_device) = (0u32, 0u32, 0u32);
    let runs = 600;
    let mut reasons = std::collections::BTreeMap::new();
    for i in 0..runs {
        // With the flag too: a mounted device is refused whatever it says.
        match Device::open(&link, true, i % 2 == 0) {
            Ok(mut d) => {
                if d.is_block_device() {
                    to_device += 1;
                }
                // Sector 2 of the device is the ext4 superblock.
                d.access(Op::Write, 2, 1).unwrap();
                to_file += 1;
            }
            Err(e) => {
                refused += 1;
                let kind = match e {
                    Error::InUse { .. } => "in use",
                    Error::NeedsDestructive(_) => "needs the flag",
                    Error::Invalid(_) => "path changed while opening",
                    _ => "other",
                };
                *reasons.entry(kind).or_insert(0u32) += 1;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let flips = flipper.join().unwrap();
    println!(
        "{runs} runs, {flips} flips: {to_file} opened (the scratch file), {refused} refused ({reasons:?}), {to_device} reached the mounted device"
    );
    assert_eq!(to_device, 0);
    assert!(to_file > 0 && refused > 0, "the race was not run both ways");
    drop(m);
    intact(&lo.0, &mnt, &data);
}
