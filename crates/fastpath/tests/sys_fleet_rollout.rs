//! What `fleet-sim --rollout` takes from a real etcd (Debian's etcd-server
//! in a namespace, `lab::etcd`), measured on this machine:
//!
//! - watch fan-out: W watchers, each on a connection of its own (each load
//!   balancer is a machine), watch the fleet's prefix; a put of one key of
//!   a one-backend push's size is timed from the call to each watcher's
//!   receipt (first, median, p99, last), over several puts;
//! - re-list: R of them read the whole prefix of a 1,000 VIP x 100 backend
//!   configuration at once (what follows a leader loss), timed until every
//!   one has it.
//!
//! `by_hand_`: a measurement, run by hand (`FLEET_WATCHERS=100,1000
//! FLEET_MEMBERS=1 FLEET_PUTS=10 FLEET_RELISTERS=100`), printing one JSON
//! line per W for BENCHMARKS.md; its assertions are that every watcher
//! receives every put and every re-list returns the whole configuration.

use std::time::{Duration, Instant};

use lab::etcd::EtcdCluster;

const PREFIX: &str = "/fastpath/rollout";
const DEADLINE: Duration = Duration::from_secs(30);

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|s| s.trim().parse().unwrap_or_else(|_| panic!("{name}: {s:?}")))
        .collect()
}

fn env_one(name: &str, default: usize) -> usize {
    env_list(name, &default.to_string())[0]
}

/// min, median, p99 and max of `xs` (ms).
fn spread(mut xs: Vec<f64>) -> serde_json::Value {
    xs.sort_by(f64::total_cmp);
    let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    serde_json::json!({
        "min": at(0.0), "p50": at(0.5), "p99": at(0.99), "max": at(1.0)
    })
}

async fn populate(store: &fleetconf::Store, shape: &bench::control::Spec) -> (usize, usize) {
    // etcd's default bounds (128 operations a transaction): 60 VIPs and
    // their pools a push.
    let mut vips = 0;
    while vips < shape.vips {
        vips = (vips + 60).min(shape.vips);
        let text = bench::control::Spec {
            vips,
            ..shape.clone()
        }
        .config_text(false);
        let read = store.snapshot(PREFIX, None).await.expect("snapshot");
        store
            .push(
                PREFIX,
                &fleetconf::Push::new(&text, "generated", "rollout"),
                &read,
            )
            .await
            .expect("push");
    }
    let snap = store.snapshot(PREFIX, None).await.expect("snapshot");
    let bytes = snap
        .keys
        .iter()
        .map(|(k, v)| PREFIX.len() + 1 + k.len() + v.len())
        .sum();
    (snap.keys.len(), bytes)
}

#[test]
#[ignore = "system test: root, namespaces, etcd"]
fn by_hand_watch_fanout_and_relist() {
    systest::require_netns();
    systest::require_programs(&["etcd", "etcdctl"]);
    let members = env_one("FLEET_MEMBERS", 1);
    let puts = env_one("FLEET_PUTS", 10).max(1);
    let relisters_max = env_one("FLEET_RELISTERS", 100);
    let watchers = env_list("FLEET_WATCHERS", "100,1000");
    let shape = bench::control::Spec {
        vips: env_one("FLEET_VIPS", 1000),
        backends: env_one("FLEET_BACKENDS", 100),
        ..bench::control::Spec::default()
    };
    let tag = format!("ro{}", std::process::id() % 100_000);
    let c = match EtcdCluster::start(&tag, members) {
        Ok(c) => c,
        Err(lab::Error::Unavailable) => systest::missing("root and iproute2 (network namespaces)"),
        Err(e) => panic!("{e}"),
    };
    let endpoints = c.endpoints();
    let lines = c
        .netns()
        .inside(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(measure(endpoints, shape, watchers, puts, relisters_max))
        })
        .expect("inside the namespace");
    for l in &lines {
        println!("{l}");
    }
    drop(c);
}

