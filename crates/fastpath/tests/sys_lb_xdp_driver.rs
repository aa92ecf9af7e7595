//! The load balancer in the driver (`[forwarder] driver = "xdp"`, issue
//! 15): real HTTP from a client namespace through the VIP to the nginx
//! backends, with the TCP connections forwarded by the XDP program (the
//! daemon's counters say the driver forwarded them) and everything else
//! (ARP, health checks, the client's checksum-offloaded segments) still
//! handled. Then a backend goes down through its health check: the
//! driver's maps follow the tables, and new connections avoid it.

mod common;

use std::time::Duration;

use lab::topology::Topology;

/// Starts load balancer 1 with its configuration as `edit` makes it and
/// `driver = "xdp"`, and waits until the VIP answers, with the load
/// balancer in the driver.
fn start_in_the_driver(t: &mut Topology, edit: impl FnOnce(String) -> String) {
    let cfg = &t.configs[0];
    let text = edit(std::fs::read_to_string(cfg).unwrap());
    std::fs::write(
        cfg,
        text.replacen("[forwarder]\n", "[forwarder]\ndriver = \"xdp\"\n", 1),
    )
    .unwrap();
    t.start_lb().unwrap();
    t.wait_for_vip(Duration::from_secs(20)).unwrap();
    let status = t.status_of(1).unwrap();
    assert!(
        status.driver.contains("in the driver"),
        "driver: {}",
        status.driver
    );
}

fn status_json(t: &Topology) -> serde_json::Value {
    serde_json::from_str(&t.api("GET", "/status").unwrap()).unwrap()
}

/// 40 HTTP requests through the VIP, each on a new connection, all
/// answered, by both backends; `/status` from before them.
fn forty_requests_to_both_backends(t: &Topology) -> serde_json::Value {
    let before = status_json(t);
    let by = t.requests(40).unwrap();
    assert_eq!(by.get(""), None, "no request failed: {by:?}");
    assert_eq!(by.len(), 2, "both backends answered: {by:?}");
    before
}

fn forwarded(v: &serde_json::Value) -> u64 {
    v["forwarded"].as_u64().unwrap_or(0)
}

fn in_driver(v: &serde_json::Value) -> u64 {
    v["forwarded_in_driver"].as_u64().unwrap_or(0)
}

/// `/status` once `enough` says so of it, or after 3 s (the counters
/// reach the daemon's within a publication interval).
fn status_once(t: &Topology, enough: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let s = status_json(t);
        if enough(&s) || std::time::Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "system test: root, namespaces, XDP, nginx"]
fn http_through_the_load_balancer_in_the_driver() {
    // Two topologies with nginx and XDP at once on 2 cores made a request
    // miss its timeout once.
    let _one = systest::exclusive();
    let mut t = common::topology(1, 2, "xdpd");
    start_in_the_driver(&mut t, |text| text);
    let before = forty_requests_to_both_backends(&t);
    // 40 connections of several segments each from the client, through
    // the driver: its counters reach the daemon's within a publication
    // interval (100 ms).
    let after = status_once(&t, |s| forwarded(s) - forwarded(&before) >= 40 * 3);
    let n = forwarded(&after) - forwarded(&before);
    assert!(n >= 40 * 3, "forwarded {n}: {after}");
    let per_backend: u64 = after["vips"][0]["backends"]
        .as_array()
        .map(|a| a.iter().filter_map(|b| b["packets"].as_u64()).sum())
        .unwrap_or(0);
    assert!(
        per_backend >= n,
        "per-backend packets {per_backend} < {n}: {after}"
    );
    // The driver forwarded them, not the packet threads: every segment of
    // these connections is plain IPv4 TCP to the VIP.
    let d = in_driver(&after) - in_driver(&before);
    assert!(d >= n, "the driver forwarded {d} of {n}: {after}");

    // Failover: backend 1's nginx stops, its health check takes it out of
    // the tables, the driver's maps follow, and every new connection goes
    // to backend 2.
    t.procs.stop("nginx1");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while t
        .api("GET", "/metrics")
        .unwrap_or_default()
        .contains("fastpath_lb_backend_healthy{backend=\"10.10.3.2\",address=\"10.10.3.2\"} 1")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "backend 1 never marked down"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = status_json(&t);
    let by = t.requests(30).unwrap();
    assert_eq!(
        by.get(""),
        None,
        "no request failed after the failover: {by:?}"
    );
    assert!(!by.contains_key("backend-1") && by.len() == 1, "{by:?}");
    std::thread::sleep(Duration::from_millis(300));
    let after = status_json(&t);
    let d = in_driver(&after) - in_driver(&before);
    assert!(
        d >= 30 * 3,
        "after the failover the driver forwarded {d}: {after}"
    );
}

