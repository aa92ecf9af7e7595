//! The simulator, the extraction and the validation, end to end.

use disk::extract::{self, param, Extraction};
use disk::sim::{presets, Disk};
use disk::skippy::{self, SkippyMode, SkippyOpts};
use disk::validate;
use disk::{seeker, zoned};
use proptest::prelude::*;

#[test]
fn printed_values_hold_over_random_starts_noise_and_features() {
    // Every preset (spares, per-zone skews, caches, read/write overheads
    // included) and the read and backwards variants, at a random zone,
    // start and noise level per seed.
    // The published models have their own test below.
    let rep = validate::over_seeds(&paper_and_feature(), 3).unwrap();
    assert_eq!(rep.runs_impossible_as_fact, 0, "{:#?}", rep.misses);
    assert!(
        rep.share_ok() >= 0.95,
        "{:.3}: {:#?}",
        rep.share_ok(),
        rep.misses
    );
    assert!(rep.longest_skippy_disk_ms <= 2000.0);
    // Six parameters per scenario, each counted in every run.
    assert!(rep.params.iter().all(|x| x.runs == 3
        && x.within_goal + x.flagged_uncertain + x.absent + x.out_of_goal_but_printed == 3));
    // The paper's drives, written forward: rotation, sectors per track, MTM
    // and head switch within their goals (cylinder switch and surfaces may
    // be flagged when too few cylinders were seen to confirm them).
    let paper = ["hawk", "barracuda", "ultrastar", "9zx", "hp97560", "rz26"];
    for x in rep.params.iter().filter(|x| {
        paper.contains(&x.preset)
            && x.mode == SkippyMode::Write
            && ![param::CYL, param::SURFACES].contains(&x.param)
    }) {
        assert!(x.within_goal >= 2, "{x:?}");
    }
}

/// The paper's drives and the feature presets (the published models have
/// their own test, `extraction_holds_on_published_drive_models`).
fn paper_and_feature() -> Vec<disk::sim::Spec> {
    let mut v = disk::sim::paper_presets();
    v.extend(disk::sim::feature_presets());
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Against the simulator at any start and noise: the rotation and
    /// sectors per track are within their goals or flagged, and nothing
    /// physically impossible is printed as fact.
    #[test]
    fn extraction_holds_at_random_starts(
        preset in 0usize..paper_and_feature().len(),
        at in 0.0f64..1.0,
        noise in prop::sample::select(vec![0.0, 0.01, 0.03]),
        seed in 1u64..1000,
    ) {
        let mut spec = paper_and_feature()[preset].clone();
        spec.noise_ms = noise;
        spec.seed = seed;
        let start = ((spec.sectors() - 200_000) as f64 * at) as u64;
        let (_, ex, _) = validate::skippy_run(&spec, SkippyMode::Write, start).unwrap();
        if let Extraction::Rotational(e) = ex {
            for (p, v) in [
                (param::ROTATION, Some(e.rotation_ms)),
                (param::SPT, Some(e.sectors_per_track)),
                (param::MTM, Some(e.mtm_ms)),
                (param::HEAD, e.head_switch_ms),
                (param::CYL, e.cyl_switch_ms),
                (param::SURFACES, e.surfaces.map(f64::from)),
            ] {
                if let Some(v) = v {
                    prop_assert!(
                        e.uncertain(p).is_some() || !validate::impossible(&e, p, v),
                        "{} {p} = {v} printed as fact", spec.name
                    );
                }
            }
            let r = spec.rotation_ms();
            prop_assert!(
                e.uncertain(param::ROTATION).is_some() || ((e.rotation_ms - r) / r).abs() < 0.01,
                "{}: rotation {} vs {r}", spec.name, e.rotation_ms
            );
            let spt = spec.zone_at(start).spt as f64;
            prop_assert!(
                e.uncertain(param::SPT).is_some() || ((e.sectors_per_track - spt) / spt).abs() < 0.02,
                "{}: {} sectors per track vs {spt}", spec.name, e.sectors_per_track
            );
        }
    }
}

