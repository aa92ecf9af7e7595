//! The fleet's configuration in a real etcd cluster (three members of
//! Debian's etcd-server in a namespace, `lab::etcd`):
//!
//! - the `lb config` commands (push, diff, history, rollback, hold, show),
//!   read back by etcdctl too; an invalid file refused before writing;
//!   etcd unreachable named with its endpoint and deadline; etcd's own
//!   bound on a transaction;
//! - the guard: two operators who read the same revision cannot both
//!   push, nor can a push land over a key written behind its back;
//! - three load balancers (`lab::topology`) following one prefix: the same
//!   revision and table fingerprints after a push; runtime changes refused
//!   with the reason; an invalid revision written behind the CLI's back
//!   refused by every one while traffic flows; the leader killed; one load
//!   balancer cut off (lag reported, `lb status` says LAGS, converges after
//!   the partition heals and a compaction); a canary hold; quorum lost and
//!   back.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use lab::etcd::EtcdCluster;

const PREFIX: &str = "/fastpath/test";

fn cluster(tag: &str) -> EtcdCluster {
    systest::require_netns();
    systest::require_programs(&["etcd", "etcdctl", "timeout"]);
    let tag = format!("{tag}{}", std::process::id() % 100_000);
    match EtcdCluster::start(&tag, 3) {
        Ok(c) => c,
        Err(lab::Error::Unavailable) => systest::missing("root and iproute2 (network namespaces)"),
        Err(e) => panic!("{e}"),
    }
}

/// `fastpath ARGS` in the members' namespace, bounded to 30 s.
fn fastpath_in(c: &EtcdCluster, args: &[&str]) -> Output {
    let mut cmd: Command = c.command("timeout");
    cmd.arg("30").arg(env!("CARGO_BIN_EXE_fastpath")).args(args);
    cmd.output().expect("running fastpath")
}

fn ok_json(c: &EtcdCluster, args: &[&str]) -> serde_json::Value {
    let o = fastpath_in(c, args);
    assert!(
        o.status.success(),
        "fastpath {args:?}: {}{}",
        String::from_utf8_lossy(&o.stderr),
        c.logs()
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    })
}

fn example() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/lb.toml"
    ))
    .expect("examples/lb.toml")
}

