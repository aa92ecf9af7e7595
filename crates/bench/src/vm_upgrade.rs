//! `vm.upgrade`: the switch restarted under two running guests that ping
//! each other through it.
//!
//! `fastpath switch run` runs as a process of its own (this program, with
//! `switch run`) with two vhost-user ports; two TCG guests boot on them
//! with QEMU's `reconnect-ms=100` on each vhost-user chardev. Guest A
//! pings guest B every 100 ms; two seconds in, the switch is stopped
//! (`SIGTERM`, or `SIGKILL` for the crash case) and a new one started at
//! once on the same sockets. QEMU notices the closed socket, restores each
//! queue's next entry from the used ring in guest memory, connects again
//! within 100 ms of the new socket appearing and sets the device up again.
//! The NICs offer the guest no link status (`status=off`, set by
//! [`lab::guest`] for every reconnecting NIC): with it, QEMU takes the
//! guest's link down on the disconnect and up on the reconnect, the guest
//! flushes its ARP entries on the way down and drops what it sends while
//! down, its ARP request for the next ping included, and Linux asks again
//! only after its retransmit time, a second: pings then resumed about
//! 1,000 ms after the new switch served (1,111-1,117 ms gaps) where without
//! the link change they resume once QEMU has reconnected (156 ms). What
//! the guest sends meanwhile waits in its ring for the new switch. Each
//! restart gives:
//!
//! - `ping_gap_ms`: the longest stretch between two replies A received
//!   (100 ms resolution: the ping interval), which holds the old switch's
//!   exit, the new one's start, QEMU's reconnect and ARP if it expired;
//! - `switch_down_ms`: from the signal to the new switch answering on its
//!   control socket (what the switch itself costs);
//! - `reboots`: guests whose boot id changed (must stay 0);
//! - `resumed_after_serving_ms`: from the new switch serving to A's first
//!   reply after the gap (the goal's measure; read early, see below);
//! - `breakdown`: each step's time after the stop (the old switch's exit,
//!   the new one serving, each QEMU connecting, each port's rings
//!   running, the first frame each way, the replies either side of the
//!   gap), the guests' carrier changes and the frames from A over time.
//!   Switch-side steps are on this program's clock (status polled every
//!   few ms); reply times come from the ping's sequence numbers and round
//!   trips, placed by when its command was written to the console; the
//!   ping starts later than that, so they read early, by up to about
//!   100 ms (one reply was placed 32 ms after the stop, before the rings
//!   it went through ran at 105 ms). `ping_gap_ms` has no such error.
//!
//! Minimum, median and maximum over the restarts; the machine is shared
//! and the guests' CPUs emulated, so a gap also holds the time a loaded
//! host takes to schedule QEMU's reconnect and the guests' vCPUs.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lab::guest::{Guest, GuestOpts, Nic};
use rustix::process::Signal;
use serde::{Deserialize, Serialize};

use crate::vm::{err, stats, Stats, VmError, VmOptions};

const MAC_A: &str = "52:54:00:fa:1a:01";
const MAC_B: &str = "52:54:00:fa:1b:01";
const IP_A: &str = "10.79.0.1";
const IP_B: &str = "10.79.0.2";
/// Ping interval, ms: the gap's resolution.
pub const INTERVAL_MS: u32 = 100;
/// Pings per restart (10 s).
const PINGS: u32 = 100;
/// QEMU's reconnect interval, ms.
pub const RECONNECT_MS: u32 = 100;

/// The upgrade row.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Upgrade {
    /// Longest stretch without a reply, per restart, ms.
    pub ping_gap_ms: Stats,
    /// Signal to the new switch serving, per restart, ms.
    pub switch_down_ms: Stats,
    /// Signal to both guests' queues running on the new switch (QEMU
    /// reconnected and set the device up again), per restart, ms.
    pub reconnected_ms: Stats,
    /// Guests whose boot id changed over all restarts.
    pub reboots: u32,
    /// Restarts after which pings did not come back.
    pub not_resumed: u32,
    /// Restarts after which the new switch carried frames both ways on
    /// both ports (QEMU reconnected to it, not to something else).
    pub carried_by_new_switch: u32,
    /// How the old switch was stopped.
    pub signal: String,
    /// What the figures are.
    pub is: String,
    /// From the new switch serving (answering on its control socket) to
    /// guest A's first ping reply through it, per restart, ms: the goal's
    /// "pings resume after the new switch serves".
    #[serde(default)]
    pub resumed_after_serving_ms: Stats,
    /// Where the time went, per restart.
    #[serde(default)]
    pub breakdown: Vec<Breakdown>,
}

