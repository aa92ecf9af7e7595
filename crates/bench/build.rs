//! Compiles the veth bench's XDP programs (`bpf/fwd.c`: the forwarder of
//! its limit row, the sink, the XDP generator) with clang when clang and
//! the libbpf headers are present (scripts/setup.sh installs them).
//! Without them the crate still builds and the bench says why it cannot
//! run; the first build after they are installed compiles the programs.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(fastpath_xdp_obj)");
    if bpf_build::Programs::new(&["bpf/fwd.c"], "the veth bench's XDP programs").compile() {
        println!("cargo:rustc-cfg=fastpath_xdp_obj");
    }
}
