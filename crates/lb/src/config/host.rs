//! What a configuration needs of the machine it runs on, checked on this
//! machine (`fastpath lb check-config --host`): not part of
//! [`Config::load`], because a file is often checked on another machine
//! (CI, a laptop) than the one it will run on.
//!
//! [`Config::check_host`] finds every problem, not only the first:
//!
//! - `[bgp] birdc`: the program is found (on `PATH` when it names no
//!   directory), and BIRD's control socket (birdc's `-s PATH`, else
//!   BIRD's default [`BIRD_SOCKET`]) exists, is a socket, and answers a
//!   connection (a socket left by a BIRD that is gone does not);
//! - `[bgp] vips_file` (and `vips_file6` when `protocol6` is set): the
//!   directory exists and this process can create a file in it (the
//!   daemon replaces the routes file by renaming a new one over it);
//! - `[[vips]] address`: none is one of this host's own addresses, or
//!   inside a prefix routed locally (an address on the loopback, a
//!   `local` route): the kernel would take such packets for itself, and
//!   BIRD would announce an address of this host ([`HostAddresses`]);
//! - `[api] token_file`: readable or writable by its owner alone (whoever
//!   reads the token can reconfigure the load balancer);
//! - `[[quic_lb]] key_file`: the same (whoever reads the key can tell which
//!   server each QUIC connection uses, what the encryption hides).

use std::io::BufRead;
use std::net::IpAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{Config, ConfigError};

/// BIRD's control socket when `birdc` is not given `-s` (BIRD 2 as
/// packaged: `/run/bird/bird.ctl`).
pub const BIRD_SOCKET: &str = "/run/bird/bird.ctl";

/// The control socket a `[bgp] birdc` command talks to: the argument of
/// its `-s` (`-s PATH` or `-sPATH`), else [`BIRD_SOCKET`].
pub fn bird_socket(birdc: &[String]) -> PathBuf {
    let mut args = birdc.iter().skip(1);
    while let Some(a) = args.next() {
        if a == "-s" {
            if let Some(p) = args.next() {
                return PathBuf::from(p);
            }
        } else if let Some(p) = a.strip_prefix("-s").filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
    }
    PathBuf::from(BIRD_SOCKET)
}

/// A prefix this host takes packets to for itself: an address of one of
/// its interfaces, or a `local` route (an address on the loopback covers
/// its whole prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPrefix {
    /// The prefix's first address.
    pub address: IpAddr,
    /// Its length.
    pub len: u8,
    /// The interface, where the kernel says (IPv6).
    pub interface: Option<String>,
}

/// This host's local prefixes, as the kernel routes them (its local
/// routing table), in the calling thread's network namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAddresses {
    /// The prefixes.
    pub local: Vec<LocalPrefix>,
}

/// `RTF_LOCAL` in `/proc/net/ipv6_route`'s flags: a route to this host.
const RTF_LOCAL: u32 = 0x8000_0000;

