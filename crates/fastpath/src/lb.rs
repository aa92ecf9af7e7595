//! `fastpath lb ...`: the Maglev load balancer's subcommands, parsed and
//! handed to the `lb` (forwarder), `lbd` (daemon), `decap` (backend agent),
//! `bench` (benchmarks) and `lab` (demo, sample traffic) crates.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

use crate::report::{emit, Report};
use crate::{stop_flag, Format};

#[derive(Subcommand)]
pub enum LbCommand {
    /// Reproduce the paper's consistent-hashing evaluation (section 5.3).
    ///
    /// Figure 11: the largest and smallest share of the lookup table held by
    /// one backend, for Maglev, Karger (ring with virtual nodes) and
    /// rendezvous hashing. Figure 12: the share of table entries that change
    /// when a percentage of backends fail at once. Also the time to generate
    /// each table (beside Pseudocode 1 written literally and the paper's
    /// times) and the cost of a lookup.
    ///
    /// Examples:
    ///   fastpath lb hash-eval --quick
    ///   fastpath lb hash-eval --plot-dir out/plots
    ///   fastpath lb hash-eval --quick --format json | jq '.results.maglev'
    #[command(verbatim_doc_comment)]
    HashEval(HashEvalArgs),
    // The help text is FleetSimArgs' doc comment (crates/fastpath/src/fleet_sim.rs).
    FleetSim(crate::fleet_sim::FleetSimArgs),
    /// Forward packets through the Maglev forwarder: the load balancer
    /// itself (--interface), or a capture replayed through it (--pcap-in).
    ///
    /// With --interface, the daemon: frames are received on the interface
    /// (--driver: AF_XDP with our XDP program, AF_PACKET, or `xdp`, which
    /// forwards TCP and UDP over IPv4 and IPv6 in the driver itself), matched to a
    /// VIP, given a backend by connection tracking or the VIP's Maglev
    /// table, GRE-encapsulated toward it and sent back out on the same
    /// interface to the next hop (its MAC found from the kernel's route and
    /// neighbour tables, or [encap] gateway_mac). It runs until SIGINT or
    /// SIGTERM (with [bgp], SIGTERM first withdraws the VIPs and waits for
    /// traffic to stop); the configuration section by section:
    ///   [api] listen     HTTP API: GET /status, GET /metrics (Prometheus),
    ///                    POST /reload, POST /backends/B/drain|undrain|weight/N
    ///                    (`fastpath lb status|reload|drain|undrain|weight`);
    ///                    [api] token_file guards the POSTs with a bearer token,
    ///                    and the GETs too on a data address ([api]
    ///                    token_for_reads); connections beyond what the
    ///                    open-files limit leaves after health checks and the
    ///                    datapath are closed at once (the soft limit is
    ///                    raised to the hard one at start)
    ///   reload           SIGHUP or `fastpath lb reload`: the file is re-read,
    ///                    validated whole and swapped in (only changed tables
    ///                    rebuilt, connections kept); a bad file is rejected
    ///                    and the running configuration stays
    ///   health = {...}   health checks per pool (tcp, http; via the tunnel
    ///                    to the VIP, as client traffic goes, or direct,
    ///                    which cannot see a dead decap agent); a backend
    ///                    that fails them leaves the tables until it passes
    ///                    again, and its established connections move to
    ///                    other backends, which reset them
    ///   [bgp]            announce the VIPs through BIRD while healthy
    ///   [fleet]          the other load balancers, for fragments
    ///   [tracer]         packet-tracer reports (`fastpath lb trace`)
    /// Backends decapsulate the GRE (`fastpath lb decap`) and hold the VIP on
    /// loopback; README.md, section "Deploying the load balancer", walks
    /// through a setup.
    ///
    /// Frames for a VIP's address on a port or protocol no VIP serves are
    /// dropped and counted (`vip_port_not_served` in `lb status` drops and
    /// fastpath_lb_drops_total), and answered as a host answers a closed
    /// port, so that clients learn at once instead of timing out: TCP with
    /// a RST, UDP with an ICMP (ICMPv6) port unreachable, sent back out of
    /// the interface from the VIP's address; never a RST, an ICMP error, a
    /// fragment, a broadcast or multicast, or a martian source; at most
    /// 1,000 replies a second per packet thread (bursts of 50), as Linux
    /// limits its ICMP errors (`lb status`: "unserved ports refused";
    /// fastpath_lb_refusals_total, fastpath_lb_refusals_rate_limited_total).
    ///
    /// With --pcap-in: reads frames from a pcap file, runs them through
    /// steering, the packet threads and muxing, writes what is forwarded
    /// (and the refusals above) to --pcap-out, and prints the counters: per VIP, per backend, drops by
    /// reason and frames that were not for a VIP.
    ///
    /// Examples:
    ///   fastpath lb check-config examples/lb.toml
    ///   fastpath lb run --config /etc/fastpath/lb.toml --interface eth0
    ///   fastpath lb run --config lb.toml --pcap-in in.pcap --pcap-out out.pcap
    ///   fastpath lb run --config /etc/fastpath/local.toml --interface eth0 \
    ///       --config-etcd http://10.0.0.1:2379,http://10.0.0.2:2379 --prefix /fastpath/edge
    ///
    /// The configuration format is documented in crates/lb/src/config.rs and
    /// examples/lb.toml (every section, annotated).
    ///
    /// Logs go to stderr, one line per event: text, or JSON objects with
    /// --log-format json (for journald or a log shipper). RUST_LOG sets what
    /// is logged (default "info"): RUST_LOG=debug for more, RUST_LOG=warn
    /// for problems only, or per module, e.g. RUST_LOG=info,lbd::health=debug.
    /// Under systemd (dist/systemd/fastpath-lb@.service) the daemon says
    /// when it is ready and, while its datapath beats, feeds the unit's
    /// watchdog; outside systemd it does neither.
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
    /// Measure the forwarder's packet rate (paper section 5.2.2).
    ///
    /// Drives the forwarder from the in-memory generator with 64-byte TCP
    /// frames of three kinds: SYN (a new flow per packet), non-SYN (ACKs over
    /// established flows) and a constant 5-tuple, with 1 and 2 packet
    /// threads; in the same run a null forwarder (parse, swap addresses,
    /// send) over the same pipeline gives this machine's limit, and every
    /// rate is printed as a ratio to it.
    ///
    /// With --topology veth: packets per second through a veth pair in
    /// namespaces, the load balancer (lb run --interface) beside nftables
    /// doing the same job (DNAT with jhash) and an XDP forwarder doing the
    /// same hop (the pair's limit), with the ratios. The generator is an
    /// XDP program in live-frames mode (many Mpps from one core); a row
    /// whose generator offered less than 1.5x what it delivered is marked
    /// invalid.
    ///
    /// Examples:
    ///   fastpath lb bench --quick
    ///   fastpath lb bench --format json
    ///   fastpath lb bench --topology veth
    #[command(verbatim_doc_comment)]
    Bench(BenchArgs),
    // The help text is CheckConfigArgs' doc comment (crates/fastpath/src/check_config.rs).
    CheckConfig(crate::check_config::CheckConfigArgs),
    // The help text is BenchControlArgs' doc comment (crates/fastpath/src/bench_control.rs).
    BenchControl(crate::bench_control::BenchControlArgs),
    /// Show a running load balancer's VIPs, backends, health and counters,
    /// or whether a fleet of them agrees.
    ///
    /// Reads /status from the HTTP API of `fastpath lb run --interface`
    /// (enabled by `[api] listen = "127.0.0.1:9180"` in its configuration).
    /// Each VIP shows its table fingerprint: a hash of its Maglev lookup
    /// table and backends, the same on every machine with the same table.
    /// The "gateway" line is the MAC every encapsulated frame is sent to:
    /// resolved from the kernel (the next hop towards the first backend),
    /// configured ([encap] gateway_mac), or UNRESOLVED, with the reason and
    /// what to check; unresolved, frames are lost although counted as
    /// forwarded.
    ///
    /// Counters: "configuration generation" rises only when a
    /// configuration is applied (start, reload, drain/undrain/weight);
    /// health changes are counted apart. "reloads: N applied, M rejected"
    /// are two separate counts. "dropped" counts frames for the load
    /// balancer it could not forward; frames not for a VIP (the kernel's
    /// own traffic on AF_PACKET, ARP) are counted as "not for a VIP".
    /// "connections: A active, T tracked": active ones are not closed;
    /// tracked entries include closed flows lingering briefly. Each backend
    /// shows its configured weight and its state: up, DOWN, drained (takes
    /// no new connections; `fastpath lb undrain` restores it), or
    /// "drained, DOWN".
    ///
    /// With several --api: asks every load balancer at once (an unreachable
    /// one is reported after a few seconds, not waited for), prints one row
    /// per load balancer with each VIP's fingerprint, and a verdict: "fleet
    /// agrees", or "fleet DISAGREES" naming the load balancer that differs
    /// from the majority and what differs (pool, backends, weights, health).
    /// Behind ECMP, a flow that moves between load balancers keeps its
    /// backend only if their tables agree. Exits 1 unless the fleet agrees.
    ///
    /// Where the API listens on a data address with a token, reads need
    /// it too: pass the daemon's [api] token_file with --token-file.
    ///
    /// Examples:
    ///   fastpath lb status --api 127.0.0.1:9180
    ///   fastpath lb status --api 10.0.0.1:9180 --api 10.0.0.2:9180 --api 10.0.0.3:9180
    ///   fastpath lb status --api 10.0.0.1:9180,10.0.0.2:9180 --format json | jq .agree
    ///   fastpath lb status --api 10.0.0.1:9180,10.0.0.2:9180 --token-file /etc/fastpath/api.token
    #[command(verbatim_doc_comment)]
    Status {
        /// The API address; repeat (or separate with commas) to check a
        /// fleet.
        #[arg(long, default_value = "127.0.0.1:9180", num_args = 1.., value_delimiter = ',')]
        api: Vec<std::net::SocketAddr>,
        /// File holding the API's bearer token (the daemon's `[api]
        /// token_file`); needed where reads need it (an API on a data
        /// address with a token, or `[api] token_for_reads = true`).
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Reload a running load balancer's configuration file.
    ///
    /// Asks the running load balancer (`fastpath lb run --interface`, with
    /// `[api] listen`) to re-read its configuration file, as SIGHUP does,
    /// and answers with the result: the new configuration generation, how
    /// long it took, how many of the file's [[pools]]/[[vips]] elements
    /// had to be parsed again (unchanged ones are remembered), and the keys
    /// that changed but apply only at the next start. A file with any
    /// error is rejected whole, the running configuration stays, and the
    /// error (file, key or line, what was expected) is printed; exit
    /// status 1.
    ///
    /// With several --api (a fleet): every load balancer is asked for its
    /// /status first, and none is reloaded unless all answer; then all are
    /// reloaded at once, and each one's result is printed (JSON: applied,
    /// sent, lbs[]{api, answer, error}). Exit status 1 unless every one
    /// applied it.
    ///
    /// Examples:
    ///   fastpath lb reload
    ///   fastpath lb reload --api 127.0.0.1:9180 --token-file /etc/fastpath/api.token
    ///   fastpath lb reload --format json | jq .generation
    ///   fastpath lb reload --api 10.0.0.1:9180,10.0.0.2:9180 --token-file /etc/fastpath/api.token
    #[command(verbatim_doc_comment)]
    Reload(ApiArgs),
    /// The fleet's configuration in etcd: push, diff, history, rollback,
    /// hold, show (`fastpath lb config --help`; load balancers follow it
    /// with `lb run --config-etcd`).
    Config(crate::lb_config::ConfigArgs),
    /// Drain a backend: it takes no new connections and keeps the ones it
    /// has; its weight is kept for `undrain`.
    ///
    /// Asks the running load balancer (`fastpath lb run --interface`, with
    /// `[api] listen`) to list the backend in its pool's `drained` in the
    /// configuration: the change is validated and applied whole like a
    /// reload, and written back into the configuration file (comments and
    /// layout kept) so that a restart keeps it. A backend listed in several
    /// pools is drained in all of them (the answer names them). The daemon
    /// refuses (and changes nothing) when no pool lists the backend, or when
    /// the file was edited since it was loaded: reload that edit first
    /// (SIGHUP or POST /reload), or undo it.
    ///
    /// BACKEND is the backend's `name`, or its address when it has none.
    /// With `[api] token_file`, pass the same file with --token-file.
    /// `fastpath lb status` then shows the backend as "drained".
    ///
    /// With several --api (a fleet): every load balancer is asked first,
    /// and nothing changes anywhere unless all answer and serve the
    /// backend; then all change at once (the fleet disagrees for one
    /// request's time, not for N commands), and each one's answer or
    /// refusal is printed (JSON: applied, sent, lbs[]{api, answer, error}).
    /// Exit status 1 unless every one applied it. The same goes for
    /// `undrain` and `weight`.
    ///
    /// Examples:
    ///   fastpath lb drain backend-1
    ///   fastpath lb drain 10.1.0.2 --api 127.0.0.1:9180 --token-file /etc/fastpath/api.token
    ///   fastpath lb drain backend-1 --format json | jq .pools
    ///   fastpath lb drain backend-1 --api 10.0.0.1:9180,10.0.0.2:9180 --token-file /etc/fastpath/api.token
    #[command(verbatim_doc_comment)]
    Drain(BackendArgs),
    /// Undrain a backend: its configured weight applies again.
    ///
    /// The reverse of `fastpath lb drain`: removes the backend from its
    /// pools' `drained` lists, applied whole like a reload and written back
    /// into the configuration file. Undraining a backend that is not
    /// drained changes nothing (the answer says so).
    ///
    /// Examples:
    ///   fastpath lb undrain backend-1
    ///   fastpath lb undrain 10.1.0.2 --api 127.0.0.1:9180 --token-file /etc/fastpath/api.token
    #[command(verbatim_doc_comment)]
    Undrain(BackendArgs),
    /// Set a backend's weight (its share of new connections in its pools).
    ///
    /// Sets `weight = N` on the backend in every pool that lists it,
    /// applied whole like a reload (Maglev tables rebuilt, connections kept
    /// by connection tracking) and written back into the configuration
    /// file. A drained backend stays drained with the new weight to come
    /// back with. Weight 0 also takes it out of the table; prefer `drain`,
    /// which keeps the weight.
    ///
    /// Examples:
    ///   fastpath lb weight backend-1 3
    ///   fastpath lb weight 10.1.0.2 1 --api 127.0.0.1:9180 --token-file /etc/fastpath/api.token
    #[command(verbatim_doc_comment)]
    Weight {
        #[command(flatten)]
        target: BackendArgs,
        /// The new weight.
        #[arg(value_name = "N")]
        weight: u32,
    },
    /// Withdraw a load balancer's VIP routes from BIRD, whether it runs or
    /// not: what its service unit runs once it has stopped.
    ///
    /// A killed or frozen `fastpath lb run` cannot withdraw for itself, and
    /// its BIRD goes on announcing the VIPs; this is the `ExecStopPost=` of
    /// dist/systemd/fastpath-lb@.service. It reads only [bgp] of the
    /// configuration, leniently (a file edited since the daemon started
    /// still names its protocols), and runs `birdc disable` (with [bgp]
    /// birdc) for each protocol that holds the VIP routes: every key of
    /// [bgp] whose name starts with "protocol", and the names
    /// dist/bird/fastpath.conf ships (fastpath_vips, fastpath_vips6) for
    /// what the file leaves out. Prints per protocol: disabled, already
    /// disabled (a graceful stop withdraws by itself), BIRD not running
    /// (then nothing is announced), or not in BIRD (a shipped name this
    /// BIRD has no protocol of), or "not withdrawn" and why. Exits 1 if a
    /// protocol the file names was not withdrawn. Ends within about 2 s
    /// whatever BIRD does (each protocol asked at once, birdc bounded).
    ///
    /// Examples:
    ///   fastpath lb withdraw --config /etc/fastpath/edge.toml
    ///   ExecStopPost=/usr/bin/fastpath lb withdraw --config /etc/fastpath/%i.toml
    #[command(verbatim_doc_comment)]
    Withdraw {
        /// The load balancer's configuration file.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Packet-tracer: which load balancer handled a packet, and how
    /// (paper section 4.4; needs root for the raw socket).
    ///
    /// Sends --count probes to the VIP from a raw socket: ordinary TCP SYNs
    /// or UDP datagrams (source port +1 per probe, so they hash apart)
    /// whose payload starts with a marker naming --report-to. Each load
    /// balancer that sees one forwards it as usual and sends a report back:
    /// its name, packet thread, connection-table hit or miss, tables
    /// generation (`tables_generation` in /status: it also rises on health
    /// changes), the VIP's table fingerprint, the backend, and for
    /// fragments (--fragment) whether it redirected the fragment to the
    /// fleet peer responsible or received it redirected. Reports are
    /// collected for --wait-ms and printed per probe; load balancers
    /// rate-limit them ([tracer] rate_per_s, excess counted in /metrics).
    /// Load balancers answer only with `[tracer] enabled = true` and only
    /// to addresses inside its `report_to` prefixes (a report names
    /// backends and machines). Exits 1 if no probe was reported. Marker
    /// format: crates/lb/src/tracer.rs.
    ///
    /// JSON keys: vip, proto, report_to, unreported, ignored, probes[]{probe,
    /// src, fragmented, reports[]{probe, machine, thread, src, vip, proto,
    /// vip_name, fragment, conntrack, generation, fingerprint, backend,
    /// backend_address, redirected_to, arrived_redirected, redirected_from}}.
    ///
    /// Examples:
    ///   fastpath lb trace --vip 198.18.0.80:80 --proto tcp --report-to 10.0.0.2:9999
    ///   fastpath lb trace --vip 198.18.0.80:80 --proto tcp --count 8 --report-to 10.0.0.2:9999
    ///   fastpath lb trace --vip 198.18.0.80:53 --proto udp --fragment --report-to 10.0.0.2:9999 --format json
    #[command(verbatim_doc_comment)]
    Trace(crate::tracer::TraceArgs),
    // The help text is QuicCidArgs' doc comment (crates/fastpath/src/quic_cid.rs).
    QuicCid(crate::quic_cid::QuicCidArgs),
    /// A Maglev fleet in a throwaway network, end to end (needs root).
    ///
    /// Builds network namespaces: a client, a router running BIRD that
    /// learns the VIP (198.18.0.80, which exists only in these namespaces)
    /// from every load balancer over BGP and spreads flows over them with
    /// ECMP on the 5-tuple, --lbs load balancers (each `fastpath lb run` on
    /// AF_XDP, else AF_PACKET, with its own BIRD; BFD takes a dead one out
    /// in about 0.3 s) and --backends nginx backends behind `fastpath lb
    /// decap`. Then, under HTTP load:
    ///
    ///   1. requests spread over load balancers x backends (a table);
    ///   2. long-lived keep-alive connections are opened;
    ///   3. load balancer 1's machine dies (fastpath and BIRD frozen, then
    ///      killed: nothing withdrawn, only BFD notices): its flows, and flows the
    ///      router's hash-threshold multipath moves between the survivors,
    ///      reach load balancers without a connection-tracking entry and
    ///      must keep their backend by Maglev hashing alone (goal: 0 broken);
    ///   4. it comes back (goal: 0 broken);
    ///   5. every load balancer is restarted in turn, gracefully (SIGTERM:
    ///      withdraw the VIP, drain, exit), goal: 0 failed requests;
    ///   6. backend-1 is removed while load balancer 2 is down: broken
    ///      connections beside what Maglev's table disruption predicts;
    ///   7. the fleet's table fingerprints are compared;
    ///   8. QUIC downloads move twice each mid-download (new address and
    ///      port) with the VIP routed by connection ID (QUIC-LB: all
    ///      complete), then by the 5-tuple (most break); needs
    ///      fastpath-quic-peer beside fastpath, else skipped and said.
    ///
    /// Everything it created is removed at the end, also when interrupted.
    ///
    /// Examples:
    ///   fastpath lb demo
    ///   fastpath lb demo --format json | jq .fleet.rolling_restart
    #[command(verbatim_doc_comment)]
    Demo {
        /// Load balancers in the fleet (2 to 8).
        #[arg(long, default_value_t = 3)]
        lbs: usize,
        /// Number of nginx backends (2 to 8).
        #[arg(long, default_value_t = 3)]
        backends: usize,
        /// Requests for the spread table, each a new connection.
        #[arg(long, default_value_t = 300)]
        requests: usize,
        /// Long-lived connections kept open through the fleet's changes.
        #[arg(long, default_value_t = 60)]
        connections: usize,
        /// `table`: tables for people; `json`: the figures as
        /// {"fleet": {...}} on stdout (progress on stderr).
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Soak the load balancer: real HTTP load while faults are injected
    /// (needs root, wrk, nginx, BIRD).
    ///
    /// Builds the namespace topology of `lb demo` with five nginx backends
    /// (four in the configuration, the fifth added and removed by reloads)
    /// and health checks through the tunnel, then for --seconds runs wrk
    /// with keep-alive and with `Connection: close` through the VIP, keeps
    /// two long-lived keep-alive connections per backend asking GET / every
    /// half second, and in every minute: stops and restarts nginx on
    /// backend 1, kills (SIGKILL) and restarts backend 2's decap agent,
    /// takes backend 3's link down and up, adds and removes backend 5 by
    /// reloads every two seconds, sends a broken reload, and drains then
    /// undrains backend 4.
    ///
    /// It reports requests sent and failed (and whether every failure lies
    /// in a fault window), long-lived connections broken on backends that
    /// stayed healthy (goal 0), the time from each fault until the backend
    /// is out of the table, and the load balancer's RSS and packet-pool
    /// occupancy after the warm-up and at the end (goal: no growth). Exits
    /// non-zero when a goal is missed. Progress goes to stderr; everything
    /// it creates is removed at the end, also on Ctrl-C.
    ///
    /// JSON keys: seconds, cycles, requests_sent, requests_failed, load[],
    /// long_lived{broken_on_healthy, ...}, faults[]{fault, backend,
    /// at_s, action_s, out_after_s, back_after_s}, drains[], reloads,
    /// rss_kib{start, middle, end}, pool_in_use{start, middle, end},
    /// segments[], goals[]{goal, met, detail}. RELIABILITY.md has figures.
    ///
    /// Examples:
    ///   fastpath lb soak --seconds 60
    ///   fastpath lb soak --seconds 600 --json out/soak.json     (make soak)
    ///   fastpath lb soak --seconds 60 --format json | jq '.goals'
    #[command(verbatim_doc_comment)]
    Soak(SoakArgs),
    /// Decapsulate GRE for a backend (run it on each backend).
    ///
    /// This kernel has no GRE module, so backends cannot add a GRE tunnel.
    /// This helper receives GRE (IPv4 and IPv6) on raw sockets, removes the
    /// outer headers and writes the inner packet into a TUN device; with the
    /// VIP on the backend's loopback, the kernel serves it and replies go
    /// directly to the client. Runs until SIGINT or SIGTERM, then prints its
    /// counters.
    ///
    /// The backend's kernel needs two settings for this to work:
    ///   arp_ignore=1, arp_announce=2   the VIP is on lo of every backend:
    ///                                  without them each answers ARP for it
    ///                                  and takes the load balancers' traffic
    ///   rp_filter=0                    the client's packets arrive on the
    ///                                  TUN device, its route is elsewhere:
    ///                                  strict reverse-path filtering drops
    ///                                  them (a warning is logged at start
    ///                                  when net.ipv4.conf.all.rp_filter is on)
    ///
    /// Example (on a backend):
    ///   ip addr add 192.0.2.80/32 dev lo
    ///   sysctl -w net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2
    ///   sysctl -w net.ipv4.conf.all.rp_filter=0
    ///   fastpath lb decap --tun fpdecap0
    #[command(verbatim_doc_comment)]
    Decap {
        /// Name of the TUN device to create and deliver into.
        #[arg(long, default_value = "fpdecap0")]
        tun: String,
    },
    /// Write mixed sample traffic for examples/lb.toml to a pcap file.
    ///
    /// TCP and UDP over IPv4, an any-port UDP VIP, IPv6, ICMP errors about VIP
    /// flows, fragments in and out of order, traffic for no VIP and garbage:
    /// everything `fastpath lb run` has to handle.
    ///
    /// Example:
    ///   fastpath lb sample-pcap --out in.pcap
    ///   fastpath lb run --config examples/lb.toml --pcap-in in.pcap --pcap-out out.pcap
    #[command(verbatim_doc_comment)]
    SamplePcap {
        /// The pcap file to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

/// Where a running load balancer's API is (or the APIs of a fleet), and
/// its token.
#[derive(Args)]
pub struct ApiConn {
    /// The API address of the load balancer (its `[api] listen`); repeat
    /// (or separate with commas) to change a fleet: every load balancer is
    /// asked first, nothing changes unless all answer (and list the
    /// backend), then all are changed at once and each answer is shown.
    #[arg(long, default_value = "127.0.0.1:9180", num_args = 1.., value_delimiter = ',')]
    api: Vec<std::net::SocketAddr>,
    /// File holding the API's bearer token (the daemon's `[api]
    /// token_file`); needed when the daemon has one.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

impl ApiConn {
    /// The token from --token-file, if given.
    fn token(&self) -> anyhow::Result<Option<String>> {
        Ok(self
            .token_file
            .as_deref()
            .map(lbd::http::read_token)
            .transpose()?)
    }
}

/// A change's answer, or its error; a refusal is said after `what` (the
/// request in words).
fn refused<T>(r: Result<T, lbd::client::ApiError>, what: &str) -> anyhow::Result<T> {
    r.map_err(|e| match e {
        e @ lbd::client::ApiError::Status { .. } => anyhow::Error::new(e).context(what.to_string()),
        e => e.into(),
    })
}

/// `fastpath lb reload`'s arguments.
#[derive(Args)]
pub struct ApiArgs {
    #[command(flatten)]
    conn: ApiConn,
    /// Output format: `table` (a sentence), or `json` (the daemon's
    /// answer: generation, not_applied, took_us, parsed {chunks, parsed,
    /// whole}).
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// `fastpath lb reload`: POST /reload, its answer printed; a rejected file
/// is an error with the daemon's reason. With several --api, the whole
/// fleet ([`fleet_outcome`]).
fn reload(a: ApiArgs) -> anyhow::Result<()> {
    let token = a.conn.token()?;
    let [api] = a.conn.api[..] else {
        let r = lbd::client::fleet_reload(&a.conn.api, token.as_deref());
        return fleet_outcome(&r, a.format, "reload", reloaded_text);
    };
    let r = refused(lbd::client::reload(api, token.as_deref()), "reload")?;
    emit(a.format, &r)
}

impl Report for lbd::reload::Reloaded {
    fn to_text(&self) -> String {
        reloaded_text(self)
    }
}

impl Report for lbd::reload::RuntimeChanged {
    fn to_text(&self) -> String {
        changed_text(self)
    }
}

/// A fleet-wide change as a report: its document is the whole
/// [`lbd::client::FleetChange`]; its text one line per load balancer, the
/// answer in words (`text`) or the error.
#[derive(serde::Serialize)]
#[serde(transparent)]
struct FleetReport<'a, T: serde::Serialize> {
    change: &'a lbd::client::FleetChange<T>,
    #[serde(skip)]
    text: &'a dyn Fn(&T) -> String,
}

impl<T: serde::Serialize> Report for FleetReport<'_, T> {
    fn to_text(&self) -> String {
        let mut out = String::new();
        for lb in &self.change.lbs {
            match (&lb.answer, &lb.error) {
                (Some(a), _) => out += &format!("{}: {}", lb.api, (self.text)(a)),
                (None, Some(e)) => out += &format!("{}: {e}\n", lb.api),
                (None, None) => out += &format!("{}: no answer\n", lb.api),
            }
        }
        out
    }
}

/// A reload's answer in words.
fn reloaded_text(r: &lbd::reload::Reloaded) -> String {
    let pieces = if r.parsed.whole {
        "the file was parsed whole".to_string()
    } else {
        format!(
            "{} of its {} [[pools]]/[[vips]] elements parsed again",
            r.parsed.parsed, r.parsed.chunks
        )
    };
    let mut out = format!(
        "reloaded: configuration generation {} in {:.1} ms ({pieces})\n",
        r.generation,
        r.took_us as f64 / 1e3
    );
    if !r.not_applied.is_empty() {
        out += &format!(
            "changed but applied only at the next start (the running values stay): {}\n",
            r.not_applied.join(", ")
        );
    }
    out
}

/// A fleet-wide change's outcome: per load balancer, its answer in words
/// (`text`) or its error; JSON: the whole [`lbd::client::FleetChange`].
/// An error unless every load balancer applied it.
fn fleet_outcome<T: serde::Serialize>(
    r: &lbd::client::FleetChange<T>,
    format: Format,
    what: &str,
    text: impl Fn(&T) -> String,
) -> anyhow::Result<()> {
    emit(
        format,
        &FleetReport {
            change: r,
            text: &text,
        },
    )?;
    let failed: Vec<&str> = r
        .lbs
        .iter()
        .filter(|l| l.error.is_some())
        .map(|l| l.api.as_str())
        .collect();
    match (r.sent, failed.is_empty()) {
        (_, true) => Ok(()),
        (false, false) => anyhow::bail!(
            "{what}: nothing changed on any load balancer: {} could not take it",
            r.lbs
                .iter()
                .filter(|l| l
                    .error
                    .as_deref()
                    .is_some_and(|e| !e.contains("another load balancer")))
                .map(|l| l.api.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        (true, false) => anyhow::bail!(
            "{what}: applied on {} of {} load balancers; not on {} (the fleet disagrees until it is)",
            r.lbs.len() - failed.len(),
            r.lbs.len(),
            failed.join(", ")
        ),
    }
}

/// A backend of a running load balancer, and how to reach its API.
#[derive(Args)]
pub struct BackendArgs {
    /// The backend: its `name` in the configuration, or its address.
    #[arg(value_name = "BACKEND")]
    backend: String,
    #[command(flatten)]
    conn: ApiConn,
    /// Output format: `table` (a sentence), or `json` (the daemon's
    /// answer: backend, change, pools, changed, generation, file).
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// `fastpath lb drain|undrain|weight`: one POST to the API, its answer
/// printed; an error status is an error with the daemon's reason. With
/// several --api, the whole fleet ([`fleet_outcome`]).
fn runtime_change(a: BackendArgs, change: lbd::runtime::Change) -> anyhow::Result<()> {
    let token = a.conn.token()?;
    let what = format!("{change} {}", a.backend);
    let [api] = a.conn.api[..] else {
        let r = lbd::client::fleet_change(&a.conn.api, &a.backend, change, token.as_deref());
        return fleet_outcome(&r, a.format, &what, changed_text);
    };
    let r = refused(
        lbd::client::change(api, &a.backend, change, token.as_deref()),
        &what,
    )?;
    emit(a.format, &r)
}

/// `fastpath lb withdraw`: one line per protocol, what could not be
/// withdrawn included; fails if any protocol was not withdrawn.
fn withdraw(config: &std::path::Path) -> anyhow::Result<()> {
    let done = lbd::withdraw::withdraw(config)?;
    if done.is_empty() {
        println!(
            "{}: no [bgp]: nothing is announced, nothing to withdraw",
            config.display()
        );
    }
    let mut not_withdrawn = Vec::new();
    for (protocol, outcome) in done {
        let what = match outcome {
            Ok(lbd::withdraw::Outcome::Disabled) => "disabled: its VIP routes are withdrawn",
            Ok(lbd::withdraw::Outcome::AlreadyDisabled) => "already disabled",
            Ok(lbd::withdraw::Outcome::BirdNotRunning) => {
                "BIRD is not running: it announces nothing"
            }
            Ok(lbd::withdraw::Outcome::NotInBird) => "not in BIRD's configuration",
            Err(e) => {
                eprintln!("{protocol}: not withdrawn: {e}");
                not_withdrawn.push(protocol);
                continue;
            }
        };
        println!("{protocol}: {what}");
    }
    if !not_withdrawn.is_empty() {
        anyhow::bail!(
            "not withdrawn: {} (BIRD may still announce their VIPs until it answers or the router's hold timer expires)",
            not_withdrawn.join(", ")
        );
    }
    Ok(())
}

/// A runtime change's answer in words.
fn changed_text(r: &lbd::reload::RuntimeChanged) -> String {
    let what = match r.change {
        lbd::runtime::Change::Drain => "drained".to_string(),
        lbd::runtime::Change::Undrain => "undrained".to_string(),
        lbd::runtime::Change::Weight(w) => format!("weight set to {w}"),
    };
    let pools = if r.pools.len() == 1 {
        format!("pool {}", r.pools[0])
    } else {
        format!(
            "all {} pools that list it: {}",
            r.pools.len(),
            r.pools.join(", ")
        )
    };
    if r.changed {
        format!(
            "{}: {what} in {pools}; applied (configuration generation {}) and written to {}\n",
            r.backend, r.generation, r.file
        )
    } else {
        format!(
            "{}: already {what} in {pools}; nothing changed\n",
            r.backend
        )
    }
}

#[derive(Args)]
pub struct SoakArgs {
    /// Seconds of the measured run, after a 5 s warm-up (one cycle of
    /// faults per full minute, at least one).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(30..))]
    seconds: u64,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Output format on stdout.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

fn soak(a: SoakArgs) -> anyhow::Result<()> {
    let stop = stop_flag()?;
    let exe = std::env::current_exe().context("finding our own binary")?;
    let opts = lab::soak::Options::new(a.seconds);
    let report = lab::soak::run(&exe, &opts, &stop, &mut |line| eprintln!("soak: {line}"))?;
    if let Some(path) = &a.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, &json).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("soak: wrote {}", path.display());
    }
    emit(a.format, &report)?;
    let missed: Vec<&str> = report
        .goals
        .iter()
        .filter(|g| !g.met)
        .map(|g| g.goal.as_str())
        .collect();
    if !report.passed() {
        anyhow::bail!("soak: goals missed: {}", missed.join("; "));
    }
    Ok(())
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Topology {
    /// The forwarder alone, driven from an in-memory generator.
    Memory,
    /// A veth pair in namespaces, beside nftables DNAT and an XDP bounce
    /// (needs root).
    Veth,
}

/// `lb bench --topology veth --generator`.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum GenArg {
    /// AF_XDP in copy mode.
    Afxdp,
    /// XDP in live-frames mode (BPF_PROG_TEST_RUN).
    Xdp,
}

#[derive(Args)]
pub struct BenchArgs {
    /// What to drive: the forwarder in memory, or a veth pair.
    #[arg(long, value_enum, default_value = "memory")]
    topology: Topology,
    /// Seconds per device under test with --topology veth.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// With --topology veth: veth queues, one AF_XDP generator thread on
    /// each.
    #[arg(long, default_value_t = 1)]
    gen_queues: u32,
    /// With --topology veth: the generator: an XDP program in live-frames
    /// mode (batches of XDP frames, no sk_buff), or AF_XDP in copy mode
    /// (an sk_buff per frame; on veth it offers well under 1 Mpps).
    #[arg(long, value_enum, default_value = "xdp")]
    generator: GenArg,
    /// With --topology veth: set d0 up for preferred busy polling
    /// (napi_defer_hard_irqs, gro_flush_timeout), so that the load
    /// balancer runs d0's receive processing itself when its ring is empty
    /// instead of sharing its core with d0's NAPI thread. No effect on
    /// veth as of Linux 6.18: veth gives its XDP receive queue no NAPI id,
    /// so the socket has none to poll (SO_INCOMING_NAPI_ID reads 0), and
    /// the load balancer stops polling at its first frames; kept for
    /// interfaces that have one.
    #[arg(long)]
    busy_poll: bool,
    /// A run of a few seconds (fewer packets, one repetition).
    #[arg(long)]
    quick: bool,
    /// How the rate grows with threads: per-queue run to completion (one
    /// in-memory receive queue per worker, flows spread by the steering
    /// hash) beside the steering pipeline and the null forwarder, for each
    /// thread count (default 1 to the CPUs less one, at least 2, at most
    /// 16): total Mpps, Mpps per thread, efficiency, thread placement and
    /// the generator's own rate. Needs nothing but this binary.
    #[arg(long, conflicts_with_all = ["topology", "traffic"])]
    scaling: bool,
    /// Packets per run.
    #[arg(long)]
    packets: Option<u64>,
    /// Packet-thread counts, comma separated.
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Runs per measurement (the median is reported).
    #[arg(long)]
    repeats: Option<usize>,
    /// Traffic types, comma separated: syn, non_syn, constant (TCP);
    /// non_syn_v6 (the non-SYN ACKs over IPv6, to IPv6 backends, beside the
    /// null forwarder on the same frames); udp, and quic_plaintext,
    /// quic_single_pass, quic_four_pass (the same datagrams to a QUIC-LB
    /// VIP, routed by connection ID, each beside udp). The null forwarder
    /// always runs as the peer.
    #[arg(long, value_delimiter = ',', value_parser = ["syn", "non_syn", "non_syn_v6", "constant", "udp", "quic_plaintext", "quic_single_pass", "quic_four_pass"])]
    traffic: Option<Vec<String>>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

fn lb_bench(a: BenchArgs) -> anyhow::Result<()> {
    if a.topology == Topology::Veth {
        let exe = std::env::current_exe().context("finding our own binary")?;
        let secs = if a.quick {
            a.seconds.min(1.0)
        } else {
            a.seconds
        };
        let kind = match a.generator {
            GenArg::Afxdp => bench::veth::GeneratorKind::AfXdp,
            GenArg::Xdp => bench::veth::GeneratorKind::Xdp,
        };
        let report = bench::veth::run(&exe, secs, a.gen_queues, kind, a.busy_poll, &mut |what| {
            eprintln!("measuring {what}")
        })?;
        return emit(a.format, &report);
    }
    if a.scaling {
        let mut b = if a.quick {
            bench::scaling::ScalingConfig::quick()
        } else {
            bench::scaling::ScalingConfig::full()
        };
        if let Some(p) = a.packets {
            b.packets = p;
        }
        if let Some(t) = a.threads {
            b.threads = t;
        }
        if let Some(r) = a.repeats {
            b.repeats = r;
        }
        let report = bench::scaling::run(&b, &mut |what| eprintln!("measuring {what}"))?;
        return emit(a.format, &report);
    }
    let mut b = if a.quick {
        bench::forwarder::BenchConfig::quick()
    } else {
        bench::forwarder::BenchConfig::full()
    };
    if let Some(p) = a.packets {
        b.packets = p;
    }
    if let Some(t) = a.threads {
        b.threads = t;
    }
    if let Some(r) = a.repeats {
        b.repeats = r;
    }
    if let Some(t) = a.traffic {
        b.traffic = t;
    }
    let report = bench::forwarder::run(&b, &mut |what| eprintln!("measuring {what}"))?;
    emit(a.format, &report)
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["pcap_in", "interface"])))]
pub struct RunArgs {
    /// Configuration file (TOML); with --config-etcd, this machine's own
    /// part of it.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    #[command(flatten)]
    etcd: crate::lb_config::EtcdRunArgs,
    /// Capture to forward (Ethernet link type); needs --pcap-out.
    #[arg(long, value_name = "FILE", requires = "pcap_out")]
    pcap_in: Option<PathBuf>,
    /// Where forwarded (GRE-encapsulated) frames are written.
    #[arg(long, value_name = "FILE")]
    pcap_out: Option<PathBuf>,
    /// Forward on this interface until SIGINT or SIGTERM (frames are
    /// received and sent back out on it).
    #[arg(long, value_name = "IFACE", conflicts_with = "pcap_in")]
    interface: Option<String>,
    /// Packet I/O driver for --interface (default: the configuration's
    /// [forwarder] driver, itself "auto" by default).
    #[arg(long, value_enum)]
    driver: Option<lb::config::Driver>,
    /// Packet threads, overriding forwarder.threads (0: inline).
    #[arg(long)]
    threads: Option<usize>,
    /// Output format for the counters of a --pcap-in replay (the daemon
    /// logs; its counters are in `fastpath lb status`).
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// How log lines are written to stderr: `text` for people, `json` for
    /// journald or a log shipper (one object a line: timestamp, level,
    /// fields, target, threadName; the counters at exit are one more such
    /// line, under fields.counters). What is logged: RUST_LOG.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// How log lines are written.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

fn lb_run(a: RunArgs) -> anyhow::Result<()> {
    let (stats, tables) = match (&a.interface, &a.pcap_in, &a.pcap_out) {
        (Some(iface), _, _) => {
            // The first signal stops gracefully (withdraw, drain); a second
            // one while draining stops at once. (signal-hook runs actions in
            // the order registered: the exit is checked before the flag is
            // set.)
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&stop))
                    .context("installing a signal handler")?;
                signal_hook::flag::register(sig, Arc::clone(&stop))
                    .context("installing a signal handler")?;
            }
            let source = a.etcd.source(&a.config)?;
            lbd::daemon::run_from(source, iface, a.driver, a.threads, stop)?
        }
        (None, Some(inp), Some(out)) => lb::pcap_run::run(&a.config, inp, out, a.threads)?,
        _ => anyhow::bail!("give --interface, or --pcap-in with --pcap-out"),
    };
    let report = RunReport {
        stats: &stats,
        tables: &tables,
    };
    // A daemon logging JSON ends with its counters as one more JSON log
    // line, not a table among the log shipper's objects.
    if a.interface.is_some() && a.log_format == LogFormat::Json && matches!(a.format, Format::Table)
    {
        eprintln!("{}", counters_event(&report));
        return Ok(());
    }
    emit(a.format, &report)
}

/// The counters at exit as a log line of `--log-format json`'s shape
/// (timestamp, level, fields, target, threadName), the counters document
/// under `fields.counters`.
fn counters_event(report: &RunReport<'_>) -> String {
    use tracing_subscriber::fmt::time::FormatTime;
    let mut timestamp = String::new();
    let _ = tracing_subscriber::fmt::time::SystemTime.format_time(
        &mut tracing_subscriber::fmt::format::Writer::new(&mut timestamp),
    );
    serde_json::json!({
        "timestamp": timestamp,
        "level": "INFO",
        "fields": { "message": "counters at exit", "counters": report },
        "target": "fastpath::lb",
        "threadName": std::thread::current().name().unwrap_or("main"),
    })
    .to_string()
}

/// `fastpath lb run`'s counters and tables at the end. Its document and its
/// text are lb's own (`lb::pcap_run::json` and `report`).
struct RunReport<'a> {
    stats: &'a lb::datapath::RunStats,
    tables: &'a lb::tables::Tables,
}

impl serde::Serialize for RunReport<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        lb::pcap_run::json(self.stats, self.tables).serialize(s)
    }
}

