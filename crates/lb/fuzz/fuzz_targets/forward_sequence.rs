//! Fuzzes the forwarder with sequences of frames: the input is read as
//! frames (per frame a control byte, a little-endian u16 length and the
//! bytes; control bit 0 fills in the IPv4 header checksum), which run
//! through the datapath of the sample configuration with the oracle's
//! `quic` VIPs (`oracle::QUIC_CONFIG`) inline and with two
//! packet threads. Each run must end on its own, return every buffer,
//! forward only valid GRE carrying an input packet to the backend the model
//! names, forward whatever must be, and account for every frame (the checks
//! are `../oracle.rs`, shared with `crates/lb/tests/liveness.rs`).
//! Run: `make fuzz` (or `cargo +nightly fuzz run forward_sequence` in
//! crates/lb); `make fuzz` first seeds the corpus from the property test.
#![no_main]

#[path = "../oracle.rs"]
#[allow(dead_code)]
mod oracle;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lb::datapath::Datapath;
use libfuzzer_sys::fuzz_target;
use oracle::Oracle;

/// The sample configuration (`lb_sample::CONFIG`).
const CONFIG: &str = include_str!("../../../../examples/lb.toml");

/// How long a run may take before the watchdog stops it and the input
/// counts as a crash (runs take milliseconds).
const DEADLINE: Duration = Duration::from_secs(10);

/// One oracle and one datapath per mode for the whole fuzzing process: a
/// leaked buffer shows on the input that leaked it.
fn setup() -> &'static (Oracle, [Arc<Datapath>; 2]) {
    static SETUP: OnceLock<(Oracle, [Arc<Datapath>; 2])> = OnceLock::new();
    SETUP.get_or_init(|| {
        let o = Oracle::new(&oracle::with_quic(CONFIG));
        let dps = [o.datapath(0), o.datapath(2)];
        (o, dps)
    })
}

fuzz_target!(|data: &[u8]| {
    let (o, dps) = setup();
    let frames = oracle::decode(data);
    for (dp, threads) in dps.iter().zip([0, 2]) {
        if let Err(e) = o.check(dp, &frames, DEADLINE) {
            panic!("threads={threads}: {e}");
        }
    }
});
