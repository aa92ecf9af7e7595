//! Where a forwarded packet's time goes: each stage of the packet threads'
//! work on the non-SYN traffic of [`crate::forwarder`] (4,096 established
//! flows to one TCP VIP over 8 backends, IPv4 or IPv6), timed on its own in a loop over
//! the same frames, with the library's own functions: parsing, the flow
//! hash, the VIP match, the connection table's hit, Maglev's pick (what a
//! miss adds), the partial-checksum check and the GRE encapsulation. Their
//! sum is set beside what the forwarder costs above the null forwarder in
//! the same run, so that a regression names its stage, and what no stage
//! explains (the batch loop, counters, the pipeline's queues) shows as the
//! rest.

use std::hint::black_box;
use std::time::Instant;

use lb::conntrack::{Conntrack, Entry};
use lb::tables::Control;
use packet::checksum::complete_partial;
use packet::gre::encapsulate_templated;
use packet::parse_frame;
use serde::Serialize;

use crate::forwarder::{config, templates, v6_config, Error};

/// One stage's cost.
#[derive(Debug, Clone, Serialize)]
pub struct Stage {
    /// Its name (`parse`, `flow_hash`, `vip_match`, `conntrack_hit`,
    /// `maglev_pick`, `checksum_check`, `encapsulate`).
    pub stage: String,
    /// Nanoseconds per packet, the median of the rounds.
    pub ns: f64,
}

/// Each stage's nanoseconds per packet, one thread, on the CPU it ran.
#[derive(Debug, Clone, Serialize)]
pub struct Stages {
    /// Per stage, in the order a packet meets them.
    pub stages: Vec<Stage>,
    /// The sum of the stages the forwarder adds to the null forwarder's
    /// work: all but `parse` (the null forwarder parses too) and
    /// `maglev_pick` (the non-SYN traffic hits the connection table).
    pub sum_ns: f64,
    /// The CPU the stages were timed on (`/proc/cpuinfo`'s model name).
    pub cpu: String,
}

/// Rounds of every stage over the 4,096 frames; the median round counts.
const ROUNDS: usize = 15;

/// Times each stage over the frames of `kind` (`non_syn` or `non_syn_v6`),
/// `ROUNDS` times, on the calling thread.
pub fn measure(kind: &str) -> Result<Stages, Error> {
    let cfg = if kind.ends_with("_v6") {
        v6_config()?
    } else {
        config()?
    };
    let control = Control::new(cfg.clone()).map_err(Error::Config)?;
    let tables = control.tables().load_full();
    let (frames, _) = templates(kind);
    let parsed: Vec<_> = frames.iter().filter_map(|f| parse_frame(f).ok()).collect();
    let n = parsed.len().max(1) as f64;
    let hashes: Vec<u64> = parsed
        .iter()
        .map(|p| lb::worker::flow_hash(&p.flow))
        .collect();
    let vip = &tables.vips[0];
    let mut ct = Conntrack::new(cfg.conntrack.size, 60_000, 60_000);
    for (p, &h) in parsed.iter().zip(&hashes) {
        let backend = vip.pick(h).unwrap_or(0);
        ct.insert(&p.flow, h, Entry { vip: 0, backend }, 1);
    }
    let template = tables.backends.iter().find_map(|b| b.template.clone());
    // Frames with headroom for the outer headers, encapsulated again and
    // again in place (only the headers in front of the packet change).
    const ROOM: usize = 64;
    let mut bufs: Vec<Vec<u8>> = frames
        .iter()
        .map(|f| {
            let mut b = vec![0u8; ROOM];
            b.extend_from_slice(f);
            b
        })
        .collect();
    let time = |f: &mut dyn FnMut() -> u64| -> f64 {
        let mut rounds: Vec<f64> = (0..ROUNDS)
            .map(|_| {
                let t = Instant::now();
                black_box(f());
                t.elapsed().as_nanos() as f64 / n
            })
            .collect();
        measure::median(&mut rounds)
    };
    let mut stages = Vec::new();
    let mut add = |name: &str, ns: f64| {
        stages.push(Stage {
            stage: name.to_string(),
            ns,
        })
    };
    add(
        "parse",
        time(&mut || {
            frames
                .iter()
                .map(|f| parse_frame(black_box(f)).map_or(0, |p| p.l3_len as u64))
                .sum()
        }),
    );
    add(
        "flow_hash",
        time(&mut || {
            parsed
                .iter()
                .map(|p| lb::worker::flow_hash(black_box(&p.flow)))
                .fold(0, u64::wrapping_add)
        }),
    );
    add(
        "vip_match",
        time(&mut || {
            parsed
                .iter()
                .filter_map(|p| {
                    let f = black_box(&p.flow);
                    tables.matcher.lookup(&f.dst, f.dst_port, f.proto)
                })
                .map(u64::from)
                .sum()
        }),
    );
    add(
        "conntrack_hit",
        time(&mut || {
            parsed
                .iter()
                .zip(&hashes)
                .filter_map(|(p, &h)| ct.lookup(black_box(&p.flow), h, 2))
                .map(|e| u64::from(e.backend))
                .sum()
        }),
    );
    add(
        "maglev_pick",
        time(&mut || {
            hashes
                .iter()
                .filter_map(|&h| vip.pick(black_box(h)))
                .map(u64::from)
                .sum()
        }),
    );
    add(
        "checksum_check",
        time(&mut || {
            bufs.iter_mut()
                .zip(&parsed)
                .map(|(b, p)| complete_partial(black_box(&mut b[ROOM..]), p) as u64)
                .sum()
        }),
    );
    if let Some(t) = &template {
        add(
            "encapsulate",
            time(&mut || {
                bufs.iter_mut()
                    .zip(&parsed)
                    .zip(&hashes)
                    .filter_map(|((b, p), &h)| encapsulate_templated(b, ROOM, p, t, h).ok())
                    .map(|r| r.start as u64)
                    .sum()
            }),
        );
    }
    let sum_ns = stages
        .iter()
        .filter(|s| s.stage != "maglev_pick" && s.stage != "parse")
        .map(|s| s.ns)
        .sum();
    Ok(Stages {
        stages,
        sum_ns,
        cpu: crate::proc::cpu_model(),
    })
}
