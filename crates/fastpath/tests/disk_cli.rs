//! `fastpath disk` as a user runs it.

mod common;

use common::fastpath;

#[test]
fn validate_json_document_meets_the_goals() {
    let v = common::json(&["disk", "validate", "--format", "json"]);
    let presets = v["presets"].as_object().unwrap();
    // The paper's drives, the feature presets, the published DiskSim models.
    assert_eq!(presets.len(), 26);
    for (name, p) in presets {
        for k in [
            "rotation_ms",
            "mtm_ms",
            "sectors_per_track",
            "head_switch_ms",
            "cyl_switch_ms",
            "surfaces",
        ] {
            let q = &p["params"][k];
            assert!(q["specified"].is_number(), "{name}.{k}: {q}");
            // Extracted within the goal, or flagged, or not printed.
            assert!(
                q["ok"] == true || q["uncertain"].is_string() || q["extracted"].is_null(),
                "{name}.{k}: {q}"
            );
        }
    }
    assert_eq!(v["all_ok"], true, "{v}");
}

#[test]
fn validate_over_seeds_counts_every_outcome_per_preset_and_parameter() {
    let v = common::json(&["disk", "validate", "--seeds", "2", "--format", "json"]);
    assert_eq!(v["seeds"], 2);
    let params = v["params"].as_array().unwrap();
    // 26 presets written, ultrastar backwards, the read-ahead preset and
    // the nine published models with a segmented cache read and
    // backwards: 47 scenarios of 6 parameters.
    assert_eq!(params.len(), 47 * 6, "{v}");
    for g in params {
        let n = |k: &str| g[k].as_u64().unwrap();
        assert_eq!(n("runs"), 2, "{g}");
        assert_eq!(
            n("within_goal") + n("flagged_uncertain") + n("absent") + n("out_of_goal_but_printed"),
            2,
            "{g}"
        );
        assert_eq!(n("impossible_as_fact"), 0, "{g}");
    }
    assert_eq!(v["runs_impossible_as_fact"], 0);
    assert!(v["share_ok"].as_f64().unwrap() >= 0.9, "{v}");
    assert!(v["longest_skippy_disk_ms"].as_f64().unwrap() <= 2000.0);
    // Zero seeds is not a run.
    let bad = fastpath()
        .args(["disk", "validate", "--seeds", "0"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
}

#[test]
fn a_recorded_trace_is_analyzed_like_the_live_run() {
    let dir = std::env::temp_dir().join(format!("fp-disk-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("trace.csv");
    let svg = dir.join("skippy.svg");
    let a = common::json_of(
        fastpath()
            .args([
                "disk",
                "skippy",
                "--sim",
                "ultrastar",
                "--format",
                "json",
                "--csv",
            ])
            .arg(&csv)
            .arg("--plot")
            .arg(&svg),
    );
    let b = common::json_of(
        fastpath()
            .args(["disk", "analyze", "--format", "json"])
            .arg(&csv),
    );
    assert_eq!(a["kind"], "rotational");
    let spt = |v: &serde_json::Value| v["sectors_per_track"].as_f64().unwrap();
    assert!(
        (spt(&a) - spt(&b)).abs() < 0.01 && (spt(&a) - 184.0).abs() < 1.0,
        "{a} {b}"
    );
    assert_eq!(a["surfaces"], b["surfaces"]);
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.contains("<svg") && plot.contains("L2"),
        "plot lacks the fitted lines"
    );
    // The same trace in microseconds, space separated, without a header:
    // refused with the unit to pass, then read right with it.
    let us = dir.join("trace-us.txt");
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<String> = text
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            format!("{} {:.3}", f[0], f[1].parse::<f64>().unwrap() * 1000.0)
        })
        .collect();
    std::fs::write(&us, lines.join("\n")).unwrap();
    let out = fastpath()
        .args(["disk", "analyze"])
        .arg(&us)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("outside 2-30 ms") && err.contains("--unit us"),
        "{err}"
    );
    let c = common::json_of(
        fastpath()
            .args(["disk", "analyze", "--unit", "us", "--format", "json"])
            .arg(&us),
    );
    assert!((spt(&c) - spt(&b)).abs() < 0.5, "{c} {b}");
    // In seconds, tab separated, the unit in the header.
    let secs = dir.join("trace-s.tsv");
    let lines: Vec<String> = text
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            format!("{}\t{:.9}", f[0], f[1].parse::<f64>().unwrap() / 1000.0)
        })
        .collect();
    std::fs::write(&secs, format!("step\tlatency_s\n{}", lines.join("\n"))).unwrap();
    let d = common::json_of(
        fastpath()
            .args(["disk", "analyze", "--format", "json"])
            .arg(&secs),
    );
    assert!(
        (d["rotation_ms"].as_f64().unwrap() - 8.333).abs() < 0.05,
        "{d}"
    );
    // A file with no point is an error naming its first line.
    std::fs::write(&csv, "step|latency\n0|8.3\n").unwrap();
    let out = fastpath()
        .args(["disk", "analyze"])
        .arg(&csv)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(":1: found \"step|latency\": no point"),
        "{err}"
    );
    // A garbage trace is an error that names the line.
    std::fs::write(&csv, "step,latency_ms\n1,2.0\nx,y\n").unwrap();
    let bad = fastpath()
        .args(["disk", "analyze"])
        .arg(&csv)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains(":3:"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "system test: root, loop devices"]
