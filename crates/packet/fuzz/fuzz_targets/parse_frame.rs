//! Fuzzes the forwarder's parser, GRE encapsulation of whatever parses, and
//! decapsulation: none may panic, and what parses must lie inside the frame.
//! Run: `make fuzz` (or `cargo +nightly fuzz run parse_frame` in crates/packet).
#![no_main]

use libfuzzer_sys::fuzz_target;
use packet::gre::{decapsulate, encapsulate, Outer};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = packet::parse_frame(data) {
        assert!(p.l3_offset + p.l3_len <= data.len());
        assert!(p.l4_offset <= p.l3_offset + p.l3_len);
        let mut buf = vec![0u8; 64];
        buf.extend_from_slice(data);
        let outer = Outer {
            eth_src: [2, 0, 0, 0, 0, 1],
            eth_dst: [2, 0, 0, 0, 0, 2],
            src: packet::flow::mapped([10, 0, 0, 1]),
            dst: packet::flow::mapped([10, 0, 0, 2]),
            ttl: 64,
        };
        if let Ok(r) = encapsulate(&mut buf, 64, &p, &outer, 1) {
            let d = decapsulate(&buf[r.clone()]).expect("our own GRE must decapsulate");
            assert_eq!(&buf[r][d.inner], &data[p.l3_offset..p.l3_offset + p.l3_len]);
        }
    }
    let _ = decapsulate(data);
});
