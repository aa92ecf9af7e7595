//! A mechanical disk simulator.
//!
//! Geometry: surfaces, zones of cylinders with their sectors per track,
//! logical blocks laid out track by track (head-first: every surface of a
//! cylinder before the next cylinder; or serpentine: alternate cylinders
//! walk the surfaces in opposite order). Each track is skewed against the
//! previous one by enough sectors to cover a head switch (or, at a cylinder
//! boundary, a cylinder switch), as real drives do, so that a sequential
//! stream loses only the skew at a boundary.
//!
//! Timing of one request, on a simulated clock: command overhead (host,
//! bus, controller; jittered by the noise model), positioning (a seek along
//! the seek curve, whose one-cylinder value is the cylinder switch time, or a
//! head switch), the rotational wait until the first sector comes under the
//! head, then the transfer, track by track. The platters turn at a constant
//! rate from time zero, so every latency follows from the clock.
//!
//! Options: a write-back cache (writes complete after the overhead), read-
//! ahead (a read leaves the rest of its track in the cache), timing noise
//! (Gaussian jitter on the overhead plus rare outliers), a seed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::{Error, Op, Target};

/// Bytes per simulated sector.
pub const SECTOR: u64 = 512;

/// A recording zone: `cylinders` consecutive cylinders with `spt` sectors on
/// every track.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Zone {
    /// How many cylinders the zone has.
    pub cylinders: u32,
    /// Sectors on each of its tracks.
    pub spt: u32,
}

/// Order of tracks within and across cylinders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// Every cylinder walks its surfaces from the first head to the last.
    HeadFirst,
    /// Odd cylinders walk the surfaces from the last head back to the
    /// first, so that crossing to the next cylinder keeps the head.
    Serpentine,
}

/// Seek time against distance in cylinders: `short_a + short_b * sqrt(d)`
/// below `boundary`, `long_c + long_e * d` from there on (the form of the
/// classic HP 97560 model). A one-cylinder move is the cylinder switch.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SeekCurve {
    /// Constant of the short-seek part (ms).
    pub short_a: f64,
    /// Square-root coefficient of the short-seek part (ms).
    pub short_b: f64,
    /// Distance (cylinders) from which the linear part applies.
    pub boundary: u32,
    /// Constant of the long-seek part (ms).
    pub long_c: f64,
    /// Per-cylinder coefficient of the long-seek part (ms).
    pub long_e: f64,
}

impl SeekCurve {
    /// A curve through `one` ms at one cylinder and `full` ms at `cyls`,
    /// square root for the first third of the stroke and linear (with the
    /// same slope where they meet) beyond.
    pub fn through(one: f64, full: f64, cyls: u32) -> SeekCurve {
        let d0 = (cyls as f64 / 3.0).max(4.0);
        let cyls = cyls as f64;
        let b = (full - one) / (d0.sqrt() - 1.0 + (cyls - d0) / (2.0 * d0.sqrt()));
        let a = one - b;
        let e = b / (2.0 * d0.sqrt());
        let c = a + b * d0.sqrt() - e * d0;
        SeekCurve {
            short_a: a,
            short_b: b,
            boundary: d0 as u32,
            long_c: c,
            long_e: e,
        }
    }

    /// Milliseconds to move `d` cylinders (d >= 1).
    pub fn time(&self, d: u32) -> f64 {
        let d = d as f64;
        if d < self.boundary as f64 {
            self.short_a + self.short_b * d.sqrt()
        } else {
            self.long_c + self.long_e * d
        }
    }
}

