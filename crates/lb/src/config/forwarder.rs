//! `[forwarder]`: the packet I/O driver, the packet threads, their batches,
//! queues and packet pool, and the fragment tables.

use serde::{Deserialize, Serialize};

use super::{problem, Config, Problem, MAX_DURATION_MS};

/// The deepest `[forwarder] queue_size`: 65,536 packets (128 MiB of 2 KiB
/// buffers behind each queue); deeper queues only add delay.
pub const MAX_QUEUE_SIZE: usize = 1 << 16;

/// The largest `[forwarder] pool_buffers`: 4,194,304 buffers (8 GiB).
pub const MAX_POOL_BUFFERS: u32 = 1 << 22;

/// The fewest buffers a pool sized by the thread count gets
/// ([`Forwarder::pool_buffers`] without `pool_buffers` in the file).
pub const DEFAULT_POOL_BUFFERS: u32 = 8192;

/// The largest `[forwarder] frag_table_size` per packet thread: 1,048,576
/// datagrams being reassembled.
pub const MAX_FRAG_TABLE_SIZE: usize = 1 << 20;

/// The longest `[forwarder] batch_timeout_us`: one second, TCP's shortest
/// retransmission timeout; a packet held longer would be sent again.
pub const MAX_BATCH_TIMEOUT_US: u64 = 1_000_000;

/// Packet I/O driver for `lb run --interface`: `[forwarder] driver` in
/// the file, `--driver` on the command line (which overrides it). The
/// names are the same in both places: `auto`, `af-xdp`, `xdp` (the
/// forwarder's XDP part is [`crate::xdp`]), `af-packet`. The variants'
/// comments are also the command line's help for each value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Driver {
    /// AF_XDP if it can be had (our XDP program, native or generic), else
    /// AF_PACKET; says which and why.
    #[default]
    Auto,
    /// AF_XDP only: our XDP program steers VIP frames into the pool's
    /// buffers, the rest goes on to the kernel.
    AfXdp,
    /// The load balancer in the driver: TCP and UDP to exactly matched
    /// VIPs, over IPv4 without options and IPv6 without extension headers,
    /// forwarded by an XDP program (XDP_TX, no copy, no socket), everything
    /// else (fragments, ICMP, extension headers, prefix-group VIPs, probes)
    /// through AF_XDP to the packet threads. Same backends, same bytes.
    Xdp,
    /// AF_PACKET only, with a TPACKET_V3 receive ring.
    AfPacket,
}

/// `[forwarder]`.
///
/// ```toml
/// [forwarder]
/// driver = "auto"          # on an interface: "auto" (AF_XDP, else AF_PACKET), "af-xdp",
///                          # "xdp" (TCP/UDP in the driver, the rest AF_XDP), "af-packet"
/// threads = 2              # packet threads (0: process in the I/O thread)
/// batch = 32               # packets per batch
/// batch_timeout_us = 50    # a partial batch is handed over after this long
/// queue_size = 1024        # per-thread receive and transmit queues
/// # pool_buffers = 8192    # packet pool size (2 KiB buffers); default: what the
///                          # queues of `threads` packet threads hold, at least 8192
/// frag_table_size = 1024   # datagrams being reassembled, per packet thread
/// frag_timeout_ms = 1000   # how long a fragment waits for its first fragment
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Forwarder {
    /// Packet I/O driver on an interface: "auto", "af-xdp", "xdp" or
    /// "af-packet".
    pub driver: Driver,
    /// Packet threads; 0 processes packets in the I/O thread.
    pub threads: usize,
    /// Packets per batch.
    pub batch: usize,
    /// Microseconds after which a partial batch is handed over: 1 to
    /// [`MAX_BATCH_TIMEOUT_US`].
    pub batch_timeout_us: u64,
    /// Per-thread queue size (a power of two).
    pub queue_size: usize,
    /// Packet pool buffers as written in the file; none (the default):
    /// sized by the thread count ([`Forwarder::pool_buffers`]). A value
    /// given must fill the queues of `threads` packet threads.
    pub pool_buffers: Option<u32>,
    /// Fragment table entries per packet thread.
    pub frag_table_size: usize,
    /// Milliseconds a fragment waits for its datagram's first fragment: 1
    /// to a day.
    pub frag_timeout_ms: u64,
}

impl Default for Forwarder {
    fn default() -> Self {
        Forwarder {
            driver: Driver::Auto,
            threads: 2,
            batch: 32,
            batch_timeout_us: 50,
            queue_size: 1024,
            pool_buffers: None,
            frag_table_size: 1024,
            frag_timeout_ms: 1000,
        }
    }
}

impl Forwarder {
    /// The buffers the datapath's rings and queues hold when full with
    /// `threads` packet threads: a receive and a transmit queue each, the
    /// I/O loop's receive ring (two queues deep) and its transmit ring (two
    /// queues deep per thread, counted with the threads' queues here, as
    /// it only holds what they emptied). A pool smaller than this would
    /// make steering wait for buffers the queues keep.
    pub fn needed_buffers(&self) -> u64 {
        (self.queue_size as u64).saturating_mul(2 * self.threads.max(1) as u64 + 2)
    }