impl HostAddresses {
    /// Reads them from `/proc/net/fib_trie` (IPv4: the `host LOCAL`
    /// entries) and `/proc/net/ipv6_route` (IPv6: routes flagged
    /// `RTF_LOCAL`), line by line: the files are the kernel's own view of
    /// the namespace, with no program to run.
    pub fn read() -> std::io::Result<HostAddresses> {
        let open = |p: &str| std::fs::File::open(p).map(std::io::BufReader::new);
        let mut h = HostAddresses::default();
        h.add_fib_trie(open("/proc/net/fib_trie")?)?;
        // A kernel without IPv6 has no such file, and no IPv6 address.
        match open("/proc/net/ipv6_route") {
            Ok(r) => h.add_ipv6_route(r)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(h)
    }

    /// The IPv4 local prefixes of a `/proc/net/fib_trie` text: a leaf
    /// (`|-- 192.0.2.2`) followed by its entries (`/32 host LOCAL`).
    pub fn add_fib_trie(&mut self, text: impl BufRead) -> std::io::Result<()> {
        let mut leaf = None;
        for line in text.lines() {
            let line = line?;
            let line = line.trim();
            if let Some(a) = line.strip_prefix("|-- ") {
                leaf = a.trim().parse::<std::net::Ipv4Addr>().ok();
            } else if let (Some(a), Some(entry)) = (leaf, line.strip_prefix('/')) {
                let mut words = entry.split_whitespace();
                let len = words.next().and_then(|l| l.parse::<u8>().ok());
                if let (Some(len), Some("LOCAL")) = (len, words.last()) {
                    self.add(LocalPrefix {
                        address: IpAddr::V4(a),
                        len,
                        interface: None,
                    });
                }
            }
        }
        Ok(())
    }

    /// The IPv6 local prefixes of a `/proc/net/ipv6_route` text:
    /// destination, its length, source, its length, next hop, metric,
    /// references, use, flags, interface.
    pub fn add_ipv6_route(&mut self, text: impl BufRead) -> std::io::Result<()> {
        for line in text.lines() {
            let line = line?;
            let f: Vec<&str> = line.split_whitespace().collect();
            let [dest, len, _, _, _, _, _, _, flags, interface] = f[..] else {
                continue;
            };
            let (Ok(dest), Ok(len), Ok(flags)) = (
                u128::from_str_radix(dest, 16),
                u8::from_str_radix(len, 16),
                u32::from_str_radix(flags, 16),
            ) else {
                continue;
            };
            if flags & RTF_LOCAL != 0 && len <= 128 {
                self.add(LocalPrefix {
                    address: IpAddr::V6(dest.into()),
                    len,
                    interface: Some(interface.to_string()),
                });
            }
        }
        Ok(())
    }

    fn add(&mut self, p: LocalPrefix) {
        if !self.local.contains(&p) {
            self.local.push(p);
        }
    }

    /// The local prefix `a` is in, the longest if several.
    pub fn find(&self, a: IpAddr) -> Option<&LocalPrefix> {
        let a = a.to_canonical();
        self.local
            .iter()
            .filter(|p| {
                super::overlaps((p.address, p.len), (a, if a.is_ipv4() { 32 } else { 128 }))
            })
            .max_by_key(|p| p.len)
    }
}

impl Config {
    /// Checks what this configuration needs of this host (see the module
    /// documentation): every problem found, each naming `file`, the key
    /// and the fix; none when the host has what it needs.
    pub fn check_host(&self, file: &str) -> Vec<ConfigError> {
        match HostAddresses::read() {
            Ok(addresses) => self.check_host_with(file, &addresses),
            Err(e) => {
                let mut out = self.check_host_with(file, &HostAddresses::default());
                out.push(ConfigError {
                    file: file.into(),
                    key: "vips".into(),
                    problem: format!(
                        "cannot read this host's addresses (/proc/net/fib_trie, \
                         /proc/net/ipv6_route): {e}; VIPs were not compared with them"
                    ),
                });
                out
            }
        }
    }

    /// [`Config::check_host`] against the given addresses of the host.
    pub fn check_host_with(&self, file: &str, addresses: &HostAddresses) -> Vec<ConfigError> {
        let mut out = Vec::new();
        let mut report = |key: String, problem: String| {
            out.push(ConfigError {
                file: file.into(),
                key,
                problem,
            })
        };
        if let Some(b) = &self.bgp {
            if let Some(program) = b.birdc.first() {
                if let Err(why) = find_program(program) {
                    report("bgp.birdc".into(), why);
                }
            }
            if let Err(why) = check_socket(&bird_socket(&b.birdc)) {
                report("bgp.birdc".into(), why);
            }
            let mut dirs = Vec::new();
            let mut files = vec![("bgp.vips_file", b.vips_file.clone())];
            if !b.protocol6.is_empty() {
                files.push(("bgp.vips_file6", b.routes_file6()));
            }
            for (key, f) in files {
                let dir = match f.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                    _ => PathBuf::from("."),
                };
                if dirs.contains(&dir) {
                    continue;
                }
                if let Err(why) = check_writable_dir(&dir, &f) {
                    report(key.into(), why);
                }
                dirs.push(dir);
            }
        }
        for (i, v) in self.vips.iter().enumerate() {
            let Some(a) = v.address else { continue };
            if let Some(p) = addresses.find(a) {
                let at = match &p.interface {
                    Some(i) => format!("on {i}"),
                    None => format!("local route {}/{}", p.address, p.len),
                };
                report(
                    format!("vips[{i}].address"),
                    format!(
                        "{a} is this host's own address ({at}): the kernel takes its packets \
                         for itself and the load balancer never sees them; remove it from the \
                         interface (VIPs belong on the backends' loopback, not here) or give \
                         the VIP another address"
                    ),
                );
            }
        }
        if let Some(t) = &self.api.token_file {
            if let Err(why) = check_private(
                t,
                "whoever reads the token can reconfigure the load balancer",
            ) {
                report("api.token_file".into(), why);
            }
        }
        for (i, q) in self.quic_lb.iter().enumerate() {
            if let Some(k) = &q.key_file {
                if let Err(why) = check_private(
                    k,
                    "whoever reads the key can tell which server every QUIC connection uses",
                ) {
                    report(format!("quic_lb[{i}].key_file"), why);
                }
            }
        }
        out
    }
}

