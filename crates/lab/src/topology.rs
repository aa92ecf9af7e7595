//! The throwaway network the demo and the integration tests run in, built
//! from network namespaces (root and iproute2 needed) and removed on drop:
//!
//! ```text
//! client 10.10.1.2 -- 10.10.1.1 router 10.10.2.1 -- 10.10.2.2 load balancer (fastpath, BIRD)
//!                        (BIRD) router 10.10.3.1 -- 10.10.3.2 backend 1 (nginx, VIP on lo, fastpath lb decap)
//!                               router 10.10.4.1 -- 10.10.4.2 backend 2 ...
//! ```
//!
//! The router learns the VIP from the load balancer over BGP; the load
//! balancer forwards with AF_PACKET as GRE; each backend decapsulates into a
//! TUN device and answers the client directly.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::{self, Netns};
use crate::{Error, Result};

/// The VIP.
pub const VIP: &str = "192.0.2.80";
/// Where the load balancer's API listens (inside its namespace).
pub const API: &str = "127.0.0.1:9180";

/// Child processes, stopped with SIGTERM (then SIGKILL) and reaped when
/// dropped; their output is kept.
#[derive(Default)]
pub struct Procs(Vec<(String, Child)>);

impl Procs {
    /// Adds a child under a name.
    pub fn push(&mut self, name: &str, c: Child) {
        self.0.push((name.to_string(), c));
    }

