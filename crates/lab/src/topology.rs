//! The throwaway network the demo and the integration tests run in, built
//! from network namespaces (root and iproute2 needed) and removed on drop:
//!
//! ```text
//! client 10.10.1.2 -- 10.10.1.1 router 10.10.2.1 ==ptp== 10.10.2.2 load balancer 1 (fastpath, BIRD)
//!                        (BIRD,  router 10.10.2.1 ==ptp== 10.10.2.3 load balancer 2 ...  (a fleet: K of them)
//!                        ECMP)   router 10.10.3.1 -- 10.10.3.2 backend 1 (nginx, VIP on lo, fastpath lb decap)
//!                                router 10.10.4.1 -- 10.10.4.2 backend 2 ...
//! ```
//!
//! The router learns the VIP ([`VIP`], in 198.18.0.0/15, which exists only
//! inside these namespaces) from every load balancer over BGP with equal
//! attributes and installs one multipath route (`merge paths on` at the
//! kernel protocol), hashing flows on their 5-tuple
//! (`fib_multipath_hash_policy=3`, fields `0x0037`), as the routers in front
//! of a Maglev fleet do. BFD and short BGP timers take a dead load balancer
//! out of the route in about 0.3 s. Each load balancer has its own
//! point-to-point link (`10.10.2.1 peer 10.10.2.(k+1)`), forwards with
//! AF_XDP (else AF_PACKET) as GRE, and each backend decapsulates into a TUN
//! device and answers the client directly. With one load balancer the
//! addresses are those of the single-box topology the tests have always used.
//!
//! A dual-stack network ([`Topology::build_dual_stack`]) adds IPv6 to every
//! link (`fd00:10:N::/64` beside `10.10.N.0/24`; load balancer `k`'s link
//! is `fd00:10:2:k::/64`), an IPv6 VIP ([`VIP6`]) on every backend's
//! loopback served by the same pool, BIRD's ipv6 channel on every session
//! (carried over the IPv4 session, next hop the load balancer's IPv6
//! address) and IPv6 ECMP at the router (`net.ipv6.fib_multipath_hash_policy`
//! 3 on the same fields). The backends stay IPv4: the load balancers send
//! them the IPv6 packets in GRE over IPv4, and they answer over IPv6.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::netns::{self, Netns};
use crate::{Error, Result};

/// The VIP.
pub const VIP: &str = "198.18.0.80";
/// The IPv6 VIP of a dual-stack network (port 80, the same pool).
pub const VIP6: &str = "fd00:18::80";
/// The UDP port of the fleet's echo VIP (each backend answers datagrams
/// to it, see [`Topology::start_udp_echo`]).
pub const UDP_ECHO_PORT: u16 = 7;
/// Where a single load balancer's API listens (inside its namespace); in a
/// fleet each listens on its own address (see [`Topology::api_addr`]).
pub const API: &str = "127.0.0.1:9180";
/// The bearer token of a fleet's APIs (they listen on addresses the router
/// reaches, so they need one).
pub const API_TOKEN: &str = "fastpath-lab-fleet-token";

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

    /// Whether a named child is still running (false once it has exited,
    /// or if there is none of that name).
    pub fn running(&mut self, name: &str) -> bool {
        self.0
            .iter_mut()
            .find(|(n, _)| n == name)
            .is_some_and(|(_, c)| matches!(c.try_wait(), Ok(None)))
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
    /// Load balancer namespaces, load balancer `k` (1-based) at index `k - 1`.
    pub lbs: Vec<Netns>,
    /// Backend namespaces.
    pub backends: Vec<Netns>,
    /// Running processes (dropped before the namespaces).
    pub procs: Procs,
    /// Scratch directory (configs, sockets, logs).
    pub dir: PathBuf,
    /// Load balancer 1's configuration file (`configs[0]`).
    pub config: PathBuf,
    /// Each load balancer's configuration file.
    pub configs: Vec<PathBuf>,
    fastpath: PathBuf,
    /// Whether the network is dual-stack ([`Topology::build_dual_stack`]).
    pub ipv6: bool,
    /// Tells the UDP echo threads to end.
    echo_stop: Arc<AtomicBool>,
    echo_threads: Vec<std::thread::JoinHandle<()>>,
}

fn spawn(ns: &Netns, args: &[&str]) -> Result<Child> {
    let (program, rest) = args
        .split_first()
        .ok_or(Error::Netns(netns::Error::Failed {
            command: String::new(),
            stderr: "empty command line".into(),
        }))?;
    let mut c = ns.command(program);
    c.args(rest)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().map_err(|source| {
        Error::Netns(netns::Error::Spawn {
            program: format!("{args:?} in {}", ns.name()),
            source,
        })
    })
}

