//! A reload that adds `[bgp]` to a configuration that started without it
//! says that it waits for a restart: the daemon runs no BGP controller
//! when it starts without the section.

use lb::config::Config;

const BASE: &str = r#"
[encap]
source = "10.0.0.1"
[[pools]]
name = "p"
backends = [{ address = "10.1.0.1" }]
[[vips]]
name = "web"
address = "192.0.2.80"
port = 80
protocol = "tcp"
pool = "p"
"#;

const BGP: &str = r#"
[bgp]
vips_file = "/run/fastpath/vips.conf"
"#;

#[test]
fn adding_bgp_waits_for_a_restart_removing_it_does_not() {
    let without = Config::parse(BASE, "t").unwrap();
    let with = Config::parse(&format!("{BASE}{BGP}"), "t").unwrap();
    assert_eq!(without.restart_keys(&with), ["bgp"]);
    assert!(with.restart_keys(&without).is_empty());
    assert!(with.restart_keys(&with).is_empty());
}
