//! The BIRD client: the one place the daemon (and `fastpath lb withdraw`)
//! runs `birdc`, and the reading of its answers. No BGP is spoken here:
//! BIRD holds the sessions; fastpath asks it what it has (`show protocols
//! all`, read into a [`BirdView`]) and has it read its configuration,
//! enable or disable a protocol. What to ask for is decided elsewhere
//! ([`crate::announce`] for the daemon, [`crate::withdraw`] after it).
//!
//! [`Bird`] is what the decisions are applied through: BIRD itself
//! ([`Birdc`]) or a stand-in in tests.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Why talking to BIRD failed.
#[derive(Debug, thiserror::Error)]
pub enum BirdError {
    /// `[bgp] birdc` names no command (rejected by validation; kept for
    /// callers that build a configuration by hand).
    #[error("bgp.birdc is empty: it needs a command, e.g. [\"birdc\"]")]
    NoBirdc,
    /// birdc could not be started.
    #[error("running {program}: {source} (is bird2 installed?)")]
    Spawn {
        /// The program.
        program: String,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// birdc did not end within its deadline (killed, with what it
    /// started).
    #[error("birdc {command}: no answer within {after:?} (is BIRD stuck?); birdc was killed")]
    Deadline {
        /// The birdc arguments.
        command: String,
        /// The deadline it was given.
        after: Duration,
    },
    /// birdc printed more than the output bound (killed).
    #[error(
        "birdc {command}: printed more than {limit} bytes; birdc was killed and its answer ignored"
    )]
    TooLong {
        /// The birdc arguments.
        command: String,
        /// The bound, in bytes.
        limit: usize,
    },
    /// The daemon began to stop while birdc ran (killed) or before it
    /// could run: what it was asking is left to the stop's own withdrawal.
    #[error("birdc {command}: given up, the daemon is stopping")]
    Cancelled {
        /// The birdc arguments.
        command: String,
    },
    /// Not run: the time given for it (a stop's) had run out.
    #[error("birdc {command}: not run, its time ran out (BIRD did not answer what came before)")]
    OutOfTime {
        /// The birdc arguments.
        command: String,
    },
    /// birdc ran and BIRD refused (codes 8xxx/9xxx, or a failed exit).
    #[error("birdc {command}: {output}")]
    Refused {
        /// The birdc arguments.
        command: String,
        /// What birdc printed.
        output: String,
    },
}

/// What birdc printed and how it exited, as it was: [`Bird::run`] reads
/// it as an answer or a refusal; `lb withdraw` classifies it itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Whether birdc exited with success.
    pub success: bool,
    /// What it printed on stdout (BIRD's answer, errors included).
    pub stdout: String,
    /// What it printed on stderr (birdc's own complaints).
    pub stderr: String,
}

/// The real BIRD, through a birdc command line (`[bgp] birdc`: the program
/// and its own arguments, e.g. `["birdc", "-s", "/run/bird/bird.ctl"]`).
#[derive(Debug, Clone, Copy)]
pub struct Birdc<'a>(pub &'a [String]);

/// How long one birdc command may run: a BIRD that stops answering costs
/// this much, never more (`lb withdraw` runs one per protocol, two at most).
pub const DEADLINE: Duration = Duration::from_secs(2);

/// How much birdc may print (stdout and stderr together). `show protocols
/// all` prints about 1.5 KiB per protocol, so this holds thousands of BGP
/// sessions; a BIRD (or something in its place) that prints more is cut
/// off rather than read into memory.
pub const OUTPUT_LIMIT: usize = 8 << 20;

