#!/usr/bin/python3
"""Benchmarks the Python SDK against the Go SDK in one run, on this machine's gVisor.

It starts its own ``fusebox local up`` (bin/fusebox, the pinned runsc; root) on a unix socket
in a temporary directory, and measures with the Python SDK, as an agent sees it:

* exec round trip of ``true`` (p50, p99) over one sandbox's pinned connection;
* 3,000 files of 4 KiB (random data, 50 directories) materialised with write_files, then read
  back through the plan and compared byte for byte: the median of 5 rounds, as Go's figure;
* one file of 256 MiB of random bytes read back with read_file and compared: the median of 5;
* warm allocations including the first call (Manager.allocate over a kept manager connection
  with a fresh agent key, which the kept Manager makes ahead, then stat
  "."), each taken from a full pool that has settled, as ``fusebox-bench allocate --manager``
  does; every sandbox is released.

In the same run it measures the Go SDK: ``fusebox-bench allocate --manager ADDR`` against the
same manager, and ``fusebox-bench sdk --manager ADDR`` (one sandbox from the same manager, the
same workloads) for exec, materialisation and read-back: both SDKs meet sandboxes of one
template, limits and image. Prints one JSON object (``--json``) or a table. Keep runs short
on a shared machine.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fusebox  # noqa: E402
from tests.conftest import DEFAULT_RUNSC, REPO, LocalManager  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def settle(m: fusebox.Manager, target: int, settle_s: float, warm_s: float = 1.2, wait_s: float = 120.0) -> None:
    """Waits until the pool holds target ready units, creates and destroys nothing, for
    settle_s, and its oldest ready unit is warm_s old (past gVisor's clock warm-up)."""
    end = time.monotonic() + wait_s
    full_since = None
    while time.monotonic() < end:
        units = m.list()
        ready = [u for u in units if u.state == "READY"]
        busy = any(u.state in ("CREATING", "DESTROYING") for u in units)
        now = datetime.datetime.now(datetime.timezone.utc)
        if len(ready) >= target and not busy:
            full_since = full_since or time.monotonic()
            oldest = min(u.created for u in ready if u.created) if ready else now
            if time.monotonic() - full_since >= settle_s and (now - oldest).total_seconds() >= warm_s:
                return
        else:
            full_since = None
        time.sleep(0.02)
    raise RuntimeError("the manager's pool did not settle")


# ALLOCATE_P99_TARGET_MS is the target for the p99 of warm allocations including the first
# call; the figures count the allocations at or over it, since a p99 of a few hundred is
# decided by its slowest two or three.
ALLOCATE_P99_TARGET_MS = 15.0

# ROUNDS is how many times the small-file workload runs; its figures are the median, as Go's.
ROUNDS = 5

# The streamed file: its size and how many times it is read back (Go's streamRounds).
STREAM_MIB = 256
STREAM_ROUNDS = 5


def python_figures(addr: str, exec_runs: int, alloc_runs: int, settle_s: float, pool: int) -> dict:
    out = {}
    with fusebox.Manager(addr) as m:
        settle(m, pool, settle_s)
        with m.allocate() as sb:
            for _ in range(20):
                sb.exec(["true"])
            lat = []
            for _ in range(exec_runs):
                t0 = time.perf_counter()
                sb.exec(["true"])
                lat.append((time.perf_counter() - t0) * 1e3)
            out["exec_roundtrip_p50_ms"], out["exec_roundtrip_p99_ms"] = pct(lat, 50), pct(lat, 99)
            # Go's workload and method (test/bench): 3,000 files of 4 KiB of random bytes dealt
            # round 50 directories, a fresh root per round, the median of ROUNDS rounds.
            rnd = random.Random(1)
            data = [rnd.randbytes(4096) for _ in range(3000)]
            mats, reads = [], []
            for r in range(ROUNDS):
                files = {f"mat{r}/d{i % 50:02d}/f{i:05d}.txt": d for i, d in enumerate(data)}
                t0 = time.perf_counter()
                st = sb.write_files(files)
                mats.append(time.perf_counter() - t0)
                out["materialize_3000x4k_rpcs"] = st.batches + st.streamed
                t0 = time.perf_counter()
                got = sb.read_files(f"mat{r}/**")
                if got != files:
                    raise RuntimeError("read back differs from what was written")
                reads.append(time.perf_counter() - t0)
            out["materialize_3000x4k_s"], out["read_plan_3000x4k_s"] = statistics.median(mats), statistics.median(reads)
            out["materialize_rounds"] = ROUNDS
            # Go's stream out (fusebox-bench sdk): one file of STREAM_MIB random MiB read back
            # with read_file, compared, the median of STREAM_ROUNDS.
            big = os.urandom(STREAM_MIB << 20)
            sb.write_file_from("big.bin", io.BytesIO(big), size=len(big))
            mibs = []
            for _ in range(STREAM_ROUNDS):
                t0 = time.perf_counter()
                got = sb.read_file("big.bin")
                d = time.perf_counter() - t0
                if got != big:
                    raise RuntimeError("streamed back differs from what was written")
                mibs.append(STREAM_MIB / d)
            out["read_file_256m_mib_s"] = statistics.median(mibs)
        lat = []
        for _ in range(alloc_runs):
            settle(m, pool, settle_s)
            t0 = time.perf_counter()
            sb = m.allocate()
            sb.stat(".")
            lat.append((time.perf_counter() - t0) * 1e3)
            sb.close()
        out["allocate_p50_ms"], out["allocate_p90_ms"], out["allocate_p99_ms"] = pct(lat, 50), pct(lat, 90), pct(lat, 99)
        out["allocate_max_ms"] = max(lat)
        out["allocate_over_target"] = sum(1 for x in lat if x >= ALLOCATE_P99_TARGET_MS)
        out["allocate_runs"] = alloc_runs
    return out


def run_json(argv: list) -> dict:
    """Runs argv and returns its standard output as JSON; on failure, raises with its stderr."""
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(str(a) for a in argv)}: exit status {p.returncode}:\n{p.stderr.strip()}")
    return json.loads(p.stdout)


