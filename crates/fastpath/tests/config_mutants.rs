//! `fastpath lb check-config` accepts exactly what `fastpath lb run` starts
//! with, and no configuration hurts the code that validates it.
//!
//! 5,000 configurations are made from three valid ones by a seeded
//! generator: lines deleted, duplicated and swapped, values swapped between
//! keys, numbers replaced by edge and huge ones, addresses by ones of the
//! wrong class (IPv4-mapped ones, a VIP's, loopback), prefixes and MACs
//! with a sign or host bits, names by long and unprintable ones, sections
//! (fleets, ports 0, drained backends) added, token
//! and routes files of every kind; and whole files built to hurt: include
//! cycles, diamonds of 55 to 80 levels, chains of 6,000 pools, includes that
//! resolve to millions of backends, tables that add up to more memory than
//! any machine has. Every one goes through the validation `check-config`
//! and the daemon share (`lb::config::Config::load`) on a thread with a 256
//! KiB stack (no recursion on the configuration's depth), each within 5 s
//! (a watchdog fails the test on a hang), none panicking. A sample of 150
//! is then given to the real binary, as `fastpath lb check-config FILE` and
//! as `fastpath lb run --config FILE --pcap-in SAMPLE --pcap-out OUT`: both
//! accept it or both refuse it, as the validation did.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MUTANTS: usize = 5_000;
const SAMPLE: usize = 150;
const DEADLINE: Duration = Duration::from_secs(5);

/// splitmix64: a seeded generator, so a failure names a mutant that the
/// next run makes again.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let d = std::env::temp_dir().join(format!("fastpath-mutants-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every section and most keys, valid. `TOKEN` and `VIPS` are replaced by
/// files in the scratch directory.
const FULL: &str = r#"[forwarder]
threads = 1
batch = 32
batch_timeout_us = 50
queue_size = 256
pool_buffers = 4096
frag_table_size = 1024
frag_timeout_ms = 1000

[conntrack]
size = 4096
tcp_timeout_s = 300
udp_timeout_s = 30

[encap]
source = "10.0.0.1"
source6 = "fd00::1"
mac = "02:00:00:00:00:01"
gateway_mac = "02:00:00:00:00:fe"
ttl = 64
source_prefix = "198.18.100.0/24"

[api]
listen = "127.0.0.1:9180"
token_file = "TOKEN"

[bgp]
vips_file = "VIPS"
protocol = "fastpath_vips"
birdc = ["birdc", "-s", "/run/bird/bird.ctl"]
poll_ms = 500
drain_ms = 3000
drain_quiet_ms = 300

[tracer]
enabled = true
report_to = ["10.9.0.0/24"]
rate_per_s = 100
burst = 100
name = "lb1"

[[pools]]
name = "web"
table_size = 251
backends = [{ address = "10.1.0.1" }, { address = "10.1.0.2", weight = 2, name = "b2" }]
include = ["extra"]
drained = ["b2"]
health = { kind = "http", port = 80, path = "/", expect_status = 200, interval_ms = 1000, timeout_ms = 500, rise = 2, fall = 2 }

[[pools]]
name = "extra"
table_size = 1009
backends = [{ address = "10.1.0.3" }, { address = "fd00:1::3", name = "six" }]

[[prefix_groups]]
name = "class-a"
prefixes = ["74.125.0.0/16", "173.194.0.0/16"]
cluster_prefix_len = 24

[[vips]]
name = "http"
address = "192.0.2.80"
port = 80
protocol = "tcp"
pool = "web"

[[vips]]
name = "svc"
prefix_group = "class-a"
suffix = "0.0.0.1"
port = 443
protocol = "tcp"
pool = "extra"

[[vips]]
name = "v6"
address = "2001:db8::80"
protocol = "udp"
pool = "extra"
"#;

/// A fleet member with IPv6 peers and tunnel health checks.
const FLEET: &str = r#"[encap]
source = "10.0.0.1"
source6 = "fd00::1"

