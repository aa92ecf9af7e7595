//! The isolation benchmark runs end to end, in short windows: every
//! attack has its row, the victim kept receiving under each, and the
//! switch answered its status requests. The bounds are loose (a loaded
//! 2-core machine); the figures come from the benchmark itself
//! (`cargo run -p bench --example isolation`).

use std::time::Duration;

use bench::isolation::{run, Attack, Options};

#[test]
fn every_attack_leaves_the_victim_forwarding_and_the_switch_answering() {
    let report = run(&Options {
        window: Duration::from_millis(200),
        repeats: 1,
        ..Options::default()
    })
    .expect("the benchmark runs");
    println!("{}", report.to_text());
    assert_eq!(report.rows.len(), Attack::ALL.len());
    for (row, attack) in report.rows.iter().zip(Attack::ALL) {
        assert_eq!(row.attack, attack.name());
        assert!(
            row.calm_fps.min > 0.0,
            "{}: the victim received nothing without the attack",
            row.attack
        );
        assert!(
            row.attacked_fps.min > 0.0,
            "{}: the victim received nothing under attack",
            row.attack
        );
        assert!(
            row.status_answered > 0 && row.status_failed == 0,
            "{}: status answered {}, failed {}",
            row.attack,
            row.status_answered,
            row.status_failed
        );
        assert!(
            row.status_max_ms.max < 2000.0,
            "{}: status took {} ms",
            row.attack,
            row.status_max_ms.max
        );
        assert_eq!(
            row.recovered, 1,
            "{}: no new pair forwarded after the attacker left",
            row.attack
        );
    }
    let json = serde_json::to_string(&report).expect("the report serializes");
    assert!(json.contains("\"irq-blocked\""), "{json}");
}
