"""The machine a benchmark ran on, and how fast it is: a fixed reference workload, timed in the same run.

Issue 14's targets are absolute times (30 s for a DeepSeek-V3-shaped audit, 7 minutes for
``make test``), and the project's machines differ: the same code audited DeepSeek-V3 in 61 s on one
2-core machine and in 20 to 21 s on another, two days later. Each benchmark that reports an absolute time
records :func:`describe`, whose ``reference_s`` is the time of a workload that does not depend on
placecheck's code but exercises what an audit spends its time on (Python object churn and torch's
dispatch on meta tensors), so that results of two runs can be compared (divide by ``reference_s``).

It runs in fresh interpreters (a benchmark such as ``bench_pool`` never imports torch itself), three
times, keeping the fastest; ``torch_import_s`` is the fastest ``import torch`` of the three.

    python benchmarks/machine.py     # prints the description as JSON
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any

REFERENCE = """
import time
start = time.perf_counter()
import torch, torch.nn as nn
imported = time.perf_counter()
with torch.device("meta"):
    layers = nn.Sequential(*[nn.Linear(256, 256) for _ in range(3000)])
x = torch.empty(4, 256, device="meta")
for layer in layers:
    x = layer(x)
table = {i: str(i) for i in range(300_000)}
total = sum(len(v) for v in table.values())
print(imported - start, time.perf_counter() - imported)
"""


def reference(repeats: int = 3) -> dict[str, float]:
    """The fastest of ``repeats`` runs of :data:`REFERENCE`: ``reference_s`` and ``torch_import_s``."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", REFERENCE], capture_output=True, text=True, check=True)
        imported, work = (float(v) for v in out.stdout.split())
        runs.append((work, imported))
    return {"reference_s": round(min(w for w, _ in runs), 3),
            "torch_import_s": round(min(i for _, i in runs), 3)}


def describe(**extra: Any) -> dict[str, Any]:
    """The machine: CPUs, Python, platform, load average, and :func:`reference`'s timings; plus ``extra``."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "load_average": [round(v, 2) for v in os.getloadavg()], **reference(), **extra}


if __name__ == "__main__":
    print(json.dumps(describe(), indent=2))
