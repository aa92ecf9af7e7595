//! Tests of the configuration as a whole, and the helpers the sections'
//! tests share.

use std::net::IpAddr;

use super::*;

pub(super) const GOOD: &str = r#"
[encap]
source = "10.0.0.1"
[[pools]]
name = "web"
backends = [{ address = "10.1.0.1" }, { address = "10.1.0.2", weight = 2 }]
include = ["extra"]
[[pools]]
name = "extra"
backends = [{ address = "10.1.0.3", name = "third" }, { address = "10.1.0.1" }]
[[vips]]
name = "http"
address = "192.0.2.80"
port = 80
protocol = "tcp"
pool = "web"
"#;

#[test]
fn good_config_flattens_pools() {
    let c = Config::parse(GOOD, "t.toml").unwrap();
    let b = c.flatten("web").unwrap();
    let names: Vec<String> = b
        .iter()
        .map(|b| b.name.clone().unwrap_or(b.address.to_string()))
        .collect();
    assert_eq!(names, ["10.1.0.1", "10.1.0.2", "third"]);
    assert_eq!(c.forwarder.batch_timeout_us, 50);
}

pub(super) fn err(text: &str) -> ConfigError {
    Config::parse(text, "t.toml").unwrap_err()
}

#[test]
fn errors_name_file_key_and_problem() {
    let e = err(&GOOD.replace("pool = \"web\"", "pool = \"nope\""));
    assert_eq!(
        (e.file.as_str(), e.key.as_str()),
        ("t.toml", "vips[0].pool")
    );
    assert!(e.problem.contains("nope"));
    let e = err(&format!("{GOOD}\n[[pools]]\nname = \"loop\"\ninclude = [\"loop2\"]\n[[pools]]\nname = \"loop2\"\ninclude = [\"loop\"]\n"));
    assert!(
        e.problem.contains("cycle") && e.problem.contains("loop -> loop2 -> loop"),
        "{e}"
    );
    let e = err(&GOOD.replace("[encap]", "[encap]\nttl = 0"));
    assert_eq!(e.key, "encap.ttl");
    let e = err(&GOOD.replace("name = \"web\"\n", "name = \"web\"\ntable_size = 65536\n"));
    assert!(
        e.key == "pools[0].table_size" && e.problem.contains("not prime"),
        "{e}"
    );
    let e = err(&GOOD.replace("port = 80", "port = 80\ncolour = \"blue\""));
    assert!(
        e.problem.contains("colour") && e.key.starts_with("line"),
        "{e}"
    );
    let e = err(&GOOD.replace("source = \"10.0.0.1\"", ""));
    assert_eq!(e.key, "encap.source");
    let e = err(&GOOD.replace("port = 80", "port = 99999"));
    assert!(e.key.starts_with("line"), "{e}");
    assert!(e.problem.contains("port = 99999"), "{e}");
    // The parser's message does not name the table; the line does.
    let e = err(&format!("{GOOD}\n[encap]\nttl = 3\n"));
    assert!(e.key == "line 18" && e.problem.contains("[encap]"), "{e}");
    let e = err("[conntrack]\nsize = 1000\n");
    assert_eq!(e.key, "conntrack.size");
    // A tracer reports only to prefixes it is given, never the world.
    let e = err(&GOOD.replace("[encap]", "[tracer]\nenabled = true\n[encap]"));
    assert_eq!(e.key, "tracer.report_to", "{e}");
    let e = err(&GOOD.replace(
        "[encap]",
        "[tracer]\nenabled = true\nreport_to = [\"10.1.0.0\"]\n[encap]",
    ));
    assert_eq!(e.key, "tracer.report_to[0]", "{e}");
    let c = Config::parse(
        &GOOD.replace(
            "[encap]",
            "[tracer]\nenabled = true\nreport_to = [\"10.1.0.0/24\"]\n[encap]",
        ),
        "t",
    )
    .unwrap();
    assert!(c.tracer.enabled);
    assert!(!Config::parse(GOOD, "t").unwrap().tracer.enabled);
    // An API anyone can reach needs a token.
    let e = err(&GOOD.replace("[encap]", "[api]\nlisten = \"0.0.0.0:9180\"\n[encap]"));
    assert!(
        e.key == "api.listen" && e.problem.contains("token_file"),
        "{e}"
    );
    Config::parse(
        &GOOD.replace(
            "[encap]",
            "[api]\nlisten = \"0.0.0.0:9180\"\ntoken_file = \"/etc/t\"\n[encap]",
        ),
        "t",
    )
    .unwrap();
    Config::parse(
        &GOOD.replace("[encap]", "[api]\nlisten = \"[::1]:9180\"\n[encap]"),
        "t",
    )
    .unwrap();
    // A bad key in column 0 is reported on its own line (it was one
    // line too high).
    let e = err("[forwarder]\nthreads = 2\nbatch = 32\nthreadz = 4\n");
    assert_eq!(e.key, "line 4", "{e}");
    let e = err("\n\n[forwarder]\n  threadz = 4\n");
    assert_eq!(e.key, "line 4", "{e}");
    // One machine under two names would silently double its weight.
    let e = err(&GOOD.replace(
        "{ address = \"10.1.0.2\", weight = 2 }",
        "{ address = \"10.1.0.2\", weight = 2 }, { address = \"10.1.0.2\", name = \"again\" }",
    ));
    assert_eq!(e.key, "pools[0].backends[2]", "{e}");
    assert!(
        e.problem.contains("\"again\"") && e.problem.contains("\"10.1.0.2\""),
        "{e}"
    );
    let e = err(&GOOD.replace(
        "{ address = \"10.1.0.3\", name = \"third\" }",
        "{ address = \"10.1.0.2\", name = \"third\" }",
    ));
    assert_eq!(e.key, "pools[0].include", "{e}");
    assert!(
        e.problem.contains("10.1.0.2") && e.problem.contains("third"),
        "{e}"
    );
    assert!(Config::load(std::path::Path::new("/nonexistent.toml"))
        .unwrap_err()
        .to_string()
        .contains("/nonexistent.toml"));
}

