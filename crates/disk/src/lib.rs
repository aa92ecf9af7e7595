//! Disk characterization (paper: "Microbenchmark-based extraction of local
//! and global disk characteristics", Talagala, Arpaci-Dusseau, Patterson).
//!
//! - [`sim`]: a mechanical disk simulator (zones with their own skews,
//!   spare sectors per track, per cylinder and every few cylinders with the
//!   slipping they cause, spare areas at a zone's end, switch times, write
//!   settling, a seek curve, read and write command overheads, a segmented
//!   read-ahead cache, a write-back cache with a bounded buffer, noise on
//!   the drive and on the host's clock)
//!   with presets for the paper's drives, presets that exercise each
//!   feature, and the eleven drive models DiskSim validated against real
//!   drives, transcribed from their published parameter files.
//! - [`device`]: real block devices and files, O_DIRECT, with the safety
//!   rules, decided on the descriptor written through (writes to a block
//!   device need `--allow-destructive`; anything mounted, swapped to or
//!   held, and files backing a loop device in use, are refused whatever
//!   the flag); [`holders`] finds who holds a device or file.
//! - [`skippy`], [`zoned`], [`seeker`]: the paper's three
//!   microbenchmarks over either: SKIPPY (write, read, backward read) with
//!   the delayed probes that place MTM, ZONED and SEEKER.
//! - [`extract`]: parameters from the SKIPPY curve, forward or backwards
//!   (rotation and sectors per track fitted jointly over every tooth of the
//!   sawtooth and cross-checked against the first steps, MTM, the head and
//!   cylinder switch as SKIPPY sees them (skew costs), surfaces counted from
//!   the boundaries seen); values that contradict physics or each other,
//!   and cache signatures, are flagged uncertain with the reason; it says
//!   so when the curve has no rotational signature.
//! - [`validate`]: every benchmark on every preset, extracted against
//!   specified; and over seeds, random starts and noise levels, how often
//!   each printed value is within its goal, flagged, or wrong.
//! - [`trace`]: the SKIPPY trace format (written by a run, read back for a
//!   later analysis: units, separators, errors) and the reconstruction of a
//!   trace's positions.
//! - [`plots`]: SVG plots of the three curves with the fits.

pub mod device;
pub mod extract;
pub mod holders;
pub mod plots;
pub mod seeker;
pub mod sim;
pub mod skippy;
pub mod trace;
pub mod validate;
pub mod zoned;

/// Reading or writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// A read of the sectors.
    Read,
    /// A write of the sectors (destroys what they held).
    Write,
}

/// Something the benchmarks can time: the simulator or a real device.
pub trait Target {
    /// Bytes per sector (the device's logical block size).
    fn sector_size(&self) -> u64;
    /// Size in sectors.
    fn sectors(&self) -> u64;
    /// Do one access of `count` sectors at `lba`; returns its latency in ms.
    fn access(&mut self, op: Op, lba: u64, count: u32) -> Result<f64, Error>;
    /// Milliseconds of (simulated or real) time spent so far.
    fn elapsed_ms(&self) -> f64;
    /// Let `ms` pass before the next access (the host busy elsewhere). A
    /// real device spins on the monotonic clock: sleeping is far coarser
    /// than the fractions of a sector this is used for.
    fn idle(&mut self, ms: f64) {
        let end = std::time::Instant::now() + std::time::Duration::from_secs_f64(ms.max(0.0) / 1e3);
        while std::time::Instant::now() < end {
            std::hint::spin_loop();
        }
    }
    /// A short description.
    fn describe(&self) -> String;
}

/// Why a benchmark could not open, measure or validate its target; each
/// says what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call on a device, file or directory failed.
    #[error("{path}: {what}")]
    Io {
        /// The device, file or directory.
        path: String,
        /// What was being done (`open (O_DIRECT)`, `read`, ...).
        what: &'static str,
        /// The system's answer.
        #[source]
        err: std::io::Error,
    },
    /// Writing a block device without `--allow-destructive`.
    #[error("refusing to write to {0}: writing destroys its data; pass --allow-destructive if you mean it")]
    NeedsDestructive(String),
    /// Writing something in use: a block device that is mounted, swapped
    /// to or claimed (or whose partition or disk is), a file backing a
    /// loop device in use, mounted somewhere or swapped to; no flag
    /// overrides this.
    #[error("refusing to write to {path}: {why}; unmount it / stop using it first (--allow-destructive does not override this)")]
    InUse {
        /// The device or file, as given.
        path: String,
        /// What holds it (a whole clause, naming the holder).
        why: String,
    },
    /// Writing a file that backs a loop device nothing uses now, without
    /// `--allow-destructive`.
    #[error("refusing to write to {path}: it backs {device} (not mounted or in use), whose data writing it destroys; detach it (losetup -d {device}) or pass --allow-destructive")]
    BacksLoop {
        /// The file, as given.
        path: String,
        /// The loop device.
        device: String,
    },
    /// Whether a device or file is in use could not be told.
    #[error(transparent)]
    Holders(#[from] holders::Error),
    /// Settings or a target the benchmarks cannot use (the text says which
    /// and what to change).
    #[error("{0}")]
    Invalid(String),
    /// A simulator preset that does not exist: the name asked for, and the
    /// known names.
    #[error("unknown preset {0:?}; known: {1}")]
    UnknownPreset(String, String),
}