/// One restart's steps, each in ms after the old switch was signalled
/// (`None`: not seen within the watch).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Breakdown {
    /// The old switch exited.
    pub old_exited_ms: f64,
    /// The new switch process was started.
    pub new_started_ms: f64,
    /// The new switch answered on its control socket (its VM ports'
    /// sockets listen by then).
    pub serving_ms: f64,
    /// Each guest's QEMU connected to its port again (A, B).
    pub connected_ms: [Option<f64>; 2],
    /// Each port's rings ran again (QEMU set the device up: A, B).
    pub rings_ms: [Option<f64>; 2],
    /// The first frame the new switch took from each guest (A, B).
    pub first_from_ms: [Option<f64>; 2],
    /// The first frame it put in each guest's ring (A, B).
    pub first_to_ms: [Option<f64>; 2],
    /// Guest A's last reply before the gap, from its ping's sequence
    /// numbers and round trips (± the console's latency).
    pub last_reply_ms: Option<f64>,
    /// Guest A's first reply after the gap, likewise.
    pub first_reply_ms: Option<f64>,
    /// Carrier changes each guest's NIC counted over the restart
    /// (`/sys/class/net/eth0/carrier_changes`; 2: QEMU took the link down
    /// on the disconnect and up on the reconnect).
    pub carrier_changes: [u64; 2],
    /// Frames taken from A by the new switch over time: `ms: count` each
    /// time it changed (ARP requests and pings that found no answer show
    /// as steps before the first reply).
    pub from_a: Vec<(f64, u64)>,
}

impl Breakdown {
    /// One line: each step's time.
    pub fn line(&self) -> String {
        let o = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.0}"));
        let pair = |p: &[Option<f64>; 2]| format!("{}/{}", o(p[0]), o(p[1]));
        let from_a: Vec<String> = self
            .from_a
            .iter()
            .map(|(t, n)| format!("{t:.0}:{n}"))
            .collect();
        format!(
            "old exited {:.0}, new started {:.0}, serving {:.0}, QEMU connected (A/B) {}, rings running {}, first frame from {}, first frame to {}; last reply before {}, first reply after {}; carrier changes (A/B) {}/{}; frames from A (ms:count) {}",
            self.old_exited_ms,
            self.new_started_ms,
            self.serving_ms,
            pair(&self.connected_ms),
            pair(&self.rings_ms),
            pair(&self.first_from_ms),
            pair(&self.first_to_ms),
            o(self.last_reply_ms),
            o(self.first_reply_ms),
            self.carrier_changes[0],
            self.carrier_changes[1],
            from_a.join(" "),
        )
    }
}

/// The switch process, killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// Signal it and wait (at most 10 s, then SIGKILL) for it to exit.
    fn stop(mut self, sig: Signal) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, sig);
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Drop kills and reaps it.
    }
}

