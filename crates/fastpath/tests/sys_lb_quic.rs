//! QUIC that survives migration, through the namespace fleet: three load
//! balancers behind the router's ECMP route, three backends each running a
//! real QUIC server (quinn, `fastpath-quic-peer`) that issues QUIC-LB
//! connection IDs with its server ID. A hundred clients download, each
//! rebinding its socket to a new address and port twice mid-download (a NAT
//! rebinding, a move between networks).
//!
//! - With `quic = true` on the VIP every download completes: each datagram
//!   after a move reaches the same backend by its connection ID, whichever
//!   load balancer the router picks and whatever the new 5-tuple hashes to.
//! - The same run with `quic = false` (reloaded on every load balancer): the
//!   5-tuple sends most moved connections to a backend that does not know
//!   them, and they break. Both figures come from the same run.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use lab::topology::{Topology, VIP};

const PORT: u16 = 443;
const KEY: &str = "8f95f09245765f80256934e50c66207f";

fn peer() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_fastpath")).with_file_name("fastpath-quic-peer");
    if !bin.is_file() {
        systest::missing(&format!(
            "{} (built by `cargo test --workspace`: crates/quic-peer)",
            bin.display()
        ));
    }
    bin
}

/// The QUIC part of every load balancer's configuration.
fn quic_section(backends: usize, quic: bool) -> String {
    let list: Vec<String> = (0..backends)
        .map(|i| {
            format!(
                "{{ address = \"10.10.{}.2\", quic_server_id = \"{:04x}\" }}",
                3 + i,
                i + 1
            )
        })
        .collect();
    format!(
        "\n[[quic_lb]]\ncodepoint = 1\nserver_id_len = 2\nnonce_len = 6\nkey = \"{KEY}\"\n\
         length_self_encoding = true\n\
         [[pools]]\nname = \"h3\"\nbackends = [{}]\n\
         [[vips]]\nname = \"h3\"\naddress = \"{VIP}\"\nport = {PORT}\nprotocol = \"udp\"\nquic = {quic}\npool = \"h3\"\n",
        list.join(", ")
    )
}

fn write_configs(t: &Topology, base: &[String], quic: bool) {
    for (path, text) in t.configs.iter().zip(base) {
        std::fs::write(
            path,
            format!("{text}{}", quic_section(t.backends.len(), quic)),
        )
        .expect("write config");
    }
}

/// Runs the migrating client from the client's namespace; its report.
fn downloads(
    t: &Topology,
    peer: &Path,
    dir: &Path,
    binds: &[String],
    timeout_s: u64,
) -> serde_json::Value {
    let out = t
        .client
        .command(&peer.to_string_lossy())
        .args(["client", "--connect", &format!("{VIP}:{PORT}")])
        .args([
            "--connections",
            "100",
            "--bytes",
            "200000",
            "--migrations",
            "2",
        ])
        .args([
            "--bind",
            &binds.join(","),
            "--timeout-s",
            &timeout_s.to_string(),
        ])
        .arg("--cert-dir")
        .arg(dir)
        .output()
        .expect("run the client");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

#[test]
#[ignore = "system test: root, namespaces, BIRD, and the fastpath-quic-peer binary"]
fn migrating_quic_downloads_survive_with_quic_lb_and_break_without() {
    let peer = peer();
    let mut t = common::topology(3, 3, "quic");
    let base: Vec<String> = t
        .configs
        .iter()
        .map(|c| std::fs::read_to_string(c).expect("config"))
        .collect();
    write_configs(&t, &base, true);
    let dir = t.dir.join("quic-cert");
    let st = std::process::Command::new(&peer)
        .args(["cert", "--dir"])
        .arg(&dir)
        .status()
        .expect("cert");
    assert!(st.success());
    for i in 0..t.backends.len() {
        let child = t.backends[i]
            .command(&peer.to_string_lossy())
            .args(["server", "--listen", &format!("{VIP}:{PORT}")])
            .args(["--server-id", &format!("{:04x}", i + 1), "--codepoint", "1"])
            .args(["--server-id-len", "2", "--nonce-len", "6", "--key", KEY])
            .args([
                "--length-self-encoding",
                "--name",
                &format!("backend-{}", i + 1),
            ])
            .args(["--duration-s", "240", "--cert-dir"])
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("quic server");
        t.procs.push(&format!("quic{}", i + 1), child);
    }
    t.start_lbs().expect("start the load balancers");
    t.wait_for_vip(Duration::from_secs(30))
        .expect("the VIP answers");
    t.wait_for_ecmp(&[1, 2, 3], Duration::from_secs(30))
        .expect("all three in the route");
    let mut binds = vec!["10.10.1.2".to_string()];
    binds.extend(t.add_client_addresses(3).expect("client addresses"));

    let on = downloads(&t, &peer, &dir, &binds, 30);
    assert_eq!(on["connections"], 100, "{on}");
    assert_eq!(on["migrations"], 200, "every connection moved twice: {on}");
    assert_eq!(on["broken"], 0, "QUIC-LB on: {on}");
    let servers = on["servers"].as_object().expect("servers");
    assert_eq!(
        servers.len(),
        3,
        "the fallback spreads new connections: {on}"
    );
    // The load balancers counted what they routed by connection ID.
    let routed: u64 = (1..=3)
        .map(|k| {
            let m = t.api_on(k, "GET", "/metrics").expect("metrics");
            m.lines()
                .filter(|l| l.starts_with("fastpath_lb_quic_routed_total"))
                .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        })
        .sum();
    assert!(routed > 1000, "datagrams routed by connection ID: {routed}");

    // The same run with the VIP's QUIC routing off, on every load balancer.
    write_configs(&t, &base, false);
    for k in 1..=3 {
        t.api_on(k, "POST", "/reload").expect("reload");
    }
    let off = downloads(&t, &peer, &dir, &binds, 10);
    let broken = off["broken"].as_u64().expect("broken");
    eprintln!("QUIC-LB on: {on}\nQUIC-LB off: {off}");
    assert!(
        broken >= 50,
        "without QUIC-LB most moved connections break: {off}"
    );
}
