//! Shared measurement plumbing: the workspace's one median (and its upper
//! variant, in [`stats`]), timing with medians, plain-text result tables, and
//! SVG plots. Pure apart from writing the plot files it is asked to write.

pub mod plot;
pub mod stats;
pub mod table;

pub use stats::{median, time_median, upper_median, Sample};
pub use table::Table;
