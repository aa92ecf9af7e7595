//! The load balancer finds its next hop's MAC itself: without `[encap] gateway_mac`, `fastpath lb run --interface` asks
//! the kernel (route to the first backend, neighbour table), sends its GRE
//! frames there, follows a change, and says clearly, at start and in
//! `/status` and `lb status`, when it cannot.
//!
//! Two namespaces of the test's own: the load balancer's (`w0`,
//! 10.205.0.2/24, backends 10.205.8.0/24 routed via the gateway 10.205.0.1,
//! and 10.205.9.0/24 via 10.205.0.9, which nobody has at first) and the
//! gateway's (`w1`, 10.205.0.1/24, a known MAC). The test plays the client
//! from the gateway's side: it sends UDP frames for the VIP into `w0` and
//! catches the GRE frames the load balancer sends back on `w1`, reading
//! their Ethernet addresses.

mod common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::probe::RawSocket;
use lab::netns::{self, Netns};
use packet::build::Frame;

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x5c, 0x01];
const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x5c, 0xfe];
const GW_NEW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x5c, 0xfd];
const PLACEHOLDER: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];
const VIP: [u8; 4] = [198, 18, 0, 55];
const API: &str = "127.0.0.1:9185";

fn mac(m: [u8; 6]) -> String {
    netio::neigh::format_mac(&m)
}

/// A configuration without gateway_mac whose backends are `backends`.
fn config(backends: &[&str]) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ address = \"{b}\" }}"))
        .collect();
    format!(
        "[api]\nlisten = \"{API}\"\n[encap]\nsource = \"10.205.0.2\"\n\
         [[pools]]\nname = \"p\"\nbackends = [{}]\n\
         [[vips]]\nname = \"udp\"\naddress = \"198.18.0.55\"\nprotocol = \"udp\"\npool = \"p\"\n",
        list.join(", ")
    )
}

struct Net {
    lb: Netns,
    gw: Netns,
}

fn net() -> Net {
    let id = std::process::id() % 100_000;
    let lb = Netns::new(&format!("fpgw-l-{id}")).unwrap();
    let gw = Netns::new(&format!("fpgw-g-{id}")).unwrap();
    for ns in [&lb, &gw] {
        ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
            .unwrap();
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1").unwrap();
    }
    netns::veth(&lb, "w0", &mac(LB_MAC), &gw, "w1", &mac(GW_MAC)).unwrap();
    lb.ip(&["addr", "add", "10.205.0.2/24", "dev", "w0"])
        .unwrap();
    gw.ip(&["addr", "add", "10.205.0.1/24", "dev", "w1"])
        .unwrap();
    lb.ip(&["route", "add", "10.205.8.0/24", "via", "10.205.0.1"])
        .unwrap();
    lb.ip(&["route", "add", "10.205.9.0/24", "via", "10.205.0.9"])
        .unwrap();
    // The gateway announces a MAC change, as routers do.
    gw.sysctl("net.ipv4.conf.w1.arp_notify", "1").unwrap();
    Net { lb, gw }
}

/// `fastpath lb run` in the load balancer's namespace.
struct Lb {
    child: Child,
    config: std::path::PathBuf,
}

impl Lb {
    fn start(n: &Net, tag: &str, text: &str) -> Lb {
        let config = std::env::temp_dir().join(format!("fpgw-{tag}-{}.toml", std::process::id()));
        std::fs::write(&config, text).unwrap();
        let child =
            n.lb.command(env!("CARGO_BIN_EXE_fastpath"))
                .args(["lb", "run", "--config"])
                .arg(&config)
                .args([
                    "--interface",
                    "w0",
                    "--driver",
                    "af-packet",
                    "--threads",
                    "1",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
        Lb { child, config }
    }

    /// Rewrites the configuration and reloads it (SIGHUP).
    fn reload(&self, text: &str) {
        std::fs::write(&self.config, text).unwrap();
        // SAFETY: kill(2) on our own, unreaped child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGHUP) };
    }

    /// Stops it (SIGTERM); what it logged.
    fn stop(mut self) -> String {
        // SAFETY: kill(2) on our own, unreaped child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        assert!(status.success(), "{status}: {err}");
        err
    }
}

impl Drop for Lb {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.config);
    }
}

