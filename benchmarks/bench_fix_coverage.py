"""How much of the project's own buggy code ``placecheck fix`` fixes clean; that it never makes a file worse.

The corpus: every model fixture with findings (``tests/fixtures/forward``,
``tests/fixtures/seeds``, ``tests/fixtures/fix``), the bundled buggy example
(``placecheck/examples/buggy.py:BuggyNet``), and for ``fix --run`` the scripts
of ``tests/fixtures/fix/run`` and ``placecheck/examples/train_buggy.py``. Each
file is copied into a temporary directory and fixed there as a user would:
``fix`` (audit, edits, proof), ``write``, then ``fix`` again on the written
file. Per file:

- ``buggy``: the first audit reports something at warning or above (info
  findings alone do not make a bug file);
- ``clean``: a buggy file after the proven edits has nothing at warning or
  above left;
- ``worse``: the written file does not parse, or its audit reports a finding
  (code, place, op) more often than the first audit did; it must never happen;
- ``idempotent``: the second ``fix`` offers no edit.

The goal (issue 26): at least two thirds of the buggy files fixed
clean, none made worse. A file whose only findings are ones no rewrite should
touch (host syncs, a forward that raises) still counts against the fraction.

    python benchmarks/bench_fix_coverage.py

Prints a table and writes ``benchmarks/results/fix_coverage.json``.
"""

from __future__ import annotations

import ast
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
GOAL = 2 / 3

MODELS = [*(f"tests/fixtures/{folder}/{p.name}:Model" for folder in ("forward", "seeds", "fix")
            for p in sorted((ROOT / "tests" / "fixtures" / folder).glob("*.py"))
            if not p.name.endswith(".fixed.py")),
          "placecheck/examples/buggy.py:BuggyNet"]
SCRIPTS = [*(f"tests/fixtures/fix/run/{p.name}"
             for p in sorted((ROOT / "tests/fixtures/fix/run").glob("*.py"))
             if not p.name.endswith(".fixed.py")),
           "placecheck/examples/train_buggy.py"]


def _counted(findings: Any) -> Counter[tuple[str, str, str]]:
    return Counter((f.code, f.where, dict(f.details).get("op", "")) for f in findings)


def _measure(name: str, fix_once: Callable[[], Any], copy: Path) -> dict[str, Any]:
    from placecheck.findings.finding import Severity
    from placecheck.fix import write

    start = time.perf_counter()
    result = fix_once()
    before = result.report.findings
    buggy = any(f.severity.rank >= Severity.WARNING.rank for f in before)
    row: dict[str, Any] = {"file": name, "findings": len(before), "buggy": buggy,
                           "fixed": result.fixed_findings, "edits": len(result.edits),
                           "failed_proof": len(result.failed), "left": len(result.remaining),
                           "clean": buggy and result.exit_code == 0 and bool(result.edits)}
    write(result)
    try:
        ast.parse(copy.read_text(encoding="utf-8"))
        parses = True
    except SyntaxError:
        parses = False
    again = fix_once()
    gained = _counted(again.report.findings) - _counted(before)
    row.update(parses=parses, gained=sorted(f"{c} {w} {o}".strip() for c, w, o in gained.elements()),
               worse=not parses or bool(gained), idempotent=not again.edits,
               not_fixed=sorted({f"{u.finding.code}: {u.reason}" for u in result.not_fixable}),
               seconds=round(time.perf_counter() - start, 2))
    return row


def _model_row(target: str, folder: Path) -> dict[str, Any]:
    from placecheck.basics.options import AuditOptions
    from placecheck.fix import fix

    path, attr = target.rsplit(":", 1)
    copy = folder / Path(path).name
    shutil.copy(ROOT / path, copy)
    os.chdir(folder)
    return _measure(path, lambda: fix(f"{copy.name}:{attr}", AuditOptions()), copy)


def _script_row(script: str, folder: Path, checkpoint: str) -> dict[str, Any]:
    from placecheck.fix import fix_run

    copy = folder / Path(script).name
    shutil.copy(ROOT / script, copy)
    os.chdir(folder)
    return _measure(f"{script} (--run)", lambda: fix_run(copy.name, [checkpoint]), copy)


def main() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import torch.nn as nn
    from checkpoint_writer import save_with_locations

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-fix-") as tmp:
        checkpoint = Path(tmp) / "saved_on_cuda3.pt"  # the PC301 script loads it (argv[1])
        save_with_locations(dict(nn.Linear(8, 2).state_dict()), checkpoint, default="cuda:3")
        for index, target in enumerate(MODELS):
            folder = Path(tmp) / f"m{index}"
            folder.mkdir()
            rows.append(_model_row(target, folder))
        for index, script in enumerate(SCRIPTS):
            folder = Path(tmp) / f"s{index}"
            folder.mkdir()
            rows.append(_script_row(script, folder, str(checkpoint)))
        os.chdir(ROOT)
    buggy = [r for r in rows if r["buggy"]]
    clean = [r for r in buggy if r["clean"]]
    worse = [r for r in rows if r["worse"]]
    fraction = len(clean) / len(buggy) if buggy else 0.0
    print(f"{'file':58} {'found':>5} {'fixed':>5} {'left':>4} {'clean':>5} {'worse':>5} {'idem':>4}")
    for r in rows:
        print(f"{r['file'][-58:]:58} {r['findings']:5} {r['fixed']:5} {r['left']:4} "
              f"{'yes' if r['clean'] else '-':>5} {'YES' if r['worse'] else '-':>5} "
              f"{'yes' if r['idempotent'] else 'NO':>4}")
    met = fraction >= GOAL and not worse and all(r["idempotent"] for r in rows)
    print(f"fixed clean: {len(clean)} of {len(buggy)} buggy files ({fraction:.0%}); made worse: "
          f"{len(worse)}; goal (at least 2/3 clean, none worse, fix --write twice changes nothing): "
          f"{'met' if met else 'NOT met'}")
    for r in buggy:
        if not r["clean"]:
            print(f"  left in {r['file']}: " + "; ".join(r["not_fixed"]) if r["not_fixed"] else
                  f"  left in {r['file']}: {r['left']} finding(s) after the edits")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fix_coverage.json").write_text(json.dumps(
        {"goal": "at least 2/3 of the buggy files (a finding at warning or above) fixed clean (proven), none "
                 "made worse, fix twice changes nothing the second time",
         "files": len(rows), "buggy": len(buggy), "clean": len(clean), "fraction_clean": fraction,
         "made_worse": len(worse), "met": met, "python": platform.python_version(), "rows": rows},
        indent=2) + "\n")


if __name__ == "__main__":
    main()
