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

/// A configuration `GOOD` with `from` replaced by `to` (which must occur).
fn with(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "{from}");
    GOOD.replacen(from, to, 1)
}

/// The key `text` is refused at, and that the message names it.
fn refused_at(text: &str) -> (String, String) {
    let e = err(text);
    (e.key, e.problem)
}

/// A timeout the datapath rounds to 0 ms (`1e-300`), or that is not a
/// number, expires every connection at once: refused.
#[test]
fn conntrack_timeouts_that_round_to_zero_are_refused() {
    for (k, v) in [
        ("tcp_timeout_s", "1e-300"),
        ("tcp_timeout_s", "0.0009"),
        ("udp_timeout_s", "1e-300"),
        ("tcp_timeout_s", "nan"),
        ("udp_timeout_s", "inf"),
        ("udp_timeout_s", "-inf"),
    ] {
        let (key, problem) = refused_at(&with(
            "[encap]",
            &format!("[conntrack]\n{k} = {v}\n[encap]"),
        ));
        assert_eq!(key, format!("conntrack.{k}"), "{v}: {problem}");
        assert!(problem.contains("0.001"), "{v}: {problem}");
    }
    Config::parse(
        &with("[encap]", "[conntrack]\ntcp_timeout_s = 0.001\n[encap]"),
        "t",
    )
    .unwrap();
}

#[test]
fn frag_timeout_of_zero_is_refused() {
    let (key, problem) = refused_at(&with(
        "[encap]",
        "[forwarder]\nfrag_timeout_ms = 0\n[encap]",
    ));
    assert_eq!(key, "forwarder.frag_timeout_ms", "{problem}");
    assert!(problem.contains("at least 1"), "{problem}");
}

#[test]
fn batch_timeout_of_zero_is_refused() {
    let (key, problem) = refused_at(&with(
        "[encap]",
        "[forwarder]\nbatch_timeout_us = 0\n[encap]",
    ));
    assert_eq!(key, "forwarder.batch_timeout_us", "{problem}");
    assert!(problem.contains("at least 1"), "{problem}");
}

/// Maglev needs a table comfortably larger than its backends: 2 or 3
/// slots for web's 3 backends cannot spread them by weight.
#[test]
fn tables_too_small_for_their_pools_are_refused() {
    for size in [2, 3, 7, 29] {
        let (key, problem) = refused_at(&with(
            "name = \"web\"\n",
            &format!("name = \"web\"\ntable_size = {size}\n"),
        ));
        assert_eq!(key, "pools[0].table_size", "{size}: {problem}");
        assert!(problem.contains("at least 31"), "{size}: {problem}");
    }
    // 10 slots a backend is the least: 31 for 3 backends.
    Config::parse(
        &with("name = \"web\"\n", "name = \"web\"\ntable_size = 31\n"),
        "t",
    )
    .unwrap();
}

/// A VIP whose pool has no backend with a share of the table can never
/// be served: the file is refused where it is loaded (check-config, the
/// start, a reload), while a runtime drain of the last backend (an
/// operator's act, through the same text check) stays possible.
#[test]
fn pools_whose_every_backend_is_weightless_are_refused_and_drained_ones_warned_at_load() {
    let dir = Scratch::new("servable");
    let weightless = GOOD
        .replace(
            "{ address = \"10.1.0.1\" }, { address = \"10.1.0.2\", weight = 2 }",
            "{ address = \"10.1.0.1\", weight = 0 }, { address = \"10.1.0.2\", weight = 0 }",
        )
        .replace(
            "{ address = \"10.1.0.3\", name = \"third\" }, { address = \"10.1.0.1\" }",
            "{ address = \"10.1.0.3\", name = \"third\", weight = 0 }",
        );
    assert_ne!(weightless, GOOD);
    let f = dir.write("lb.toml", &weightless);
    let e = Config::load(&f).unwrap_err();
    assert_eq!(e.key, "vips[0].pool", "{e}");
    assert!(
        e.problem.contains("\"web\"") && e.problem.contains("weight"),
        "{e}"
    );
    // The runtime path (a change through the API) checks the text alone.
    Config::check_text(weightless.clone(), "t", &mut ParseCache::new()).unwrap();
    // Every backend drained: an operator's maintenance, written to the
    // file by the daemon; a reload or a restart during it must work, and
    // says what it means.
    let drained = GOOD.replace(
        "include = [\"extra\"]\n",
        "drained = [\"10.1.0.1\", \"10.1.0.2\"]\n",
    );
    assert_ne!(drained, GOOD);
    let f = dir.write("lb.toml", &drained);
    let c = Config::load(&f).unwrap();
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("\"web\"") && w.contains("drained") && w.contains("undrain")),
        "{:?}",
        c.warnings
    );
    // One backend with a share is enough, and says nothing.
    let f = dir.write(
        "lb.toml",
        &GOOD.replace("include = [\"extra\"]\n", "drained = [\"10.1.0.1\"]\n"),
    );
    let c = Config::load(&f).unwrap();
    assert!(
        !c.warnings
            .iter()
            .any(|w| w.contains("served by no backend")),
        "{:?}",
        c.warnings
    );
}

