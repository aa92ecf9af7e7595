//! `fastpath lb bench --topology veth`: packets per second through a device
//! under test on a veth pair, three ways in one run:
//!
//! - **fastpath**: `lb run --interface` (AF_XDP when it can), forwarding as
//!   GRE back out of the same interface (one-armed, as deployed);
//! - **nftables**: the kernel doing the same job: DNAT with `jhash` over the
//!   same backends, forwarded back out;
//! - **veth limit**: an XDP program that sends every frame straight back
//!   (XDP_TX), the most this pair carries.
//!
//! ```text
//! generator ns: g0 (AF_PACKET sendmmsg, 64-byte UDP, many flows; counts what comes back)
//!      |
//! DUT ns:       d0 (one of the three)
//! ```
//!
//! Everything shares this machine's cores: the generator, the device under
//! test and the kernel's veth processing. The figures are ratios of one run.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lab::netns::{self, Netns};
use maio::{Hugepages, Pool};
use netio::afpacket::{self, AfPacketPort};
use netio::{Nic, Slot};
use packet::build::Frame;
use serde::Serialize;

const VIP: [u8; 4] = [198, 18, 0, 1];
const GEN_MAC: &str = "02:00:00:00:0e:01";
const DUT_MAC: &str = "02:00:00:00:0e:02";

