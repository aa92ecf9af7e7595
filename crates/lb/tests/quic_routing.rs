//! A `quic` VIP through the datapath: datagrams whose connection ID carries
//! a backend's QUIC-LB server ID reach that backend from any client address
//! and port (a migrated client), and everything else takes the 5-tuple
//! fallback an ordinary UDP VIP uses, counted by reason. Connection IDs are
//! made by the server's encoder (`quic_lb`), the expected fallback by an
//! independent Maglev computation (`lb_sample::expected_backend`).

use std::net::IpAddr;
use std::sync::atomic::AtomicBool;

use lb::config::Config;
use lb::datapath::{Datapath, Params};
use lb::quic::Miss;
use lb::Control;
use maio::Hugepages;
use netio::mem::{MemPort, Vary};
use packet::build::Frame;
use packet::gre::decapsulate;
use packet::{flow, parse_frame};
use proptest::prelude::*;

use lb_sample::{expected_backend, ip};

const KEY: &str = "8f95f09245765f80256934e50c66207f";

fn config() -> Config {
    let text = format!(
        r#"
[encap]
source = "10.0.0.1"
gateway_mac = "02:00:00:00:00:fe"

[[quic_lb]]
codepoint = 1
server_id_len = 2
nonce_len = 6
key = "{KEY}"

[[pools]]
name = "h3"
table_size = 251
backends = [
  {{ address = "10.1.0.1", quic_server_id = "0001" }},
  {{ address = "10.1.0.2", quic_server_id = "0002" }},
  {{ address = "10.1.0.3", quic_server_id = "0003" }},
]

[[vips]]
name = "h3"
address = "198.18.0.10"
port = 443
protocol = "udp"
quic = true
pool = "h3"
"#
    );
    Config::parse(&text, "quic.toml").expect("valid")
}

fn encoder() -> quic_lb::Config {
    let key: [u8; 16] = (0..16)
        .map(|i| u8::from_str_radix(&KEY[2 * i..2 * i + 2], 16).expect("hex"))
        .collect::<Vec<u8>>()
        .try_into()
        .expect("16");
    quic_lb::Config::new(1, 2, 6, Some(key), false).expect("valid")
}

/// A short-header datagram to the VIP with `cid`.
fn short(src: IpAddr, sport: u16, cid: &[u8]) -> Vec<u8> {
    let mut payload = vec![0x40];
    payload.extend_from_slice(cid);
    payload.extend_from_slice(&[0xab; 40]);
    Frame::udp(src, ip("198.18.0.10"), sport, 443, &payload).to_bytes()
}

/// A client's Initial: long header, a DCID the client chose.
fn initial(src: IpAddr, sport: u16, dcid: &[u8]) -> Vec<u8> {
    let mut payload = vec![0xc3, 0, 0, 0, 1, dcid.len() as u8];
    payload.extend_from_slice(dcid);
    payload.extend_from_slice(&[0, 0, 0x40, 0x10]);
    payload.extend_from_slice(&[0; 64]);
    Frame::udp(src, ip("198.18.0.10"), sport, 443, &payload).to_bytes()
}

/// Runs `frames` through the datapath inline; the backend each reached, in
/// the order of `frames` (outputs are matched to inputs by their inner
/// packet: the datapath may reorder), and the counters.
fn run(
    control: &Control,
    cfg: &Config,
    frames: Vec<Vec<u8>>,
) -> (Vec<Option<IpAddr>>, lb::counters::Counters) {
    let mut params = Params::from_config(cfg);
    params.hugepages = Hugepages::Auto;
    let dp = Datapath::new(params, control.tables()).expect("datapath");
    let inner_of = |f: &[u8]| {
        let p = parse_frame(f).expect("parse");
        f[p.l3_offset..p.l3_offset + p.l3_len].to_vec()
    };
    let keys: Vec<Vec<u8>> = frames.iter().map(|f| inner_of(f)).collect();
    let n = frames.len() as u64;
    let mut port = MemPort::new(frames, Vary::None, Some(n)).capture();
    let stats = dp.run(&mut port, &AtomicBool::new(false)).expect("run");
    let out = port.captured.take().expect("captured");
    let mut reached = std::collections::HashMap::new();
    for f in &out {
        let d = decapsulate(f).expect("GRE");
        reached.insert(f[d.inner.clone()].to_vec(), flow::to_ip(&d.outer_dst));
    }
    let backends = keys.iter().map(|k| reached.get(k).copied()).collect();
    (backends, stats.counters)
}

