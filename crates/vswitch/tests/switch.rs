//! The switch with ports attached through its control socket, as separate
//! processes would attach (here: threads of the test).

mod common;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::ring_port::{mac, recv, send};
use ring::control::{attach, status, AttachRequest, Attached};
use ring::Mode;
use vswitch::pktgen::udp_frame;
use vswitch::{spawn, Config, Switch};

fn sock(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("fp-sw-{tag}-{}.sock", std::process::id()))
}

fn start(
    tag: &str,
) -> (
    PathBuf,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<Switch>,
) {
    let path = sock(tag);
    let sw = Switch::new(Config {
        socket: Some(path.clone()),
        // These ports play stations sending from whatever address a test
        // picks, as ports that bridge other stations do; the port security
        // test names its MACs.
        ring_unlocked: vec!["*".into()],
        ..Config::default()
    })
    .unwrap();
    let (stop, h) = spawn(sw).unwrap();
    (path, stop, h)
}

fn port(path: &std::path::Path, name: &str, mode: Mode, slots: u32) -> Attached {
    attach(
        path,
        &AttachRequest {
            name: name.into(),
            mode,
            itr: 0,
            slots,
            buf_size: 2048,
            mac: None,
        },
    )
    .unwrap()
}

#[test]
fn learning_bridge_floods_then_forwards_unicast() {
    for mode in [Mode::Base, Mode::Sc, Mode::Csb] {
        let (path, stop, h) = start(&format!("learn-{mode}"));
        let mut a = port(&path, "a", mode, 256);
        let mut b = port(&path, "b", mode, 256);
        let mut c = port(&path, "c", mode, 256);
        // a -> unknown: flooded to b and c.
        assert_eq!(send(&mut a, 100, 1, 2), 100);
        let fb = recv(&mut b, 100, Duration::from_millis(500));
        let fc = recv(&mut c, 100, Duration::from_millis(500));
        assert_eq!((fb.len(), fc.len()), (100, 100), "{mode}");
        assert_eq!(&fb[0][..], &udp_frame(60, mac(1), mac(2))[..]);
        // b -> a: a's address was learned, so only a gets it.
        assert_eq!(send(&mut b, 50, 2, 1), 50);
        assert_eq!(
            recv(&mut a, 50, Duration::from_millis(500)).len(),
            50,
            "{mode}"
        );
        assert!(
            recv(&mut c, 1, Duration::from_millis(100)).is_empty(),
            "{mode}: c saw unicast"
        );
        // Now a -> b is unicast too.
        assert_eq!(send(&mut a, 30, 1, 2), 30);
        assert_eq!(recv(&mut b, 30, Duration::from_millis(500)).len(), 30);
        assert!(recv(&mut c, 1, Duration::from_millis(100)).is_empty());
        let s = status(&path).unwrap();
        assert_eq!(s["ports"].as_array().unwrap().len(), 3);
        assert!(s["macs"].as_u64().unwrap() >= 2);
        stop.store(true, Ordering::Relaxed);
        let sw = h.join().unwrap();
        assert_eq!(sw.stats.runts, 0);
    }
}

#[test]
fn broadcast_reaches_every_other_port() {
    let (path, stop, h) = start("bcast");
    let mut ports: Vec<Attached> = (0..4)
        .map(|i| port(&path, &format!("p{i}"), Mode::Csb, 256))
        .collect();
    let f = udp_frame(60, mac(9), [0xff; 6]);
    let k = ports[0].driver.send(5, |_, b| {
        b[..60].copy_from_slice(&f);
        60
    });
    assert_eq!(k, 5);
    for p in ports.iter_mut().skip(1) {
        assert_eq!(recv(p, 5, Duration::from_millis(500)).len(), 5);
    }
    assert!(
        recv(&mut ports[0], 1, Duration::from_millis(100)).is_empty(),
        "echoed to sender"
    );
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
}

