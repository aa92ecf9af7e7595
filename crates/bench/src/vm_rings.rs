//! The receiving guest's rings: guest to guest beside guest to a sink, and
//! TCP between the two guests, with the vhost-user NICs' rings at a given
//! size (QEMU's `rx_queue_size` / `tx_queue_size`), alone: the narrow form
//! of those rows of `fastpath switch bench --part vm`, for comparing ring
//! sizes run by run with the same binary.
//!
//! The switch runs in this process with ports `vm-a`, `vm-b` and a sink;
//! guest A has one NIC (on `vm-a`), guest B one (on `vm-b`). Each run
//! boots both guests with the given rings, reads the rings the guest's
//! driver set up (`ethtool -g`), measures guest to guest exactly as the vm
//! part does (pktgen in A, burst 32, to the sink and then to B, in each
//! repeat; drops counted at B's full ring by the switch and inside B by
//! its kernel), then TCP from A to B with iperf3 (1 and 4 streams), with
//! the sender's retransmits.

use std::path::Path;
use std::time::{Duration, Instant};

use lab::guest::{Guest, GuestOpts, Nic};
use serde::{Deserialize, Serialize};

use crate::switch_ports::SinkPort;
use crate::vm::{err, stats, GuestToGuest, Stats, VmError, VmOptions};

// The vm part's addresses: its guest-to-guest row sends to them.
use crate::vm::{IP_A, IP_B, MAC_A, MAC_B, MAC_SINK};
/// Seconds of each iperf3 run.
const TCP_SECS: u32 = 5;

/// The rings a guest's driver runs with, from `ethtool -g`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rings {
    /// The device's largest receive ring.
    pub rx_max: u32,
    /// The device's largest transmit ring.
    pub tx_max: u32,
    /// The receive ring in use.
    pub rx: u32,
    /// The transmit ring in use.
    pub tx: u32,
}

/// Read `ethtool -g`: the `RX:` and `TX:` lines under "Pre-set maximums"
/// and under "Current hardware settings"; `None` without both sections.
pub fn parse_rings(out: &str) -> Option<Rings> {
    let mut r = Rings::default();
    let mut section = 0;
    let (mut seen_max, mut seen_cur) = (false, false);
    for l in out.lines() {
        let l = l.trim();
        if l.starts_with("Pre-set maximums") {
            section = 1;
            continue;
        }
        if l.starts_with("Current hardware settings") {
            section = 2;
            continue;
        }
        let Some((key, val)) = l.split_once(':') else {
            continue;
        };
        let Ok(n) = val.trim().parse::<u32>() else {
            continue;
        };
        match (section, key.trim()) {
            (1, "RX") => (r.rx_max, seen_max) = (n, true),
            (1, "TX") => r.tx_max = n,
            (2, "RX") => (r.rx, seen_cur) = (n, true),
            (2, "TX") => r.tx = n,
            _ => {}
        }
    }
    (seen_max && seen_cur).then_some(r)
}

/// One run at one ring size.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RingsRun {
    /// The ring size asked of QEMU.
    pub vhost_ring: u16,
    /// What guest B's driver runs with.
    pub guest_b_rings: Rings,
    /// Guest to guest beside guest to the sink (`o.repeats` repeats).
    pub guest_to_guest: GuestToGuest,
    /// TCP from A to B, 1 stream: Gbit/s as B received.
    pub tcp1_gbps: f64,
    /// Its sender's retransmits.
    pub tcp1_retransmits: u64,
    /// TCP from A to B, 4 streams: Gbit/s.
    pub tcp4_gbps: f64,
    /// Its sender's retransmits.
    pub tcp4_retransmits: u64,
    /// Frames the switch dropped at B's full ring during the TCP runs.
    pub tcp_dropped_at_full_ring: u64,
    /// The 1-minute load average at the start.
    pub load: f64,
}

