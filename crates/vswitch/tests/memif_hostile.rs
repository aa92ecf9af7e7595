//! A memif client that lies: unsealed memory, rings outside their region,
//! impossible counters, descriptors pointing anywhere. The switch refuses or
//! counts, and keeps serving.

mod common;

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::memif::{eventfd, handshake, memfd, msg, RING_BYTES};
use ring::control::{recv_msg, send_msg, status, Conn};
use vswitch::{spawn, Config, Switch};

/// The switch's memif port, as its status shows it.
fn memif_port(ctl: &std::path::Path) -> Option<serde_json::Value> {
    status(ctl).unwrap()["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["kind"] == "memif")
        .cloned()
}

/// The tests of this binary run one at a time: the descriptor test counts
/// what this process holds, and a sibling test's switch and client running
/// beside it would be counted as the switch's (141 against 136 once, in a
/// loaded CI run).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    // A failed sibling test poisons the lock; this one still runs alone.
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Poll `f` until it gives a value (at most 5 s).
fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn lying_memif_clients_are_refused_or_contained() {
    let _alone = serial();
    let pid = std::process::id();
    let ctl = std::env::temp_dir().join(format!("fp-mh-ctl-{pid}.sock"));
    let msock = std::env::temp_dir().join(format!("fp-mh-{pid}.sock"));
    let (stop, h) = spawn(
        Switch::new(Config {
            socket: Some(ctl.clone()),
            memif_socket: Some(msock.clone()),
            ..Config::default()
        })
        .unwrap(),
    )
    .unwrap();
    let size = 2 * RING_BYTES + 65536;

    // Unsealed memory: refused with DISCONNECT (8).
    let (_c, r) = handshake(&msock, memfd(size, false), size as u64, [0, 4352]);
    assert_eq!(r, 8);
    // A region claiming more bytes than its file has: refused.
    let (_c, r) = handshake(&msock, memfd(4096, true), 1 << 20, [0, 4352]);
    assert_eq!(r, 8);
    // A ring outside its region: refused.
    let (_c, r) = handshake(&msock, memfd(size, true), size as u64, [0, size as u32]);
    assert_eq!(r, 8);
    // Rings without the cookie: refused at connect.
    let (_c, r) = handshake(&msock, memfd(size, true), size as u64, [0, 4352]);
    assert_eq!(r, 8);

    // A well-formed client that then writes garbage.
    let region = memfd(size, true);
    // SAFETY: a fresh shared mapping of a memfd we own, `size` bytes long.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            region.as_raw_fd(),
            0,
        )
    } as *mut u8;
    assert!(!map.is_null());
    for off in [0usize, 4352] {
        // SAFETY: off + 4 <= size, inside the live mapping; 4-byte aligned.
        unsafe { (map.add(off) as *mut u32).write_volatile(0x3E31F20) };
    }
    let (conn, r) = handshake(&msock, region, size as u64, [0, 4352]);
    assert_eq!(r, 7, "CONNECTED");
    // C2S descriptors: region 3 (absent), an offset past the end, a length
    // past the end, and one good frame.
    // SAFETY: descriptor i of the first ring lies inside the live mapping.
    let desc = |i: usize, region: u16, len: u32, off: u32| unsafe {
        let d = map.add(128 + i * 16);
        (d.add(2) as *mut u16).write_volatile(region);
        (d.add(4) as *mut u32).write_volatile(len);
        (d.add(8) as *mut u32).write_volatile(off);
    };
    let buf_off = 2 * RING_BYTES as u32;
    desc(0, 3, 60, buf_off);
    desc(1, 0, 60, u32::MAX - 10);
    desc(2, 0, 1 << 20, buf_off);
    desc(3, 0, 60, buf_off);
    // SAFETY: byte 6 of the first ring's header, inside the live mapping.
    unsafe { (map.add(6) as *mut u16).write_volatile(4) }; // c2s head
    let memif = until("bad descriptors counted", || {
        memif_port(&ctl).filter(|m| m["detail"]["bad_descriptors"].as_u64() == Some(3))
    });
    assert_eq!(memif["from_port"].as_u64(), Some(1), "{memif}");
    // Slots were returned: tail moved to head.
    // SAFETY: byte 64 of the first ring's header, inside the live mapping.
    assert_eq!(unsafe { (map.add(64) as *const u16).read_volatile() }, 4);
    // An impossible head breaks the port; the switch keeps answering.
    // SAFETY: byte 6 of the first ring's header, inside the live mapping.
    unsafe { (map.add(6) as *mut u16).write_volatile(4 + 5000) };
    until("impossible head caught", || {
        memif_port(&ctl).filter(|m| m["detail"]["broken"].is_string())
    });
    drop(conn);
    until("memif port removed on disconnect", || {
        memif_port(&ctl).is_none().then_some(())
    });
    // SAFETY: map is the mapping made above, of `size` bytes, no longer used.
    unsafe { libc::munmap(map as *mut _, size) };
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    let _ = std::fs::remove_file(&ctl);
    let _ = std::fs::remove_file(&msock);
}

