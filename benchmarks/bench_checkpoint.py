"""Checkpoint inspection against a plain ``torch.load``: wall time and peak RSS on a >= 2 GB file.

A checkpoint of ``--tensors`` float32 tensors totalling ``--gib`` GiB (default
512 x 4 MiB = 2 GiB) is generated in a temporary directory (deleted after),
once per format (``torch.save`` zip and safetensors). Then, each in its own
subprocess so that its peak RSS is its own (``ru_maxrss`` of that process,
interpreter and torch included):

- ``inspect``: :func:`placecheck.checkpoint.check_checkpoint` on the file
  (what ``placecheck checkpoint FILE`` does: index, globals, device table);
- ``load``: ``torch.load(path, map_location="cpu", weights_only=True)``
  (safetensors: ``safetensors.torch.load_file(path)``), what a script does;
- ``index``: reading the index alone with the standard library (the zip's
  central directory and ``data.pkl``; the safetensors header): the floor
  that "inspected in about the time it takes to read its index" refers to.

safetensors' ``load_file`` maps the file and touches no page until a tensor
is used, so its "load" is itself nearly free: the ratio that matters is the
``torch.save`` one, where ``torch.load`` reads and copies every byte.

Times are seconds inside the measured process, after imports; the best of
``--repeat`` runs. The file was just written, so every measurement reads it
from the page cache: the ratios are CPU and memory work, not disk speed (a
cold ``torch.load`` would be slower still; the inspection reads a few KiB).

    python benchmarks/bench_checkpoint.py [--gib 2] [--tensors 512] [--repeat 3]

Prints a table and writes ``benchmarks/results/checkpoint.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
TIMEOUT_S = 600
KINDS = ("inspect", "load", "index")
FORMATS = ("zip", "safetensors")


def _peak_rss_bytes() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def child(kind: str, path: str) -> dict[str, Any]:
    """Run one measurement in this (fresh) process."""
    # Every kind imports the same modules before the clock starts: only the work is timed.
    import safetensors.torch
    import tabulate  # noqa: F401  (the report's device table uses it)
    import torch

    from placecheck.checkpoint import check_checkpoint

    start = time.perf_counter()
    if kind == "inspect":
        result = check_checkpoint(path, device="cpu")
        tensors = dict(result.report.stats)["tensors"]
    elif kind == "load":
        if path.endswith(".safetensors"):
            tensors = len(safetensors.torch.load_file(path))
        else:
            tensors = len(torch.load(path, map_location="cpu", weights_only=True))
    elif kind == "index":
        tensors = _read_index(path)
    else:
        raise SystemExit(f"unknown kind {kind}")
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_rss": _peak_rss_bytes(), "tensors": tensors}


def _read_index(path: str) -> int:
    """The index alone, with the standard library: what no inspection can beat."""
    import pickletools
    import struct
    import zipfile

    if path.endswith(".safetensors"):
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            return sum(1 for k in json.loads(fh.read(length)) if k != "__metadata__")
    with zipfile.ZipFile(path) as zf:
        data_pkl = next(n for n in zf.namelist() if n.endswith("/data.pkl"))
        payload = zf.read(data_pkl)
    return sum(1 for op, _, _ in pickletools.genops(payload) if op.name == "BINPERSID")


def run_child(kind: str, path: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", kind, str(path)], capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def generate(fmt: str, directory: Path, gib: float, tensors: int) -> Path:
    """Write the checkpoint in a subprocess (its memory is given back before measuring)."""
    path = directory / ("big.safetensors" if fmt == "safetensors" else "big.pt")
    code = (
        "import sys, torch\n"
        f"n, numel = {tensors}, int({gib} * 2**30 / 4 / {tensors})\n"
        "state = {f'layers.{i}.weight': torch.full((numel,), float(i)) for i in range(n)}\n"
        f"if {fmt == 'safetensors'}:\n"
        "    from safetensors.torch import save_file; save_file(state, sys.argv[1])\n"
        "else:\n"
        "    torch.save(state, sys.argv[1])\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=TIMEOUT_S)
    return path


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    return {"seconds": min(r["seconds"] for r in ok), "peak_rss": max(r["peak_rss"] for r in ok),
            "tensors": ok[0]["tensors"], "runs": len(ok)}


def _ratio(a: dict[str, Any], b: dict[str, Any], key: str) -> float | None:
    return a[key] / b[key] if key in a and key in b and b[key] else None


def table(results: dict[str, dict[str, Any]]) -> str:
    from tabulate import tabulate

    rows = []
    for fmt, res in results.items():
        for kind in KINDS:
            r = res[kind]
            if "error" in r:
                rows.append((fmt, kind, "error", r["error"][:60], "", ""))
                continue
            rows.append((fmt, kind, f"{r['seconds']:.3f}", f"{r['peak_rss'] / 2**20:.0f}",
                         r["tensors"], ""))
        t, m = res.get("time_ratio"), res.get("rss_ratio")
        if t is not None and m is not None:
            rows.append((fmt, "inspect / load", f"{t:.4f}", f"{m:.3f}", "", "ratios"))
    return tabulate(rows, headers=("format", "measurement", "seconds", "peak RSS MiB", "tensors", ""),
                    tablefmt="simple")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="checkpoint size in GiB (default 2)")
    parser.add_argument("--tensors", type=int, default=512, help="number of tensors (default 512)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is kept")
    parser.add_argument("--formats", default=",".join(FORMATS), help="zip,safetensors")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(*args.child)))
        return 0

    results: dict[str, dict[str, Any]] = {}
    directory = Path(tempfile.mkdtemp(prefix="placecheck-bench-"))
    try:
        for fmt in [f.strip() for f in args.formats.split(",") if f.strip()]:
            path = generate(fmt, directory, args.gib, args.tensors)
            res: dict[str, Any] = {"file_bytes": path.stat().st_size}
            for kind in KINDS:
                res[kind] = best([run_child(kind, path) for _ in range(max(1, args.repeat))])
                if "error" in res[kind]:
                    print(f"{fmt} {kind}: {res[kind]['error']}", file=sys.stderr)
            res["time_ratio"] = _ratio(res["inspect"], res["load"], "seconds")
            res["rss_ratio"] = _ratio(res["inspect"], res["load"], "peak_rss")
            res["inspect_over_index"] = _ratio(res["inspect"], res["index"], "seconds")
            results[fmt] = res
            path.unlink()
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    print(table(results))
    RESULTS.mkdir(exist_ok=True)
    payload = {"machine": {"platform": platform.platform(), "python": platform.python_version(),
                           "cpus": os.cpu_count()},
               "gib": args.gib, "tensors": args.tensors, "repeat": args.repeat, "results": results}
    (RESULTS / "checkpoint.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS / 'checkpoint.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
