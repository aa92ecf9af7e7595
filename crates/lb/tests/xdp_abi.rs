//! The XDP program (`bpf/lb.c`) and the packet threads agree, checked
//! without root: the header the build writes from `lb::xdp::abi`
//! (`lb_abi.h`), which `lb.c` includes, and the program's flow hash
//! (`bpf/flow.h`) are compiled with the host's C compiler into a small
//! program that prints how C lays out every shared struct, the value of
//! every shared constant, and the flow hash and Maglev slot of the flows it
//! is given (IPv4 and IPv6); each must be what Rust says. (`tests/sys_xdp.rs` runs the program
//! itself against the worker, frame by frame, as root.)

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use lb::quic::Miss;
use lb::xdp::abi::{self, STRUCTS};
use packet::FlowKey;
use proptest::prelude::*;

/// The C side: layouts and constants, then one line per flow read.
fn c_program() -> String {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"lb_abi.h\"\n#include \"flow.h\"\n\n\
         int main(void)\n{\n\tunsigned long long k, s0, s1, d0, d1, sp, dp, p, m;\n\n",
    );
    for s in STRUCTS {
        c.push_str(&format!(
            "\tprintf(\"size {0} %zu\\n\", sizeof(struct {0}));\n\
             \tprintf(\"align {0} %zu\\n\", _Alignof(struct {0}));\n",
            s.name
        ));
        for f in s.fields {
            c.push_str(&format!(
                "\tprintf(\"offset {0}.{1} %zu\\n\", offsetof(struct {0}, {1}));\n\
                 \tprintf(\"fieldsize {0}.{1} %zu\\n\", sizeof(((struct {0} *)0)->{1}));\n",
                s.name, f.name
            ));
        }
    }
    for (name, _, _) in abi::CONSTANTS {
        c.push_str(&format!(
            "\tprintf(\"const {name} %llu\\n\", (unsigned long long)({name}));\n"
        ));
    }
    // A line: the family (4 or 6), the source and destination as two
    // words each (IPv4: the address as loaded, then 0; IPv6: its bytes
    // 0..8 and 8..16 as loaded), ports, protocol, table size.
    c.push_str(
        "\tprintf(\"end\\n\");\n\
         \twhile (scanf(\"%llu %llu %llu %llu %llu %llu %llu %llu %llu\", &k, &s0, &s1, &d0, &d1, &sp, &dp, &p, &m) == 9) {\n\
         \t\t__u64 sa[2] = {s0, s1}, da[2] = {d0, d1};\n\
         \t\t__u64 h = k == 4 ? flow_hash4((__u32)s0, (__u32)d0, (__u16)sp, (__u16)dp, (__u8)p)\n\
         \t\t\t: flow_hash6(sa, da, (__u16)sp, (__u16)dp, (__u8)p);\n\
         \t\tprintf(\"%llu %u\\n\", (unsigned long long)h, flow_slot(h, (__u32)m));\n\
         \t}\n\treturn 0;\n}\n",
    );
    c
}