[fleet]
peers = ["fd00::1", "fd00::2", "fd00::3"]
name = "lb1"
health = { kind = "tcp", port = 179, interval_ms = 200, timeout_ms = 100 }

[[pools]]
name = "a"
backends = [{ address = "fd00:1::1" }, { address = "fd00:1::2", weight = 3 }]
health = { kind = "tcp", port = 80, via = "tunnel" }

[[pools]]
name = "b"
include = ["a"]
backends = [{ address = "10.2.0.1", name = "v4" }]

[[vips]]
name = "x"
address = "2001:db8::1"
port = 53
protocol = "udp"
pool = "b"
"#;

/// The least a configuration holds.
const SMALL: &str = r#"[encap]
source = "10.0.0.1"
[[pools]]
name = "p"
backends = [{ address = "10.1.0.1" }]
[[vips]]
name = "v"
address = "192.0.2.1"
protocol = "tcp"
pool = "p"
"#;

const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "4",
    "31",
    "64",
    "65",
    "100",
    "599",
    "600",
    "1024",
    "65535",
    "65536",
    "65537",
    "131072",
    "655373",
    "16777213",
    "16777259",
    "500000003",
    "2147483647",
    "4294967295",
    "4294967296",
    "4611686018427387904",
    "9000000000000000000",
    "9223372036854775807",
    "-1",
    "1e300",
    "1e-300",
    "nan",
    "0.5",
];

const ADDRESSES: &[&str] = &[
    "0.0.0.0",
    "255.255.255.255",
    "224.0.0.1",
    "239.255.255.250",
    "127.0.0.1",
    "127.0.0.2",
    "::",
    "::1",
    "ff02::1",
    "::ffff:127.0.0.1",
    "10.7.0.9",
    "10.1.0.1",
    "192.0.2.80",
    "fd00::9",
    "2001:db8::80",
    "10.0.0.1",
    "::ffff:192.0.2.80",
    "not-an-address",
];

const MACS: &[&str] = &[
    "ff:ff:ff:ff:ff:ff",
    "01:00:5e:00:00:01",
    "00:00:00:00:00:00",
    "33:33:00:00:00:01",
    "02:aa:bb:cc:dd:ee",
    "02:aa:bb:cc:dd",
    "+2:0:0:0:0:1",
];

const PREFIXES: &[&str] = &[
    "0.0.0.0/0",
    "128.0.0.0/1",
    "224.0.0.0/4",
    "255.255.255.255/32",
    "10.9.0.0/24",
    "10.9.0.0/33",
    "::/0",
    "ff02::/16",
    "fd00:9::/64",
    "74.125.0.0",
    "74.125.0.0/+16",
    "74.125.0.1/16",
    "224.0.0.0/16",
];

/// Lines a mutant may gain (in whatever section they land).
const EXTRA_LINES: &[&str] = &[
    "colour = \"blue\"",
    "[fleet]\npeers = [\"10.0.0.1\", \"10.0.0.2\"]",
    "[fleet]\npeers = [\"10.0.0.2\"]",
    "[fleet]\npeers = [\"10.0.0.1\", \"255.255.255.255\"]",
    "gateway_mac = \"ff:ff:ff:ff:ff:ff\"",
    "report_to = [\"0.0.0.0/0\"]",
    "expect_status = 0",
    "poll_ms = 9000000000000000000",
    "[[pools]]\nname = \"web\"",
    "[[pools]]\nname = \"loop\"\ninclude = [\"loop\"]",
    "[[vips]]\nname = \"dup\"\naddress = \"192.0.2.80\"\nport = 80\nprotocol = \"tcp\"\npool = \"web\"",
    "[[prefix_groups]]\nname = \"empty\"\nprefixes = []\ncluster_prefix_len = 200",
    "[[vips]]\nname = \"s6\"\nprefix_group = \"class-a\"\nsuffix = \"::1\"\nprotocol = \"udp\"\npool = \"web\"",
    "[forwarder]\ndriver = \"xdp\"",
    "[api]\nlisten = \"0.0.0.0:9180\"",
    "[api]\nlisten = \"127.0.0.1:0\"",
    "[fleet]\npeers = [\"10.0.0.1\", \"127.0.0.1\"]",
    "[fleet]\npeers = [\"10.0.0.1\", \"192.0.2.80\"]",
    "drained = [\"10.1.0.1\"]",
    "health = { kind = \"tcp\", port = 0 }",
    "include = [\"nowhere\"]",
    "drained = [\"10.1.0.1\", \"10.1.0.1\"]",
    "health = { kind = \"tcp\", port = 80, interval_ms = 0 }",
    "a = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    "",
];

