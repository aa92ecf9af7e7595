#!/usr/bin/env python3
"""Regenerate the DiskSim SKIPPY traces under crates/disk/tests/disksim/traces.

Drives an already built DiskSim 4.0 (its `disksim` binary, given by path)
with SKIPPY's request pattern on each validated drive model that DiskSim
ships, and writes each run as a SKIPPY trace that `fastpath disk analyze`
reads. This script builds nothing and contains no DiskSim code: it writes a
request trace and a copy of the drive's parameter file (with the output
settings below), runs the binary, and reads the request times DiskSim logs.

    scripts/disksim-skippy.py /path/to/disksim /path/to/DiskSim/valid

`valid` is the directory of DiskSim's validated drive models (in
westerndigitalcorporation/DiskSim: STABLE/DiskSim_Linux_Generic_2.01.016/valid).

How a run is made:
- the request trace is in DiskSim's `validate` format, whose requests are
  issued one at a time, each when the previous one completes (plus a think
  time, here 0), as SKIPPY issues them. (The `ascii` format's arrival times
  cannot express that: its closed-loop setting, a negative `I/O Trace Time
  Scale`, is never stored by DiskSim 4.0's parameter loader.)
- the parameter file is the drive's own, with `Output file for trace of
  I/O requests simulated` set, so that DiskSim logs each request's issue
  time; a request's latency is the next one's issue time less its own (a
  last read at the start times the last step).
- scenarios: `write` (write SKIPPY, `Fast write level` 0: every write goes
  to the medium), `read` (read SKIPPY, the model's read-ahead and cache as
  published), `wcache` (write SKIPPY, `Fast write level` 2: writes complete
  from the cache); each at 400 and 900 steps, from random starts anywhere on
  the drive (seeded: the same arguments give the same traces).
- the drive's size comes from its ground-truth file beside the traces
  (crates/disk/tests/disksim/<drive>.toml).
"""

import argparse
import os
import random
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "crates" / "disk" / "tests" / "disksim"

DRIVES = [
    "atlas_III",
    "barracuda",
    "cheetah4LP",
    "cheetah9LP",
    "ibm18es",
    "atlas10k",
    "hp_c2247a",
    "hp_c3323a",
    "hp_c2490a",
    "dec_rz26",
    "st41601n",
]

# scenario: (operation, Fast write level or None for the model's own, starts per length)
SCENARIOS = {
    "write": ("W", 0, 10),
    "read": ("R", None, 2),
    "wcache": ("W", 2, 2),
}
LENGTHS = [400, 900]


def span(steps):
    """Sectors a forward SKIPPY run of `steps` steps covers, priming access included."""
    return steps * (steps + 1) // 2 + steps + 2


def requests(op, start, steps):
    """The run as DiskSim validate-format lines: a priming access, the steps,
    and a read at the start that times the last step."""
    lines = [f"{op} Miss {start} 1 0.0 0.0"]
    pos = start + 1
    for step in range(steps):
        lba = pos + step
        lines.append(f"{op} Miss {lba} 1 0.0 0.0")
        pos = lba + 1
    lines.append(f"R Miss {start} 1 0.0 0.0")
    return "\n".join(lines) + "\n"


def parameters(valid, drive, log):
    """The drive's parameter file, logging each request's issue time to `log`."""
    text = (valid / f"{drive}.parv").read_text()
    key = "Output file for trace of I/O requests simulated"
    lines = []
    for line in text.splitlines():
        if key in line:
            continue  # replaced below
        lines.append(line)
        if "Stat definition file" in line:
            if not line.rstrip().endswith(","):
                lines[-1] = line.rstrip() + ","
            lines.append(f"  {key} = {log}")
    return "\n".join(lines) + "\n"


def run(disksim, valid, work, drive, op, fwl, start, steps):
    """One SKIPPY run; its latencies (ms), one per step."""
    log = work / "issued.csv"
    log.write_text("")  # DiskSim opens it for update: it must exist
    parv = work / f"{drive}.parv"
    parv.write_text(parameters(valid, drive, log.name))
    trace = work / "requests.trace"
    trace.write_text(requests(op, start, steps))
    cmd = [str(disksim), parv.name, "out.outv", "validate", trace.name, "0"]
    if fwl is not None:
        cmd += ["disk0", "Fast write level", str(fwl)]
    r = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if r.returncode != 0:
        why = r.stderr.strip().splitlines()[-1:] or ["no message"]
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {why[0]}")
    times = []
    for line in log.read_text().splitlines()[1:]:
        times.append(float(line.split(",")[0]))
    if len(times) != steps + 2:
        sys.exit(f"{drive}: DiskSim logged {len(times)} requests, expected {steps + 2}")
    # times[0] is the priming access; step s is request s + 1.
    return [times[s + 2] - times[s + 1] for s in range(steps)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("disksim", type=Path, help="the built disksim binary")
    ap.add_argument("valid", type=Path, help="DiskSim's valid/ directory (drive models)")
    ap.add_argument("--out", type=Path, default=DATA / "traces")
    ap.add_argument("--seed", type=int, default=34)
    ap.add_argument("--drive", action="append", help="only these drives")
    a = ap.parse_args()
    disksim = a.disksim.resolve()
    valid = a.valid.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    written = 0
    for drive in a.drive or DRIVES:
        for old in a.out.glob(f"{drive}-*.csv"):
            old.unlink()
        truth = tomllib.loads((DATA / f"{drive}.toml").read_text())
        rng = random.Random(f"{a.seed}-{drive}")
        with tempfile.TemporaryDirectory(prefix="disksim-skippy-") as tmp:
            work = Path(tmp)
            # The parameter files name each other relative to their own
            # directory: link the drive models beside the edited copy.
            for f in valid.iterdir():
                if f.is_file():
                    os.symlink(f, work / f.name)
            os.unlink(work / f"{drive}.parv")
            for scenario, (op, fwl, starts) in SCENARIOS.items():
                skip = False
                for steps in LENGTHS:
                    for _ in range(starts):
                        if skip:
                            break
                        # DiskSim 4.0 stops on an assertion at some blocks
                        # (ST41601N: a slipped sector its own mapping
                        # misplaces) and on some models' write caches (DEC
                        # RZ26): another start, then give up on the scenario.
                        for attempt in range(4):
                            start = rng.randrange(0, truth["blocks"] - span(steps))
                            try:
                                lat = run(disksim, valid, work, drive, op, fwl, start, steps)
                                break
                            except RuntimeError as e:
                                print(f"{drive} {scenario} from {start}: {e}", file=sys.stderr)
                        else:
                            if scenario == "write":
                                sys.exit(f"{drive}: DiskSim failed on every start tried")
                            print(f"{drive} {scenario}: skipped", file=sys.stderr)
                            skip = True
                            break
                        name = f"{drive}-{scenario}-{steps}-{start}.csv"
                        with open(a.out / name, "w") as f:
                            f.write(
                                f"# DiskSim 4.0, drive model {drive} ({drive}.parv), "
                                f"{'write' if op == 'W' else 'read'} SKIPPY, "
                                f"fast write level {fwl if fwl is not None else 'as published'}\n"
                                f"# start: {start}\n"
                                "step,latency_ms\n"
                            )
                            for s, l in enumerate(lat):
                                f.write(f"{s},{l:.4f}\n")
                        written += 1
        print(f"{drive}: done", file=sys.stderr)
    print(f"{written} traces in {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
