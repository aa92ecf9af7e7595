//! An outside program attaches over memif: DPDK's testpmd (net_memif, client
//! role) forwards with MAC swap, and pktgen on a ring port of the same switch
//! exchanges frames with it, with the switch's memif interrupts as they come
//! and moderated.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ring::control::{attach, status, AttachRequest};
use ring::Mode;
use vswitch::pktgen::udp_frame;
use vswitch::{spawn, Config, Switch};

fn testpmd() -> Option<PathBuf> {
    ["/usr/bin/dpdk-testpmd", "/usr/local/bin/dpdk-testpmd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "system test: DPDK testpmd"]
fn testpmd_exchanges_traffic_with_pktgen_through_the_switch() {
    exchange("irq", Config::default());
}

/// Moderated (and never polling while idle, so that every idle moment is
/// a moderated sleep): nothing is lost or stuck, the switch did sleep
/// moderated, and once the traffic stops it unmasks testpmd's interrupts
/// (after `QUIET_WAKES` empty looks), so that the next frame wakes it.
#[test]
#[ignore = "system test: DPDK testpmd"]
fn testpmd_exchanges_traffic_through_a_moderated_switch() {
    let s = exchange(
        "mod",
        Config {
            poll_us: 0,
            memif_moderation: Duration::from_micros(50),
            ..Config::default()
        },
    );
    let memif = memif_port(&s);
    assert!(
        memif["detail"]["moderated_sleeps"].as_u64().unwrap() > 0,
        "{memif}"
    );
    assert_eq!(
        memif["detail"]["interrupts_masked"].as_bool(),
        Some(false),
        "idle for 300 ms and still masked: {memif}"
    );
}

/// The memif port in a switch status document.
fn memif_port(s: &serde_json::Value) -> serde_json::Value {
    s["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["kind"] == "memif")
        .unwrap()
        .clone()
}

/// Exchanges 10,000 frames with testpmd through a switch set up by `cfg`,
/// checks that every one came back mirrored, waits 300 ms idle and
/// returns the switch's status then.
fn exchange(tag: &str, cfg: Config) -> serde_json::Value {
    let Some(pmd) = testpmd() else {
        systest::missing(
            "dpdk-testpmd (scripts/setup.sh installs dpdk-dev and librte-net-memif23)",
        );
    };
    let pid = std::process::id();
    let ctl = std::env::temp_dir().join(format!("fp-memif-ctl-{pid}-{tag}.sock"));
    let msock = std::env::temp_dir().join(format!("fp-memif-{pid}-{tag}.sock"));
    let sw = Switch::new(Config {
        socket: Some(ctl.clone()),
        memif_socket: Some(msock.clone()),
        // The pktgen port sends from testpmd's addresses' peers: it bridges.
        ring_unlocked: vec!["*".into()],
        ..cfg
    })
    .unwrap();
    let (stop, h) = spawn(sw).unwrap();

    let log = std::env::temp_dir().join(format!("fp-testpmd-{pid}-{tag}.log"));
    let child = Command::new(pmd)
        .args([
            "-l",
            "0-1",
            "--no-huge",
            "-m",
            "512",
            "--no-pci",
            "--log-level=pmd.net.memif:info",
        ])
        .arg(format!("--file-prefix=fp-{pid}-{tag}"))
        .arg(format!(
            "--vdev=net_memif0,role=client,id=0,socket-abstract=no,socket={}",
            msock.display()
        ))
        .args([
            "--",
            "--forward-mode=macswap",
            "--auto-start",
            "--total-num-mbufs=4096",
        ])
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start testpmd");
    let _pmd = Kill(child);

    // Wait for the memif port to connect.
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let s = status(&ctl).unwrap();
        if s["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["kind"] == "memif")
        {
            break;
        }
        assert!(
            Instant::now() < end,
            "testpmd never connected; its output:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut a = attach(
        &ctl,
        &AttachRequest {
            name: "pktgen".into(),
            mode: Mode::Csb,
            itr: 0,
            slots: 1024,
            buf_size: 2048,
            mac: None,
        },
    )
    .unwrap();
    let me = [2, 0xfa, 0, 0, 0, 1];
    let peer = [2, 0xfa, 0, 0, 0, 2];
    let frame = udp_frame(60, me, peer);
    // testpmd posts its receive buffers some time after it connects: probe
    // until the first reply, then count.
    let end = Instant::now() + Duration::from_secs(15);
    let mut warm = false;
    while !warm && Instant::now() < end {
        a.driver.send(1, |_, b| {
            b[..60].copy_from_slice(&frame);
            60
        });
        a.driver.wait_rx(Duration::from_millis(20));
        warm = a.driver.recv(256, |_| ()) > 0;
    }
    assert!(warm, "no reply from testpmd: {}", status(&ctl).unwrap());
    std::thread::sleep(Duration::from_millis(50));
    a.driver.recv(1024, |_| ());
    let mut sent = 0usize;
    let mut replies = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while (sent < 10_000 || replies.len() < sent) && Instant::now() < end {
        // At most 256 in flight: testpmd's rings hold 1024, so none is lost.
        if sent < 10_000 && sent - replies.len() < 256 {
            sent += a.driver.send(32.min(10_000 - sent), |_, b| {
                b[..60].copy_from_slice(&frame);
                60
            });
        }
        let k = a.driver.recv(256, |f| replies.push(f.to_vec()));
        if k == 0 {
            a.driver.wait_rx(Duration::from_millis(1));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let s = status(&ctl).unwrap();
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    let _ = std::fs::remove_file(&ctl);
    let _ = std::fs::remove_file(&msock);

    // testpmd swapped the addresses: every reply is our frame, mirrored.
    let mut want = frame.clone();
    want[..6].copy_from_slice(&me);
    want[6..12].copy_from_slice(&peer);
    assert_eq!(sent, 10_000);
    assert_eq!(
        replies.len(),
        sent,
        "{} of {sent} came back: {s}",
        replies.len()
    );
    assert!(
        replies.iter().all(|r| r[..] == want[..]),
        "a reply was not our frame mirrored"
    );
    let memif = memif_port(&s);
    assert!(
        memif["from_port"].as_u64().unwrap() >= replies.len() as u64,
        "{memif}"
    );
    assert_eq!(
        memif["detail"]["bad_descriptors"].as_u64(),
        Some(0),
        "{memif}"
    );
    s
}
