//! Writes what the load balancer's XDP program shares with user space
//! (`src/xdp/abi.rs`) out as C (`OUT_DIR/lb_abi.h`), and compiles the
//! program (`bpf/lb.c`, which includes that header, its own `flow.h` and
//! netio's `steer.h`) with clang when clang and the libbpf headers are
//! present (scripts/setup.sh installs them). Without them the crate still
//! builds, the XDP driver says why it cannot run, and the first build after
//! they are installed compiles the program (`bpf-build` says how).

use std::path::PathBuf;

// The one definition of the constants and map layouts both sides use.
#[allow(dead_code)]
#[path = "src/xdp/abi.rs"]
mod abi;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(fastpath_xdp_obj)");
    println!("cargo:rerun-if-changed=src/xdp/abi.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let header = out.join("lb_abi.h");
    if let Err(e) = std::fs::write(&header, abi::c_header()) {
        panic!("writing {}: {e}", header.display());
    }
    // netio's `bpf/` (steer.h), which its build script names.
    let netio = std::env::var_os("DEP_NETIO_BPF_INCLUDE").map(PathBuf::from);
    let mut programs =
        bpf_build::Programs::new(&["bpf/lb.c"], "the load balancer in the driver (XDP)")
            .include(&out);
    if let Some(dir) = netio {
        programs = programs.include(dir);
    }
    if programs.compile() {
        println!("cargo:rustc-cfg=fastpath_xdp_obj");
    }
}