#[test]
#[ignore = "system test: root, namespaces, etcd"]
fn config_commands_against_a_three_member_cluster() {
    let c = cluster("ec");
    let ep = c.endpoints_arg();
    let dir = c.dir().to_path_buf();
    let file = dir.join("fleet.toml");
    let text = example();
    std::fs::write(&file, &text).unwrap();
    let f = file.to_str().unwrap();
    let base = [
        "--etcd",
        ep.as_str(),
        "--prefix",
        PREFIX,
        "--format",
        "json",
    ];
    let args = |head: &[&str]| -> Vec<String> {
        head.iter()
            .chain(base.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let run = |head: &[&str]| {
        let a = args(head);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        ok_json(&c, &a)
    };

    // A first push writes every key and the guard.
    let p1 = run(&["lb", "config", "push", f]);
    let r1 = p1["revision"].as_i64().expect("revision");
    let put: Vec<&str> = p1["put"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(put.contains(&"/fastpath/test/config/vip/http"), "{put:?}");
    assert!(put.contains(&"/fastpath/test/config/order"), "{put:?}");
    // What is stored reads back as the same configuration.
    let shown = run(&["lb", "config", "show"]);
    let stored = shown["text"].as_str().unwrap();
    assert_eq!(
        lb::config::Config::parse(stored, "stored").unwrap(),
        lb::config::Config::parse(&text, "file").unwrap()
    );
    assert_eq!(shown["pushed"]["revision"].as_i64(), Some(r1), "{shown}");
    // etcdctl, a client we did not write, sees the same keys.
    let o = c
        .etcdctl(
            &ep,
            &[
                "get",
                "--prefix",
                "--keys-only",
                &format!("{PREFIX}/config/"),
            ],
        )
        .unwrap();
    let keys = String::from_utf8_lossy(&o.stdout);
    assert!(
        keys.contains("/fastpath/test/config/pool/web-extra"),
        "{keys}"
    );

    // The same file again: nothing written.
    let same = run(&["lb", "config", "push", f]);
    assert_eq!(same["revision"].as_i64(), Some(r1), "{same}");
    assert!(same["put"].as_array().unwrap().is_empty(), "{same}");

    // One weight changed: diff names the pool, the push writes it alone.
    let changed = text.replacen(
        "{ address = \"10.1.0.3\", weight = 2 }",
        "{ address = \"10.1.0.3\", weight = 5 }",
        1,
    );
    assert_ne!(changed, text);
    std::fs::write(&file, &changed).unwrap();
    let d = run(&["lb", "config", "diff", f]);
    assert_eq!(d["changed"], serde_json::json!(["config/pool/web"]), "{d}");
    let p2 = run(&["lb", "config", "push", f]);
    let r2 = p2["revision"].as_i64().unwrap();
    assert!(r2 > r1);
    assert_eq!(
        p2["put"],
        serde_json::json!(["/fastpath/test/config/pool/web"]),
        "{p2}"
    );

    // An invalid file is refused before anything is written.
    let bad = changed.replacen("pool = \"dns\"", "pool = \"no-such-pool\"", 1);
    std::fs::write(&file, &bad).unwrap();
    let a = args(&["lb", "config", "push", f]);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = fastpath_in(&c, &a);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no-such-pool"), "{err}");
    assert_eq!(
        run(&["lb", "config", "show"])["pushed"]["revision"].as_i64(),
        Some(r2)
    );

    // History, newest first; a rollback to r1 is a new revision with r1's text.
    let h = run(&["lb", "config", "history"]);
    let revs: Vec<i64> = h["pushes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["revision"].as_i64())
        .collect();
    assert_eq!(revs, vec![r2, r1], "{h}");
    let rb = run(&["lb", "config", "rollback", &r1.to_string()]);
    let r3 = rb["revision"].as_i64().unwrap();
    assert!(r3 > r2);
    let shown = run(&["lb", "config", "show"]);
    assert_eq!(
        lb::config::Config::parse(shown["text"].as_str().unwrap(), "stored").unwrap(),
        lb::config::Config::parse(&text, "file").unwrap()
    );
    assert_eq!(shown["pushed"]["rollback_of"].as_i64(), Some(r1), "{shown}");
    // And the old revision is still there to read.
    let old = run(&["lb", "config", "show", "--revision", &r2.to_string()]);
    assert!(
        old["text"].as_str().unwrap().contains("weight = 5"),
        "{old}"
    );

    // The hold.
    run(&["lb", "config", "hold", "lb2"]);
    assert_eq!(run(&["lb", "config", "show"])["hold"].as_str(), Some("lb2"));
    run(&["lb", "config", "hold", "--release"]);
    assert!(run(&["lb", "config", "show"])["hold"].is_null());

    // etcd unreachable: the error names the endpoint and the deadline,
    // and comes within it (plus the process's start).
    let started = Instant::now();
    let o = fastpath_in(
        &c,
        &[
            "lb",
            "config",
            "show",
            "--etcd",
            "http://198.19.250.99:2379",
            "--prefix",
            PREFIX,
            "--timeout-ms",
            "700",
        ],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("198.19.250.99:2379") && err.contains("700ms"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // etcd's own bound on a transaction, which the CLI's default mirrors:
    // a push over it is staged in several transactions; told the cluster
    // takes more, the CLI sends one and the server itself refuses it (so
    // the default is the server's, not a guess).
    let mut big = String::from("[encap]\nsource = \"10.0.0.1\"\n");
    for i in 0..150 {
        big.push_str(&format!(
            "[[pools]]\nname = \"p{i}\"\nbackends = [{{ address = \"10.2.0.{b}\" }}]\n\
             [[vips]]\nname = \"v{i}\"\naddress = \"198.18.1.1\"\nport = {port}\nprotocol = \"tcp\"\npool = \"p{i}\"\n",
            b = 1 + i,
            port = 1000 + i
        ));
    }
    let big_file = dir.join("big.toml");
    std::fs::write(&big_file, &big).unwrap();
    lb::config::Config::parse(&big, "big").expect("the generated fleet is valid");
    let bf = big_file.to_str().unwrap();
    let o = fastpath_in(
        &c,
        &[
            "lb",
            "config",
            "push",
            bf,
            "--etcd",
            &ep,
            "--prefix",
            "/fastpath/big",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    // 302 keys: the marker's, three of at most 128, the last one.
    assert!(
        out.contains("302 keys written, 0 deleted; staged in 5 transactions"),
        "{}",
        out.lines().next().unwrap_or("")
    );
    let o = fastpath_in(
        &c,
        &[
            "lb",
            "config",
            "push",
            bf,
            "--etcd",
            &ep,
            "--prefix",
            "/fastpath/big2",
            "--max-txn-ops",
            "100000",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("too many operations in txn request"),
        "{err}"
    );
}

/// Two operators read the same revision; the second push is refused, as
/// is a push after a key was written behind the CLI's back.
#[test]
#[ignore = "system test: root, namespaces, etcd"]
fn concurrent_pushes_do_not_interleave() {
    let c = cluster("ei");
    let endpoints = c.endpoints();
    let text = example();
    let ep = c.endpoints_arg();
    let result = c
        .netns()
        .inside(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let store = fleetconf::Store::connect(&endpoints, Duration::from_secs(5))
                    .await
                    .unwrap();
                let empty = store.snapshot(PREFIX, None).await.unwrap();
                store
                    .push(PREFIX, &fleetconf::Push::new(&text, "a", "first"), &empty)
                    .await
                    .unwrap();
                let a = store.snapshot(PREFIX, None).await.unwrap();
                let b = a.clone();
                let one = text.replacen("weight = 2", "weight = 3", 1);
                let two = text.replacen("weight = 2", "weight = 4", 1);
                let first = store
                    .push(PREFIX, &fleetconf::Push::new(&one, "one", "op1"), &a)
                    .await;
                let second = store
                    .push(PREFIX, &fleetconf::Push::new(&two, "two", "op2"), &b)
                    .await;
                let now = store.snapshot(PREFIX, None).await.unwrap();
                (
                    first.map(|o| o.revision),
                    second.map_err(|e| e.to_string()),
                    now.text,
                )
            })
        })
        .unwrap();
    let (first, second, now) = result;
    assert!(first.is_ok(), "{first:?}");
    let e = second.expect_err("the second operator's push must be refused");
    assert!(e.contains("changed since revision"), "{e}");
    assert!(
        now.contains("weight = 3") && !now.contains("weight = 4"),
        "{now}"
    );

    // A key written behind the CLI's back between read and push.
    let endpoints = c.endpoints();
    let text = example();
    let (read_rev, pushed) = c
        .netns()
        .inside(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let store = fleetconf::Store::connect(&endpoints, Duration::from_secs(5))
                    .await
                    .unwrap();
                let read = store.snapshot(PREFIX, None).await.unwrap();
                (read.revision, read)
            })
        })
        .unwrap();
    let o = c
        .etcdctl(
            &ep,
            &[
                "put",
                &format!("{PREFIX}/config/vip/http"),
                "[[vips]]\nname = \"http\"\n",
            ],
        )
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let endpoints = c.endpoints();
    let res = c
        .netns()
        .inside(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let store = fleetconf::Store::connect(&endpoints, Duration::from_secs(5))
                    .await
                    .unwrap();
                store
                    .push(
                        PREFIX,
                        &fleetconf::Push::new(&text, "again", "op3"),
                        &pushed,
                    )
                    .await
                    .map_err(|e| e.to_string())
            })
        })
        .unwrap();
    let e = res.expect_err("a push over a key written since the read must be refused");
    assert!(e.contains(&format!("since revision {read_rev}")), "{e}");
}