#[test]
fn mtm_is_placed_within_a_sector_on_the_slow_sector_drives() {
    // The HP 97560's and RZ26's sectors take 0.2 ms: a step alone cannot
    // place MTM within 0.1 ms; the delayed probes must have done it.
    for name in ["hp97560", "rz26"] {
        let mut spec = disk::sim::preset_named(name).unwrap();
        spec.seed = 5;
        let r = validate::preset(&spec, None).unwrap();
        assert!(
            r.notes
                .iter()
                .any(|n| n.contains("by delaying the request")),
            "{name}: {:?}",
            r.notes
        );
        let m = r.params.iter().find(|p| p.name == "mtm_ms").unwrap();
        let sector = spec.rotation_ms() / spec.zones[0].spt as f64;
        assert!(
            (m.extracted.unwrap() - m.specified).abs() < 0.3 * sector,
            "{name}: {m:?}"
        );
    }
}

#[test]
fn a_write_cached_disk_has_no_rotational_signature() {
    let mut spec = disk::sim::preset_named("barracuda").unwrap();
    spec.write_cache = true;
    let mut d = Disk::new(spec);
    let pts = skippy::run(&mut d, &SkippyOpts::default()).unwrap();
    // Writes complete from the cache: latencies are the overhead plus the
    // noise model's outliers, and nothing rotational may be reported.
    if let Extraction::Rotational(e) = extract::skippy(&pts) {
        panic!("invented a rotation of {} ms", e.rotation_ms);
    }
}

#[test]
fn a_write_buffer_is_named_and_its_values_flagged() {
    // A write-back cache of 48 writes: the first writes are answered at
    // once, then each waits for an older one to reach the platter.
    let spec = disk::sim::preset_named("9zx-wcache").unwrap().quiet();
    let mut d = Disk::new(spec);
    let pts = skippy::run(
        &mut d,
        &SkippyOpts {
            budget_ms: Some(1300.0),
            ..SkippyOpts::default()
        },
    )
    .unwrap();
    match extract::skippy(&pts) {
        Extraction::Rotational(e) => {
            let c = e.cache.expect("the cache's answers are named");
            assert!(c.answered >= 40 && c.latency_ms < 0.3, "{c:?}");
            for p in [param::ROTATION, param::MTM] {
                let why = e
                    .uncertain(p)
                    .unwrap_or_else(|| panic!("{p} not flagged: {e:?}"));
                assert!(why.contains("cache"), "{why}");
            }
        }
        Extraction::NoRotation { reason } => assert!(reason.contains("cache"), "{reason}"),
    }
}

#[test]
fn backwards_reads_give_rotation_and_sectors_per_track() {
    let spec = disk::sim::preset_named("ultrastar").unwrap();
    let (_, ex, _) = validate::skippy_run(&spec, SkippyMode::Backward, 0).unwrap();
    let Extraction::Rotational(e) = ex else {
        panic!("{ex:?}")
    };
    assert_eq!(e.direction, extract::Direction::Backward);
    assert!(
        (e.rotation_ms - spec.rotation_ms()).abs() / spec.rotation_ms() < 0.01,
        "{e:?}"
    );
    assert!((e.sectors_per_track - 184.0).abs() < 184.0 * 0.02, "{e:?}");
    // Backwards, what a boundary costs is not the skew, and MTM holds
    // whatever the drive does between requests: said so.
    assert!(e.uncertain(param::CYL).is_some() && e.uncertain(param::MTM).is_some());
}

#[test]
fn read_ahead_hides_small_steps_and_backwards_reads_avoid_it() {
    let spec = disk::sim::preset_named("dtta-readahead").unwrap().quiet();
    let mut d = Disk::new(spec.clone());
    let fwd = skippy::run(
        &mut d,
        &SkippyOpts {
            mode: SkippyMode::Read,
            steps: 60,
            ..Default::default()
        },
    )
    .unwrap();
    // Read-ahead answers the short steps from the drive's cache, as soon
    // as it has read them: never a missed revolution.
    assert!(
        fwd.iter()
            .take(10)
            .all(|p| p.latency_ms < spec.overhead_ms + 0.1),
        "{:?}",
        &fwd[..10]
    );
    let mut d = Disk::new(spec.clone());
    let back = skippy::run(
        &mut d,
        &SkippyOpts {
            mode: SkippyMode::Backward,
            steps: 60,
            ..Default::default()
        },
    )
    .unwrap();
    // Backwards, nothing was read ahead: every access waits for the platter.
    assert!(back
        .iter()
        .skip(1)
        .take(10)
        .all(|p| p.latency_ms > spec.overhead_ms + 0.1));
}