async fn measure(
    endpoints: Vec<String>,
    shape: bench::control::Spec,
    watchers: Vec<usize>,
    puts: usize,
    relisters_max: usize,
) -> Vec<String> {
    let admin = fleetconf::Store::connect(&endpoints, DEADLINE)
        .await
        .expect("connect");
    let (keys, prefix_bytes) = populate(&admin, &shape).await;
    // A one-backend push's key: one pool's TOML.
    let one = admin.snapshot(PREFIX, None).await.expect("snapshot");
    let value_bytes = one
        .keys
        .iter()
        .find(|(k, _)| k.starts_with("config/pool/"))
        .map_or(3000, |(_, v)| v.len());
    let cpu = bench::rollout::cpu_name();
    let mut lines = Vec::new();
    for &w in &watchers {
        // W stores, each its own connection, spread over the members.
        let mut stores = Vec::with_capacity(w);
        for i in 0..w {
            let ep = endpoints[i % endpoints.len()].clone();
            stores.push(
                fleetconf::Store::connect(&[ep], DEADLINE)
                    .await
                    .expect("connect a watcher"),
            );
        }
        let from = admin.ping(PREFIX).await.expect("ping");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
        let mut tasks = Vec::with_capacity(w);
        for (i, s) in stores.iter().enumerate() {
            let mut watch = s.watch(PREFIX, from).await.expect("watch");
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                while watch.next().await.is_ok() {
                    if tx.send((i, Instant::now())).is_err() {
                        break;
                    }
                }
            }));
        }
        let (mut put_ms, mut first_ms, mut p50_ms, mut p99_ms, mut all_ms, mut per_watcher_us) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for p in 0..puts {
            let value = format!("{p:06}{}", "x".repeat(value_bytes.saturating_sub(6)));
            let t0 = Instant::now();
            admin.set_hold(PREFIX, Some(&value)).await.expect("put");
            put_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            let mut got = vec![false; w];
            let mut times = Vec::with_capacity(w);
            let until = tokio::time::Instant::now() + DEADLINE;
            while times.len() < w {
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some((i, t))) => {
                        if !got[i] {
                            got[i] = true;
                            times.push((t - t0).as_secs_f64() * 1e3);
                        }
                    }
                    _ => panic!(
                        "put {p}: {} of {w} watchers received it within {DEADLINE:?}",
                        times.len()
                    ),
                }
            }
            times.sort_by(f64::total_cmp);
            let q = |x: f64| times[((w - 1) as f64 * x).round() as usize];
            first_ms.push(q(0.0));
            p50_ms.push(q(0.5));
            p99_ms.push(q(0.99));
            all_ms.push(q(1.0));
            per_watcher_us.push((q(1.0) - q(0.0)) * 1e3 / w as f64);
        }
        for t in &tasks {
            t.abort();
        }
        // The re-list: R load balancers read the whole prefix at once.
        let r = w.min(relisters_max);
        let t0 = Instant::now();
        let reads: Vec<_> = stores
            .iter()
            .take(r)
            .map(|s| {
                let s = s.clone();
                tokio::spawn(async move {
                    let snap = s.snapshot(PREFIX, None).await.expect("re-list");
                    (snap.keys.len(), t0.elapsed().as_secs_f64() * 1e3)
                })
            })
            .collect();
        let mut done = Vec::with_capacity(r);
        for h in reads {
            done.push(h.await.expect("a re-list panicked"));
        }
        let relist_all = t0.elapsed().as_secs_f64() * 1e3;
        for (n, _) in &done {
            assert_eq!(*n, keys, "a re-list returned {n} keys of {keys}");
        }
        let relist_times: Vec<f64> = done.iter().map(|(_, t)| *t).collect();
        let line = serde_json::json!({
            "watchers": w,
            "members": endpoints.len(),
            "puts": puts,
            "value_bytes": value_bytes,
            "put_ms": spread(put_ms),
            "first_received_ms": spread(first_ms),
            "p50_received_ms": spread(p50_ms),
            "p99_received_ms": spread(p99_ms),
            "all_received_ms": spread(all_ms),
            "per_watcher_us": spread(per_watcher_us),
            "relist": {
                "load_balancers": r,
                "keys": keys,
                "prefix_bytes": prefix_bytes,
                "all_ms": relist_all,
                "each_ms": spread(relist_times),
                "mb_s": r as f64 * prefix_bytes as f64 / 1e6 / (relist_all / 1e3),
            },
            "client": "one current-thread tokio runtime in the test process for every watcher",
            "cpu": cpu,
        });
        lines.push(line.to_string());
    }
    admin.set_hold(PREFIX, None).await.expect("delete");
    lines
}