#[test]
fn restart_keys_name_what_a_reload_cannot_apply() {
    let old = Config::parse(GOOD, "t").unwrap();
    assert!(old.restart_keys(&old).is_empty());
    let new = Config::parse(
        &GOOD
            .replace(
                "[encap]",
                "[forwarder]\nthreads = 3\n[api]\nlisten = \"127.0.0.1:9999\"\n[encap]",
            )
            .replace(
                "{ address = \"10.1.0.2\", weight = 2 }",
                "{ address = \"10.1.0.2\", weight = 3 }",
            ),
        "t",
    )
    .unwrap();
    // The weight is applied live; threads and the API address are not.
    assert_eq!(old.restart_keys(&new), ["forwarder.threads", "api.listen"]);
    // The tracer is built at start; [fleet] coming or going changes
    // how the ports are opened.
    let traced = Config::parse(
        &GOOD.replace(
            "[encap]",
            "[tracer]\nenabled = true\nreport_to = [\"10.1.0.0/24\"]\n[encap]",
        ),
        "t",
    )
    .unwrap();
    assert_eq!(
        old.restart_keys(&traced),
        ["tracer.enabled", "tracer.report_to"]
    );
}

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// examples/lb.toml loads, and shows every section the configuration
/// has (as a table, or commented out where a capture replay cannot use
/// it): a section added here and not there fails this test.
#[test]
fn the_annotated_example_is_valid_and_complete() {
    let text = include_str!("../../../../examples/lb.toml");
    let c = Config::parse(text, "examples/lb.toml").unwrap();
    let sections = serde_json::to_value(&c).unwrap();
    for key in sections.as_object().unwrap().keys() {
        let shown = [format!("[{key}]"), format!("[[{key}]]")].iter().any(|h| {
            text.lines()
                .any(|l| l.trim_start_matches("# ").starts_with(h.as_str()))
        });
        assert!(shown, "examples/lb.toml does not show [{key}]");
    }
    // Every health-check key and the BGP drain keys are shown too.
    for k in [
        "interval_ms",
        "timeout_ms",
        "rise",
        "fall",
        "drain_ms",
        "drain_quiet_ms",
        "report_to",
    ] {
        assert!(text.contains(k), "examples/lb.toml does not show {k}");
    }
}

