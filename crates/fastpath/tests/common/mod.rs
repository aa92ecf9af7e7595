//! What the CLI tests share: running `fastpath` as a user would.

// Each test binary includes this module and uses a part of it.
#![allow(dead_code)]

pub mod probe;
pub mod systemd;
pub mod vm;

use std::process::Command;

/// The `fastpath` binary under test.
pub fn fastpath() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fastpath"))
}

/// Run `cmd`, which must succeed (its stderr is the failure message); its
/// standard output is one JSON document.
pub fn json_of(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{cmd:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `fastpath ARGS`, read as with [`json_of`].
pub fn json(args: &[&str]) -> serde_json::Value {
    json_of(fastpath().args(args))
}

/// A namespace network (`lab::topology`) around this `fastpath`: `lbs`
/// load balancers, `backends` backends, names tagged with `prefix` and this
/// process's id. A system test's: where this machine cannot build one (not
/// root, no iproute2) the test fails saying so, as on any other failure.
pub fn topology(lbs: usize, backends: usize, prefix: &str) -> lab::topology::Topology {
    systest::require_netns();
    // The router and the load balancers run BIRD, the backends nginx.
    systest::require_programs(&["bird", "birdc", "nginx"]);
    let tag = format!("{prefix}{}", std::process::id() % 100_000);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fastpath"));
    match lab::topology::Topology::build_fleet(bin, lbs, backends, &tag) {
        Ok(t) => t,
        Err(lab::Error::Unavailable) => systest::missing("root and iproute2 (network namespaces)"),
        Err(e) => panic!("{e}"),
    }
}

/// What tshark (a decoder we did not write) reads in `pcap`: one line per
/// frame, `fields` separated by `|` (a field that occurs twice, as in
/// GRE's outer and inner headers, is comma-separated), with the
/// preferences `prefs` (`-o` values such as `ip.check_checksum:TRUE`).
pub fn tshark_fields(pcap: &std::path::Path, prefs: &[&str], fields: &[&str]) -> Vec<String> {
    systest::require_program("tshark");
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(pcap);
    for p in prefs {
        cmd.args(["-o", p]);
    }
    cmd.args(["-T", "fields", "-E", "separator=|"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let ts = cmd
        .output()
        .expect("tshark must be installed: run scripts/setup.sh");
    assert!(
        ts.status.success(),
        "{}",
        String::from_utf8_lossy(&ts.stderr)
    );
    String::from_utf8(ts.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A three-member etcd cluster (`lab::etcd`) named after `tag` and this
/// process, on TLS with its own CA when `tls`; a missing etcd, etcdctl or
/// openssl fails the test, naming it.
pub fn etcd_cluster(tag: &str, tls: bool) -> lab::etcd::EtcdCluster {
    systest::require_netns();
    systest::require_programs(&["etcd", "etcdctl", "timeout"]);
    if tls {
        systest::require_programs(&["openssl"]);
    }
    let tag = format!("{tag}{}", std::process::id() % 100_000);
    let started = if tls {
        lab::etcd::EtcdCluster::start_tls(&tag, 3)
    } else {
        lab::etcd::EtcdCluster::start(&tag, 3)
    };
    match started {
        Ok(c) => c,
        Err(lab::Error::Unavailable) => systest::missing("root and iproute2 (network namespaces)"),
        Err(e) => panic!("{e}"),
    }
}
