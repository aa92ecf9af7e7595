//! The sections of the man pages that clap's definition cannot say: EXIT
//! STATUS on every page, and SIGNALS and FILES on the pages of the
//! commands that run as services. What they say is what the code does:
//! `main` exits 1 on any error and clap 2 on a command line it refuses;
//! the daemon's signals are registered in `lb::lb_run` (SIGINT, SIGTERM)
//! and `lbd::daemon` (SIGHUP).

/// EXIT STATUS of every command.
const EXIT_STATUS: &str = r#".SH "EXIT STATUS"
.TP
.B 0
Success.
.TP
.B 1
An error; its message is on standard error, after "fastpath: error:".
.TP
.B 2
The command line was refused (an unknown option, a missing or bad value).
"#;

/// The sections a page has beyond clap's and [`EXIT_STATUS`], by page
/// name (without `.1`).
fn sections(page: &str) -> &'static str {
    match page {
        "fastpath-lb-run" => {
            r#".SH "EXIT STATUS (WITH --interface)"
0 after a stop by SIGINT or SIGTERM that withdrew and drained; 1 when a
second SIGINT or SIGTERM ended the drain at once, or on an error (start-up,
the interface, the configuration).
.SH SIGNALS
.TP
.BR SIGTERM ", " SIGINT
Graceful stop: with [bgp], the daemon tells systemd STOPPING=1, withdraws
the VIPs from BIRD, keeps forwarding until no VIP packet has come for
[bgp] drain_quiet_ms (at most [bgp] drain_ms), prints its counters and
exits 0. Without [bgp] it stops at once. A second SIGTERM or SIGINT during
the drain exits at once with status 1.
.TP
.B SIGHUP
Reload: the configuration file is read again and applied whole or
rejected whole (as \fBfastpath lb reload\fR); the running configuration
stays if it is rejected.
.TP
.B SIGKILL
What the unit's watchdog sends to a daemon that stopped feeding it; the
unit's ExecStopPost (\fBfastpath lb withdraw\fR) then withdraws the VIPs.
.SH FILES
.TP
.I /etc/fastpath/NAME.toml
The configuration (\fB--config\fR) of the unit fastpath-lb@NAME; read at
start and on each reload, and written back by \fBfastpath lb
drain|undrain|weight\fR.
.TP
.I /etc/fastpath/NAME.env
Optional; INTERFACE=IFACE when the interface is not named NAME.
.TP
.I /run/fastpath/vips.conf, /run/fastpath/vips6.conf
The VIP routes written for BIRD ([bgp] vips_file, vips_file6), which
BIRD's configuration includes.
.TP
.I /run/fastpath/lb-NETNS-IFACE.lock
One load balancer per interface and network namespace.
.TP
.I /run/bird/bird.ctl
BIRD's control socket, through birdc ([bgp] birdc).
.TP
.I [api] token_file
The bearer token of the HTTP API, read at start.
.TP
.I /usr/share/doc/fastpath/examples/lb.toml
The annotated example configuration.
"#
        }
        "fastpath-lb-withdraw" => {
            r#".SH FILES
.TP
.I /etc/fastpath/NAME.toml
The load balancer's configuration; only [bgp] is read.
.TP
.I /run/bird/bird.ctl
BIRD's control socket, through birdc ([bgp] birdc).
"#
        }
        "fastpath-lb-decap" => {
            r#".SH SIGNALS
.TP
.BR SIGTERM ", " SIGINT
Stop: the counters are printed and the command exits 0.
.SH FILES
.TP
.I /dev/net/tun
The TUN device it creates (\fB--tun\fR).
.TP
.I /proc/sys/net/ipv4/conf/all/rp_filter
Read at start: a warning is logged when reverse-path filtering is on.
"#
        }
        _ => "",
    }
}

/// `page` (roff, as clap_mangen writes it, named `name` without `.1`)
/// with its extra sections: before VERSION, where clap_mangen ends a page,
/// or at the end.
pub fn with_sections(name: &str, page: &str) -> String {
    let extra = format!("{EXIT_STATUS}{}", sections(name));
    match page.find(".SH VERSION") {
        Some(at) => format!("{}{extra}{}", &page[..at], &page[at..]),
        None => format!("{page}{extra}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_go_before_the_version_or_at_the_end() {
        let p = with_sections("fastpath-lb-run", ".TH x\n.SH NAME\nx\n.SH VERSION\nv1\n");
        let exit = p.find(".SH \"EXIT STATUS\"").unwrap();
        let signals = p.find(".SH SIGNALS").unwrap();
        let files = p.find(".SH FILES").unwrap();
        let version = p.find(".SH VERSION").unwrap();
        assert!(exit < signals && signals < files && files < version, "{p}");
        let q = with_sections("fastpath-maio", ".TH x\n.SH NAME\nx\n");
        assert!(q.ends_with(EXIT_STATUS), "{q}");
        assert!(!q.contains(".SH SIGNALS"), "{q}");
    }
}