impl Report for RunReport<'_> {
    fn to_text(&self) -> String {
        lb::pcap_run::report(self.stats, self.tables)
    }
}

#[derive(Args)]
pub struct HashEvalArgs {
    /// Reduced run (3 failure levels x 10 repetitions); a few seconds.
    #[arg(long)]
    quick: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Write figure11.svg and figure12.svg into this directory.
    #[arg(long, value_name = "DIR")]
    plot_dir: Option<PathBuf>,
    /// Number of backends N.
    #[arg(long, default_value_t = 1000)]
    backends: usize,
    /// Table sizes M, comma separated; each must be prime.
    #[arg(long, value_delimiter = ',', default_values_t = [65_537u64, 655_373])]
    sizes: Vec<u64>,
    /// Random repetitions per failure level (default: 200, or 10 with --quick).
    #[arg(long)]
    repetitions: Option<usize>,
    /// Virtual nodes per backend on the Karger ring.
    #[arg(long, default_value_t = 1000)]
    karger_views: u32,
    /// Seed for choosing which backends fail.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
}

fn hash_eval(a: HashEvalArgs) -> anyhow::Result<()> {
    let mut cfg = if a.quick {
        bench::hash_eval::Config::quick()
    } else {
        bench::hash_eval::Config::paper()
    };
    cfg.backends = a.backends;
    cfg.sizes = a.sizes;
    cfg.karger_views = a.karger_views;
    cfg.seed = a.seed;
    if let Some(r) = a.repetitions {
        cfg.repetitions = r;
    }
    let report = bench::hash_eval::run(&cfg)?;
    emit(a.format, &report)?;
    if let Some(dir) = a.plot_dir {
        for f in report.plot(&dir)? {
            eprintln!("wrote {}", f.display());
        }
    }
    Ok(())
}