impl Birdc<'_> {
    /// Runs birdc with `args` after its own arguments; what it printed and
    /// how it exited. Bounded: birdc (and anything it started) is killed
    /// after [`DEADLINE`] or once it printed [`OUTPUT_LIMIT`] bytes.
    pub fn answer(&self, args: &[&str]) -> Result<Answer, BirdError> {
        self.answer_within(args, DEADLINE, OUTPUT_LIMIT)
    }

    /// [`Birdc::answer`] with the bounds given.
    pub fn answer_within(
        &self,
        args: &[&str],
        deadline: Duration,
        limit: usize,
    ) -> Result<Answer, BirdError> {
        self.answer_until(args, Instant::now() + deadline, limit, None)
    }

    /// [`Birdc::answer`] ending by `deadline` at the latest, and as soon
    /// as `cancel` is set (checked every [`CANCEL_CHECK`]): birdc and what
    /// it started are killed either way.
    pub fn answer_until(
        &self,
        args: &[&str],
        deadline: Instant,
        limit: usize,
        cancel: Option<&AtomicBool>,
    ) -> Result<Answer, BirdError> {
        let (program, rest) = self.0.split_first().ok_or(BirdError::NoBirdc)?;
        let command = || args.join(" ");
        if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(BirdError::Cancelled { command: command() });
        }
        let started = Instant::now();
        let mut child = Command::new(program)
            .args(rest)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so that what it starts dies with it.
            .process_group(0)
            .spawn()
            .map_err(|source| BirdError::Spawn {
                program: program.clone(),
                source,
            })?;
        let read = read_bounded(&mut child, deadline, limit, cancel);
        if read.is_err() {
            if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = child.kill();
        }
        // Reaps it; after SIGKILL or closed pipes this does not wait long.
        let status = child.wait();
        let (stdout, stderr) = match read {
            Ok(out) => out,
            Err(Cut::Deadline) => {
                return Err(BirdError::Deadline {
                    command: command(),
                    // To the millisecond: it was given from a little
                    // before `started`.
                    after: Duration::from_millis(
                        (deadline.saturating_duration_since(started).as_secs_f64() * 1000.0).round()
                            as u64,
                    ),
                });
            }
            Err(Cut::Cancelled) => return Err(BirdError::Cancelled { command: command() }),
            Err(Cut::Limit) => {
                return Err(BirdError::TooLong {
                    command: command(),
                    limit,
                })
            }
            Err(Cut::Io(source)) => {
                return Err(BirdError::Spawn {
                    program: program.clone(),
                    source,
                })
            }
        };
        Ok(Answer {
            success: status.map(|s| s.success()).unwrap_or(false),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    }
}

/// How often a birdc run with a cancel flag looks at it.
pub const CANCEL_CHECK: Duration = Duration::from_millis(25);

/// Why reading birdc's output stopped before it ended.
enum Cut {
    Deadline,
    Cancelled,
    Limit,
    Io(std::io::Error),
}

/// Reads the child's stdout and stderr until both end, the deadline passes
/// or `limit` bytes came, or `cancel` is set, without ever blocking past
/// the deadline (or [`CANCEL_CHECK`] past a cancel).
fn read_bounded(
    child: &mut std::process::Child,
    deadline: Instant,
    limit: usize,
    cancel: Option<&AtomicBool>,
) -> Result<(Vec<u8>, Vec<u8>), Cut> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    use std::io::Read;
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(Cut::Io(std::io::Error::other(
            "birdc's pipes were not set up",
        )));
    };
    let (mut o, mut e) = (Vec::new(), Vec::new());
    let (mut out_open, mut err_open) = (true, true);
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0usize;
    while out_open || err_open {
        if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(Cut::Cancelled);
        }
        let mut left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Cut::Deadline);
        }
        if cancel.is_some() {
            left = left.min(CANCEL_CHECK);
        }
        let t = Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = Vec::with_capacity(2);
        if out_open {
            fds.push(PollFd::new(&out, PollFlags::IN));
        }
        if err_open {
            fds.push(PollFd::new(&err, PollFlags::IN));
        }
        match poll(&mut fds, Some(&t)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(Cut::Io(e.into())),
        }
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        let mut i = 0;
        for (open, pipe, sink) in [
            (&mut out_open, &mut out as &mut dyn Read, &mut o),
            (&mut err_open, &mut err as &mut dyn Read, &mut e),
        ] {
            if !*open {
                continue;
            }
            let r = ready[i];
            i += 1;
            if !r {
                continue;
            }
            // Readable (or hung up): one read cannot block.
            match pipe.read(&mut buf) {
                Ok(0) => *open = false,
                Ok(n) => {
                    sink.extend_from_slice(&buf[..n]);
                    total += n;
                    if total > limit {
                        return Err(Cut::Limit);
                    }
                }
                Err(x) if x.kind() == std::io::ErrorKind::Interrupted => {}
                Err(x) => return Err(Cut::Io(x)),
            }
        }
    }
    Ok((o, e))
}

