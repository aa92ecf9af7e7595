//! The shipped units' sandboxes, run for real: the .deb that `make deb`
//! builds (from this test build) is installed into a private systemd
//! (tests/common/systemd.rs), and `fastpath-lb@test` and
//! `fastpath-decap@fpdecap0` run as shipped. What is checked is what the
//! sandbox promises both ways:
//!
//! - it leaves the daemon working: the load balancer in the driver (XDP:
//!   the BPF verifier's stricter rules without CAP_PERFMON or CAP_SYS_ADMIN
//!   refuse the program) and AF_XDP, and the decapsulation agent with its
//!   TUN device, under the units' capabilities and system-call filters;
//! - it holds against a compromised daemon: a command run with the load
//!   balancer's privileges (an `ExecStartPre=` of a drop-in, which systemd
//!   runs in the same sandbox) cannot remount /usr writable, write to it
//!   or mount anything, so cannot undo `ProtectSystem=`.
//!
//! System test: root, namespaces, systemd, dpkg-deb, util-linux
//! (scripts/setup.sh); it fails naming whichever is missing, and holds the
//! machine alone (`systest::exclusive`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::systemd::Systemd;
use lab::netns::{self, Netns};

const UNIT: &str = "fastpath-lb@test.service";
const DECAP: &str = "fastpath-decap@fpdecap0.service";

/// The load balancer: in the driver, no BGP (no BIRD needed), the next
/// hop's MAC given.
const CONFIG: &str = r#"
[forwarder]
threads = 1
queue_size = 256
pool_buffers = 4096
driver = "xdp"
[api]
listen = "127.0.0.1:9180"
[encap]
source = "10.10.9.2"
gateway_mac = "02:00:00:00:09:01"
[[pools]]
name = "web"
backends = [{ address = "10.10.8.2" }]
[[vips]]
name = "http"
address = "198.18.0.80"
port = 80
protocol = "tcp"
pool = "web"
"#;

/// What a compromised daemon would try, run with the unit's privileges:
/// each attempt's exit status, into /run/fastpath/probe (the one
/// directory besides /etc/fastpath the unit may write).
const PROBE: &str = "[Service]\n\
ExecStartPre=/bin/sh -c 'mkdir -p /run/fastpath; \
mount -o remount,bind,rw /usr 2>/dev/null; r=$?; \
touch /usr/.fastpath-probe 2>/dev/null; w=$?; \
mount -t tmpfs probe /mnt 2>/dev/null; t=$?; \
echo \"remount=$r write=$w tmpfs=$t\" > /run/fastpath/probe'\n";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds the .deb into `dir`; its path.
fn build_deb(dir: &Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let built = Command::new(repo().join("scripts/build-deb.sh"))
        .arg(env!("CARGO_BIN_EXE_fastpath"))
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    String::from_utf8_lossy(&built.stdout).trim().to_string()
}

/// Whether `unit` is active, polled for up to `limit`.
fn active_within(sd: &Systemd, unit: &str, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if sd
            .systemctl(&["is-active", unit])
            .is_ok_and(|s| s.trim() == "active")
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
#[ignore = "system test: root, namespaces, systemd, dpkg, XDP"]
fn the_units_sandboxes_keep_the_datapath_and_forbid_mounts() {
    let _serial = systest::exclusive();
    systest::require_netns();
    systest::require_programs(&["dpkg-deb", "nsenter", "unshare", "setpriv", "systemctl"]);
    let tag = std::process::id() % 100_000;
    let work = Scratch(std::env::temp_dir().join(format!("fastpath-sandbox-{tag}")));
    let _ = std::fs::remove_dir_all(&work.0);
    let debs = work.0.join("out");
    let deb = build_deb(&debs);

    let lbns = Netns::new(&format!("fpul-{tag}")).unwrap();
    let peer = Netns::new(&format!("fpup-{tag}")).unwrap();
    netns::veth(
        &lbns,
        "l0",
        "02:00:00:00:09:02",
        &peer,
        "p0",
        "02:00:00:00:09:01",
    )
    .unwrap();
    lbns.ip(&["addr", "add", "10.10.9.2/24", "dev", "l0"])
        .unwrap();

    let sd = Systemd::boot(&lbns, &[&debs], &format!("sbx-{tag}")).unwrap();
    sd.run(&["dpkg", "-i", &deb]).unwrap();
    sd.write("/etc/fastpath/test.toml", CONFIG).unwrap();
    sd.write("/etc/fastpath/test.env", "INTERFACE=l0\n")
        .unwrap();
    sd.write(
        "/etc/systemd/system/fastpath-lb@test.service.d/probe.conf",
        PROBE,
    )
    .unwrap();
    sd.systemctl(&["daemon-reload"]).unwrap();

    // Type=notify: `systemctl start` returns once the daemon said READY=1.
    if let Err(e) = sd.systemctl(&["start", UNIT]) {
        panic!("{e}\n{}", sd.journal(UNIT));
    }
    let journal = sd.journal(UNIT);
    assert_eq!(
        sd.systemctl(&["is-active", UNIT]).unwrap().trim(),
        "active",
        "{journal}"
    );
    assert!(
        journal.contains("the load balancer in the driver (XDP)") && journal.contains("AF_XDP"),
        "the unit's sandbox left XDP in the driver unusable:\n{journal}"
    );
    let probe = sd.run(&["cat", "/run/fastpath/probe"]).unwrap();
    eprintln!("with the load balancer's privileges: {}", probe.trim());
    let status = |attempt: &str| {
        probe
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{attempt}=")))
            .and_then(|v| v.parse::<i32>().ok())
            .unwrap_or_else(|| panic!("no {attempt} in the probe's report: {probe}"))
    };
    for attempt in ["remount", "write", "tmpfs"] {
        assert_ne!(
            status(attempt),
            0,
            "{attempt} succeeded with the unit's privileges: {probe}"
        );
    }
    sd.systemctl(&["stop", UNIT]).unwrap();

    // The decapsulation agent under its own filter: it runs, with its TUN
    // device up, until stopped.
    sd.systemctl(&["start", DECAP]).unwrap();
    assert!(
        active_within(&sd, DECAP, Duration::from_secs(5)),
        "{}",
        sd.journal(DECAP)
    );
    // Still running a second later: a refused call would have ended it.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        sd.systemctl(&["is-active", DECAP])
            .unwrap_or_default()
            .trim(),
        "active",
        "{}",
        sd.journal(DECAP)
    );
    if let Err(e) = lbns.ip(&["link", "show", "dev", "fpdecap0"]) {
        panic!("no TUN device: {e}\n{}", sd.journal(DECAP));
    }
    sd.systemctl(&["stop", DECAP]).unwrap();
    drop(sd);
}