/// The kinds of token and routes files a mutant may name.
struct Files {
    tokens: Vec<String>,
    vips: Vec<String>,
}

impl Files {
    fn new(dir: &Scratch) -> Files {
        let s = |p: PathBuf| p.display().to_string();
        let _ = std::fs::create_dir_all(dir.path("a-dir"));
        Files {
            tokens: vec![
                s(dir.write("token", "a-long-enough-secret-token\n")),
                s(dir.write("short-token", "short\n")),
                s(dir.write("big-token", &"t".repeat(5000))),
                s(dir.path("missing-token")),
                s(dir.path("a-dir")),
                "/dev/zero".into(),
            ],
            vips: vec![
                s(dir.path("vips-not-yet.conf")),
                s(dir.write("vips.conf", lb::config::VIPS_FILE_HEADER)),
                s(dir.write("placeholder.conf", "# filled in by fastpath\n")),
                "/etc/passwd".into(),
                s(dir.path("a-dir")),
                s(dir.write("bird.conf", "router id 10.0.0.1;\n")),
            ],
        }
    }
}

/// Replaces the `n`-th match of `find` in `line` (a value) by `with`.
fn replace_value(
    line: &str,
    find: impl Fn(&str) -> Vec<(usize, usize)>,
    with: &str,
    n: usize,
) -> Option<String> {
    let spans = find(line);
    let (a, b) = *spans.get(n % spans.len().max(1))?;
    Some(format!("{}{with}{}", &line[..a], &line[b..]))
}

/// Spans of integer literals (digits not inside a word or a quoted string).
fn numbers(line: &str) -> Vec<(usize, usize)> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    let mut quoted = false;
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' {
            quoted = !quoted;
        }
        let word_before =
            i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b'.');
        if !quoted && b[i].is_ascii_digit() && !word_before {
            let start = i;
            while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'_') {
                i += 1;
            }
            out.push((start, i));
            continue;
        }
        i += 1;
    }
    out
}

/// Spans of the insides of quoted strings.
fn strings(line: &str) -> Vec<(usize, usize)> {
    let idx: Vec<usize> = line.match_indices('"').map(|(i, _)| i).collect();
    idx.chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| (c[0] + 1, c[1]))
        .collect()
}