/// Boot the two guests with `o.vhost_ring` entries per ring and measure
/// (sockets in `dir`).
pub fn run(o: &VmOptions, dir: &Path) -> Result<RingsRun, VmError> {
    if !lab::guest::available() {
        return Err(VmError::Unavailable);
    }
    let load = crate::proc::load_average_1min();
    let sock = |n: &str| crate::vm::vm_sock(dir, "rings-", n);
    let mut sw = crate::vm::vm_switch(
        dir,
        "rings-",
        o.poll_us,
        &[("vm-a", MAC_A), ("vm-b", MAC_B)],
    )?;
    let idx_a = sw.find("vm-a").unwrap_or(0);
    let idx_b = sw.find("vm-b").unwrap_or(1);
    let idx_sink = sw
        .add_port(Box::new(SinkPort::with_mac("sink", MAC_SINK)))
        .map_err(VmError::Switch)?;
    let mut running = crate::vm::Running::new(sw);
    running.start();
    let opts = |name: &str, s: &str, mac: &str, ip: &str| {
        GuestOpts::new(name, vec![Nic::vhost_user(&sock(s), mac)])
            .ip(&format!("{ip}/24"))
            .vhost_ring(o.vhost_ring)
            .limit(Duration::from_secs(900))
    };
    let say = |s: &str| {
        if let Some(p) = &o.progress {
            p(s);
        }
    };
    say(&format!(
        "rings: booting two guests with {}-entry vhost-user rings",
        o.vhost_ring
    ));
    let t0 = Instant::now();
    let mut a = Guest::start(&opts("RA", "vm-a", MAC_A, IP_A)).map_err(err("RA"))?;
    let mut b = Guest::start(&opts("RB", "vm-b", MAC_B, IP_B)).map_err(err("RB"))?;
    a.wait_ready(lab::guest::BOOT).map_err(err("RA"))?;
    b.wait_ready(lab::guest::BOOT).map_err(err("RB"))?;
    say(&format!(
        "rings: guests up after {:.0} s",
        t0.elapsed().as_secs_f64()
    ));
    let a_if = a.iface(MAC_A).map_err(err("RA"))?;
    let b_if = b.iface(MAC_B).map_err(err("RB"))?;
    let cmd = format!("ethtool -g {b_if}");
    let out = b.ok(&cmd, Duration::from_secs(30)).map_err(err("RB"))?;
    let guest_b_rings = parse_rings(&out).ok_or_else(|| VmError::Io {
        what: format!("guest B's `{cmd}`: cannot read it: {out}"),
        source: std::io::Error::other("no ring sizes"),
    })?;
    say(&format!(
        "rings: guest B's driver runs with {guest_b_rings:?}"
    ));
    // ARP both ways before anything is timed.
    let p = a.ping(IP_B, 3, 200).map_err(err("RA"))?;
    if p.received == 0 {
        return Err(VmError::Io {
            what: format!("rings: no ping reply from B: {}", a.console_tail()),
            source: std::io::Error::other("no reply"),
        });
    }
    let mut bench =
        crate::vm::Bench::narrow(o, running, a, b, a_if, b_if, [idx_a, idx_b, idx_sink]);
    let guest_to_guest = bench.guest_to_guest()?;
    let dropped_b = |bench: &mut crate::vm::Bench| bench.dropped_at(idx_b);
    let d0 = dropped_b(&mut bench);
    let (a, b) = bench.guests();
    let within = Duration::from_secs(u64::from(TCP_SECS) + 120);
    let mut tcp = |streams: u32| -> Result<lab::guest::Iperf, VmError> {
        b.iperf3_server(Duration::from_secs(30))
            .map_err(err("RB"))?;
        let c = a
            .iperf3_client(IP_B, TCP_SECS, streams, within)
            .map_err(err("RA"))?;
        let s = b
            .iperf3_server_result(Duration::from_secs(30))
            .map_err(err("RB"))?;
        say(&format!(
            "rings: TCP A to B, {streams} stream(s): {:.3} Gbit/s, {} retransmits ({}-entry rings)",
            s.gbps(),
            c.retransmits,
            o.vhost_ring
        ));
        Ok(lab::guest::Iperf {
            retransmits: c.retransmits,
            ..s
        })
    };
    let t1 = tcp(1)?;
    let t4 = tcp(4)?;
    let d1 = dropped_b(&mut bench);
    Ok(RingsRun {
        vhost_ring: o.vhost_ring,
        guest_b_rings,
        guest_to_guest,
        tcp1_gbps: t1.gbps(),
        tcp1_retransmits: t1.retransmits,
        tcp4_gbps: t4.gbps(),
        tcp4_retransmits: t4.retransmits,
        tcp_dropped_at_full_ring: d1.saturating_sub(d0),
        load,
    })
}