    /// The pid of a named child.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, c)| c.id())
    }

    /// Takes a named child out of the list.
    fn take(&mut self, name: &str) -> Option<Child> {
        let i = self.0.iter().position(|(n, _)| n == name)?;
        Some(self.0.remove(i).1)
    }

    /// Kills (if still running) and reaps a child; what it printed.
    fn reap(name: &str, mut c: Child) -> String {
        let _ = c.kill();
        match c.wait_with_output() {
            Ok(out) => format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => format!("(could not reap {name}: {e})"),
        }
    }

    /// Stops a named child and returns what it printed.
    pub fn stop(&mut self, name: &str) -> String {
        let Some(mut c) = self.take(name) else {
            return String::new();
        };
        // The child is ours and not yet reaped, so its pid is still its own.
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&c),
            rustix::process::Signal::TERM,
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        Self::reap(name, c)
    }

    /// Kills a named child with SIGKILL (no chance to clean up, as when it
    /// crashes) and returns what it printed.
    pub fn kill(&mut self, name: &str) -> String {
        match self.take(name) {
            Some(c) => Self::reap(name, c),
            None => String::new(),
        }
    }

    /// Stops everything, returning each child's output.
    pub fn stop_all(&mut self) -> Vec<(String, String)> {
        let names: Vec<String> = self.0.iter().map(|(n, _)| n.clone()).collect();
        names
            .into_iter()
            .map(|n| {
                let out = self.stop(&n);
                (n, out)
            })
            .collect()
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// The network, its processes and its files.
pub struct Topology {
    /// Client namespace.
    pub client: Netns,
    /// Router namespace.
    pub router: Netns,
    /// Load balancer namespace.
    pub lb: Netns,
    /// Backend namespaces.
    pub backends: Vec<Netns>,
    /// Running processes (dropped before the namespaces).
    pub procs: Procs,
    /// Scratch directory (configs, sockets, logs).
    pub dir: PathBuf,
    /// The load balancer's configuration file.
    pub config: PathBuf,
    fastpath: PathBuf,
}

fn spawn(ns: &Netns, args: &[&str]) -> Result<Child> {
    let (program, rest) = args.split_first().ok_or(Error::Failed {
        command: String::new(),
        stderr: "empty command line".into(),
    })?;
    let mut c = ns.command(program);
    c.args(rest)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().map_err(|source| Error::Spawn {
        program: format!("{args:?} in {}", ns.name()),
        source,
    })
}

impl Topology {
    /// Builds the network with `backends` nginx backends (1 to 8) and BIRD,
    /// but does not start the load balancer. `fastpath` is the binary to run
    /// (`lb run`, `lb decap`); `tag` makes names unique.
    pub fn build(fastpath: &Path, backends: usize, tag: &str) -> Result<Topology> {
        if !netns::available() {
            return Err(Error::Unavailable);
        }
        let backends = backends.clamp(1, 8);
        let n = |s: &str| Netns::new(&format!("fp{s}-{tag}"));
        let (client, router, lb) = (n("c")?, n("r")?, n("l")?);
        let mut bes = Vec::new();
        for i in 1..=backends {
            bes.push(n(&format!("b{i}"))?);
        }
        let dir = std::env::temp_dir().join(format!("fastpath-topology-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(Error::io(dir.display()))?;
        let mut t = Topology {
            client,
            router,
            lb,
            backends: bes,
            procs: Procs::default(),
            config: dir.join("lb.toml"),
            dir,
            fastpath: fastpath.to_path_buf(),
        };
        t.wire()?;
        t.start_bird()?;
        t.start_backends()?;
        t.write_config()?;
        Ok(t)
    }

    fn wire(&self) -> Result<()> {
        for ns in self.all() {
            for k in ["all", "default"] {
                ns.sysctl(&format!("net.ipv4.conf.{k}.rp_filter"), "0")?;
            }
            ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
            ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")?;
        }
        netns::veth(
            &self.client,
            "c0",
            "02:00:00:00:01:02",
            &self.router,
            "r1",
            "02:00:00:00:01:01",
        )?;
        // Two queues: the load balancer runs one AF_XDP socket per queue.
        netns::veth_multiqueue(
            &self.lb,
            "l0",
            "02:00:00:00:02:02",
            &self.router,
            "r2",
            "02:00:00:00:02:01",
            2,
        )?;
        self.client
            .ip(&["addr", "add", "10.10.1.2/24", "dev", "c0"])?;
        // A real client NIC puts complete checksums on the wire; veth leaves
        // them to offload by default, and XDP (unlike AF_PACKET) does not
        // say when a checksum is unfinished.
        self.client.exec(&["ethtool", "-K", "c0", "tx", "off"])?;
        self.router
            .ip(&["addr", "add", "10.10.1.1/24", "dev", "r1"])?;
        self.lb.ip(&["addr", "add", "10.10.2.2/24", "dev", "l0"])?;
        self.router
            .ip(&["addr", "add", "10.10.2.1/24", "dev", "r2"])?;
        for (i, be) in self.backends.iter().enumerate() {
            let net = 3 + i;
            netns::veth(
                be,
                "b0",
                &format!("02:00:00:00:{net:02x}:02"),
                &self.router,
                &format!("r{net}"),
                &format!("02:00:00:00:{net:02x}:01"),
            )?;
            be.ip(&["addr", "add", &format!("10.10.{net}.2/24"), "dev", "b0"])?;
            self.router.ip(&[
                "addr",
                "add",
                &format!("10.10.{net}.1/24"),
                "dev",
                &format!("r{net}"),
            ])?;
            be.ip(&["route", "add", "default", "via", &format!("10.10.{net}.1")])?;
            be.ip(&["addr", "add", &format!("{VIP}/32"), "dev", "lo"])?;
        }
        // No static route to the VIP: the router learns it over BGP.
        self.router.sysctl("net.ipv4.ip_forward", "1")?;
        self.client
            .ip(&["route", "add", "default", "via", "10.10.1.1"])?;
        self.lb
            .ip(&["route", "add", "default", "via", "10.10.2.1"])?;
        Ok(())
    }

    fn all(&self) -> impl Iterator<Item = &Netns> {
        [&self.client, &self.router, &self.lb]
            .into_iter()
            .chain(self.backends.iter())
    }

    /// Path of a BIRD control socket (`rtr` or `lb`).
    pub fn bird_socket(&self, which: &str) -> PathBuf {
        self.dir.join(format!("bird-{which}.ctl"))
    }

    fn start_bird(&mut self) -> Result<()> {
        let vips_file = self.dir.join("vips.conf");
        std::fs::write(&vips_file, "# filled in by fastpath\n")
            .map_err(Error::io(vips_file.display()))?;
        let timers = "connect delay time 1; connect retry time 1; hold time 9; keepalive time 3;";
        let confs = [
            (
                "rtr",
                format!(
                    "router id 10.10.2.1;\nprotocol device {{}}\nprotocol kernel {{ ipv4 {{ import none; export all; }}; }}\n\
                     protocol bgp lb1 {{ local 10.10.2.1 as 65000; neighbor 10.10.2.2 as 65001; {timers} ipv4 {{ import all; export none; }}; }}\n"
                ),
            ),
            (
                "lb",
                // BIRD reads `include` only at the start of a line.
                format!(
                    "router id 10.10.2.2;\nprotocol device {{}}\nprotocol static fastpath_vips {{\n  disabled;\n  ipv4;\ninclude \"{}\";\n}}\n\
                     protocol bgp uplink {{ local 10.10.2.2 as 65001; neighbor 10.10.2.1 as 65000; {timers} ipv4 {{ import none; export where proto = \"fastpath_vips\"; }}; }}\n",
                    vips_file.display()
                ),
            ),
        ];
        for (which, conf) in confs {
            let path = self.dir.join(format!("bird-{which}.conf"));
            std::fs::write(&path, conf).map_err(Error::io(path.display()))?;
            let ns = if which == "rtr" {
                &self.router
            } else {
                &self.lb
            };
            let sock = self.bird_socket(which);
            let pid = self.dir.join(format!("bird-{which}.pid"));
            let c = spawn(
                ns,
                &[
                    "bird",
                    "-f",
                    "-c",
                    &path.to_string_lossy(),
                    "-s",
                    &sock.to_string_lossy(),
                    "-P",
                    &pid.to_string_lossy(),
                ],
            )?;
            self.procs.push(&format!("bird-{which}"), c);
        }
        Ok(())
    }

    fn start_backends(&mut self) -> Result<()> {
        for i in 1..=self.backends.len() {
            self.start_decap(i)?;
            self.start_nginx(i)?;
        }
        Ok(())
    }

    /// The backend namespace of backend `i` (1-based).
    fn backend(&self, i: usize, doing: &str) -> Result<&Netns> {
        self.backends.get(i.wrapping_sub(1)).ok_or(Error::Failed {
            command: format!("{doing} on backend {i}"),
            stderr: format!("there are {} backends", self.backends.len()),
        })
    }

    /// The address of backend `i` (1-based): `10.10.{i+2}.2`, also its name
    /// in the configuration this module writes.
    pub fn backend_address(i: usize) -> String {
        format!("10.10.{}.2", 2 + i)
    }

    /// Starts (or restarts) backend `i`'s decapsulation agent
    /// (`fastpath lb decap`, process name `decap{i}`).
    pub fn start_decap(&mut self, i: usize) -> Result<()> {
        let fp = self.fastpath.to_string_lossy().to_string();
        let decap = spawn(
            self.backend(i, "start the decap agent")?,
            &[&fp, "lb", "decap", "--tun", "fpdecap0"],
        )?;
        self.procs.push(&format!("decap{i}"), decap);
        Ok(())
    }

    /// Takes backend `i`'s link down or up, on the router's side of its
    /// veth pair: the backend keeps its addresses and routes, the router
    /// loses (and on up regains) its route to the backend's network, as
    /// when a cable is pulled and plugged back.
    pub fn set_backend_link(&self, i: usize, up: bool) -> Result<()> {
        self.backend(i, "set the link")?;
        self.router.ip(&[
            "link",
            "set",
            "dev",
            &format!("r{}", 2 + i),
            if up { "up" } else { "down" },
        ])?;
        Ok(())
    }

    /// Rewrites the pool's `backends = [...]` line of the configuration
    /// file: backend numbers (1-based) with their weights (0 drains), in
    /// this order. The rest of the file stays as it is; nothing is reloaded.
    pub fn set_backends(&self, backends: &[(usize, u32)]) -> Result<()> {
        let list: Vec<String> = backends
            .iter()
            .map(|&(i, w)| {
                format!(
                    "{{ address = \"{}\", weight = {w} }}",
                    Self::backend_address(i)
                )
            })
            .collect();
        let text =
            std::fs::read_to_string(&self.config).map_err(Error::io(self.config.display()))?;
        let mut found = false;
        let lines: Vec<String> = text
            .lines()
            .map(|l| {
                if l.starts_with("backends = [") {
                    found = true;
                    format!("backends = [{}]", list.join(", "))
                } else {
                    l.to_string()
                }
            })
            .collect();
        if !found {
            return Err(Error::Failed {
                command: format!("rewrite the backends of {}", self.config.display()),
                stderr: "no line starts with `backends = [`".into(),
            });
        }
        std::fs::write(&self.config, lines.join("\n") + "\n")
            .map_err(Error::io(self.config.display()))
    }

    /// The load balancer's resident set size in KiB (`VmRSS` of
    /// /proc/PID/status; `ip netns exec` runs the program in its own pid).
    pub fn lb_rss_kib(&self) -> Result<u64> {
        let pid = self.procs.pid("lb").ok_or(Error::Failed {
            command: "read the load balancer's RSS".into(),
            stderr: "the load balancer is not running".into(),
        })?;
        let path = format!("/proc/{pid}/status");
        let text = std::fs::read_to_string(&path).map_err(Error::io(&path))?;
        text.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or(Error::Failed {
                command: format!("read VmRSS from {path}"),
                stderr: "no VmRSS line".into(),
            })
    }

    /// Starts (or restarts) nginx on backend `i` (1-based), answering
    /// `backend-i`.
    pub fn start_nginx(&mut self, i: usize) -> Result<()> {
        let d = self.dir.join(format!("be{i}"));
        std::fs::create_dir_all(d.join("tmp")).map_err(Error::io(d.display()))?;
        let conf = d.join("nginx.conf");
        let p = d.display();
        std::fs::write(
            &conf,
            format!(
                "daemon off;\nworker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/error.log;\nevents {{ worker_connections 256; }}\n\
                 http {{\n  access_log off;\n  keepalive_timeout 120s;\n  keepalive_requests 100000;\n  client_body_temp_path {p}/tmp;\n\
                 server {{ listen 80; location / {{ default_type text/plain; return 200 \"backend-{i}\\n\"; }} }}\n}}\n"
            ),
        )
        .map_err(Error::io(conf.display()))?;
        let be = self.backend(i, "start nginx")?;
        let nginx = spawn(
            be,
            &[
                "nginx",
                "-e",
                &format!("{p}/error.log"),
                "-p",
                &p.to_string(),
                "-c",
                &conf.to_string_lossy(),
            ],
        )?;
        self.procs.push(&format!("nginx{i}"), nginx);
        Ok(())
    }

    fn write_config(&self) -> Result<()> {
        let backends: Vec<String> = (0..self.backends.len())
            .map(|i| format!("{{ address = \"10.10.{}.2\" }}", 3 + i))
            .collect();
        let conf = format!(
            r#"# The demo's load balancer (see crates/lb/src/config.rs for every key).
[forwarder]
threads = 2
queue_size = 256
pool_buffers = 4096
[api]
listen = "{API}"
[bgp]
vips_file = "{vips}"
birdc = ["birdc", "-s", "{sock}"]
poll_ms = 200
[encap]
source = "10.10.2.2"
gateway_mac = "02:00:00:00:02:01"
[[pools]]
name = "web"
backends = [{backends}]
health = {{ kind = "http", port = 80, interval_ms = 200, timeout_ms = 300, rise = 2, fall = 2 }}
[[vips]]
name = "http"
address = "{VIP}"
port = 80
protocol = "tcp"
pool = "web"
"#,
            vips = self.dir.join("vips.conf").display(),
            sock = self.bird_socket("lb").display(),
            backends = backends.join(", "),
        );
        std::fs::write(&self.config, conf).map_err(Error::io(self.config.display()))
    }

    /// Starts `fastpath lb run --interface l0` in the load balancer's
    /// namespace.
    pub fn start_lb(&mut self) -> Result<()> {
        let fp = self.fastpath.to_string_lossy().to_string();
        let c = spawn(
            &self.lb,
            &[
                &fp,
                "lb",
                "run",
                "--config",
                &self.config.to_string_lossy(),
                "--interface",
                "l0",
            ],
        )?;
        self.procs.push("lb", c);
        Ok(())
    }

    /// Like [`Topology::start_lb`], with the load balancer's output appended
    /// to the file `log` instead of a pipe: for long runs, where a pipe that
    /// is read only at the end would fill and block its logging.
    pub fn start_lb_logged(&mut self, log: &Path) -> Result<()> {
        let file = std::fs::File::create(log).map_err(Error::io(log.display()))?;
        let err = file.try_clone().map_err(Error::io(log.display()))?;
        let fp = self.fastpath.to_string_lossy().to_string();
        let config = self.config.to_string_lossy().to_string();
        let args = [
            fp.as_str(),
            "lb",
            "run",
            "--config",
            &config,
            "--interface",
            "l0",
        ];
        let mut c = self.lb.command(args[0]);
        c.args(&args[1..])
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err);
        let child = c.spawn().map_err(|source| Error::Spawn {
            program: format!("{args:?} in {}", self.lb.name()),
            source,
        })?;
        self.procs.push("lb", child);
        Ok(())
    }

    /// Waits until a request through the VIP is answered; on timeout, says
    /// what every process printed.
    pub fn wait_for_vip(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.request().is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = self
                    .procs
                    .stop_all()
                    .into_iter()
                    .map(|(n, o)| format!("--- {n}:\n{o}"))
                    .collect();
                return Err(Error::Timeout {
                    what: format!("no answer through the VIP within {timeout:?}"),
                    logs: logs.join("\n"),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `f` on a thread inside namespace `ns` (sockets it opens live
    /// there).
    pub fn inside<T: Send + 'static>(
        ns: &Netns,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        ns.inside(f)
    }

    /// One HTTP request from the client through the VIP on a new connection;
    /// the answer's body.
    pub fn request(&self) -> Result<String, Error> {
        Self::inside(&self.client, || {
            let mut c = HttpConn::connect()?;
            c.get()
        })?
    }

    /// `count` requests from the client, each on its own connection (so
    /// each is a new flow); the answer counts by body, failures under "".
    pub fn requests(&self, count: usize) -> Result<std::collections::BTreeMap<String, usize>> {
        Self::inside(&self.client, move || {
            let mut by = std::collections::BTreeMap::new();
            for _ in 0..count {
                let body = HttpConn::connect()
                    .and_then(|mut c| c.get())
                    .unwrap_or_default();
                *by.entry(body).or_insert(0) += 1;
            }
            by
        })
    }

    /// The API's answer to `method path`, from inside the load balancer's
    /// namespace.
    pub fn api(&self, method: &str, path: &str) -> Result<String, Error> {
        let (method, path) = (method.to_string(), path.to_string());
        Self::inside(&self.lb, move || {
            let addr: SocketAddr = API.parse().map_err(|source| Error::Address {
                addr: API.to_string(),
                source,
            })?;
            lbd::daemon::api_request(addr, &method, &path).map_err(|e| Error::Api {
                request: format!("{method} {path}"),
                source: e.into(),
            })
        })?
    }

    /// The router's kernel route to the VIP (empty when withdrawn).
    pub fn router_route(&self) -> String {
        self.router
            .ip(&["route", "show", &format!("{VIP}/32")])
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    }

    /// What the router's BIRD says about the VIP.
    pub fn router_bird_route(&self) -> String {
        Command::new("birdc")
            .args([
                "-s",
                &self.bird_socket("rtr").to_string_lossy(),
                "show",
                "route",
                "for",
                VIP,
                "all",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.procs.stop_all();
        let _ = std::fs::remove_dir_all(&self.dir);
        // The namespaces delete themselves as their fields drop.
    }
}

/// A minimal HTTP/1.1 keep-alive client for the demo and tests: enough to
/// send GET / and read a Content-Length body, on one connection (one flow)
/// for as long as it lives.
pub struct HttpConn {
    s: TcpStream,
}

impl HttpConn {
    /// Connects to the VIP (from inside the client's namespace).
    pub fn connect() -> Result<Self> {
        let text = format!("{VIP}:80");
        let addr: SocketAddr = text.parse().map_err(|source| Error::Address {
            addr: text.clone(),
            source,
        })?;
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .map_err(Error::io(format!("connecting to {addr}")))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))
            .map_err(Error::io("setting a read timeout"))?;
        Ok(HttpConn { s })
    }

    /// Connects to the VIP from local port `port` (with SO_REUSEADDR), to
    /// reuse a 5-tuple on purpose: a client whose previous connection on
    /// that port was closed by the server first ([`HttpConn::get_closing`])
    /// may reuse it at once.
    pub fn connect_from(port: u16) -> Result<Self> {
        let text = format!("{VIP}:80");
        let addr: SocketAddr = text.parse().map_err(|source| Error::Address {
            addr: text.clone(),
            source,
        })?;
        let doing = |what: &str| Error::io(format!("{what} (local port {port} to {addr})"));
        let fd = rustix::net::socket(
            rustix::net::AddressFamily::INET,
            rustix::net::SocketType::STREAM,
            None,
        )
        .map_err(|e| doing("creating a socket")(e.into()))?;
        rustix::net::sockopt::set_socket_reuseaddr(&fd, true)
            .map_err(|e| doing("setting SO_REUSEADDR")(e.into()))?;
        let local = SocketAddr::from(([0, 0, 0, 0], port));
        rustix::net::bind(&fd, &local).map_err(|e| doing("binding")(e.into()))?;
        rustix::net::connect(&fd, &addr).map_err(|e| doing("connecting")(e.into()))?;
        let s = TcpStream::from(fd);
        s.set_read_timeout(Some(Duration::from_secs(3)))
            .map_err(Error::io("setting a read timeout"))?;
        Ok(HttpConn { s })
    }

    /// GET / with `Connection: close`, then waits for the server to close
    /// and closes too: the server closes first, so this side keeps no
    /// TIME_WAIT and its port is free again at once. The body.
    pub fn get_closing(mut self) -> Result<String, Error> {
        self.send("Connection: close\r\n")?;
        let body = self.answer()?;
        let mut rest = [0u8; 256];
        // The answer is complete; what follows is the server's FIN (0) or
        // an error, either way the end.
        while matches!(self.s.read(&mut rest), Ok(n) if n > 0) {}
        Ok(body)
    }

    fn send(&mut self, extra_headers: &str) -> Result<(), Error> {
        self.s
            .write_all(
                format!(
                    "GET / HTTP/1.1\r\nHost: {VIP}\r\nUser-Agent: fastpath-demo\r\n{extra_headers}\r\n"
                )
                .as_bytes(),
            )
            .map_err(Error::io("sending GET /"))
    }

    /// GET / on this connection; the body.
    pub fn get(&mut self) -> Result<String, Error> {
        self.send("")?;
        self.answer()
    }

    /// Reads one answer; its body.
    fn answer(&mut self) -> Result<String, Error> {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            let n = self
                .s
                .read(&mut chunk)
                .map_err(Error::io("reading the answer"))?;
            if n == 0 {
                return Err(Error::Http("connection closed".into()));
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>())
                    })
                    .and_then(Result::ok)
                    .unwrap_or(0);
                if body.len() >= len {
                    return Ok(body[..len].trim().to_string());
                }
            }
            if buf.len() > 65_536 {
                return Err(Error::Http("answer too long".into()));
            }
        }
    }
}
