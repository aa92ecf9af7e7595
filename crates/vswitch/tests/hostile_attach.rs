//! Peers that attack the switch's attach paths rather than its rings:
//! sockets at paths that are not the switch's to take, connections that
//! never complete a handshake, a ring port that sends from another port's
//! address. Each peer here is written from its protocol (vhost-user's
//! message header, memif's messages, the control socket's requests), not
//! from the switch's own client code.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::ring_port::{mac, recv, send};
use ring::control::{attach, status, AttachRequest, Attached, Conn};
use ring::Mode;
use vswitch::ports::memif::EVICTABLE_AFTER;
use vswitch::ports::vhost;
use vswitch::{spawn, Config, ConfigError, SocketPathError, Switch, HANDSHAKE_TIMEOUT};

/// A fresh directory for one test's sockets.
fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fp-hostile-attach-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("socket directory");
    d
}

/// A switch running on its own thread, stopped and joined when dropped
/// (also when a test fails).
struct Running(
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    Option<std::thread::JoinHandle<Switch>>,
);

impl Running {
    fn new(cfg: Config) -> Running {
        let (stop, h) = spawn(Switch::new(cfg).unwrap()).unwrap();
        Running(stop, Some(h))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

/// A switch whose one vhost-user port listens on `path`.
fn with_vm_port(path: &Path) -> Config {
    Config {
        vhost_user: vec![vhost::Config::new("vm", path)],
        log_ports: false,
        ..Config::default()
    }
}

#[test]
fn a_regular_file_at_a_vhost_user_path_survives_and_is_refused_by_name() {
    let d = dir("file");
    let path = d.join("disk.img");
    std::fs::write(&path, b"someone's data").unwrap();
    let e = with_vm_port(&path).claim_sockets().unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, ConfigError::Socket(SocketPathError::NotSocket { .. })),
        "{text}"
    );
    assert!(
        text.contains(&path.display().to_string()) && text.contains("not a socket"),
        "{text}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"someone's data");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn another_running_switch_s_control_socket_is_refused_and_outlives_us() {
    let d = dir("live");
    let ctl = d.join("switch.sock");
    let _switch = Running::new(Config {
        socket: Some(ctl.clone()),
        log_ports: false,
        ..Config::default()
    });
    // A second switch given the first one's control socket, as its own
    // control socket or as a VM port's.
    for cfg in [
        Config {
            socket: Some(ctl.clone()),
            ..Config::default()
        },
        with_vm_port(&ctl),
    ] {
        let e = cfg.claim_sockets().unwrap_err();
        assert!(
            matches!(e, ConfigError::Socket(SocketPathError::Live { .. })),
            "{e}"
        );
        assert!(e.to_string().contains(&ctl.display().to_string()), "{e}");
    }
    // The first switch still answers on it.
    assert!(status(&ctl).unwrap()["switch"].is_object());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_socket_path_given_twice_is_refused() {
    let d = dir("twice");
    let p = d.join("x.sock");
    let cases = [
        Config {
            socket: Some(p.clone()),
            memif_socket: Some(d.join(".").join("x.sock")),
            ..Config::default()
        },
        Config {
            vhost_user: vec![vhost::Config::new("vm1", &p), vhost::Config::new("vm2", &p)],
            ..Config::default()
        },
    ];
    for cfg in cases {
        let e = cfg.check().unwrap_err();
        assert!(matches!(e, ConfigError::SamePath { .. }), "{e}");
        assert!(e.to_string().contains("given twice"), "{e}");
        assert!(cfg.claim_sockets().is_err());
    }
    // The file says it the same way.
    let f = d.join("sw.toml");
    std::fs::write(
        &f,
        format!(
            "socket = {:?}\n[[vhost_user]]\npath = {:?}\n",
            p.display().to_string(),
            p.display().to_string()
        ),
    )
    .unwrap();
    let e = vswitch::FileConfig::load(&f).unwrap_err();
    assert!(e.to_string().contains("given twice"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Sixty-four memif connections that never say anything, then a real
/// client: once the idle ones are older than `EVICTABLE_AFTER` it takes the
/// place of one of them, well within the handshake deadline.
#[test]
fn idle_memif_connections_do_not_lock_out_a_real_client() {
    let d = dir("memif");
    let msock = d.join("memif.sock");
    let _switch = Running::new(Config {
        memif_socket: Some(msock.clone()),
        log_ports: false,
        ..Config::default()
    });
    let idle: Vec<Conn> = (0..vswitch::ports::memif::MAX_CONNECTIONS)
        .map(|_| Conn::connect(&msock).unwrap())
        .collect();
    let start = Instant::now();
    let deadline = start + EVICTABLE_AFTER + Duration::from_secs(2);
    let client = loop {
        let (c, r) = common::memif::good_client(&msock);
        if r == 7 {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "no memif client got in for {:?} past 64 idle connections",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(start.elapsed() >= EVICTABLE_AFTER / 2, "the idle ones held");
    // The connected client is not held to the deadline.
    std::thread::sleep(HANDSHAKE_TIMEOUT + Duration::from_millis(500));
    let mut pfd = [libc::pollfd {
        fd: client.fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    }];
    // SAFETY: one live pollfd; a zero timeout only looks.
    let n = unsafe { libc::poll(pfd.as_mut_ptr(), 1, 0) };
    assert_eq!(
        (n, pfd[0].revents),
        (0, 0),
        "the connected client was told something or closed"
    );
    drop(idle);
    let _ = std::fs::remove_dir_all(&d);
}

/// Whether the peer closed `fd` (or it has something to read), looking
/// without waiting.
fn readable_or_closed(fd: i32) -> bool {
    let mut pfd = [libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    }];
    // SAFETY: one live pollfd; a zero timeout only looks.
    unsafe { libc::poll(pfd.as_mut_ptr(), 1, 0) != 0 }
}

/// A control connection that asks nothing is closed after the handshake
/// deadline; one that brought a port is not held to it.
#[test]
fn an_idle_control_connection_is_closed_and_a_port_s_is_kept() {
    let d = dir("control");
    let ctl = d.join("switch.sock");
    let _switch = Running::new(Config {
        socket: Some(ctl.clone()),
        log_ports: false,
        ..Config::default()
    });
    let idle = Conn::connect(&ctl).unwrap();
    let port = ring_port(&ctl, "station", Some(1)).unwrap();
    std::thread::sleep(HANDSHAKE_TIMEOUT + Duration::from_secs(1));
    assert!(readable_or_closed(idle.fd()), "the idle connection is open");
    let names: Vec<String> = status(&ctl).unwrap()["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(names, ["station"], "the port's connection was kept");
    drop(port);
    let _ = std::fs::remove_dir_all(&d);
}

/// vhost-user's message header (the specification's "Message
/// Specification"): request, flags (version 1), payload size.
fn vu_msg(request: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(12 + payload.len());
    m.extend_from_slice(&request.to_le_bytes());
    m.extend_from_slice(&1u32.to_le_bytes());
    m.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    m.extend_from_slice(payload);
    m
}

const VHOST_USER_GET_FEATURES: u32 = 1;
const VHOST_USER_SET_OWNER: u32 = 3;

/// A frontend asks `VHOST_USER_GET_FEATURES` and reads the reply: the
/// features, or none if the switch closed the connection (turned away).
fn get_features(s: &mut UnixStream) -> Option<u64> {
    s.write_all(&vu_msg(VHOST_USER_GET_FEATURES, &[])).ok()?;
    let mut r = [0u8; 20];
    s.read_exact(&mut r).ok()?;
    let word = |at: usize| u32::from_le_bytes([r[at], r[at + 1], r[at + 2], r[at + 3]]);
    assert_eq!(word(0), VHOST_USER_GET_FEATURES);
    assert_eq!(word(4) & 0x4, 0x4, "a reply");
    assert_eq!(word(8), 8);
    Some(u64::from_le_bytes(r[12..20].try_into().unwrap()))
}

/// A frontend that connects once, without retrying (QEMU without
/// `reconnect`), gets the port from a connection that has said nothing
/// for longer than `EVICTABLE_AFTER`; a frontend that has claimed the
/// device keeps it against newcomers.
#[test]
fn a_frontend_that_connects_once_takes_the_place_of_a_silent_one() {
    let d = dir("vhost-once");
    let path = d.join("vm.sock");
    let _switch = Running::new(with_vm_port(&path));
    let silent = UnixStream::connect(&path).unwrap();
    std::thread::sleep(vswitch::EVICTABLE_AFTER + Duration::from_millis(300));
    let mut front = UnixStream::connect(&path).unwrap();
    front
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    assert!(
        get_features(&mut front).is_some(),
        "a frontend's only try was turned away while a silent connection held the port"
    );
    let mut b = [0u8; 1];
    silent
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    assert_eq!(
        (&silent).read(&mut b).unwrap(),
        0,
        "the silent one is closed"
    );
    front.write_all(&vu_msg(VHOST_USER_SET_OWNER, &[])).unwrap();
    std::thread::sleep(vswitch::EVICTABLE_AFTER + Duration::from_millis(300));
    let mut late = UnixStream::connect(&path).unwrap();
    late.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    assert!(
        get_features(&mut late).is_none(),
        "a newcomer took an owned port"
    );
    assert!(
        get_features(&mut front).is_some(),
        "the owner lost its port"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// A connection that says nothing holds the VM port only until the
/// handshake deadline: then a real frontend (one that retries, as QEMU
/// with `reconnect` does) gets the port, and keeps it once it claimed it
/// with `SET_OWNER`.
#[test]
fn a_silent_vhost_user_connection_gives_way_to_a_real_frontend() {
    let d = dir("vhost");
    let path = d.join("vm.sock");
    let _switch = Running::new(with_vm_port(&path));
    let silent = UnixStream::connect(&path).unwrap();
    // Let the switch take the silent one first.
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let deadline = start + HANDSHAKE_TIMEOUT + Duration::from_secs(3);
    let mut front = loop {
        let mut s = UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        if get_features(&mut s).is_some() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the real frontend was turned away for {:?}",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    front.write_all(&vu_msg(VHOST_USER_SET_OWNER, &[])).unwrap();
    // The silent one was closed.
    let mut b = [0u8; 1];
    silent
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    assert_eq!(
        (&silent).read(&mut b).unwrap(),
        0,
        "the silent one is closed"
    );
    // The owner is not held to the deadline.
    std::thread::sleep(HANDSHAKE_TIMEOUT + Duration::from_millis(500));
    assert!(
        get_features(&mut front).is_some(),
        "the frontend that claimed the device was closed"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// An error and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut s = e.source();
    while let Some(c) = s {
        text.push_str(&format!(": {c}"));
        s = c.source();
    }
    text
}

fn ring_port(ctl: &Path, name: &str, m: Option<u8>) -> Result<Attached, ring::Error> {
    attach(
        ctl,
        &AttachRequest {
            name: name.into(),
            mode: Mode::Csb,
            itr: 0,
            slots: 256,
            buf_size: 2048,
            mac: m.map(mac),
        },
    )
}

/// By default a ring port is locked to the address it names: one that
/// names none is refused, and one that sends from another port's address
/// takes none of that port's frames.
#[test]
fn a_ring_port_is_locked_to_its_mac_by_default() {
    let d = dir("ring");
    let ctl = d.join("switch.sock");
    let _switch = Running::new(Config {
        socket: Some(ctl.clone()),
        log_ports: false,
        ..Config::default()
    });
    let e = ring_port(&ctl, "thief", None)
        .err()
        .expect("an unlocked port");
    let text = chain(&e);
    assert!(text.contains("--ring-unlocked"), "{text}");
    // Nor may a port lock itself to the broadcast address (pinned to it,
    // every broadcast would go to that port alone).
    let e = attach(
        &ctl,
        &AttachRequest {
            name: "thief".into(),
            mode: Mode::Csb,
            itr: 0,
            slots: 256,
            buf_size: 2048,
            mac: Some([0xff; 6]),
        },
    )
    .err()
    .expect("a port locked to the broadcast address");
    let text = chain(&e);
    assert!(text.contains("group address"), "{text}");
    let mut victim = ring_port(&ctl, "victim", Some(2)).unwrap();
    let mut sender = ring_port(&ctl, "sender", Some(1)).unwrap();
    let mut thief = ring_port(&ctl, "thief", Some(3)).unwrap();
    let mut delivered = 0;
    for _ in 0..10 {
        assert_eq!(send(&mut thief, 20, 2, 1), 20);
        assert_eq!(send(&mut sender, 50, 1, 2), 50);
        delivered += recv(&mut victim, usize::MAX, Duration::from_millis(100)).len();
    }
    let stolen = recv(&mut thief, usize::MAX, Duration::from_millis(200));
    assert!(
        stolen.iter().all(|f| f[..6] != mac(2)),
        "the thief got {} of the victim's frames",
        stolen.iter().filter(|f| f[..6] == mac(2)).count()
    );
    assert_eq!(delivered, 500, "the victim got every frame for it");
    let _ = std::fs::remove_dir_all(&d);
}

/// The operator's opt-out: a port named in `ring_unlocked` bridges other
/// stations, sending from their addresses.
#[test]
fn a_ring_port_the_switch_lets_bridge_attaches_unlocked() {
    let d = dir("bridge");
    let ctl = d.join("switch.sock");
    let _switch = Running::new(Config {
        socket: Some(ctl.clone()),
        log_ports: false,
        ring_unlocked: vec!["uplink".into()],
        ..Config::default()
    });
    let mut uplink = ring_port(&ctl, "uplink", None).unwrap();
    let mut station = ring_port(&ctl, "station", Some(1)).unwrap();
    assert_eq!(send(&mut uplink, 5, 7, 1), 5);
    assert_eq!(send(&mut uplink, 5, 8, 1), 5);
    assert_eq!(
        recv(&mut station, usize::MAX, Duration::from_millis(200)).len(),
        10
    );
    let _ = std::fs::remove_dir_all(&d);
}