#[test]
fn zoned_sees_the_zones_and_fits_them() {
    let spec = disk::sim::preset_named("ultrastar").unwrap().quiet();
    let mut d = Disk::new(spec.clone());
    let z = zoned::run(&mut d, 1 << 20, 80, None, &mut |_, _| {}).unwrap();
    let f = extract::zone_fits(&z).unwrap();
    assert!(f.outer_mbps > 1.4 * f.inner_mbps, "{f:?}");
    for fit in [
        f.linear,
        f.quadratic,
        f.linear_two_point,
        f.quadratic_two_point,
    ] {
        assert!(fit.rms.is_finite() && fit.a < 0.0, "{f:?}");
    }
    // Least squares beats the two-point version of the same model.
    assert!(f.linear.rms <= f.linear_two_point.rms && f.quadratic.rms <= f.quadratic_two_point.rms);
    // Bandwidth never rises going inwards.
    assert!(z.windows(2).all(|w| w[1].mbps <= w[0].mbps * 1.01));
}

#[test]
fn seeker_grows_with_distance() {
    let spec = disk::sim::preset_named("hp97560").unwrap().quiet();
    let mut d = Disk::new(spec.clone());
    let s = seeker::run(&mut d, disk::Op::Write, 10, 80, &mut |_, _| {}).unwrap();
    assert!(
        s.windows(2).all(|w| w[1].min_ms > w[0].min_ms - 0.01),
        "{s:?}"
    );
    let far = s.last().unwrap().min_ms - spec.overhead_ms;
    let want = spec.seek.time(spec.cylinders() - 1);
    assert!((far - want).abs() < 0.5, "{far} vs {want}");
}

#[test]
fn validation_document_has_the_promised_fields() {
    let (_, doc) = validate::all(&presets(), None).unwrap();
    for name in ["hawk", "ultrastar", "hp97560", "rz26", "hawk-spt-spares"] {
        for k in [
            "rotation_ms",
            "mtm_ms",
            "sectors_per_track",
            "head_switch_ms",
            "cyl_switch_ms",
            "surfaces",
        ] {
            let p = &doc["presets"][name]["params"][k];
            assert!(
                p["specified"].is_number()
                    && p["extracted"].is_number()
                    && p["error_pct"].is_number(),
                "{name}.{k}: {p}"
            );
        }
        // The mechanical switch is shown beside the skew cost SKIPPY sees.
        assert!(
            doc["presets"][name]["params"]["mechanical_head_switch_ms"]["specified"].is_number()
        );
    }
    assert_eq!(doc["all_ok"], true, "{doc}");
}

#[test]
fn extraction_holds_on_published_drive_models() {
    // The eleven drives DiskSim validated against real ones (zones, skews,
    // spares per track, per cylinder, per range and per zone, serpentine
    // layout, write settling, published overheads and caches): written
    // forward, and read forward and backwards where a segmented cache
    // reads ahead, at a random zone, start and noise level per seed.
    let ext = disk::sim::external_presets();
    let rep = validate::over_seeds(&ext, 3).unwrap();
    // Eleven written, nine read and read backwards.
    assert_eq!(rep.runs, 3 * (11 + 2 * 9));
    assert_eq!(rep.runs_impossible_as_fact, 0, "{:#?}", rep.misses);
    assert!(
        rep.share_ok() >= 0.98,
        "{:.3}: {:#?}",
        rep.share_ok(),
        rep.misses
    );
    // Written forward, every model shows its sawtooth.
    for x in rep
        .params
        .iter()
        .filter(|x| x.mode == SkippyMode::Write && x.param == param::ROTATION)
    {
        assert_eq!((x.runs, x.absent), (3, 0), "{x:?}");
    }
}