/// `fastpath lb status --format json` inside the namespace, once the API
/// answers (at most 15 s).
fn status(n: &Net) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out =
            n.lb.command(env!("CARGO_BIN_EXE_fastpath"))
                .args(["lb", "status", "--api", API, "--format", "json"])
                .output()
                .unwrap();
        if out.status.success() {
            return serde_json::from_slice(&out.stdout).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "no /status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `fastpath lb status` as a person reads it.
fn status_text(n: &Net) -> String {
    let out =
        n.lb.command(env!("CARGO_BIN_EXE_fastpath"))
            .args(["lb", "status", "--api", API])
            .output()
            .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Waits (at most `limit`) until `/status`'s gateway satisfies `f`.
fn gateway_until(
    n: &Net,
    limit: Duration,
    f: &dyn Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let g = status(n)["gateway"].clone();
        if f(&g) {
            return g;
        }
        assert!(
            Instant::now() < deadline,
            "gateway still {g} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The gateway's end of the pair.
struct Probe {
    socket: RawSocket,
    sent: std::cell::Cell<u16>,
}

impl Probe {
    /// Opens it on `iface` of the calling thread's namespace.
    fn open(iface: &str) -> Probe {
        Probe {
            socket: RawSocket::open(iface),
            sent: std::cell::Cell::new(0),
        }
    }

    /// Sends a UDP frame for the VIP (from the gateway's MAC `from`) and
    /// returns the Ethernet destination and source of the GRE frame that
    /// carries it back (none: nothing in 1 s).
    fn forward(&self, from: [u8; 6]) -> Option<([u8; 6], [u8; 6])> {
        let n = self.sent.get() + 1;
        self.sent.set(n);
        let payload = format!("gateway probe {n} {}", std::process::id());
        let mut f = Frame::udp(
            [10, 9, 0, 1].into(),
            VIP.into(),
            10_000 + n,
            53,
            payload.as_bytes(),
        );
        f.eth.dst = LB_MAC;
        f.eth.src = from;
        self.socket.send(&f.to_bytes());
        let (b, _) = self.socket.receive_matching(Duration::from_secs(1), |b| {
            let gre = b.len() > 34 && b[12..14] == [0x08, 0x00] && b[23] == 47;
            gre && b.windows(payload.len()).any(|w| w == payload.as_bytes())
        })?;
        let dst: [u8; 6] = b[0..6].try_into().unwrap();
        let src: [u8; 6] = b[6..12].try_into().unwrap();
        Some((dst, src))
    }
}

#[test]
#[ignore = "system test: root, namespaces"]
fn the_next_hop_is_resolved_followed_and_reported() {
    systest::require_netns();
    let n = net();
    let probe = n.gw.inside(|| Probe::open("w1")).unwrap();
    let lb = Lb::start(&n, "a", &config(&["10.205.8.5", "10.205.8.6"]));

    // Resolved at start: /status says what and from where.
    let g = gateway_until(&n, Duration::from_secs(10), &|g| g["source"] == "resolved");
    assert_eq!(g["mac"], mac(GW_MAC), "{g}");
    assert_eq!(g["address"], "10.205.0.1", "{g}");
    assert_eq!(g["toward"], "10.205.8.5", "{g}");
    assert_eq!(g["interface"], "w0", "{g}");
    assert!(g["error"].is_null() && g["warning"].is_null(), "{g}");
    let text = status_text(&n);
    assert!(
        text.contains(&format!(
            "gateway: {} (resolved: next hop 10.205.0.1 on w0",
            mac(GW_MAC)
        )),
        "{text}"
    );
    // And the frames go there, from the interface's own MAC.
    assert_eq!(probe.forward(GW_MAC), Some((GW_MAC, LB_MAC)));

    // A reload keeps both MACs (the interface's was lost on reload before).
    lb.reload(&config(&["10.205.8.5", "10.205.8.6", "10.205.8.7"]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while status(&n)["reloads"] != 1 {
        assert!(Instant::now() < deadline, "the reload was not applied");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(probe.forward(GW_MAC), Some((GW_MAC, LB_MAC)));

    // The gateway changes its MAC: picked up at a re-check, swapped in.
    n.gw.ip(&["link", "set", "dev", "w1", "address", &mac(GW_NEW_MAC)])
        .unwrap();
    let t = Instant::now();
    gateway_until(&n, Duration::from_secs(15), &|g| {
        g["mac"] == mac(GW_NEW_MAC)
    });
    eprintln!(
        "the new gateway MAC was in /status after {:.1?}",
        t.elapsed()
    );
    assert_eq!(probe.forward(GW_NEW_MAC), Some((GW_NEW_MAC, LB_MAC)));

    // Backends behind another next hop as well: a warning, frames still to
    // the first backend's next hop.
    lb.reload(&config(&["10.205.8.5", "10.205.9.5"]));
    let g = gateway_until(&n, Duration::from_secs(10), &|g| !g["warning"].is_null());
    let w = g["warning"].as_str().unwrap();
    assert!(w.contains("10.205.9.5 via next hop 10.205.0.9"), "{w}");
    assert_eq!(g["mac"], mac(GW_NEW_MAC), "{g}");
    assert!(status_text(&n).contains("gateway warning: backends route through different next hops"));

    // The first backend's next hop does not answer: unresolved, said so.
    lb.reload(&config(&["10.205.9.5"]));
    let g = gateway_until(&n, Duration::from_secs(10), &|g| {
        g["source"] == "unresolved"
    });
    assert_eq!(g["address"], "10.205.0.9", "{g}");
    let e = g["error"].as_str().unwrap();
    assert!(e.contains("10.205.0.9") && e.contains("w0"), "{e}");
    // The tables keep the last MAC resolved (the next hop may only be slow
    // to answer), and the status says so.
    assert_eq!(g["mac"], mac(GW_NEW_MAC), "{g}");
    let text = status_text(&n);
    for want in [
        "gateway: UNRESOLVED on w0",
        "still go to 02:00:00:00:5c:fd, the last MAC resolved",
        "ip route get 10.205.9.5",
        "gateway_mac",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
    assert_eq!(probe.forward(GW_NEW_MAC), Some((GW_NEW_MAC, LB_MAC)));
    lb.stop();

    // Unresolvable from the start: the log says so at once, naming the
    // interface, the address and what to do; frames carry the placeholder.
    let lb = Lb::start(&n, "b", &config(&["10.205.9.5"]));
    let g = gateway_until(&n, Duration::from_secs(10), &|g| {
        g["source"] == "unresolved"
    });
    assert_eq!(g["toward"], "10.205.9.5", "{g}");
    assert!(g["mac"].is_null(), "{g}");
    let text = status_text(&n);
    assert!(
        text.contains("go to the placeholder 02:00:00:00:00:fe and are LOST"),
        "{text}"
    );
    assert_eq!(probe.forward(GW_NEW_MAC), Some((PLACEHOLDER, LB_MAC)));
    // The next hop appears: found at a retry, no reload needed.
    n.gw.ip(&["addr", "add", "10.205.0.9/24", "dev", "w1"])
        .unwrap();
    let t = Instant::now();
    let g = gateway_until(&n, Duration::from_secs(10), &|g| g["source"] == "resolved");
    eprintln!(
        "the next hop was resolved {:.1?} after it appeared",
        t.elapsed()
    );
    assert_eq!(
        (g["mac"].as_str(), g["address"].as_str()),
        (Some(mac(GW_NEW_MAC).as_str()), Some("10.205.0.9"))
    );
    assert_eq!(probe.forward(GW_NEW_MAC), Some((GW_NEW_MAC, LB_MAC)));
    let log = lb.stop();
    let line = log
        .lines()
        .find(|l| l.contains("cannot resolve the next hop's MAC"))
        .unwrap_or_else(|| panic!("no start-up line about the gateway in:\n{log}"));
    for want in [
        "on w0 towards backend 10.205.9.5",
        "10.205.0.9",
        "ip route get 10.205.9.5",
        "gateway_mac",
        "02:00:00:00:00:fe",
    ] {
        assert!(line.contains(want), "{want:?} missing in {line}");
    }
    assert!(
        log.contains(&format!(
            "gateway: next hop 10.205.0.9 on w0 is {}",
            mac(GW_NEW_MAC)
        )),
        "{log}"
    );
    // No ANSI colour in a log that is not a terminal.
    assert!(!log.contains('\u{1b}'), "{log}");
}

/// Logs carry colour only on a terminal, and not even there with NO_COLOR
/// set, as command-line tools should behave. The daemon runs under `script`, which gives
/// it a pseudo-terminal: it logs the unresolvable gateway, then stops at
/// once on an API address it cannot bind (the namespace does not have it;
/// a missing token file no longer gets that far: the configuration is
/// refused before the gateway is looked for).
#[test]
#[ignore = "system test: root, namespaces"]
fn logs_have_colour_only_on_a_terminal_without_no_color() {
    systest::require_netns();
    systest::require_program("script");
    let ns = Netns::new(&format!("fpgw-c-{}", std::process::id() % 100_000)).unwrap();
    let path = std::env::temp_dir().join(format!("fpgw-colour-{}.toml", std::process::id()));
    let token = std::env::temp_dir().join(format!("fpgw-colour-{}.token", std::process::id()));
    std::fs::write(&token, "a-token-long-enough-to-pass\n").unwrap();
    std::fs::write(
        &path,
        config(&["10.205.8.5"]).replace(
            &format!("listen = \"{API}\""),
            &format!(
                "listen = \"10.205.99.1:9185\"\ntoken_file = \"{}\"",
                token.display()
            ),
        ),
    )
    .unwrap();
    let run = |no_color: Option<&str>| -> String {
        let inner = format!(
            "{}ip netns exec {} {} lb run --config {} --interface lo --driver af-packet --threads 0",
            no_color.map(|v| format!("NO_COLOR={v} ")).unwrap_or_default(),
            ns.name(),
            env!("CARGO_BIN_EXE_fastpath"),
            path.display()
        );
        let out = std::process::Command::new("timeout")
            .args(["20", "script", "-q", "-e", "-c", &inner, "/dev/null"])
            .env_remove("NO_COLOR")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            text.contains("cannot resolve the next hop's MAC")
                && text.contains("cannot serve the HTTP API on 10.205.99.1:9185"),
            "{text}"
        );
        text
    };
    let coloured = run(None);
    assert!(
        coloured.contains("\u{1b}["),
        "no colour on a terminal: {coloured}"
    );
    for v in ["1", "yes"] {
        let plain = run(Some(v));
        assert!(!plain.contains("\u{1b}["), "NO_COLOR={v}: {plain}");
    }
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&token);
}

/// A dual-stack pool behind one router: the IPv6 backends' next hop is
/// the router's IPv6 address, necessarily another address than the IPv4
/// one, but the same MAC. That is no "different next hops": no warning,
/// although the load balancer's kernel had never talked IPv6 to the
/// router (its MAC is resolved, not only looked up).
#[test]
#[ignore = "system test: root, namespaces"]
fn a_dual_stack_pool_through_one_router_is_not_warned_about() {
    systest::require_netns();
    let id = std::process::id() % 100_000;
    let lb_ns = Netns::new(&format!("fpgw6-l-{id}")).unwrap();
    let gw = Netns::new(&format!("fpgw6-g-{id}")).unwrap();
    for ns in [&lb_ns, &gw] {
        for k in ["all", "default"] {
            ns.sysctl(&format!("net.ipv6.conf.{k}.disable_ipv6"), "0")
                .unwrap();
        }
    }
    netns::veth(&lb_ns, "w0", &mac(LB_MAC), &gw, "w1", &mac(GW_MAC)).unwrap();
    lb_ns
        .ip(&["addr", "add", "10.205.0.2/24", "dev", "w0"])
        .unwrap();
    gw.ip(&["addr", "add", "10.205.0.1/24", "dev", "w1"])
        .unwrap();
    lb_ns
        .ip(&["-6", "addr", "add", "fd05::2/64", "dev", "w0", "nodad"])
        .unwrap();
    gw.ip(&["-6", "addr", "add", "fd05::1/64", "dev", "w1", "nodad"])
        .unwrap();
    lb_ns
        .ip(&["route", "add", "10.205.8.0/24", "via", "10.205.0.1"])
        .unwrap();
    lb_ns
        .ip(&["-6", "route", "add", "fd08::/64", "via", "fd05::1"])
        .unwrap();
    let n = Net { lb: lb_ns, gw };
    let text = config(&["10.205.8.5", "fd08::5", "10.205.8.6", "fd08::6"])
        .replace("[encap]\n", "[encap]\nsource6 = \"fd05::2\"\n");
    let lb = Lb::start(&n, "dual", &text);
    let g = gateway_until(&n, Duration::from_secs(10), &|g| g["source"] == "resolved");
    assert_eq!(g["mac"], mac(GW_MAC), "{g}");
    assert!(g["warning"].is_null(), "a false warning: {g}");
    assert!(
        !status_text(&n).contains("gateway warning"),
        "{}",
        status_text(&n)
    );
    lb.stop();
}
