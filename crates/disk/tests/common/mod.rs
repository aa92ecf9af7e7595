//! What the disk crate's system tests share: running programs, scratch
//! space, loop devices, mounts and file systems that clean up after
//! themselves, and a test's own mount namespace.
// Each test binary compiles this module and uses only a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use disk::device::Device;
use disk::{Error, Target};

/// Runs a program: its output, trimmed, or what failed and what it said.
pub fn sh(args: &[&str]) -> Result<String, String> {
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

/// Runs the calling test again in a mount namespace of its own (`unshare
/// -m`, private propagation), so that what it mounts is seen by nothing
/// else and goes when it ends; `true` in the copy that is to do the work.
/// (Loop devices are not namespaced: each test detaches its own.)
pub fn in_private_mounts(test: &str) -> bool {
    if std::env::var_os("FP_DISK_PRIVATE_MOUNTS").is_some() {
        return true;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private"])
        .arg(&exe)
        // System tests are ignored unless asked for: this one is.
        .args([
            test,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FP_DISK_PRIVATE_MOUNTS", "1")
        .output();
    match out {
        Ok(o) => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            println!("{text}");
            assert!(
                o.status.success(),
                "{test} in its own mount namespace failed"
            );
            assert!(text.contains("1 passed"), "{test} did not run: {text}");
            false
        }
        Err(e) => {
            eprintln!("unshare: {e}: mounting in this namespace instead");
            true
        }
    }
}

/// Loop devices and mounts need root: a system test fails without it.
pub fn root() -> bool {
    systest::require_root();
    true
}

/// A scratch directory, removed with what is left in it.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(what: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("fp-disk-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    pub fn file(&self, name: &str, bytes: usize) -> PathBuf {
        let f = self.0.join(name);
        std::fs::write(&f, vec![0u8; bytes]).unwrap();
        f
    }
    pub fn dir(&self, name: &str) -> PathBuf {
        let d = self.0.join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loop device over a file, detached (by its name) when dropped.
pub struct LoopDev(pub String);

impl LoopDev {
    pub fn over(file: &Path, partitions: bool) -> LoopDev {
        let mut args = vec!["losetup", "-f", "--show"];
        if partitions {
            args.push("-P");
        }
        args.push(file.to_str().unwrap());
        LoopDev(sh(&args).expect("losetup (util-linux)"))
    }
    pub fn path(&self) -> &Path {
        Path::new(&self.0)
    }
    pub fn name(&self) -> &str {
        self.0.trim_start_matches("/dev/")
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        if let Err(e) = sh(&["losetup", "-d", &self.0]) {
            eprintln!("{e}");
        }
    }
}

/// A mount, unmounted (by its mount point) when dropped.
pub struct Mounted(pub PathBuf);

impl Mounted {
    pub fn new(args: &[&str], at: &Path) -> Mounted {
        let mut a = vec!["mount"];
        a.extend_from_slice(args);
        a.push(at.to_str().unwrap());
        sh(&a).expect("mount");
        Mounted(at.to_path_buf())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = sh(&["umount", self.0.to_str().unwrap()]) {
            eprintln!("{e}");
        }
    }
}

/// A swap area, turned off (by its path) when dropped.
pub struct Swap(pub String);

impl Drop for Swap {
    fn drop(&mut self) {
        if let Err(e) = sh(&["swapoff", &self.0]) {
            eprintln!("{e}");
        }
    }
}

/// An ext4 file system on `dev` with a file of known bytes in it, mounted
/// at `at`; the bytes, to check it afterwards.
pub fn ext4_with_data(dev: &str, at: &Path) -> (Mounted, Vec<u8>) {
    sh(&["mkfs.ext4", "-q", "-F", dev]).expect("mkfs.ext4 (e2fsprogs)");
    let m = Mounted::new(&[dev], at);
    let data: Vec<u8> = (0..1_000_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761) as u8)
        .collect();
    std::fs::write(at.join("data"), &data).unwrap();
    sh(&["sync"]).unwrap();
    (m, data)
}

/// The file system on `dev` is intact: e2fsck finds nothing to fix, and the
/// known bytes read back (mounted read-only at `at`).
pub fn intact(dev: &str, at: &Path, data: &[u8]) {
    sh(&["e2fsck", "-f", "-n", dev]).expect("e2fsck found damage");
    let _m = Mounted::new(&["-o", "ro", dev], at);
    assert_eq!(
        std::fs::read(at.join("data")).unwrap(),
        data,
        "data changed"
    );
}

pub fn refusal(r: Result<Device, Error>) -> String {
    match r {
        Err(e @ Error::InUse { .. }) => e.to_string(),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(d) => panic!("opened for writing: {}", d.describe()),
    }
}

/// An MBR with one Linux partition from sector 2048 to the end.
pub fn mbr(sectors: u32) -> [u8; 512] {
    let mut b = [0u8; 512];
    let e = &mut b[446..462];
    e[4] = 0x83;
    e[8..12].copy_from_slice(&2048u32.to_le_bytes());
    e[12..16].copy_from_slice(&(sectors - 2048).to_le_bytes());
    b[510] = 0x55;
    b[511] = 0xaa;
    b
}