def go_figures(bench: Path, addr: str, exec_runs: int, alloc_runs: int, settle_s: float) -> dict:
    """The Go SDK's figures, from fusebox-bench (the benchmarks' binary, beside fusebox)."""
    alloc = run_json([bench, "allocate", "--manager", addr, "--runs", alloc_runs,
                      "--settle", f"{int(settle_s * 1000)}ms", "--json"])
    sdk = run_json([bench, "sdk", "--manager", addr, "--exec-runs", exec_runs, "--json"])
    return {"exec_roundtrip_p50_ms": sdk["exec_roundtrip_p50_ms"], "exec_roundtrip_p99_ms": sdk["exec_roundtrip_p99_ms"],
            "materialize_3000x4k_s": sdk["materialize"]["seconds"], "materialize_3000x4k_rpcs": sdk["materialize"]["rpcs"],
            "read_plan_3000x4k_s": sdk["read"]["seconds"], "read_file_256m_mib_s": sdk["stream_read"]["mib_per_s"],
            "allocate_p50_ms": alloc["allocate_p50_ms"], "allocate_p99_ms": alloc["allocate_p99_ms"], "allocate_runs": alloc["runs"]}


def arm_figures(managers: dict, runs: int, settle_s: float, pool: int, seed: int) -> dict:
    """Warm allocations with the first call through each manager of ``managers`` (arm name to
    address), interleaved: ``runs`` rounds, each taking every arm once in an order shuffled
    afresh, each after that arm's pool has settled. Returns each arm's p50, p90 and p99 and,
    for every arm but the first, the median over rounds of its time less the first's."""
    rng = random.Random(seed)
    names = list(managers)
    ms = {n: fusebox.Manager(a) for n, a in managers.items()}
    lat = {n: [] for n in names}
    try:
        for _ in range(runs):
            order = names[:]
            rng.shuffle(order)
            for n in order:
                settle(ms[n], pool, settle_s)
                t0 = time.perf_counter()
                sb = ms[n].allocate()
                sb.stat(".")
                lat[n].append((time.perf_counter() - t0) * 1e3)
                sb.close()
    finally:
        for m in ms.values():
            m.close()
    out = {"rounds": runs, "seed": seed, "arms": []}
    for n in names:
        arm = {"arm": n, "p50_ms": pct(lat[n], 50), "p90_ms": pct(lat[n], 90), "p99_ms": pct(lat[n], 99)}
        if n != names[0]:
            arm["paired_p50_ms"] = statistics.median(x - r for x, r in zip(lat[n], lat[names[0]]))
        out["arms"].append(arm)
    return out


