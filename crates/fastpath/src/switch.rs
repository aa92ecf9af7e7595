//! `fastpath switch ...` and `fastpath pktgen`: argument parsing and wiring.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bench::switch::{Backend, Options, SwitchPlacement};
use clap::{Args, Subcommand, ValueEnum};
use measure::Table;
use ring::control::AttachRequest;
use ring::Mode;
use vswitch::pktgen::{Params, Role};

use crate::report::{emit, Report};
use crate::Format;

pub const DEFAULT_SOCKET: &str = "/run/fastpath/switch.sock";

#[derive(Subcommand)]
pub enum SwitchCommand {
    /// Run the switch.
    ///
    /// Ports: processes attach through the control socket (`fastpath pktgen`,
    /// or any program using the `ring` crate); DPDK, VPP and libmemif
    /// programs attach over memif (--memif); --tap adds TAP devices (the
    /// kernel path); --vhost-user adds a virtual machine's NIC: QEMU
    /// connects to that socket (vhost-user, the switch is the server) and
    /// the switch moves frames in and out of the guest's virtio rings
    /// itself. Settings may also come from a TOML file (--config; the keys
    /// are documented in crates/vswitch/src/config.rs, FileConfig, and
    /// examples/switch.toml).
    ///
    /// A VM port given the guest's MAC (mac=) is locked to it (port
    /// security): the guest cannot send from another address, and no other
    /// port can take its traffic by sending from its address. Ring ports
    /// are locked to the MAC they name when they attach; one that bridges
    /// other stations needs --ring-unlocked NAME.
    ///
    /// What a peer cannot do: take a socket path that holds something else
    /// (a file that is not a socket, another switch's live socket: refused,
    /// never deleted; at exit only the switch's own sockets are removed),
    /// or hold a place without completing its handshake (memif, vhost-user
    /// and control connections get 3 s, and give way to a newcomer after
    /// 1 s); block the switch through the interrupt line it shares (signals
    /// never wait for the peer: "line blocked" in status counts what its
    /// line could not take); make the switch walk its rings without end
    /// (a chain longer than the ring stops that queue, and each queue has
    /// a descriptor budget per second and per pass); send from an address
    /// other than its lock (checked on the copy that is delivered; a port
    /// whose frames are refused is served at a bounded rate).
    ///
    /// What a peer can do: fill the rings it owns and lose its own frames,
    /// stop its own queues (a reset of its connection recovers them), and
    /// take its share of the switch's time: on a machine with fewer cores
    /// than busy peers, an attacker's threads compete with everyone's
    /// (`fastpath switch bench --part isolation` measures the other ports'
    /// rate under each attack).
    ///
    /// Status: `fastpath switch status`, or send SIGUSR1 and the switch
    /// prints it to stderr. SIGINT or SIGTERM stop it.
    ///
    /// Examples:
    ///   fastpath switch run
    ///   fastpath switch run --memif /run/fastpath/memif.sock --tap fptap0
    ///   fastpath switch run --vhost-user /run/fastpath/vm1.sock,mac=52:54:00:00:00:01 \
    ///     --vhost-user /run/fastpath/vm2.sock,mode=sc,itr=100
    ///   qemu-system-x86_64 ... -object memory-backend-memfd,id=m,size=256M,share=on \
    ///     -numa node,memdev=m -chardev socket,id=c,path=/run/fastpath/vm1.sock \
    ///     -netdev vhost-user,id=n,chardev=c -device virtio-net-pci,netdev=n,mac=52:54:00:00:00:01
    ///   fastpath switch vm --vhost-user /run/fastpath/vm1.sock --ip 10.9.0.1/24 --up 600
    ///   dpdk-testpmd --no-huge --no-pci -l 0-1 \
    ///     --vdev=net_memif0,role=client,socket-abstract=no,socket=/run/fastpath/memif.sock \
    ///     -- --forward-mode=macswap --auto-start
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
    /// Show a running switch's ports and counters.
    ///
    /// One row per port: frames each way, frames dropped because the port
    /// was full, frames dropped by port security, and the notifications
    /// the paper counts: kicks (the guest's doorbell writes, VM exits under
    /// KVM) and interrupts, in all and per packet. VM (vhost-user) ports add
    /// their frontend's state under --format json (features, memory,
    /// per-queue counters, refused descriptor chains by reason).
    ///
    /// Examples:
    ///   fastpath switch status
    ///   fastpath switch status --format json | jq '.ports[] | select(.kind == "vhost-user")'
    #[command(verbatim_doc_comment)]
    Status {
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Reproduce the structure of the paper's Figure 1 (needs root for TAP).
    ///
    /// Rows: BASE itr=0, itr=100, itr=100 SC, itr=0 CSB, itr=100 CSB.
    /// Columns: guest transmit and receive Kpps with 60-byte frames, Mbps
    /// with 1514-byte frames, notifications (kicks + interrupts) per packet
    /// while transmitting, ping-pong transactions per second. Once with the
    /// switch as backend and once with a TAP device (the kernel path); the
    /// paper's own numbers beside ours. Then the switch's forwarding rate
    /// between two ring ports, per second of the switch thread's CPU time and
    /// end to end, with each thread's CPU time; then DPDK testpmd (txonly) ->
    /// memif -> switch -> memif -> testpmd (rxonly), and one testpmd
    /// (flowgen) sending and receiving through the switch, beside the two
    /// testpmds over memif directly, with testpmd's own counters (skipped
    /// if DPDK is not installed). Where the switch thread runs decides the
    /// memif rows on a small machine: see --switch-cpu.
    ///
    /// --part vm boots two QEMU guests (TCG; needs root, QEMU 10 and the
    /// guest image from scripts/setup.sh) and measures the figure with
    /// real guests: guest transmit over vhost-user in each notification
    /// scheme beside the same guest over QEMU's own TAP backend and an
    /// emulated e1000 (throttling off/on, burst 1/32), guest to guest
    /// through the switch beside guest to a sink, and ping between the
    /// guests; every figure min/median/max of --repeats runs, the paper's
    /// figures and each row's limit beside it. JSON keys:
    /// vm.vhost_user.guest_tx_pps, vm.qemu_tap.guest_tx_pps,
    /// vm.ratio_vhost_user_over_tap, vm.vhost_user.notifications_per_packet,
    /// vm.guest_to_guest.pps, vm.guest_to_guest.rtt_us_p50,
    /// vm.guest_to_sink.pps (each {min, median, max, samples}).
    ///
    /// Examples:
    ///   fastpath switch bench --quick
    ///   fastpath switch bench --part forwarding --part memif
    ///   fastpath switch bench --part memif --switch-cpu none
    ///   fastpath switch bench --quick --format json | jq .backends.switch.csb_itr0
    ///   fastpath switch bench --part vm --quick
    ///   fastpath switch bench --part vm --repeats 3 --format json | jq .vm.ratio_vhost_user_over_tap
    #[command(verbatim_doc_comment)]
    Bench(BenchArgs),
    /// Boot a QEMU guest on a switch's VM port, on QEMU's TAP backend, or
    /// with an emulated e1000; run commands in it or keep it up; tear it
    /// down.
    ///
    /// The guest is a small Debian kernel with a busybox initramfs, built
    /// offline by scripts/guest-image.sh into /var/cache/fastpath/guest, run
    /// under TCG (this machine cannot run KVM guests): it boots in 7-40 s.
    /// Its first NIC gets --ip. Each --run command runs in the guest's shell
    /// (busybox: ip, ping, cat, and the kernel's pktgen under
    /// /proc/net/pktgen) and its output is printed; without --run the guest
    /// stays up for --up seconds (Ctrl-C ends it early). QEMU is always
    /// killed at the end, when fastpath dies, and after --limit seconds.
    ///
    /// NICs, the --vhost-user ones first, then --tap, then --e1000 (the
    /// first is eth0); each takes `,mac=MAC` after its argument (default
    /// 52:54:00:fa:00:NN, NN counting from 01):
    ///   --vhost-user PATH   virtio-net on a switch's vhost-user port
    ///                       (`fastpath switch run --vhost-user PATH`)
    ///   --tap IFNAME        virtio-net on QEMU's own TAP backend
    ///   --e1000 IFNAME      an emulated Intel e1000 on QEMU's TAP backend
    /// QEMU creates the TAP devices itself, in --netns when given (needs
    /// root; keep test traffic inside a namespace).
    ///
    /// Start the switch first: QEMU gives up at once when nobody listens on
    /// a --vhost-user socket. --image DIR boots an image that
    /// `scripts/guest-image.sh DIR` built elsewhere.
    ///
    /// Examples:
    ///   fastpath switch run --socket /tmp/vms.ctl --vhost-user /tmp/vm1.sock &
    ///   fastpath switch vm --vhost-user /tmp/vm1.sock --ip 10.9.0.1/24 \
    ///     --run 'ip addr show eth0' --run 'ping -c 3 10.9.0.2'
    ///   ip netns add t && fastpath switch vm --netns t --e1000 fpe0 --up 60
    ///   fastpath switch vm --vhost-user /tmp/vm1.sock,mac=52:54:00:00:00:01 --up 600
    #[command(verbatim_doc_comment)]
    Vm(VmArgs),
    /// Two QEMU guests exchanging traffic through the switch, shown to a
    /// person (needs root, QEMU 10 and the guest image: scripts/setup.sh).
    ///
    /// Starts `fastpath switch run` in a throwaway namespace (fpvmdemo-PID:
    /// two demos do not meet, and one of that name already there is left
    /// alone) with two VM
    /// ports (vhost-user, each locked to its guest's MAC) and a TAP port
    /// whose far side is the namespace's kernel; boots two guests; they ping
    /// each other and the TAP side; guest A sends a short pktgen blast to
    /// guest B; then `fastpath switch status` shows the VM ports' counters
    /// (kicks and interrupts per packet). Everything is removed at the end,
    /// also on Ctrl-C. About a minute.
    ///
    /// Examples:
    ///   fastpath switch demo
    ///   fastpath switch demo --blast 100000
    #[command(verbatim_doc_comment)]
    Demo(DemoArgs),
}

#[derive(Args)]
pub struct VmArgs {
    /// virtio-net on a switch's vhost-user port at PATH (repeatable);
    /// `queues=N` asks for N queue pairs (the switch's port offers up to
    /// its own `queues=`, 4 by default): give the guest as many --cpus,
    /// and its driver turns them all on.
    #[arg(long, value_name = "PATH[,mac=MAC][,queues=N]")]
    vhost_user: Vec<String>,
    /// virtio-net on QEMU's own TAP backend, TAP IFNAME (repeatable).
    #[arg(long, value_name = "IFNAME[,mac=MAC]")]
    tap: Vec<String>,
    /// An emulated e1000 on QEMU's TAP backend, TAP IFNAME (repeatable).
    #[arg(long, value_name = "IFNAME[,mac=MAC]")]
    e1000: Vec<String>,
    /// The first NIC's address, ADDR/LEN.
    #[arg(long)]
    ip: Option<String>,
    /// Run QEMU (and so its TAP devices) in this network namespace.
    #[arg(long)]
    netns: Option<String>,
    /// A command to run in the guest (repeatable, in order); a failing one
    /// ends the guest with an error.
    #[arg(long)]
    run: Vec<String>,
    /// Seconds a command may take.
    #[arg(long, default_value_t = 120)]
    run_timeout: u64,
    /// Without --run: keep the guest up this many seconds.
    #[arg(long, default_value_t = 60)]
    up: u64,
    /// Kill QEMU after this many seconds whatever happens.
    #[arg(long, default_value_t = 900)]
    limit: u64,
    /// Guest memory, MiB.
    #[arg(long, default_value_t = 256)]
    mem_mib: u32,
    /// The guest's vCPUs (QEMU's -smp; TCG runs each in a host thread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    cpus: u32,
    /// The guest image's directory (vmlinuz, initrd.gz): one that
    /// `scripts/guest-image.sh DIR` built elsewhere than the default.
    #[arg(long, value_name = "DIR", default_value = lab::guest::IMAGE_DIR)]
    image: PathBuf,
    /// How often QEMU tries the switch's socket again after it closed
    /// (QEMU's `reconnect-ms`), so that the guest keeps its network across
    /// a restart or upgrade of the switch: such a NIC shows the guest no
    /// link status, so what it sends meanwhile waits in its ring (pings
    /// resume in about 0.2 s); 0: QEMU stays disconnected.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    reconnect_ms: u32,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Frames in guest A's pktgen blast to guest B.
    #[arg(long, default_value_t = 50_000)]
    blast: u64,
}

#[derive(Args)]
pub struct RunArgs {
    /// TOML settings file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Control socket for attaching ports and status.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Also serve memif (server role) on this socket.
    #[arg(long)]
    memif: Option<PathBuf>,
    /// Add a TAP port (created if absent); repeatable.
    #[arg(long)]
    tap: Vec<String>,
    /// Add a vhost-user port (a VM's NIC) listening on PATH; repeatable.
    /// Options after the path, comma-separated: name=NAME (default: the
    /// file's stem), mode=base|sc|csb (default csb: event-index windows),
    /// itr=N (interrupt moderation, 250 ns units), mac=MAC (the guest's:
    /// locks the port to it), port_security=on|off, event_idx=on|off,
    /// offloads=on|off (checksum and TSO offloads; default on).
    /// PATH must be free or a stale socket: a file that is not a socket,
    /// another switch's live socket, or a path given twice is refused,
    /// never deleted; at exit only the sockets this switch made are
    /// removed.
    #[arg(long, value_name = "PATH[,KEY=VALUE]...")]
    vhost_user: Vec<String>,
    /// Let the ring port named NAME attach without a MAC address (not
    /// locked to one), for a port that bridges other stations; repeatable,
    /// `*` for every ring port. By default a ring port names its MAC when
    /// it attaches (fastpath pktgen --src-mac) and is locked to it: the
    /// switch drops its frames from any other address, so it cannot take
    /// another port's traffic by sending from that port's address.
    /// Adds to the file's ring_unlocked.
    #[arg(long, value_name = "NAME")]
    ring_unlocked: Vec<String>,
    /// Keep polling at least this long (microseconds) after the last work before sleeping.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=vswitch::MAX_INTERVAL_US))]
    poll_us: Option<u64>,
    /// Longest adaptive polling window, microseconds (default 200): after a
    /// port's frame the switch keeps polling, kicks off, for twice the 98th
    /// percentile of that port's gaps, at most this long; <= --poll-us: off.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=vswitch::MAX_WINDOW_US))]
    poll_max_us: Option<u64>,
    /// Polling past --poll-us that finds nothing, at most this % of a core
    /// averaged over a second (default 10; 0: windows off).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
    poll_budget_pct: Option<u8>,
    /// memif interrupt moderation, microseconds (0: off). Asleep, the
    /// switch masks its memif clients' interrupts and looks at their rings
    /// again after this long, so a busy client fills a batch instead of
    /// waking it per burst: for a switch sharing its core with the programs
    /// it serves (10 is a good start). Overrides the file's
    /// memif_moderation_us.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=vswitch::MAX_INTERVAL_US))]
    memif_moderation_us: Option<u64>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum BackendArg {
    Switch,
    Tap,
    Both,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Short runs (the whole table in well under a minute).
    #[arg(long)]
    quick: bool,
    /// Seconds per measurement (default 2, or 0.3 with --quick).
    #[arg(long)]
    seconds: Option<f64>,
    #[arg(long, value_enum, default_value = "both")]
    backend: BackendArg,
    /// Frames per transmit call.
    #[arg(long, default_value_t = 64)]
    burst: usize,
    /// Parts to run (repeatable): figure1 (the paper's table), forwarding
    /// (ring to ring, per switch core), memif (DPDK testpmd through the
    /// switch beside testpmd to testpmd), vm (QEMU guests), vm-multiqueue
    /// (only vm's multiqueue row), isolation (the other ports' rate while
    /// one port attacks); default all.
    #[arg(long, value_enum)]
    part: Vec<PartArg>,
    /// Frames per transmit call of the ring-to-ring sender.
    #[arg(long, default_value_t = 256)]
    forwarding_burst: usize,
    /// The switch's poll_us (poll this long after the last frame, then
    /// sleep) in the ring-to-ring measurement.
    #[arg(long, default_value_t = 20)]
    forwarding_poll_us: u64,
    /// Leave the ring-to-ring measurement's threads where the scheduler
    /// puts them (default: the sender alone on CPU 0, the switch and the
    /// receiver on CPU 1, the layout in which the switch is preempted
    /// least on a 2-core machine).
    #[arg(long)]
    forwarding_no_pin: bool,
    /// Seconds of measurement per memif row, at least 2 (testpmd reports
    /// once a second; the window holds at least two reports): default 3, 2
    /// with --quick.
    #[arg(long)]
    memif_seconds: Option<f64>,
    /// log2 of the memif ring size (DPDK's rsize).
    #[arg(long, default_value_t = 10)]
    memif_ring_log2: u8,
    /// Where the switch thread runs in the memif rows: "auto", a CPU
    /// number (every row), or "none" (the scheduler places it). auto picks
    /// per row: with two testpmds, which busy-poll both cores, the sending
    /// testpmd's forwarding core (CPU 1), so the switch takes turns with
    /// the sender it waits for while the receiver drains on the other;
    /// with one testpmd, which busy-polls CPU 1, the free CPU 0, so each
    /// busy thread has a core, as in the direct pair.
    #[arg(long, default_value = "auto")]
    switch_cpu: String,
    /// The switch's memif interrupt moderation in the memif rows,
    /// microseconds (0: off, the switch is woken per burst once it
    /// sleeps). On a core it shares with a busy sender, moderation lets the
    /// sender fill a ring's worth before the switch takes the core back.
    #[arg(long, default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=vswitch::MAX_INTERVAL_US))]
    memif_moderation_us: u64,
    /// Entries in each ring of the vm part's guests' vhost-user NICs
    /// (QEMU's rx_queue_size and tx_queue_size): 1024 by default, 256 as
    /// QEMU's own default.
    #[arg(long, default_value_t = lab::guest::VHOST_RING, value_parser = vm_ring)]
    vm_ring: u16,
    /// Runs per figure in the vm and isolation parts (min/median/max over them): default
    /// 3, 1 with --quick.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=20))]
    repeats: Option<u64>,
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// A vhost-user ring size QEMU takes: 256, 512 or 1024 entries.
fn vm_ring(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(n @ (256 | 512 | 1024)) => Ok(n),
        _ => Err(format!("{s}: 256, 512 or 1024 entries")),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PartArg {
    Figure1,
    Forwarding,
    Memif,
    /// QEMU guests: vhost-user beside QEMU's TAP backend and an e1000.
    Vm,
    /// Only the vm part's multiqueue row: a 2-vCPU guest with two queue
    /// pairs against one (part of vm).
    VmMultiqueue,
    /// Two ring ports forwarding while a third port attacks the switch
    /// (blocked interrupt line, looping receive chains, 32,768-descriptor
    /// transmit chains, spoofing, idle memif connections): the victim's
    /// rate beside its rate without attack in the same run.
    Isolation,
}

#[derive(Args)]
pub struct PktgenArgs {
    /// The switch's control socket.
    #[arg(long, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Port name on the switch.
    #[arg(long, default_value = "pktgen")]
    name: String,
    /// tx, rx, ping-pong, or pong (answer ping-pong).
    #[arg(long, default_value = "tx")]
    mode: Role,
    /// How the port notifies: base, sc (Send Combining) or csb.
    #[arg(long, default_value = "csb")]
    port_mode: Mode,
    /// Interrupt moderation, in 250 ns units (100 = 25 us).
    #[arg(long, default_value_t = 0)]
    itr: u32,
    /// Frame size in bytes, without FCS (60..=2048).
    #[arg(long, default_value_t = 60)]
    size: usize,
    /// Frames per transmit call.
    #[arg(long, default_value_t = 64)]
    burst: usize,
    /// Packets per second (default: as fast as possible).
    #[arg(long)]
    rate: Option<f64>,
    /// Stop after this many packets.
    #[arg(long)]
    count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Ring slots (a power of two).
    #[arg(long, default_value_t = 1024)]
    slots: u32,
    /// Source MAC, the port's own address (it is locked to it): default
    /// 02:fa:00:00:00:01 for the senders (tx, ping-pong) and
    /// 02:fa:00:00:00:02, the senders' default destination, for the
    /// receivers (rx, pong), so that a sender and a receiver with the
    /// defaults are two stations. Two ports on one switch need two.
    #[arg(long)]
    src_mac: Option<String>,
    /// Destination MAC (unknown or broadcast destinations are flooded).
    #[arg(long, default_value = "02:fa:00:00:00:02")]
    dst_mac: String,
    /// Lock the port to --src-mac (port security): the switch drops its
    /// frames from any other address, and no other port can take its
    /// traffic by sending from this one. The default; the flag stays for
    /// the scripts that give it.
    #[arg(long, conflicts_with = "unlocked")]
    lock_mac: bool,
    /// Attach without a MAC address (not locked to one), for a port that
    /// sends from other stations' addresses: the switch must let it (its
    /// --ring-unlocked NAME).
    #[arg(long)]
    unlocked: bool,
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

fn parse_mac(s: &str) -> anyhow::Result<[u8; 6]> {
    // The switch's own parser: hex digits only, so no sign slips through.
    vswitch::bridge::parse_mac(s).with_context(|| {
        format!("MAC address {s:?} must be six hex bytes (1-2 digits each) separated by ':'")
    })
}

pub fn run(a: RunArgs, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let file = match &a.config {
        Some(p) => vswitch::FileConfig::load(p)?,
        None => vswitch::FileConfig::default(),
    };
    let mut cfg = file.config();
    cfg.socket = a
        .socket
        .or(cfg.socket)
        .or_else(|| Some(PathBuf::from(DEFAULT_SOCKET)));
    cfg.memif_socket = a.memif.or(cfg.memif_socket);
    cfg.ring_unlocked.extend(a.ring_unlocked);
    if let Some(p) = a.poll_us {
        cfg.poll_us = p;
    }
    if let Some(p) = a.poll_max_us {
        cfg.poll_max_us = p;
    }
    if let Some(p) = a.poll_budget_pct {
        cfg.poll_budget_pct = p;
    }
    if let Some(m) = a.memif_moderation_us {
        cfg.memif_moderation = std::time::Duration::from_micros(m);
    }
    for spec in &a.vhost_user {
        let v = vswitch::VhostUserEntry::parse(spec)
            .and_then(|e| e.config())
            .with_context(|| format!("--vhost-user {spec}"))?;
        cfg.vhost_user.push(v);
    }
    // Nothing at a path that is not a free or stale socket is touched: a
    // regular file or another switch's live socket is refused, and a path
    // given twice too; at exit only the sockets this switch made go.
    let mut sockets = cfg.claim_sockets()?;
    for p in sockets.paths() {
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    let mut sw = vswitch::Switch::new(cfg.clone())
        .and_then(vswitch::EventLoop::new)
        .context("starting the switch")?;
    sockets.bound();
    for t in file.taps.iter().chain(a.tap.iter()) {
        let tap = netio::tap::Tap::open(t).with_context(|| format!("TAP port {t} (needs root)"))?;
        sw.add_port(Box::new(vswitch::TapPort::new(tap)))?;
    }
    let usr1 = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, usr1.clone())?;
    eprintln!(
        "switch: control socket {}{}{}; SIGUSR1 prints status, Ctrl-C stops",
        cfg.socket
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        cfg.memif_socket
            .as_ref()
            .map(|p| format!(", memif on {}", p.display()))
            .unwrap_or_default(),
        cfg.vhost_user
            .iter()
            .map(|v| format!(", VM port {} on {}", v.name, v.path.display()))
            .collect::<String>()
    );
    sw.run(&stop, Some(&usr1));
    drop(sw);
    drop(sockets);
    Ok(())
}

pub fn status(socket: &std::path::Path, format: Format) -> anyhow::Result<()> {
    let s = vswitch::status::ask(socket)
        .with_context(|| format!("asking the switch on {}", socket.display()))?;
    emit(format, &s)
}

/// What `fastpath pktgen` prints: the run's report (its JSON is the
/// report's own), and the port it ran on for the table's title.
#[derive(serde::Serialize)]
#[serde(transparent)]
struct PktgenRun<'a> {
    report: &'a vswitch::pktgen::Report,
    #[serde(skip)]
    title: String,
    #[serde(skip)]
    ping_pong: bool,
}

impl Report for PktgenRun<'_> {
    fn to_text(&self) -> String {
        let r = self.report;
        let mut t = Table::new(["metric", "value"]).title(self.title.clone());
        t.row(["packets".to_string(), r.packets.to_string()]);
        t.row(["seconds".to_string(), format!("{:.3}", r.seconds)]);
        t.row(["Kpps".to_string(), format!("{:.1}", r.pps / 1e3)]);
        t.row(["Mbps".to_string(), format!("{:.1}", r.mbps)]);
        t.row([
            "kicks/packet".to_string(),
            format!("{:.4}", r.kicks_per_packet),
        ]);
        t.row([
            "interrupts/packet".to_string(),
            format!("{:.4}", r.interrupts_per_packet),
        ]);
        if self.ping_pong {
            t.row([
                "transactions/s".to_string(),
                format!("{:.0}", r.transactions_per_sec),
            ]);
            t.row(["rtt p50 us".to_string(), format!("{:.1}", r.rtt_us_p50)]);
            t.row(["rtt p90 us".to_string(), format!("{:.1}", r.rtt_us_p90)]);
            t.row(["rtt p99 us".to_string(), format!("{:.1}", r.rtt_us_p99)]);
            t.row(["rtt max us".to_string(), format!("{:.1}", r.rtt_us_max)]);
            t.row(["lost".to_string(), r.lost.to_string()]);
        }
        t.to_string()
    }
}

pub fn pktgen(a: PktgenArgs, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    if !(42..=2048).contains(&a.size) {
        bail!("--size must be 42..=2048 bytes, got {}", a.size);
    }
    if a.burst == 0 || a.burst > 4096 {
        bail!("--burst must be 1..=4096, got {}", a.burst);
    }
    if a.rate.is_some_and(|r| r <= 0.0 || r.is_nan()) {
        bail!("--rate must be positive");
    }
    let src_mac = parse_mac(a.src_mac.as_deref().unwrap_or(match a.mode {
        Role::Tx | Role::PingPong => "02:fa:00:00:00:01",
        Role::Rx | Role::Pong => "02:fa:00:00:00:02",
    }))?;
    let req = AttachRequest {
        name: a.name.clone(),
        mode: a.port_mode,
        itr: a.itr,
        slots: a.slots,
        buf_size: 2048,
        mac: if a.unlocked && !a.lock_mac {
            None
        } else {
            Some(src_mac)
        },
    };
    let mut port = ring::control::attach(&a.socket, &req)
        .with_context(|| format!("attaching to the switch on {}", a.socket.display()))?;
    let p = Params {
        role: a.mode,
        size: a.size,
        burst: a.burst,
        rate: a.rate,
        count: a.count,
        duration: Duration::from_secs_f64(a.duration),
        src_mac,
        dst_mac: parse_mac(&a.dst_mac)?,
    };
    let r = vswitch::pktgen::run(&mut port.driver, &p, &|| stop.load(Ordering::Relaxed));
    emit(
        a.format,
        &PktgenRun {
            title: format!(
                "pktgen {} on port {} ({} itr={})",
                r.mode, a.name, a.port_mode, a.itr
            ),
            ping_pong: a.mode == Role::PingPong,
            report: &r,
        },
    )
}

pub fn bench(a: BenchArgs) -> anyhow::Result<()> {
    let seconds = a.seconds.unwrap_or(if a.quick { 0.3 } else { 2.0 });
    if !(0.05..=60.0).contains(&seconds) {
        bail!("--seconds must be 0.05..=60");
    }
    let backends = match a.backend {
        BackendArg::Switch => vec![Backend::Switch],
        BackendArg::Tap => vec![Backend::Tap],
        BackendArg::Both => vec![Backend::Switch, Backend::Tap],
    };
    if a.forwarding_burst == 0 || a.forwarding_burst > 1024 {
        bail!("--forwarding-burst must be 1..=1024");
    }
    let switch_cpu = match a.switch_cpu.as_str() {
        "auto" => SwitchPlacement::Auto,
        "none" => SwitchPlacement::Unpinned,
        n => SwitchPlacement::Cpu(n.parse::<usize>().ok().filter(|&c| c < 1024).with_context(
            || format!("--switch-cpu must be \"auto\", a CPU number or \"none\", got {n:?}"),
        )?),
    };
    if !(1..=14).contains(&a.memif_ring_log2) {
        bail!("--memif-ring-log2 must be 1..=14 (DPDK's memif limit)");
    }
    let memif_seconds = a.memif_seconds.unwrap_or(if a.quick {
        bench::switch::MEMIF_MIN_SECONDS
    } else {
        3.0
    });
    bench::switch::check_memif_seconds(memif_seconds)?;
    let all = a.part.is_empty();
    let part = |p: PartArg| all || a.part.contains(&p);
    let backends = if part(PartArg::Figure1) {
        backends
    } else {
        Vec::new()
    };
    // The memif rows need DPDK; when every part was asked for implicitly,
    // a machine without it skips them (and says so).
    let memif_wanted = part(PartArg::Memif);
    let memif_skipped = memif_wanted && all && bench::peers::testpmd_path().is_none();
    // Progress goes to stderr whatever the format: stdout holds the report
    // (the JSON document), and the vm part runs for minutes.
    let o = Options {
        forwarding: part(PartArg::Forwarding),
        forwarding_burst: a.forwarding_burst,
        forwarding_poll_us: a.forwarding_poll_us.min(vswitch::MAX_INTERVAL_US),
        forwarding_pin: !a.forwarding_no_pin,
        memif: (memif_wanted && !memif_skipped).then_some(bench::switch::MemifOptions {
            seconds: memif_seconds,
            ring_log2: a.memif_ring_log2,
            switch_cpu,
            moderation_us: a.memif_moderation_us,
        }),
        seconds,
        backends,
        burst: a.burst,
        progress: Some(Arc::new(move |s: &str| eprintln!("  {s}"))),
    };
    // The vm part boots guests; when every part was asked for implicitly,
    // a machine without QEMU, the guest image or root skips it (and says so).
    let vm_wanted = part(PartArg::Vm);
    let vm_ready = lab::guest::available() && lab::netns::available();
    let vm_skipped = vm_wanted && all && !vm_ready;
    let base = all
        || a.part
            .iter()
            .any(|p| matches!(p, PartArg::Figure1 | PartArg::Forwarding | PartArg::Memif));
    let progress = o.progress.clone();
    let mut report = if !base {
        bench::switch::Report::default()
    } else {
        eprintln!("switch bench: {seconds} s per measurement, 4 measurements per row");
        bench::switch::run(&o)?
    };
    if memif_skipped {
        report.memif = Some(bench::switch::MemifPart::Skipped {
            skipped: "dpdk-testpmd not installed".into(),
        });
    }
    if vm_skipped {
        report.vm = Some(bench::vm::VmPart::Skipped {
            skipped: "needs root, qemu-system-x86_64 and the guest image (scripts/setup.sh)".into(),
        });
    } else if vm_wanted || a.part.contains(&PartArg::VmMultiqueue) {
        let repeats = a.repeats.unwrap_or(if a.quick { 1 } else { 3 }) as usize;
        let vo = bench::vm::VmOptions {
            quick: a.quick,
            repeats,
            poll_us: a.forwarding_poll_us.min(vswitch::MAX_INTERVAL_US),
            progress,
            stop: crate::stop_flag()?,
            vhost_ring: a.vm_ring,
        };
        if vm_wanted {
            eprintln!("switch bench, vm part: two QEMU guests (TCG), {repeats} run(s) per figure");
            let v = bench::vm::run(&vo).context("the vm part")?;
            report.vm = Some(bench::vm::VmPart::Measured(Box::new(v)));
        } else {
            eprintln!("switch bench, vm multiqueue row: one QEMU guest (TCG), {repeats} run(s)");
            let m = bench::vm_mq::run_alone(&vo).context("the vm multiqueue row")?;
            report.vm = Some(bench::vm::VmPart::Multiqueue {
                multiqueue: Box::new(m),
            });
        }
    }
    if part(PartArg::Isolation) {
        let io = bench::isolation::Options {
            window: Duration::from_secs_f64(if a.quick { 0.3 } else { 2.0 }),
            repeats: a.repeats.unwrap_or(if a.quick { 1 } else { 3 }) as usize,
            progress: true,
            ..bench::isolation::Options::default()
        };
        eprintln!(
            "switch bench, isolation part: {} attacks, {:?} windows, {} run(s)",
            io.attacks.len(),
            io.window,
            io.repeats
        );
        report.isolation = Some(bench::isolation::run(&io).context("the isolation part")?);
    }
    emit(a.format, &report)
}

/// Whether something is at `path` that a vhost-user frontend can connect
/// to: a socket file (a switch bound it); the error says what is there
/// instead. Looking does not connect: a connection, even one closed at
/// once, would show in the switch's counters as a frontend that came and
/// went.
fn listening(path: &Path) -> Result<(), &'static str> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => Ok(()),
        Ok(_) => Err("it is not a socket"),
        Err(_) => Err("nothing is there"),
    }
}

/// A NIC argument: `X[,mac=MAC]`, and for a vhost-user NIC `[,queues=N]`.
struct NicSpec {
    head: String,
    mac: Option<String>,
    queues: u16,
}

/// `X[,mac=MAC][,queues=N]` (queues only where `what` is vhost-user).
fn nic_spec(spec: &str, what: &str) -> anyhow::Result<NicSpec> {
    let mut parts = spec.split(',');
    let head = parts.next().unwrap_or_default().to_string();
    if head.is_empty() {
        bail!("--{what} {spec:?}: nothing before the first ','");
    }
    let vhost = what == "vhost-user";
    let (mut mac, mut queues) = (None, 1);
    for kv in parts {
        match kv.split_once('=') {
            Some(("mac", m)) => {
                parse_mac(m).with_context(|| format!("--{what} {spec}"))?;
                mac = Some(m.to_string());
            }
            Some(("queues", q)) if vhost => {
                queues = match q.parse::<u16>() {
                    Ok(n @ 1..=vswitch::ports::vhost::MAX_QUEUE_PAIRS) => n,
                    _ => bail!(
                        "--{what} {spec:?}: queues={q}: a number of queue pairs from 1 to {}",
                        vswitch::ports::vhost::MAX_QUEUE_PAIRS
                    ),
                };
            }
            _ if vhost => {
                bail!("--{what} {spec:?}: unknown option {kv:?} (mac=MAC, queues=N)")
            }
            _ => bail!("--{what} {spec:?}: unknown option {kv:?} (only mac=MAC)"),
        }
    }
    Ok(NicSpec { head, mac, queues })
}

pub fn vm(a: VmArgs, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    use lab::guest::{Guest, GuestOpts, Nic};
    let mut nics = Vec::new();
    // Default MACs count the NICs, from 01.
    let mut made = 0usize;
    let mut mac_for = |m: Option<String>| {
        made += 1;
        m.unwrap_or_else(|| format!("52:54:00:fa:00:{made:02x}"))
    };
    for s in &a.vhost_user {
        let n = nic_spec(s, "vhost-user")?;
        let nic = Nic::vhost_user(std::path::Path::new(&n.head), &mac_for(n.mac)).queues(n.queues);
        nics.push(if a.reconnect_ms > 0 {
            nic.reconnect(a.reconnect_ms)
        } else {
            nic
        });
    }
    for s in &a.tap {
        let n = nic_spec(s, "tap")?;
        nics.push(Nic::tap(&n.head, &mac_for(n.mac)));
    }
    for s in &a.e1000 {
        let n = nic_spec(s, "e1000")?;
        nics.push(Nic::e1000(&n.head, &mac_for(n.mac)));
    }
    if nics.is_empty() {
        bail!("give the guest at least one NIC: --vhost-user PATH, --tap IFNAME or --e1000 IFNAME");
    }
    // QEMU connects to the switch's VM socket at once and gives up in a
    // fraction of a second if nobody is there: say what to do first.
    for s in &a.vhost_user {
        let path = nic_spec(s, "vhost-user")?.head;
        if let Err(why) = listening(Path::new(&path)) {
            bail!(
                "no switch listens on {path} ({why}): start the switch first \
                 (fastpath switch run --socket /run/fastpath/vm.ctl --vhost-user {path})"
            );
        }
    }
    let mut o = GuestOpts::new("vm", nics)
        .limit(Duration::from_secs(a.limit.max(1)))
        .cpus(a.cpus);
    o.mem_mib = a.mem_mib.clamp(64, 4096);
    o.image = a.image.clone();
    if let Some(ip) = &a.ip {
        o = o.ip(ip);
    }
    if let Some(ns) = &a.netns {
        o = o.netns(ns);
    }
    if let Some(what) = lab::guest::missing_in(&a.image) {
        bail!("QEMU 10 and the guest image are needed, and {what} is missing: run scripts/setup.sh (it installs qemu-system-x86 from bookworm-backports and builds {}), or give --image DIR", lab::guest::IMAGE_DIR);
    }
    eprintln!("booting the guest (TCG: 7-40 s)...");
    let t = std::time::Instant::now();
    let hint = if a.vhost_user.is_empty() {
        ""
    } else {
        " (QEMU ends at once when the switch behind a --vhost-user socket is gone: is it running?)"
    };
    let mut g = Guest::start(&o).with_context(|| format!("starting QEMU{hint}"))?;
    g.wait_ready(lab::guest::BOOT)
        .with_context(|| format!("booting the guest{hint}"))?;
    eprintln!(
        "guest up after {:.1} s, eth0 {}",
        t.elapsed().as_secs_f64(),
        g.mac
    );
    let within = Duration::from_secs(a.run_timeout.max(1));
    if a.run.is_empty() {
        let end = std::time::Instant::now() + Duration::from_secs(a.up);
        while std::time::Instant::now() < end && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    for cmd in &a.run {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let (rc, out) = g
            .run(cmd, within)
            .with_context(|| format!("running {cmd:?}"))?;
        println!("$ {cmd}");
        if !out.is_empty() {
            println!("{out}");
        }
        if rc != 0 {
            bail!("{cmd:?} exited with {rc} in the guest");
        }
    }
    drop(g);
    eprintln!("guest stopped");
    Ok(())
}

pub fn demo(a: DemoArgs, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding our own binary")?;
    lab::switch_demo::run(
        &lab::switch_demo::Options {
            exe,
            blast: a.blast.clamp(1, 10_000_000),
        },
        stop,
    )?;
    Ok(())
}