#[test]
fn a_full_port_loses_frames_and_blocks_nobody() {
    let (path, stop, h) = start("full");
    let mut a = port(&path, "a", Mode::Csb, 256);
    let mut slow = port(&path, "slow", Mode::Csb, 64);
    let mut fast = port(&path, "fast", Mode::Csb, 1024);
    // Teach the switch where 2 and 3 live.
    send(&mut slow, 1, 2, 0xfe);
    send(&mut fast, 1, 3, 0xfe);
    recv(&mut a, 2, Duration::from_millis(300));
    recv(&mut slow, 1, Duration::from_millis(300));
    recv(&mut fast, 1, Duration::from_millis(300));
    // 'slow' never reads; 'fast' does.
    let t0 = Instant::now();
    assert_eq!(send(&mut a, 5000, 1, 2), 5000);
    assert_eq!(send(&mut a, 500, 1, 3), 500);
    assert!(t0.elapsed() < Duration::from_secs(3), "sender was held up");
    assert_eq!(recv(&mut fast, 500, Duration::from_millis(500)).len(), 500);
    let s = status(&path).unwrap();
    let slow_s = s["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "slow")
        .unwrap()
        .clone();
    assert_eq!(slow_s["to_port"].as_u64().unwrap(), 65, "{slow_s}"); // + fast's flood
    assert_eq!(
        slow_s["dropped_full"].as_u64().unwrap(),
        5000 - 64,
        "{slow_s}"
    );
    assert_eq!(recv(&mut slow, 5000, Duration::from_millis(300)).len(), 64);
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
}

#[test]
fn a_detached_port_is_removed_and_its_addresses_forgotten() {
    let (path, stop, h) = start("detach");
    let mut a = port(&path, "a", Mode::Csb, 256);
    let mut b = port(&path, "b", Mode::Csb, 256);
    send(&mut b, 1, 2, 1);
    recv(&mut a, 1, Duration::from_millis(300));
    drop(b); // the "process" dies: its connection closes
    let end = Instant::now() + Duration::from_secs(2);
    loop {
        let s = status(&path).unwrap();
        if s["ports"].as_array().unwrap().len() == 1 {
            assert_eq!(s["macs"].as_u64(), Some(0), "{s}");
            break;
        }
        assert!(Instant::now() < end, "port not removed: {s}");
        std::thread::sleep(Duration::from_millis(10));
    }
    // A name can be reused after the port is gone; duplicates are refused.
    let _b2 = port(&path, "b", Mode::Csb, 256);
    let dup = attach(
        &path,
        &AttachRequest {
            name: "b".into(),
            mode: Mode::Csb,
            itr: 0,
            slots: 256,
            buf_size: 2048,
            mac: None,
        },
    );
    assert!(dup.err().unwrap().to_string().contains("exists"));
    let bad = attach(
        &path,
        &AttachRequest {
            name: "c".into(),
            mode: Mode::Csb,
            itr: 0,
            slots: 100,
            buf_size: 2048,
            mac: None,
        },
    );
    assert!(bad.err().unwrap().to_string().contains("power of two"));
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
}

#[test]
fn a_port_writing_garbage_cannot_hurt_the_switch_or_other_ports() {
    let (path, stop, h) = start("garbage");
    let mut a = port(&path, "a", Mode::Csb, 256);
    let mut b = port(&path, "b", Mode::Csb, 256);
    send(&mut b, 1, 2, 1);
    recv(&mut a, 1, Duration::from_millis(300));
    // Several hostile ports, each scribbling over its rings and status block
    // with a different pattern, kicking all the while.
    let evil = std::thread::spawn({
        let path = path.clone();
        move || {
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            let mut last = None;
            for round in 0..20 {
                let mut g = port(&path, &format!("evil{round}"), Mode::Csb, 64);
                let r = g.driver.region();
                let words = (r.offsets().bufs_off - 64) / 4;
                let base = r.csb() as *const _ as *mut u32;
                for _ in 0..2000 {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let w = (seed as usize) % words;
                    // Driver-writable: the guest CSB line and both rings.
                    if (16..32).contains(&w) {
                        continue; // the host line is the device's
                    }
                    // SAFETY: w < words, so the word lies inside the port's mapping (kept alive by g).
                    unsafe { base.add(w).write_volatile((seed >> 32) as u32) };
                    if seed.is_multiple_of(7) {
                        g.driver.raw_kick();
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
                last = Some(g);
            }
            last
        }
    });
    let mut total = 0;
    for _ in 0..20 {
        assert_eq!(send(&mut a, 200, 1, 2), 200);
        let got = recv(&mut b, 200, Duration::from_millis(500));
        assert!(got
            .iter()
            .all(|f| f[..] == udp_frame(60, mac(1), mac(2))[..]));
        total += got.len();
    }
    let last_evil = evil.join().unwrap();
    let s = status(&path).unwrap();
    assert_eq!(total, 4000, "good ports lost traffic: {s}");
    let e = s["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "evil19")
        .unwrap()
        .clone();
    let d = &e["detail"];
    assert!(
        !d["broken"].is_null() || d["bad_slots"].as_u64().unwrap() > 0,
        "the garbage went unnoticed: {e}"
    );
    drop(last_evil);
    std::thread::sleep(Duration::from_millis(50));
    let s = status(&path).unwrap();
    assert!(s["switch"].is_object(), "switch still answers: {s}");
    let evil_seen = s["ports"].as_array().unwrap().len();
    assert_eq!(evil_seen, 2, "hostile ports were not cleaned up: {s}");
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
}

/// `fastpath switch status` at 1,000 ports: the document is sent in pages
/// that each fit a control message, and the client puts them together (a
/// single reply was cut at 64 KiB, about 300 ports, and at 1,000 the
/// switch closed the connection instead of answering).
#[test]
fn status_reaches_the_client_whole_at_a_thousand_ports() {
    let path = sock("status-1000");
    let mut sw = Switch::new(Config {
        socket: Some(path.clone()),
        log_ports: false,
        ..Config::default()
    })
    .unwrap();
    for i in 0..1000 {
        sw.add_port(Box::new(common::SinkPort::new(&format!(
            "sink-with-a-long-name-{i:04}"
        ))))
        .unwrap();
    }
    let whole = serde_json::to_vec(&sw.status()).unwrap().len();
    assert!(
        whole > 2 * ring::control::MAX_MSG,
        "the document ({whole} bytes) should need several messages"
    );
    let (stop, h) = spawn(sw).unwrap();
    let s = status(&path).unwrap();
    let ports = s["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1000);
    for (i, p) in ports.iter().enumerate() {
        assert_eq!(p["name"], format!("sink-with-a-long-name-{i:04}"));
    }
    assert!(s.get("next").is_none(), "the last page says no more");
    assert!(s["switch"].is_object());
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
}

/// Port security: a port that sends from another station's address cannot
/// take that station's traffic when the station's port is locked to it,
/// and a locked port cannot send from any other address.
#[test]
fn a_spoofing_port_cannot_steal_a_locked_port_s_frames() {
    let (path, stop, h) = start("spoof");
    let locked = |name: &str, m: u8| {
        attach(
            &path,
            &AttachRequest {
                name: name.into(),
                mode: Mode::Csb,
                itr: 0,
                slots: 1024,
                buf_size: 2048,
                mac: Some(mac(m)),
            },
        )
        .unwrap()
    };
    let mut victim = locked("victim", 2);
    let mut sender = port(&path, "sender", Mode::Csb, 1024);
    let mut thief = port(&path, "thief", Mode::Csb, 1024);
    // A second port locked to the victim's address is refused.
    let again = attach(
        &path,
        &AttachRequest {
            name: "twin".into(),
            mode: Mode::Csb,
            itr: 0,
            slots: 256,
            buf_size: 2048,
            mac: Some(mac(2)),
        },
    );
    assert!(
        again
            .err()
            .unwrap()
            .to_string()
            .contains("is locked to port"),
        "a second lock on one address"
    );
    // The sender's address is learned; the thief claims the victim's
    // address, over and over, between the sender's frames.
    send(&mut sender, 1, 1, 0xfe);
    recv(&mut victim, 1, Duration::from_millis(300));
    recv(&mut thief, 1, Duration::from_millis(300));
    let mut delivered = 0;
    for _ in 0..20 {
        assert_eq!(send(&mut thief, 20, 2, 1), 20);
        assert_eq!(send(&mut sender, 100, 1, 2), 100);
        delivered += recv(&mut victim, 100, Duration::from_millis(300)).len();
    }
    assert_eq!(delivered, 2000, "the victim got every frame for it");
    let stolen = recv(&mut thief, 2000, Duration::from_millis(200));
    assert!(
        stolen.iter().all(|f| f[..6] != mac(2)),
        "the thief got {} of the victim's frames",
        stolen.iter().filter(|f| f[..6] == mac(2)).count()
    );
    // The thief's frames from the locked address were dropped, counted; so
    // are the locked port's own frames from another address.
    assert!(recv(&mut sender, 1, Duration::from_millis(100)).is_empty());
    assert_eq!(send(&mut victim, 10, 7, 1), 10);
    assert!(recv(&mut sender, 10, Duration::from_millis(200)).is_empty());
    assert_eq!(send(&mut victim, 10, 2, 1), 10);
    assert_eq!(recv(&mut sender, 10, Duration::from_millis(300)).len(), 10);
    let s = status(&path).unwrap();
    let p = |n: &str| {
        s["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == n)
            .unwrap()
            .clone()
    };
    assert_eq!(p("thief")["spoofed"].as_u64(), Some(400), "{s}");
    assert_eq!(p("victim")["spoofed"].as_u64(), Some(10), "{s}");
    assert_eq!(p("victim")["locked_mac"], "02:00:00:00:00:02");
    assert_eq!(s["switch"]["spoofed"].as_u64(), Some(410));
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
}