/// Something that answers birdc commands: BIRD itself through [`Birdc`],
/// or a stand-in in tests.
pub trait Bird {
    /// Runs one birdc command (`["show", "protocols", "all"]`); its output.
    fn run(&self, args: &[&str]) -> Result<String, BirdError>;
}

impl Bird for Birdc<'_> {
    fn run(&self, args: &[&str]) -> Result<String, BirdError> {
        read_answer(args, self.answer(args)?)
    }
}

/// BIRD through birdc, each command bounded by [`DEADLINE`] and
/// [`OUTPUT_LIMIT`] and further: given up as soon as `cancel` is set (the
/// daemon's stop, for the BGP task's ordinary steps), and never running
/// past `by` (the time a stop leaves for the withdrawal).
#[derive(Debug, Clone, Copy)]
pub struct Bounded<'a> {
    /// The birdc command line.
    pub birdc: Birdc<'a>,
    /// Gives up when set.
    pub cancel: Option<&'a AtomicBool>,
    /// No command runs past this.
    pub by: Option<Instant>,
}

impl Bird for Bounded<'_> {
    fn run(&self, args: &[&str]) -> Result<String, BirdError> {
        let now = Instant::now();
        let mut deadline = now + DEADLINE;
        if let Some(by) = self.by {
            if by <= now {
                return Err(BirdError::OutOfTime {
                    command: args.join(" "),
                });
            }
            deadline = deadline.min(by);
        }
        let a = self
            .birdc
            .answer_until(args, deadline, OUTPUT_LIMIT, self.cancel)?;
        read_answer(args, a)
    }
}

/// birdc's answer as BIRD's output, or its refusal.
fn read_answer(args: &[&str], a: Answer) -> Result<String, BirdError> {
    // birdc reports errors on stdout with codes 8xxx/9xxx and exits 0.
    if !a.success
        || a.stdout
            .lines()
            .any(|l| l.starts_with('8') || l.starts_with('9'))
    {
        return Err(BirdError::Refused {
            command: args.join(" "),
            output: excerpt(&format!("{}{}", a.stdout.trim(), a.stderr.trim())),
        });
    }
    Ok(a.stdout)
}

/// The most of a refusal's text kept in the error: it is logged and shown
/// in `/status`, and a BIRD that answers garbage may send megabytes.
pub const REFUSAL_EXCERPT: usize = 400;

/// `text` cut to [`REFUSAL_EXCERPT`] characters, saying how much was left.
pub(crate) fn excerpt(text: &str) -> String {
    match text.char_indices().nth(REFUSAL_EXCERPT) {
        None => text.to_string(),
        Some((at, _)) => format!("{}... ({} bytes in all)", &text[..at], text.len()),
    }
}

/// An address family: BIRD's static protocols and channels are per family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// IPv4 (channel `ipv4`).
    Ipv4,
    /// IPv6 (channel `ipv6`).
    Ipv6,
}

impl Family {
    /// BIRD's name of the family's channel.
    pub fn channel(self) -> &'static str {
        match self {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
        }
    }

    /// The family of an address.
    pub fn of(a: std::net::IpAddr) -> Family {
        if a.is_ipv4() {
            Family::Ipv4
        } else {
            Family::Ipv6
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.channel())
    }
}

