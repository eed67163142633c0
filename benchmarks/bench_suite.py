"""``.ci/run`` on a clean clone from nothing, timed step by step: issue 41's targets, scaled to the machine.

Clones this repository's ``HEAD`` (committed work only, as CI sees it) into a temporary folder and
runs ``CI=true bash .ci/run`` there with standard input closed, as CI does: both venvs installed
from nothing, ``make test`` (the whole suite on the main torch build, then the ``cpu_build`` tests on
the CPU-only build), the corpus gate (on this checkout's ``../shared/corpus``, named to the clone's
``make test-corpus`` with ``CORPUS``) and the version matrix with its downloads. ``.ci/run`` announces
each step (``== .ci/run: make test``); each line is timed as it arrives, so each step's wall time is
measured, and from pytest's own summary lines the main suite's and the CPU-only build's times and
counts.

Issue 41's targets: ``make test`` at most 5 minutes and the whole ``.ci/run`` from nothing at most 15,
on the project's 2-core machine when they were set, whose reference workload (:mod:`machine`) took
1.9 s. The project's machines differ by a factor of about three, so each target is scaled by this
machine's reference workload, measured after the run: on a machine three times slower, the target is
three times longer. Both the absolute and the scaled figures are printed and written.

    python benchmarks/bench_suite.py [--keep]

``--keep`` leaves the clone and the log (its path is printed). Prints a table and writes
``benchmarks/results/suite.json``; exits 1 when the run fails or misses a target.
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
REFERENCE_S = 1.9
"""The reference workload on the machine where issue 41 set its targets (suite.json at 07bb510: 1.906 s)."""
TARGETS_S = {"make test": 5 * 60, ".ci/run": 15 * 60}
"""Issue 41, item 8, at :data:`REFERENCE_S`: ``make test`` and the whole ``.ci/run`` from nothing."""
# "==== 1905 passed, 65 skipped, 7 warnings in 248.85s (0:04:08) ===="
SUMMARY = re.compile(r"^=+ (?P<counts>.*?) in (?P<seconds>[\d.]+)s(?: \([\d:]+\))? =+$")
STEP = "== .ci/run: "


def pytest_runs(output: str) -> list[dict[str, Any]]:
    """Each pytest summary line of ``output``, in order: its seconds and its counts (``{"passed": 1905}``)."""
    runs = []
    for line in output.splitlines():
        match = SUMMARY.match(line.strip())
        if match:
            counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", match["counts"])}
            runs.append({"seconds": float(match["seconds"]), "counts": counts})
    return runs


def step_times(lines: list[tuple[float, str]], end: float) -> dict[str, float]:
    """Each step ``.ci/run`` announced (``== .ci/run: make test``) and its seconds, from the times its
    output's lines arrived (``(seconds, line)``, in order): from its announcement to the next one's, the
    last to ``end``."""
    starts = [(t, line[len(STEP):].strip()) for t, line in lines if line.startswith(STEP)]
    ends = [t for t, _ in starts[1:]] + [end] if starts else []
    steps: dict[str, float] = {}
    for (t, name), stop in zip(starts, ends, strict=True):
        name = " ".join(name.split()[:2])  # "make test-compat COMPAT_KEEP=0 ...": "make test-compat"
        steps[name] = round(stop - t, 1)
    return steps


def scaled_targets(reference_s: float) -> dict[str, float]:
    """:data:`TARGETS_S` on a machine whose reference workload took ``reference_s``."""
    return {name: round(target * reference_s / REFERENCE_S, 1) for name, target in TARGETS_S.items()}


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
    corpus = REPO.parent / "shared" / "corpus"
    if corpus.is_dir():  # the gate reads ../shared/corpus beside the clone: the clone here has none beside it
        env["CORPUS"] = str(corpus)
    lines: list[tuple[float, str]] = []
    start = time.perf_counter()
    with subprocess.Popen(["bash", ".ci/run"], cwd=clone, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.perf_counter() - start, line))
    wall = time.perf_counter() - start
    output = "".join(line for _, line in lines)
    (workdir / "ci.log").write_text(output, encoding="utf-8")
    runs = pytest_runs(output)
    steps = {**step_times(lines, wall), ".ci/run": round(wall, 1)}
    machine = describe()  # after the run, which must not share the machine with it
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    main_suite, cpu_build = [*runs, {}, {}][:2]
    targets = scaled_targets(machine["reference_s"])
    met = {name: proc.returncode == 0 and name in steps and steps[name] <= target
           for name, target in targets.items()}
    print(f".ci/run on a clean clone of {commit} (CI=true bash .ci/run): exit {proc.returncode}")
    print(f"{'part':<28}{'seconds':>9}  counts")
    for name, run in (("main suite", main_suite), ("CPU-only build (cpu_build)", cpu_build)):
        counts = ", ".join(f"{n} {word}" for word, n in run.get("counts", {}).items())
        print(f"{name:<28}{run.get('seconds', float('nan')):>9.1f}  {counts}")
    for name, seconds in steps.items():
        target = (f"  target {targets[name]:.0f} s ({TARGETS_S[name]} s at reference {REFERENCE_S} s): "
                  f"{'met' if met[name] else 'MISSED'}" if name in targets else "")
        print(f"{name:<28}{seconds:>9.1f}{target}")
    print(f"this machine's reference workload (benchmarks/machine.py): {machine['reference_s']:.2f} s")
    if args.keep:
        print(f"clone and log kept in {workdir}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "suite.json"
    out.write_text(json.dumps({
        "commit": commit, "machine": machine, "exit_code": proc.returncode, "wall_s": round(wall, 1),
        "steps_s": steps, "main_suite": main_suite, "cpu_build": cpu_build,
        "targets_at_reference_s": TARGETS_S, "reference_of_targets_s": REFERENCE_S, "targets_s": targets,
        "targets_met": met,
    }, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out}")
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