    /// The pool's size: `pool_buffers` as written, else what the queues
    /// of the thread count need ([`Forwarder::needed_buffers`]), at least
    /// [`DEFAULT_POOL_BUFFERS`] (at most [`MAX_POOL_BUFFERS`], which
    /// validation makes sure is enough).
    pub fn pool_buffers(&self) -> u32 {
        self.pool_buffers.unwrap_or_else(|| {
            self.needed_buffers()
                .clamp(u64::from(DEFAULT_POOL_BUFFERS), u64::from(MAX_POOL_BUFFERS))
                as u32
        })
    }
}

impl Config {
    /// `[forwarder]`: thread count, batch, queue and pool sizes, waits.
    pub(super) fn check_forwarder(&self) -> Result<(), Problem> {
        let f = &self.forwarder;
        // The XDP program steers VIP addresses and the prefix groups'
        // prefixes, the latter in a trie of a fixed size: a configuration
        // with more prefixes than it holds would be refused by the daemon
        // at start (`auto` would fall back to AF_PACKET), so it is refused
        // here.
        if matches!(f.driver, Driver::AfXdp | Driver::Xdp) {
            let prefixes = self.steered_prefixes();
            if prefixes > netio::afxdp::MAX_VIP_PREFIXES {
                return problem(
                    "forwarder.driver".into(),
                    format!(
                        "\"{}\" steers at most {} prefix-group prefixes (the XDP program's \
                         trie), and the prefix groups have {prefixes}; use driver = \
                         \"af-packet\" or \"auto\"",
                        if f.driver == Driver::Xdp {
                            "xdp"
                        } else {
                            "af-xdp"
                        },
                        netio::afxdp::MAX_VIP_PREFIXES
                    ),
                );
            }
        }
        if f.threads > 64 {
            return problem(
                "forwarder.threads".into(),
                format!("{} is too many; expected 0 to 64", f.threads),
            );
        }
        if f.batch == 0 || f.batch > 1024 {
            return problem(
                "forwarder.batch".into(),
                format!("{} is out of range; expected 1 to 1024", f.batch),
            );
        }
        if f.batch_timeout_us == 0 || f.batch_timeout_us > MAX_BATCH_TIMEOUT_US {
            return problem(
                "forwarder.batch_timeout_us".into(),
                format!(
                    "{} is out of range: expected at least 1 (0 would hand over every partial \
                     batch at once, a wake-up per packet) and at most {MAX_BATCH_TIMEOUT_US} \
                     (one second: a packet held longer would be retransmitted); the default is 50",
                    f.batch_timeout_us
                ),
            );
        }
        if !f.queue_size.is_power_of_two()
            || f.queue_size < f.batch
            || f.queue_size > MAX_QUEUE_SIZE
        {
            return problem(
                "forwarder.queue_size".into(),
                format!(
                    "{} must be a power of two of at least forwarder.batch ({}) and at most \
                     {MAX_QUEUE_SIZE}",
                    f.queue_size, f.batch
                ),
            );
        }
        // Both bounded above: no overflow.
        let needed = f.needed_buffers();
        match f.pool_buffers {
            Some(b) if b > MAX_POOL_BUFFERS => {
                return problem(
                    "forwarder.pool_buffers".into(),
                    format!("{b} is more than the most, {MAX_POOL_BUFFERS}"),
                )
            }
            Some(b) if u64::from(b) < needed => {
                return problem(
                    "forwarder.pool_buffers".into(),
                    format!(
                        "{b} cannot fill the queues of {} packet thread(s): expected at least \
                         {needed} (queue_size {} x (2 x {} + 2)); raise it, or leave it out to \
                         size the pool by the thread count",
                        f.threads,
                        f.queue_size,
                        f.threads.max(1)
                    ),
                )
            }
            None if needed > u64::from(MAX_POOL_BUFFERS) => {
                return problem(
                    "forwarder.queue_size".into(),
                    format!(
                        "{} for {} packet thread(s) needs a pool of {needed} buffers, more than \
                         the most ({MAX_POOL_BUFFERS}); use a smaller queue_size",
                        f.queue_size, f.threads
                    ),
                )
            }
            _ => {}
        }
        if f.frag_table_size == 0 || f.frag_table_size > MAX_FRAG_TABLE_SIZE {
            return problem(
                "forwarder.frag_table_size".into(),
                format!(
                    "{} is out of range; expected 1 to {MAX_FRAG_TABLE_SIZE}",
                    f.frag_table_size
                ),
            );
        }
        if f.frag_timeout_ms == 0 || f.frag_timeout_ms > MAX_DURATION_MS {
            return problem(
                "forwarder.frag_timeout_ms".into(),
                format!(
                    "{} is out of range: expected at least 1 (0 would expire every fragment \
                     before the next one arrives) and at most a day ({MAX_DURATION_MS} ms); \
                     the default is 1000",
                    f.frag_timeout_ms
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::*;
    use crate::config::*;

    #[test]
    fn driver_key() {
        let c = Config::parse(
            &GOOD.replace("[encap]", "[forwarder]\ndriver = \"af-packet\"\n[encap]"),
            "t",
        )
        .unwrap();
        assert_eq!(c.forwarder.driver, Driver::AfPacket);
        assert_eq!(
            Config::parse(GOOD, "t").unwrap().forwarder.driver,
            Driver::Auto
        );
        let e = err(&GOOD.replace("[encap]", "[forwarder]\ndriver = \"dpdk\"\n[encap]"));
        assert!(
            e.problem.contains("dpdk") && e.problem.contains("af-xdp"),
            "{e}"
        );
    }

    /// Every driver serves prefix-group VIPs (the XDP program steers the
    /// groups' prefixes); with more prefixes than its trie holds, the XDP
    /// drivers are refused here as the daemon would refuse them at start.
    #[test]
    fn xdp_drivers_take_prefix_group_vips_up_to_the_steering_trie() {
        let groups = |prefixes: &str| {
            format!(
                "[[prefix_groups]]\nname = \"g\"\nprefixes = [{prefixes}]\n\
                 cluster_prefix_len = 28\n[[vips]]\nname = \"svc\"\nprefix_group = \"g\"\n\
                 suffix = \"0.0.0.1\"\nport = 443\nprotocol = \"tcp\"\npool = \"web\"\n"
            )
        };
        let with = |driver: &str, prefixes: &str| {
            format!("{GOOD}\n{}", groups(prefixes)).replace(
                "[encap]",
                &format!("[forwarder]\ndriver = \"{driver}\"\n[encap]"),
            )
        };
        let many = |n: usize| {
            (0..n)
                .map(|i| format!("\"74.{}.{}.0/24\"", i / 256, i % 256))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let most = netio::afxdp::MAX_VIP_PREFIXES;
        for d in ["af-xdp", "xdp", "auto", "af-packet"] {
            Config::parse(&with(d, "\"74.125.0.0/16\""), "t").unwrap();
            Config::parse(&with(d, &many(most)), "t").unwrap();
        }
        for d in ["af-xdp", "xdp"] {
            let e = err(&with(d, &many(most + 1)));
            assert_eq!(e.key, "forwarder.driver", "{e}");
            assert!(e.problem.contains(&format!("have {}", most + 1)), "{e}");
        }
        for d in ["auto", "af-packet"] {
            Config::parse(&with(d, &many(most + 1)), "t").unwrap();
        }
    }

    /// Any thread count from 0 to 64 starts with the default sizes: the
    /// pool follows the count. A pool written in the file is kept, and
    /// must hold the queues of the count, whether the file or `--threads`
    /// sets it; the refusal says what would.
    #[test]
    fn the_pool_follows_the_thread_count() {
        let with = |forwarder: &str| {
            GOOD.replace("[encap]", &format!("[forwarder]\n{forwarder}\n[encap]"))
        };
        let mut last = 0;
        for threads in 0..=64usize {
            let c = Config::parse(&with(&format!("threads = {threads}")), "t").unwrap();
            let f = &c.forwarder;
            assert_eq!(f.pool_buffers, None);
            assert!(
                u64::from(f.pool_buffers()) >= f.needed_buffers(),
                "{threads}"
            );
            assert!(f.pool_buffers() >= DEFAULT_POOL_BUFFERS && f.pool_buffers() >= last);
            last = f.pool_buffers();
        }
        assert_eq!(last, 1024 * 130);
        let e = err(&with("threads = 8\npool_buffers = 16384"));
        assert_eq!(e.key, "forwarder.pool_buffers");
        assert!(
            e.problem.contains("at least 18432") && e.problem.contains("8 packet thread"),
            "{e}"
        );
        let c = Config::parse(&with("threads = 2\npool_buffers = 100000"), "t").unwrap();
        assert_eq!(c.forwarder.pool_buffers(), 100_000);
        // The deepest queues for 64 threads would need more than a pool
        // may hold: the queue size is what to change.
        let e = err(&with("threads = 64\nqueue_size = 65536"));
        assert_eq!(e.key, "forwarder.queue_size", "{e}");

        let dir = Scratch::new("threads");
        let file = dir.write("lb.toml", GOOD);
        let name = file.display().to_string();
        let checked = Config::load(&file)
            .unwrap()
            .with_threads(32, &name)
            .unwrap();
        assert_eq!(checked.config.forwarder.threads, 32);
        assert_eq!(checked.config.forwarder.pool_buffers(), 1024 * 66);
        assert_eq!(
            checked.memory.parts[0].bytes,
            1024 * 66 * (2048 + 1),
            "the memory is estimated for the new count"
        );
        let file = dir.write("small.toml", &with("pool_buffers = 8192"));
        let e = Config::load(&file)
            .unwrap()
            .with_threads(32, &name)
            .unwrap_err();
        assert_eq!(e.key, "forwarder.pool_buffers");
        assert!(
            e.problem.contains("32 packet thread") && e.problem.contains("--threads 32"),
            "{e}"
        );
    }
}