/// Everything that defines a simulated drive.
#[derive(Debug, Clone, Serialize)]
pub struct Spec {
    /// The preset's short name (`--sim NAME`).
    pub name: &'static str,
    /// The drive's make and model.
    pub model: &'static str,
    /// Where the values come from.
    pub source: &'static str,
    /// Rotations per minute.
    pub rpm: f64,
    /// Recording surfaces (heads), so tracks per cylinder.
    pub surfaces: u32,
    /// Outermost first.
    pub zones: Vec<Zone>,
    /// Mechanical head switch time; the track skew covers it.
    pub head_switch_ms: f64,
    /// Mechanical cylinder switch (one-cylinder seek); the cylinder skew covers it.
    pub cyl_switch_ms: f64,
    /// Fixed track skew in sectors, where the drive's documentation gives
    /// it (else derived from the head switch time).
    pub track_skew: Option<u32>,
    /// Fixed cylinder skew in sectors, where the drive's documentation
    /// gives it (else derived from the cylinder switch time).
    pub cyl_skew: Option<u32>,
    /// Seek time against distance.
    pub seek: SeekCurve,
    /// Host + bus + controller time before the mechanism starts.
    pub overhead_ms: f64,
    /// A write-back cache: writes complete after the overhead (hides the
    /// mechanism from write SKIPPY).
    pub write_cache: bool,
    /// A read leaves the rest of its track in the cache.
    pub read_ahead: bool,
    /// Order of tracks within and across cylinders.
    pub layout: Layout,
    /// Gaussian jitter (standard deviation) on the overhead.
    pub noise_ms: f64,
    /// Probability of an outlier (0.5-4 ms late) per request.
    pub outlier_rate: f64,
    /// Seed of the noise and outliers: a seed repeats a run exactly.
    pub seed: u64,
}

impl Spec {
    /// Time of one rotation (ms).
    pub fn rotation_ms(&self) -> f64 {
        60_000.0 / self.rpm
    }
    /// Cylinders over all zones.
    pub fn cylinders(&self) -> u32 {
        self.zones.iter().map(|z| z.cylinders).sum()
    }
    /// Capacity in sectors of [`SECTOR`] bytes.
    pub fn sectors(&self) -> u64 {
        self.zones
            .iter()
            .map(|z| z.cylinders as u64 * self.surfaces as u64 * z.spt as u64)
            .sum()
    }
    fn sector_ms(&self, spt: u32) -> f64 {
        self.rotation_ms() / spt as f64
    }
    /// Track skew in sectors for a zone.
    pub fn track_skew_for(&self, spt: u32) -> u32 {
        self.track_skew
            .unwrap_or_else(|| (self.head_switch_ms / self.sector_ms(spt)).ceil() as u32)
    }
    /// Cylinder skew in sectors for a zone.
    pub fn cyl_skew_for(&self, spt: u32) -> u32 {
        self.cyl_skew
            .unwrap_or_else(|| (self.cyl_switch_ms / self.sector_ms(spt)).ceil() as u32)
    }
    /// What a head switch costs a stream in the outermost zone: its skew.
    pub fn effective_head_switch_ms(&self) -> f64 {
        let spt = self.zones[0].spt;
        self.track_skew_for(spt) as f64 * self.sector_ms(spt)
    }
    /// What a cylinder switch costs a stream in the outermost zone.
    pub fn effective_cyl_switch_ms(&self) -> f64 {
        let spt = self.zones[0].spt;
        self.cyl_skew_for(spt) as f64 * self.sector_ms(spt)
    }
    /// Sequential bandwidth of a zone in MB/s (10^6 bytes): a track per
    /// rotation, less the skew lost at every track boundary.
    pub fn zone_mbps(&self, z: &Zone) -> f64 {
        let s = self.surfaces as f64;
        let skew =
            ((s - 1.0) * self.track_skew_for(z.spt) as f64 + self.cyl_skew_for(z.spt) as f64) / s;
        let per_track_ms = self.rotation_ms() * (1.0 + skew / z.spt as f64);
        z.spt as f64 * SECTOR as f64 / per_track_ms / 1000.0
    }
    /// A copy without noise (for exact checks).
    pub fn quiet(mut self) -> Spec {
        self.noise_ms = 0.0;
        self.outlier_rate = 0.0;
        self
    }
}

