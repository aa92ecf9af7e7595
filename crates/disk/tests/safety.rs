//! Writing is destructive: a block device needs --allow-destructive, and a
//! mounted one is refused whatever the flag. Files are always allowed.
//! (Uses a loop device over a scratch file; needs root, skips otherwise.)

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use disk::device::Device;
use disk::{Error, Op, Target};

fn sh(args: &[&str]) -> Result<String, String> {
    let o = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    } else {
        Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

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
fn block_devices_need_the_flag_and_mounted_ones_are_refused() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root for loop devices");
        return;
    }
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
