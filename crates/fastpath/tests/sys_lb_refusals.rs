//! A client connecting to the VIP's address on a port no VIP serves is
//! refused at once, as by any host (a TCP RST, an ICMP port unreachable),
//! instead of waiting out its connect timeout: through the router, over
//! the load balancer's real driver, with the kernel's own TCP and UDP
//! sockets in the client's namespace as the judges.

mod common;

use std::time::Duration;

use lab::topology::VIP;

/// Connects to VIP:81 over TCP and sends to VIP:9 over a connected UDP
/// socket, each with a 3 s timeout: prints what happened and how long it
/// took. Linux reports a RST as ECONNREFUSED on connect, and an ICMP port
/// unreachable as ECONNREFUSED on a connected UDP socket's next call.
const CLIENT: &str = r#"
import socket, sys, time
vip = sys.argv[1]
t = time.monotonic()
s = socket.socket()
s.settimeout(3)
try:
    s.connect((vip, 81))
    print("tcp connected %.3f" % (time.monotonic() - t))
except ConnectionRefusedError:
    print("tcp refused %.3f" % (time.monotonic() - t))
except Exception as e:
    print("tcp %s %.3f" % (type(e).__name__, time.monotonic() - t))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(3)
u.connect((vip, 9))
t = time.monotonic()
try:
    u.send(b"x")
    u.recv(100)
    print("udp answered %.3f" % (time.monotonic() - t))
except ConnectionRefusedError:
    print("udp refused %.3f" % (time.monotonic() - t))
except Exception as e:
    print("udp %s %.3f" % (type(e).__name__, time.monotonic() - t))
"#;

/// Starts load balancer 1 (with `driver`, if given), connects as the
/// client, and checks both refusals came within a second and were counted.
fn refused_within_a_second(driver: Option<&str>) {
    systest::require_programs(&["python3", "timeout"]);
    // One topology per test, named apart: the two run at once.
    let mut t = common::topology(1, 2, if driver.is_some() { "rfx" } else { "rf" });
    if let Some(d) = driver {
        let cfg = &t.configs[0];
        let text = std::fs::read_to_string(cfg).unwrap();
        let text = text.replacen(
            "[forwarder]\n",
            &format!("[forwarder]\ndriver = \"{d}\"\n"),
            1,
        );
        std::fs::write(cfg, text).unwrap();
    }
    t.start_lb().unwrap();
    t.wait_for_vip(Duration::from_secs(30)).unwrap();
    let s = t.status_of(1).unwrap();
    eprintln!("driver: {}", s.driver);
    if driver == Some("xdp") {
        assert!(s.driver.contains("in the driver"), "driver: {}", s.driver);
    }
    // Bounded twice: the sockets' timeouts, and `timeout` around them.
    let out = t
        .client
        .exec(&["timeout", "15", "python3", "-c", CLIENT, VIP])
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (proto, line) in ["tcp", "udp"].iter().zip(said.lines()) {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.get(1), Some(&"refused"), "{proto}: {said}");
        let took: f64 = words[2].parse().unwrap();
        assert!(took < 1.0, "{proto} refused after {took} s: {said}");
    }
    // The packet threads publish their counters every so often: the
    // client can hold its refusals before `/status` counts them (a
    // rehearsal read 1 RST and 0 ICMP right after the client's answers).
    let counted = |s: &lbd::status::Status| {
        s.refusals.tcp_rst >= 1
            && s.refusals.icmp_unreachable >= 1
            && s.drops.get("vip_port_not_served").copied().unwrap_or(0) >= 2
    };
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let mut s = t.status_of(1).unwrap();
    while !counted(&s) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
        s = t.status_of(1).unwrap();
    }
    assert!(s.refusals.tcp_rst >= 1, "{:?}", s.refusals);
    assert!(s.refusals.icmp_unreachable >= 1, "{:?}", s.refusals);
    assert!(
        s.drops.get("vip_port_not_served").copied().unwrap_or(0) >= 2,
        "{:?}",
        s.drops
    );
    // The port that is served still serves.
    let by = t.requests(5).unwrap();
    assert_eq!(by.get(""), None, "failed requests: {by:?}");
}

#[test]
#[ignore = "system test: root, namespaces, bird, nginx, python3"]
fn a_connection_to_an_unserved_port_is_refused_within_a_second() {
    refused_within_a_second(None);
}

/// With the load balancer in the driver, the XDP program leaves such
/// frames to user space (the VIP's address is in the steering map), where
/// the packet threads answer them.
#[test]
#[ignore = "system test: root, namespaces, bird, nginx, python3, XDP"]
fn with_the_driver_in_xdp_an_unserved_port_is_refused_too() {
    refused_within_a_second(Some("xdp"));
}