/// A VIP at a backend's address or at this load balancer's outer source
/// sends the encapsulated packets back to itself.
#[test]
fn a_vip_at_a_backend_or_the_outer_source_is_refused() {
    for (vip, what) in [
        ("10.1.0.2", "backend"),
        ("10.1.0.3", "backend"),
        ("10.0.0.1", "encap.source"),
    ] {
        let (key, problem) = refused_at(&with("192.0.2.80", vip));
        assert_eq!(key, "vips[0].address", "{vip}: {problem}");
        assert!(problem.contains(what), "{vip}: {problem}");
    }
    let v6 = with(
        "source = \"10.0.0.1\"",
        "source = \"10.0.0.1\"\nsource6 = \"fd00::1\"",
    );
    let (key, problem) = refused_at(&v6.replace("192.0.2.80", "fd00::1"));
    assert_eq!(key, "vips[0].address", "{problem}");
}

/// `::ffff:192.0.2.80` is 192.0.2.80 to the matcher: a second VIP written
/// so served the same packets, and would be announced as an IPv6 route.
#[test]
fn a_vip_written_as_ipv4_mapped_is_refused() {
    let text = format!(
        "{GOOD}\n[[vips]]\nname = \"again\"\naddress = \"::ffff:192.0.2.80\"\nport = 80\nprotocol = \"tcp\"\npool = \"web\"\n"
    );
    let (key, problem) = refused_at(&text);
    assert_eq!(key, "vips[1].address", "{problem}");
    assert!(
        problem.contains("192.0.2.80") && problem.contains("IPv4"),
        "{problem}"
    );
}

fn group(prefixes: &str, suffix: &str) -> String {
    format!(
        "{GOOD}\n[[prefix_groups]]\nname = \"a\"\nprefixes = [{prefixes}]\ncluster_prefix_len = 24\n\
         [[vips]]\nname = \"s\"\nprefix_group = \"a\"\nsuffix = \"{suffix}\"\nprotocol = \"udp\"\npool = \"web\"\n"
    )
}

/// `74.125.0.1/16` (host bits set) and `74.125.0.0/+16` (a sign the
/// integer parser took) are not what they seem; refused, naming the
/// prefix meant.
#[test]
fn prefixes_with_host_bits_or_a_sign_are_refused() {
    for bad in ["74.125.0.1/16", "74.125.0.0/+16", "74.125.0.0/-16"] {
        let (key, problem) = refused_at(&group(&format!("\"{bad}\""), "0.0.0.1"));
        assert_eq!(key, "prefix_groups[0].prefixes[0]", "{bad}: {problem}");
    }
    let (_, problem) = refused_at(&group("\"74.125.0.1/16\"", "0.0.0.1"));
    assert!(problem.contains("74.125.0.0/16"), "{problem}");
    for bad in ["10.1.0.1/24", "10.1.0.0/+24"] {
        let (key, problem) = refused_at(&with(
            "[encap]",
            &format!("[tracer]\nenabled = true\nreport_to = [\"{bad}\"]\n[encap]"),
        ));
        assert_eq!(key, "tracer.report_to[0]", "{bad}: {problem}");
    }
    let (key, problem) = refused_at(&with(
        "[encap]",
        "[encap]\nsource_prefix = \"198.18.100.0/+24\"",
    ));
    assert_eq!(key, "encap.source_prefix", "{problem}");
    assert_eq!(parse_prefix("74.125.0.0/+16"), None);
    assert_eq!(parse_prefix("74.125.0.0/16"), Some((ip("74.125.0.0"), 16)));
}

/// A group of `0.0.0.0/0` makes every address a VIP (broadcast,
/// multicast, this host's own); refused like any prefix that is not
/// unicast.
#[test]
fn prefix_groups_over_everything_are_refused() {
    for (bad, suffix) in [
        ("0.0.0.0/0", "0.0.0.1"),
        ("224.0.0.0/8", "0.0.0.1"),
        ("::/0", "::1"),
        ("ff00::/8", "::1"),
    ] {
        let text = group(&format!("\"{bad}\""), suffix).replace(
            "cluster_prefix_len = 24",
            if suffix == "::1" {
                "cluster_prefix_len = 64"
            } else {
                "cluster_prefix_len = 24"
            },
        );
        let (key, problem) = refused_at(&text);
        assert_eq!(key, "prefix_groups[0].prefixes[0]", "{bad}: {problem}");
    }
}

