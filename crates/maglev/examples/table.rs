//! A Maglev lookup table over named, weighted backends: build it, look a
//! few flows up, then take one backend out and see what moved.
//!
//! ```sh
//! cargo run -p maglev --example table
//! ```
//!
//! Every load balancer that is given the same backend names, weights and
//! table size builds the same table, whatever order the backends come in:
//! that is what lets a fleet of them send a connection to the same backend
//! without talking to each other (Maglev, section 3.4).

use std::error::Error;

use maglev::{mix64, weighted_share_bound, Backend, Maglev, DEFAULT_TABLE_SIZE};

/// A flow's hash. The forwarder hashes the 5-tuple with
/// `packet::FlowKey::hash`; any well-mixed 64-bit hash of the flow will do.
fn flow_hash(client: [u8; 4], port: u16) -> u64 {
    mix64(u64::from(u32::from_be_bytes(client)) << 16 | u64::from(port))
}

fn main() -> Result<(), Box<dyn Error>> {
    // Names seed each backend's preference over the slots; weights set how
    // often it takes a turn. Weight 0 is a drained backend: no new flows.
    let backends = vec![
        Backend::weighted("10.1.0.1:80", 2),
        Backend::weighted("10.1.0.2:80", 1),
        Backend::weighted("10.1.0.3:80", 1),
        Backend::weighted("10.1.0.4:80", 1),
        Backend::weighted("10.1.0.5:80", 0),
    ];
    // M must be prime (65537 is the paper's "small" table); `new` says so
    // otherwise, naming the nearest primes.
    let mut table = Maglev::new(u64::from(DEFAULT_TABLE_SIZE))?;
    table.populate(&backends)?;
    let m = table.size();

    // Each backend holds a share of the slots close to its share of the
    // weight, within the bound the crate proves for backends with weight.
    let counts = table.counts(backends.len());
    let total: u64 = backends.iter().map(|b| u64::from(b.weight)).sum();
    let active = backends.iter().filter(|b| b.weight > 0).count();
    println!("M = {m} slots over {} backends:", backends.len());
    for (b, &slots) in backends.iter().zip(&counts) {
        let fair = f64::from(m) * f64::from(b.weight) / total as f64;
        let (low, high) = weighted_share_bound(b.weight, total, active);
        println!(
            "  {:<12} weight {}  {slots:>6} slots ({:>5.2}%, fair share {fair:.0})",
            b.name,
            b.weight,
            100.0 * f64::from(slots) / f64::from(m),
        );
        let off = f64::from(slots) - fair;
        assert!(
            b.weight == 0 || low < off && off < high,
            "{} holds {slots} slots, {off:+.1} from its fair share",
            b.name
        );
    }
    assert_eq!(counts[4], 0, "a drained backend holds no slots");

    // The same backends in another order build the same table: slots name
    // backends by their index in the caller's slice, so compare by name.
    let mut shuffled = backends.clone();
    shuffled.reverse();
    let mut other = Maglev::new(u64::from(m))?;
    other.populate(&shuffled)?;
    let names = |t: &Maglev, bs: &[Backend]| -> Vec<String> {
        (0..t.size() as usize)
            .map(|i| {
                t.slot(i)
                    .map_or("-".into(), |b| bs[b as usize].name.clone())
            })
            .collect()
    };
    let before = names(&table, &backends);
    assert_eq!(before, names(&other, &shuffled), "order changed the table");
    println!("the reversed list builds the same table");

    // A lookup is one multiply and one load: the flow hash picks a slot.
    let flows: Vec<([u8; 4], u16)> = (0..8u8)
        .map(|i| ([198, 51, 100, 10 + i], 40_000 + u16::from(i)))
        .collect();
    let pick = |t: &Maglev, bs: &[Backend], (ip, port): ([u8; 4], u16)| -> Option<String> {
        t.lookup(flow_hash(ip, port))
            .map(|b| bs[b as usize].name.clone())
    };
    let first: Vec<String> = flows
        .iter()
        .map(|&f| pick(&table, &backends, f).ok_or("empty table"))
        .collect::<Result<_, _>>()?;

    // Take 10.1.0.3 out (it failed its health check) and rebuild.
    let gone = "10.1.0.3:80";
    let remaining: Vec<Backend> = backends
        .iter()
        .filter(|b| b.name != gone)
        .cloned()
        .collect();
    let mut after = Maglev::new(u64::from(m))?;
    after.populate(&remaining)?;
    let after_names = names(&after, &remaining);

    println!("flows before and after removing {gone}:");
    for (f, was) in flows.iter().zip(&first) {
        let now = pick(&after, &remaining, *f).ok_or("empty table")?;
        let note = if *was == now { "" } else { "  (moved)" };
        println!(
            "  {}.{}.{}.{}:{} -> {was:<12} -> {now}{note}",
            f.0[0], f.0[1], f.0[2], f.0[3], f.1
        );
        assert_ne!(now, gone);
    }

    // Disruption: the removed backend's slots must move; Maglev keeps the
    // others where they were, almost all of them.
    let (mut lost, mut extra) = (0u32, 0u32);
    for (was, now) in before.iter().zip(&after_names) {
        if was == gone {
            lost += 1;
        } else if was != now {
            extra += 1;
        }
    }
    let pct = |n: u32| 100.0 * f64::from(n) / f64::from(m);
    println!(
        "{lost} slots ({:.2}%) had to move, being {gone}'s; {extra} more ({:.2}%) moved between backends that stayed",
        pct(lost),
        pct(extra)
    );
    let held = backends
        .iter()
        .position(|b| b.name == gone)
        .map(|i| counts[i]);
    assert_eq!(held, Some(lost));
    assert!(
        pct(extra) < 5.0,
        "{:.2}% of slots moved needlessly",
        pct(extra)
    );
    Ok(())
}
