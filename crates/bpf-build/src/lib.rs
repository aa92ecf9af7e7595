//! For the build scripts of the crates that embed XDP programs (`netio`,
//! `lb`, `bench`): compiles their C for BPF with clang when clang and the
//! libbpf headers are there, and otherwise lets the crate build without
//! them and says how to get them.
//!
//! What it must get right is the build after they are installed: cargo
//! runs a build script again only when something the script named with
//! `cargo:rerun-if-changed` is newer than its last run. Package managers
//! give installed files the time their package was made, which is older
//! than that run; a missing file named to cargo makes it run the script on
//! every build, recompiling the crate and all that depends on it, and once
//! the file is there with its old time, never again. What does change on
//! installation is the directories that receive the files (a new entry
//! updates its directory's time, and cargo looks at a directory's entries
//! recursively). So:
//!
//! - clang not found: cargo watches `CLANG`, `PATH` and every directory of
//!   `PATH`, where a new `clang` will appear;
//! - a program that does not compile (a header missing): cargo watches the
//!   compiler's include directories, where the header will appear;
//! - compiled: cargo watches clang and every file the object was made of,
//!   as clang lists them (the sources, our headers, the system's).
//!
//! `scripts/setup.sh` installs clang and libbpf-dev; the next `cargo build`
//! compiles the programs, without `cargo clean`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// XDP programs to compile, and what the crate lacks without them.
#[derive(Debug, Clone)]
pub struct Programs {
    sources: Vec<PathBuf>,
    include: Vec<PathBuf>,
    lacking: String,
}

impl Programs {
    /// The C files `sources` (relative to the crate), each compiled to
    /// `OUT_DIR/<file stem>.o`; `lacking` says what the crate's users lose
    /// without them ("AF_XDP", say), in the warning.
    pub fn new(sources: &[&str], lacking: &str) -> Self {
        Programs {
            sources: sources.iter().map(PathBuf::from).collect(),
            include: Vec::new(),
            lacking: lacking.to_string(),
        }
    }

    /// Searches `dir` for `#include`s too (after the source's own
    /// directory). A directory under `OUT_DIR` (a generated header) is
    /// not watched: the build script writes it on every run.
    pub fn include(mut self, dir: impl Into<PathBuf>) -> Self {
        self.include.push(dir.into());
        self
    }

    /// Compiles every program; whether all compiled. Prints the
    /// `cargo:rerun-if-*` lines that make cargo run the build script again
    /// when what was missing appears, and a `cargo:warning` when something
    /// was.
    pub fn compile(&self) -> bool {
        let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
        for s in &self.sources {
            println!("cargo:rerun-if-changed={}", s.display());
        }
        println!("cargo:rerun-if-env-changed=CLANG");
        println!("cargo:rerun-if-env-changed=PATH");
        let Some(clang) = find_clang() else {
            for dir in watched_for_clang() {
                println!("cargo:rerun-if-changed={}", dir.display());
            }
            println!(
                "cargo:warning=clang not found (CLANG, or clang in PATH): {} will be unavailable in this build. Install clang and libbpf-dev (scripts/setup.sh does); the next cargo build compiles the XDP programs, no cargo clean needed",
                self.lacking
            );
            return false;
        };
        println!("cargo:rerun-if-changed={}", clang.display());
        let mut args: Vec<OsString> = ["-O2", "-g", "-target", "bpf"]
            .iter()
            .map(OsString::from)
            .collect();
        args.push(format!("-I/usr/include/{}-linux-gnu", target_arch()).into());
        for dir in &self.include {
            let mut a = OsString::from("-I");
            a.push(dir);
            args.push(a);
        }
        for src in &self.sources {
            let stem = src.file_stem().unwrap_or_default().to_string_lossy();
            let obj = out.join(format!("{stem}.o"));
            let deps = out.join(format!("{stem}.d"));
            let ran = Command::new(&clang)
                .args(&args)
                .arg("-MD")
                .arg("-MF")
                .arg(&deps)
                .arg("-c")
                .arg(src)
                .arg("-o")
                .arg(&obj)
                .output();
            match ran {
                Ok(o) if o.status.success() => {
                    let listed = std::fs::read_to_string(&deps).unwrap_or_default();
                    for dep in dependencies(&listed) {
                        if !dep.starts_with(&out) {
                            println!("cargo:rerun-if-changed={}", dep.display());
                        }
                    }
                }
                failed => {
                    let why = match failed {
                        Ok(o) => first_error(&String::from_utf8_lossy(&o.stderr)),
                        Err(e) => format!("running {}: {e}", clang.display()),
                    };
                    for dir in search_dirs(&clang, &args) {
                        if !dir.starts_with(&out) {
                            println!("cargo:rerun-if-changed={}", dir.display());
                        }
                    }
                    println!(
                        "cargo:warning=compiling {} failed ({why}): {} will be unavailable in this build. Install libbpf-dev and clang (scripts/setup.sh does); the next cargo build compiles the XDP programs, no cargo clean needed",
                        src.display(),
                        self.lacking
                    );
                    return false;
                }
            }
        }
        true
    }
}