/// Sizes once had no upper bound (a table of 2^31-1 slots, a
/// queue whose buffers overflow `usize`, unbounded connection and
/// fragment tables), and names could be of any length. Each is refused naming its
/// key; and what the sizes imply together must fit the machine.
#[test]
fn sizes_and_names_are_bounded() {
    for (from, to, key) in [
        ("name = \"web\"\n", "name = \"web\"\ntable_size = 2147483647\n", "pools[0].table_size"),
        ("name = \"web\"\n", "name = \"web\"\ntable_size = 500000003\n", "pools[0].table_size"),
        ("[encap]", "[forwarder]\nqueue_size = 4611686018427387904\n[encap]", "forwarder.queue_size"),
        ("[encap]", "[forwarder]\nqueue_size = 131072\npool_buffers = 4000000\n[encap]", "forwarder.queue_size"),
        ("[encap]", "[forwarder]\npool_buffers = 4294967295\n[encap]", "forwarder.pool_buffers"),
        ("[encap]", "[forwarder]\nfrag_table_size = 1099511627776\n[encap]", "forwarder.frag_table_size"),
        ("[encap]", "[forwarder]\nfrag_timeout_ms = 9223372036854775807\n[encap]", "forwarder.frag_timeout_ms"),
        ("[encap]", "[forwarder]\nbatch_timeout_us = 9223372036854775807\n[encap]", "forwarder.batch_timeout_us"),
        ("[encap]", "[conntrack]\nsize = 1099511627776\n[encap]", "conntrack.size"),
        ("[encap]", "[conntrack]\ntcp_timeout_s = 9e6\n[encap]", "conntrack.tcp_timeout_s"),
        ("[encap]", "[bgp]\nvips_file = \"/run/v\"\ndrain_ms = 0\ndrain_quiet_ms = 9223372036854775807\n[encap]", "bgp.drain_quiet_ms"),
    ] {
        let text = GOOD.replace(from, to);
        assert_ne!(text, GOOD);
        let e = err(&text);
        assert_eq!(e.key, key, "{to}: {e}");
    }
    // The largest table is accepted.
    Config::parse(
        &GOOD.replace(
            "name = \"web\"\n",
            "name = \"web\"\ntable_size = 16777213\n",
        ),
        "t",
    )
    .unwrap();
    // Names: 255 bytes at most, printable.
    let long = "n".repeat(65_536);
    for (from, to, key) in [
        (
            "name = \"web\"",
            format!("name = \"{long}\""),
            "pools[0].name",
        ),
        (
            "name = \"http\"",
            format!("name = \"{long}\""),
            "vips[0].name",
        ),
        (
            "name = \"third\"",
            format!("name = \"{long}\""),
            "pools[1].backends[0].name",
        ),
        (
            "name = \"third\"",
            "name = \"a\\nb\"".to_string(),
            "pools[1].backends[0].name",
        ),
        ("name = \"http\"", "name = \"\"".to_string(), "vips[0].name"),
    ] {
        let e = err(&GOOD.replace(from, &to));
        assert_eq!(e.key, key, "{e}");
        assert!(e.problem.len() < 200, "the message repeats the name: {e}");
    }
    let ok = "x".repeat(255);
    Config::parse(
        &GOOD.replace("name = \"http\"", &format!("name = \"{ok}\"")),
        "t",
    )
    .unwrap();
    // Everything within bounds, together more than the machine has.
    let big = Config::parse(
        &GOOD.replace(
            "[encap]",
            "[forwarder]\nthreads = 64\npool_buffers = 200000\n[conntrack]\nsize = 16777216\n[encap]",
        ),
        "t",
    )
    .unwrap();
    let estimate = big.memory_estimate();
    assert!(estimate.total() > 50 << 30, "{estimate:?}");
    let machine = MachineMemory {
        bytes: 8 << 30,
        source: "a test's".into(),
    };
    let (key, why) = estimate.fits(&machine).unwrap_err();
    assert_eq!(key, "conntrack.size");
    assert!(
        why.contains("8.0 GiB")
            && why.contains("conntrack.size")
            && why.contains("64 packet threads"),
        "{why}"
    );
    let small = Config::parse(GOOD, "t").unwrap().memory_estimate();
    small.fits(&machine).unwrap();
    assert!(small.total() < 256 << 20, "{small:?}");
    // Every part says what sizes it; the tables are counted per pool.
    let parts: Vec<&str> = small.parts.iter().map(|p| p.key).collect();
    assert_eq!(
        parts,
        [
            "forwarder.pool_buffers",
            "forwarder.queue_size",
            "conntrack.size",
            "forwarder.frag_table_size",
            "pools.table_size"
        ]
    );
    assert_eq!(
        small.parts[4].bytes,
        2 * (65_537 * 4 + 65_537_u64.div_ceil(8))
    );
}