/// One family's BIRD protocol and routes file, as `[bgp]` names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The family.
    pub family: Family,
    /// BIRD's static protocol holding its VIP routes.
    pub protocol: String,
    /// The routes file BIRD includes in it.
    pub routes_file: PathBuf,
}

impl Target {
    /// The `[bgp]` key that names the protocol.
    pub(crate) fn key(&self) -> &'static str {
        match self.family {
            Family::Ipv4 => "protocol",
            Family::Ipv6 => "protocol6",
        }
    }
}

/// One channel of a BIRD protocol, from `show protocols all`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BirdChannel {
    /// Its name: `ipv4`, `ipv6`.
    pub name: String,
    /// Whether its state is UP.
    pub up: bool,
    /// Routes it imported (for a static protocol: the routes it holds).
    pub imported: u64,
    /// Routes it exports now (for a BGP session: what the peer is told).
    pub exported: u64,
}

/// One BIRD protocol, from `show protocols all`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BirdProtocol {
    /// Its name.
    pub name: String,
    /// Its kind: `Static`, `BGP`, `Kernel`, ...
    pub kind: String,
    /// Its state: `up`, `down` (also when disabled), `start`, `stop`.
    pub state: String,
    /// What follows (a BGP session's state: `Established`, `Active`, ...).
    pub info: String,
    /// Its channels.
    pub channels: Vec<BirdChannel>,
}

/// What BIRD said to `show protocols all`, and to `show route protocol
/// NAME` for the static protocols it was asked about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BirdView {
    /// Every protocol.
    pub protocols: Vec<BirdProtocol>,
    /// Per static protocol asked about, the prefixes it holds (`addr/len`,
    /// as [`prefix`] writes them); a protocol that is not up holds none.
    /// Absent: not asked (only counts are known then).
    pub held: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
}

/// What BIRD says about one family's VIP routes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FamilyView {
    /// The static protocol's state; `None` if BIRD has no such protocol.
    pub state: Option<String>,
    /// Routes the protocol holds (0 unless it is up).
    pub routes: u64,
    /// Established BGP sessions with an UP channel of the family.
    pub sessions: u64,
    /// Routes those sessions export (to the router).
    pub exported: u64,
}

impl FamilyView {
    /// Whether the router is told: the protocol is up with routes, and an
    /// established session exports routes of the family.
    pub fn announced(&self) -> bool {
        self.state.as_deref() == Some("up")
            && self.routes > 0
            && self.sessions > 0
            && self.exported > 0
    }
}

/// Reads BIRD's answer to `show protocols all`: a line per protocol
/// (name, kind, table, state, since, info) followed by indented details,
/// among them `Channel NAME`, its `State:` and `Routes: N imported, ...,
/// M exported` lines.
pub fn parse_protocols(text: &str) -> BirdView {
    let mut v = BirdView::default();
    for line in text.lines() {
        if line.trim().is_empty() || line.starts_with("BIRD ") || line.starts_with("Name ") {
            continue;
        }
        let t = line.trim_start();
        if !line.starts_with(char::is_whitespace) {
            let mut w = line.split_whitespace();
            let (Some(name), Some(kind), Some(_table), Some(state)) =
                (w.next(), w.next(), w.next(), w.next())
            else {
                continue;
            };
            let _since = w.next();
            v.protocols.push(BirdProtocol {
                name: name.into(),
                kind: kind.into(),
                state: state.into(),
                info: w.collect::<Vec<_>>().join(" "),
                channels: Vec::new(),
            });
            continue;
        }
        let Some(p) = v.protocols.last_mut() else {
            continue;
        };
        if let Some(name) = t.strip_prefix("Channel ") {
            p.channels.push(BirdChannel {
                name: name.trim().into(),
                ..BirdChannel::default()
            });
        } else if let Some(state) = t.strip_prefix("State:") {
            if let Some(c) = p.channels.last_mut() {
                c.up = state.trim() == "UP";
            }
        } else if let Some(routes) = t.strip_prefix("Routes:") {
            if let Some(c) = p.channels.last_mut() {
                let w: Vec<&str> = routes.split([' ', ',']).filter(|s| !s.is_empty()).collect();
                for pair in w.windows(2) {
                    match (pair[0].parse::<u64>(), pair[1]) {
                        (Ok(n), "imported") => c.imported = n,
                        (Ok(n), "exported") => c.exported = n,
                        _ => {}
                    }
                }
            }
        }
    }
    v
}

