//! The load balancer on real interfaces, end to end, in namespaces this test
//! creates and removes: a client makes real HTTP requests to the VIP; the
//! router sends them to the load balancer, which forwards them with
//! AF_PACKET as GRE to two backends; each backend decapsulates with
//! `fastpath lb decap` into a TUN device, serves the request from its own
//! TCP stack (the VIP is on its loopback), and answers the client directly
//! (direct server return).
//!
//! ```text
//! client 10.10.1.2 -- 10.10.1.1 router 10.10.2.1 -- 10.10.2.2 lb (AF_PACKET)
//!                               router 10.10.3.1 -- 10.10.3.2 backend 1 (VIP on lo, decap)
//!                               router 10.10.4.1 -- 10.10.4.2 backend 2 (VIP on lo, decap)
//! ```

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use netio::netns::{self, Netns};

const VIP: &str = "192.0.2.80";

/// Children stopped with SIGTERM (and reaped) when the test ends, also on
/// panic; their output is kept for the assertions.
struct Procs(Vec<(String, Child)>);

impl Procs {
    fn stop(&mut self, name: &str) -> String {
        let Some(i) = self.0.iter().position(|(n, _)| n == name) else {
            return String::new();
        };
        let (_, mut c) = self.0.remove(i);
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let out = c.wait_with_output().expect("reaping a child");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        let names: Vec<String> = self.0.iter().map(|(n, _)| n.clone()).collect();
        for n in names {
            self.stop(&n);
        }
    }
}

fn spawn(ns: &Netns, args: &[&str]) -> Child {
    let mut c = ns.command(args[0]);
    c.args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn()
        .unwrap_or_else(|e| panic!("spawning {args:?} in {}: {e}", ns.name()))
}