/// One mutation of `text`.
fn mutate(rng: &mut Rng, text: &str, files: &Files) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        return text.to_string();
    }
    let i = rng.below(lines.len());
    match rng.below(16) {
        0 => {
            lines.remove(i);
        }
        1 => {
            let l = lines[i].clone();
            lines.insert(i, l);
        }
        2 => {
            let j = rng.below(lines.len());
            lines.swap(i, j);
        }
        3 => {
            // A value moved to another key.
            let j = rng.below(lines.len());
            if let (Some((ka, _)), Some((_, vb))) =
                (lines[i].split_once(" = "), lines[j].split_once(" = "))
            {
                lines[i] = format!("{ka} = {vb}");
            }
        }
        4..=6 => {
            let with = rng.pick(NUMBERS).to_string();
            let n = rng.below(4);
            if let Some(l) = replace_value(&lines[i], numbers, &with, n) {
                lines[i] = l;
            }
        }
        7..=9 => {
            // A string: an address of another class, a MAC, a prefix, a
            // long or unprintable name, nothing.
            let long = |n: usize| "n".repeat(n);
            let with = match rng.below(8) {
                0 | 1 => rng.pick(ADDRESSES).to_string(),
                2 => rng.pick(MACS).to_string(),
                3 => rng.pick(PREFIXES).to_string(),
                4 => long(*rng.pick(&[255, 256, 65_536, 70_000])),
                5 => "a\\nb".into(),
                6 => String::new(),
                _ => "web".into(),
            };
            let n = rng.below(3);
            if let Some(l) = replace_value(&lines[i], strings, &with, n) {
                lines[i] = l;
            }
        }
        10 | 11 => lines.insert(i, rng.pick(EXTRA_LINES).to_string()),
        12 => {
            let t = rng.pick(&files.tokens).clone();
            let t = format!("token_file = \"{t}\"");
            match lines.iter().position(|l| l.starts_with("token_file")) {
                Some(k) => lines[k] = t,
                None => lines.insert(0, format!("[api]\nlisten = \"127.0.0.1:9180\"\n{t}")),
            }
        }
        13 => {
            let v = rng.pick(&files.vips).clone();
            let v = format!("vips_file = \"{v}\"");
            match lines.iter().position(|l| l.starts_with("vips_file")) {
                Some(k) => lines[k] = v,
                None => lines.insert(0, format!("[bgp]\n{v}")),
            }
        }
        _ => {
            // Cut anywhere.
            let cut = rng.below(lines[i].len() + 1);
            let mut l = lines[i].clone();
            while !l.is_char_boundary(cut.min(l.len())) {
                l.pop();
            }
            l.truncate(cut.min(l.len()));
            lines[i] = l;
        }
    }
    lines.join("\n") + "\n"
}

/// `n` pools including each other in a ring (a cycle of `n`), or with the
/// last including one in the middle.
fn cycle(rng: &mut Rng) -> String {
    let n = 2 + rng.below(60);
    let back = rng.below(n);
    let mut t = String::from("[encap]\nsource = \"10.0.0.1\"\n");
    for i in 0..n {
        let next = if i + 1 < n { i + 1 } else { back };
        t += &format!(
            "[[pools]]\nname = \"c{i}\"\ninclude = [\"c{next}\"]\nbackends = [{{ address = \"10.1.{}.{}\" }}]\n",
            i / 200,
            i % 200 + 1
        );
    }
    t + "[[vips]]\nname = \"v\"\naddress = \"192.0.2.1\"\nprotocol = \"tcp\"\npool = \"c0\"\n"
}

/// Two pools a level, each including both of the next: 2^levels paths.
fn diamond(levels: usize) -> String {
    let mut t = String::from("[encap]\nsource = \"10.0.0.1\"\n");
    for l in 0..levels {
        for side in ["a", "b"] {
            t += &format!("[[pools]]\nname = \"l{l}{side}\"\n");
            if l + 1 < levels {
                t += &format!("include = [\"l{n}a\", \"l{n}b\"]\n", n = l + 1);
            }
            t += &format!(
                "backends = [{{ address = \"10.{}.{}.{}\" }}]\n",
                1 + l / 100,
                l % 100,
                if side == "a" { 1 } else { 2 }
            );
        }
    }
    t + "[[vips]]\nname = \"v\"\naddress = \"192.0.2.1\"\nprotocol = \"tcp\"\npool = \"l0a\"\n"
}