fn zones(outer: u32, inner: u32, n: u32, total_cyls: u32) -> Vec<Zone> {
    let n = n.max(1);
    (0..n)
        .map(|i| {
            let f = if n == 1 {
                0.0
            } else {
                i as f64 / (n - 1) as f64
            };
            Zone {
                cylinders: total_cyls / n + u32::from(i < total_cyls % n),
                spt: (outer as f64 + (inner as f64 - outer as f64) * f).round() as u32,
            }
        })
        .collect()
}

fn cyls_for(capacity_gb: f64, surfaces: u32, outer: u32, inner: u32) -> u32 {
    let avg = (outer + inner) as f64 / 2.0;
    (capacity_gb * 1e9 / (surfaces as f64 * avg * SECTOR as f64)).round() as u32
}

#[allow(clippy::too_many_arguments)]
fn preset(
    name: &'static str,
    model: &'static str,
    source: &'static str,
    rpm: f64,
    surfaces: u32,
    capacity_gb: f64,
    (outer, inner, nzones): (u32, u32, u32),
    (hs, cs): (f64, f64),
    max_seek: f64,
    overhead: f64,
) -> Spec {
    let cyls = cyls_for(capacity_gb, surfaces, outer, inner);
    Spec {
        name,
        model,
        source,
        rpm,
        surfaces,
        zones: zones(outer, inner, nzones, cyls),
        head_switch_ms: hs,
        cyl_switch_ms: cs,
        track_skew: None,
        cyl_skew: None,
        seek: SeekCurve::through(cs, max_seek, cyls),
        overhead_ms: overhead,
        write_cache: false,
        read_ahead: true,
        layout: Layout::HeadFirst,
        noise_ms: 0.03,
        outlier_rate: 0.01,
        seed: 1,
    }
}

/// The paper's drives. RPM, surfaces and capacity are the paper's Table 2
/// (the manufacturers' sheets); sectors per track, switch times, overhead
/// (MTM), bandwidth ratio (inner/outer zone) and longest seek are the
/// paper's Table 3 unless a published specification is named.
pub fn presets() -> Vec<Spec> {
    let t = "Table 2 (RPM, surfaces, capacity); Table 3 (sectors/track, switch times, MTM as overhead, inner/outer bandwidth, max seek); zone count assumed";
    let mut v = vec![
        preset("hawk", "Seagate ST32430W Hawk", t, 5411.0, 9, 2.05, (142, 82, 12), (1.16, 2.29), 19.72, 1.93),
        preset("barracuda", "Seagate ST15150W Barracuda", t, 7200.0, 21, 4.10, (123, 80, 16), (0.76, 1.32), 15.64, 2.01),
        preset("micropolis", "Micropolis 3391", t, 7200.0, 22, 8.69, (201, 112, 8), (1.50, 2.62), 14.42, 3.78),
        preset(
            "ultrastar",
            "IBM UltraStar XP",
            "Table 2; manufacturer specification quoted in the paper (184..120 sectors/track in 8 zones, head switch 0.85 ms, cylinder switch 2.17 ms); Table 3 (MTM, max seek)",
            7200.0,
            18,
            8.69,
            (184, 120, 8),
            (0.85, 2.17),
            16.95,
            2.10,
        ),
        preset("9zx", "IBM 9ZX", t, 10020.0, 12, 8.70, (224, 140, 10), (0.79, 1.91), 16.17, 1.40),
        preset(
            "fireball",
            "Quantum Fireball EX 3.2A (IDE)",
            "Table 2; Table 3 (one zone: equal inner and outer bandwidth); max seek not measured in the paper: 15 ms assumed",
            5400.0,
            2,
            3.08,
            (356, 356, 1),
            (2.19, 2.89),
            15.0,
            1.25,
        ),
        preset("dtta", "IBM-DTTA-351010 (IDE)", t, 5400.0, 6, 9.6, (330, 330, 1), (1.93, 3.81), 16.41, 1.02),
    ];
    // The HP 97560 as Ruemmler and Wilkes describe it (the model behind the
    // Dartmouth simulator the paper ran): 1962 cylinders, 19 surfaces, 72
    // sectors per track, 4002 RPM, track skew 8 and cylinder skew 18 sectors,
    // seek 3.24 + 0.400 sqrt(d) ms below 383 cylinders, 8.00 + 0.008 d above;
    // overhead 2.2 ms controller plus host (Table 3's MTM is 3.12 ms).
    v.push(Spec {
        name: "hp97560",
        model: "HP 97560 (simulated in the paper)",
        source: "Ruemmler & Wilkes' HP 97560 model (geometry, skews, seek curve); Table 3 (MTM)",
        rpm: 4002.0,
        surfaces: 19,
        zones: vec![Zone {
            cylinders: 1962,
            spt: 72,
        }],
        head_switch_ms: 1.6,
        cyl_switch_ms: 3.5,
        track_skew: Some(8),
        cyl_skew: Some(18),
        seek: SeekCurve {
            short_a: 3.24,
            short_b: 0.400,
            boundary: 383,
            long_c: 8.00,
            long_e: 0.008,
        },
        overhead_ms: 2.9,
        write_cache: false,
        read_ahead: false,
        layout: Layout::HeadFirst,
        noise_ms: 0.03,
        outlier_rate: 0.01,
        seed: 1,
    });
    v.push(preset(
        "rz26",
        "DEC RZ26 (simulated in the paper)",
        "Table 2 (5400 RPM, 14 surfaces, 1.03 GB); Table 3 (58 sectors/track rounded from 60.33 toward diskSim's RZ26, switch times, MTM, max seek); one zone",
        5400.0,
        14,
        1.03,
        (58, 58, 1),
        (1.70, 5.13),
        17.95,
        3.09,
    ));
    v
}

