//! The peer itself, before any load balancer: in a private namespace, a
//! server with a QUIC-LB server ID and clients that rebind twice mid-download
//! complete every download (so a failure behind the load balancer is the
//! load balancer's), and a client that finds no server says so in time.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Ns(String);
impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn peer() -> &'static str {
    env!("CARGO_BIN_EXE_fastpath-quic-peer")
}

fn client(
    ns: &str,
    dir: &std::path::Path,
    port: u16,
    n: usize,
    timeout_s: u64,
) -> serde_json::Value {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, peer(), "client", "--connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args([
            "--connections",
            &n.to_string(),
            "--bytes",
            "3000000",
            "--migrations",
            "2",
        ])
        .args(["--timeout-s", &timeout_s.to_string(), "--cert-dir"])
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
#[ignore = "system test: root (a network namespace), iproute2"]
fn migrating_clients_complete_against_one_server_and_give_up_in_time_without_one() {
    systest::require_netns();
    let ns = Ns(format!("fpquic-{}", std::process::id()));
    let ok = Command::new("ip")
        .args(["netns", "add", &ns.0])
        .status()
        .expect("ip");
    assert!(ok.success());
    Command::new("ip")
        .args(["-n", &ns.0, "link", "set", "lo", "up"])
        .status()
        .expect("ip");
    let dir = std::env::temp_dir().join(format!("fastpath-quic-peer-{}", std::process::id()));
    let st = Command::new(peer())
        .args(["cert", "--dir"])
        .arg(&dir)
        .status()
        .expect("cert");
    assert!(st.success());
    let server = Kill(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns.0,
                peer(),
                "server",
                "--listen",
                "127.0.0.1:4433",
            ])
            .args([
                "--server-id",
                "0a01",
                "--key",
                "8f95f09245765f80256934e50c66207f",
            ])
            .args(["--name", "s1", "--duration-s", "60", "--cert-dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("server"),
    );
    std::thread::sleep(Duration::from_millis(300));
    let v = client(&ns.0, &dir, 4433, 20, 20);
    assert_eq!(v["ok"], 20, "{v}");
    assert_eq!(v["migrations"], 40, "{v}");
    assert_eq!(v["servers"]["s1"], 20, "{v}");
    drop(server);
    // Nobody listening on another port: every download fails, within its
    // deadline, and the report says so.
    let started = Instant::now();
    let v = client(&ns.0, &dir, 4434, 3, 3);
    assert_eq!(
        (v["ok"].as_u64(), v["broken"].as_u64()),
        (Some(0), Some(3)),
        "{v}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