/// Runs at each ring size in `sizes`, alternated (`rounds` rounds: the
/// first size, the second, the first, ...), each with `o.repeats`
/// guest-to-guest repeats.
pub fn alternate(
    o: &VmOptions,
    dir: &Path,
    sizes: &[u16],
    rounds: usize,
) -> Result<Vec<RingsRun>, VmError> {
    let mut out = Vec::new();
    for _ in 0..rounds {
        for &r in sizes {
            if o.stop.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(VmError::Interrupted);
            }
            let o = VmOptions {
                vhost_ring: r,
                ..o.clone()
            };
            out.push(run(&o, dir)?);
        }
    }
    Ok(out)
}

/// Per ring size: guest-to-guest over guest-to-sink ratios (every repeat
/// of every run), 4-stream TCP Gbit/s and retransmits (per run).
pub fn summary(runs: &[RingsRun]) -> String {
    let mut sizes: Vec<u16> = runs.iter().map(|r| r.vhost_ring).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut t = measure::Table::new([
        "ring",
        "guest B's rx/tx",
        "g2g / sink (min/med/max)",
        "B received / sink",
        "dropped at B's ring / run",
        "dropped in B / run",
        "TCP 1 Gbit/s",
        "TCP 1 retr",
        "TCP 4 Gbit/s",
        "TCP 4 retr",
    ])
    .title("the receiving guest's rings (alternated runs, same binary)");
    for s in sizes {
        let rs: Vec<&RingsRun> = runs.iter().filter(|r| r.vhost_ring == s).collect();
        let all = |f: &dyn Fn(&GuestToGuest) -> &Stats| -> Stats {
            let v: Vec<f64> = rs
                .iter()
                .flat_map(|r| f(&r.guest_to_guest).samples.clone())
                .collect();
            stats(&v)
        };
        let per = |f: &dyn Fn(&RingsRun) -> f64| -> Stats {
            stats(&rs.iter().map(|r| f(r)).collect::<Vec<_>>())
        };
        let mmm = |s: &Stats, d: usize| {
            let f = |x: Option<f64>| crate::nan::cell(x, d);
            format!("{} / {} / {}", f(s.min), f(s.median), f(s.max))
        };
        let rings = rs
            .first()
            .map(|r| format!("{}/{}", r.guest_b_rings.rx, r.guest_b_rings.tx))
            .unwrap_or_default();
        t.row([
            s.to_string(),
            rings,
            mmm(&all(&|g| &g.ratio_over_sink), 2),
            mmm(&all(&|g| &g.rx_ratio_over_sink), 3),
            mmm(&all(&|g| &g.dropped_at_full_ring), 0),
            mmm(&all(&|g| &g.dropped_in_guest), 0),
            mmm(&per(&|r| r.tcp1_gbps), 3),
            mmm(&per(&|r| r.tcp1_retransmits as f64), 0),
            mmm(&per(&|r| r.tcp4_gbps), 3),
            mmm(&per(&|r| r.tcp4_retransmits as f64), 0),
        ]);
    }
    let placement = runs
        .first()
        .map(|r| r.guest_to_guest.placement.clone())
        .unwrap_or_default();
    format!("{t}\nguest to guest placed: {placement}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ethtool_rings() {
        let out = "Ring parameters for eth0:\nPre-set maximums:\nRX:\t\t1024\nRX Mini:\tn/a\nRX Jumbo:\tn/a\nTX:\t\t1024\nTX push buff len:\tn/a\nCurrent hardware settings:\nRX:\t\t1024\nRX Mini:\tn/a\nRX Jumbo:\tn/a\nTX:\t\t256\nRX Buf Len:\t\tn/a\n";
        assert_eq!(
            parse_rings(out),
            Some(Rings {
                rx_max: 1024,
                tx_max: 1024,
                rx: 1024,
                tx: 256
            })
        );
        assert_eq!(parse_rings("netlink error: Operation not supported"), None);
    }
}
