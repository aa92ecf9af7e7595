//! The layout's promise: `join(split(x))` is the same configuration as
//! `x` (parsed by the one validation the daemon uses), for the shipped
//! examples and generated fleets, with every key far under etcd's
//! request limit.

use fleetconf::layout::{self, LayoutError, ORDER_KEY};
use lb::config::Config;
use proptest::prelude::*;

fn round_trip(text: &str) -> Vec<(String, String)> {
    let keys = layout::split(text).expect("split");
    let joined = layout::join(keys.iter().map(|(k, v)| (k.as_str(), v.as_str()))).expect("join");
    let want = Config::parse(text, "original").expect("original parses");
    let got = Config::parse(&joined, "joined").unwrap_or_else(|e| panic!("joined: {e}\n{joined}"));
    assert_eq!(got, want, "joined text:\n{joined}");
    keys
}

fn example(name: &str) -> String {
    let path = format!("{}/../../examples/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn shipped_examples_round_trip() {
    for name in ["lb.toml", "lb-loaded-host.toml"] {
        let keys = round_trip(&example(name));
        let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            names.contains(&"config/section/forwarder"),
            "{name}: {names:?}"
        );
        assert_eq!(names.last(), Some(&ORDER_KEY), "{name}");
    }
    let keys = round_trip(&example("lb.toml"));
    let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    for want in [
        "config/pool/web",
        "config/pool/web-extra",
        "config/vip/http6",
        "config/section/bgp",
    ] {
        assert!(names.contains(&want), "{want} not in {names:?}");
    }
    // Comments travel with their piece.
    let web = keys
        .iter()
        .find(|(k, _)| k == "config/pool/dns")
        .map(|(_, v)| v.as_str());
    assert!(
        web.is_some_and(|v| v.contains("Maglev table size")),
        "{web:?}"
    );
}

/// A fleet of `vips` VIPs, each with a pool of `backends` backends.
fn fleet(vips: usize, backends: usize) -> String {
    let mut t = String::from("[encap]\nsource = \"10.0.0.1\"\n\n");
    for v in 0..vips {
        t.push_str(&format!(
            "[[pools]]\nname = \"pool-{v}\"\ntable_size = 1009\nbackends = [\n"
        ));
        for b in 0..backends {
            t.push_str(&format!(
                "  {{ address = \"10.{}.{}.{}\", weight = {} }},\n",
                1 + v / 256,
                v % 256,
                1 + b,
                1 + b % 3
            ));
        }
        t.push_str("]\n\n");
    }
    for v in 0..vips {
        t.push_str(&format!(
            "[[vips]]\nname = \"vip-{v}\"\naddress = \"198.18.{}.{}\"\nport = 80\nprotocol = \"tcp\"\npool = \"pool-{v}\"\n\n",
            v / 256,
            v % 256
        ));
    }
    t
}

#[test]
fn thousand_vips_by_hundred_backends_fit_in_small_keys() {
    let text = fleet(1000, 100);
    let keys = round_trip(&text);
    assert_eq!(keys.len(), 1 + 1000 + 1000 + 1, "encap, pools, vips, order");
    let (key, largest) = keys
        .iter()
        .map(|(k, v)| (k, v.len()))
        .max_by_key(|(_, n)| *n)
        .expect("keys");
    // etcd refuses a request over 1.5 MiB; a key of a few KiB leaves a
    // transaction room for hundreds of them.
    assert!(largest < 64 * 1024, "{key} is {largest} bytes");
    let total: usize = keys.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert!(
        total > 1536 * 1024,
        "the whole fleet ({total} bytes) is more than one request: the point of splitting"
    );
}

#[test]
fn order_is_kept_and_one_change_touches_one_key() {
    let text = fleet(5, 3);
    let before = layout::split(&text).expect("split");
    // Same VIPs, one backend changed in pool-2.
    let changed = text.replacen("10.1.2.3\", weight = 3", "10.1.2.3\", weight = 2", 1);
    assert_ne!(changed, text);
    let after = layout::split(&changed).expect("split");
    let d = fleetconf::diff(&before, &after);
    assert_eq!(d.changed, vec!["config/pool/pool-2".to_string()], "{d:?}");
    assert!(d.added.is_empty() && d.removed.is_empty(), "{d:?}");
}

