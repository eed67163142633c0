"""``placecheck fix`` against ``placecheck audit`` on the same target, measured in one run.

The issue's target: fixing the bundled buggy example, proof included, takes
under 2x the time of its audit. It is judged on what a user runs, the two
commands (``cli``); the in-process times are printed beside it. Each is
measured ``--repeat`` times, alternated, best of each:

- ``cli`` (the target): wall time of ``python -m placecheck audit TARGET`` and
  ``python -m placecheck fix TARGET``, each a fresh process, interpreter and
  ``import torch`` included;
- ``warm``, inside one process after a first audit: one ``audit()`` call, the
  first ``fix()`` call (it imports libcst and parses the file), and a second
  ``fix()`` call (everything warm). A fix is two audits (its own and the
  proof's, in a child forked from the warm process), so this ratio is 2 at
  best; on the command line ``import torch`` and the interpreter's start,
  paid once by either command, dominate.

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
from placecheck.commands.api import audit
from placecheck.fix import fix
from placecheck.model.load import build, resolve, split_target
from placecheck.basics.options import AuditOptions
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
first = time.perf_counter() - start
start = time.perf_counter()
fix(target, AuditOptions())
fixed = time.perf_counter() - start
print(json.dumps({"audit": audited, "fix_first": first, "fix": fixed}))
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
    cli_audit, cli_fix, warm_audit, warm_first, warm_fix = [], [], [], [], []
    for _ in range(args.repeat):
        cli_audit.append(_cli(["audit", args.target]))
        cli_fix.append(_cli(["fix", args.target]))
        out = subprocess.run([sys.executable, "-c", _WARM, args.target], capture_output=True, text=True,
                             check=True)
        times = json.loads(out.stdout.strip().splitlines()[-1])
        warm_audit.append(times["audit"])
        warm_first.append(times["fix_first"])
        warm_fix.append(times["fix"])
    rows = {"cli": (min(cli_audit), min(cli_fix)), "warm_first": (min(warm_audit), min(warm_first)),
            "warm": (min(warm_audit), min(warm_fix))}
    print(f"{'':10} {'audit s':>8} {'fix s':>8} {'ratio':>6}   target {args.target}, best of {args.repeat}")
    for name, (audited, fixed) in rows.items():
        print(f"{name:10} {audited:8.2f} {fixed:8.2f} {fixed / audited:6.2f}")
    ratio = rows["cli"][1] / rows["cli"][0]
    print(f"target: the fix command under 2x the audit command: {ratio:.2f}x, "
          f"{'met' if ratio < 2 else 'NOT met'}")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / "fix.json").write_text(json.dumps(
        {"target": args.target, "repeat": args.repeat,
         "goal": "placecheck fix TARGET (proof included) under 2x placecheck audit TARGET, as commands",
         "ratio": ratio, "met": ratio < 2,
         **{name: {"audit_s": a, "fix_s": f, "ratio": f / a} for name, (a, f) in rows.items()}},
        indent=2) + "\n")


if __name__ == "__main__":
    main()
