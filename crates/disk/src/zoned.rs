//! ZONED (the paper's Figure 9): bandwidth against location,
//! over any [`Target`].

use serde::Serialize;

use crate::{Error, Op, Target};

/// One ZONED report: bandwidth over a region.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ZonePoint {
    /// Start of the region, bytes.
    pub offset: u64,
    /// MB/s (10^6 bytes per second) over the region.
    pub mbps: f64,
}

/// ZONED (the paper's Figure 9): read everything in large blocks, report the
/// bandwidth of each region. `progress(done, total)` is called per region.
pub fn run(
    t: &mut dyn Target,
    block_bytes: u64,
    regions: u32,
    limit_bytes: Option<u64>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<ZonePoint>, Error> {
    let ss = t.sector_size();
    let block = (block_bytes / ss).max(1);
    let total = limit_bytes.map_or(t.sectors(), |l| (l / ss).min(t.sectors()));
    let regions = regions.max(2) as u64;
    let per_region = (total / regions / block).max(1) * block;
    let mut out = Vec::new();
    let mut lba = 0;
    while lba + per_region <= total {
        let mut ms = 0.0;
        let mut done = 0;
        while done < per_region {
            let n = block.min(per_region - done);
            ms += t.access(Op::Read, lba + done, n as u32)?;
            done += n;
        }
        out.push(ZonePoint {
            offset: lba * ss,
            mbps: (per_region * ss) as f64 / ms / 1000.0,
        });
        lba += per_region;
        progress(lba * ss, total * ss);
    }
    Ok(out)
}