/// `n` pools in a chain.
fn chain(n: usize) -> String {
    let mut t = String::from("[encap]\nsource = \"10.0.0.1\"\n");
    for i in 0..n {
        t += &format!("[[pools]]\nname = \"p{i}\"\n");
        if i + 1 < n {
            t += &format!("include = [\"p{}\"]\n", i + 1);
        } else {
            t += "backends = [{ address = \"10.1.0.1\" }]\n";
        }
    }
    t + "[[vips]]\nname = \"v\"\naddress = \"192.0.2.1\"\nprotocol = \"tcp\"\npool = \"p0\"\n"
}

/// `pools` pools each including one pool of `backends` backends: their
/// includes resolve to pools x backends.
fn wide(pools: usize, backends: usize) -> String {
    let mut t =
        String::from("[encap]\nsource = \"10.0.0.1\"\n[[pools]]\nname = \"big\"\nbackends = [\n");
    for b in 0..backends {
        t += &format!(
            "{{ address = \"10.{}.{}.{}\" }},\n",
            1 + b / 65_536,
            (b / 256) % 256,
            b % 256
        );
    }
    t += "]\n";
    for p in 0..pools {
        t += &format!("[[pools]]\nname = \"w{p}\"\ninclude = [\"big\"]\n");
    }
    t + "[[vips]]\nname = \"v\"\naddress = \"192.0.2.1\"\nprotocol = \"tcp\"\npool = \"w0\"\n"
}

/// `n` VIPs over `n` pools of tables of `size` slots.
fn many_tables(n: usize, size: u64) -> String {
    let mut t = String::from("[encap]\nsource = \"10.0.0.1\"\n");
    for i in 0..n {
        t += &format!(
            "[[pools]]\nname = \"t{i}\"\ntable_size = {size}\nbackends = [{{ address = \"10.1.{}.{}\" }}]\n\
             [[vips]]\nname = \"v{i}\"\naddress = \"192.0.{}.{}\"\nprotocol = \"tcp\"\npool = \"t{i}\"\n",
            i / 250,
            i % 250 + 1,
            2 + i / 250,
            i % 250 + 1
        );
    }
    t
}

