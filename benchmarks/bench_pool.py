"""A ``--config`` run of the torchvision zoo: warm fork servers against one interpreter per model.

Both paths audit the same config (``configs/torchvision.toml``, 109 models) with
the same ``--jobs``, one after the other in this process (which, like the CLI,
never imports torch):

- ``spawn``: ``--isolation spawn``, a fresh interpreter per model, each paying
  the imports of torch and torchvision (about 3 s here) before its audit;
- ``fork``: ``--isolation fork`` (the default), ``--jobs`` warm servers that
  import torch, torchvision and placecheck's engine once, then fork a fresh
  child per model.

On a shared machine the load drifts during a run of minutes, so the models are
split into two halves (every other model) run in the order spawn, fork, fork,
spawn; each path's wall time is the sum of its two runs (the fork path pays its
servers' warm-up twice, which only counts against it).

Measured: each path's wall time (the whole run, servers' warm-up included) and
the time of each model (its process included, from the job's start to its
result: the first model of each warm server also waits for the server's
imports), shown as min / median / p90 / max. The findings of every model are
compared between the paths (code, where, and for PC901 its reason). Issue 14's
target: the fork path in at most 40% of the spawn path's wall time, same
findings.

    python benchmarks/bench_pool.py [--jobs 2] [--models N] [--config FILE]

``--models N`` runs the first N models only (for a quick check). Prints a table
and writes ``benchmarks/results/pool.json`` once both paths have run the first
half (``complete`` false), and again at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from machine import describe  # noqa: E402

from placecheck.basics.config import load  # noqa: E402
from placecheck.commands.runner import ModelOutcome, run_models  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TARGET_RATIO = 0.40


def _findings(outcome: ModelOutcome) -> list[tuple[str, str, str]]:
    return [(f.code, f.where, dict(f.details).get("reason", "")) for f in outcome.report.findings]


def _distribution(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, max(0, round(0.9 * len(ordered)) - 1))]
    return {"min": ordered[0], "median": statistics.median(ordered), "p90": p90, "max": ordered[-1]}


def _run(config: Any, jobs: int, isolation: str) -> tuple[float, list[ModelOutcome]]:
    started = time.perf_counter()
    outcomes = run_models(config, jobs=jobs, progress="off", workdir=str(REPO), isolation=isolation)
    return time.perf_counter() - started, outcomes


def _summary(wall: float, outcomes: list[ModelOutcome]) -> dict[str, Any]:
    return {
        "wall_s": wall,
        "per_model_s": _distribution([o.seconds for o in outcomes]),
        "failed": sum(o.failed for o in outcomes),
        "models_with_findings": sum(1 for o in outcomes if o.report.findings),
        "findings": {o.model.label: _findings(o) for o in outcomes},
        "seconds": {o.model.label: round(o.seconds, 3) for o in outcomes},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "torchvision.toml"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--models", type=int, default=0, help="only the first N models (0: all)")
    options = parser.parse_args()
    config = load(options.config)
    if options.models:
        config = replace(config, models=config.models[:options.models])
    load_before = os.getloadavg()
    machine = describe(load_average_before=load_before)  # before the runs, on the machine as it is
    halves = [replace(config, models=config.models[0::2]), replace(config, models=config.models[1::2])]
    walls = {"spawn": 0.0, "fork": 0.0}
    outcomes: dict[str, list[ModelOutcome]] = {"spawn": [], "fork": []}
    for step, (isolation, half) in enumerate((("spawn", 0), ("fork", 0), ("fork", 1), ("spawn", 1))):
        if halves[half].models:
            wall, done = _run(halves[half], options.jobs, isolation)
            walls[isolation] += wall
            outcomes[isolation] += done
            print(f"  {isolation} half {half + 1}: {len(done)} models in {wall:.1f} s", flush=True)
        if step in (1, 3):  # both paths have run the same models: a result (the first half's, then all)
            _report(options, config, walls, outcomes, machine, complete=step == 3)
    return 0


def _report(options: Any, config: Any, walls: dict[str, float], outcomes: dict[str, list[ModelOutcome]],
            machine: dict[str, Any], complete: bool) -> None:
    """Print the table and write the JSON of what both paths have run so far."""
    order = {m.label: i for i, m in enumerate(config.models)}
    results = {isolation: _summary(walls[isolation], sorted(done, key=lambda o: order[o.model.label]))
               for isolation, done in outcomes.items()}
    spawn, fork = results["spawn"], results["fork"]
    ratio = fork["wall_s"] / spawn["wall_s"]
    differ = sorted(label for label, found in spawn["findings"].items() if found != fork["findings"][label])
    models = len(outcomes["spawn"])
    print(f"{models} of the {len(config.models)} models of {Path(options.config).name}, --jobs {options.jobs}"
          f"{'' if complete else ' (the first half; the second half follows)'}")
    print(f"{'isolation':10} {'wall s':>8} {'min s':>7} {'median s':>9} {'p90 s':>7} {'max s':>7} "
          f"{'failed':>7} {'with findings':>14}")
    for name, r in results.items():
        d = r["per_model_s"]
        print(f"{name:10} {r['wall_s']:>8.1f} {d['min']:>7.2f} {d['median']:>9.2f} {d['p90']:>7.2f} "
              f"{d['max']:>7.2f} {r['failed']:>7} {r['models_with_findings']:>14}")
    met = ratio <= TARGET_RATIO and not differ
    same = "identical" if not differ else "differ: " + ", ".join(differ)
    print(f"fork / spawn wall time: {ratio:.2f} ({'meets' if ratio <= TARGET_RATIO else 'misses'} the "
          f"{TARGET_RATIO:.0%} target); findings {same}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    name = "pool.json" if not options.models else f"pool-{options.models}.json"
    (RESULTS / name).write_text(json.dumps({
        "machine": {**machine, "load_average_after": os.getloadavg()},
        "config": str(Path(options.config).relative_to(REPO)) if Path(options.config).is_relative_to(REPO)
        else options.config,
        "config_models": len(config.models), "models": models, "complete": complete, "jobs": options.jobs,
        "spawn": spawn, "fork": fork, "ratio": ratio, "target_ratio": TARGET_RATIO,
        "findings_identical": not differ, "findings_differ": differ, "target_met": met,
    }, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