impl BirdView {
    /// The protocol of a name.
    pub fn protocol(&self, name: &str) -> Option<&BirdProtocol> {
        self.protocols.iter().find(|p| p.name == name)
    }

    /// What BIRD says about `t`'s routes: its static protocol's state and
    /// routes, and what the established BGP sessions export of the family.
    pub fn family(&self, t: &Target) -> FamilyView {
        let mut f = FamilyView::default();
        if let Some(p) = self.protocol(&t.protocol) {
            f.state = Some(p.state.clone());
            f.routes = p
                .channels
                .iter()
                .filter(|c| c.up && c.name == t.family.channel())
                .map(|c| c.imported)
                .sum();
        }
        for p in self.protocols.iter().filter(|p| {
            p.kind == "BGP"
                && p.state == "up"
                && p.info.split_whitespace().next() == Some("Established")
        }) {
            for c in p
                .channels
                .iter()
                .filter(|c| c.up && c.name == t.family.channel())
            {
                f.sessions += 1;
                f.exported += c.exported;
            }
        }
        f
    }
}

/// Asks BIRD for its protocols.
pub fn read_view(bird: &dyn Bird) -> Result<BirdView, BirdError> {
    bird.run(&["show", "protocols", "all"])
        .map(|t| parse_protocols(&t))
}

/// Asks BIRD for its protocols, and for the routes each of `statics`
/// holds (`show route protocol NAME`, only for those that are up): what
/// is announced is then known route by route, not only counted.
pub fn read_view_with_routes(bird: &dyn Bird, statics: &[&str]) -> Result<BirdView, BirdError> {
    let mut v = read_view(bird)?;
    for &name in statics {
        let Some(p) = v.protocol(name) else {
            continue;
        };
        let held = if p.state == "up" {
            parse_route_prefixes(&bird.run(&["show", "route", "protocol", name])?)
        } else {
            Default::default()
        };
        v.held.insert(name.to_string(), held);
    }
    Ok(v)
}

/// A prefix as fastpath compares them: the address as Rust writes it
/// (IPv6 compressed, lower case), `/`, the length; `None` if `text` is no
/// prefix.
pub fn prefix(text: &str) -> Option<String> {
    let (addr, len) = text.split_once('/')?;
    let addr: std::net::IpAddr = addr.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (len <= max).then(|| format!("{addr}/{len}"))
}

