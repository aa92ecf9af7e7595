//! Compiles the AF_XDP steering program (`bpf/xsk.c`) with clang when
//! clang and the libbpf headers are present (scripts/setup.sh installs
//! them). Without them the crate still builds, opening an AF_XDP port says
//! why it cannot, and the first build after they are installed compiles
//! the program (`bpf-build` says how).
//!
//! Also tells the build scripts of crates that depend on netio where
//! `bpf/steer.h` is (`DEP_NETIO_BPF_INCLUDE`), for XDP programs of theirs
//! that steer what they do not handle as ours does.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(fastpath_xdp_obj)");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bpf");
    println!("cargo::metadata=include={}", dir.display());
    if bpf_build::Programs::new(&["bpf/xsk.c"], "AF_XDP").compile() {
        println!("cargo:rustc-cfg=fastpath_xdp_obj");
    }
}
