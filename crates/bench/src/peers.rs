//! Where the peer programs the benches measure beside are installed (the
//! switch's memif rows, the VM rows' vhost PMD and forwarding rows all
//! start DPDK's testpmd).

use std::path::PathBuf;

/// The testpmd binary, if DPDK is installed (Debian's `dpdk` package, or
/// a build installed under /usr/local).
pub fn testpmd_path() -> Option<PathBuf> {
    ["/usr/bin/dpdk-testpmd", "/usr/local/bin/dpdk-testpmd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}