def main_arms(a, binary: Path, runsc: str) -> int:
    """--arms: one fusebox local up per --fast-path setting, the Python SDK's warm allocations
    interleaved across them (arm_figures)."""
    arms = a.arms.split(",")
    lms = {arm: LocalManager(Path(tempfile.mkdtemp(prefix="fbxpyb-")), binary, runsc, ("--fast-path", arm)) for arm in arms}
    try:
        for lm in lms.values():
            lm.start()
        r = arm_figures({arm: lm.address for arm, lm in lms.items()}, a.alloc_runs, a.settle, 2, a.seed)
    finally:
        for lm in lms.values():
            lm.stop()
    r["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"python warm allocation + first call, {r['rounds']} interleaved rounds (seed {r['seed']}), p50 / p90 / p99 ms:")
    for arm in r["arms"]:
        paired = f", paired against {arms[0]} {arm['paired_p50_ms']:+.2f}" if "paired_p50_ms" in arm else ""
        print(f"  --fast-path {arm['arm']:24} {arm['p50_ms']:.2f} / {arm['p90_ms']:.2f} / {arm['p99_ms']:.2f}{paired}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exec-runs", type=int, default=300)
    ap.add_argument("--alloc-runs", type=int, default=200,
                    help="warm allocations per SDK; a p99 wants hundreds (1000 for a figure to quote)")
    ap.add_argument("--settle", type=float, default=0.1, help="seconds the full pool idles before each allocation")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--arms", help="compare the Python SDK's warm allocations across managers of these --fast-path "
                    "settings, comma-separated, interleaved (e.g. all,none: keep-awake on and off); "
                    "the first is the reference. Measures allocations only")
    ap.add_argument("--seed", type=int, default=1, help="with --arms: the seed of the rounds' order")
    a = ap.parse_args()
    binary = Path(os.environ.get("FUSEBOX_BIN") or REPO / "bin" / "fusebox")
    runsc = os.environ.get("FUSEBOX_RUNSC") or DEFAULT_RUNSC
    if a.arms:
        return main_arms(a, binary, runsc)
    lm = LocalManager(Path(tempfile.mkdtemp(prefix="fbxpyb-")), binary, runsc)
    pool = 2
    try:
        lm.start()
        py = python_figures(lm.address, a.exec_runs, a.alloc_runs, a.settle, pool)
        go = go_figures(binary.parent / "fusebox-bench", lm.address, a.exec_runs, a.alloc_runs, a.settle)
    finally:
        lm.stop()
    r = {"python": py, "go": go, "ratios": {
        "exec_p50_python_over_go": py["exec_roundtrip_p50_ms"] / go["exec_roundtrip_p50_ms"],
        "materialize_python_over_go": py["materialize_3000x4k_s"] / go["materialize_3000x4k_s"],
        "read_file_256m_python_over_go": py["read_file_256m_mib_s"] / go["read_file_256m_mib_s"]},
        "targets": {"exec_p50_ratio_max": 1.5, "materialize_ratio_max": 2.0, "allocate_p99_ms_max": ALLOCATE_P99_TARGET_MS,
                    "read_file_256m_ratio_min": 0.7},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "note": "python: one fusebox local up, SDK defaults, random data verified; go: fusebox-bench allocate --manager "
                "and fusebox-bench sdk --manager against the same manager"}
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    rows = [("exec round trip of true, p50 / p99", "exec_roundtrip_p50_ms", "exec_roundtrip_p99_ms", "ms"),
            ("materialise 3000 x 4 KiB", "materialize_3000x4k_s", None, "s"),
            ("read 3000 x 4 KiB via plan", "read_plan_3000x4k_s", None, "s"),
            ("read_file of 256 MiB, verified", "read_file_256m_mib_s", None, "MiB/s"),
            ("warm allocation + first call, p50 / p99", "allocate_p50_ms", "allocate_p99_ms", "ms")]
    print(f"{'figure':44} {'python':>18} {'go':>18}")
    for name, k1, k2, unit in rows:
        f = (lambda d: f"{d[k1]:.3f} / {d[k2]:.3f} {unit}") if k2 else (lambda d: f"{d[k1]:.3f} {unit}")
        print(f"{name:44} {f(py):>18} {f(go):>18}")
    print(f"python/go: exec p50 {r['ratios']['exec_p50_python_over_go']:.2f}x (target <= 1.5x), "
          f"materialise {r['ratios']['materialize_python_over_go']:.2f}x (target <= 2x), "
          f"read_file 256 MiB {r['ratios']['read_file_256m_python_over_go']:.2f}x (target >= 0.7x); "
          f"python allocation p99 {py['allocate_p99_ms']:.2f} ms (target < {ALLOCATE_P99_TARGET_MS:g} ms; "
          f"{py['allocate_over_target']} of {py['allocate_runs']} at or over it); {r['date']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
