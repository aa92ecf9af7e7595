//! A capture that fastpath did not write: a capture of lone
//! later fragments must end in under a second with every frame accounted
//! for. Scapy, an independent packet library, fragments real UDP and TCP
//! datagrams to the sample configuration's VIPs; the capture keeps every
//! fragment of some datagrams, only the later fragments of others (the
//! first never comes), and sends UDP to the TCP-only VIP (its first
//! fragment is dropped, so its later ones wait in vain). `lb run` on it
//! must end promptly, account for every frame, and forward whole
//! datagrams.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

const SCAPY: &str = r#"
import sys
from scapy.all import Ether, IP, UDP, TCP, Raw, fragment, wrpcap
out = []
eth = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
for i in range(10):
    d = IP(src="203.0.113.%d" % (i + 1), dst="192.0.2.53", id=1000 + i) / UDP(sport=4000 + i, dport=53) / Raw(b"x" * 300)
    frags = fragment(d, fragsize=104)
    if i % 2:
        frags = frags[1:]          # the first fragment never comes
    out += [eth / f for f in frags]
for i in range(5):
    # UDP to the TCP-only VIP: its first fragment is dropped (no VIP serves UDP there).
    d = IP(src="198.51.100.%d" % (i + 1), dst="192.0.2.80", id=2000 + i) / UDP(sport=5000 + i, dport=80) / Raw(b"y" * 200)
    out += [eth / f for f in fragment(d, fragsize=104)]
for i in range(5):
    d = IP(src="203.0.113.9", dst="192.0.2.80", id=3000 + i) / TCP(sport=6000 + i, dport=80, flags="PA") / Raw(b"z" * 250)
    frags = fragment(d, fragsize=96)
    out += [eth / f for f in reversed(frags)]   # last first
wrpcap(sys.argv[1], out)
print(len(out))
"#;

#[test]
#[ignore = "system test: python3-scapy"]
fn a_foreign_capture_of_lone_later_fragments_ends_and_accounts_for_every_frame() {
    let py = "/usr/bin/python3";
    systest::require_python_module(py, "scapy");
    let dir = std::env::temp_dir().join(format!("fastpath-foreign-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (inp, out) = (dir.join("in.pcap"), dir.join("out.pcap"));
    let made = Command::new(py)
        .args(["-c", SCAPY])
        .arg(&inp)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let frames: u64 = String::from_utf8_lossy(&made.stdout)
        .trim()
        .parse()
        .unwrap();
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/lb.toml");
    for threads in ["0", "2"] {
        let started = Instant::now();
        let mut child = common::fastpath()
            .args([
                "lb",
                "run",
                "--config",
                config,
                "--format",
                "json",
                "--threads",
                threads,
            ])
            .arg("--pcap-in")
            .arg(&inp)
            .arg("--pcap-out")
            .arg(&out)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("threads={threads}: lb run still running after 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let took = started.elapsed();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(
            took < Duration::from_secs(5),
            "threads={threads}: took {took:?}"
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let rx = v["port"]["rx"].as_u64().unwrap();
        let processed = v["processed"].as_u64().unwrap();
        let tx = v["forwarded"].as_u64().unwrap();
        let dropped = v["dropped"].as_u64().unwrap();
        let not_for_vip = v["not_for_vip"].as_u64().unwrap();
        let by_reason: u64 = v["drops"]
            .as_object()
            .unwrap()
            .values()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!((rx, processed), (frames, frames), "threads={threads}: {v}");
        assert_eq!(dropped, by_reason, "threads={threads}: {v}");
        assert_eq!(
            processed,
            tx + dropped + not_for_vip,
            "threads={threads}: every frame accounted for: {v}"
        );
        assert!(v["drops"]["frag_expired"].as_u64().unwrap() > 0, "{v}");
        // Whole datagrams (5 UDP to DNS, 5 TCP) are forwarded, fragments
        // and all: tshark reads every output as GRE.
        assert!(tx > 0, "{v}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