#[test]
fn addresses_are_of_the_right_class() {
    for bad in ["0.0.0.0", "255.255.255.255", "224.0.0.1", "127.0.0.1"] {
        let e = err(&GOOD.replace(
            "\"10.1.0.1\" }, { address",
            &format!("\"{bad}\" }}, {{ address"),
        ));
        assert_eq!(e.key, "pools[0].backends[0].address", "{bad}: {e}");
        let e = err(&GOOD.replace("192.0.2.80", bad));
        assert_eq!(e.key, "vips[0].address", "{bad}: {e}");
        let e = err(&GOOD.replace("source = \"10.0.0.1\"", &format!("source = \"{bad}\"")));
        assert_eq!(e.key, "encap.source", "{bad}: {e}");
    }
    let v6 = |a: &str| {
        GOOD.replace(
            "source = \"10.0.0.1\"",
            "source = \"10.0.0.1\"\nsource6 = \"fd00::1\"",
        )
        .replace("192.0.2.80", a)
    };
    Config::parse(&v6("2001:db8::80"), "t").unwrap();
    for bad in ["::", "ff02::1", "::1", "::ffff:127.0.0.1"] {
        assert_eq!(err(&v6(bad)).key, "vips[0].address", "{bad}");
    }
    for mac in [
        "ff:ff:ff:ff:ff:ff",
        "01:00:5e:00:00:01",
        "00:00:00:00:00:00",
    ] {
        let e = err(&GOOD.replace("[encap]", &format!("[encap]\ngateway_mac = \"{mac}\"")));
        assert_eq!(e.key, "encap.gateway_mac", "{mac}: {e}");
        if mac != "00:00:00:00:00:00" {
            let e = err(&GOOD.replace("[encap]", &format!("[encap]\nmac = \"{mac}\"")));
            assert_eq!(e.key, "encap.mac", "{mac}: {e}");
        }
    }
    // Loopback's MAC, which the daemon takes as its own on `lo`.
    Config::parse(
        &GOOD.replace("[encap]", "[encap]\nmac = \"00:00:00:00:00:00\""),
        "t",
    )
    .unwrap();
    for (prefix, ok) in [
        ("0.0.0.0/0", false),
        ("224.0.0.0/4", false),
        ("255.255.255.255/32", false),
        ("128.0.0.0/1", false),
        ("::/0", false),
        ("ff02::/16", false),
        ("10.1.0.0/24", true),
        ("fd00:9::/64", true),
    ] {
        let text = GOOD.replace(
            "[encap]",
            &format!("[tracer]\nenabled = true\nreport_to = [\"{prefix}\"]\n[encap]"),
        );
        match Config::parse(&text, "t") {
            Ok(_) => assert!(ok, "{prefix} accepted"),
            Err(e) => assert!(!ok && e.key == "tracer.report_to[0]", "{prefix}: {e}"),
        }
    }
    let group = |prefixes: &str, suffix: &str| {
        format!(
            "{GOOD}\n[[prefix_groups]]\nname = \"a\"\nprefixes = [{prefixes}]\ncluster_prefix_len = 24\n\
             [[vips]]\nname = \"s\"\nprefix_group = \"a\"\nsuffix = \"{suffix}\"\nprotocol = \"udp\"\npool = \"web\"\n"
        )
    };
    Config::parse(&group("\"74.125.0.0/16\"", "0.0.0.1"), "t").unwrap();
    assert_eq!(
        err(&group("\"74.125.0.0/16\"", "::1")).key,
        "vips[1].suffix"
    );
    assert_eq!(
        err(&group("\"74.125.0.0/16\", \"2001:db8::/32\"", "0.0.0.1")).key,
        "prefix_groups[0].prefixes[1]"
    );
    // An empty group once let a cluster length of 200 through, which
    // overflowed the matcher's arithmetic.
    let e =
        err(&group("", "0.0.0.1").replace("cluster_prefix_len = 24", "cluster_prefix_len = 200"));
    assert_eq!(e.key, "prefix_groups[0].prefixes", "{e}");
}

