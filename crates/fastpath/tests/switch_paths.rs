//! `fastpath switch run` and `fastpath switch vm` with socket paths that are
//! not theirs to take, as a user mistypes them: nothing there is deleted,
//! and the error names the path and what to do. No root needed.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use common::fastpath;

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fp-switch-paths-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `fastpath switch run ARGS`, which must fail at once; its stderr.
fn run_fails(args: &[&str]) -> String {
    let mut c = fastpath()
        .args(["switch", "run"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while c.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = c.kill();
            let _ = c.wait();
            panic!("the switch started with {args:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out: Output = c.wait_with_output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_file_at_a_vm_socket_path_is_left_alone_and_named() {
    let d = dir("file");
    let img = d.join("disk.img");
    std::fs::write(&img, b"a guest's disk").unwrap();
    let err = run_fails(&["--socket", s(&d.join("ctl.sock")), "--vhost-user", s(&img)]);
    assert!(
        err.contains(s(&img)) && err.contains("not a socket"),
        "{err}"
    );
    assert_eq!(std::fs::read(&img).unwrap(), b"a guest's disk");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn another_switch_s_live_socket_and_a_path_given_twice_are_refused() {
    let d = dir("live");
    let a = d.join("a.sock");
    let _first = Proc(
        fastpath()
            .args(["switch", "run", "--socket", s(&a)])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let end = Instant::now() + Duration::from_secs(10);
    while !a.exists() {
        assert!(Instant::now() < end, "the first switch did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = run_fails(&["--socket", s(&d.join("b.sock")), "--vhost-user", s(&a)]);
    assert!(err.contains(s(&a)) && err.contains("live socket"), "{err}");
    // The first switch still answers on its socket.
    let st = common::json(&["switch", "status", "--socket", s(&a), "--format", "json"]);
    assert!(st["switch"].is_object(), "{st}");
    let vm = d.join("vm.sock");
    let err = run_fails(&[
        "--socket",
        s(&d.join("c.sock")),
        "--vhost-user",
        &format!("{},name=v1", s(&vm)),
        "--vhost-user",
        &format!("{},name=v2", s(&vm)),
    ]);
    assert!(err.contains("given twice"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_vm_started_before_its_switch_says_to_start_the_switch_first() {
    let d = dir("vm");
    let out = fastpath()
        .args([
            "switch",
            "vm",
            "--vhost-user",
            s(&d.join("vm1.sock")),
            "--image",
            s(&d),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("start the switch first") && err.contains("fastpath switch run"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// A VM NIC's queue pairs are checked before QEMU is asked for them: a
/// count the switch cannot offer, or queues on a NIC that has none here,
/// is refused with what is allowed.
#[test]
fn a_vm_nic_asks_for_queue_pairs_the_switch_can_offer() {
    let d = dir("vm-queues");
    let sock = d.join("vm1.sock");
    let run = |args: &[&str]| {
        let out = fastpath()
            .args(["switch", "vm", "--image", s(&d)])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    for q in ["0", "9", "two"] {
        let err = run(&["--vhost-user", &format!("{},queues={q}", s(&sock))]);
        assert!(
            err.contains(&format!("queues={q}")) && err.contains("from 1 to 8"),
            "{q}: {err}"
        );
    }
    let err = run(&["--tap", "fpt0,queues=2"]);
    assert!(err.contains("only mac=MAC"), "{err}");
    let err = run(&[
        "--vhost-user",
        &format!("{},queues=2", s(&sock)),
        "--cpus",
        "9",
    ]);
    assert!(err.contains("--cpus"), "{err}");
    // Two pairs pass the check: what stops it then is the missing switch.
    let err = run(&[
        "--vhost-user",
        &format!("{},queues=2", s(&sock)),
        "--cpus",
        "2",
    ]);
    assert!(err.contains("start the switch first"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}