fn client(i: u32) -> IpAddr {
    IpAddr::from([198, 19, (i >> 8) as u8, i as u8])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Every datagram whose connection ID names a backend reaches it, from
    /// whatever address and port: where the 5-tuple alone would have sent
    /// about two thirds of them elsewhere.
    #[test]
    fn routable_connection_ids_reach_their_server_from_any_address(
        picks in proptest::collection::vec((0u8..3, any::<u16>(), 1024u16.., any::<[u8; 6]>()), 32..96),
    ) {
        let cfg = config();
        let control = Control::new(cfg.clone()).expect("control");
        let enc = encoder();
        let mut frames = Vec::new();
        let mut want = Vec::new();
        let mut tuple_would_differ = 0;
        for &(server, host, sport, nonce) in &picks {
            let cid = enc.encode(&[0, server + 1], &nonce, 0).expect("encode");
            let src = client(u32::from(host));
            let frame = short(src, sport, cid.as_bytes());
            let target = ip(&format!("10.1.0.{}", server + 1));
            let by_tuple = expected_backend(&cfg, "h3", &parse_frame(&frame).expect("parse").flow);
            tuple_would_differ += usize::from(by_tuple != Some(target));
            frames.push(frame);
            want.push(Some(target));
        }
        let (got, c) = run(&control, &cfg, frames);
        prop_assert_eq!(&got, &want);
        prop_assert_eq!(c.quic_routed, picks.len() as u64);
        prop_assert_eq!(c.quic_miss.iter().sum::<u64>(), 0);
        // Not a coincidence of the hash: most would have gone elsewhere.
        prop_assert!(tuple_would_differ * 3 >= picks.len(), "{tuple_would_differ} of {}", picks.len());
    }
}

#[test]
fn what_does_not_route_takes_the_5_tuple_and_is_counted_by_reason() {
    let cfg = config();
    let mut control = Control::new(cfg.clone()).expect("control");
    let enc = encoder();
    let mut frames = Vec::new();
    let mut want = Vec::new();
    let tuple =
        |frame: &[u8]| expected_backend(&cfg, "h3", &parse_frame(frame).expect("parse").flow);
    // Clients' Initials (DCIDs of their own choosing: codepoint 0, none
    // configured), a reserved codepoint, a short datagram, a server ID no
    // backend has.
    for i in 0..40u32 {
        let f = initial(
            client(i),
            2000 + i as u16,
            &[0x10, 1, 2, 3, 4, 5, 6, i as u8],
        );
        want.push(tuple(&f));
        frames.push(f);
    }
    let reserved = short(client(50), 5000, &[0xe0, 1, 2, 3, 4, 5, 6, 7, 8]);
    want.push(tuple(&reserved));
    frames.push(reserved);
    let stub = Frame::udp(client(51), ip("198.18.0.10"), 5001, 443, &[0x40, 0x20, 1]).to_bytes();
    want.push(tuple(&stub));
    frames.push(stub);
    let nobody = short(
        client(52),
        5002,
        enc.encode(&[0, 9], &[1; 6], 0).expect("e").as_bytes(),
    );
    want.push(tuple(&nobody));
    frames.push(nobody);
    let (got, c) = run(&control, &cfg, frames);
    assert_eq!(got, want);
    assert_eq!(c.quic_routed, 0);
    assert_eq!(c.quic_miss[Miss::NoConfig.index()], 40);
    assert_eq!(c.quic_miss[Miss::Reserved.index()], 1);
    assert_eq!(c.quic_miss[Miss::TooShort.index()], 1);
    assert_eq!(c.quic_miss[Miss::UnknownServerId.index()], 1);

    // A backend that is down: its connection IDs take the fallback (the
    // table no longer holds it), counted; a drained one keeps them.
    assert!(control.set_health("10.1.0.2", false));
    let frames: Vec<Vec<u8>> = (0..30u32)
        .map(|i| {
            short(
                client(100 + i),
                7000 + i as u16,
                enc.encode(&[0, 2], &[i as u8; 6], 0).expect("e").as_bytes(),
            )
        })
        .collect();
    let (got, c) = run(&control, &cfg, frames);
    assert_eq!(c.quic_server_down, 30);
    assert!(
        got.iter()
            .all(|b| b.is_some() && *b != Some(ip("10.1.0.2"))),
        "{got:?}"
    );
}

#[test]
fn a_udp_vip_without_quic_never_reads_connection_ids() {
    let mut cfg = config();
    cfg.vips[0].quic = false;
    let control = Control::new(cfg.clone()).expect("control");
    let enc = encoder();
    let frames: Vec<Vec<u8>> = (0..30u32)
        .map(|i| {
            short(
                client(i),
                3000 + i as u16,
                enc.encode(&[0, 1], &[i as u8; 6], 0).expect("e").as_bytes(),
            )
        })
        .collect();
    let want: Vec<Option<IpAddr>> = frames
        .iter()
        .map(|f| expected_backend(&cfg, "h3", &parse_frame(f).expect("parse").flow))
        .collect();
    let (got, c) = run(&control, &cfg, frames);
    assert_eq!(got, want);
    assert_eq!((c.quic_routed, c.quic_miss.iter().sum::<u64>()), (0, 0));
}