fn decap(tun: &str) -> anyhow::Result<()> {
    let stop = stop_flag()?;
    eprintln!("decapsulating GRE into {tun}; stop with Ctrl-C (SIGINT) or SIGTERM");
    let s = decap::run(tun, &stop)?;
    println!(
        "GRE received {}, delivered {} (IPv4 {}, IPv6 {}), malformed {}, not IP {}, TUN errors {}",
        s.received, s.delivered, s.inner_v4, s.inner_v6, s.malformed, s.not_ip, s.tun_errors
    );
    Ok(())
}

fn sample_pcap(out: &std::path::Path) -> anyhow::Result<()> {
    let frames: Vec<Vec<u8>> = lab::sample::mixed_traffic()
        .into_iter()
        .map(|s| s.frame)
        .collect();
    netio::pcap::write_frames(out, &frames)?;
    eprintln!("wrote {} frames to {}", frames.len(), out.display());
    Ok(())
}

/// Runs one `fastpath lb` subcommand.
pub fn run(c: LbCommand) -> anyhow::Result<()> {
    match c {
        LbCommand::HashEval(a) => hash_eval(a),
        LbCommand::FleetSim(a) => crate::fleet_sim::run(a),
        LbCommand::Run(a) => lb_run(a),
        LbCommand::Config(a) => crate::lb_config::run(a),
        LbCommand::Bench(a) => lb_bench(a),
        LbCommand::CheckConfig(a) => crate::check_config::run(a),
        LbCommand::BenchControl(a) => crate::bench_control::run(a),
        LbCommand::SamplePcap { out } => sample_pcap(&out),
        LbCommand::Decap { tun } => decap(&tun),
        LbCommand::Withdraw { config } => withdraw(&config),
        LbCommand::Soak(a) => soak(a),
        LbCommand::Demo {
            lbs,
            backends,
            requests,
            connections,
            format,
        } => {
            let stop = stop_flag()?;
            let opts = lab::demo::Options {
                lbs,
                backends,
                requests,
                connections,
                json: matches!(format, Format::Json),
            };
            let report = lab::demo::run(&opts, stop)?;
            let simulated = simulate_demo(&report)?;
            let mut fleet = serde_json::to_value(&report)?;
            fleet["simulated"] = serde_json::to_value(&simulated)?;
            if opts.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({ "fleet": fleet }))?
                );
            } else {
                println!("{}", simulated_table(&report, &simulated));
            }
            Ok(())
        }
        LbCommand::Status {
            api,
            token_file,
            format,
        } => status(api, token_file.as_deref(), format),
        LbCommand::Trace(a) => crate::tracer::run(a),
        LbCommand::QuicCid(a) => crate::quic_cid::run(a),
        LbCommand::Reload(a) => reload(a),
        LbCommand::Drain(a) => runtime_change(a, lbd::runtime::Change::Drain),
        LbCommand::Undrain(a) => runtime_change(a, lbd::runtime::Change::Undrain),
        LbCommand::Weight { target, weight } => {
            runtime_change(target, lbd::runtime::Change::Weight(weight))
        }
    }
}

