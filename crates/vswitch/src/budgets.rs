//! How much of the switch one peer may have: the descriptor budget of a VM
//! port's queues and the hold of a port whose frames port security
//! refuses, in one leaf that the datapaths, the switch and the status
//! report all read (so that the report's stated bounds are the ones in
//! force, and no module points back at the datapath for them).

/// Descriptor reads one queue may make per pass, on average, beyond the
/// first [`FREE_READS`] of each chain: one more per frame of a full batch.
pub const DESC_BUDGET: u64 = 256;
/// Reads of each chain not charged to the budget: the descriptors an
/// honest frame takes, which the batch size and the ring already bound, so
/// that ordinary guests never meet the budget. With segmentation offloads
/// a Linux guest's 64 KB TCP segment is the header, the linear part and up
/// to 17 page fragments (`MAX_SKB_FRAGS`): 19 descriptors, read once more
/// each for the two the transmit fast paths look at before such a chain is
/// walked: 21. (Without offloads a frame took one or two, and this was 2.)
/// A hostile guest's chains still cost at most this many reads each
/// beyond the budget, and a pass takes at most a batch of them.
pub const FREE_READS: u64 = 21;
/// Descriptor reads one queue may make per second beyond the free ones:
/// the rate the budget refills at. About 122 chains of 32,768 descriptors
/// a second; a few percent of a core at the few nanoseconds a read costs.
pub const DESC_RATE: u64 = 4_000_000;
/// How long a port is held back (its frames not taken) per frame port
/// security refused from it: a port that keeps sending from an address it
/// may not use is served at a bounded rate, whatever its peer's speed.
pub const SPOOF_HOLD_PER_FRAME: std::time::Duration = std::time::Duration::from_micros(1);
/// The longest a port is held back after one batch.
pub const SPOOF_HOLD_MAX: std::time::Duration = std::time::Duration::from_millis(1);