/// The target's architecture, as Debian's multiarch directories name it
/// (`<asm/types.h>` lives in `/usr/include/<arch>-linux-gnu`).
fn target_arch() -> String {
    std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into())
}

/// clang: `CLANG` (a path, or a name looked up in `PATH`), else `clang` in
/// `PATH`.
fn find_clang() -> Option<PathBuf> {
    let want = std::env::var_os("CLANG").unwrap_or_else(|| "clang".into());
    let want = PathBuf::from(want);
    if want.components().count() > 1 {
        return want.is_file().then_some(want);
    }
    path_dirs()
        .into_iter()
        .map(|d| d.join(&want))
        .find(|p| p.is_file())
}

/// The directories of `PATH`.
fn path_dirs() -> Vec<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .filter(|d| !d.as_os_str().is_empty())
        .collect()
}

/// Where clang may appear: the directories of `PATH` that exist, and the
/// directory `CLANG` names a file in.
fn watched_for_clang() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = path_dirs().into_iter().filter(|d| d.is_dir()).collect();
    if let Some(c) = std::env::var_os("CLANG").map(PathBuf::from) {
        if let Some(parent) = c.parent().filter(|p| p.is_dir()) {
            dirs.push(parent.to_path_buf());
        }
    }
    outermost(dirs)
}

/// `dirs` without duplicates and without those inside another (cargo
/// looks into a directory recursively).
fn outermost(mut dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    dirs.sort();
    dirs.dedup();
    let all = dirs.clone();
    dirs.retain(|d| !all.iter().any(|o| o != d && d.starts_with(o)));
    dirs
}

/// The files of a make rule as `clang -MD` writes it (`obj: a.c b.h \`),
/// spaces in names escaped with a backslash.
fn dependencies(rule: &str) -> Vec<PathBuf> {
    let joined = rule.replace("\\\n", " ");
    let Some((_, files)) = joined.split_once(": ") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = files.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => {
                cur.push(' ');
                chars.next();
            }
            c if c.is_whitespace() => {
                if !cur.is_empty() {
                    out.push(PathBuf::from(std::mem::take(&mut cur)));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(PathBuf::from(cur));
    }
    out
}

/// The directories clang searches for headers with these arguments
/// (`clang -E -v` lists them), those that exist.
fn search_dirs(clang: &Path, args: &[OsString]) -> Vec<PathBuf> {
    let Ok(o) = Command::new(clang)
        .args(args)
        .args(["-E", "-v", "-x", "c", "/dev/null", "-o", "/dev/null"])
        .output()
    else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&o.stderr);
    let dirs: Vec<PathBuf> = text
        .lines()
        .skip_while(|l| !l.starts_with("#include \"...\" search starts here:"))
        .take_while(|l| !l.starts_with("End of search list."))
        .filter(|l| l.starts_with(' '))
        .map(|l| PathBuf::from(l.trim()))
        .filter(|d| d.is_dir())
        .collect();
    outermost(dirs)
}

/// The compiler's first error line, for the warning.
fn first_error(stderr: &str) -> String {
    stderr
        .lines()
        .find(|l| l.contains("error"))
        .unwrap_or("no error message")
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dependency_rule_lists_its_files() {
        let rule = "out/xsk.o: bpf/xsk.c bpf/steer.h \\\n  /usr/include/linux/bpf.h /tmp/a\\ b.h\n";
        assert_eq!(
            dependencies(rule),
            [
                "bpf/xsk.c",
                "bpf/steer.h",
                "/usr/include/linux/bpf.h",
                "/tmp/a b.h"
            ]
            .map(PathBuf::from)
        );
        assert!(dependencies("").is_empty());
    }

    #[test]
    fn directories_inside_others_are_left_to_them() {
        let dirs = [
            "/usr/include/x86_64-linux-gnu",
            "/usr/include",
            "/usr/local/include",
            "/usr/include",
        ]
        .map(PathBuf::from)
        .to_vec();
        assert_eq!(
            outermost(dirs),
            ["/usr/include", "/usr/local/include"].map(PathBuf::from)
        );
    }

    #[test]
    fn the_warning_quotes_the_first_error() {
        let stderr = "In file included from bpf/xsk.c:2:\nbpf/steer.h:11:10: fatal error: 'bpf/bpf_helpers.h' file not found\n1 error generated.\n";
        assert_eq!(
            first_error(stderr),
            "bpf/steer.h:11:10: fatal error: 'bpf/bpf_helpers.h' file not found"
        );
    }
}