/// The BGP timers of every session: BFD at 100 ms x 3 notices a silently
/// dead peer in about 0.3 s (BIRD's defaults need minutes), and a session
/// that failed may come back after a second instead of a minute.
const BGP_TIMERS: &str = "bfd on; hold time 3; keepalive time 1; connect delay time 1; connect retry time 1; error wait time 1,5;";
/// The shipped part of BIRD's configuration that fastpath drives
/// (`dist/bird/fastpath.conf`): every load balancer's BIRD includes it as
/// it is, so the namespace tests and `make demo` run what the package
/// installs.
pub const SHIPPED_BIRD_CONF: &str = include_str!("../../../dist/bird/fastpath.conf");
/// The IPv4 routes file [`SHIPPED_BIRD_CONF`] includes (a `[bgp]
/// vips_file` must name it).
pub const SHIPPED_VIPS_FILE: &str = "/run/fastpath/vips.conf";
/// Where the shipped files put fastpath's runtime files.
const SHIPPED_RUN_DIR: &str = "/run/fastpath";
/// BFD at 100 ms, 3 missed packets.
const BFD: &str = "protocol bfd { interface \"*\" { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }; }";

impl Topology {
    /// Builds the network with one load balancer and `backends` nginx
    /// backends (1 to 8) and BIRD, but does not start the load balancer.
    /// `fastpath` is the binary to run (`lb run`, `lb decap`); `tag` makes
    /// names unique.
    pub fn build(fastpath: &Path, backends: usize, tag: &str) -> Result<Topology> {
        Self::build_fleet(fastpath, 1, backends, tag)
    }

    /// Builds the network with `lbs` load balancers (1 to 8, each with its
    /// own BIRD, all in one Maglev pool) and `backends` nginx backends (1 to
    /// 8), but starts no load balancer.
    pub fn build_fleet(
        fastpath: &Path,
        lbs: usize,
        backends: usize,
        tag: &str,
    ) -> Result<Topology> {
        Self::build_with(fastpath, lbs, backends, tag, false)
    }

    /// [`Topology::build_fleet`] with IPv6 beside IPv4 everywhere and the
    /// IPv6 VIP [`VIP6`] (`http6`, port 80, the same pool) announced by
    /// every load balancer over BGP's ipv6 channel.
    pub fn build_dual_stack(
        fastpath: &Path,
        lbs: usize,
        backends: usize,
        tag: &str,
    ) -> Result<Topology> {
        Self::build_with(fastpath, lbs, backends, tag, true)
    }