/// A prefix-group VIP (paper section 4.2: the VIP is a suffix within a
/// group's prefixes, matched by longest prefix, not listed as an address)
/// through the driver: the daemon starts with `driver = "xdp"` (it used to
/// refuse), the XDP program forwards the connections itself (its
/// longest-prefix trie picks the group, the suffix map the VIP), and what
/// it leaves to user space reaches the packet threads through the
/// steering prefix trie. Prefix groups are not announced through BGP, so
/// the router gets a static route to the group's prefix.
#[test]
#[ignore = "system test: root, namespaces, XDP, nginx"]
fn http_to_a_prefix_group_vip_through_the_driver() {
    // Two topologies with nginx and XDP at once on 2 cores made a request
    // miss its timeout once.
    let _one = systest::exclusive();
    let mut t = common::topology(1, 2, "xdpg");
    let vip = lab::topology::VIP;
    t.router
        .ip(&[
            "route",
            "replace",
            "198.18.0.0/24",
            "via",
            &Topology::lb_address(1),
            "proto",
            "static",
        ])
        .unwrap();
    start_in_the_driver(&mut t, |text| {
        let listed = format!("name = \"http\"\naddress = \"{vip}\"\n");
        assert!(text.contains(&listed), "{text}");
        text.replacen(
            &listed,
            "name = \"http\"\nprefix_group = \"front\"\nsuffix = \"0.0.0.80\"\n",
            1,
        ) + "\n[[prefix_groups]]\nname = \"front\"\nprefixes = [\"198.18.0.0/24\"]\ncluster_prefix_len = 24\n"
    });
    let before = forty_requests_to_both_backends(&t);
    let after = status_once(&t, |s| in_driver(s) - in_driver(&before) >= 40 * 3);
    let d = in_driver(&after) - in_driver(&before);
    let n = forwarded(&after) - forwarded(&before);
    assert!(
        d >= 40 * 3 && d <= n,
        "the driver forwarded {d} of {n} to the prefix-group VIP: {after}"
    );
    // What the driver leaves to user space reaches the packet threads
    // through the steering trie: connections whose every segment carries
    // IPv4 options (four NOPs, set on the client's socket) are not
    // forwarded in the driver; without the trie they would go to the load
    // balancer's kernel and never be answered.
    let before = status_json(&t);
    let answers: Vec<Result<String, String>> = Topology::inside(&t.client, move || {
        (0..10).map(|_| get_with_ip_options(vip)).collect()
    })
    .unwrap();
    let ok: Vec<&String> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
    assert_eq!(ok.len(), 10, "requests with IP options: {answers:?}");
    assert!(ok.iter().all(|b| b.starts_with("backend-")), "{answers:?}");
    let user = |after: &serde_json::Value| {
        (forwarded(after) - forwarded(&before))
            .saturating_sub(in_driver(after) - in_driver(&before))
    };
    let after = status_once(&t, |s| user(s) >= 10 * 3);
    let user = user(&after);
    assert!(
        user >= 10 * 3,
        "the packet threads forwarded {user} segments with options: {after}"
    );
}

/// GET / from a new connection to `vip`:80 whose segments carry IPv4
/// options (four NOPs); the answer's body.
fn get_with_ip_options(vip: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let addr: std::net::Ipv4Addr = vip.parse().map_err(|e| format!("{vip}: {e}"))?;
    let err = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: a plain socket(2); the descriptor is owned at once below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(err("socket"));
    }
    // SAFETY: `raw` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let nops = [1u8; 4];
    // SAFETY: `nops` outlives the call, whose length argument is its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_OPTIONS,
            nops.as_ptr().cast(),
            nops.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(err("IP_OPTIONS"));
    }
    // connect(2) and every read and write give up after 2 s (Linux
    // bounds a blocking connect by SO_SNDTIMEO).
    let limit = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    for opt in [libc::SO_SNDTIMEO, libc::SO_RCVTIMEO] {
        // SAFETY: `limit` outlives the call, whose length is its size.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                std::ptr::from_ref(&limit).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(err("SO_SNDTIMEO/SO_RCVTIMEO"));
        }
    }
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 80u16.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `sin` is a whole sockaddr_in and the length says so.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            std::ptr::from_ref(&sin).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(err("connect"));
    }
    let mut s = std::net::TcpStream::from(fd);
    s.write_all(b"GET / HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.trim().to_string())
        .ok_or_else(|| format!("no HTTP answer: {answer:?}"))?;
    Ok(body)
}

/// A reload whose tables the driver's maps cannot hold (the pool's
/// Maglev table grown to 1,000,003 slots, beyond the room the maps were
/// loaded with) used to be answered 200 and turn the driver off until a
/// restart, every frame going to the packet threads. It is refused whole
/// now, saying a restart is needed; the configuration generation stays,
/// and new connections are still forwarded in the driver.
#[test]
#[ignore = "system test: root, namespaces, XDP, nginx"]
fn a_reload_the_drivers_maps_cannot_hold_is_refused_and_the_driver_keeps_forwarding() {
    let _one = systest::exclusive();
    let mut t = common::topology(1, 2, "xdpr");
    start_in_the_driver(&mut t, |text| text);
    let cfg = t.configs[0].clone();
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("[[pools]]\nname = \"web\"\n"), "{text}");
    std::fs::write(
        &cfg,
        text.replacen(
            "[[pools]]\nname = \"web\"\n",
            "[[pools]]\nname = \"web\"\ntable_size = 1000003\n",
            1,
        ),
    )
    .unwrap();
    let answer = t.api("POST", "/reload").unwrap();
    assert!(
        answer.contains("\"error\"")
            && answer.contains("pools.table_size")
            && answer.contains("restart"),
        "{answer}"
    );
    let before = forty_requests_to_both_backends(&t);
    assert_eq!(before["generation"], 1, "{before}");
    let after = status_once(&t, |s| in_driver(s) - in_driver(&before) >= 40 * 3);
    let d = in_driver(&after) - in_driver(&before);
    assert!(
        d >= 40 * 3,
        "after the refused reload the driver forwarded {d}: {after}"
    );
    // The file put back: a reload applies.
    std::fs::write(&cfg, &text).unwrap();
    let answer = t.api("POST", "/reload").unwrap();
    assert!(answer.contains("\"generation\":2"), "{answer}");
}