/// Why the veth bench could not measure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A namespace, the veth pair or an address could not be set up.
    #[error(transparent)]
    Lab(#[from] lab::Error),
    /// The generator's packet pool could not be created.
    #[error("the generator's packet pool: {0}")]
    Pool(#[source] maio::Error),
    /// The generator's AF_PACKET port failed.
    #[error("the generator's AF_PACKET port on g0: {0}")]
    Port(#[source] netio::Error),
    /// An XDP program could not be attached.
    #[error("attaching an XDP program to {iface}: {source}")]
    Xdp {
        /// The interface.
        iface: &'static str,
        /// What the attach said.
        #[source]
        source: netio::Error,
    },
    /// The nftables rules could not be loaded.
    #[error("loading the nftables rules (is nftables installed?): {0}")]
    Nft(#[source] lab::Error),
    /// A file or process of the bench could not be made.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// A thread of the bench panicked.
    #[error("the {0} thread panicked")]
    Panicked(&'static str),
    /// A peer forwarded nothing, so no ratio means anything.
    #[error("a peer forwarded nothing (nftables {nftables} Mpps, veth limit {veth_limit} Mpps): the measurement is void; {note}")]
    Void {
        /// What came back through nftables, Mpps.
        nftables: f64,
        /// What came back from the XDP bounce, Mpps.
        veth_limit: f64,
        /// The bounce's note (its mode and interface counters).
        note: String,
    },
}

impl Error {
    fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

/// One variant's result.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Frames per second that came back to the generator, millions.
    pub mpps: f64,
    /// What the generator offered, millions per second.
    pub offered_mpps: f64,
    /// Notes (driver, XDP mode).
    pub note: String,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Seconds each variant was driven.
    pub seconds: f64,
    /// `fastpath`, `nftables`, `veth_limit`.
    pub results: BTreeMap<String, Cell>,
    /// fastpath over nftables.
    pub ratio_to_nftables: f64,
    /// fastpath over the veth limit.
    pub ratio_to_veth_limit: f64,
}

fn rx_packets(ns: &Netns, dev: &str) -> u64 {
    let out = ns
        .ip(&["-s", "-j", "link", "show", "dev", dev])
        .map(|o| o.stdout)
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
    v[0]["stats64"]["rx"]["packets"].as_u64().unwrap_or(0)
}

/// Drives `g0` from inside `gen` for `secs`; returns frames sent.
fn generate(gen: &Netns, secs: f64) -> Result<u64, Error> {
    let name = gen.name().to_string();
    std::thread::spawn(move || -> Result<u64, Error> {
        netns::enter(&name)?;
        let pool = Pool::new(maio::Config {
            buffers: 2048,
            buf_size: 2048,
            hugepages: Hugepages::Auto,
            magazine_depth: 64,
        })
        .map_err(Error::Pool)?;
        let mut h = pool.handle();
        let mut port = AfPacketPort::open(afpacket::Config::new("g0")).map_err(Error::Port)?;
        let dmac = lb::config::parse_mac(DUT_MAC).unwrap_or_default();
        let smac = lb::config::parse_mac(GEN_MAC).unwrap_or_default();
        let slots: Vec<Slot> = (0..1024u32)
            .map(|i| {
                let mut f = Frame::udp(
                    IpAddr::from([10, 30, 0, 1]),
                    IpAddr::from(VIP),
                    1024 + i as u16,
                    9,
                    &[0; 18],
                );
                f.eth.dst = dmac;
                f.eth.src = smac;
                let bytes = f.to_bytes();
                let mut b = h.alloc().expect("pool sized for the templates");
                pool.data_mut(&mut b)[..bytes.len()].copy_from_slice(&bytes);
                Slot {
                    buf: Some(b),
                    off: 0,
                    len: bytes.len() as u16,
                }
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs_f64(secs);
        let mut sent = 0u64;
        let mut at = 0;
        while Instant::now() < deadline {
            let n = port
                .transmit(&pool, &slots[at..(at + 64).min(slots.len())])
                .map_err(Error::Port)?;
            sent += n as u64;
            at = (at + 64) % slots.len();
        }
        Ok(sent)
    })
    .join()
    .map_err(|_| Error::Panicked("generator"))?
}

/// Keeps an XDP program attached (from a thread inside `ns`) until the
/// returned guard drops; `attach` runs inside the namespace.
struct XdpHold {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl XdpHold {
    fn new<T: 'static>(
        ns: &Netns,
        attach: impl FnOnce() -> Result<(T, String), Error> + Send + 'static,
    ) -> Result<(XdpHold, String), Error> {
        let name = ns.name().to_string();
        let (tx, rx) = std::sync::mpsc::channel::<Result<String, Error>>();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            match netns::enter(&name)
                .map_err(Error::from)
                .and_then(|_| attach())
            {
                Ok((handle, note)) => {
                    let _ = tx.send(Ok(note));
                    let _ = stop_rx.recv();
                    drop(handle);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        });
        let note = rx.recv().map_err(|_| Error::Panicked("XDP holder"))??;
        Ok((
            XdpHold {
                stop: Some(stop_tx),
                thread: Some(thread),
            },
            note,
        ))
    }
}

impl Drop for XdpHold {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn pair(tag: &str) -> Result<(Netns, Netns, XdpHold), Error> {
    let gen = Netns::new(&format!("fpbg-{tag}"))?;
    let dut = Netns::new(&format!("fpbd-{tag}"))?;
    for ns in [&gen, &dut] {
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")?;
        ns.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
        ns.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
    }
    netns::veth(&gen, "g0", GEN_MAC, &dut, "d0", DUT_MAC)?;
    gen.ip(&["addr", "add", "10.30.0.1/24", "dev", "g0"])?;
    // veth accepts frames its peer sends from XDP (XDP_TX, redirect) only
    // when it runs an XDP program itself: a pass-everything one, on g0 for
    // every variant alike.
    let (hold, _) = XdpHold::new(&gen, || {
        netio::afxdp::attach_pass("g0")
            .map(|b| (b, String::new()))
            .map_err(|source| Error::Xdp {
                iface: "g0",
                source,
            })
    })?;
    dut.ip(&["addr", "add", "10.30.0.2/24", "dev", "d0"])?;
    // The backends are reached through the generator's side: what comes
    // back there is what was forwarded.
    dut.ip(&["route", "add", "10.20.0.0/24", "via", "10.30.0.1"])?;
    dut.ip(&["neigh", "add", "10.30.0.1", "lladdr", GEN_MAC, "dev", "d0"])?;
    Ok((gen, dut, hold))
}

fn measure(gen: &Netns, secs: f64) -> Result<(f64, f64), Error> {
    let before = rx_packets(gen, "g0");
    let t = Instant::now();
    let sent = generate(gen, secs)?;
    std::thread::sleep(Duration::from_millis(100));
    let got = rx_packets(gen, "g0").saturating_sub(before);
    let el = t.elapsed().as_secs_f64().max(secs);
    Ok((got as f64 / el / 1e6, sent as f64 / el / 1e6))
}

/// Runs the three variants for `secs` each; `fastpath` is our binary.
pub fn run(fastpath: &Path, secs: f64, progress: &mut dyn FnMut(&str)) -> Result<Report, Error> {
    if !netns::available() {
        return Err(lab::Error::Unavailable.into());
    }
    let tag = format!("{}", std::process::id() % 100_000);
    let backends = ["10.20.0.1", "10.20.0.2", "10.20.0.3", "10.20.0.4"];
    let mut results = BTreeMap::new();

    // fastpath.
    progress("fastpath (lb run --interface, driver auto)");
    let (gen, dut, pass) = pair(&tag)?;
    let dir = std::env::temp_dir().join(format!("fastpath-vethbench-{tag}"));
    std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let cfg = dir.join("lb.toml");
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ address = \"{b}\" }}"))
        .collect();
    std::fs::write(
        &cfg,
        format!(
            "[forwarder]\nthreads = 0\nqueue_size = 1024\npool_buffers = 8192\n[conntrack]\nsize = 65536\n[api]\nlisten = \"127.0.0.1:9181\"\n\
             [encap]\nsource = \"10.30.0.2\"\ngateway_mac = \"{GEN_MAC}\"\n[[pools]]\nname = \"p\"\nbackends = [{}]\n\
             [[vips]]\nname = \"v\"\naddress = \"198.18.0.1\"\nport = 9\nprotocol = \"udp\"\npool = \"p\"\n",
            list.join(", ")
        ),
    )
    .map_err(Error::io(format!("writing {}", cfg.display())))?;
    let mut lb = dut
        .command(&fastpath.to_string_lossy())
        .args([
            "lb",
            "run",
            "--config",
            &cfg.to_string_lossy(),
            "--interface",
            "d0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Error::io("starting the load balancer"))?;
    std::thread::sleep(Duration::from_millis(1500));
    let m = measure(&gen, secs);
    // The child is ours and not yet reaped, so its pid is still its own.
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_child(&lb),
        rustix::process::Signal::TERM,
    );
    let _ = lb.wait();
    let mut log = String::new();
    if let Some(mut e) = lb.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut log);
    }
    let driver = log
        .lines()
        .find(|l| l.contains("driver:"))
        .map(|l| l[l.find("driver:").unwrap_or(0)..].trim().to_string())
        .unwrap_or_default();
    let (mpps, offered) = m?;
    results.insert(
        "fastpath".to_string(),
        Cell {
            mpps,
            offered_mpps: offered,
            note: driver,
        },
    );
    drop((pass, gen, dut));
    let _ = std::fs::remove_dir_all(&dir);

    // nftables: DNAT with jhash over the same backends, forwarded.
    progress("nftables (DNAT, jhash)");
    let (gen, dut, pass) = pair(&tag)?;
    dut.sysctl("net.ipv4.ip_forward", "1")?;
    let map: Vec<String> = backends
        .iter()
        .enumerate()
        .map(|(i, b)| format!("{i} : {b}"))
        .collect();
    let rules = format!(
        "table ip fastpath_bench {{\n  chain pre {{\n    type nat hook prerouting priority dstnat;\n    \
         ip daddr 198.18.0.1 udp dport 9 dnat to jhash ip saddr . udp sport mod {} map {{ {} }}\n  }}\n}}\n",
        backends.len(),
        map.join(", ")
    );
    dut.exec_input(&["nft", "-f", "-"], rules.as_bytes())
        .map_err(Error::Nft)?;
    let (mpps, offered) = measure(&gen, secs)?;
    results.insert(
        "nftables".to_string(),
        Cell {
            mpps,
            offered_mpps: offered,
            note: "kernel forwarding with DNAT, conntrack".into(),
        },
    );
    drop((pass, gen, dut));

    // The veth limit: frames straight back from XDP.
    progress("veth limit (XDP_TX bounce)");
    let (gen, dut, pass) = pair(&tag)?;
    let (bounce, note) = XdpHold::new(&dut, || {
        netio::afxdp::attach_bounce("d0")
            .map(|(b, mode)| (b, format!("{mode:?} XDP")))
            .map_err(|source| Error::Xdp {
                iface: "d0",
                source,
            })
    })?;
    let m = measure(&gen, secs);
    let counters = |ns: &Netns, dev: &str| {
        ns.exec(&["ethtool", "-S", dev])
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter(|l| !l.ends_with(": 0"))
                    .collect::<Vec<_>>()
                    .join(";")
            })
            .unwrap_or_default()
    };
    let diag = format!(
        "d0: {} | g0: {}",
        counters(&dut, "d0"),
        counters(&gen, "g0")
    );
    drop(bounce);
    let (mpps, offered) = m?;
    let note = if mpps > 0.0 {
        note
    } else {
        format!("{note}; {diag}")
    };
    results.insert(
        "veth_limit".to_string(),
        Cell {
            mpps,
            offered_mpps: offered,
            note,
        },
    );
    drop((pass, gen, dut));

    let f = results["fastpath"].mpps;
    let (n, v) = (results["nftables"].mpps, results["veth_limit"].mpps);
    if n <= 0.0 || v <= 0.0 {
        return Err(Error::Void {
            nftables: n,
            veth_limit: v,
            note: results["veth_limit"].note.clone(),
        });
    }
    Ok(Report {
        seconds: secs,
        ratio_to_nftables: f / n,
        ratio_to_veth_limit: f / v,
        results,
    })
}

impl Report {
    /// As a table.
    pub fn to_text(&self) -> String {
        let mut t =
            measure::Table::new(["device under test", "Mpps through", "offered Mpps", "how"])
                .title(format!(
                    "64-byte UDP through a veth pair, {} s each (all on this machine's cores)",
                    self.seconds
                ));
        for k in ["fastpath", "nftables", "veth_limit"] {
            if let Some(c) = self.results.get(k) {
                t.row([
                    k.to_string(),
                    format!("{:.3}", c.mpps),
                    format!("{:.3}", c.offered_mpps),
                    c.note.clone(),
                ]);
            }
        }
        format!(
            "{t}\nfastpath / nftables = {:.2}x (goal >= 2)   fastpath / veth limit = {:.2} (goal >= 0.7)\n",
            self.ratio_to_nftables, self.ratio_to_veth_limit
        )
    }
}
