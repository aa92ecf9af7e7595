//! Compiles the AF_XDP steering program (`bpf/xsk.c`) with clang when
//! clang and the libbpf headers are present (scripts/setup.sh installs
//! them). Without them the crate still builds, opening an AF_XDP port says
//! why it cannot, and the first build after they are installed compiles
//! the program (`bpf-build` says how).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(fastpath_xdp_obj)");
    if bpf_build::Programs::new(&["bpf/xsk.c", "bpf/lb.c"], "AF_XDP").compile() {
        println!("cargo:rustc-cfg=fastpath_xdp_obj");
    }
}
