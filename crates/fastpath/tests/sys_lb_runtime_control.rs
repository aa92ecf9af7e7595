//! Runtime control without editing files: `fastpath lb drain`,
//! `undrain` and `weight` against a running daemon (`lb run --interface`
//! on a veth pair in a namespace of its own, AF_PACKET, API on the
//! namespace's loopback with a bearer token). The change shows in `lb
//! status`, is written back into the configuration file with its comments,
//! survives a restart, and is refused whole (nothing changed) for an
//! unknown backend, without the token, or when the file was edited since
//! it was loaded.

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use lab::netns::{self, Netns};

/// The API inside the namespace.
const API: &str = "127.0.0.1:9187";

/// Comments everywhere; backend `b2` is in two pools (own backends of
/// both), `b1` in one.
const CONFIG: &str = r#"# The runtime-control test's load balancer.
[api]
listen = "127.0.0.1:9187" # loopback of the test's namespace
token_file = "TOKEN_FILE"

[encap]
source = "10.0.0.1" # outer source

# Web servers.
[[pools]]
name = "web"
backends = [
  { address = "10.2.0.1", name = "b1", weight = 2 }, # the big one
  { address = "10.2.0.2", name = "b2", weight = 3 },
]

# The same machine b2 serves the API pool too.
[[pools]]
name = "api"
backends = [{ address = "10.2.0.2", name = "b2", weight = 3 }] # shared

[[vips]]
name = "http"
address = "198.18.0.80"
port = 80
protocol = "tcp"
pool = "web"

[[vips]]
name = "api"
address = "198.18.0.81"
port = 443
protocol = "tcp"
pool = "api"
"#;

const TOKEN: &str = "ops-runtime-control-test-token";

struct Daemon {
    child: Child,
}