    fn build_with(
        fastpath: &Path,
        lbs: usize,
        backends: usize,
        tag: &str,
        ipv6: bool,
    ) -> Result<Topology> {
        if !netns::available() {
            return Err(Error::Unavailable);
        }
        let backends = backends.clamp(1, 8);
        let lbs = lbs.clamp(1, 8);
        let n = |s: &str| Netns::new(&format!("fp{s}-{tag}"));
        let (client, router) = (n("c")?, n("r")?);
        let mut lb_ns = Vec::new();
        for k in 1..=lbs {
            lb_ns.push(n(&format!("l{k}"))?);
        }
        let mut bes = Vec::new();
        for i in 1..=backends {
            bes.push(n(&format!("b{i}"))?);
        }
        let dir = std::env::temp_dir().join(format!("fastpath-topology-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(Error::io(dir.display()))?;
        let configs: Vec<PathBuf> = (1..=lbs)
            .map(|k| {
                if k == 1 {
                    dir.join("lb.toml")
                } else {
                    dir.join(format!("lb{k}.toml"))
                }
            })
            .collect();
        let mut t = Topology {
            client,
            router,
            lbs: lb_ns,
            backends: bes,
            procs: Procs::default(),
            config: configs[0].clone(),
            configs,
            dir,
            fastpath: fastpath.to_path_buf(),
            ipv6,
            echo_stop: Arc::new(AtomicBool::new(false)),
            echo_threads: Vec::new(),
        };
        t.wire()?;
        t.start_bird()?;
        t.start_backends()?;
        t.write_config()?;
        Ok(t)
    }

    /// Load balancer 1's namespace.
    pub fn lb(&self) -> &Netns {
        &self.lbs[0]
    }

    /// The number of load balancers.
    pub fn lb_count(&self) -> usize {
        self.lbs.len()
    }

    /// The address of load balancer `k` (1-based): `10.10.2.{k+1}`.
    pub fn lb_address(k: usize) -> String {
        format!("10.10.2.{}", k + 1)
    }

    /// The IPv6 address of load balancer `k` (1-based) in a dual-stack
    /// network: `fd00:10:2:{k}::2`, the router being `::1` of that /64.
    pub fn lb_address6(k: usize) -> String {
        format!("fd00:10:2:{k}::2")
    }

    /// The MAC of the router's end of load balancer `k`'s link (the load
    /// balancer's next hop).
    pub fn router_mac(k: usize) -> String {
        if k == 1 {
            "02:00:00:00:02:01".into()
        } else {
            format!("02:00:00:00:{:02x}:01", 0x20 + k)
        }
    }

    /// The MAC of load balancer `k`'s end of its link (`l0`).
    pub fn lb_mac(k: usize) -> String {
        if k == 1 {
            "02:00:00:00:02:02".into()
        } else {
            format!("02:00:00:00:{:02x}:02", 0x20 + k)
        }
    }

    /// The router's interface towards load balancer `k`.
    pub fn router_if(k: usize) -> String {
        if k == 1 {
            "r2".into()
        } else {
            format!("rl{k}")
        }
    }

    /// The name under [`Topology::procs`] of load balancer `k`'s process:
    /// `lb` for the first (as the single-box tests always called it), `lbK`
    /// for the others.
    pub fn lb_proc(k: usize) -> String {
        if k == 1 {
            "lb".into()
        } else {
            format!("lb{k}")
        }
    }

    /// Load balancer `k`'s namespace (1-based).
    fn lb_ns(&self, k: usize) -> Result<&Netns> {
        self.lbs
            .get(k.wrapping_sub(1))
            .ok_or(Error::Netns(netns::Error::Failed {
                command: format!("use load balancer {k}"),
                stderr: format!("there are {} load balancers", self.lbs.len()),
            }))
    }

    fn wire(&self) -> Result<()> {
        let off = if self.ipv6 { "0" } else { "1" };
        for ns in self.all() {
            for k in ["all", "default"] {
                ns.sysctl(&format!("net.ipv4.conf.{k}.rp_filter"), "0")?;
            }
            ns.sysctl("net.ipv6.conf.all.disable_ipv6", off)?;
            ns.sysctl("net.ipv6.conf.default.disable_ipv6", off)?;
        }
        netns::veth(
            &self.client,
            "c0",
            "02:00:00:00:01:02",
            &self.router,
            "r1",
            "02:00:00:00:01:01",
        )?;
        for (i, lb) in self.lbs.iter().enumerate() {
            let k = i + 1;
            let (rif, lb_mac) = (Self::router_if(k), Self::lb_mac(k));
            // Two queues: the load balancer runs one AF_XDP socket per queue.
            netns::veth_multiqueue(
                lb,
                "l0",
                &lb_mac,
                &self.router,
                &rif,
                &Self::router_mac(k),
                2,
            )?;
            // A veth takes frames its peer sends with XDP_TX (the load
            // balancer in the driver) only in NAPI mode, which GRO turns on
            // (a real NIC's link partner needs nothing).
            self.router.exec(&["ethtool", "-K", &rif, "gro", "on"])?;
            // Point to point: the router keeps 10.10.2.1 on every load
            // balancer's link, each load balancer its own address.
            let me = Self::lb_address(k);
            lb.ip(&["addr", "add", &me, "peer", "10.10.2.1/32", "dev", "l0"])?;
            self.router.ip(&[
                "addr",
                "add",
                "10.10.2.1",
                "peer",
                &format!("{me}/32"),
                "dev",
                &rif,
            ])?;
            lb.ip(&["route", "add", "default", "via", "10.10.2.1"])?;
        }
        self.client
            .ip(&["addr", "add", "10.10.1.2/24", "dev", "c0"])?;
        // A real client NIC puts complete checksums on the wire; veth leaves
        // them to offload by default, and XDP (unlike AF_PACKET) does not
        // say when a checksum is unfinished.
        self.client.exec(&["ethtool", "-K", "c0", "tx", "off"])?;
        self.router
            .ip(&["addr", "add", "10.10.1.1/24", "dev", "r1"])?;
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
        // No static route to the VIP: the router learns it over BGP. ECMP on
        // the 5-tuple: policy 3 with source and destination address,
        // protocol and both ports (policy 1 hashes connected sockets on
        // their socket hash, not their ports).
        self.router.sysctl("net.ipv4.ip_forward", "1")?;
        self.router
            .sysctl("net.ipv4.fib_multipath_hash_fields", "0x0037")?;
        self.router
            .sysctl("net.ipv4.fib_multipath_hash_policy", "3")?;
        self.client
            .ip(&["route", "add", "default", "via", "10.10.1.1"])?;
        if self.ipv6 {
            self.wire6()?;
        }
        Ok(())
    }

    /// The IPv6 half of a dual-stack network: an address on every link
    /// (no duplicate address detection: usable at once), the VIP on every
    /// backend's loopback, default routes through the router, and the
    /// router's forwarding and ECMP on the 5-tuple.
    fn wire6(&self) -> Result<()> {
        let addr =
            |ns: &Netns, a: &str, dev: &str| ns.ip(&["-6", "addr", "add", a, "dev", dev, "nodad"]);
        addr(&self.client, "fd00:10:1::2/64", "c0")?;
        addr(&self.router, "fd00:10:1::1/64", "r1")?;
        self.client
            .ip(&["-6", "route", "add", "default", "via", "fd00:10:1::1"])?;
        for (i, lb) in self.lbs.iter().enumerate() {
            let k = i + 1;
            addr(lb, &format!("{}/64", Self::lb_address6(k)), "l0")?;
            addr(
                &self.router,
                &format!("fd00:10:2:{k}::1/64"),
                &Self::router_if(k),
            )?;
            lb.ip(&[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &format!("fd00:10:2:{k}::1"),
            ])?;
        }
        for (i, be) in self.backends.iter().enumerate() {
            let net = 3 + i;
            addr(be, &format!("fd00:10:{net}::2/64"), "b0")?;
            addr(
                &self.router,
                &format!("fd00:10:{net}::1/64"),
                &format!("r{net}"),
            )?;
            be.ip(&[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &format!("fd00:10:{net}::1"),
            ])?;
            addr(be, &format!("{VIP6}/128"), "lo")?;
        }
        self.router.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        self.router
            .sysctl("net.ipv6.fib_multipath_hash_fields", "0x0037")?;
        self.router
            .sysctl("net.ipv6.fib_multipath_hash_policy", "3")?;
        Ok(())
    }

    fn all(&self) -> impl Iterator<Item = &Netns> {
        [&self.client, &self.router]
            .into_iter()
            .chain(self.lbs.iter())
            .chain(self.backends.iter())
    }

    /// Path of a BIRD control socket: `rtr` for the router, `lb` for load
    /// balancer 1, `lbK` for load balancer K.
    pub fn bird_socket(&self, which: &str) -> PathBuf {
        self.dir.join(format!("bird-{which}.ctl"))
    }

    /// The BIRD name (`lb`, `lb2`, ...) of load balancer `k`.
    fn bird_name(k: usize) -> String {
        Self::lb_proc(k)
    }

    /// Load balancer `k`'s /run/fastpath: a directory of the scratch
    /// directory, mounted there for its BIRD and its fastpath (see
    /// [`Topology::lb_machine`]), where the routes file of the shipped
    /// BIRD configuration lies.
    fn run_dir(&self, k: usize) -> PathBuf {
        self.dir.join(format!("run-{}", Self::bird_name(k)))
    }

    /// The routes files load balancer `k` writes for its BIRD, as this
    /// machine sees them (inside its namespace they are in /run/fastpath).
    fn vips_files(&self, k: usize) -> [PathBuf; 2] {
        let run = self.run_dir(k);
        [run.join("vips.conf"), run.join("vips6.conf")]
    }

    /// The command line that runs `args` on load balancer `k`'s machine:
    /// its own /run/fastpath mounted in a mount namespace of the command's
    /// own (`ip netns exec` makes one whose mounts do not reach this
    /// machine's), so that every load balancer's BIRD includes the shipped
    /// `dist/bird/fastpath.conf` as it is, with its fixed paths, and sees
    /// only the routes its own fastpath wrote.
    fn lb_machine(&self, k: usize, args: &[&str]) -> Result<Vec<String>> {
        let run = self.run_dir(k);
        std::fs::create_dir_all(&run).map_err(Error::io(run.display()))?;
        // The mount point, once, on this machine (empty: fastpath's own
        // runtime directory, where it also keeps its interface locks).
        std::fs::create_dir_all(SHIPPED_RUN_DIR).map_err(Error::io(SHIPPED_RUN_DIR))?;
        let mut line = vec![
            "sh".to_string(),
            "-c".to_string(),
            format!("mount --bind \"$0\" {SHIPPED_RUN_DIR} && exec \"$@\""),
            run.to_string_lossy().into_owned(),
        ];
        line.extend(args.iter().map(|a| a.to_string()));
        Ok(line)
    }

    /// A command that runs `args` on load balancer `k`'s machine, as its
    /// fastpath runs there: in its namespace, with its own /run/fastpath
    /// (where its BIRD reads the routes file). For a test that starts the
    /// load balancer its own way (under `prlimit`, for example).
    pub fn lb_machine_command(&self, k: usize, args: &[&str]) -> Result<Command> {
        let line = self.lb_machine(k, args)?;
        let mut c = self.lb_ns(k)?.command(&line[0]);
        c.args(&line[1..]);
        Ok(c)
    }

    /// Where BIRD `which` (`rtr`, `lb`, `lbK`) logs.
    pub fn bird_log_path(&self, which: &str) -> PathBuf {
        self.dir.join(format!("bird-{which}.log"))
    }

    /// What BIRD `which` (`rtr`, `lb`, `lbK`) has logged so far.
    pub fn bird_log(&self, which: &str) -> String {
        std::fs::read_to_string(self.bird_log_path(which)).unwrap_or_default()
    }

    /// The BIRD name (`lb`, `lb2`, ...) of load balancer `k`, for
    /// [`Topology::bird_socket`] and [`Topology::bird_log`].
    pub fn bird_of(k: usize) -> String {
        Self::bird_name(k)
    }

    /// Runs `birdc ARGS` against BIRD `which`; what it printed.
    pub fn birdc(&self, which: &str, args: &[&str]) -> String {
        Command::new("birdc")
            .arg("-s")
            .arg(self.bird_socket(which))
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    }

    fn start_bird(&mut self) -> Result<()> {
        // One session per load balancer, all in one AS with equal
        // attributes, merged into one multipath kernel route (per family
        // in a dual-stack network; IPv6 rides the IPv4 session).
        let (kernel6, channel6) = if self.ipv6 {
            (
                "protocol kernel { merge paths on; ipv6 { import none; export all; }; }\n",
                " ipv6 { import all; export none; };",
            )
        } else {
            ("", "")
        };
        // Each BIRD logs to a file of its own (a pipe read only at the end
        // would fill and block it).
        let log = |which: &str| format!("log \"{}\" all;\n", self.bird_log_path(which).display());
        let mut rtr = format!(
            "{}router id 10.10.2.1;\nprotocol device {{}}\n{BFD}\n\
             protocol kernel {{ merge paths on; ipv4 {{ import none; export all; }}; }}\n{kernel6}",
            log("rtr")
        );
        for k in 1..=self.lbs.len() {
            rtr += &format!(
                "protocol bgp lb{k} {{ local 10.10.2.1 as 65000; neighbor {} as 65001; {BGP_TIMERS} ipv4 {{ import all; export none; }};{channel6} }}\n",
                Self::lb_address(k)
            );
        }
        let mut confs = vec![("rtr".to_string(), rtr, None)];
        // The load balancers' static protocols are the shipped ones, as
        // they are (dist/bird/fastpath.conf, which the package installs).
        let shipped = self.dir.join("fastpath.conf");
        std::fs::write(&shipped, SHIPPED_BIRD_CONF).map_err(Error::io(shipped.display()))?;
        for k in 1..=self.lbs.len() {
            let me = Self::lb_address(k);
            // BIRD reads `include` only at the start of a line. The shipped
            // file has both families' static protocols; a dual-stack
            // network also carries IPv6 on the session, next hop this load
            // balancer's IPv6 address.
            let uplink6 = if self.ipv6 {
                format!(
                    " ipv6 {{ import none; export where proto = \"fastpath_vips6\"; next hop address {}; }};",
                    Self::lb_address6(k)
                )
            } else {
                String::new()
            };
            confs.push((
                Self::bird_name(k),
                format!(
                    "{}router id {me};\nprotocol device {{}}\n{BFD}\ninclude \"{}\";\n\
                     protocol bgp uplink {{ local {me} as 65001; neighbor 10.10.2.1 as 65000; {BGP_TIMERS} ipv4 {{ import none; export where proto = \"fastpath_vips\"; }};{uplink6} }}\n",
                    log(&Self::bird_name(k)),
                    shipped.display()
                ),
                Some(k),
            ));
        }
        for (which, conf, k) in confs {
            let path = self.dir.join(format!("bird-{which}.conf"));
            std::fs::write(&path, conf).map_err(Error::io(path.display()))?;
            self.spawn_bird(&which, k)?;
        }
        Ok(())
    }

    /// Starts BIRD `which` (written by `start_bird`) in the router's
    /// namespace (`k` = None) or load balancer `k`'s.
    fn spawn_bird(&mut self, which: &str, k: Option<usize>) -> Result<()> {
        let path = self.dir.join(format!("bird-{which}.conf"));
        let ns = match k {
            None => &self.router,
            Some(k) => self.lb_ns(k)?,
        };
        let sock = self.bird_socket(which);
        let pid = self.dir.join(format!("bird-{which}.pid"));
        let (path, sock, pid) = (
            path.to_string_lossy(),
            sock.to_string_lossy(),
            pid.to_string_lossy(),
        );
        let args = ["bird", "-f", "-c", &path, "-s", &sock, "-P", &pid];
        let c = match k {
            None => spawn(ns, &args)?,
            Some(k) => {
                let line = self.lb_machine(k, &args)?;
                spawn(ns, &line.iter().map(String::as_str).collect::<Vec<_>>())?
            }
        };
        self.procs.push(&format!("bird-{which}"), c);
        Ok(())
    }

    /// Freezes load balancer `k`'s machine (SIGSTOP to fastpath and its
    /// BIRD): it stops answering anything while its sockets stay open, as a
    /// hung or unplugged box, so the router can only notice by BFD. Follow
    /// with [`Topology::kill_lb_machine`].
    pub fn freeze_lb_machine(&mut self, k: usize) -> Result<()> {
        self.lb_ns(k)?;
        for name in [Self::lb_proc(k), format!("bird-{}", Self::bird_name(k))] {
            if let Some(pid) = self.procs.pid(&name) {
                let pid = rustix::process::Pid::from_raw(pid as i32).ok_or(Error::Netns(
                    netns::Error::Failed {
                        command: format!("freeze {name}"),
                        stderr: "pid 0".into(),
                    },
                ))?;
                rustix::process::kill_process(pid, rustix::process::Signal::STOP).map_err(|e| {
                    Error::Netns(netns::Error::Io {
                        what: format!("SIGSTOP to {name}"),
                        source: e.into(),
                    })
                })?;
            }
        }
        Ok(())
    }

    /// Kills load balancer `k`'s machine: fastpath and its BIRD with
    /// SIGKILL, nothing withdrawn, as when the box loses power. The
    /// router notices by BFD. (Killing only fastpath would leave its BIRD
    /// announcing the VIP: a real deployment stops the announcement from
    /// the service manager when the process dies.)
    pub fn kill_lb_machine(&mut self, k: usize) -> Result<()> {
        self.lb_ns(k)?;
        self.procs.kill(&Self::lb_proc(k));
        self.procs.kill(&format!("bird-{}", Self::bird_name(k)));
        Ok(())
    }

    /// Boots load balancer `k`'s machine again: its BIRD, then fastpath
    /// (logging to `lbK.log`).
    pub fn boot_lb_machine(&mut self, k: usize) -> Result<()> {
        // A fresh BIRD starts with the VIPs' protocol disabled, as the
        // configuration says, and a booted machine's /run is empty;
        // fastpath writes the routes and enables the protocol once it
        // forwards.
        for vips in self.vips_files(k) {
            match std::fs::remove_file(&vips) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io(vips.display())(e))
                }
                _ => {}
            }
        }
        let _ = std::fs::remove_file(self.bird_socket(&Self::bird_name(k)));
        self.spawn_bird(&Self::bird_name(k), Some(k))?;
        self.start_lb_k(k)
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
        self.backends
            .get(i.wrapping_sub(1))
            .ok_or(Error::Netns(netns::Error::Failed {
                command: format!("{doing} on backend {i}"),
                stderr: format!("there are {} backends", self.backends.len()),
            }))
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