/// The prefixes in BIRD's answer to `show route`: every line whose first
/// word is a prefix (`198.18.0.80/32  blackhole [fastpath_vips ...] *
/// (200)`); further routes of a prefix are indented and repeat none.
pub fn parse_route_prefixes(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(prefix)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A birdc that is a shell script (`sh -c SCRIPT`): birdc's own
    /// arguments follow as `$0 $1 ...`.
    fn script(s: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), s.into()]
    }

    #[test]
    fn a_birdc_that_never_answers_is_killed_at_its_deadline_with_what_it_started() {
        let dir = std::env::temp_dir().join(format!("fp-birdc-hang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("pid");
        // The script starts a grandchild that holds the pipes open, as a
        // birdc stuck on a socket would, and waits for it.
        let b = script(&format!(
            "sleep 100 & echo $! > {}; wait",
            pidfile.display()
        ));
        let t = Instant::now();
        let e = Birdc(&b)
            .answer_within(
                &["show", "protocols", "all"],
                Duration::from_millis(300),
                1 << 20,
            )
            .unwrap_err();
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "took {:?}",
            t.elapsed()
        );
        assert!(matches!(e, BirdError::Deadline { .. }), "{e}");
        assert!(e.to_string().contains("no answer within"), "{e}");
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        let proc_dir = format!("/proc/{}", pid.trim());
        let gone = Instant::now() + Duration::from_secs(2);
        // Killed, then reaped by init (or left a zombie of the dead shell).
        while Instant::now() < gone {
            let state = std::fs::read_to_string(format!("{proc_dir}/stat")).unwrap_or_default();
            if state.is_empty() || state.contains(") Z ") {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let state = std::fs::read_to_string(format!("{proc_dir}/stat")).unwrap_or_default();
        assert!(
            state.is_empty() || state.contains(") Z "),
            "birdc's child lives on: {state}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_birdc_that_trickles_is_cut_at_its_deadline() {
        let b = script("while :; do printf x; sleep 0.1; done");
        let t = Instant::now();
        let e = Birdc(&b)
            .answer_within(&["show", "protocols"], Duration::from_millis(500), 1 << 20)
            .unwrap_err();
        assert!(matches!(e, BirdError::Deadline { .. }), "{e}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "took {:?}",
            t.elapsed()
        );
    }

    #[test]
    fn a_birdc_that_floods_is_cut_at_the_output_bound() {
        let b = script("exec cat /dev/zero");
        let t = Instant::now();
        let e = Birdc(&b)
            .answer_within(&["show", "protocols"], Duration::from_secs(10), 1 << 20)
            .unwrap_err();
        assert!(
            matches!(e, BirdError::TooLong { limit, .. } if limit == 1 << 20),
            "{e}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "took {:?}",
            t.elapsed()
        );
    }

    /// The daemon's stop kills a birdc that BIRD keeps waiting, at once;
    /// a stop's time, once spent, runs no more commands, and shortens
    /// those it still allows.
    #[test]
    fn a_stop_cuts_birdc_short_and_its_budget_bounds_the_rest() {
        let b = script("exec sleep 100");
        let cancel = AtomicBool::new(false);
        let bird = Bounded {
            birdc: Birdc(&b),
            cancel: Some(&cancel),
            by: None,
        };
        let t = Instant::now();
        let e = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(200));
                cancel.store(true, Ordering::Relaxed);
            });
            bird.run(&["show", "protocols", "all"]).unwrap_err()
        });
        assert!(matches!(e, BirdError::Cancelled { .. }), "{e}");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "took {:?}",
            t.elapsed()
        );
        // Set before: not even started.
        assert!(matches!(
            bird.run(&["disable", "x"]).unwrap_err(),
            BirdError::Cancelled { .. }
        ));
        let spent = Bounded {
            birdc: Birdc(&b),
            cancel: None,
            by: Some(Instant::now()),
        };
        let e = spent.run(&["disable", "x"]).unwrap_err();
        assert!(matches!(e, BirdError::OutOfTime { .. }), "{e}");
        let short = Bounded {
            birdc: Birdc(&b),
            cancel: None,
            by: Some(Instant::now() + Duration::from_millis(300)),
        };
        let t = Instant::now();
        let e = short.run(&["disable", "x"]).unwrap_err();
        assert!(matches!(e, BirdError::Deadline { .. }), "{e}");
        assert!(t.elapsed() < DEADLINE, "took {:?}", t.elapsed());
    }

    /// A refusal is logged and shown in `/status`: a BIRD that answers
    /// megabytes of garbage gets an excerpt of it there.
    #[test]
    fn a_refusal_keeps_an_excerpt_of_what_birdc_printed() {
        let b = script("head -c 300000 /dev/zero | tr \\\\0 x; exit 1");
        let e = Birdc(&b).run(&["show", "protocols", "all"]).unwrap_err();
        let words = e.to_string();
        assert!(matches!(e, BirdError::Refused { .. }), "{words}");
        assert!(words.len() < 1000, "{} bytes", words.len());
        assert!(words.contains("300000 bytes in all"), "{}", &words[..200]);
    }

    #[test]
    fn a_prompt_birdc_is_read_whole_with_its_exit() {
        let b = script("echo \"$0 $1\"; echo complaint >&2; exit 3");
        let a = Birdc(&b).answer(&["disable", "fastpath_vips"]).unwrap();
        assert_eq!(a.stdout, "disable fastpath_vips\n");
        assert_eq!(a.stderr, "complaint\n");
        assert!(!a.success);
    }

    /// BIRD 2.0.12's answer, as it printed it for a load balancer whose
    /// IPv4 protocol is up and exported, IPv6 disabled.
    const SHOW: &str = "BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
