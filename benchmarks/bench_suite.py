"""``make test`` on a clean clone, as CI runs it: issue 14's target of 7 minutes on the project's machine.

Clones this repository's ``HEAD`` (committed work only, as CI sees it) into a temporary folder and
runs ``CI=true bash .ci/run`` there with standard input closed, as CI does: both venvs installed
from nothing, the whole suite on the main torch build, then the ``cpu_build`` tests on the CPU-only
build. Measured: the whole run's wall time, and from pytest's own summary lines the main suite's
and the CPU-only build's times and counts; "installs and the rest" is what remains (venvs, pip,
pytest's start-up and collection). The machine's reference workload (:mod:`machine`) is recorded
beside them: the project's machines differ by a factor of about three.

    python benchmarks/bench_suite.py [--keep]

``--keep`` leaves the clone (its path is printed). Prints a table and writes
``benchmarks/results/suite.json``; exits 1 when the run fails or misses the target.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import describe

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
TARGET_S = 7 * 60
# "==== 1905 passed, 65 skipped, 7 warnings in 248.85s (0:04:08) ===="
SUMMARY = re.compile(r"^=+ (?P<counts>.*?) in (?P<seconds>[\d.]+)s(?: \([\d:]+\))? =+$")


def pytest_runs(output: str) -> list[dict[str, Any]]:
    """Each pytest summary line of ``output``, in order: its seconds and its counts (``{"passed": 1905}``)."""
    runs = []
    for line in output.splitlines():
        match = SUMMARY.match(line.strip())
        if match:
            counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", match["counts"])}
            runs.append({"seconds": float(match["seconds"]), "counts": counts})
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the clone in place")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    workdir = Path(tempfile.mkdtemp(prefix="placecheck-suite-"))
    clone = workdir / "placecheck"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTEST_ADDOPTS")}
    env["CI"] = "true"
    start = time.perf_counter()
    proc = subprocess.run(["bash", ".ci/run"], cwd=clone, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    wall = time.perf_counter() - start
    (workdir / "ci.log").write_text(proc.stdout, encoding="utf-8")
    runs = pytest_runs(proc.stdout)
    machine = describe()  # after the run, which must not share the machine with it
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    main_suite, cpu_build = [*runs, {}, {}][:2]
    rest = wall - sum(r.get("seconds", 0.0) for r in (main_suite, cpu_build))
    met = proc.returncode == 0 and len(runs) == 2 and wall <= TARGET_S
    print(f"make test on a clean clone of {commit} (CI=true bash .ci/run): exit {proc.returncode}")
    print(f"{'part':<26}{'seconds':>9}  counts")
    for name, run in (("main suite", main_suite), ("CPU-only build (cpu_build)", cpu_build)):
        counts = ", ".join(f"{n} {word}" for word, n in run.get("counts", {}).items())
        print(f"{name:<26}{run.get('seconds', float('nan')):>9.1f}  {counts}")
    print(f"{'installs and the rest':<26}{rest:>9.1f}")
    print(f"{'whole run':<26}{wall:>9.1f}  target {TARGET_S} s: {'met' if met else 'MISSED'}")
    print(f"this machine's reference workload (benchmarks/machine.py): {machine['reference_s']:.2f} s")
    if args.keep:
        print(f"clone and log kept in {workdir}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "suite.json"
    out.write_text(json.dumps({
        "commit": commit, "machine": machine, "exit_code": proc.returncode, "wall_s": round(wall, 1),
        "main_suite": main_suite, "cpu_build": cpu_build, "installs_and_rest_s": round(rest, 1),
        "target_s": TARGET_S, "target_met": met,
    }, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