/// A directory of files for the checks beyond the text, removed when
/// dropped.
pub(super) struct Scratch(pub(super) std::path::PathBuf);

impl Scratch {
    pub(super) fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("fastpath-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    pub(super) fn write(&self, name: &str, text: &str) -> std::path::PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A missing, short, directory or `/dev/zero` token file, and
/// `vips_file = "/etc/passwd"`, passed check-config. `Config::load`
/// (check-config, the start, every reload) reads them as the daemon
/// would.
#[test]
fn files_a_configuration_names_are_checked_when_it_loads() {
    let dir = Scratch::new("load");
    let token = dir.write("token", "  a-long-enough-secret-token \nnext\n");
    let short = dir.write("short", "short\n");
    let big = dir.write(
        "big",
        &format!("a-long-enough-secret-token\n{}", "x".repeat(5000)),
    );
    let load = |api: String, bgp: String| {
        let text = GOOD.replace("[encap]", &format!("{api}{bgp}[encap]"));
        let f = dir.write("lb.toml", &text);
        Config::load(&f)
    };
    let api = |t: &std::path::Path| {
        format!(
            "[api]\nlisten = \"0.0.0.0:9180\"\ntoken_file = \"{}\"\n",
            t.display()
        )
    };
    let checked = load(api(&token), String::new()).unwrap();
    assert!(checked.text.contains("token_file"));
    assert_eq!(read_token(&token).unwrap(), "a-long-enough-secret-token");
    for t in [
        dir.0.join("missing"),
        short,
        big,
        dir.0.clone(),
        std::path::PathBuf::from("/dev/zero"),
    ] {
        let e = load(api(&t), String::new()).unwrap_err();
        assert_eq!(e.key, "api.token_file", "{}: {e}", t.display());
        assert!(e.problem.contains(&t.display().to_string()), "{e}");
    }
    let bgp = |p: &std::path::Path| format!("[bgp]\nvips_file = \"{}\"\n", p.display());
    for ok in [
        dir.0.join("not-yet"),
        dir.write("written", VIPS_FILE_HEADER),
        dir.write("placeholder", "# filled in by fastpath\n"),
        dir.write("empty", ""),
    ] {
        load(String::new(), bgp(&ok)).unwrap();
    }
    for bad in [
        std::path::PathBuf::from("/etc/passwd"),
        dir.write("bird.conf", "router id 10.0.0.1;\n# fastpath\n"),
        dir.0.clone(),
    ] {
        let e = load(String::new(), bgp(&bad)).unwrap_err();
        assert_eq!(e.key, "bgp.vips_file", "{}: {e}", bad.display());
    }
    // The configuration itself: a regular file of bounded size.
    for bad in [std::path::Path::new("/dev/zero"), &dir.0] {
        let e = Config::load(bad).unwrap_err();
        assert_eq!(e.key, "(file)", "{e}");
    }
    // What the machine has: found here, and larger than a small
    // configuration's estimate.
    let m = machine_memory().expect("Linux says how much memory there is");
    assert!(m.bytes > checked.memory.total(), "{m:?}");
    assert!(checked.machine.is_some());
}
