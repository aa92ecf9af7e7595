//! Checksum offload on AF_XDP: with transmit
//! checksum offload left ON on the client's veth, its TCP segments carry
//! partial checksums (the pseudo-header sum); XDP does not say so, and a
//! backend would drop them all as checksum errors. The load balancer, on
//! AF_XDP, completes them: real HTTP through the VIP succeeds.

mod common;

use std::time::Duration;

#[test]
#[ignore = "system test: root, namespaces, AF_XDP, nginx, ethtool"]
fn tcp_through_af_xdp_with_the_clients_checksum_offload_on() {
    let mut t = common::topology(1, 2, "encap");
    // What the topology turned off, back on: the sender offloads.
    t.client.exec(&["ethtool", "-K", "c0", "tx", "on"]).unwrap();
    let k = t.client.exec(&["ethtool", "-k", "c0"]).unwrap();
    let k = String::from_utf8_lossy(&k.stdout);
    assert!(
        k.lines()
            .any(|l| l.trim().starts_with("tx-checksumming: on")),
        "{k}"
    );
    t.start_lb().unwrap();
    t.wait_for_vip(Duration::from_secs(20)).unwrap();
    let status = t.status_of(1).unwrap();
    if !status.driver.starts_with("AF_XDP") {
        // AF_PACKET completes by the kernel's flag: not what this tests.
        systest::missing(&format!(
            "the AF_XDP driver on veth (the load balancer runs {})",
            status.driver
        ));
    }
    let by = t.requests(20).unwrap();
    assert_eq!(by.get(""), None, "no request failed: {by:?}");
    assert_eq!(by.values().sum::<usize>(), 20);
    let raw = t.api("GET", "/status").unwrap();
    let n = serde_json::from_str::<serde_json::Value>(&raw)
        .ok()
        .and_then(|v| v["csum_completed"].as_u64())
        .unwrap_or_else(|| panic!("no csum_completed in /status: {raw}"));
    // The kernel completes most partial checksums itself before XDP sees
    // the frame (veth hands XDP a copy of many skbs); the ones it leaves
    // are what broke connections before. At least one must have come.
    assert!(n >= 1, "no partial checksum was completed: {n}");
}
