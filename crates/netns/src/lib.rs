//! Throwaway network namespaces for tests, demos and benchmarks, built with
//! iproute2. Each [`Netns`] deletes itself (and so its interfaces) when
//! dropped, also when a test panics.
//!
//! A crate of its own, with no async runtime and nothing of the load
//! balancer's, so that a port's tests can build a veth pair without
//! building the daemon.

use std::io::{self, Write as _};
use std::os::fd::AsFd;
use std::process::{Command, Output, Stdio};

/// Why a namespace, a veth pair or a command inside could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A program could not be started.
    #[error("starting {program}: {source}")]
    Spawn {
        /// The program (and where it was to run).
        program: String,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// A command ran and exited with a failure.
    #[error("`{command}` failed: {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A file or system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// A thread sent into a namespace panicked.
    #[error("a thread inside namespace {0} panicked")]
    ThreadPanicked(String),
}

/// What this crate's fallible functions return.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Io`] saying what was being done.
    fn io(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> Error {
        let what = what.to_string();
        move |source| Error::Io { what, source }
    }
}

/// A network namespace that is deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

/// Runs a command and fails with its stderr if it fails.
pub fn sh(args: &[&str]) -> Result<Output> {
    let (program, rest) = args.split_first().ok_or_else(|| Error::Failed {
        command: String::new(),
        stderr: "empty command line".into(),
    })?;
    let out = Command::new(program)
        .args(rest)
        .output()
        .map_err(|source| Error::Spawn {
            program: program.to_string(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Failed {
            command: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

impl Netns {
    /// Creates `name` (deleting a stale one of that name first) with its
    /// loopback up.
    pub fn new(name: &str) -> Result<Self> {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        sh(&["ip", "netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
        };
        ns.ip(&["link", "set", "dev", "lo", "up"])?;
        Ok(ns)
    }

    /// A handle on an existing namespace (not created here; dropping it
    /// deletes the namespace unless wrapped in `ManuallyDrop`).
    pub fn new_handle(name: &str) -> Self {
        Netns {
            name: name.to_string(),
        }
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip ARGS` inside the namespace.
    pub fn ip(&self, args: &[&str]) -> Result<Output> {
        let mut v = vec!["ip", "-n", &self.name];
        v.extend_from_slice(args);
        sh(&v)
    }

    /// A command run inside the namespace (`ip netns exec`).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Runs a command inside and fails with its stderr if it fails.
    pub fn exec(&self, args: &[&str]) -> Result<Output> {
        let mut v = vec!["ip", "netns", "exec", &self.name];
        v.extend_from_slice(args);
        sh(&v)
    }

    /// Runs a command inside with `input` on its stdin, and fails with its
    /// stderr if it fails (for `nft -f -` and the like).
    pub fn exec_input(&self, args: &[&str], input: &[u8]) -> Result<Output> {
        let mut v = vec!["ip", "netns", "exec", &self.name];
        v.extend_from_slice(args);
        let spawn_failed = |source| Error::Spawn {
            program: format!("{} in {}", args.first().unwrap_or(&""), self.name),
            source,
        };
        let mut child = Command::new("ip")
            .args(&v[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_failed)?;
        if let Some(mut stdin) = child.stdin.take() {
            // A command that exits without reading all of its input reports
            // why on stderr, checked below.
            let _ = stdin.write_all(input);
        }
        let out = child
            .wait_with_output()
            .map_err(Error::io(format!("waiting for `{}`", v.join(" "))))?;
        if !out.status.success() {
            return Err(Error::Failed {
                command: v.join(" "),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(out)
    }

    /// Sets a sysctl inside.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.exec(&["sysctl", "-qw", &format!("{key}={value}")])
            .map(|_| ())
    }

    /// Moves the calling thread into this namespace (sockets it opens
    /// afterwards belong to it). Other threads are unaffected.
    pub fn enter(&self) -> Result<()> {
        enter(&self.name)
    }

    /// Runs `f` on a new thread inside this namespace (sockets it opens
    /// belong to it) and returns what it returned; the calling thread stays
    /// where it is.
    pub fn inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        let name = self.name.clone();
        std::thread::spawn(move || {
            enter(&name)?;
            Ok(f())
        })
        .join()
        .map_err(|_| Error::ThreadPanicked(self.name.clone()))?
    }
}

/// Moves the calling thread into the namespace called `name` (made by
/// `ip netns add`, or a [`Netns`] that another thread owns). Other threads
/// are unaffected.
pub fn enter(name: &str) -> Result<()> {
    let path = format!("/var/run/netns/{name}");
    let f = std::fs::File::open(&path).map_err(Error::io(format!("opening {path}")))?;
    rustix::thread::move_into_link_name_space(
        f.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(|e| Error::Io {
        what: format!("entering namespace {name} (setns)"),
        source: e.into(),
    })
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Connects two namespaces with a veth pair: `a_if` in `a` and `b_if` in
/// `b` (the same namespace is allowed), with the given MACs, both up.
pub fn veth(a: &Netns, a_if: &str, a_mac: &str, b: &Netns, b_if: &str, b_mac: &str) -> Result<()> {
    veth_multiqueue(a, a_if, a_mac, b, b_if, b_mac, 1)
}

/// Like [`veth`], with `queues` receive and transmit queues on each end
/// (for one AF_XDP socket per queue).
pub fn veth_multiqueue(
    a: &Netns,
    a_if: &str,
    a_mac: &str,
    b: &Netns,
    b_if: &str,
    b_mac: &str,
    queues: u32,
) -> Result<()> {
    let q = queues.max(1).to_string();
    let end = |name: &'static str, ifname: &str, mac: &str, ns: &Netns| -> Vec<String> {
        let mut v: Vec<String> = [name, ifname, "address", mac]
            .iter()
            .map(|s| s.to_string())
            .collect();
        if queues > 1 {
            v.extend(
                ["numrxqueues", &q, "numtxqueues", &q]
                    .iter()
                    .map(|s| s.to_string()),
            );
        }
        v.extend(["netns".to_string(), ns.name().to_string()]);
        v
    };
    let mut args: Vec<String> = ["ip", "link", "add"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(end("name", a_if, a_mac, a));
    args.extend(["type", "veth", "peer"].iter().map(|s| s.to_string()));
    args.extend(end("name", b_if, b_mac, b));
    sh(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    if queues > 1 {
        // veth allocates the queues but starts with one active channel.
        a.exec(&["ethtool", "-L", a_if, "rx", &q, "tx", &q])?;
        b.exec(&["ethtool", "-L", b_if, "rx", &q, "tx", &q])?;
    }
    a.ip(&["link", "set", "dev", a_if, "up"])?;
    b.ip(&["link", "set", "dev", b_if, "up"])?;
    Ok(())
}

/// Whether this process may create namespaces (root with iproute2).
pub fn available() -> bool {
    rustix::process::geteuid().is_root()
        && Command::new("ip")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "system test: root, iproute2"]
    fn threads_inside_see_the_namespace_and_commands_get_their_input() {
        systest::require_netns();
        let ns = Netns::new(&format!("fplab{}", std::process::id())).expect("namespace");
        veth(
            &ns,
            "ta",
            "02:00:00:00:7e:01",
            &ns,
            "tb",
            "02:00:00:00:7e:02",
        )
        .expect("veth");
        ns.ip(&["addr", "add", "10.202.0.1/30", "dev", "ta"])
            .expect("address");
        // The address exists only inside the namespace.
        let bound = ns
            .inside(|| std::net::UdpSocket::bind("10.202.0.1:0").is_ok())
            .expect("thread inside");
        assert!(bound);
        let out = ns.exec_input(&["cat"], b"hello").expect("cat");
        assert_eq!(out.stdout, b"hello");
        assert!(matches!(
            ns.exec_input(&["false"], b""),
            Err(Error::Failed { .. })
        ));
        assert!(matches!(
            ns.inside(|| panic!("a test panic")),
            Err(Error::ThreadPanicked(_))
        ));
    }
}