/// Look a preset up by name.
pub fn preset_named(name: &str) -> Result<Spec, Error> {
    presets()
        .into_iter()
        .find(|p| p.name.eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            Error::UnknownPreset(
                name.to_string(),
                presets()
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
}

#[derive(Debug, Clone, Copy)]
struct Pos {
    zone: usize,
    cyl: u32,
    head: u32,
    sector: u32,
    spt: u32,
    /// First LBA of this track.
    track_lba: u64,
}

struct ZoneIdx {
    first_lba: u64,
    first_cyl: u32,
    spt: u32,
    track_skew: u32,
    cyl_skew: u32,
}

/// A simulated drive.
pub struct Disk {
    spec: Spec,
    zones: Vec<ZoneIdx>,
    rot: f64,
    now: f64,
    cyl: u32,
    head: u32,
    cache: Option<(u64, u64)>,
    rng: StdRng,
    sectors: u64,
}

impl Disk {
    /// A drive built to `spec`, its head over cylinder 0 at time zero.
    pub fn new(spec: Spec) -> Disk {
        let mut zones = Vec::new();
        let (mut lba, mut cyl) = (0u64, 0u32);
        for z in &spec.zones {
            zones.push(ZoneIdx {
                first_lba: lba,
                first_cyl: cyl,
                spt: z.spt,
                track_skew: spec.track_skew_for(z.spt),
                cyl_skew: spec.cyl_skew_for(z.spt),
            });
            lba += z.cylinders as u64 * spec.surfaces as u64 * z.spt as u64;
            cyl += z.cylinders;
        }
        Disk {
            rot: spec.rotation_ms(),
            rng: StdRng::seed_from_u64(spec.seed),
            sectors: lba,
            spec,
            zones,
            now: 0.0,
            cyl: 0,
            head: 0,
            cache: None,
        }
    }

    /// What the drive was built to.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    fn locate(&self, lba: u64) -> Pos {
        let zi = self
            .zones
            .iter()
            .rposition(|z| z.first_lba <= lba)
            .unwrap_or(0);
        let z = &self.zones[zi];
        let rel = lba - z.first_lba;
        let s = self.spec.surfaces as u64;
        let spc = z.spt as u64 * s;
        let cyl_in = (rel / spc) as u32;
        let track_in = ((rel % spc) / z.spt as u64) as u32;
        let sector = (rel % z.spt as u64) as u32;
        let head = match self.spec.layout {
            Layout::Serpentine if (z.first_cyl + cyl_in) % 2 == 1 => {
                self.spec.surfaces - 1 - track_in
            }
            _ => track_in,
        };
        Pos {
            zone: zi,
            cyl: z.first_cyl + cyl_in,
            head,
            sector,
            spt: z.spt,
            track_lba: lba - sector as u64,
        }
    }

    /// Angle (in sectors of its track) of a sector's start: the track's skew
    /// accumulated from the zone's first track, plus the sector.
    fn angle(&self, p: &Pos) -> f64 {
        let z = &self.zones[p.zone];
        let cyl_in = (p.cyl - z.first_cyl) as u64;
        let track_in = ((p.track_lba - z.first_lba) / z.spt as u64) % self.spec.surfaces as u64;
        let skew = cyl_in
            * ((self.spec.surfaces as u64 - 1) * z.track_skew as u64 + z.cyl_skew as u64)
            + track_in * z.track_skew as u64;
        ((skew + p.sector as u64) % z.spt as u64) as f64
    }

    /// Where the head is over a track of `spt` sectors at time `t`.
    fn head_angle(&self, t: f64, spt: u32) -> f64 {
        (t / self.rot).fract() * spt as f64
    }

    fn position(&mut self, p: &Pos) -> f64 {
        let d = self.cyl.abs_diff(p.cyl);
        let t = if d > 0 {
            if d == 1 {
                self.spec.cyl_switch_ms
            } else {
                self.spec.seek.time(d)
            }
        } else if self.head != p.head {
            self.spec.head_switch_ms
        } else {
            0.0
        };
        self.cyl = p.cyl;
        self.head = p.head;
        t
    }

    fn gauss(&mut self) -> f64 {
        // Box-Muller.
        let u1: f64 = self.rng.gen_range(1e-12..1.0);
        let u2: f64 = self.rng.gen();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Serve one request arriving now; returns its latency in ms.
    pub fn serve(&mut self, op: Op, lba: u64, count: u32) -> f64 {
        let start = self.now;
        let mut jitter = self.spec.noise_ms * self.gauss();
        jitter = jitter.max(-0.5 * self.spec.overhead_ms);
        if self.spec.outlier_rate > 0.0 && self.rng.gen::<f64>() < self.spec.outlier_rate {
            jitter += self.rng.gen_range(0.5..4.0);
        }
        let mut t = start + self.spec.overhead_ms + jitter;
        let end_lba = lba + count as u64;
        let cached = match (op, self.cache) {
            (Op::Read, Some((a, b))) => lba >= a && end_lba <= b,
            _ => false,
        };
        if (op == Op::Write && self.spec.write_cache) || cached {
            // Served from the drive's memory: the bus transfer only.
            t += count as f64 * 0.002;
            if op == Op::Write {
                self.cache = None;
            }
            self.now = t;
            return t - start;
        }
        let mut cur = lba;
        while cur < end_lba {
            let p = self.locate(cur.min(self.sectors - 1));
            // A seek or switch; inside a request, the head or cylinder
            // switch at a track boundary (the skew hides most of it).
            t += self.position(&p);
            let target = self.angle(&p);
            let here = self.head_angle(t, p.spt);
            let sector_ms = self.rot / p.spt as f64;
            let wait = (target - here).rem_euclid(p.spt as f64) * sector_ms;
            let n = (p.spt - p.sector).min((end_lba - cur) as u32);
            t += wait + n as f64 * sector_ms;
            cur += n as u64;
        }
        if op == Op::Read && self.spec.read_ahead {
            let p = self.locate((end_lba - 1).min(self.sectors - 1));
            self.cache = Some((end_lba, p.track_lba + p.spt as u64));
        } else if op == Op::Write {
            self.cache = None;
        }
        self.now = t;
        t - start
    }

    /// Let time pass (the host doing something else).
    pub fn idle(&mut self, ms: f64) {
        self.now += ms;
    }
}

impl Target for Disk {
    fn sector_size(&self) -> u64 {
        SECTOR
    }
    fn sectors(&self) -> u64 {
        self.sectors
    }
    fn access(&mut self, op: Op, lba: u64, count: u32) -> Result<f64, Error> {
        if lba + count as u64 > self.sectors {
            return Err(Error::Invalid(format!(
                "access at sector {lba} (+{count}) is past the end ({} sectors)",
                self.sectors
            )));
        }
        Ok(self.serve(op, lba, count))
    }
    fn elapsed_ms(&self) -> f64 {
        self.now
    }
    fn idle(&mut self, ms: f64) {
        Disk::idle(self, ms);
    }
    fn describe(&self) -> String {
        format!("simulated {} ({})", self.spec.name, self.spec.model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp() -> Disk {
        Disk::new(preset_named("hp97560").unwrap().quiet())
    }

    #[test]
    fn hp_seek_curve_is_the_published_one() {
        let s = preset_named("hp97560").unwrap().seek;
        assert!((s.time(100) - (3.24 + 4.0)).abs() < 1e-9);
        assert!((s.time(1000) - 16.0).abs() < 1e-9);
    }

    #[test]
    fn fitted_seek_curves_pass_their_anchors_and_rise() {
        let c = SeekCurve::through(1.3, 15.6, 6000);
        assert!((c.time(1) - 1.3).abs() < 1e-9);
        assert!((c.time(6000) - 15.6).abs() < 1e-6);
        let b = c.boundary;
        assert!(
            (c.time(b - 1) - c.time(b)).abs() < 0.01,
            "continuous at the boundary"
        );
        let mut last = 0.0;
        for d in [1, 2, 10, 100, 1000, 5999] {
            assert!(c.time(d) > last);
            last = c.time(d);
        }
    }

    #[test]
    fn rereading_the_same_sector_waits_one_rotation() {
        let mut d = hp();
        d.serve(Op::Write, 1000, 1);
        // The same sector again comes round exactly one rotation after it
        // was last under the head: the overhead is spent while it turns.
        let l = d.serve(Op::Write, 1000, 1);
        assert!((l - d.spec().rotation_ms()).abs() < 1e-6, "{l}");
    }

    #[test]
    fn sequential_reads_run_at_the_zone_rate() {
        let mut d = Disk::new(preset_named("ultrastar").unwrap().quiet());
        let spec = d.spec().clone();
        let t0 = d.elapsed_ms();
        let n = 2048u32;
        for i in 0..200u64 {
            d.serve(Op::Read, i * n as u64, n);
        }
        let mbps = 200.0 * n as f64 * 512.0 / (d.elapsed_ms() - t0) / 1000.0;
        let want = spec.zone_mbps(&spec.zones[0]);
        // Per-request overhead costs a little more than the media rate.
        assert!(mbps < want && mbps > 0.75 * want, "{mbps} vs {want}");
    }

    #[test]
    fn layouts_cover_every_sector_once() {
        for layout in [Layout::HeadFirst, Layout::Serpentine] {
            let mut s = preset_named("rz26").unwrap();
            s.layout = layout;
            s.zones = vec![Zone {
                cylinders: 3,
                spt: 10,
            }];
            let d = Disk::new(s);
            let mut seen = std::collections::HashSet::new();
            for lba in 0..d.sectors() {
                let p = d.locate(lba);
                assert!(
                    seen.insert((p.cyl, p.head, p.sector)),
                    "{layout:?} lba {lba}"
                );
            }
        }
    }

    #[test]
    fn write_cache_hides_the_mechanism() {
        let mut s = preset_named("barracuda").unwrap().quiet();
        s.write_cache = true;
        let mut d = Disk::new(s);
        let l = d.serve(Op::Write, 5000, 1);
        assert!(l < 2.1, "{l}");
    }

    #[test]
    fn the_seed_makes_runs_repeat() {
        let run = || {
            let mut d = Disk::new(preset_named("9zx").unwrap());
            (0..50)
                .map(|i| d.serve(Op::Write, i * 37, 1))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }
}
