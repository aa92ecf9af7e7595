//! TAP and TUN devices open, come up and take what is written into them, in
//! a namespace this test creates.

use netio::tap::{Tap, Tun};
use netns::Netns;

/// `ip -o link show dev` inside namespace `ns`.
fn link(ns: &str, dev: &str) -> String {
    let out = std::mem::ManuallyDrop::new(Netns::new_handle(ns))
        .ip(&["-o", "link", "show", "dev", dev])
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `ip -o link` output says the interface is administratively up.
fn is_up(link: &str) -> bool {
    let flags = link.split(['<', '>']).nth(1).unwrap_or("");
    flags.split(',').any(|f| f == "UP")
}

#[test]
#[ignore = "system test: root, namespaces"]
fn tap_and_tun_open_up_and_take_frames() {
    systest::require_netns();
    let ns = Netns::new(&format!("fp-tap-{}", std::process::id())).unwrap();
    ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        .unwrap();
    let name = ns.name().to_string();
    let (tap_link, tun_link, tap_took, tun_took) = ns
        .inside(move || {
            let tap = Tap::open("fptap0").unwrap();
            let tun = Tun::open("fptun0").unwrap();
            assert_eq!((tap.name(), tun.name()), ("fptap0", "fptun0"));
            // A broadcast Ethernet frame into the TAP device, an IPv4
            // header (to 10.0.0.2, from 10.0.0.1) into the TUN device.
            let mut frame = vec![0xffu8; 6];
            frame.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x08, 0x06]);
            frame.resize(60, 0);
            let mut ip = vec![0x45u8, 0, 0, 20, 0, 0, 0x40, 0, 64, 17, 0, 0];
            ip.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
            (
                link(&name, "fptap0"),
                link(&name, "fptun0"),
                tap.send(&frame),
                tun.send(&ip),
            )
        })
        .unwrap();
    assert!(is_up(&tap_link), "{tap_link}");
    assert!(tap_link.contains("link/ether"), "{tap_link}");
    assert!(is_up(&tun_link), "{tun_link}");
    assert!(tun_link.contains("link/none"), "{tun_link}");
    assert!(tap_took, "the TAP device refused a frame");
    assert!(tun_took, "the TUN device refused a packet");
}
