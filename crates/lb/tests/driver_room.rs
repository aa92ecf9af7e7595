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