fn status(
    apis: Vec<std::net::SocketAddr>,
    token_file: Option<&std::path::Path>,
    format: Format,
) -> anyhow::Result<()> {
    let token = token_file.map(lbd::http::read_token).transpose()?;
    let [api] = apis[..] else {
        return fleet_status(&apis, token.as_deref(), format);
    };
    let s = lbd::client::fetch_status_with(api, token.as_deref())?;
    emit(format, &s)
}

/// `fastpath lb status` with several APIs: the fleet table and verdict.
fn fleet_status(
    apis: &[std::net::SocketAddr],
    token: Option<&str>,
    format: Format,
) -> anyhow::Result<()> {
    let a = lbd::agreement::check(apis, token);
    emit(format, &a)?;
    if !a.agree {
        use std::io::Write;
        std::io::stdout().flush()?;
        std::process::exit(1);
    }
    Ok(())
}

/// The fleet simulator's prediction for the demo's fleet (`fastpath lb
/// fleet-sim`'s small case with the demo's sizes, backend names and table
/// size): what the measured figures are checked against.
fn simulate_demo(r: &lab::demo::FleetReport) -> anyhow::Result<bench::fleet_sim::SmallCase> {
    let spec = bench::fleet_sim::SmallCaseSpec {
        connections: r.lb_killed.connections,
        seed: 1,
        // The demo's backend change happens while load balancer 2 (the
        // middle next hop) is down.
        killed_lb: r.lb_and_backend_change.lb_down - 1,
        removed_backend: 0,
        backend_names: (1..=r.backends)
            .map(lab::topology::Topology::backend_address)
            .collect(),
        table_size: u64::from(maglev::DEFAULT_TABLE_SIZE),
    };
    Ok(bench::fleet_sim::small_case_with(&spec)?)
}

/// Measured against simulated, per fleet change.
fn simulated_table(r: &lab::demo::FleetReport, sim: &bench::fleet_sim::SmallCase) -> String {
    let mut t = measure::Table::new([
        "fleet change",
        "measured broken",
        "simulated broken (fleet-sim)",
    ])
    .title(format!(
        "The namespace fleet beside `fastpath lb fleet-sim` for the same sizes ({} connections):",
        sim.connections
    ));
    let c = &r.lb_and_backend_change;
    for (what, measured, p) in [
        ("lb killed", r.lb_killed.broken_connections, &sim.lb_killed),
        (
            "lb restored",
            r.lb_restored.broken_connections,
            &sim.lb_restored,
        ),
        (
            "rolling restart",
            r.rolling_restart.broken_connections,
            &sim.rolling_restart,
        ),
        (
            "backend removed, lb down",
            c.broken_connections,
            &sim.lb_and_backend_change,
        ),
    ] {
        t.row([
            what.to_string(),
            measured.to_string(),
            format!(
                "{} ({} on the removed backend, {} remapped)",
                p.broken, p.backend_gone, p.remapped
            ),
        ]);
    }
    t.to_string()
}
