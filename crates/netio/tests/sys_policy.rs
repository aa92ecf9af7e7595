//! Policy routing over netlink ([`netio::policy`]) in a throwaway
//! namespace, read back with iproute2: the rule of a mark (its mark, table
//! and priority) and its table's default route (its device), for IPv4 and
//! IPv6, then their removal.
//!
//! System tests: they need root and iproute2, and fail naming what is missing.

use std::io;

use netio::policy::{self, Error, Family, MarkRule};
use netns::Netns;

const MARK: u32 = 0x4650;
const TABLE: u32 = 18_000;
const PRIORITY: u32 = 1000;

/// A namespace with a veth pair `p0`/`p1`, `p0` up.
fn namespace(tag: &str) -> Netns {
    systest::require_root();
    systest::require_netns();
    let ns = Netns::new(&format!("fppol-{tag}-{}", std::process::id() % 100_000)).unwrap();
    ns.ip(&["link", "add", "p0", "type", "veth", "peer", "name", "p1"])
        .unwrap();
    ns.ip(&["link", "set", "p0", "up"]).unwrap();
    ns
}

fn rule(family: Family) -> MarkRule {
    MarkRule {
        family,
        mark: MARK,
        table: TABLE,
    }
}

/// `ip rule show`'s lines of rules that match a mark, as iproute2 writes
/// them (`PRIORITY:\tfrom all fwmark MARK lookup TABLE`).
fn mark_rules(ns: &Netns, family: Family) -> Vec<String> {
    let out = ns.ip(&[family.ip_option(), "rule", "show"]).unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("fwmark"))
        .map(|l| l.trim().to_string())
        .collect()
}

/// `ip route show table TABLE`'s lines; none when the table is gone.
fn table_routes(ns: &Netns, family: Family) -> Vec<String> {
    let table = TABLE.to_string();
    match ns.ip(&[family.ip_option(), "route", "show", "table", &table]) {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .collect(),
        // The kernel removes an emptied table, and iproute2 says so.
        Err(netns::Error::Failed { stderr, .. }) if stderr.contains("does not exist") => Vec::new(),
        Err(e) => panic!("{e}"),
    }
}

fn errno(e: &Error) -> Option<i32> {
    e.io_error().and_then(io::Error::raw_os_error)
}

#[test]
#[ignore = "system test: root and network namespaces"]
fn a_marks_rule_and_its_tables_default_route_are_set_up_and_removed() {
    let ns = namespace("setup");
    let ifindex = ns
        .inside(|| netio::afpacket::ifindex("p0"))
        .unwrap()
        .expect("p0 has an index");
    for family in [Family::Ipv4, Family::Ipv6] {
        let fam = family.ip_option();
        let made = ns
            .inside(move || -> Result<(), Error> {
                assert_eq!(policy::delete_all_rules(&rule(family))?, 0);
                policy::add_rule(&rule(family), PRIORITY)?;
                // Replacing is idempotent: twice leaves one route.
                policy::replace_default_route(family, TABLE, ifindex)?;
                policy::replace_default_route(family, TABLE, ifindex)
            })
            .unwrap();
        made.unwrap_or_else(|e| panic!("{fam}: {e}"));
        assert_eq!(
            mark_rules(&ns, family),
            [format!(
                "{PRIORITY}:\tfrom all fwmark {MARK:#x} lookup {TABLE}"
            )],
            "{fam}"
        );
        let routes = table_routes(&ns, family);
        assert_eq!(routes.len(), 1, "{fam}: {routes:?}");
        assert!(
            routes[0].starts_with("default dev p0 "),
            "{fam}: {routes:?}"
        );

        // The kernel refuses an exact duplicate, and says why.
        let dup = ns
            .inside(move || policy::add_rule(&rule(family), PRIORITY))
            .unwrap()
            .expect_err("a duplicate rule");
        assert!(matches!(dup, Error::Refused { .. }), "{fam}: {dup:?}");
        assert_eq!(errno(&dup), Some(libc::EEXIST), "{fam}: {dup}");

        let deleted = ns
            .inside(move || {
                (
                    policy::delete_rule(&rule(family)).unwrap(),
                    policy::delete_rule(&rule(family)).unwrap(),
                )
            })
            .unwrap();
        assert_eq!(deleted, (true, false), "{fam}: deleted once, then none");
        assert_eq!(mark_rules(&ns, family), Vec::<String>::new(), "{fam}");
    }
    // The tables' routes go with their device, as the tunnel's do.
    ns.ip(&["link", "del", "p0"]).unwrap();
    for family in [Family::Ipv4, Family::Ipv6] {
        assert_eq!(
            table_routes(&ns, family),
            Vec::<String>::new(),
            "{family:?}"
        );
    }
}

#[test]
#[ignore = "system test: root and network namespaces"]
fn stale_duplicates_are_all_deleted_and_a_missing_device_is_refused() {
    let ns = namespace("stale");
    let (count, left_over, gone) = ns
        .inside(|| {
            let r = rule(Family::Ipv4);
            // As killed predecessors at other priorities leave them.
            for p in [PRIORITY, PRIORITY + 1, PRIORITY + 2] {
                policy::add_rule(&r, p).unwrap();
            }
            let count = policy::delete_all_rules(&r).unwrap();
            let left_over = policy::delete_rule(&r).unwrap();
            let gone = policy::replace_default_route(Family::Ipv4, TABLE, 999_999)
                .expect_err("no interface has that index");
            (count, left_over, gone)
        })
        .unwrap();
    assert_eq!(count, 3);
    assert!(!left_over);
    assert_eq!(mark_rules(&ns, Family::Ipv4), Vec::<String>::new());
    assert!(matches!(gone, Error::Refused { .. }), "{gone:?}");
    assert_eq!(errno(&gone), Some(libc::ENODEV), "{gone}");
    assert!(std::error::Error::source(&gone).is_some());
}
