//! Parse a frame, rewrite it in place, tunnel it in GRE and take it apart
//! again: what a load balancer does to every packet, with this crate's views
//! (zero-copy, over the frame's bytes) and reprs (plain structs).
//!
//! ```sh
//! cargo run -p packet --example rewrite
//! ```

use std::error::Error;
use std::net::Ipv4Addr;

use packet::build::Frame;
use packet::checksum::pseudo_v4;
use packet::ethernet::EthernetFrame;
use packet::flow::{mapped, to_ip};
use packet::gre::{self, Outer};
use packet::ipv4::{Ipv4Packet, Ipv4Repr};
use packet::parse::parse_packet;
use packet::tcp::{self, TcpPacket, TcpRepr};
use packet::{ethertype, parse_frame, proto};

const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 80);
const BACKEND: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 5);
const LB: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

fn main() -> Result<(), Box<dyn Error>> {
    // A client's TCP segment to a virtual IP, built from reprs: lengths and
    // checksums are filled in. (A capture or a NIC would hand us the bytes.)
    let payload = b"GET / HTTP/1.1\r\nHost: example\r\n\r\n";
    let mut frame = Frame::tcp(
        CLIENT.into(),
        VIP.into(),
        40_000,
        80,
        tcp::flags::PSH | tcp::flags::ACK,
        payload,
    )
    .to_bytes();

    // The forwarder's one-pass parse: offsets, TTL and the 5-tuple, read in
    // place. Malformed input is an error naming the reason, never a panic.
    let p = parse_frame(&frame)?;
    println!(
        "parsed {} bytes: {}:{} -> {}:{} proto {} ttl {}, IP at {}, TCP at {}",
        frame.len(),
        to_ip(&p.flow.src),
        p.flow.src_port,
        to_ip(&p.flow.dst),
        p.flow.dst_port,
        p.flow.proto,
        p.ttl,
        p.l3_offset,
        p.l4_offset
    );
    assert_eq!((p.flow.proto, p.ttl, p.flow.dst_port), (proto::TCP, 64, 80));

    // Rewrite in place through the views, as a NAT would: one hop less,
    // and the backend's address instead of the VIP. The IPv4 header
    // checksum covers the header; TCP's covers a pseudo-header with both
    // addresses, so it must be recomputed too.
    {
        let mut eth = EthernetFrame::new_checked(&mut frame[..])?;
        let mut ip = Ipv4Packet::new_checked(eth.payload_mut())?;
        ip.set_ttl(ip.ttl() - 1);
        ip.set_dst(BACKEND.octets());
        ip.fill_checksum();
        let (src, dst) = (ip.src(), ip.dst());
        let len = ip.payload().len();
        let mut seg = TcpPacket::new_checked(ip.payload_mut())?;
        seg.fill_checksum(pseudo_v4(src, dst, proto::TCP, u16::try_from(len)?));
    }

    // Read it back as reprs and check both checksums.
    let eth = EthernetFrame::new_checked(&frame[..])?;
    let ip = Ipv4Packet::new_checked(eth.payload())?;
    let seg = TcpPacket::new_checked(ip.payload())?;
    let ip_repr = Ipv4Repr::parse(&ip);
    let tcp_repr = TcpRepr::parse(&seg);
    println!(
        "rewritten: {} -> {} ttl {}, {} payload bytes",
        Ipv4Addr::from(ip_repr.src),
        Ipv4Addr::from(ip_repr.dst),
        ip_repr.ttl,
        tcp_repr.payload.len()
    );
    assert!(ip.checksum_ok(), "IPv4 header checksum");
    let seg_len = u16::try_from(ip.payload().len())?;
    let pseudo = pseudo_v4(ip_repr.src, ip_repr.dst, proto::TCP, seg_len);
    assert!(seg.checksum_ok(pseudo), "TCP checksum");
    assert_eq!((ip_repr.dst, ip_repr.ttl), (BACKEND.octets(), 63));
    assert_eq!(tcp_repr.payload, payload);
    let inner_ip = ip.into_inner().to_vec();

    // Now tunnel it, as Maglev forwards to a backend: GRE over IPv4 from
    // the load balancer. The outer headers are written into headroom in
    // front of the packet; the packet itself is not copied.
    let headroom = gre::overhead_keyed(true);
    let mut buf = vec![0u8; headroom + frame.len()];
    buf[headroom..].copy_from_slice(&frame);
    let p = parse_frame(&buf[headroom..])?;
    let outer = Outer {
        eth_src: [0x02, 0, 0, 0, 0, 0x10],
        eth_dst: [0x02, 0, 0, 0, 0, 0x20],
        src: mapped(LB.octets()),
        dst: mapped(BACKEND.octets()),
        ttl: 64,
    };
    let flow_hash = p.flow.hash(0);
    let key = gre::Spread::key(flow_hash);
    let range = gre::encapsulate_keyed(&mut buf, headroom, &p, &outer, flow_hash, Some(key))?;
    let tunnelled = &buf[range];
    println!(
        "encapsulated: {} bytes ({} of outer Ethernet, IPv4 and keyed GRE), key {key:#010x}",
        tunnelled.len(),
        tunnelled.len() - inner_ip.len()
    );

    // The backend's side: the outer frame parses as GRE from the load
    // balancer, and decapsulating finds exactly the rewritten packet.
    let outer_p = parse_frame(tunnelled)?;
    assert_eq!(outer_p.flow.proto, proto::GRE);
    assert_eq!(outer_p.flow.src, mapped(LB.octets()));
    let d = gre::decapsulate(tunnelled)?;
    assert_eq!(d.ethertype, ethertype::IPV4);
    assert_eq!(d.key, Some(key));
    assert_eq!(&tunnelled[d.inner.clone()], &inner_ip[..]);
    let inner = parse_packet(tunnelled, d.inner.start, d.ethertype)?;
    println!(
        "decapsulated from {}: {}:{} -> {}:{} ttl {}",
        to_ip(&d.outer_src),
        to_ip(&inner.flow.src),
        inner.flow.src_port,
        to_ip(&inner.flow.dst),
        inner.flow.dst_port,
        inner.ttl
    );
    assert_eq!(inner.flow.dst, mapped(BACKEND.octets()));
    assert_eq!(inner.ttl, 63);
    println!("ok");
    Ok(())
}
