//! One reader of `/proc/<pid>/stat`, shared by the benchmarks that watch
//! the processes they start, and of the CPU's model in `/proc/cpuinfo`
//! and the load averages in `/proc/loadavg`, which benchmarks print
//! beside their figures.
//!
//! Session ids are read here rather than with `getsid(2)`: inside a PID
//! namespace whose session leader lives outside it (a container, a CI
//! runner) the kernel answers 0, which rustix's `getsid` turns into a
//! panic (`Pid` must be positive). `/proc` gives the same 0 as a number.

/// The fields of `/proc/<pid>/stat` after the command name, so that index
/// 0 is the state, 3 the session, 11 utime and 12 stime (`proc(5)` numbers
/// them 3, 6, 14 and 15). `None` when the process is gone or the file
/// cannot be parsed. `pid` is a number or `self`.
pub(crate) fn stat_fields(pid: impl std::fmt::Display) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: it ends at the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The session id of a process as this PID namespace sees it (0 when the
/// session's leader is outside it).
pub(crate) fn session(pid: impl std::fmt::Display) -> Option<i64> {
    stat_fields(pid)?.get(3)?.parse().ok()
}

/// Whether the process still runs (exists and is not a zombie).
pub(crate) fn alive(pid: impl std::fmt::Display) -> bool {
    stat_fields(pid)
        .and_then(|f| f.first().map(|s| s != "Z"))
        .unwrap_or(false)
}

/// utime + stime of a process in seconds; NaN when it cannot be read.
pub(crate) fn cpu_seconds(pid: impl std::fmt::Display) -> f64 {
    let Some(f) = stat_fields(pid) else {
        return f64::NAN;
    };
    let tick = |i: usize| {
        f.get(i)
            .and_then(|x| x.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    // SAFETY: sysconf reads a constant and has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (tick(11) + tick(12)) / hz
}

/// The CPU's model name (`/proc/cpuinfo`'s first `model name`), or
/// "unknown CPU".
pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The 1, 5 and 15 minute load averages of `/proc/loadavg`'s text, which
/// `proc(5)` gives as its first three fields (then the runnable and total
/// tasks, and the last PID); NaN for a field that is missing or is not a
/// number.
pub(crate) fn parse_load_averages(text: &str) -> [f64; 3] {
    let mut it = text
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(f64::NAN));
    [(); 3].map(|()| it.next().unwrap_or(f64::NAN))
}

/// The three load averages of `/proc/loadavg`'s text as it writes them,
/// joined by one space (a report shows them as the kernel did).
fn load_averages_text(text: &str) -> String {
    text.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The 1, 5 and 15 minute load averages (other work on the machine); NaN
/// each when `/proc/loadavg` cannot be read.
pub(crate) fn load_averages_figures() -> [f64; 3] {
    parse_load_averages(&std::fs::read_to_string("/proc/loadavg").unwrap_or_default())
}

/// The 1-minute load average; NaN when `/proc/loadavg` cannot be read.
pub(crate) fn load_average_1min() -> f64 {
    load_averages_figures()[0]
}

/// The three load averages as `/proc/loadavg` writes them ("0.52 1.35
/// 1.59"); empty when it cannot be read.
pub(crate) fn load_averages() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| load_averages_text(&s))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_started_with_setsid_has_a_session_other_than_ours() {
        let own = session("self").expect("own stat");
        let mut child = std::process::Command::new("setsid")
            .args(["sleep", "5"])
            .spawn()
            .expect("setsid sleep");
        // setsid(1) forks only when the caller leads a process group; give
        // it a moment to exec.
        let mut theirs = None;
        for _ in 0..100 {
            theirs = session(child.id()).filter(|&s| s != own);
            if theirs.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(alive(child.id()));
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            theirs,
            Some(child.id() as i64),
            "a new session is led by its process"
        );
        assert!(!alive(child.id()), "reaped");
    }

    #[test]
    fn a_missing_process_reads_as_nothing() {
        assert_eq!(stat_fields(i32::MAX), None);
        assert!(cpu_seconds(i32::MAX).is_nan());
        assert!(!alive(i32::MAX));
    }

    #[test]
    fn the_load_averages_are_the_first_three_fields() {
        let line = "0.52 1.35 1.59 2/345 6789\n";
        assert_eq!(parse_load_averages(line), [0.52, 1.35, 1.59]);
        assert_eq!(load_averages_text(line), "0.52 1.35 1.59");
    }

    #[test]
    fn a_malformed_load_average_reads_as_nan() {
        let [one, five, fifteen] = parse_load_averages("0.52 busy\n");
        assert_eq!(one, 0.52);
        assert!(five.is_nan() && fifteen.is_nan(), "{five} {fifteen}");
        assert!(parse_load_averages("").iter().all(|x| x.is_nan()));
        assert_eq!(load_averages_text(""), "");
    }

    #[test]
    fn this_machine_has_a_load_average() {
        let [one, five, fifteen] = load_averages_figures();
        assert!(one >= 0.0 && five >= 0.0 && fifteen >= 0.0);
        assert_eq!(load_averages().split(' ').count(), 3);
    }
}