device1    Device     ---        up     16:26:35.741  

fastpath_vips Static     master4    up     16:26:38.765  
  Channel ipv4
    State:          UP
    Table:          master4
    Preference:     200
    Input filter:   ACCEPT
    Output filter:  REJECT
    Routes:         1 imported, 0 exported, 1 preferred
    Route change stats:     received   rejected   filtered    ignored   accepted
      Import updates:              1          0          0          0          1

fastpath_vips6 Static     master6    down   16:26:49.190  
  Channel ipv6
    State:          DOWN
    Table:          master6

uplink     BGP        ---        up     16:26:40.344  Established   
  BGP state:          Established
    Neighbor address: 10.99.0.2
  Channel ipv4
    State:          UP
    Table:          master4
    Routes:         0 imported, 1 exported, 0 preferred
  Channel ipv6
    State:          UP
    Table:          master6
    Routes:         0 imported, 0 exported, 0 preferred
";

    /// `show route protocol NAME` as birdc prints it (BIRD 2: a table
    /// heading, a route a line, further routes of a prefix indented).
    #[test]
    fn routes_are_read_prefix_by_prefix() {
        let text = "BIRD 2.0.12 ready.
Table master4:
198.18.0.80/32       blackhole [fastpath_vips 16:26:38.765] * (200)
198.18.0.81/32       blackhole [fastpath_vips 16:26:38.765] * (200)
                     blackhole [other 16:26:38.765] (200)
Table master6:
FD00:18::0080/128    blackhole [fastpath_vips6 16:26:38.765] * (200)
not/a prefix
10.0.0.0/33 x
";
        let held: Vec<String> = parse_route_prefixes(text).into_iter().collect();
        assert_eq!(
            held,
            ["198.18.0.80/32", "198.18.0.81/32", "fd00:18::80/128"]
        );
        assert_eq!(prefix("192.0.2.1/24").as_deref(), Some("192.0.2.1/24"));
        assert_eq!(prefix("::1/129"), None);
    }

    fn target(family: Family, protocol: &str) -> Target {
        Target {
            family,
            protocol: protocol.into(),
            routes_file: PathBuf::from("/run/x"),
        }
    }

    #[test]
    fn birds_answer_is_read_per_family() {
        let v = parse_protocols(SHOW);
        assert_eq!(v.protocols.len(), 4);
        let v4 = v.family(&target(Family::Ipv4, "fastpath_vips"));
        assert_eq!(
            v4,
            FamilyView {
                state: Some("up".into()),
                routes: 1,
                sessions: 1,
                exported: 1
            }
        );
        assert!(v4.announced());
        let v6 = v.family(&target(Family::Ipv6, "fastpath_vips6"));
        assert_eq!(
            (v6.state.as_deref(), v6.routes, v6.sessions),
            (Some("down"), 0, 1)
        );
        assert!(!v6.announced());
        assert_eq!(v.family(&target(Family::Ipv4, "nosuch")).state, None);
        // A session that is not established carries nothing.
        let down = parse_protocols(&SHOW.replace(
            "up     16:26:40.344  Established",
            "start  16:26:40.344  Active",
        ));
        assert!(!down
            .family(&target(Family::Ipv4, "fastpath_vips"))
            .announced());
    }
}