fn writing_a_block_device_without_the_flag_is_refused_by_the_cli() {
    systest::require_root();
    // /dev/loop-control is a character device; pick a block device that
    // certainly exists instead: any /dev/loopN.
    let dev = (0..8)
        .map(|i| format!("/dev/loop{i}"))
        .find(|p| std::path::Path::new(p).exists());
    let Some(dev) = dev else {
        systest::missing("a block device node /dev/loop0-7 (root with loop devices)");
    };
    let out = fastpath()
        .args(["disk", "skippy", "--device", &dev])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--allow-destructive") || err.contains("too small") || err.contains("in use"),
        "{err}"
    );
}

#[test]
fn trace_and_mode_errors_say_what_is_wrong() {
    // A missing trace names the file and keeps the system's answer.
    let missing = std::env::temp_dir().join(format!("fp-disk-none-{}.csv", std::process::id()));
    let out = fastpath()
        .args(["disk", "analyze"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("reading {}: ", missing.display())) && err.contains("os error"),
        "{err}"
    );
    // An unknown SKIPPY mode lists the known ones.
    let out = fastpath()
        .args(["disk", "skippy", "--sim", "ultrastar", "--mode", "sideways"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown SKIPPY mode \"sideways\": write, read or backward"),
        "{err}"
    );
}

#[test]
fn skippy_runs_every_step_asked_for_or_says_why_it_stopped() {
    let dir = std::env::temp_dir().join(format!("fp-disk-steps-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("trace.csv");
    // 900 steps: past the two seconds of disk time the run used to stop at.
    let out = fastpath()
        .args([
            "disk",
            "skippy",
            "--sim",
            "barracuda",
            "--steps",
            "900",
            "--csv",
        ])
        .arg(&csv)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), 1 + 900, "a header and 900 points");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("steps used"), "{stdout}");
    // A budget that runs out first: fewer points, and the reason.
    let out = fastpath()
        .args([
            "disk",
            "skippy",
            "--sim",
            "barracuda",
            "--steps",
            "900",
            "--budget-ms",
            "500",
            "--csv",
        ])
        .arg(&csv)
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let points = std::fs::read_to_string(&csv).unwrap().lines().count() - 1;
    assert!(points < 900, "{points}");
    assert!(
        err.contains(&format!("SKIPPY stopped after {points} of 900 steps"))
            && err.contains("--budget-ms"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run a command; its trimmed standard output, or what went wrong.
fn sh(args: &[&str]) -> Result<String, String> {
    let o = std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    } else {
        Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// A loop device, detached by its name when dropped.
struct LoopDev(String);

impl Drop for LoopDev {
    fn drop(&mut self) {
        if let Err(e) = sh(&["losetup", "-d", &self.0]) {
            eprintln!("{e}");
        }
    }
}

#[test]
#[ignore = "system test: root, loop devices"]
fn the_file_behind_a_mounted_loop_device_is_refused_by_the_cli() {
    // Needs root (loop devices, a mount). The mount is made in a mount
    // namespace of its own, which ends with the command.
    systest::require_root();
    let dir = std::env::temp_dir().join(format!("fp-disk-cli-loop-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("mnt")).unwrap();
    let img = dir.join("fs.img");
    std::fs::write(&img, vec![0u8; 32 << 20]).unwrap();
    let lo = LoopDev(sh(&["losetup", "-f", "--show", img.to_str().unwrap()]).expect("losetup"));
    sh(&["mkfs.ext4", "-q", "-F", &lo.0]).expect("mkfs.ext4");
    let mnt = dir.join("mnt");
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount "$1" "$2" && "$3" disk skippy --device "$4" --steps 50 --allow-destructive"#)
        .args([
            "sh",
            &lo.0,
            mnt.to_str().unwrap(),
            env!("CARGO_BIN_EXE_fastpath"),
        ])
        .arg(&img)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "{} (mounted at {}) is backed by this file",
            lo.0,
            mnt.display()
        )),
        "{err}"
    );
    sh(&["e2fsck", "-f", "-n", &lo.0]).expect("the file system is intact");
    drop(lo);
    let _ = std::fs::remove_dir_all(&dir);
}