#[test]
fn join_refuses_keys_written_around_the_order() {
    let keys = layout::split(&fleet(2, 2)).expect("split");
    let as_ref = |ks: &[(String, String)]| {
        ks.iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    let mut extra = as_ref(&keys);
    extra.push((
        "config/vip/sneaky".into(),
        "[[vips]]\nname = \"sneaky\"\n".into(),
    ));
    let e = layout::join(extra.iter().map(|(k, v)| (k.as_str(), v.as_str()))).unwrap_err();
    assert!(
        matches!(e, LayoutError::Unlisted(ref k) if k == "config/vip/sneaky"),
        "{e}"
    );
    let missing: Vec<_> = keys
        .iter()
        .filter(|(k, _)| k != "config/vip/vip-1")
        .cloned()
        .collect();
    let e = layout::join(missing.iter().map(|(k, v)| (k.as_str(), v.as_str()))).unwrap_err();
    assert!(
        matches!(e, LayoutError::Missing(ref k) if k == "config/vip/vip-1"),
        "{e}"
    );
    let no_order: Vec<_> = keys
        .iter()
        .filter(|(k, _)| k != ORDER_KEY)
        .cloned()
        .collect();
    let e = layout::join(no_order.iter().map(|(k, v)| (k.as_str(), v.as_str()))).unwrap_err();
    assert!(matches!(e, LayoutError::NoOrder), "{e}");
    assert_eq!(layout::join(std::iter::empty()).expect("empty"), "");
}

#[test]
fn duplicate_names_are_refused_and_odd_names_encoded() {
    let text = "[[pools]]\nname = \"a\"\nbackends = []\n[[pools]]\nname = \"a\"\nbackends = []\n";
    assert!(
        matches!(layout::split(text), Err(LayoutError::Duplicate(ref k)) if k == "config/pool/a")
    );
    let text = "[[pools]]\nname = \"x/y%z\"\nbackends = [{ address = \"10.1.0.1\" }]\n";
    let keys = layout::split(text).expect("split");
    assert_eq!(keys[0].0, "config/pool/x%2Fy%25z");
}

#[test]
fn inline_and_dotted_forms_become_standalone_pieces() {
    // The same configuration written with dotted keys and inline tables
    // at the top: each piece must still carry its own header.
    let text = "forwarder.threads = 1\nencap = { source = \"10.0.0.1\" }\npools = [{ name = \"p\", backends = [{ address = \"10.1.0.1\" }] }]\n[[vips]]\nname = \"v\"\naddress = \"198.18.0.1\"\nport = 80\nprotocol = \"tcp\"\npool = \"p\"\n";
    round_trip(text);
}

prop_compose! {
    fn arb_fleet()(pools in 1usize..6, vips_per in 0usize..3, backends in 1usize..5,
                   order in proptest::collection::vec(any::<u16>(), 12),
                   odd in proptest::collection::vec("[a-z/%. -]{1,8}", 6)) -> String {
        let mut t = String::from("[encap]\nsource = \"10.0.0.1\"\n");
        let mut vips = Vec::new();
        let mut conntrack = false;
        let name = |i: usize| format!("{}{i}", odd[i % odd.len()]);
        for p in 0..pools {
            t.push_str(&format!("[[pools]]\nname = {:?}\nbackends = [", name(p)));
            for b in 0..backends {
                t.push_str(&format!("{{ address = \"10.1.{p}.{}\" }},", b + 1));
            }
            t.push_str("]\n");
            for v in 0..vips_per {
                vips.push((p, v));
            }
            if !conntrack && order[p % order.len()] % 3 == 0 {
                conntrack = true;
                t.push_str("[conntrack]\nsize = 4096\n");
            }
        }
        // VIPs in a shuffled order: the order is part of the configuration.
        vips.sort_by_key(|(p, v)| order[(p * 3 + v) % order.len()]);
        for (p, v) in vips {
            t.push_str(&format!(
                "[[vips]]\nname = \"v{p}-{v}\"\naddress = \"198.18.{p}.{}\"\nprotocol = \"udp\"\npool = {:?}\n",
                v + 1, name(p)));
        }
        t
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn generated_fleets_round_trip(text in arb_fleet()) {
        // Only configurations the daemon would take are the promise.
        let parsed = Config::parse(&text, "gen");
        prop_assert!(parsed.is_ok(), "the generator wrote an invalid configuration: {:?}\n{}", parsed.err(), text);
        round_trip(&text);
    }
}

/// A push larger than one transaction is staged in several, but one key
/// larger than a request can carry cannot be: it is refused before
/// anything is sent, saying which bound to raise. (The store connects
/// lazily: nothing listens on port 1 of loopback and nothing is asked.)
#[test]
fn a_key_over_etcds_request_bound_is_refused_before_sending() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // 200 VIPs, one of 400 backends: its pool's key is some 20 KiB, over
    // what a 70 KiB request leaves once its margin is kept.
    let mut text = fleet(200, 3);
    let big: Vec<String> = (0..400)
        .map(|i| format!("{{ address = \"10.{}.{}.9\" }}", 100 + i / 250, i % 250))
        .collect();
    text.push_str(&format!(
        "\n[[pools]]\nname = \"huge\"\nbackends = [\n  {}\n]\n",
        big.join(",\n  ")
    ));
    assert!(Config::parse(&text, "gen").is_ok(), "{text}");
    let e = rt
        .block_on(async {
            let store = fleetconf::Store::connect(
                &["http://127.0.0.1:1".to_string()],
                std::time::Duration::from_millis(500),
            )
            .await
            .unwrap()
            .with_limits(fleetconf::TxnLimits {
                max_ops: 128,
                max_bytes: fleetconf::REQUEST_MARGIN_BYTES + 6 * 1024,
            });
            let empty = fleetconf::Snapshot {
                revision: 1,
                text: String::new(),
                keys: Vec::new(),
                guard_revision: 0,
                pushed: None,
                hold: None,
                pending: None,
            };
            store
                .push(
                    "/fastpath/t",
                    &fleetconf::Push::new(&text, "gen", "test"),
                    &empty,
                )
                .await
        })
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, fleetconf::StoreError::TooLarge { ops: 1, bytes, .. } if bytes > 6 * 1024),
        "{msg}"
    );
    assert!(msg.contains("--max-request-bytes"), "{msg}");
}

