//! pktgen: a packet generator and sink on the driver side of a ring port
//! (netmap's pkt-gen, run inside the "guest").

use std::time::{Duration, Instant};

use packet::build::Frame;
use ring::driver::{Driver, DriverStats};
use serde::Serialize;

/// What to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Transmit as fast as allowed.
    Tx,
    /// Receive and count.
    Rx,
    /// Send one frame, wait for its reply, repeat: round-trip times.
    PingPong,
    /// Answer every frame with addresses swapped (the other end of ping-pong).
    Pong,
}

/// A generator mode that does not exist.
#[derive(Debug, thiserror::Error)]
#[error("unknown mode {0:?}: tx, rx, ping-pong or pong")]
pub struct UnknownRole(pub String);

impl std::str::FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Role, UnknownRole> {
        match s {
            "tx" => Ok(Role::Tx),
            "rx" => Ok(Role::Rx),
            "ping-pong" | "pingpong" => Ok(Role::PingPong),
            "pong" => Ok(Role::Pong),
            _ => Err(UnknownRole(s.to_string())),
        }
    }
}

/// Generator settings.
#[derive(Clone, Debug)]
pub struct Params {
    /// What to do.
    pub role: Role,
    /// Frame length in bytes without the FCS (60 is the Ethernet minimum).
    pub size: usize,
    /// Frames per transmit or receive call.
    pub burst: usize,
    /// Packets per second; None: as fast as possible.
    pub rate: Option<f64>,
    /// Stop after this many packets.
    pub count: Option<u64>,
    /// Stop after this long.
    pub duration: Duration,
    /// Source address of the generated frames.
    pub src_mac: [u8; 6],
    /// Destination address of the generated frames.
    pub dst_mac: [u8; 6],
}

