//! The load balancer in the driver (XDP) keeps the map sizes it was
//! loaded with until a restart. A configuration whose tables those maps
//! cannot hold (a pool's `table_size` grown, say) used to be applied and
//! silently turn the driver off until a restart; the control plane now
//! refuses it whole, saying a restart is needed and why, and the running
//! tables stay. Without a driver nothing is refused.

use lb::config::Config;
use lb::Control;

fn sample() -> Config {
    Config::parse(lb_sample::CONFIG, "test").unwrap()
}

/// The sample with the web pool's table grown to 1,000,003 slots (a
/// prime): more than twice the sample's slots, which the maps get.
fn grown(cfg: &Config) -> Config {
    let mut c = cfg.clone();
    let web = c.pools.iter().position(|p| p.name == "web").unwrap();
    c.pools[web].table_size = 1_000_003;
    c
}

#[test]
fn a_configuration_the_drivers_maps_cannot_hold_is_refused_whole() {
    let cfg = sample();
    let mut control = Control::new(cfg.clone()).unwrap();
    let t = control.tables().load_full();
    t.driver_room
        .set(lb::xdp::sizes(&cfg, &t))
        .expect("no room set before");
    let generation = t.generation;
    let e = control.apply(grown(&cfg)).unwrap_err();
    assert_eq!(e.key, "pools.table_size", "{e}");
    assert!(
        e.problem.contains("restart") && e.problem.contains("needs 1066549 Maglev slots"),
        "{e}"
    );
    // Nothing changed: the same snapshot and configuration run.
    assert_eq!(control.tables().load().generation, generation);
    assert_eq!(control.config(), &cfg);
    // A change the maps hold is applied.
    let mut drained = cfg.clone();
    drained.pools[0].drained = vec![drained.pools[0].backends[0].address.to_string()];
    control.apply(drained).unwrap();
    assert!(control.tables().load().generation > generation);
}

#[test]
fn without_a_driver_a_grown_table_is_applied() {
    let cfg = sample();
    let mut control = Control::new(cfg.clone()).unwrap();
    control.apply(grown(&cfg)).unwrap();
    let t = control.tables().load();
    assert!(t.vips.iter().any(|v| v.table.size() == 1_000_003));
}

/// A `quic` VIP over a pool of `n` backends, its QUIC-LB configuration
/// plaintext (routed in the driver, whose server ID map has a size too).
fn quic(n: usize) -> Config {
    let backends: Vec<String> = (1..=n)
        .map(|i| {
            format!(
                "{{ address = \"10.1.{}.{}\", quic_server_id = \"{i:04x}\" }}",
                i / 200,
                i % 200 + 1
            )
        })
        .collect();
    let text = format!(
        "[encap]\nsource = \"10.0.0.1\"\n\n[[quic_lb]]\ncodepoint = 0\nserver_id_len = 2\nnonce_len = 6\n\n\
         [[pools]]\nname = \"h3\"\ntable_size = 1009\nbackends = [{}]\n\n\
         [[vips]]\nname = \"h3\"\naddress = \"198.18.0.10\"\nport = 443\nprotocol = \"udp\"\nquic = true\npool = \"h3\"\n",
        backends.join(", ")
    );
    Config::parse(&text, "quic.toml").unwrap()
}

#[test]
fn more_server_ids_than_the_drivers_map_holds_are_refused_whole() {
    let cfg = quic(2);
    let mut control = Control::new(cfg.clone()).unwrap();
    let t = control.tables().load_full();
    let room = lb::xdp::sizes(&cfg, &t);
    t.driver_room.set(room).expect("no room set before");
    let generation = t.generation;
    // One server ID more than the map's room (the backends' own room is
    // larger: only the server IDs outgrow it).
    let grown = quic(room.quic_ids as usize + 1);
    let e = control.apply(grown).unwrap_err();
    assert_eq!(e.key, "pools.backends.quic_server_id", "{e}");
    assert!(
        e.problem.contains("restart")
            && e.problem
                .contains(&format!("needs {} server IDs", room.quic_ids + 1)),
        "{e}"
    );
    assert_eq!(control.tables().load().generation, generation);
    // As many as it holds are applied.
    control.apply(quic(room.quic_ids as usize)).unwrap();
    assert!(control.tables().load().generation > generation);
}
