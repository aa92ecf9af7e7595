//! Compiles the XDP program for AF_XDP with clang when clang and the libbpf
//! headers are present (scripts/setup.sh installs them). Without them the
//! crate still builds, and opening an AF_XDP port says why it cannot.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=bpf/xsk.c");
    println!("cargo:rerun-if-changed=bpf/fwd.c");
    println!("cargo:rerun-if-changed=bpf/lb.c");
    println!("cargo:rerun-if-changed=bpf/steer.h");
    println!("cargo::rustc-check-cfg=cfg(fastpath_xdp_obj)");
    let dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // <asm/types.h> lives in the multiarch include directory.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    let multiarch = format!("-I/usr/include/{arch}-linux-gnu");
    let ok = ["xsk", "fwd", "lb"].iter().all(|name| {
        Command::new("clang")
            .args([
                "-O2",
                "-g",
                "-target",
                "bpf",
                &multiarch,
                "-c",
                &format!("bpf/{name}.c"),
                "-o",
            ])
            .arg(dir.join(format!("{name}.o")))
            .status()
            .is_ok_and(|s| s.success())
    });
    if ok {
        println!("cargo:rustc-cfg=fastpath_xdp_obj");
    } else {
        println!("cargo:warning=clang or libbpf headers missing: AF_XDP will be unavailable (run scripts/setup.sh)");
    }
}