/// Descriptors this process holds.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The next message's type and, for a `disconnect`, its reason.
fn next_msg(c: &Conn) -> (u16, String) {
    match recv_msg(c.fd()) {
        Ok(Some((m, _))) if m.len() >= 2 => {
            let ty = u16::from_le_bytes([m[0], m[1]]);
            let reason = if ty == 8 && m.len() >= 102 {
                let r = &m[6..102];
                let end = r.iter().position(|&b| b == 0).unwrap_or(r.len());
                String::from_utf8_lossy(&r[..end]).into_owned()
            } else {
                String::new()
            };
            (ty, reason)
        }
        _ => (0, String::new()),
    }
}

fn memif_switch(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let pid = std::process::id();
    (
        std::env::temp_dir().join(format!("fp-mh-{tag}-ctl-{pid}.sock")),
        std::env::temp_dir().join(format!("fp-mh-{tag}-{pid}.sock")),
    )
}

/// One client adding rings without end made the switch hold a descriptor
/// for each (about 20,000 before new ports failed with "Too many open
/// files"): the greeting offers one ring each way, and a second one is
/// refused. Many connections are bounded too.
#[test]
fn a_memif_client_cannot_make_the_switch_hoard_descriptors() {
    let _alone = serial();
    let (ctl, msock) = memif_switch("hoard");
    let (stop, h) = spawn(
        Switch::new(Config {
            socket: Some(ctl.clone()),
            memif_socket: Some(msock.clone()),
            ..Config::default()
        })
        .unwrap(),
    )
    .unwrap();
    let before = open_fds();
    let size = 2 * RING_BYTES + 65536;
    let c = Conn::connect(&msock).unwrap();
    assert_eq!(next_msg(&c).0, 2);
    send_msg(
        c.fd(),
        &msg(3, |m| m[2..4].copy_from_slice(&0x0200u16.to_le_bytes())),
        &[],
    )
    .unwrap();
    assert_eq!(next_msg(&c).0, 1);
    let region = memfd(size, true);
    send_msg(
        c.fd(),
        &msg(4, |m| {
            m[4..12].copy_from_slice(&(size as u64).to_le_bytes())
        }),
        &[region.as_raw_fd()],
    )
    .unwrap();
    assert_eq!(next_msg(&c).0, 1, "region acked");
    let mut acked = 0;
    let mut refusal = String::new();
    for _ in 0..2000 {
        let e = eventfd();
        let sent = send_msg(
            c.fd(),
            &msg(5, |m| {
                m[2..4].copy_from_slice(&1u16.to_le_bytes()); // client to server
                m[12] = 8;
            }),
            &[e.as_raw_fd()],
        );
        drop(e);
        if sent.is_err() {
            break;
        }
        match next_msg(&c) {
            (1, _) => acked += 1,
            (8, why) => {
                refusal = why;
                break;
            }
            other => panic!("unexpected reply {other:?}"),
        }
    }
    assert_eq!(acked, 1, "one ring each way");
    assert!(refusal.contains("second"), "{refusal}");
    drop(c);
    drop(region);
    // Connections: the server holds at most MAX_CONNECTIONS; the ones past
    // it are told why and closed.
    let mut conns = Vec::new();
    let mut refused = 0;
    for _ in 0..(vswitch::ports::memif::MAX_CONNECTIONS + 20) {
        let c = Conn::connect(&msock).unwrap();
        match next_msg(&c) {
            (2, _) => conns.push(c),
            (8, why) => {
                assert!(why.contains("too many"), "{why}");
                refused += 1;
            }
            other => panic!("unexpected greeting {other:?}"),
        }
    }
    assert_eq!(conns.len(), vswitch::ports::memif::MAX_CONNECTIONS);
    assert_eq!(refused, 20);
    // Our side holds one descriptor per connection kept; the switch one
    // more; a few for the switch itself.
    let held = open_fds().saturating_sub(before);
    assert!(
        held <= 2 * vswitch::ports::memif::MAX_CONNECTIONS + 8,
        "{held} descriptors held"
    );
    drop(conns);
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    let _ = std::fs::remove_file(&ctl);
    let _ = std::fs::remove_file(&msock);
}

/// An unsealed region is refused for its seals, before its size is even
/// read: until the seal holds, a size read from the file can be made false
/// the moment after (the file truncated between the check and our reads).
#[test]
fn a_memif_region_s_seals_are_checked_before_its_size() {
    let _alone = serial();
    let (ctl, msock) = memif_switch("toctou");
    let (stop, h) = spawn(
        Switch::new(Config {
            socket: Some(ctl.clone()),
            memif_socket: Some(msock.clone()),
            ..Config::default()
        })
        .unwrap(),
    )
    .unwrap();
    let c = Conn::connect(&msock).unwrap();
    assert_eq!(next_msg(&c).0, 2);
    send_msg(
        c.fd(),
        &msg(3, |m| m[2..4].copy_from_slice(&0x0200u16.to_le_bytes())),
        &[],
    )
    .unwrap();
    assert_eq!(next_msg(&c).0, 1);
    // Unsealed and shorter than it claims: both wrong; the seal is what
    // is checked first.
    let region = memfd(4096, false);
    send_msg(
        c.fd(),
        &msg(4, |m| m[4..12].copy_from_slice(&(1u64 << 20).to_le_bytes())),
        &[region.as_raw_fd()],
    )
    .unwrap();
    let (ty, why) = next_msg(&c);
    assert_eq!(ty, 8);
    assert!(why.contains("not sealed"), "{why}");
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    let _ = std::fs::remove_file(&ctl);
    let _ = std::fs::remove_file(&msock);
}