/// A file built whole to hurt, or a base file mutated one to four times.
fn mutant(rng: &mut Rng, i: usize, files: &Files, bases: &[String]) -> String {
    // A few of each built kind, spread over the run.
    match i % 100 {
        7 => return cycle(rng),
        17 => return diamond(55 + rng.below(26)),
        27 if i % 1000 == 27 => return chain(6_000),
        37 if i % 1000 == 37 => return wide(1_100, 4_000),
        47 if i % 500 == 47 => return many_tables(2_000, 16_777_213),
        57 => {
            // Names of any length.
            let n = *rng.pick(&[255usize, 256, 65_536, 70_000]);
            let name = "n".repeat(n);
            let base = rng.pick(bases).clone();
            return base.replacen("name = \"", &format!("name = \"{name}"), 1 + rng.below(3));
        }
        67 => {
            // Sizes at and past their bounds.
            let (k, v) = *rng.pick(&[
                ("table_size", "2147483647"),
                ("table_size", "500000003"),
                ("table_size", "16777259"),
                ("queue_size", "4611686018427387904"),
                ("size", "1099511627776"),
                ("frag_table_size", "1099511627776"),
                ("pool_buffers", "4294967295"),
            ]);
            let base = &bases[0];
            return base
                .lines()
                .map(|l| {
                    if l.starts_with(&format!("{k} = ")) {
                        format!("{k} = {v}")
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
        }
        _ => {}
    }
    let mut text = rng.pick(bases).clone();
    for _ in 0..1 + rng.below(4) {
        text = mutate(rng, &text, files);
    }
    text
}

/// What the shared validation said, and how long it took.
#[derive(Clone, Debug)]
struct Verdict {
    accepted: bool,
    why: String,
    memory: u64,
    took: Duration,
}

#[test]
fn check_config_and_lb_run_agree_on_mutated_configurations() {
    let started = Instant::now();
    let dir = Scratch::new();
    let files = Files::new(&dir);
    let bases: Vec<String> = [FULL, FLEET, SMALL]
        .iter()
        .map(|b| {
            b.replace("TOKEN", &files.tokens[0])
                .replace("VIPS", &files.vips[1])
        })
        .collect();
    for (k, b) in bases.iter().enumerate() {
        let p = dir.write(&format!("base{k}.toml"), b);
        if let Err(e) = lb::config::Config::load(&p) {
            panic!("base {k} is not valid: {e}");
        }
    }
    let mut rng = Rng(0x5eed_f00d_0031);
    let paths: Vec<PathBuf> = (0..MUTANTS)
        .map(|i| dir.write(&format!("m{i}.toml"), &mutant(&mut rng, i, &files, &bases)))
        .collect();

    // The shared validation, on a small stack, under a watchdog.
    let current = Arc::new(AtomicUsize::new(usize::MAX));
    let since_ms = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let verdicts: Arc<Mutex<Vec<Option<Verdict>>>> = Arc::new(Mutex::new(vec![None; MUTANTS]));
    let panics: Arc<Mutex<Vec<(usize, String)>>> = Arc::new(Mutex::new(Vec::new()));
    let clock = Instant::now();
    let worker = {
        let (paths, current, since_ms, done, verdicts, panics) = (
            paths.clone(),
            Arc::clone(&current),
            Arc::clone(&since_ms),
            Arc::clone(&done),
            Arc::clone(&verdicts),
            Arc::clone(&panics),
        );
        std::thread::Builder::new()
            .name("validate".into())
            .stack_size(256 << 10)
            .spawn(move || {
                for (i, p) in paths.iter().enumerate() {
                    since_ms.store(clock.elapsed().as_millis() as u64, Ordering::Release);
                    current.store(i, Ordering::Release);
                    let t = Instant::now();
                    let r = std::panic::catch_unwind(|| lb::config::Config::load(p));
                    let took = t.elapsed();
                    let v = match r {
                        Ok(Ok(c)) => Verdict {
                            accepted: true,
                            why: String::new(),
                            memory: c.memory.total(),
                            took,
                        },
                        Ok(Err(e)) => Verdict {
                            accepted: false,
                            why: format!(
                                "{}: {}",
                                e.key,
                                e.problem.chars().take(120).collect::<String>()
                            ),
                            memory: 0,
                            took,
                        },
                        Err(p) => {
                            let msg = p
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default();
                            panics.lock().unwrap().push((i, msg));
                            continue;
                        }
                    };
                    verdicts.lock().unwrap()[i] = Some(v);
                    done.fetch_add(1, Ordering::Release);
                }
                current.store(usize::MAX, Ordering::Release);
            })
            .unwrap()
    };
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let i = current.load(Ordering::Acquire);
        if worker.is_finished() {
            break;
        }
        if i == usize::MAX {
            continue;
        }
        let since = Duration::from_millis(since_ms.load(Ordering::Acquire));
        let busy = clock.elapsed().saturating_sub(since);
        if busy > DEADLINE && current.load(Ordering::Acquire) == i {
            let text = std::fs::read_to_string(&paths[i]).unwrap_or_default();
            let head: String = text.chars().take(600).collect();
            panic!("mutant {i} took more than {DEADLINE:?} to validate:\n{head}");
        }
    }
    // A stack overflow would have aborted the process; a panic is listed.
    worker.join().expect("the validation thread");
    let panics = panics.lock().unwrap();
    assert!(
        panics.is_empty(),
        "{} mutants panicked; first: {:?}",
        panics.len(),
        &panics[..panics.len().min(5)]
    );
    let verdicts: Vec<Verdict> = verdicts
        .lock()
        .unwrap()
        .iter()
        .map(|v| v.clone().unwrap())
        .collect();
    let accepted = verdicts.iter().filter(|v| v.accepted).count();
    let validated_in = started.elapsed();
    eprintln!(
        "{MUTANTS} mutants validated in {validated_in:?}: {accepted} accepted, {} refused",
        MUTANTS - accepted
    );
    // What refused them, by key (for whoever reads the log).
    let mut by_key: std::collections::BTreeMap<String, usize> = Default::default();
    for v in verdicts.iter().filter(|v| !v.accepted) {
        let key = v.why.split([':', '[', '.']).next().unwrap_or("");
        let key = if key.starts_with("line") {
            "syntax"
        } else {
            key
        }
        .to_string();
        *by_key.entry(key).or_default() += 1;
    }
    eprintln!("refused by: {by_key:?}");
    let mut slowest: Vec<(Duration, usize)> = verdicts
        .iter()
        .enumerate()
        .map(|(i, v)| (v.took, i))
        .collect();
    slowest.sort_unstable_by(|a, b| b.cmp(a));
    eprintln!("slowest: {:?}", &slowest[..5]);
    // The generator must reach both sides.
    assert!(
        accepted >= MUTANTS / 10 && MUTANTS - accepted >= MUTANTS / 10,
        "{accepted} accepted"
    );

    // The binaries, on a sample: every MUTANTS/SAMPLE-th mutant, skipping
    // those whose memory estimate lies between 256 MiB and 1 TiB (whether
    // they fit depends on the machine, and starting one would allocate
    // gigabytes); the rest of the sample moves to the next mutant.
    let pcap = dir.path("in.pcap");
    let o = Command::new(env!("CARGO_BIN_EXE_fastpath"))
        .args(["lb", "sample-pcap", "--out"])
        .arg(&pcap)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut sample = Vec::new();
    let mut i = 0;
    while sample.len() < SAMPLE && i < MUTANTS {
        let m = verdicts[i].memory;
        if !(m > 256 << 20 && m < 1 << 40) {
            sample.push(i);
            i += MUTANTS / SAMPLE;
        } else {
            i += 1;
        }
    }
    assert_eq!(sample.len(), SAMPLE);
    let sampled_accepted = sample.iter().filter(|&&i| verdicts[i].accepted).count();
    assert!(
        sampled_accepted >= SAMPLE / 10 && SAMPLE - sampled_accepted >= SAMPLE / 10,
        "the sample has {sampled_accepted} accepted mutants of {SAMPLE}"
    );
    let next = AtomicUsize::new(0);
    let disagreements: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let run = |args: &[&str], path: &Path| -> (bool, String) {
        let o = Command::new(env!("CARGO_BIN_EXE_fastpath"))
            .args(args)
            .arg(path)
            .args(if args[1] == "run" {
                vec![
                    "--pcap-in".to_string(),
                    pcap.display().to_string(),
                    "--pcap-out".into(),
                    dir.path(&format!(
                        "out-{}.pcap",
                        path.file_stem().unwrap().to_string_lossy()
                    ))
                    .display()
                    .to_string(),
                ]
            } else {
                vec![]
            })
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        let err: String = String::from_utf8_lossy(&o.stderr)
            .chars()
            .take(300)
            .collect();
        (o.status.success(), err)
    };
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&i) = sample.get(k) else { break };
                let p = &paths[i];
                let (check, check_err) = run(&["lb", "check-config"], p);
                let (start, start_err) = run(&["lb", "run", "--config"], p);
                let v = &verdicts[i];
                if check != start || check != v.accepted {
                    disagreements.lock().unwrap().push(format!(
                        "mutant {i}: validation {} ({}), check-config {check} ({check_err}), lb run {start} ({start_err})",
                        v.accepted, v.why
                    ));
                }
            });
        }
    });
    let disagreements = disagreements.into_inner().unwrap();
    assert!(
        disagreements.is_empty(),
        "{} of {SAMPLE} disagree:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
    eprintln!(
        "{SAMPLE} mutants through both binaries; {:?} in all",
        started.elapsed()
    );
}