/// The names read from the lines are the parser's, for every shipped
/// example, the generated fleets and texts made to look odd; where the
/// lines are not plain enough, the reader says so rather than guess.
#[test]
fn top_level_names_by_lines_agree_with_the_parser() {
    let parsed = |t: &str| -> Vec<String> {
        let table: toml::Table = t.parse().unwrap();
        let mut v: Vec<String> = table.keys().cloned().collect();
        v.sort();
        v
    };
    let mut texts: Vec<String> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples"))
            .unwrap()
            .filter_map(|e| {
                let n = e.ok()?.file_name().into_string().ok()?;
                n.ends_with(".toml").then(|| example(&n))
            })
            .collect();
    assert!(texts.len() >= 2);
    texts.push(fleet(20, 5));
    texts.push(
        fleetconf::join(
            fleetconf::split(&fleet(3, 2))
                .unwrap()
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        )
        .unwrap(),
    );
    texts.push("version = 1\nname.first = \"x\"\n[a.b]\nc = 1\n[[d]]\ne = [\n  1, 2,\n]\n".into());
    for t in &texts {
        if let Some(mut by_lines) = fleetconf::layout::top_level_names_by_lines(t) {
            by_lines.sort();
            assert_eq!(by_lines, parsed(t), "{t}");
        }
    }
    // What a fleet's keys join to is read by its lines (the point).
    for t in &texts[texts.len() - 3..] {
        assert!(
            fleetconf::layout::top_level_names_by_lines(t).is_some(),
            "a plain text is read by its lines: {}",
            &t[..t.len().min(200)]
        );
    }
    for odd in [
        "x = \"\"\"\n[not]\n\"\"\"\n",
        "[\"quoted.name\"]\na = 1\n",
        "x = [\n  1,\n]\n[t]\n",
        "[t]\ne = [\n  [1, 2],\n]\n",
    ] {
        assert_eq!(
            fleetconf::layout::top_level_names_by_lines(odd),
            None,
            "{odd}"
        );
    }
}
