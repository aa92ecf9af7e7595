//! One load balancer per interface: a second
//! `fastpath lb run` on an interface that one already serves refuses at
//! once with a clear message, instead of falling back to AF_PACKET beside
//! it. In a namespace of its own, with a veth pair that exists only there.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use lab::netns::{self, Netns};

#[test]
#[ignore = "system test: root, namespaces"]
fn a_second_load_balancer_on_the_same_interface_is_refused() {
    systest::require_netns();
    let ns = Netns::new(&format!("fp1pi-{}", std::process::id() % 100_000)).unwrap();
    netns::veth(
        &ns,
        "x0",
        "02:00:00:00:0e:01",
        &ns,
        "x1",
        "02:00:00:00:0e:02",
    )
    .unwrap();
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/lb.toml");
    let run = || {
        ns.command(env!("CARGO_BIN_EXE_fastpath"))
            .args(["lb", "run", "--config", config, "--interface", "x0"])
            .args(["--driver", "af-packet", "--threads", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut first = run();
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first load balancer should be running"
    );
    let started = Instant::now();
    let mut second = run();
    while second.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(10) {
            let _ = second.kill();
            let _ = first.kill();
            panic!("a second load balancer kept running on the same interface");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let second = second.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "the second one ran: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refusing took {:?}",
        started.elapsed()
    );
    assert!(
        err.contains("already serves x0") && err.contains(&format!("pid {}", first.id())),
        "{err}"
    );
    // The first one is unaffected and stops cleanly.
    assert!(first.try_wait().unwrap().is_none());
    // SAFETY: kill(2) on our own, unreaped child.
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    let out = first.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