/// The C program, compiled once.
fn compiled() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lb-xdp-abi");
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("abi.c");
        std::fs::write(&src, c_program()).unwrap();
        let bin = dir.join("abi");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args(["-O2", "-Wall", "-Werror", "-I", env!("OUT_DIR"), "-I"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/bpf"))
            .arg(&src)
            .arg("-o")
            .arg(&bin)
            .output()
            .unwrap_or_else(|e| panic!("running {cc} (a C compiler for the host): {e}"));
        assert!(
            out.status.success(),
            "{cc} did not compile lb_abi.h and flow.h:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
}

/// Runs the C program over `input`: what it printed before `end`, by
/// name, and the lines after.
fn run(input: &str) -> (HashMap<String, u64>, Vec<String>) {
    let mut child = Command::new(compiled())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let mut said = HashMap::new();
    for l in lines.by_ref() {
        if l == "end" {
            break;
        }
        let (key, value) = l.rsplit_once(' ').unwrap();
        said.insert(key.to_string(), value.parse().unwrap());
    }
    (said, lines.map(str::to_string).collect())
}

#[test]
fn c_lays_out_every_shared_struct_as_rust_does() {
    let (c, _) = run("");
    for s in STRUCTS {
        assert_eq!(
            c[&format!("size {}", s.name)],
            s.size as u64,
            "sizeof {}",
            s.name
        );
        assert_eq!(
            c[&format!("align {}", s.name)],
            s.align as u64,
            "alignof {}",
            s.name
        );
        let mut end = 0;
        for (i, f) in s.fields.iter().enumerate() {
            let at = format!("{}.{}", s.name, f.name);
            assert_eq!(c[&format!("offset {at}")], f.offset as u64, "offsetof {at}");
            // A field's size, from Rust's layout: up to the next field, or
            // to the end of the struct for the last.
            let next = s.fields.get(i + 1).map_or(s.size, |n| n.offset);
            assert!(
                c[&format!("fieldsize {at}")] as usize <= next - f.offset,
                "{at}"
            );
            end = end.max(f.offset + c[&format!("fieldsize {at}")] as usize);
        }
        assert!(end <= s.size, "{}: fields past the end", s.name);
    }
    // The ones the program reads, by their Rust types.
    let rust = [
        ("lb_conf", std::mem::size_of::<abi::Conf>()),
        ("lb_vip_key", std::mem::size_of::<abi::VipKey>()),
        ("lb_vip6_key", std::mem::size_of::<abi::VipKey6>()),
        ("lb_prefix_key", std::mem::size_of::<abi::PrefixKey>()),
        ("lb_prefix_group", std::mem::size_of::<abi::PrefixGroup>()),
        ("lb_suffix_key", std::mem::size_of::<abi::SuffixKey>()),
        ("lb_vip", std::mem::size_of::<abi::VipEntry>()),
        ("lb_backend", std::mem::size_of::<abi::BackendEntry>()),
        ("lb_pair", std::mem::size_of::<abi::SlotPair>()),
        ("lb_traffic", std::mem::size_of::<abi::Traffic>()),
        ("lb_stats", std::mem::size_of::<abi::Stats>()),
    ];
    for (name, size) in rust {
        assert_eq!(c[&format!("size {name}")], size as u64, "sizeof {name}");
    }
    // User space writes the prefix trie's keys as aya's LPM key over the
    // address words: the same bytes as `lb_prefix_key`.
    assert_eq!(
        std::mem::size_of::<aya::maps::lpm_trie::Key<[u32; 4]>>(),
        std::mem::size_of::<abi::PrefixKey>()
    );
    assert_eq!(std::mem::offset_of!(abi::PrefixKey, prefixlen), 0);
    assert_eq!(std::mem::offset_of!(abi::PrefixKey, addr), 4);
}

#[test]
fn c_has_the_values_rust_uses() {
    let (c, _) = run("");
    let want = [
        ("LB_FLOW_SEED", lb::worker::FLOW_SEED),
        ("LB_ANY_PORT", u64::from(abi::ANY_PORT)),
        ("LB_EMPTY", u64::from(abi::EMPTY)),
        ("LB_HEALTHY", u64::from(abi::HEALTHY)),
        ("LB_ACCEPTING", u64::from(abi::ACCEPTING)),
        ("LB_V4", u64::from(abi::V4)),
        ("LB_V6", u64::from(abi::V6)),
        // The program compares the payload's first 8 bytes, loaded as one
        // word, with it.
        ("LB_TRACE_MAGIC", u64::from_ne_bytes(lb::tracer::MAGIC)),
        ("LB_DEFAULT_VIPS", u64::from(abi::DEFAULT_VIPS)),
        ("LB_DEFAULT_CONNS", u64::from(abi::DEFAULT_CONNS)),
        // The program counts a QUIC miss at the worker's counter index.
        ("LB_QUIC_NOT_QUIC", Miss::NotQuic.index() as u64),
        ("LB_QUIC_RESERVED", Miss::Reserved.index() as u64),
        ("LB_QUIC_NO_CONFIG", Miss::NoConfig.index() as u64),
        ("LB_QUIC_TOO_SHORT", Miss::TooShort.index() as u64),
        (
            "LB_QUIC_LENGTH_MISMATCH",
            Miss::LengthMismatch.index() as u64,
        ),
        (
            "LB_QUIC_UNKNOWN_SERVER_ID",
            Miss::UnknownServerId.index() as u64,
        ),
        ("LB_QUIC_MISSES", Miss::ALL.len() as u64),
        // Outcomes past the misses, and none.
        ("LB_QUIC_ROUTED", Miss::ALL.len() as u64),
        ("LB_QUIC_SERVER_DOWN", Miss::ALL.len() as u64 + 1),
        ("LB_QUIC_NONE", Miss::ALL.len() as u64 + 2),
        ("LB_QUIC_PLAINTEXT", u64::from(abi::QUIC_PLAINTEXT)),
        // The longest server ID QUIC-LB allows.
        (
            "LB_QUIC_MAX_SID",
            (quic_lb::MAX_PLAINTEXT_LEN - quic_lb::MIN_NONCE_LEN) as u64,
        ),
    ];
    for (name, value) in want {
        assert_eq!(c[&format!("const {name}")], value, "{name}");
    }
    assert_eq!(
        want.len(),
        abi::CONSTANTS.len(),
        "a shared constant unchecked"
    );
}

/// An IPv4 flow and a Maglev table size.
type Flow = ([u8; 4], [u8; 4], u16, u16, u8, u32);

fn flow() -> impl Strategy<Value = Flow> {
    (
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        any::<u16>(),
        any::<u16>(),
        prop_oneof![Just(6u8), Just(17u8), any::<u8>()],
        prop_oneof![Just(65_537u32), Just(1_009u32), 1..u32::MAX],
    )
}

/// What the worker makes of `key` in a Maglev table of `m` entries, as
/// the C side prints it: flow hash and slot.
fn workers_line(key: &FlowKey, m: u32) -> String {
    let hash = lb::worker::flow_hash(key);
    format!("{hash} {}", maglev::flow_slot(hash, m))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// `flow.h`'s hash and slot of random IPv4 flows are the worker's
    /// (`lb::worker::flow_hash`, `maglev::flow_slot`).
    #[test]
    fn the_programs_flow_hash_and_slot_are_the_workers(flows in prop::collection::vec(flow(), 1..200)) {
        let input: String = flows
            .iter()
            .map(|(s, d, sp, dp, p, m)| {
                // The addresses as the program loads them from the packet.
                format!(
                    "4 {} 0 {} 0 {sp} {dp} {p} {m}\n",
                    u32::from_ne_bytes(*s),
                    u32::from_ne_bytes(*d)
                )
            })
            .collect();
        let (_, lines) = run(&input);
        prop_assert_eq!(lines.len(), flows.len());
        for ((s, d, sp, dp, p, m), line) in flows.iter().zip(&lines) {
            let key = FlowKey {
                src: packet::flow::mapped(*s),
                dst: packet::flow::mapped(*d),
                src_port: *sp,
                dst_port: *dp,
                proto: *p,
            };
            prop_assert_eq!(line.clone(), workers_line(&key, *m), "{:?}", (s, d, sp, dp, p, m));
        }
    }
}

/// An IPv6 flow and a Maglev table size.
type Flow6 = ([u8; 16], [u8; 16], u16, u16, u8, u32);

/// IPv6 addresses: random, some sharing a prefix, some IPv4-mapped (the
/// key form of IPv4, which an IPv6 header may carry too).
fn addr6() -> impl Strategy<Value = [u8; 16]> {
    prop_oneof![
        any::<[u8; 16]>(),
        any::<u64>().prop_map(|h| {
            let mut a = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            a[8..].copy_from_slice(&h.to_be_bytes());
            a
        }),
        any::<[u8; 4]>().prop_map(packet::flow::mapped),
    ]
}

fn flow6() -> impl Strategy<Value = Flow6> {
    (
        addr6(),
        addr6(),
        any::<u16>(),
        any::<u16>(),
        prop_oneof![Just(6u8), Just(17u8), any::<u8>()],
        prop_oneof![Just(65_537u32), Just(1_009u32), 1..u32::MAX],
    )
}

/// An address as the program loads it: its bytes 0..8 and 8..16, each one
/// native-endian word.
fn loaded(a: &[u8; 16]) -> (u64, u64) {
    let w = |b: &[u8]| u64::from_ne_bytes(b.try_into().expect("8 bytes"));
    (w(&a[..8]), w(&a[8..]))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// `flow.h`'s hash and slot of random IPv6 flows (IPv4-mapped
    /// addresses among them) are the worker's.
    #[test]
    fn the_programs_ipv6_flow_hash_and_slot_are_the_workers(flows in prop::collection::vec(flow6(), 1..200)) {
        let input: String = flows
            .iter()
            .map(|(s, d, sp, dp, p, m)| {
                let ((s0, s1), (d0, d1)) = (loaded(s), loaded(d));
                format!("6 {s0} {s1} {d0} {d1} {sp} {dp} {p} {m}\n")
            })
            .collect();
        let (_, lines) = run(&input);
        prop_assert_eq!(lines.len(), flows.len());
        for ((s, d, sp, dp, p, m), line) in flows.iter().zip(&lines) {
            let key = FlowKey {
                src: *s,
                dst: *d,
                src_port: *sp,
                dst_port: *dp,
                proto: *p,
            };
            prop_assert_eq!(line.clone(), workers_line(&key, *m), "{:?}", (s, d, sp, dp, p, m));
        }
    }
}
