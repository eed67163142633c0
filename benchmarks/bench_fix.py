"""``placecheck fix`` against ``placecheck audit`` on the same target, measured in one run.

The issue's target: fixing the bundled buggy example, proof included, takes
under 2x the time of its audit. Both are measured two ways, alternated
``--repeat`` times (best of each):

- ``cli``: wall time of the command as a user runs it (``python -m placecheck
  audit TARGET`` / ``fix TARGET``), each a fresh process, interpreter and
  ``import torch`` included;
- ``warm``: inside one process after the imports: one ``audit()`` call, then
  one ``fix()`` call (its audit plus the proof in a forked child), after a
  first audit that warms the process's caches.

The proof's child is forked from the warm process, so it does not pay
``import torch`` again; the ``cli`` ratio is therefore well under 2 while the
``warm`` ratio (two audits against one) is near 2: both are printed.

    python benchmarks/bench_fix.py [--target placecheck/examples/buggy.py:BuggyNet] [--repeat 3]

Prints a table and writes ``benchmarks/results/fix.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

_WARM = """
import sys, time, json
from placecheck.api import audit
from placecheck.fix import fix
from placecheck.load import build, resolve, split_target
from placecheck.options import AuditOptions
target = sys.argv[1]
_, attr = split_target(target)
options = AuditOptions(copy_model=False, target=target)
run = lambda: audit(lambda: build(resolve(target), attr, {}), options=options)
run()  # the first audit of a process pays lazy imports and caches: not what either is judged on
start = time.perf_counter()
run()
audited = time.perf_counter() - start
start = time.perf_counter()
fix(target, AuditOptions())
fixed = time.perf_counter() - start
print(json.dumps({"audit": audited, "fix": fixed}))
"""


def _cli(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "placecheck", *args], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="placecheck/examples/buggy.py:BuggyNet")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cli_audit, cli_fix, warm_audit, warm_fix = [], [], [], []
    for _ in range(args.repeat):
        cli_audit.append(_cli(["audit", args.target]))
        cli_fix.append(_cli(["fix", args.target]))
        out = subprocess.run([sys.executable, "-c", _WARM, args.target], capture_output=True, text=True,
                             check=True)
        times = json.loads(out.stdout.strip().splitlines()[-1])
        warm_audit.append(times["audit"])
        warm_fix.append(times["fix"])
    rows = {"cli": (min(cli_audit), min(cli_fix)), "warm": (min(warm_audit), min(warm_fix))}
    print(f"{'':6} {'audit s':>8} {'fix s':>8} {'ratio':>6}   target {args.target}, best of {args.repeat}")
    for name, (audited, fixed) in rows.items():
        print(f"{name:6} {audited:8.2f} {fixed:8.2f} {fixed / audited:6.2f}")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / "fix.json").write_text(json.dumps(
        {"target": args.target, "repeat": args.repeat,
         **{name: {"audit_s": a, "fix_s": f, "ratio": f / a} for name, (a, f) in rows.items()}},
        indent=2) + "\n")


if __name__ == "__main__":
    main()
