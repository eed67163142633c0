"""``--device-map auto`` on a Llama-shaped 8B model over 4 simulated 24 GiB GPUs: time and memory.

Issue 11's target: ``placecheck audit placecheck.examples.transformers_models:llama_8b --init meta
--device-map auto --gpus 4 --gpu-memory 24GiB`` audits (map, dispatch, walk and one forward) in under
15 s and 2 GiB of RAM on this machine. Three commands run, each in its own process so that its peak
RSS is its own (``os.wait4``'s ``ru_maxrss``, and its CPU time), alternated ``--repeat`` times
(medians). On a shared machine the wall time stretches with the load (recorded in the results);
the CPU time and the ratio to ``plain`` measured in the same run do much less:

- ``device_map``: the audit above, from the command line as a user runs it (interpreter start and
  imports included);
- ``plain``: the same model audited on one simulated GPU (``--device cuda --init meta``), the audit
  without a device map: ``device_map / plain`` is what the map, the dispatch and accelerate's hooks
  cost;
- ``accelerate``: what a user runs without placecheck to get the map alone: build on meta and
  ``infer_auto_device_map`` with ``get_balanced_memory``'s budget (no dispatch, no forward).

    python benchmarks/bench_device_map.py [--repeat 3] [--tokens 16]

Prints a table and writes ``benchmarks/results/device_map.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 15.0
LIMIT_RSS_GIB = 2.0
TARGET = "placecheck.examples.transformers_models:llama_8b"
VOCAB = 128256

_ACCELERATE_ONLY = """
import os, torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from accelerate import infer_auto_device_map
from accelerate.utils import get_balanced_memory
from placecheck.examples.transformers_models import llama_8b
with torch.device("meta"):
    model = llama_8b()
budget = {i: 24 * 2**30 for i in range(4)}
no_split = model._get_no_split_modules("auto")
balanced = get_balanced_memory(model, max_memory=dict(budget), no_split_module_classes=no_split)
print(len(infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=no_split)))
"""


def commands(tokens: int) -> dict[str, list[str]]:
    audit = [sys.executable, "-m", "placecheck", "audit", TARGET, "--init", "meta",
             "--input", f"input_ids=int64[1,{tokens}]:0..{VOCAB}", "--format", "json", "--exit-zero"]
    return {
        "device_map": [*audit, "--device-map", "auto", "--gpus", "4", "--gpu-memory", "24GiB"],
        "plain": [*audit, "--device", "cuda"],
        "accelerate": [sys.executable, "-c", _ACCELERATE_ONLY],
    }


def measure(argv: list[str]) -> dict[str, Any]:
    """Run ``argv`` in the repository root; its wall time, peak RSS and output."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv[:6])}... failed ({proc.returncode}): "
                         f"{(stderr.strip().splitlines() or ['no output'])[-1]}")
    return {"s": seconds, "peak_rss_gib": usage.ru_maxrss / 2**20, "cpu_s": usage.ru_utime + usage.ru_stime,
            "stdout": stdout}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16, help="sequence length of the input (batch 1)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in commands(args.tokens)}
    for _ in range(args.repeat):  # alternated, so that a busy moment on a shared machine hits all three
        for name, cmd in commands(args.tokens).items():
            runs[name].append(measure(cmd))
    report = json.loads(runs["device_map"][-1]["stdout"])
    results = {name: {"s": statistics.median(r["s"] for r in rs),
                      "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                      "peak_rss_gib": max(r["peak_rss_gib"] for r in rs),
                      "runs_s": [round(r["s"], 2) for r in rs]}
               for name, rs in runs.items()}
    ratios = {"device_map/plain": results["device_map"]["s"] / results["plain"]["s"],
              "device_map/accelerate": results["device_map"]["s"] / results["accelerate"]["s"]}
    met = results["device_map"]["s"] < LIMIT_S and results["device_map"]["peak_rss_gib"] < LIMIT_RSS_GIB
    print(f"{'command':<12}{'median s':>10}{'CPU s':>8}{'peak RSS':>11}  runs")
    for name, r in results.items():
        print(f"{name:<12}{r['s']:>10.2f}{r['cpu_s']:>8.2f}{r['peak_rss_gib']:>9.2f} G  {r['runs_s']}")
    print("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    print(f"target (< {LIMIT_S:.0f} s, < {LIMIT_RSS_GIB:.0f} GiB): {'met' if met else 'MISSED'} "
          f"(load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after, "
          f"{os.cpu_count()} CPUs)")
    RESULTS.mkdir(exist_ok=True)
    payload = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(),
                    # a shared machine: wall times stretch with the load, CPU times much less
                    "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]},
        "targets": {"s": LIMIT_S, "peak_rss_gib": LIMIT_RSS_GIB},
        "command": " ".join(["placecheck", *commands(args.tokens)["device_map"][3:]]),
        "results": results,
        "ratios": ratios,
        "met": met,
        "device_map": report.get("device_map"),
        "summary": report.get("summary"),
        "findings": sorted({f"{f['code']} {f['where']}" for f in report.get("findings", [])}),
    }
    out = RESULTS / "device_map.json"
    out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