/// Load balancer `k`'s configuration file cut in two: its own sections
/// (everything before the first `[[pools]]`) and the fleet's part.
fn cut(t: &lab::topology::Topology, k: usize) -> (String, String) {
    let text = std::fs::read_to_string(&t.configs[k - 1]).unwrap();
    let at = text
        .find("[[pools]]")
        .expect("a [[pools]] in the lab's configuration");
    (text[..at].to_string(), text[at..].to_string())
}

fn source(t: &lab::topology::Topology, k: usize) -> serde_json::Value {
    let body = t.api_on(k, "GET", "/status").unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["config_source"].clone()
}

fn fingerprint(t: &lab::topology::Topology, k: usize) -> String {
    let body = t.api_on(k, "GET", "/status").unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["vips"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "http")
        .map(|v| v["fingerprint"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// Waits until every load balancer's `config_source` satisfies `ok`;
/// the time it took, or a panic with what they said.
fn wait_all(
    t: &lab::topology::Topology,
    what: &str,
    timeout: Duration,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let all: Vec<serde_json::Value> = (1..=t.lb_count()).map(|k| source(t, k)).collect();
        if all.iter().all(&ok) {
            return start.elapsed();
        }
        if start.elapsed() > timeout {
            let logs: Vec<String> = (1..=t.lb_count()).map(|k| t.lb_log(k)).collect();
            panic!(
                "{what}: not within {timeout:?}: {all:#?}\n{}",
                logs.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every request of `n` through the VIP answered by a backend.
fn all_answered(t: &lab::topology::Topology, n: usize) {
    let by = t.requests(n).unwrap();
    assert_eq!(
        by.get("").copied().unwrap_or(0),
        0,
        "failed requests: {by:?}"
    );
}

#[test]
#[ignore = "system test: root, namespaces, etcd, BIRD, nginx"]
fn a_fleet_follows_its_configuration_in_etcd() {
    let mut t = common::topology(3, 2, "ef");
    let mut c = cluster("ef");
    for k in 1..=3 {
        c.connect(&t.lbs[k - 1], k).unwrap();
    }
    let ep = c.endpoints_arg();
    // Each machine keeps its own sections; the fleet's part is the same
    // for all three, and lives in etcd.
    let mut locals = Vec::new();
    let (_, fleet) = cut(&t, 1);
    for k in 1..=3 {
        let (local, f) = cut(&t, k);
        assert_eq!(
            f, fleet,
            "the lab's load balancers share their pools and VIPs"
        );
        let path = t.dir.join(format!("local{k}.toml"));
        std::fs::write(&path, local).unwrap();
        locals.push(path);
    }
    let fleet_file = t.dir.join("fleet.toml");
    std::fs::write(&fleet_file, &fleet).unwrap();
    let push = |c: &EtcdCluster, file: &std::path::Path| -> Output {
        fastpath_in(
            c,
            &[
                "lb",
                "config",
                "push",
                file.to_str().unwrap(),
                "--etcd",
                &ep,
                "--prefix",
                PREFIX,
                "--local",
                locals[0].to_str().unwrap(),
                "--format",
                "json",
            ],
        )
    };
    let revision_of = |o: &Output| -> i64 {
        assert!(
            o.status.success(),
            "push: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["revision"].as_i64().unwrap()
    };
    let r1 = revision_of(&push(&c, &fleet_file));

    let fp = env!("CARGO_BIN_EXE_fastpath");
    for k in 1..=3 {
        let name = format!("lb{k}");
        let log = t
            .dir
            .join(format!("{}.log", lab::topology::Topology::lb_proc(k)));
        let file = std::fs::File::create(&log).unwrap();
        let err = file.try_clone().unwrap();
        let local = locals[k - 1].to_str().unwrap().to_string();
        let mut cmd = t
            .lb_machine_command(
                k,
                &[
                    fp,
                    "lb",
                    "run",
                    "--config",
                    &local,
                    "--interface",
                    "l0",
                    "--config-etcd",
                    &ep,
                    "--prefix",
                    PREFIX,
                    "--name",
                    &name,
                    "--etcd-timeout-ms",
                    "1000",
                ],
            )
            .unwrap();
        cmd.stdin(std::process::Stdio::null())
            .stdout(file)
            .stderr(err);
        let child = cmd.spawn().unwrap();
        t.procs.push(&lab::topology::Topology::lb_proc(k), child);
    }
    t.wait_for_vip(Duration::from_secs(30)).unwrap();
    wait_all(
        &t,
        "every load balancer runs the first push",
        Duration::from_secs(10),
        |s| s["kind"] == "etcd" && s["pushed_revision"].as_i64() == Some(r1),
    );
    let before: Vec<String> = (1..=3).map(|k| fingerprint(&t, k)).collect();
    assert!(
        before.iter().all(|f| *f == before[0] && !f.is_empty()),
        "{before:?}"
    );

    // A push that changes a weight: every one applies the same revision
    // and builds the same new table.
    let weighted = fleet.replacen(
        "{ address = \"10.10.3.2\" }",
        "{ address = \"10.10.3.2\", weight = 3 }",
        1,
    );
    assert_ne!(weighted, fleet, "{fleet}");
    std::fs::write(&fleet_file, &weighted).unwrap();
    let r2 = revision_of(&push(&c, &fleet_file));
    let took = wait_all(
        &t,
        "every load balancer applies the second push",
        Duration::from_secs(10),
        |s| s["pushed_revision"].as_i64() == Some(r2),
    );
    eprintln!("push applied by all three in {took:?}");
    let after: Vec<String> = (1..=3).map(|k| fingerprint(&t, k)).collect();
    assert!(after.iter().all(|f| *f == after[0]), "{after:?}");
    assert_ne!(after[0], before[0], "the weight changed the table");
    all_answered(&t, 20);

    // Runtime changes are refused with the reason, not silently diverging.
    // (The lab's client gives the refusal's body back as an answer or an
    // error depending on its status: either way, it must say why.)
    let e = match t.api_on(2, "POST", "/backends/10.10.3.2/drain") {
        Ok(body) => body,
        Err(e) => e.to_string(),
    };
    assert!(e.contains("comes from etcd"), "{e}");

    // An invalid file is refused by the CLI; nothing is written.
    let invalid = weighted.replacen("pool = \"web\"", "pool = \"nowhere\"", 1);
    std::fs::write(&fleet_file, &invalid).unwrap();
    let o = push(&c, &fleet_file);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("nowhere"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // The same written behind the CLI's back: every load balancer refuses
    // that revision whole and keeps serving the one it runs.
    let o = c
        .etcdctl(
            &ep,
            &[
                "put",
                &format!("{PREFIX}/config/vip/http"),
                &invalid[invalid.find("[[vips]]").unwrap()..]
                    .lines()
                    .take(6)
                    .collect::<Vec<_>>()
                    .join("\n"),
            ],
        )
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_all(
        &t,
        "every load balancer refuses the invalid revision",
        Duration::from_secs(10),
        |s| {
            s["refused_revision"].as_i64().is_some_and(|r| r > r2)
                && s["refused_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("nowhere"))
                && s["pushed_revision"].as_i64() == Some(r2)
        },
    );
    let still: Vec<String> = (1..=3).map(|k| fingerprint(&t, k)).collect();
    assert_eq!(still, after);
    all_answered(&t, 20);

    // The etcd leader killed: forwarding goes on, and the next push (once
    // a new leader is elected) reaches every load balancer.
    std::fs::write(&fleet_file, &fleet).unwrap();
    let leader = c.leader().unwrap();
    c.kill_member(leader);
    all_answered(&t, 20);
    let started = Instant::now();
    let r3 = loop {
        let o = push(&c, &fleet_file);
        if o.status.success() {
            break revision_of(&o);
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no push accepted after the leader was killed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    wait_all(
        &t,
        "every load balancer applies the push after the leader died",
        Duration::from_secs(15),
        |s| s["pushed_revision"].as_i64() == Some(r3),
    );
    let back: Vec<String> = (1..=3).map(|k| fingerprint(&t, k)).collect();
    assert!(
        back.iter().all(|f| *f == before[0]),
        "{back:?} vs {before:?}"
    );
    all_answered(&t, 20);

    // Load balancer 3 cut off from etcd: it keeps forwarding and says how
    // old its view is, while the others apply the next push; etcd compacts
    // the revisions it missed; healed, it converges on the current one.
    c.partition(3, true).unwrap();
    std::fs::write(&fleet_file, &weighted).unwrap();
    let r5 = revision_of(&push(&c, &fleet_file));
    wait_all(
        &t,
        "the others apply, the one cut off reports its lag",
        Duration::from_secs(15),
        |s| {
            if s["name"] == "lb3" {
                s["pushed_revision"].as_i64() == Some(r3)
                    && s["etcd_answered_s_ago"].as_f64().is_some_and(|a| a > 2.0)
                    && s["last_error"].is_string()
            } else {
                s["pushed_revision"].as_i64() == Some(r5)
            }
        },
    );
    all_answered(&t, 20);
    // `lb status` over the fleet names the one that lags.
    let apis: Vec<String> = (1..=3).map(|k| t.api_addr(k)).collect();
    let out = t
        .router
        .command(env!("CARGO_BIN_EXE_fastpath"))
        .args(["lb", "status", "--token-file"])
        .arg(t.dir.join("api-token"))
        .args(["--api", &apis.join(",")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lags = text
        .lines()
        .find(|l| l.contains(&format!("{}: push", apis[2])))
        .unwrap_or_else(|| panic!("no etcd line for lb3: {text}"));
    assert!(lags.contains(&format!("LAGS (newest {r5})")), "{text}");
    let o = c.etcdctl(&ep, &["compact", &r5.to_string()]).unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    c.partition(3, false).unwrap();
    let healed = wait_all(
        &t,
        "healed, the one cut off converges",
        Duration::from_secs(15),
        |s| s["pushed_revision"].as_i64() == Some(r5) && s["last_error"].is_null(),
    );
    eprintln!("converged {healed:?} after the partition healed");
    let now: Vec<String> = (1..=3).map(|k| fingerprint(&t, k)).collect();
    assert!(now.iter().all(|f| *f == after[0]), "{now:?} vs {after:?}");

    // A hold: only the canary applies; released, the others follow.
    let hold = fastpath_in(
        &c,
        &[
            "lb", "config", "hold", "lb1", "--etcd", &ep, "--prefix", PREFIX,
        ],
    );
    assert!(
        hold.status.success(),
        "{}",
        String::from_utf8_lossy(&hold.stderr)
    );
    std::fs::write(&fleet_file, &fleet).unwrap();
    let r4 = revision_of(&push(&c, &fleet_file));
    wait_all(
        &t,
        "the canary applies, the others wait",
        Duration::from_secs(10),
        |s| {
            if s["name"] == "lb1" {
                s["pushed_revision"].as_i64() == Some(r4)
            } else {
                s["held_by"] == "lb1"
                    && s["waiting_revision"].as_i64().is_some()
                    && s["pushed_revision"].as_i64() == Some(r5)
            }
        },
    );
    let release = fastpath_in(
        &c,
        &[
            "lb",
            "config",
            "hold",
            "--release",
            "--etcd",
            &ep,
            "--prefix",
            PREFIX,
        ],
    );
    assert!(
        release.status.success(),
        "{}",
        String::from_utf8_lossy(&release.stderr)
    );
    wait_all(
        &t,
        "released, every one applies",
        Duration::from_secs(10),
        |s| s["pushed_revision"].as_i64() == Some(r4) && s["held_by"].is_null(),
    );
    // Quorum lost (a second member killed, the leader's already dead):
    // every load balancer keeps forwarding and says etcd stopped
    // answering; the members back, the next push reaches every one.
    let second = (1..=3).find(|&i| i != leader).unwrap();
    c.kill_member(second);
    wait_all(
        &t,
        "quorum lost: every one says etcd stopped answering",
        Duration::from_secs(15),
        |s| s["last_error"].is_string() && s["pushed_revision"].as_i64() == Some(r4),
    );
    all_answered(&t, 20);
    c.restart_member(second).unwrap();
    c.restart_member(leader).unwrap();
    c.wait_healthy(Duration::from_secs(30)).unwrap();
    std::fs::write(&fleet_file, &weighted).unwrap();
    let started = Instant::now();
    let r6 = loop {
        let o = push(&c, &fleet_file);
        if o.status.success() {
            break revision_of(&o);
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no push accepted after quorum returned: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let took = wait_all(
        &t,
        "quorum back: every one applies the next push",
        Duration::from_secs(15),
        |s| s["pushed_revision"].as_i64() == Some(r6) && s["last_error"].is_null(),
    );
    eprintln!("after quorum returned, the push was applied by all three in {took:?}");
    all_answered(&t, 20);
}
