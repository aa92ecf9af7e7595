//! `fastpath disk` as a user runs it.

mod common;

use common::fastpath;

#[test]
fn validate_json_document_meets_the_goals() {
    let v = common::json(&["disk", "validate", "--format", "json"]);
    let presets = v["presets"].as_object().unwrap();
    assert_eq!(presets.len(), 9);
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
            assert!(
                q["specified"].is_number()
                    && q["extracted"].is_number()
                    && q["error_pct"].is_number(),
                "{name}.{k}: {q}"
            );
        }
    }
    assert_eq!(v["all_ok"], true, "{v}");
    assert!(v["wall_seconds"].as_f64().unwrap() < 10.0);
}

#[test]
fn validate_over_seeds_counts_every_goal_per_preset() {
    let v = common::json(&["disk", "validate", "--seeds", "3", "--format", "json"]);
    assert_eq!(v["seeds"], 3);
    let goals = v["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 9 * 6, "{v}");
    for g in goals {
        assert_eq!(g["runs"], 3, "{g}");
        assert_eq!(g["met"], 3, "{g}");
    }
    assert_eq!(v["all_met"], true);
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
fn writing_a_block_device_without_the_flag_is_refused_by_the_cli() {
    // /dev/loop-control is a character device; pick a block device that
    // certainly exists instead: any /dev/loopN.
    let dev = (0..8)
        .map(|i| format!("/dev/loop{i}"))
        .find(|p| std::path::Path::new(p).exists());
    let Some(dev) = dev else {
        eprintln!("skipped: no loop device nodes");
        return;
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
