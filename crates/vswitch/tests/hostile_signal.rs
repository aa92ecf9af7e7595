//! A peer cannot stop the switch through the interrupt line it shares.
//!
//! A ring port's interrupt eventfd reaches the client by SCM_RIGHTS, so the
//! client shares its open file description and with it `O_NONBLOCK`
//! (eventfd(2)). The attacker clears the flag and fills the counter to its
//! largest value, 2^64-2: a plain `write` of 1 by the switch would then
//! sleep until somebody reads the counter, and nobody will. The same holds
//! for vhost-user's call fd and memif's interrupt fd, which the switch
//! raises through the same [`ring::EventFd`].

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ring::control::{attach, status, AttachRequest, Attached};
use ring::Mode;
use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
use vswitch::pktgen::udp_frame;
use vswitch::{spawn, Config, Switch};

const FULL: u64 = 0xffff_ffff_ffff_fffe;
const BROADCAST: [u8; 6] = [0xff; 6];

fn mac(n: u8) -> [u8; 6] {
    [2, 0, 0, 0, 0, n]
}

fn port(path: &std::path::Path, name: &str, n: u8) -> Attached {
    attach(
        path,
        &AttachRequest {
            name: name.into(),
            mode: Mode::Base,
            itr: 0,
            slots: 256,
            buf_size: 2048,
            mac: Some(mac(n)),
        },
    )
    .expect("attach")
}

/// Runs `f` on its own thread; `None` if it did not return within `limit`
/// (the thread is left behind: it is blocked on a switch that hangs).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

#[test]
fn a_port_that_blocks_and_fills_its_interrupt_line_stops_nobody() {
    let path: PathBuf = std::env::temp_dir().join(format!("fp-sw-sig-{}.sock", std::process::id()));
    let sw = Switch::new(Config {
        socket: Some(path.clone()),
        ..Config::default()
    })
    .expect("switch");
    let (stop, h) = spawn(sw).expect("spawn");
    let mut a = port(&path, "a", 1);
    let mut b = port(&path, "b", 2);
    let evil = port(&path, "evil", 3);

    // The attack, on the descriptor the protocol handed the client: fill
    // the counter while the line is still non-blocking (a signal of the
    // switch may land in between: empty the counter and try again), then
    // make the line blocking.
    let irq = evil.driver.irq_fd().as_fd();
    let mut filled = false;
    for _ in 0..1000 {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(irq, &mut b);
        if rustix::io::write(irq, &FULL.to_ne_bytes()) == Ok(8) {
            filled = true;
            break;
        }
    }
    assert!(filled, "could not fill the interrupt counter");
    let fl = fcntl_getfl(irq).expect("getfl");
    fcntl_setfl(irq, fl - OFlags::NONBLOCK).expect("clear O_NONBLOCK");

    // Broadcasts reach 'evil' too, and each delivery raises its interrupt.
    let frame = udp_frame(60, mac(1), BROADCAST);
    let (mut sent, mut got) = (0usize, 0usize);
    let end = Instant::now() + Duration::from_secs(20);
    while sent < 2000 && Instant::now() < end {
        let k = a.driver.send(64, |_, buf| {
            buf[..60].copy_from_slice(&frame);
            60
        });
        sent += k;
        a.driver.flush(Duration::from_millis(200));
        let quiet = Instant::now() + Duration::from_millis(200);
        let mut this = 0;
        while this < k && Instant::now() < quiet {
            let r = b.driver.recv(256, |_| {});
            this += r;
            if r == 0 {
                b.driver.wait_rx(Duration::from_millis(2));
            }
        }
        got += this;
    }
    assert!(
        sent >= 2000,
        "the sender was held up: {sent} frames sent in 20 s"
    );
    assert!(
        got * 10 >= sent * 9,
        "the victim received {got} of {sent} broadcasts while 'evil' blocked its line"
    );

    // The control socket answers, promptly.
    let p = path.clone();
    let t = Instant::now();
    let s = within(Duration::from_secs(5), move || status(&p))
        .expect("status did not answer within 5 s");
    let s = s.expect("status");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "status took {:?}",
        t.elapsed()
    );
    let ports = s["ports"].as_array().expect("ports");
    assert_eq!(ports.len(), 3, "{s}");
    // What could not be signalled is counted, on the attacker's port.
    let evil_port = ports
        .iter()
        .find(|p| p["name"] == "evil")
        .expect("evil's entry");
    let blocked = evil_port["detail"]["signals_blocked"]
        .as_u64()
        .expect("signals_blocked");
    assert!(
        blocked > 0,
        "the blocked line's signals were not counted: {evil_port}"
    );

    // The attacker leaves; a new port attaches and forwards.
    drop(evil);
    let mut c = port(&path, "c", 4);
    let uni = udp_frame(60, mac(4), mac(2));
    let end = Instant::now() + Duration::from_secs(5);
    let mut seen = 0;
    while seen == 0 && Instant::now() < end {
        c.driver.send(1, |_, buf| {
            buf[..60].copy_from_slice(&uni);
            60
        });
        c.driver.flush(Duration::from_millis(100));
        seen += b.driver.recv(256, |f| assert_eq!(&f[6..12], &mac(4)));
        b.driver.wait_rx(Duration::from_millis(5));
    }
    assert!(
        seen > 0,
        "a port attached after the attack does not forward"
    );

    stop.store(true, Ordering::Relaxed);
    h.join().expect("switch thread");
    let _ = std::fs::remove_file(&path);
}