/// Whether `program` can be run: a path to an executable file, or a name
/// found on `PATH`.
fn find_program(program: &str) -> Result<(), String> {
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return if executable(Path::new(program)) {
            Ok(())
        } else {
            Err(format!(
                "{program} is not an executable file: install BIRD's birdc or give its path"
            ))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| executable(&d.join(program))) {
        return Ok(());
    }
    Err(format!(
        "{program:?} is not found on PATH ({}): install BIRD (its birdc) or give birdc's full \
         path",
        path.to_string_lossy()
    ))
}

/// Whether `path` is a Unix socket that accepts a connection.
fn check_socket(path: &Path) -> Result<(), String> {
    let shown = path.display();
    let how = "(birdc's -s in bgp.birdc names it; BIRD's default is /run/bird/bird.ctl)";
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "BIRD's control socket {shown} does not exist: start BIRD, or point birdc at its \
             socket {how}"
        )),
        Err(e) => Err(format!("BIRD's control socket {shown}: {e} {how}")),
        Ok(m) if !m.file_type().is_socket() => Err(format!(
            "{shown} is not a socket, so not BIRD's control socket {how}"
        )),
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => Ok(()),
            Err(e) => Err(format!(
                "BIRD's control socket {shown} does not answer ({e}): is BIRD running? {how}"
            )),
        },
    }
}

/// Whether a file can be created in `dir` (the directory of `file`), by
/// creating one and removing it.
fn check_writable_dir(dir: &Path, file: &Path) -> Result<(), String> {
    let (shown, of) = (dir.display(), file.display());
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "the directory {shown} of {of} does not exist: create it (the shipped unit's \
                 RuntimeDirectory=fastpath makes /run/fastpath), or name a file in a directory \
                 that exists"
            ))
        }
        Err(e) => return Err(format!("the directory {shown} of {of}: {e}")),
        Ok(m) if !m.is_dir() => {
            return Err(format!(
                "{shown}, where {of} would be written, is not a directory"
            ))
        }
        Ok(_) => {}
    }
    let probe = dir.join(format!(".fastpath-check-config.{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(format!(
            "cannot create a file in {shown} ({e}): the daemon writes {of} there by renaming \
             a new file over it; give it write access"
        )),
    }
}

/// Whether `path` is readable and writable by its owner alone; `risk`
/// says what another reader could do.
fn check_private(path: &Path, risk: &str) -> Result<(), String> {
    let shown = path.display();
    let mode = std::fs::metadata(path)
        .map_err(|e| format!("{shown}: {e}"))?
        .permissions()
        .mode();
    if mode & 0o066 == 0 {
        return Ok(());
    }
    let who = match (mode & 0o060 != 0, mode & 0o006 != 0) {
        (true, true) => "its group and everyone",
        (true, false) => "its group",
        _ => "everyone",
    };
    Err(format!(
        "{shown} (mode {:04o}) can be read or written by {who}: {risk}; chmod 600 {shown}",
        mode & 0o7777
    ))
}

