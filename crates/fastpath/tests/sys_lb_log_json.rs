//! `lb run --log-format json` on an interface, stopped by SIGTERM: every
//! line it writes, on stderr and stdout, is one JSON object, its counters
//! at exit included (a log shipper reading the journal gets no plain-text
//! table among them).
//!
//! System test: root and network namespaces (a veth pair in a namespace of
//! its own, no traffic).

use std::process::Stdio;
use std::time::{Duration, Instant};

use lab::netns::{self, Netns};

const CONFIG: &str = r#"
[forwarder]
threads = 0
queue_size = 256
pool_buffers = 4096
driver = "af-packet"
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

#[test]
#[ignore = "system test: root, namespaces"]
fn json_logs_end_with_the_counters_as_json() {
    systest::require_netns();
    let tag = std::process::id() % 100_000;
    let ns = Netns::new(&format!("fplj-{tag}")).unwrap();
    let peer = Netns::new(&format!("fplp-{tag}")).unwrap();
    netns::veth(
        &ns,
        "j0",
        "02:00:00:00:09:02",
        &peer,
        "j1",
        "02:00:00:00:09:01",
    )
    .unwrap();
    ns.ip(&["addr", "add", "10.10.9.2/24", "dev", "j0"])
        .unwrap();
    let dir = std::env::temp_dir().join(format!("fastpath-log-json-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("lb.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let child = ns
        .command(env!("CARGO_BIN_EXE_fastpath"))
        .args(["lb", "run", "--log-format", "json", "--config"])
        .arg(&config)
        .args(["--interface", "j0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Forwarding: the API answers (or 10 s pass).
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let up = ns
            .command("bash")
            .args(["-c", "exec 3<>/dev/tcp/127.0.0.1/9180"])
            .output()
            .is_ok_and(|o| o.status.success());
        if up {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: kill(2) on our own, unreaped child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    let mut counters = None;
    for line in stdout.lines().chain(stderr.lines()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}\n{stdout}{stderr}"));
        for key in ["timestamp", "level", "fields", "target"] {
            assert!(v.get(key).is_some(), "no {key}: {line}");
        }
        if let Some(c) = v["fields"].get("counters") {
            counters = Some(c.clone());
        }
    }
    let counters = counters.unwrap_or_else(|| panic!("no counters at exit:\n{stderr}"));
    assert!(counters.get("forwarded").is_some(), "{counters}");
}