impl Daemon {
    fn start(ns: &Netns, config: &Path) -> Daemon {
        let child = ns
            .command(env!("CARGO_BIN_EXE_fastpath"))
            .args(["lb", "run", "--config"])
            .arg(config)
            .args([
                "--interface",
                "x0",
                "--driver",
                "af-packet",
                "--threads",
                "0",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut d = Daemon { child };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            assert!(
                d.child.try_wait().unwrap().is_none(),
                "`lb run` exited at start"
            );
            if cli(ns, &["lb", "status", "--api", API]).status.success() {
                return d;
            }
            assert!(Instant::now() < deadline, "the API did not answer in 20 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(mut self) {
        // SAFETY: kill(2) on our own, unreaped child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "`lb run` did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `fastpath ARGS` inside the namespace, bounded.
fn cli(ns: &Netns, args: &[&str]) -> Output {
    let mut c = ns.command("timeout");
    c.arg("20").arg(env!("CARGO_BIN_EXE_fastpath")).args(args);
    c.output().unwrap()
}

fn ok(ns: &Netns, args: &[&str]) -> String {
    let o = cli(ns, args);
    assert!(
        o.status.success(),
        "fastpath {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn status(ns: &Netns) -> serde_json::Value {
    serde_json::from_str(&ok(ns, &["lb", "status", "--api", API, "--format", "json"])).unwrap()
}

/// (weight, drained) of `backend` in every VIP that has it.
fn backend_in(s: &serde_json::Value, backend: &str) -> Vec<(u64, bool)> {
    s["vips"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|v| v["backends"].as_array().unwrap().iter())
        .filter(|b| b["name"] == backend)
        .map(|b| {
            (
                b["weight"].as_u64().unwrap(),
                b["drained"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn comment_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.find('#').map(|i| l[i..].trim_end()))
        .collect()
}

struct Files(PathBuf);

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
#[ignore = "system test: root, namespaces"]
fn drain_undrain_and_weight_through_the_cli_survive_a_restart() {
    systest::require_netns();
    let pid = std::process::id() % 100_000;
    let dir = std::env::temp_dir().join(format!("fpops-rc-{pid}"));
    std::fs::create_dir_all(&dir).unwrap();
    let _files = Files(dir.clone());
    let token_file = dir.join("api.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let config = dir.join("lb.toml");
    let original = CONFIG.replace("TOKEN_FILE", &token_file.display().to_string());
    std::fs::write(&config, &original).unwrap();
    let tf = token_file.display().to_string();

    let ns = Netns::new(&format!("fpops-rc-{pid}")).unwrap();
    ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        .unwrap();
    netns::veth(
        &ns,
        "x0",
        "02:00:00:00:0e:01",
        &ns,
        "x1",
        "02:00:00:00:0e:02",
    )
    .unwrap();
    let d = Daemon::start(&ns, &config);
    let s = status(&ns);
    assert_eq!(s["generation"], 1, "{s}");
    assert_eq!(backend_in(&s, "b2"), [(3, false), (3, false)]);

    // Traffic for no VIP (what the kernel's own traffic is on AF_PACKET):
    // counted as not for a VIP, not as dropped.
    ns.ip(&["addr", "add", "198.18.1.2/24", "dev", "x1"])
        .unwrap();
    ns.ip(&[
        "neigh",
        "replace",
        "198.18.1.1",
        "lladdr",
        "02:00:00:00:0e:01",
        "dev",
        "x1",
    ])
    .unwrap();
    ns.exec(&[
        "bash",
        "-c",
        "for i in 1 2 3; do echo x > /dev/udp/198.18.1.1/9; done",
    ])
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let s = loop {
        let s = status(&ns);
        if s["not_for_vip_by_kind"]["no_vip"].as_u64() >= Some(3) || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(s["not_for_vip"].as_u64() >= Some(3), "{s}");
    assert_eq!(s["dropped"], 0, "{s}");
    assert!(s["drops"].get("no_vip").is_none(), "{s}");
    let text = ok(&ns, &["lb", "status", "--api", API]);
    assert!(text.contains("dropped 0, not for a VIP"), "{text}");

    // Without the token: refused, nothing changed.
    let o = cli(&ns, &["lb", "drain", "b2", "--api", API]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Drain b2: both pools, weight kept, written back with the comments.
    let out = ok(
        &ns,
        &["lb", "drain", "b2", "--api", API, "--token-file", &tf],
    );
    assert!(
        out.contains("drained") && out.contains("web") && out.contains("api"),
        "{out}"
    );
    let s = status(&ns);
    assert_eq!(backend_in(&s, "b2"), [(3, true), (3, true)], "{s}");
    assert_eq!(backend_in(&s, "b1"), [(2, false)]);
    assert_eq!(s["generation"], 2, "{s}");
    assert_eq!(s["runtime_changes"], 1, "{s}");
    let text = ok(&ns, &["lb", "status", "--api", API]);
    let row = text.lines().find(|l| l.contains(" b2 ")).unwrap();
    assert!(row.contains("drained") && !row.contains(" up "), "{text}");
    let written = std::fs::read_to_string(&config).unwrap();
    assert_eq!(
        comment_lines(&written),
        comment_lines(&original),
        "{written}"
    );
    assert_eq!(
        written.matches("drained = [\"b2\"]").count(),
        2,
        "{written}"
    );

    // An unknown backend: a clear error, nothing changed.
    let o = cli(
        &ns,
        &["lb", "drain", "nope", "--api", API, "--token-file", &tf],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("404") && err.contains("nope"),
        "{err}"
    );
    assert_eq!(status(&ns)["generation"], 2);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), written);

    // Someone edits the file: not overwritten.
    let edited = format!("{written}# a hand edit, not reloaded yet\n");
    std::fs::write(&config, &edited).unwrap();
    let o = cli(
        &ns,
        &["lb", "weight", "b1", "5", "--api", API, "--token-file", &tf],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("changed on disk"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&config).unwrap(), edited);
    assert_eq!(backend_in(&status(&ns), "b1"), [(2, false)]);

    // `lb reload` applies the hand edit: a comment after the last VIP, so
    // only that [[vips]] element is parsed again.
    let o = cli(&ns, &["lb", "reload", "--api", API]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("401"), "{err}");
    let out = ok(&ns, &["lb", "reload", "--api", API, "--token-file", &tf]);
    assert!(
        out.contains("reloaded: configuration generation 3")
            && out.contains("1 of its 4 [[pools]]/[[vips]] elements parsed again"),
        "{out}"
    );
    // A broken file is rejected whole, naming its line; what runs stays.
    let broken = edited.replace("port = 443", "port = \"https\"");
    std::fs::write(&config, &broken).unwrap();
    let o = cli(&ns, &["lb", "reload", "--api", API, "--token-file", &tf]);
    let err = String::from_utf8_lossy(&o.stderr);
    let line = broken.lines().position(|l| l.contains("https")).unwrap() + 1;
    assert!(
        !o.status.success() && err.contains(&format!("line {line}")),
        "{err}"
    );
    let s = status(&ns);
    assert_eq!(s["generation"], 3, "{s}");
    assert_eq!(backend_in(&s, "b2"), [(3, true), (3, true)], "{s}");
    // Back to the written file, by a reload in JSON.
    std::fs::write(&config, &written).unwrap();
    let r: serde_json::Value = serde_json::from_str(&ok(
        &ns,
        &[
            "lb",
            "reload",
            "--api",
            API,
            "--token-file",
            &tf,
            "--format",
            "json",
        ],
    ))
    .unwrap();
    assert_eq!(r["generation"], 4, "{r}");
    // The rejected file cost nothing: the pieces of the applied one were
    // kept, and only the last element (the comment) is parsed again.
    assert_eq!(r["parsed"]["chunks"], 4, "{r}");
    assert_eq!(r["parsed"]["parsed"], 1, "{r}");
    // --threads 0 on the command line is not a change of the file's
    // forwarder.threads waiting for a restart.
    assert_eq!(r["not_applied"], serde_json::json!([]), "{r}");

    // A weight: applied, written, drained state untouched.
    ok(
        &ns,
        &["lb", "weight", "b1", "5", "--api", API, "--token-file", &tf],
    );
    let s = status(&ns);
    assert_eq!(backend_in(&s, "b1"), [(5, false)]);
    assert_eq!(backend_in(&s, "b2"), [(3, true), (3, true)]);

    // A restart keeps the changes.
    d.stop();
    let d = Daemon::start(&ns, &config);
    let s = status(&ns);
    assert_eq!(s["generation"], 1, "{s}");
    assert_eq!(backend_in(&s, "b2"), [(3, true), (3, true)], "{s}");
    assert_eq!(backend_in(&s, "b1"), [(5, false)]);

    // Undrain: the weight it kept applies again; the lists go.
    let out = ok(
        &ns,
        &["lb", "undrain", "b2", "--api", API, "--token-file", &tf],
    );
    assert!(out.contains("undrained"), "{out}");
    let s = status(&ns);
    assert_eq!(backend_in(&s, "b2"), [(3, false), (3, false)], "{s}");
    let after = std::fs::read_to_string(&config).unwrap();
    assert!(!after.contains("drained"), "{after}");
    assert_eq!(after, original.replace("weight = 2 }", "weight = 5 }"));

    // Fleet-wide, with several --api (here the same daemon twice, and a
    // load balancer that does not answer): nothing changes anywhere unless
    // every one answers; then each one's answer is printed.
    let o = cli(
        &ns,
        &[
            "lb",
            "drain",
            "b1",
            "--api",
            &format!("{API},127.0.0.1:1"),
            "--token-file",
            &tf,
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("nothing changed on any load balancer"),
        "{err}"
    );
    assert_eq!(backend_in(&status(&ns), "b1"), [(5, false)]);
    let out = ok(
        &ns,
        &[
            "lb",
            "drain",
            "b1",
            "--api",
            API,
            "--api",
            API,
            "--token-file",
            &tf,
        ],
    );
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with(&format!("{API}: b1: ")))
            .count(),
        2,
        "{out}"
    );
    assert_eq!(backend_in(&status(&ns), "b1"), [(5, true)]);
    let r: serde_json::Value = serde_json::from_str(&ok(
        &ns,
        &[
            "lb",
            "reload",
            "--api",
            &format!("{API},{API}"),
            "--token-file",
            &tf,
            "--format",
            "json",
        ],
    ))
    .unwrap();
    assert_eq!(
        (&r["applied"], &r["sent"]),
        (&true.into(), &true.into()),
        "{r}"
    );
    assert_eq!(r["lbs"].as_array().unwrap().len(), 2, "{r}");
    d.stop();
}

/// A reload that moves the API (`[api] listen`) or rotates its token (the
/// token file's content) used to answer 200 while the old address and
/// token stayed in use: refused now (the CLI fails with the daemon's
/// reason, saying a restart is needed), nothing applied, the API where it
/// was with the token it started with; once the file is back, a reload
/// applies.
#[test]
#[ignore = "system test: root, namespaces"]
fn a_reload_that_moves_the_api_or_rotates_its_token_is_refused_until_a_restart() {
    systest::require_netns();
    let pid = std::process::id() % 100_000;
    let dir = std::env::temp_dir().join(format!("fpops-rs-{pid}"));
    std::fs::create_dir_all(&dir).unwrap();
    let _files = Files(dir.clone());
    let token_file = dir.join("api.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let old_token = dir.join("old.token");
    std::fs::write(&old_token, format!("{TOKEN}\n")).unwrap();
    let config = dir.join("lb.toml");
    let original = CONFIG.replace("TOKEN_FILE", &token_file.display().to_string());
    std::fs::write(&config, &original).unwrap();
    let (tf, old) = (
        token_file.display().to_string(),
        old_token.display().to_string(),
    );
    let ns = Netns::new(&format!("fpops-rs-{pid}")).unwrap();
    ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        .unwrap();
    netns::veth(
        &ns,
        "x0",
        "02:00:00:00:0e:01",
        &ns,
        "x1",
        "02:00:00:00:0e:02",
    )
    .unwrap();
    let d = Daemon::start(&ns, &config);
    assert_eq!(status(&ns)["generation"], 1);

    // The token rotated in its file: the daemon still takes only the old
    // one, so a reload sent with it is refused as needing a restart.
    std::fs::write(&token_file, "a-new-token-after-a-leak\n").unwrap();
    let o = cli(&ns, &["lb", "reload", "--api", API, "--token-file", &old]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("token") && err.contains("restart"),
        "{err}"
    );
    let o = cli(&ns, &["lb", "reload", "--api", API, "--token-file", &tf]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("401"), "{err}");
    assert_eq!(status(&ns)["generation"], 1);
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();

    // The API moved in the file: refused, still served where it was.
    std::fs::write(
        &config,
        original.replace("127.0.0.1:9187", "127.0.0.1:9188"),
    )
    .unwrap();
    let o = cli(&ns, &["lb", "reload", "--api", API, "--token-file", &tf]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("api.listen")
            && err.contains("keeps listening on 127.0.0.1:9187")
            && err.contains("restart"),
        "{err}"
    );
    assert_eq!(status(&ns)["generation"], 1);

    // Back as it runs: applied.
    std::fs::write(&config, &original).unwrap();
    let out = ok(&ns, &["lb", "reload", "--api", API, "--token-file", &tf]);
    assert!(out.contains("configuration generation 2"), "{out}");
    d.stop();
}
