//! A block device that backs a loop device is written through to whatever
//! that loop device holds: writing `/dev/loopA` under `/dev/loopB` (backed
//! by it) destroys a file system mounted from `/dev/loopB` although
//! `/dev/loopA` itself is neither mounted nor claimed. The refusal follows
//! the chain of loop devices to the mount and names it; its file, one
//! link further down, is refused the same way.

use std::path::Path;

use disk::device::Device;

mod common;
use common::*;

#[test]
#[ignore = "system test: root, loop devices"]
fn a_device_backing_a_loop_device_with_a_mounted_file_system_is_refused() {
    systest::require_root();
    if !in_private_mounts("a_device_backing_a_loop_device_with_a_mounted_file_system_is_refused") {
        return;
    }
    // Declared in this order, dropped in the reverse: unmounted first,
    // then the upper loop device detached, then the lower, then the file.
    let s = Scratch::new("loop-chain");
    let img = s.file("lower.img", 64 << 20);
    let lower = LoopDev::over(&img, false);
    let upper = LoopDev::over(lower.path(), false);
    let mnt = s.dir("mnt");
    let (m, data) = ext4_with_data(&upper.0, &mnt);

    let chain = format!(
        "it backs {}, which is mounted at {}",
        upper.0,
        mnt.display()
    );
    for flag in [false, true] {
        let why = refusal(Device::open(lower.path(), true, flag));
        assert!(why.contains(&chain), "{why}");
        // The file under both, one link further.
        let why = refusal(Device::open(&img, true, flag));
        assert!(
            why.contains(&lower.0) && why.contains(&chain.replacen("it backs", "which backs", 1)),
            "{why}"
        );
    }
    // Reading is harmless.
    assert!(Device::open(lower.path(), false, false).is_ok());
    drop(m);
    intact(&upper.0, &mnt, &data);
    // Unmounted, the chain holds nothing in use: a block device is then
    // written with the flag, as any other.
    assert!(Device::open(Path::new(&lower.0), true, true).is_ok());
}

/// Once the device is opened exclusively (ours), its partitions' own
/// exclusive opens fail: asking them then would refuse every partitioned
/// device. The kernel's refusal of our open already answers for them.
#[test]
#[ignore = "system test: root, loop devices"]
fn a_partitioned_device_nothing_uses_is_written_with_the_flag() {
    systest::require_root();
    let s = Scratch::new("loop-parts");
    let img = s.file("disk.img", 32 << 20);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all(&mbr((32 << 20) / 512)).unwrap();
    }
    let lo = LoopDev::over(&img, true);
    let sys = Path::new("/sys/class/block").join(format!("{}p1", lo.name()));
    if !sys.exists() {
        let _ = sh(&["partx", "-a", &lo.0]);
    }
    if !sys.exists() {
        systest::missing(&format!("a partition device for {}", lo.0));
    }
    if let Err(e) = Device::open(lo.path(), true, true) {
        panic!("refused: {e}");
    }
}