/// Start `exe switch run` with the two ports and wait (at most 20 s) until
/// it answers on its control socket.
fn start(exe: &Path, ctl: &Path, socks: &[(PathBuf, &str, &str); 2]) -> Result<Proc, VmError> {
    let mut cmd = Command::new(exe);
    cmd.args(["switch", "run", "--socket"]).arg(ctl);
    for (sock, name, mac) in socks {
        cmd.arg("--vhost-user")
            .arg(format!("{},name={name},mac={mac}", sock.display()));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: one async-signal-safe system call between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            Ok(())
        });
    }
    let p = Proc(cmd.spawn().map_err(|source| VmError::Io {
        what: format!("starting {} switch run", exe.display()),
        source,
    })?);
    let t = Instant::now();
    loop {
        if vswitch::status::ask(ctl).is_ok() {
            return Ok(p);
        }
        if t.elapsed() > Duration::from_secs(20) {
            return Err(VmError::Io {
                what: "the switch did not answer on its control socket within 20 s".into(),
                source: std::io::Error::from(std::io::ErrorKind::TimedOut),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The replies busybox `ping` printed: sequence number and round trip
/// (ms), by sequence number.
pub fn replies(out: &str) -> Vec<(u32, f64)> {
    let field = |l: &str, key: &str| -> Option<String> {
        let at = l.find(key)? + key.len();
        Some(
            l[at..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect(),
        )
    };
    let mut v: Vec<(u32, f64)> = out
        .lines()
        .filter_map(|l| {
            let seq = field(l, "seq=")?.parse().ok()?;
            let rtt = field(l, "time=")?.parse().ok()?;
            Some((seq, rtt))
        })
        .collect();
    v.sort_by_key(|r| r.0);
    v.dedup_by_key(|r| r.0);
    v
}

/// The longest stretch between two replies' arrivals, in ms, among
/// `count` pings sent every `interval_ms` (reply `s` arrives at `s` x
/// interval + its round trip), and whether replies came after it. A run
/// that ends with more than a second of silence did not resume: the gap
/// then runs to the end.
pub fn longest_gap_ms(replies: &[(u32, f64)], count: u32, interval_ms: u32) -> (f64, bool) {
    let at = |(s, rtt): (u32, f64)| f64::from(s) * f64::from(interval_ms) + rtt;
    let end = f64::from(count) * f64::from(interval_ms);
    let Some(&last) = replies.last() else {
        return (end, false);
    };
    let mut gap = replies.first().map_or(0.0, |f| at(*f));
    for w in replies.windows(2) {
        gap = gap.max(at(w[1]) - at(w[0]));
    }
    let tail = end - at(last);
    let resumed = tail <= 1000.0;
    (if resumed { gap } else { gap.max(tail) }, resumed)
}

/// Watch the new switch at `ctl` for `for_ms` after `since` (the stop):
/// when each port's frontend connected, its rings ran, it first gave and
/// took a frame, and guest A's frames over time.
fn watch(
    ctl: &Path,
    socks: &[(PathBuf, &str, &str); 2],
    since: Instant,
    for_ms: u64,
    b: &mut Breakdown,
) {
    let ms = |since: Instant| since.elapsed().as_secs_f64() * 1000.0;
    let mut last_a = 0u64;
    while since.elapsed() < Duration::from_millis(for_ms) {
        if let Ok(st) = vswitch::status::ask(ctl) {
            let now = ms(since);
            for (i, (_, name, _)) in socks.iter().enumerate() {
                let Some(p) = st.ports.iter().find(|p| p.name == *name) else {
                    continue;
                };
                if let vswitch::status::PortDetail::Vhost(v) = &p.detail {
                    if v.connected && b.connected_ms[i].is_none() {
                        b.connected_ms[i] = Some(now);
                    }
                    if v.running && b.rings_ms[i].is_none() {
                        b.rings_ms[i] = Some(now);
                    }
                }
                if p.from_port > 0 && b.first_from_ms[i].is_none() {
                    b.first_from_ms[i] = Some(now);
                }
                if p.to_port > 0 && b.first_to_ms[i].is_none() {
                    b.first_to_ms[i] = Some(now);
                }
                if i == 0 && p.from_port != last_a {
                    last_a = p.from_port;
                    b.from_a.push((now.round(), last_a));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Both ports' rings running, ms after the stop (the later of the two).
fn both_running(b: &Breakdown) -> Option<f64> {
    Some(b.rings_ms[0]?.max(b.rings_ms[1]?))
}

fn carrier_changes(g: &mut Guest) -> u64 {
    g.ok(
        "cat /sys/class/net/eth0/carrier_changes",
        Duration::from_secs(30),
    )
    .ok()
    .and_then(|s| s.trim().lines().last()?.trim().parse().ok())
    .unwrap_or(0)
}

fn boot_id(g: &mut Guest) -> Result<String, VmError> {
    g.ok(
        "cat /proc/sys/kernel/random/boot_id",
        Duration::from_secs(30),
    )
    .map(|s| s.trim().to_string())
    .map_err(err("upgrade"))
}

/// Boot two guests on `exe switch run`, restart the switch `restarts`
/// times with `sig` under their pings, and measure.
pub fn measure(
    exe: &Path,
    dir: &Path,
    restarts: usize,
    sig: Signal,
    say: &dyn Fn(&str),
) -> Result<Upgrade, VmError> {
    let ctl = dir.join("upgrade-switch.sock");
    let socks = [
        (dir.join("up-a.sock"), "vm-ua", MAC_A),
        (dir.join("up-b.sock"), "vm-ub", MAC_B),
    ];
    let mut sw = Some(start(exe, &ctl, &socks)?);
    let opts = |name: &str, sock: &Path, mac: &str, ip: &str| {
        GuestOpts::new(
            name,
            vec![Nic::vhost_user(sock, mac).reconnect(RECONNECT_MS)],
        )
        .ip(&format!("{ip}/24"))
        .limit(Duration::from_secs(900))
    };
    say("upgrade: booting two guests with reconnecting vhost-user NICs");
    let mut a = Guest::start(&opts("UA", &socks[0].0, MAC_A, IP_A)).map_err(err("UA"))?;
    let mut b = Guest::start(&opts("UB", &socks[1].0, MAC_B, IP_B)).map_err(err("UB"))?;
    a.wait_ready(lab::guest::BOOT).map_err(err("UA"))?;
    b.wait_ready(lab::guest::BOOT).map_err(err("UB"))?;
    // ARP and a path that works before anything is restarted.
    let p = a.ping(IP_B, 5, 200).map_err(err("UA"))?;
    if p.received == 0 {
        return Err(VmError::Io {
            what: format!(
                "upgrade: no ping reply from B before any restart: {}",
                a.console_tail()
            ),
            source: std::io::Error::other("no reply"),
        });
    }
    let ids = [boot_id(&mut a)?, boot_id(&mut b)?];
    let mut gaps = Vec::new();
    let mut down = Vec::new();
    let mut not_resumed = 0;
    let mut carried = 0;
    let mut back_ms = Vec::new();
    let mut after_serving = Vec::new();
    let mut breakdown = Vec::new();
    for r in 0..restarts {
        let carrier0 = [carrier_changes(&mut a), carrier_changes(&mut b)];
        let cmd = format!(
            "ping -c {PINGS} -i {} -W 1 {IP_B}",
            f64::from(INTERVAL_MS) / 1000.0
        );
        let within =
            Duration::from_millis(u64::from(PINGS * INTERVAL_MS)) + Duration::from_secs(60);
        let old = sw.take();
        let mut bd = Breakdown::default();
        let ping_started = Instant::now();
        let (out, new) = std::thread::scope(|s| {
            let h = s.spawn(|| a.run(&cmd, within));
            std::thread::sleep(Duration::from_secs(2));
            let t = Instant::now();
            let ms = |t: Instant| t.elapsed().as_secs_f64() * 1000.0;
            if let Some(old) = old {
                old.stop(sig);
            }
            bd.old_exited_ms = ms(t);
            bd.new_started_ms = bd.old_exited_ms;
            let new = start(exe, &ctl, &socks).map(|n| (n, t.elapsed()));
            if new.is_ok() {
                // Long enough to see an ARP request sent again a second
                // after one that found no answer.
                watch(&ctl, &socks, t, 3000, &mut bd);
            }
            (h.join(), new.map(|(n, took)| (n, took, t)))
        });
        let (new, took, stopped_at) = new?;
        bd.serving_ms = took.as_secs_f64() * 1000.0;
        back_ms.push(both_running(&bd).unwrap_or(f64::NAN));
        sw = Some(new);
        let (_, out) = match out {
            Ok(r) => r.map_err(err("UA"))?,
            Err(e) => std::panic::resume_unwind(e),
        };
        let both_ways = vswitch::status::ask(&ctl).is_ok_and(|st| {
            socks.iter().all(|(_, name, _)| {
                st.ports
                    .iter()
                    .any(|p| p.name == *name && p.from_port > 0 && p.to_port > 0)
            })
        });
        carried += u32::from(both_ways);
        let seqs = replies(&out);
        let (gap, resumed) = longest_gap_ms(&seqs, PINGS, INTERVAL_MS);
        let gap = gap.round();
        // Each reply's arrival on this clock: the ping started about when
        // its command was written (the console adds a few ms).
        let offset = stopped_at.duration_since(ping_started).as_secs_f64() * 1000.0;
        let arrival = |(s, rtt): (u32, f64)| f64::from(s) * f64::from(INTERVAL_MS) + rtt - offset;
        bd.last_reply_ms = seqs
            .iter()
            .map(|r| arrival(*r))
            .filter(|t| *t <= 0.0)
            .reduce(f64::max);
        bd.first_reply_ms = seqs.iter().map(|r| arrival(*r)).find(|t| *t > 0.0);
        let carrier1 = [carrier_changes(&mut a), carrier_changes(&mut b)];
        bd.carrier_changes = [
            carrier1[0].saturating_sub(carrier0[0]),
            carrier1[1].saturating_sub(carrier0[1]),
        ];
        if let Some(f) = bd.first_reply_ms {
            after_serving.push(f - bd.serving_ms);
        } else {
            after_serving.push(f64::NAN);
        }
        say(&format!(
            "upgrade [{}/{restarts}] steps, ms after the stop: {}",
            r + 1,
            bd.line()
        ));
        breakdown.push(bd);
        let slow: Vec<String> = seqs
            .iter()
            .filter(|r| r.1 > 2.0 * f64::from(INTERVAL_MS))
            .map(|(q, t)| format!("seq {q}: {t:.0} ms"))
            .collect();
        if !slow.is_empty() {
            say(&format!("upgrade: slow replies: {}", slow.join(", ")));
        }
        if !resumed {
            not_resumed += 1;
        }
        say(&format!(
            "upgrade [{}/{restarts}]: switch stopped ({sig:?}) and serving again after {} ms, both guests' queues running after {:.0} ms; longest ping gap {gap} ms; {} of {PINGS} replies{}",
            r + 1,
            took.as_millis(),
            back_ms.last().copied().unwrap_or(f64::NAN),
            seqs.len(),
            if resumed { "" } else { "; pings did NOT resume" }
        ));
        gaps.push(gap);
        down.push(took.as_secs_f64() * 1000.0);
    }
    let after = [boot_id(&mut a)?, boot_id(&mut b)?];
    let reboots = ids.iter().zip(&after).filter(|(x, y)| x != y).count() as u32;
    drop(sw);
    drop(a);
    drop(b);
    Ok(Upgrade {
        ping_gap_ms: stats(&gaps),
        switch_down_ms: stats(&down),
        reconnected_ms: stats(&back_ms),
        resumed_after_serving_ms: stats(&after_serving),
        breakdown,
        reboots,
        not_resumed,
        carried_by_new_switch: carried,
        signal: format!("{sig:?}"),
        is: format!(
            "longest stretch without a ping reply (guest A to guest B every {INTERVAL_MS} ms) while `fastpath switch run` is stopped and a new one started on the same sockets; QEMU reconnect-ms={RECONNECT_MS}"
        ),
    })
}

/// The row for `fastpath switch bench --part vm`: this program's own
/// `switch run`, stopped with `SIGTERM`, `o.repeats` times.
pub fn run(o: &VmOptions, dir: &Path) -> Result<Upgrade, VmError> {
    let exe = std::env::current_exe().map_err(|source| VmError::Io {
        what: "finding this program (it runs the switch)".into(),
        source,
    })?;
    let say = |s: &str| {
        if let Some(p) = &o.progress {
            p(s);
        }
    };
    measure(&exe, dir, o.repeats.max(1), Signal::TERM, &say)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_from_ping_output() {
        let out = "PING 10.79.0.2 (10.79.0.2): 56 data bytes\n\
                   64 bytes from 10.79.0.2: seq=0 ttl=64 time=1.5 ms\n\
                   64 bytes from 10.79.0.2: seq=1 ttl=64 time=1.5 ms\n\
                   64 bytes from 10.79.0.2: seq=2 ttl=64 time=451.5 ms\n\
                   64 bytes from 10.79.0.2: seq=9 ttl=64 time=3.5 ms\n\
                   64 bytes from 10.79.0.2: seq=10 ttl=64 time=1.5 ms\n";
        let r = replies(out);
        assert_eq!(r.len(), 5);
        assert_eq!(r[2], (2, 451.5));
        // Reply 2 came 550 ms after reply 1; reply 9 352 ms after it.
        assert_eq!(longest_gap_ms(&r, 11, 100), (550.0, true));
        // Nothing after the restart: not resumed, the gap runs to the end.
        let early = [(0, 1.0), (1, 1.0), (2, 1.0)];
        assert_eq!(longest_gap_ms(&early, 100, 100), (9799.0, false));
        assert_eq!(longest_gap_ms(&[], 100, 100), (10000.0, false));
    }
}