#[test]
fn http_through_the_vip_with_direct_server_return() {
    assert!(
        netns::available(),
        "this test needs root and iproute2 (run scripts/setup.sh as root)"
    );
    let id = std::process::id() % 100_000;
    let n = |s: &str| Netns::new(&format!("fp{s}{id}")).unwrap();
    let (cli, rtr, lb, be1, be2) = (n("c"), n("r"), n("l"), n("b1-"), n("b2-"));
    for ns in [&cli, &rtr, &lb, &be1, &be2] {
        for k in ["all", "default"] {
            ns.sysctl(&format!("net.ipv4.conf.{k}.rp_filter"), "0")
                .unwrap();
        }
    }
    netns::veth(
        &cli,
        "c0",
        "02:00:00:00:01:02",
        &rtr,
        "r1",
        "02:00:00:00:01:01",
    )
    .unwrap();
    netns::veth(
        &lb,
        "l0",
        "02:00:00:00:02:02",
        &rtr,
        "r2",
        "02:00:00:00:02:01",
    )
    .unwrap();
    netns::veth(
        &be1,
        "b0",
        "02:00:00:00:03:02",
        &rtr,
        "r3",
        "02:00:00:00:03:01",
    )
    .unwrap();
    netns::veth(
        &be2,
        "b0",
        "02:00:00:00:04:02",
        &rtr,
        "r4",
        "02:00:00:00:04:01",
    )
    .unwrap();
    for (ns, dev, addr) in [
        (&cli, "c0", "10.10.1.2/24"),
        (&rtr, "r1", "10.10.1.1/24"),
        (&lb, "l0", "10.10.2.2/24"),
        (&rtr, "r2", "10.10.2.1/24"),
        (&be1, "b0", "10.10.3.2/24"),
        (&rtr, "r3", "10.10.3.1/24"),
        (&be2, "b0", "10.10.4.2/24"),
        (&rtr, "r4", "10.10.4.1/24"),
    ] {
        ns.ip(&["addr", "add", addr, "dev", dev]).unwrap();
    }
    // The client's veth leaves transport checksums to offload; the load
    // balancer's AF_PACKET port completes them (TP_STATUS_CSUMNOTREADY), so
    // no ethtool tweak is needed here.
    rtr.sysctl("net.ipv4.ip_forward", "1").unwrap();
    // No static route to the VIP: the router learns it from the load
    // balancer over BGP.
    cli.ip(&["route", "add", "default", "via", "10.10.1.1"])
        .unwrap();
    lb.ip(&["route", "add", "default", "via", "10.10.2.1"])
        .unwrap();

    let dir = std::env::temp_dir().join(format!("fp-ns-test-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut procs = Procs(Vec::new());
    // BIRD on the router (installs what it learns into its kernel) and on
    // the load balancer (a static protocol, disabled until fastpath enables
    // it, holding the VIP routes fastpath writes).
    let vips_file = dir.join("vips.conf");
    std::fs::write(&vips_file, "# filled in by fastpath\n").unwrap();
    let timers = "connect delay time 1; connect retry time 1; hold time 9; keepalive time 3;";
    let bird_conf = [
        (
            &rtr,
            "rtr",
            format!(
                "router id 10.10.2.1;\nprotocol device {{}}\nprotocol kernel {{ ipv4 {{ import none; export all; }}; }}\n\
                 protocol bgp lb1 {{ local 10.10.2.1 as 65000; neighbor 10.10.2.2 as 65001; {timers} ipv4 {{ import all; export none; }}; }}\n"
            ),
        ),
        (
            &lb,
            "lb",
            format!(
                "router id 10.10.2.2;\nprotocol device {{}}\nprotocol static fastpath_vips {{\n  disabled;\n  ipv4;\ninclude \"{}\";\n}}\n\
                 protocol bgp uplink {{ local 10.10.2.2 as 65001; neighbor 10.10.2.1 as 65000; {timers} ipv4 {{ import none; export where proto = \"fastpath_vips\"; }}; }}\n",
                vips_file.display()
            ),
        ),
    ];
    for (ns, name, conf) in bird_conf {
        let path = dir.join(format!("bird-{name}.conf"));
        std::fs::write(&path, conf).unwrap();
        let sock = dir.join(format!("bird-{name}.ctl"));
        procs.0.push((
            format!("bird-{name}"),
            spawn(
                ns,
                &[
                    "bird",
                    "-f",
                    "-c",
                    path.to_str().unwrap(),
                    "-s",
                    sock.to_str().unwrap(),
                    "-P",
                    dir.join(format!("bird-{name}.pid")).to_str().unwrap(),
                ],
            ),
        ));
    }
    let lb_birdc = dir.join("bird-lb.ctl");
    for (i, (be, gw)) in [(&be1, "10.10.3.1"), (&be2, "10.10.4.1")]
        .into_iter()
        .enumerate()
    {
        be.ip(&["route", "add", "default", "via", gw]).unwrap();
        be.ip(&["addr", "add", &format!("{VIP}/32"), "dev", "lo"])
            .unwrap();
        let docroot = dir.join(format!("be{}", i + 1));
        std::fs::create_dir_all(&docroot).unwrap();
        std::fs::write(docroot.join("index.html"), format!("backend-{}\n", i + 1)).unwrap();
        procs.0.push((
            format!("decap{}", i + 1),
            spawn(
                be,
                &[
                    env!("CARGO_BIN_EXE_fastpath"),
                    "lb",
                    "decap",
                    "--tun",
                    "fpdecap0",
                ],
            ),
        ));
        procs.0.push((
            format!("http{}", i + 1),
            spawn(
                be,
                &[
                    "python3",
                    "-m",
                    "http.server",
                    "80",
                    "--bind",
                    "0.0.0.0",
                    "--directory",
                    docroot.to_str().unwrap(),
                ],
            ),
        ));
    }
    let cfg = dir.join("lb.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[forwarder]
threads = 0
queue_size = 256
pool_buffers = 4096
[api]
listen = "127.0.0.1:9180"
[bgp]
vips_file = "{vips}"
birdc = ["birdc", "-s", "{birdc}"]
poll_ms = 200
[encap]
source = "10.10.2.2"
gateway_mac = "02:00:00:00:02:01"
[[pools]]
name = "web"
backends = [{{ address = "10.10.3.2" }}, {{ address = "10.10.4.2" }}]
health = {{ kind = "http", port = 80, interval_ms = 200, timeout_ms = 300, rise = 2, fall = 2 }}
[[vips]]
name = "http"
address = "{VIP}"
port = 80
protocol = "tcp"
pool = "web"
"#,
            vips = vips_file.display(),
            birdc = lb_birdc.display(),
        ),
    )
    .unwrap();
    procs.0.push((
        "lb".into(),
        spawn(
            &lb,
            &[
                env!("CARGO_BIN_EXE_fastpath"),
                "lb",
                "run",
                "--config",
                cfg.to_str().unwrap(),
                "--interface",
                "l0",
            ],
        ),
    ));

    // Real HTTP requests from the client, from different source ports.
    let curl = |timeout: &str| {
        cli.command("curl")
            .args(["-s", "-m", timeout, &format!("http://{VIP}/")])
            .output()
            .expect("curl must be installed")
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !curl("1").status.success() {
        if Instant::now() > deadline {
            let names: Vec<String> = procs.0.iter().map(|(n, _)| n.clone()).collect();
            let logs: Vec<String> = names
                .iter()
                .map(|n| format!("--- {n}:\n{}", procs.stop(n)))
                .collect();
            panic!("no answer through the VIP within 20 s\n{}", logs.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut answers: HashMap<String, u32> = HashMap::new();
    for _ in 0..30 {
        let out = curl("3");
        assert!(out.status.success(), "a request through the VIP failed");
        *answers
            .entry(String::from_utf8_lossy(&out.stdout).trim().to_string())
            .or_insert(0) += 1;
    }
    assert_eq!(answers.values().sum::<u32>(), 30);
    assert!(
        answers.keys().all(|k| k == "backend-1" || k == "backend-2") && answers.len() == 2,
        "both backends answer, nobody else: {answers:?}"
    );

    // The API: metrics and status from inside the load balancer's namespace.
    let api = |path: &str, method: &str| {
        let out = lb
            .command("curl")
            .args([
                "-s",
                "-m",
                "3",
                "-X",
                method,
                &format!("http://127.0.0.1:9180{path}"),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let wait_for = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(8);
        while !f() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; metrics:\n{}",
                api("/metrics", "GET")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    if api("/metrics", "GET").is_empty() {
        panic!(
            "the API does not answer; load balancer's log:\n{}",
            procs.stop("lb")
        );
    }
    wait_for("per-VIP metrics", &|| {
        api("/metrics", "GET")
            .lines()
            .find(|l| l.starts_with("fastpath_lb_vip_packets_total{vip=\"http\"}"))
            .and_then(|l| l.split_whitespace().last()?.parse::<u64>().ok())
            .is_some_and(|v| v >= 90)
    });
    let status = lb
        .command(env!("CARGO_BIN_EXE_fastpath"))
        .args(["lb", "status", "--api", "127.0.0.1:9180"])
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(
        status.contains("10.10.3.2")
            && status.contains("10.10.4.2")
            && status.contains("(2 healthy)"),
        "{status}"
    );

    // Failover: backend 1's server stops; its health check fails, it leaves
    // the Maglev table, and every request goes to backend 2.
    procs.stop("http1");
    wait_for("backend 1 marked down", &|| {
        api("/metrics", "GET")
            .contains("fastpath_lb_backend_healthy{backend=\"10.10.3.2\",address=\"10.10.3.2\"} 0")
    });
    for _ in 0..10 {
        let out = curl("3");
        assert!(
            out.status.success(),
            "requests keep working after the failover"
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "backend-2");
    }

    // A broken configuration is rejected whole, with the reason, and
    // traffic keeps flowing on the running one.
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        good.replace("pool = \"web\"", "pool = \"nonexistent\""),
    )
    .unwrap();
    let answer = api("/reload", "POST");
    assert!(
        answer.contains("error")
            && answer.contains("vips[0].pool")
            && answer.contains("nonexistent"),
        "{answer}"
    );
    assert!(
        curl("3").status.success(),
        "traffic flows after a rejected reload"
    );
    assert!(api("/metrics", "GET").contains("fastpath_lb_reload_failures_total 1"));
    // A good configuration applies, here on SIGHUP.
    std::fs::write(&cfg, &good).unwrap();
    let lb_pid = procs
        .0
        .iter()
        .find(|(n, _)| n == "lb")
        .map(|(_, c)| c.id())
        .unwrap();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(lb_pid as i32, libc::SIGHUP) };
    wait_for("the SIGHUP reload", &|| {
        api("/metrics", "GET").contains("fastpath_lb_reloads_total 1")
    });
    assert!(curl("3").status.success());

    // The router learned the VIP from the load balancer over BGP.
    let route = || {
        String::from_utf8_lossy(
            &rtr.ip(&["route", "show", &format!("{VIP}/32")])
                .unwrap()
                .stdout,
        )
        .to_string()
    };
    assert!(
        route().contains("via 10.10.2.2"),
        "router's route: {}",
        route()
    );
    let learned = Command::new("birdc")
        .args([
            "-s",
            dir.join("bird-rtr.ctl").to_str().unwrap(),
            "show",
            "route",
            "for",
            VIP,
            "all",
        ])
        .output()
        .unwrap();
    let learned = String::from_utf8_lossy(&learned.stdout).to_string();
    assert!(
        learned.contains("lb1") && learned.contains("BGP") && learned.contains("65001"),
        "the router's BIRD: {learned}"
    );
    assert!(api("/status", "GET").contains("\"bgp_announced\":true"));

    // Stopping the load balancer withdraws the VIP: the router loses the route.
    let lb_out = procs.stop("lb");
    let deadline = Instant::now() + Duration::from_secs(10);
    while route().contains("10.10.2.2") {
        assert!(
            Instant::now() < deadline,
            "the router still routes the VIP to a stopped load balancer"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let d1 = procs.stop("decap1");
    let d2 = procs.stop("decap2");
    // The load balancer saw and forwarded the requests; the backends
    // decapsulated them.
    assert!(lb_out.contains("forwarded (GRE)"), "{lb_out}");
    let forwarded: u64 = lb_out
        .lines()
        .find(|l| l.starts_with("forwarded (GRE)"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        forwarded >= 31 * 3,
        "at least a SYN, a request and an ACK per connection: {lb_out}"
    );
    for d in [&d1, &d2] {
        assert!(
            d.contains("delivered") && !d.contains("delivered 0 "),
            "{d}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