/// Fragments redirected to such a peer go to a service, a backend, or
/// never leave this machine. Loopback is refused where a file is loaded
/// to run (a model of a fleet on one machine may put peers there).
#[test]
fn fleet_peers_that_are_a_vip_a_backend_or_loopback_are_refused() {
    let dir = Scratch::new("peers");
    for (peer, what) in [
        ("127.0.0.1", "loopback"),
        ("127.0.0.2", "loopback"),
        ("192.0.2.80", "VIP"),
        ("10.1.0.3", "backend"),
    ] {
        let text = format!("{GOOD}\n[fleet]\npeers = [\"10.0.0.1\", \"{peer}\"]\n");
        let e = Config::load(&dir.write("lb.toml", &text)).unwrap_err();
        assert_eq!(e.key, "fleet.peers[1]", "{peer}: {e}");
        assert!(e.problem.contains(what), "{peer}: {e}");
    }
}

#[test]
fn health_port_zero_and_control_characters_in_paths_are_refused() {
    let health = |h: &str| {
        with(
            "include = [\"extra\"]",
            &format!("include = [\"extra\"]\nhealth = {{ kind = \"http\", {h} }}"),
        )
    };
    let (key, problem) = refused_at(&health("port = 0"));
    assert_eq!(key, "pools[0].health.port", "{problem}");
    for path in ["/a\\u0000b", "/a\\tb", "/a\\u007fb"] {
        let (key, problem) = refused_at(&health(&format!("port = 80, path = \"{path}\"")));
        assert_eq!(key, "pools[0].health.path", "{path}: {problem}");
    }
    let fleet = format!(
        "{GOOD}\n[fleet]\npeers = [\"10.0.0.1\"]\nhealth = {{ kind = \"tcp\", port = 0 }}\n"
    );
    assert_eq!(refused_at(&fleet).0, "fleet.health.port");
}

#[test]
fn api_listen_on_port_zero_is_refused() {
    let (key, problem) = refused_at(&with("[encap]", "[api]\nlisten = \"127.0.0.1:0\"\n[encap]"));
    assert_eq!(key, "api.listen", "{problem}");
    assert!(problem.contains("port"), "{problem}");
}

/// `+2:0:0:0:0:1`: the integer parser takes a sign; a MAC is hex digits.
#[test]
fn mac_with_a_sign_is_refused() {
    for bad in [
        "+2:0:0:0:0:1",
        "02:00:00:00:00:+1",
        "002:0:0:0:0:1",
        " 2:0:0:0:0:1",
    ] {
        assert_eq!(parse_mac(bad), None, "{bad}");
        let (key, _) = refused_at(&with("[encap]", &format!("[encap]\nmac = \"{bad}\"")));
        assert_eq!(key, "encap.mac", "{bad}");
        let (key, _) = refused_at(&with(
            "[encap]",
            &format!("[encap]\ngateway_mac = \"{bad}\""),
        ));
        assert_eq!(key, "encap.gateway_mac", "{bad}");
    }
    assert_eq!(parse_mac("2:0:0:0:0:1"), Some([2, 0, 0, 0, 0, 1]));
    assert_eq!(
        parse_mac("02:AA:bb:00:00:01"),
        Some([2, 0xaa, 0xbb, 0, 0, 1])
    );
}

/// Outer sources from a multicast or reserved range are not a host's:
/// backends' answers and ICMP errors would go nowhere.
#[test]
fn source_prefix_of_multicast_or_reserved_is_refused() {
    for bad in ["224.0.0.0/16", "240.0.0.0/16", "127.0.0.0/16", "0.0.0.0/16"] {
        let (key, problem) = refused_at(&with(
            "[encap]",
            &format!("[encap]\nsource_prefix = \"{bad}\""),
        ));
        assert_eq!(key, "encap.source_prefix", "{bad}: {problem}");
    }
    let v6 = with(
        "source = \"10.0.0.1\"",
        "source = \"10.0.0.1\"\nsource6 = \"fd00::1\"",
    );
    for bad in ["ff02::/64", "::1/128"] {
        let (key, problem) =
            refused_at(&v6.replace("[encap]", &format!("[encap]\nsource_prefix6 = \"{bad}\"")));
        assert_eq!(key, "encap.source_prefix6", "{bad}: {problem}");
    }
}