#[cfg(test)]
mod tests {
    use crate::config::tests::*;
    use crate::config::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn bird_socket_is_birdcs_dash_s_else_birds_default() {
        let s = |a: &[&str]| bird_socket(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(s(&["birdc"]), std::path::Path::new(BIRD_SOCKET));
        assert_eq!(
            s(&["birdc", "-s", "/x/b.ctl"]),
            std::path::Path::new("/x/b.ctl")
        );
        assert_eq!(
            s(&["birdc", "-s/x/b.ctl"]),
            std::path::Path::new("/x/b.ctl")
        );
        assert_eq!(s(&["birdc", "-v", "-s", "/y"]), std::path::Path::new("/y"));
    }

    #[test]
    fn local_prefixes_are_read_from_the_kernels_tables() {
        let trie = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n\
                    Local:\n     |-- 127.0.0.0\n        /8 host LOCAL\n     |-- 192.0.2.2\n        \
                    /32 host LOCAL\n     |-- 192.0.2.255\n        /32 link BROADCAST\n\
                    |-- 198.51.100.0\n        /24 host LOCAL\n";
        let v6 = "00000000000000000000000000000001 80 00000000000000000000000000000000 00 \
                  00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo\n\
                  fd000000000000000000000000000002 80 00000000000000000000000000000000 00 \
                  00000000000000000000000000000000 00000000 00000004 00000000 80200001     eth0\n\
                  fd000000000000000000000000000000 40 00000000000000000000000000000000 00 \
                  00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n";
        let mut h = HostAddresses::default();
        h.add_fib_trie(trie.as_bytes()).unwrap();
        h.add_ipv6_route(v6.as_bytes()).unwrap();
        assert_eq!(h.find(ip("192.0.2.2")).map(|p| p.len), Some(32));
        assert_eq!(h.find(ip("127.0.0.9")).map(|p| p.len), Some(8));
        assert_eq!(h.find(ip("198.51.100.7")).map(|p| p.len), Some(24));
        assert_eq!(h.find(ip("::ffff:198.51.100.7")).map(|p| p.len), Some(24));
        assert_eq!(h.find(ip("192.0.2.255")), None);
        assert_eq!(h.find(ip("192.0.2.80")), None);
        let p = h.find(ip("fd00::2")).unwrap();
        assert_eq!(p.interface.as_deref(), Some("eth0"));
        assert_eq!(h.find(ip("fd00::3")), None);
        // This machine: its loopback at least.
        let here = HostAddresses::read().unwrap();
        assert!(here.find(ip("127.0.0.1")).is_some(), "{here:?}");
    }

    /// A QUIC-LB key anyone may read is reported by its key, like a token.
    #[test]
    fn a_quic_key_anyone_may_read_is_reported() {
        let dir = Scratch::new("quickey");
        let key = dir.write("quic.key", "8f95f09245765f80256934e50c66207f\n");
        let text = format!(
            "[[quic_lb]]\ncodepoint = 0\nserver_id_len = 2\nnonce_len = 6\nkey_file = \"{}\"\n{GOOD}",
            key.display()
        );
        let c = Config::parse(&text, "t").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        let found = c.check_host("t");
        let quic: Vec<_> = found
            .iter()
            .filter(|e| e.key == "quic_lb[0].key_file")
            .collect();
        assert_eq!(quic.len(), 1, "{found:?}");
        assert!(
            quic[0].problem.contains("0640") && quic[0].problem.contains("its group"),
            "{found:?}"
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(c
            .check_host("t")
            .iter()
            .all(|e| e.key != "quic_lb[0].key_file"));
    }

    /// Each thing the host lacks is reported, all of them at once; with
    /// them in place, nothing.
    #[test]
    fn the_host_check_finds_what_the_host_lacks() {
        let dir = Scratch::new("host");
        let socket = dir.0.join("bird.ctl");
        let token = dir.write("token", "a-long-enough-secret-token\n");
        let routes = dir.0.join("routes");
        std::fs::create_dir_all(&routes).unwrap();
        let text = |socket: &std::path::Path, routes: &std::path::Path| {
            GOOD.replace(
                "[encap]",
                &format!(
                    "[api]\nlisten = \"127.0.0.1:9180\"\ntoken_file = \"{}\"\n\
                     [bgp]\nvips_file = \"{}/vips.conf\"\nbirdc = [\"true\", \"-s\", \"{}\"]\n[encap]",
                    token.display(),
                    routes.display(),
                    socket.display()
                ),
            )
        };
        let keys = |c: &Config| {
            let found = c.check_host("t");
            for e in &found {
                assert!(e.to_string().starts_with("t: "), "{e}");
            }
            found
                .into_iter()
                .map(|e| (e.key, e.problem))
                .collect::<Vec<_>>()
        };
        // Nothing in place: no socket, no routes directory, a token
        // anyone may read, and a VIP on this host's loopback (validation
        // refuses loopback VIPs; the host check sees them as local).
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut c = Config::parse(&text(&socket, &dir.0.join("gone")), "t").unwrap();
        c.vips[0].address = Some(ip("127.0.0.1"));
        let found = keys(&c);
        let names: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "bgp.birdc",
                "bgp.vips_file",
                "vips[0].address",
                "api.token_file"
            ],
            "{found:?}"
        );
        assert!(found[0].1.contains("does not exist"), "{found:?}");
        assert!(
            found[1].1.contains("gone") && found[1].1.contains("does not exist"),
            "{found:?}"
        );
        assert!(
            found[2].1.contains("127.0.0.1") && found[2].1.contains("own address"),
            "{found:?}"
        );
        assert!(
            found[3].1.contains("0644") && found[3].1.contains("chmod 600"),
            "{found:?}"
        );
        // A regular file where the socket should be.
        std::fs::write(&socket, "").unwrap();
        let c = Config::parse(&text(&socket, &routes), "t").unwrap();
        let found = keys(&c);
        assert!(
            found
                .iter()
                .any(|(k, p)| k == "bgp.birdc" && p.contains("not a socket")),
            "{found:?}"
        );
        std::fs::remove_file(&socket).unwrap();
        // Everything in place.
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(keys(&c), []);
        // A socket nobody listens on any more.
        drop(listener);
        let found = keys(&c);
        assert!(
            found
                .iter()
                .any(|(k, p)| k == "bgp.birdc" && p.contains("does not answer")),
            "{found:?}"
        );
        // A birdc that is not there.
        let mut c = c;
        c.bgp.as_mut().unwrap().birdc[0] = "fastpath-no-such-birdc".into();
        assert!(keys(&c)
            .iter()
            .any(|(k, p)| k == "bgp.birdc" && p.contains("not found on PATH")));
    }
}
