//! Frames for a VIP that no honest sender sends (martian sources, a VIP's
//! own address as the source, TTL or hop limit 0: `common/hostile.rs`
//! says which, from the RFCs) are dropped by the packet thread and counted
//! by reason; the frames beside them are forwarded. The XDP program is
//! held to the same frames in `sys_xdp.rs` (as root).

mod common;
#[path = "common/hostile.rs"]
mod hostile;

use lb::config::Config;
use lb::conntrack::Conntrack;
use lb::counters::DropReason;
use lb::frag::FragTable;
use lb::worker::Worker;
use lb::{Control, Mode};
use maio::{Hugepages, Pool};

fn setup() -> (Control, Worker, Pool) {
    let cfg = Config::parse(lb_sample::CONFIG, "test").unwrap();
    let control = Control::new(cfg).unwrap();
    let pool = Pool::new(maio::Config {
        buffers: 64,
        buf_size: 2048,
        hugepages: Hugepages::Never,
        magazine_depth: 16,
    })
    .unwrap();
    let worker = Worker::new(
        &pool,
        Mode::Maglev,
        Conntrack::new(1024, 60_000, 30_000),
        FragTable::new(64, 10_000),
    );
    (control, worker, pool)
}

/// Runs `frame` through the worker: whether it sent it, and the drop
/// counter that rose (if one did).
fn run(control: &Control, w: &mut Worker, pool: &Pool, frame: &[u8]) -> (bool, Option<String>) {
    let before = w.counters.drops.clone();
    let mut h = pool.handle();
    let mut batch = vec![common::packet(pool, &mut h, frame)];
    let mut out = Vec::new();
    w.process(&control.tables().load(), &mut batch, &mut out, 1);
    let sent = !out.is_empty();
    for p in out {
        h.free(p.buf).unwrap();
    }
    let rose = (0..before.len())
        .find(|&i| w.counters.drops[i] > before[i])
        .map(|i| DropReason::name_of(i).to_string());
    (sent, rose)
}

#[test]
fn martian_sources_vip_sources_and_ttl_zero_are_dropped_by_reason() {
    let (control, mut w, pool) = setup();
    let frames = hostile::frames();
    assert!(frames.len() >= 40);
    for f in &frames {
        let (sent, rose) = run(&control, &mut w, &pool, &f.frame);
        match f.drop {
            Some(why) => {
                assert!(!sent, "{} was forwarded", f.what);
                assert_eq!(rose.as_deref(), Some(why), "{}", f.what);
            }
            None => assert!(sent && rose.is_none(), "{}: dropped as {rose:?}", f.what),
        }
    }
    let c = &w.counters;
    assert_eq!(c.rx, frames.len() as u64);
    assert_eq!(c.rx, c.tx + c.dropped());
}

/// A fragment carries its source and TTL in every piece: a martian first
/// fragment, or one of TTL 0, is dropped as a whole frame would be.
#[test]
fn fragments_are_held_to_the_same_rules() {
    let (control, mut w, pool) = setup();
    for (src, ttl, why) in [
        ("127.0.0.1", 64, "martian_source"),
        ("192.0.2.53", 64, "source_is_vip"),
        ("198.51.100.7", 0, "ttl_zero"),
    ] {
        let f = hostile::frame_with(src, "192.0.2.80", true, ttl, true);
        assert!(packet::parse_frame(&f).unwrap().fragment.is_some());
        let (sent, rose) = run(&control, &mut w, &pool, &f);
        assert!(!sent, "fragment from {src} ttl {ttl} forwarded");
        assert_eq!(rose.as_deref(), Some(why), "fragment from {src} ttl {ttl}");
    }
    let ok = hostile::frame_with("198.51.100.7", "192.0.2.80", true, 1, true);
    assert_eq!(run(&control, &mut w, &pool, &ok), (true, None));
}

/// Not for a VIP, a martian is not the load balancer's traffic: it stays
/// counted as such (`no_vip`), apart from drops.
#[test]
fn a_martian_for_no_vip_stays_not_for_a_vip() {
    let (control, mut w, pool) = setup();
    let f = hostile::frame("127.0.0.1", "198.51.100.9", true, 64);
    assert_eq!(
        run(&control, &mut w, &pool, &f),
        (false, Some("no_vip".to_string()))
    );
}
