//! The Debian package, as `make deb` builds it (scripts/build-deb.sh),
//! from this test build of fastpath (no release build here): it installs
//! with dpkg into a scratch root, maintainer scripts included (run
//! outside a chroot, where they touch nothing: DPKG_ROOT is set), holds
//! what an operator needs with the right modes, its binary runs from
//! where it was installed, its service units pass `systemd-analyze
//! verify` and rate at most 3.0 in `systemd-analyze security`, and it
//! removes cleanly. Needs root (dpkg writes root-owned
//! files) and dpkg-deb, binutils and systemd (scripts/setup.sh).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs a command; its stdout, or a panic with everything it printed.
fn run(c: &mut Command) -> String {
    let out = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    assert!(
        out.status.success(),
        "{c:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Builds the package into `out`; its path.
pub fn build_deb(out: &Path) -> PathBuf {
    let printed = run(Command::new(repo().join("scripts/build-deb.sh"))
        .arg(env!("CARGO_BIN_EXE_fastpath"))
        .arg(out));
    PathBuf::from(printed.trim())
}

#[test]
#[ignore = "system test: root, dpkg, binutils, systemd-analyze"]
fn the_package_builds_installs_into_a_scratch_root_and_removes() {
    // dpkg installs root-owned files.
    systest::require_root();
    systest::require_programs(&[
        "dpkg-deb",
        "dpkg",
        "objdump",
        "readelf",
        "strip",
        "systemd-analyze",
        "gzip",
    ]);
    let work =
        Scratch::new(std::env::temp_dir().join(format!("fastpath-package-{}", std::process::id())));
    let work = &work.0;

    let deb = build_deb(&work.join("out"));
    let arch = run(Command::new("dpkg").arg("--print-architecture"));
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        deb.file_name().unwrap().to_string_lossy(),
        format!("fastpath_{version}_{}.deb", arch.trim())
    );
    let info = run(Command::new("dpkg-deb").arg("-I").arg(&deb));
    assert!(info.contains(&format!("Version: {version}")), "{info}");
    let depends = info
        .lines()
        .find_map(|l| l.strip_prefix(" Depends: "))
        .unwrap_or_else(|| panic!("no Depends: {info}"));
    // The shared libraries the binary links: glibc at least at its newest
    // symbol version, and the unwinder.
    assert!(depends.contains("libc6 (>= 2."), "{depends}");
    assert!(depends.contains("libgcc-s1"), "{depends}");
    // A backend, or a load balancer behind a static route, runs without
    // BIRD.
    assert!(info.contains(" Recommends: bird2"), "{info}");

    // A scratch root with an empty dpkg database; the libraries the
    // package depends on are this machine's, not the scratch root's.
    let root = work.join("root");
    for d in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for f in ["var/lib/dpkg/status", "var/lib/dpkg/available"] {
        std::fs::write(root.join(f), "").unwrap();
    }
    let dpkg = |args: &[&str]| {
        let mut c = Command::new("dpkg");
        c.arg(format!("--root={}", root.display()))
            .args([
                "--force-not-root",
                "--force-script-chrootless",
                "--force-depends",
            ])
            .args(["--log=/dev/null"])
            .args(args);
        c
    };
    run(&mut dpkg(&["-i", &deb.to_string_lossy()]));
    let status = run(&mut dpkg(&["-s", "fastpath"]));
    assert!(status.contains("Status: install ok installed"), "{status}");

    let files = [
        ("usr/bin/fastpath", 0o755),
        ("usr/share/man/man1/fastpath.1.gz", 0o644),
        ("usr/share/man/man1/fastpath-lb-run.1.gz", 0o644),
        ("usr/share/man/man1/fastpath-lb-withdraw.1.gz", 0o644),
        ("usr/share/bash-completion/completions/fastpath", 0o644),
        ("usr/share/zsh/vendor-completions/_fastpath", 0o644),
        ("usr/share/fish/vendor_completions.d/fastpath.fish", 0o644),
        ("lib/systemd/system/fastpath-lb@.service", 0o644),
        ("lib/systemd/system/fastpath-decap@.service", 0o644),
        ("usr/share/doc/fastpath/examples/lb.toml", 0o644),
        ("usr/share/doc/fastpath/examples/lb-loaded-host.toml", 0o644),
        ("usr/share/doc/fastpath/examples/bird.conf.example", 0o644),
        ("usr/share/doc/fastpath/examples/fastpath.conf", 0o644),
        ("usr/share/doc/fastpath/copyright", 0o644),
        ("usr/share/doc/fastpath/README.md", 0o644),
        ("usr/share/doc/fastpath/changelog.gz", 0o644),
    ];
    for (f, m) in files {
        assert_eq!(mode(&root.join(f)), m, "{f}");
    }
    // What ships is the repository's, byte for byte.
    for (installed, source) in [
        (
            "lib/systemd/system/fastpath-lb@.service",
            "dist/systemd/fastpath-lb@.service",
        ),
        (
            "usr/share/doc/fastpath/examples/lb.toml",
            "examples/lb.toml",
        ),
        (
            "usr/share/doc/fastpath/examples/fastpath.conf",
            "dist/bird/fastpath.conf",
        ),
        (
            "usr/share/doc/fastpath/examples/bird.conf.example",
            "dist/bird/bird.conf.example",
        ),
        (
            "lib/systemd/system/fastpath-decap@.service",
            "dist/systemd/fastpath-decap@.service",
        ),
        ("usr/share/doc/fastpath/README.md", "README.md"),
    ] {
        assert_eq!(
            std::fs::read(root.join(installed)).unwrap(),
            std::fs::read(repo().join(source)).unwrap(),
            "{installed}"
        );
    }
    // The changelog, as Debian keeps it: the repository's, compressed.
    let changelog = run(Command::new("gzip")
        .arg("-dc")
        .arg(root.join("usr/share/doc/fastpath/changelog.gz")));
    assert_eq!(
        changelog,
        std::fs::read_to_string(repo().join("CHANGELOG.md")).unwrap()
    );
    // Every file:// link of the units names a file the package installs.
    for unit in ["fastpath-lb@.service", "fastpath-decap@.service"] {
        let text = std::fs::read_to_string(root.join("lib/systemd/system").join(unit)).unwrap();
        for link in text
            .lines()
            .filter_map(|l| l.strip_prefix("Documentation="))
            .flat_map(str::split_whitespace)
            .filter_map(|d| d.strip_prefix("file:///"))
        {
            assert!(root.join(link).is_file(), "{unit}: {link} is not installed");
        }
    }

    // The site's configurations go in /etc/fastpath, which the package
    // creates empty (no example there could be started by mistake).
    assert_eq!(mode(&root.join("etc/fastpath")), 0o755);
    assert_eq!(
        std::fs::read_dir(root.join("etc/fastpath"))
            .unwrap()
            .count(),
        0
    );
    // Every file dpkg lists is there.
    let listed = run(&mut dpkg(&["-L", "fastpath"]));
    for f in listed.lines().filter(|l| l.starts_with('/')) {
        assert!(
            root.join(f.trim_start_matches('/'))
                .symlink_metadata()
                .is_ok(),
            "{f} listed but missing"
        );
    }

    // The installed binary runs, and is the one this test was built from.
    let v = run(Command::new(root.join("usr/bin/fastpath")).arg("--version"));
    assert_eq!(v.trim(), format!("fastpath {version}"));

    // The units, as installed. The scratch root lacks systemd's own units
    // (only the package's are checked: --recursive-errors=no) and /bin/kill
    // (ExecReload), which every Debian system has: it gets this machine's.
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/kill", root.join("bin/kill")).unwrap();
    let verify = Command::new("systemd-analyze")
        .args(["verify", "--man=no", "--recursive-errors=no"])
        .arg(format!("--root={}", root.display()))
        .args([
            "fastpath-lb@test.service",
            "fastpath-decap@fpdecap0.service",
        ])
        .output()
        .unwrap();
    assert!(
        verify.status.success() && verify.stderr.is_empty(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&verify.stderr)
    );
    std::fs::remove_file(root.join("bin/kill")).unwrap();

    // The units' sandboxes, as systemd rates them: at most 3.0 (the load
    // balancer's remaining exposures are each explained in its unit).
    for (unit, most) in [
        ("fastpath-lb@test.service", 3.0),
        ("fastpath-decap@fpdecap0.service", 3.0),
    ] {
        let level = exposure(&root, unit);
        eprintln!("systemd-analyze security {unit}: {level:.1}");
        assert!(level <= most, "{unit}: exposure {level:.1} > {most:.1}");
    }

    // Purged: nothing of it is left, /etc/fastpath included.
    run(&mut dpkg(&["-P", "fastpath"]));
    for (f, _) in files {
        assert!(!root.join(f).exists(), "{f} left after purge");
    }
    assert!(!root.join("etc/fastpath").exists());
}

/// `systemd-analyze security`'s overall exposure level of `unit` as
/// installed under `root` (0.0 safest, 10.0 most exposed).
fn exposure(root: &Path, unit: &str) -> f64 {
    let text = run(Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(format!("--root={}", root.display()))
        .arg(unit));
    let line = text
        .lines()
        .find(|l| l.contains("Overall exposure level for"))
        .unwrap_or_else(|| panic!("no overall exposure level:\n{text}"));
    line.rsplit(": ")
        .next()
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the level of: {line}"))
}

/// A scratch directory, removed when dropped (also when a check fails).
struct Scratch(PathBuf);

impl Scratch {
    fn new(p: PathBuf) -> Scratch {
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