impl Default for Params {
    fn default() -> Self {
        Params {
            role: Role::Tx,
            size: 60,
            burst: 64,
            rate: None,
            count: None,
            duration: Duration::from_secs(5),
            src_mac: [0x02, 0xfa, 0, 0, 0, 1],
            dst_mac: [0x02, 0xfa, 0, 0, 0, 2],
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// The role run (`tx`, `rx`, `ping-pong`, `pong`).
    pub mode: String,
    /// Packets sent (tx), received (rx, pong) or answered (ping-pong).
    pub packets: u64,
    /// Bytes of those packets, without FCS.
    pub bytes: u64,
    /// Seconds the run took.
    pub seconds: f64,
    /// Packets per second.
    pub pps: f64,
    /// Megabits per second on the wire (frame plus FCS).
    pub mbps: f64,
    /// Kicks (driver-to-device notifications) during the run.
    pub kicks: u64,
    /// Interrupts (device-to-driver notifications) during the run.
    pub interrupts: u64,
    /// Kicks per packet.
    pub kicks_per_packet: f64,
    /// Interrupts per packet.
    pub interrupts_per_packet: f64,
    /// Kicks and interrupts per packet.
    pub notifications_per_packet: f64,
    /// Ping-pong: transactions per second.
    pub transactions_per_sec: f64,
    /// Ping-pong: median round-trip time (us).
    pub rtt_us_p50: f64,
    /// Ping-pong: 90th percentile round-trip time (us).
    pub rtt_us_p90: f64,
    /// Ping-pong: 99th percentile round-trip time (us).
    pub rtt_us_p99: f64,
    /// Ping-pong: longest round-trip time (us).
    pub rtt_us_max: f64,
    /// Ping-pong: requests whose reply never came (timed out after 100 ms).
    pub lost: u64,
}

/// A UDP frame of exactly `size` bytes (at least 42).
pub fn udp_frame(size: usize, src: [u8; 6], dst: [u8; 6]) -> Vec<u8> {
    let size = size.max(42);
    let payload = vec![0x5a; size - 42];
    let mut f = Frame::udp(
        "10.99.0.1".parse().expect("literal"),
        "10.99.0.2".parse().expect("literal"),
        1024,
        9,
        &payload,
    );
    f.eth.src = src;
    f.eth.dst = dst;
    f.to_bytes()
}

fn report(mode: &str, s: &DriverStats, packets: u64, bytes: u64, secs: f64) -> Report {
    let p = packets.max(1) as f64;
    Report {
        mode: mode.into(),
        packets,
        bytes,
        seconds: secs,
        pps: packets as f64 / secs,
        // Bits on the wire: frame plus 4-byte FCS, as Ethernet counts them.
        mbps: (bytes + 4 * packets) as f64 * 8.0 / secs / 1e6,
        kicks: s.kicks,
        interrupts: s.irqs,
        kicks_per_packet: s.kicks as f64 / p,
        interrupts_per_packet: s.irqs as f64 / p,
        notifications_per_packet: s.notifications() as f64 / p,
        ..Default::default()
    }
}

/// Run one generator role on `drv` until its count or duration is reached,
/// or `stop` returns true.
pub fn run(drv: &mut Driver, p: &Params, stop: &dyn Fn() -> bool) -> Report {
    let frame = udp_frame(p.size, p.src_mac, p.dst_mac);
    let start_stats = drv.stats;
    let t0 = Instant::now();
    let end = t0 + p.duration;
    let limit = p.count.unwrap_or(u64::MAX);
    let wait = Duration::from_millis(5);
    let mut packets = 0u64;
    let mut bytes = 0u64;
    let mut rtts: Vec<f64> = Vec::new();
    let mut lost = 0;
    let mut iter = 0u32;
    let mut now = t0;
    while packets < limit && now < end {
        iter = iter.wrapping_add(1);
        if iter.is_multiple_of(64) && stop() {
            break;
        }
        match p.role {
            Role::Tx => {
                if let Some(rate) = p.rate {
                    let due = t0 + Duration::from_secs_f64(packets as f64 / rate);
                    if due > now {
                        std::thread::sleep((due - now).min(wait));
                        now = Instant::now();
                        continue;
                    }
                }
                let want = (p.burst as u64).min(limit - packets) as usize;
                let n = drv.send(want, |_, b| {
                    b[..frame.len()].copy_from_slice(&frame);
                    frame.len()
                });
                if n == 0 {
                    drv.wait_tx(wait);
                }
                packets += n as u64;
                bytes += (n * frame.len()) as u64;
            }
            Role::Rx => {
                let n = drv.recv(p.burst.max(1), |f| bytes += f.len() as u64);
                if n == 0 {
                    drv.wait_rx(wait);
                }
                packets += n as u64;
            }
            Role::Pong => {
                let mut replies: Vec<Vec<u8>> = Vec::new();
                let n = drv.recv(p.burst.max(1), |f| {
                    let mut r = f.to_vec();
                    if r.len() >= 12 {
                        let (d, s) = r.split_at_mut(6);
                        d.swap_with_slice(&mut s[..6]);
                    }
                    replies.push(r);
                });
                if n == 0 {
                    drv.wait_rx(wait);
                }
                let mut i = 0;
                while i < replies.len() && Instant::now() < end {
                    let k = drv.send(replies.len() - i, |j, b| {
                        let r = &replies[i + j];
                        b[..r.len()].copy_from_slice(r);
                        r.len()
                    });
                    if k == 0 {
                        drv.wait_tx(wait);
                    }
                    i += k;
                }
                packets += n as u64;
            }
            Role::PingPong => {
                let sent_at = Instant::now();
                while drv.send(1, |_, b| {
                    b[..frame.len()].copy_from_slice(&frame);
                    frame.len()
                }) == 0
                {
                    drv.wait_tx(wait);
                    if Instant::now() >= end {
                        break;
                    }
                }
                let deadline = sent_at + Duration::from_millis(100);
                let mut got = false;
                while !got && Instant::now() < deadline {
                    if drv.recv(1, |_| ()) == 1 {
                        got = true;
                    } else {
                        drv.wait_rx(Duration::from_millis(1));
                    }
                }
                if got {
                    rtts.push(sent_at.elapsed().as_secs_f64() * 1e6);
                    packets += 1;
                    bytes += frame.len() as u64;
                } else {
                    lost += 1;
                }
            }
        }
        now = Instant::now();
    }
    if p.role == Role::Tx {
        drv.flush(Duration::from_secs(1));
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    let mut s = drv.stats;
    s.kicks -= start_stats.kicks;
    s.irqs -= start_stats.irqs;
    let name = match p.role {
        Role::Tx => "tx",
        Role::Rx => "rx",
        Role::PingPong => "ping-pong",
        Role::Pong => "pong",
    };
    let mut r = report(name, &s, packets, bytes, secs);
    if p.role == Role::PingPong {
        r.transactions_per_sec = rtts.len() as f64 / secs;
        rtts.sort_by(|a, b| a.total_cmp(b));
        let pct = |q: f64| -> f64 {
            if rtts.is_empty() {
                0.0
            } else {
                rtts[((rtts.len() - 1) as f64 * q).round() as usize]
            }
        };
        r.rtt_us_p50 = pct(0.5);
        r.rtt_us_p90 = pct(0.9);
        r.rtt_us_p99 = pct(0.99);
        r.rtt_us_max = pct(1.0);
        r.lost = lost;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_have_the_asked_size_and_parse() {
        for size in [60, 64, 1514] {
            let f = udp_frame(size, [2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
            assert_eq!(f.len(), size);
            let p = packet::parse_frame(&f).expect("parses");
            assert_eq!(p.flow.dst_port, 9);
        }
    }
}