    /// Rewrites the pool's `backends = [...]` line of every load balancer's
    /// configuration file: backend numbers (1-based) with their weights (0
    /// drains), in this order. The rest of each file stays as it is;
    /// nothing is reloaded.
    pub fn set_backends(&self, backends: &[(usize, u32)]) -> Result<()> {
        for k in 1..=self.lbs.len() {
            self.set_backends_on(k, backends)?;
        }
        Ok(())
    }

    /// [`Topology::set_backends`] for load balancer `k`'s file only (a
    /// fleet whose configurations differ).
    pub fn set_backends_on(&self, k: usize, backends: &[(usize, u32)]) -> Result<()> {
        let list: Vec<String> = backends
            .iter()
            .map(|&(i, w)| {
                format!(
                    "{{ address = \"{}\", weight = {w} }}",
                    Self::backend_address(i)
                )
            })
            .collect();
        let path =
            self.configs
                .get(k.wrapping_sub(1))
                .ok_or(Error::Netns(netns::Error::Failed {
                    command: format!("rewrite load balancer {k}'s backends"),
                    stderr: format!("there are {} load balancers", self.lbs.len()),
                }))?;
        let text = std::fs::read_to_string(path).map_err(Error::io(path.display()))?;
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
            return Err(Error::Netns(netns::Error::Failed {
                command: format!("rewrite the backends of {}", path.display()),
                stderr: "no line starts with `backends = [`".into(),
            }));
        }
        std::fs::write(path, lines.join("\n") + "\n").map_err(Error::io(path.display()))
    }

    /// The load balancer's resident set size in KiB (`VmRSS` of
    /// /proc/PID/status; `ip netns exec` runs the program in its own pid).
    pub fn lb_rss_kib(&self) -> Result<u64> {
        let pid = self
            .procs
            .pid("lb")
            .ok_or(Error::Netns(netns::Error::Failed {
                command: "read the load balancer's RSS".into(),
                stderr: "the load balancer is not running".into(),
            }))?;
        let path = format!("/proc/{pid}/status");
        let text = std::fs::read_to_string(&path).map_err(Error::io(&path))?;
        text.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or(Error::Netns(netns::Error::Failed {
                command: format!("read VmRSS from {path}"),
                stderr: "no VmRSS line".into(),
            }))
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
                 server {{ listen 80;{listen6} location / {{ default_type text/plain; return 200 \"backend-{i}\\n\"; }} }}\n}}\n",
                listen6 = if self.ipv6 { " listen [::]:80;" } else { "" }
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
        let peers: Vec<String> = (1..=self.lbs.len())
            .map(|k| format!("\"{}\"", Self::lb_address(k)))
            .collect();
        for k in 1..=self.lbs.len() {
            // The fleet's section only where there is a fleet: the single
            // box keeps the configuration its tests were written against.
            let (fleet, udp) = if self.lbs.len() > 1 {
                (
                    format!(
                        "[fleet]\nname = \"lb{k}\"\npeers = [{}]\n[tracer]\nenabled = true\nreport_to = [\"10.10.1.0/24\"]\n",
                        peers.join(", ")
                    ),
                    format!(
                        "[[vips]]\nname = \"udp-echo\"\naddress = \"{VIP}\"\nport = {UDP_ECHO_PORT}\nprotocol = \"udp\"\npool = \"web\"\n"
                    ),
                )
            } else {
                (String::new(), String::new())
            };
            let api = if self.lbs.len() > 1 {
                let token = self.dir.join("api-token");
                std::fs::write(&token, format!("{API_TOKEN}\n"))
                    .map_err(Error::io(token.display()))?;
                format!(
                    "listen = \"{}\"\ntoken_file = \"{}\"",
                    self.api_addr(k),
                    token.display()
                )
            } else {
                format!("listen = \"{API}\"")
            };
            // The IPv6 VIP goes to the same (IPv4) backends, in GRE over
            // IPv4.
            let v6 = if self.ipv6 {
                format!(
                    "[[vips]]\nname = \"http6\"\naddress = \"{VIP6}\"\nport = 80\nprotocol = \"tcp\"\npool = \"web\"\n"
                )
            } else {
                String::new()
            };
            let conf = format!(
                r#"# Load balancer {k} of the throwaway network (see crates/lb/src/config.rs for every key).
[forwarder]
threads = 2
queue_size = 256
pool_buffers = 4096
[api]
{api}
[bgp]
vips_file = "{SHIPPED_VIPS_FILE}"
birdc = ["birdc", "-s", "{sock}"]
poll_ms = 200
[encap]
source = "{me}"
gateway_mac = "{gw}"
{fleet}[[pools]]
name = "web"
backends = [{backends}]
health = {{ kind = "http", port = 80, interval_ms = 200, timeout_ms = 300, rise = 2, fall = 2 }}
[[vips]]
name = "http"
address = "{VIP}"
port = 80
protocol = "tcp"
pool = "web"
{udp}{v6}"#,
                sock = self.bird_socket(&Self::bird_name(k)).display(),
                me = Self::lb_address(k),
                gw = Self::router_mac(k),
                backends = backends.join(", "),
            );
            let path = &self.configs[k - 1];
            std::fs::write(path, conf).map_err(Error::io(path.display()))?;
        }
        Ok(())
    }

    /// Starts `fastpath lb run --interface l0` in load balancer 1's
    /// namespace.
    pub fn start_lb(&mut self) -> Result<()> {
        self.spawn_lb(1, None)
    }

    /// Starts every load balancer.
    pub fn start_lbs(&mut self) -> Result<()> {
        for k in 1..=self.lbs.len() {
            self.start_lb_k(k)?;
        }
        Ok(())
    }

    /// Starts (or restarts) load balancer `k` (1-based), its output appended
    /// to `lbK.log` in the scratch directory (a pipe read only at the end
    /// would fill and block its logging in long runs).
    pub fn start_lb_k(&mut self, k: usize) -> Result<()> {
        let log = self.dir.join(format!("{}.log", Self::lb_proc(k)));
        self.spawn_lb(k, Some(&log))
    }

    /// Like [`Topology::start_lb`], with the load balancer's output appended
    /// to the file `log` instead of a pipe: for long runs, where a pipe that
    /// is read only at the end would fill and block its logging.
    pub fn start_lb_logged(&mut self, log: &Path) -> Result<()> {
        self.spawn_lb(1, Some(log))
    }

    fn spawn_lb(&mut self, k: usize, log: Option<&Path>) -> Result<()> {
        let fp = self.fastpath.to_string_lossy().to_string();
        let config = self
            .configs
            .get(k.wrapping_sub(1))
            .map(|c| c.to_string_lossy().to_string())
            .unwrap_or_default();
        let args = [
            fp.as_str(),
            "lb",
            "run",
            "--config",
            &config,
            "--interface",
            "l0",
        ];
        let ns = self.lb_ns(k)?.name().to_string();
        let mut c = self.lb_machine_command(k, &args)?;
        c.stdin(Stdio::null());
        match log {
            Some(log) => crate::log_to(&mut c, log)?,
            None => {
                c.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
        }
        let child = c.spawn().map_err(|source| {
            Error::Netns(netns::Error::Spawn {
                program: format!("{args:?} in {ns}"),
                source,
            })
        })?;
        self.procs.push(&Self::lb_proc(k), child);
        Ok(())
    }

    /// What load balancer `k` has logged so far (started with
    /// [`Topology::start_lb_k`]).
    pub fn lb_log(&self, k: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.log", Self::lb_proc(k))))
            .unwrap_or_default()
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
        Ok(ns.inside(f)?)
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

    /// The API's answer to `method path`, from inside load balancer 1's
    /// namespace.
    pub fn api(&self, method: &str, path: &str) -> Result<String, Error> {
        self.api_on(1, method, path)
    }

    /// The API's answer to `method path` from load balancer `k`.
    pub fn api_on(&self, k: usize, method: &str, path: &str) -> Result<String, Error> {
        let (method, path) = (method.to_string(), path.to_string());
        let api = self.api_addr(k);
        let token = (self.lbs.len() > 1).then_some(API_TOKEN);
        Self::inside(self.lb_ns(k)?, move || {
            let addr: SocketAddr = api.parse().map_err(|source| Error::Address {
                addr: api.clone(),
                source,
            })?;
            lbd::client::api_request_with(addr, &method, &path, token).map_err(|e| Error::Api {
                request: format!("{method} {path}"),
                source: e.into(),
            })
        })?
    }

    /// Where load balancer `k`'s API listens: [`API`] for a single load
    /// balancer, its own address port 9180 in a fleet (reachable from the
    /// router's namespace, with [`API_TOKEN`]).
    pub fn api_addr(&self, k: usize) -> String {
        if self.lbs.len() > 1 {
            format!("{}:9180", Self::lb_address(k))
        } else {
            API.to_string()
        }
    }

    /// Load balancer `k`'s `/status`.
    pub fn status_of(&self, k: usize) -> Result<lbd::status::Status> {
        let body = self.api_on(k, "GET", "/status")?;
        serde_json::from_str(&body).map_err(|e| Error::Api {
            request: format!("GET /status of load balancer {k}"),
            source: e.into(),
        })
    }

    /// Waits until load balancer `k`'s `/status` satisfies `ok`, and returns
    /// that status; on timeout, an error carrying the last one read. The
    /// daemon reads BIRD in the background (off the request path), so a
    /// status answered right after the router changed may describe the
    /// reading before: tests that compare the two wait for the next one.
    pub fn wait_status(
        &self,
        k: usize,
        timeout: Duration,
        ok: impl Fn(&lbd::status::Status) -> bool,
    ) -> Result<lbd::status::Status> {
        let start = Instant::now();
        loop {
            let last = self.status_of(k);
            if let Ok(s) = &last {
                if ok(s) {
                    return last;
                }
            }
            if start.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: format!(
                        "load balancer {k}'s status did not reach what was waited for within {timeout:?}; last: {}",
                        match &last {
                            Ok(s) => format!("{:?}", s.bgp),
                            Err(e) => e.to_string(),
                        }
                    ),
                    logs: String::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The load balancers the router's route to the VIP leads to now
    /// (1-based numbers, from its `nexthop via` lines or its single `via`).
    pub fn ecmp_set(&self) -> Vec<usize> {
        let route = self.router_route();
        (1..=self.lbs.len())
            .filter(|&k| route.contains(&format!("via {} ", Self::lb_address(k))))
            .collect()
    }

    /// Waits until the router's route to the VIP leads to exactly the load
    /// balancers `want` (sorted, 1-based); how long it took.
    pub fn wait_for_ecmp(&self, want: &[usize], timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if self.ecmp_set() == want {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: format!(
                        "the router's route to {VIP} did not lead to load balancers {want:?} within {timeout:?}: {}",
                        self.router_route().trim()
                    ),
                    logs: String::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts a UDP echo on every backend, on the VIP's [`UDP_ECHO_PORT`]:
    /// each datagram (reassembled by the backend's kernel) is answered
    /// with `backend-I LEN`, straight to its sender. The threads end when
    /// the topology is dropped.
    pub fn start_udp_echo(&mut self) -> Result<()> {
        for i in 1..=self.backends.len() {
            let be = self.backend(i, "start the UDP echo")?;
            let sock = be
                .inside(|| {
                    let s = std::net::UdpSocket::bind((VIP, UDP_ECHO_PORT))?;
                    s.set_read_timeout(Some(Duration::from_millis(100)))?;
                    Ok::<_, std::io::Error>(s)
                })?
                .map_err(Error::io(format!(
                    "binding {VIP}:{UDP_ECHO_PORT} on backend {i}"
                )))?;
            let stop = Arc::clone(&self.echo_stop);
            self.echo_threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, from)) = sock.recv_from(&mut buf) {
                        let _ = sock.send_to(format!("backend-{i} {n}").as_bytes(), from);
                    }
                }
            }));
        }
        Ok(())
    }

    /// Extra client addresses `10.10.1.10` .. `10.10.1.(10+n-1)` on the
    /// client's link (sources that hash differently), reachable from the
    /// backends through the router.
    pub fn add_client_addresses(&self, n: usize) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for j in 0..n.min(100) {
            let a = format!("10.10.1.{}", 10 + j);
            self.client
                .ip(&["addr", "add", &format!("{a}/24"), "dev", "c0"])?;
            out.push(a);
        }
        Ok(out)
    }

    /// The load balancer (1-based) the router sends each TCP flow from the
    /// client's 10.10.1.2 and the given source ports to the VIP's port 80
    /// to now, asked of the router's kernel (`ip route get ... ipproto tcp
    /// sport P dport 80`, which hashes the 5-tuple as forwarding does);
    /// `None` where no load balancer is in the route.
    pub fn lbs_of(&self, ports: &[u16]) -> Result<Vec<Option<usize>>> {
        let mut batch = String::new();
        for p in ports {
            batch +=
                &format!("route get {VIP} from 10.10.1.2 iif r1 ipproto tcp sport {p} dport 80\n");
        }
        let out = self
            .router
            .exec_input(&["ip", "-batch", "-"], batch.as_bytes())?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lbs = Vec::new();
        for line in text.lines().filter(|l| l.starts_with(VIP)) {
            let via = line
                .split_whitespace()
                .skip_while(|w| *w != "via")
                .nth(1)
                .unwrap_or("");
            lbs.push((1..=self.lbs.len()).find(|&k| Self::lb_address(k) == via));
        }
        if lbs.len() != ports.len() {
            return Err(Error::Netns(netns::Error::Failed {
                command: "ip -batch - (route get, in the router)".into(),
                stderr: format!("{} answers for {} flows: {text}", lbs.len(), ports.len()),
            }));
        }
        Ok(lbs)
    }

    /// The load balancers the router's route to the IPv6 VIP leads to now
    /// (1-based numbers).
    pub fn ecmp_set6(&self) -> Vec<usize> {
        let route = self.router_route6();
        (1..=self.lbs.len())
            .filter(|&k| route.contains(&format!("via {} ", Self::lb_address6(k))))
            .collect()
    }

    /// The router's kernel route to the IPv6 VIP (empty when withdrawn).
    pub fn router_route6(&self) -> String {
        self.router
            .ip(&["-6", "route", "show", &format!("{VIP6}/128")])
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
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
        self.echo_stop.store(true, Ordering::Relaxed);
        for t in self.echo_threads.drain(..) {
            let _ = t.join();
        }
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
        Self::connect_to(addr)
    }

    /// Connects to `addr` (a VIP and its port, [`VIP6`]'s too), from
    /// inside the client's namespace.
    pub fn connect_to(addr: SocketAddr) -> Result<Self> {
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

    /// The local (client) port of this connection: with the addresses and
    /// the VIP's port, its 5-tuple.
    pub fn local_port(&self) -> u16 {
        self.s.local_addr().map(|a| a.port()).unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_bird_configuration_includes_the_routes_file_the_lab_names() {
        // A pattern, so that BIRD starts before the file and its
        // directory exist.
        let pattern = SHIPPED_VIPS_FILE.replace("/fastpath/", "/fastpat[h]/");
        assert!(
            SHIPPED_BIRD_CONF.contains(&format!("\ninclude \"{pattern}\";")),
            "dist/bird/fastpath.conf no longer includes {SHIPPED_VIPS_FILE}"
        );
        assert!(SHIPPED_VIPS_FILE.starts_with(SHIPPED_RUN_DIR));
        assert!(SHIPPED_BIRD_CONF.contains("protocol static fastpath_vips {"));
    }
}
