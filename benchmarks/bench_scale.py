"""How placecheck scales: wall time and peak RSS of an audit, against a plain ``.to()`` + forward.

For each model (resnet50, vit_b_16, Llama-shaped 7B and 70B configs, a
synthetic model with 10,000 modules) four measurements run, each in its own
subprocess so that its peak RSS is its own:

- ``audit``: ``placecheck.audit()`` as the CLI runs it (build, move, walk, and
  the forward pass when the API has one), on simulated CUDA;
- ``baseline``: what a training script does on the same engine: build the
  model the same way (CPU, or the meta device where the audit chooses it),
  ``.to("cuda")`` and one forward under ``no_grad``; the audit's overhead is
  the ratio of the two;
- ``walk``: the walk alone, timed around :func:`placecheck.checks.walk.walk` after
  the move;
- ``forward_pair``: the tracer's overhead alone, plain and traced forwards
  alternated on one moved model in one process after a warm-up (medians).
  The audit and the baseline each time one cold forward, which also pays
  one-off costs of the process (fake tensors filling their dispatch cache)
  that swing by 2x between processes; the forward target is judged here.

Times are seconds inside the measured process (after imports); ``process``
is the subprocess's whole wall time, interpreter start and imports included,
which is what a user waits for. Peak RSS is ``ru_maxrss`` of the subprocess,
so it includes the interpreter and torch (about 0.3-0.5 GiB).

    python benchmarks/bench_scale.py [--only resnet50,llama_70b] [--repeat 3]

Prints a table, writes ``benchmarks/results/scale.json`` and, when matplotlib
(the ``bench`` extra) is present, ``benchmarks/results/audit_time.png``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
TIMEOUT_S = 600


@dataclass(frozen=True)
class Spec:
    """A benchmarked model: its factory, its forward inputs, and its size."""

    target: str
    """``module:attr`` of a zero-argument factory."""
    inputs: dict[str, tuple[str, tuple[int, ...], int]]
    """Forward keyword (``""`` for the positional input) -> (dtype, shape, high)."""
    params: float
    """Parameter count, for the plot (checked against the model in the child)."""


MODELS: dict[str, Spec] = {
    "resnet50": Spec("torchvision.models:resnet50", {"": ("float32", (1, 3, 224, 224), 0)}, 25.6e6),
    "vit_b_16": Spec("torchvision.models:vit_b_16", {"": ("float32", (1, 3, 224, 224), 0)}, 86.6e6),
    "many_modules_10k": Spec("placecheck.examples.many_modules:many_modules",
                             {"": ("float32", (8, 16), 0)}, 2500 * (16 * 16 + 16 + 32)),
    "llama_7b": Spec("placecheck.examples.transformers_models:llama_7b",
                     {"input_ids": ("int64", (1, 128), 32000)}, 6.74e9),
    "llama_70b": Spec("placecheck.examples.transformers_models:llama_70b",
                      {"input_ids": ("int64", (1, 128), 128256)}, 70.55e9),
}

TARGETS = {
    # (model, measurement, field): limit, as issue 6 states them
    ("llama_70b", "audit", "process_s"): 10.0,
    ("llama_70b", "audit", "peak_rss_gib"): 1.5,
    ("many_modules_10k", "walk", "seconds"): 1.0,
    # judged on the paired, warm measurement (measure_forward_pair); the cold single forwards of
    # the audit and the baseline are shown beside it
    ("resnet50", "forward_pair", "ratio"): 1.5,
    ("vit_b_16", "forward_pair", "ratio"): 1.5,
}


# -- the child: one measurement ----------------------------------------------------------------------

def _factory(spec: Spec) -> Any:
    """The model's factory, with everything it imports already imported (times exclude imports)."""
    import importlib

    module, _, attr = spec.target.partition(":")
    imported = importlib.import_module(module)
    if hasattr(imported, "_transformers"):
        imported._transformers()  # transformers is imported lazily, on the first build
    return getattr(imported, attr)


def _inputs(spec: Spec) -> tuple[list[Any], dict[str, Any]]:
    """The forward inputs, created on the current default device and fake mode."""
    import torch

    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for name, (dtype, shape, high) in spec.inputs.items():
        if dtype.startswith("int"):
            value = torch.randint(0, high, shape, dtype=getattr(torch, dtype), device="cuda")
        else:
            value = torch.randn(shape, dtype=getattr(torch, dtype), device="cuda")
        if name:
            kwargs[name] = value
        else:
            args.append(value)
    return args, kwargs


def _input_specs(spec: Spec) -> list[str]:
    """The same inputs as ``--input`` strings (``input_ids=int64[1,128]:0..32000``)."""
    out = []
    for name, (dtype, shape, high) in spec.inputs.items():
        text = f"{dtype}[{','.join(map(str, shape))}]" + (f":0..{high}" if high else "")
        out.append(f"{name}={text}" if name else text)
    return out


def _build(factory: Any) -> tuple[Any, str]:
    """Build as ``--init auto`` would: on meta when the CPU build would not fit."""
    from placecheck.model.construct import InitChoice, construct

    built = construct(factory, InitChoice.AUTO, "cuda:0", lambda f: f())
    model = built.model.eval()
    return model, "meta" if built.on_meta else "cpu"


class ForwardTimer:
    """Times every call of a model's root ``forward`` with hooks, whoever makes the call.

    Inside the audit the forward runs under placecheck's tracer; hooks on the
    root module time it without knowing anything of the tracer.
    """

    def __init__(self) -> None:
        self.calls: list[float] = []
        self._start = 0.0

    def attach(self, model: Any) -> Any:
        model.register_forward_pre_hook(self._begin)
        model.register_forward_hook(self._end)
        return model

    def _begin(self, *_: Any) -> None:
        self._start = time.perf_counter()

    def _end(self, *_: Any) -> None:
        self.calls.append(time.perf_counter() - self._start)

    @property
    def seconds(self) -> float | None:
        return sum(self.calls) if self.calls else None


def measure_audit(spec: Spec) -> dict[str, Any]:
    from placecheck.commands.api import audit

    kwargs: dict[str, Any] = {}
    if "inputs" in inspect.signature(audit).parameters:
        kwargs["inputs"] = _input_specs(spec)
    timer = ForwardTimer()
    factory = _factory(spec)
    start = time.perf_counter()
    report = audit(lambda: timer.attach(factory()), "cuda", init="auto", target=spec.target, **kwargs)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "forward_s": timer.seconds, "forward_calls": len(timer.calls),
            "findings": [f"{f.code} {f.where} {f.message}" for f in report.findings],
            "notes": list(report.notes)}


def measure_baseline(spec: Spec) -> dict[str, Any]:
    import torch

    from placecheck.engines.engine import choose_engine, move_model

    engine = choose_engine("cuda:0")
    factory = _factory(spec)
    start = time.perf_counter()
    model, init = _build(factory)
    built = time.perf_counter()
    with engine.session(), torch.no_grad():
        moved = move_model(model, engine)
        moved_at = time.perf_counter()
        args, kwargs = _inputs(spec)
        timer = ForwardTimer()
        timer.attach(moved)(*args, **kwargs)
        end = time.perf_counter()
    return {"seconds": end - start, "build_s": built - start, "move_s": moved_at - built,
            "forward_s": timer.seconds, "init": init, "engine": engine.name}


def measure_walk(spec: Spec) -> dict[str, Any]:
    from placecheck.checks.walk import Snapshot, walk
    from placecheck.engines.engine import choose_engine, move_model

    engine = choose_engine("cuda:0")
    model, init = _build(_factory(spec))
    with engine.session():
        snapshot = Snapshot.take(model)
        moved = move_model(model, engine)
        start = time.perf_counter()
        result = walk(moved, engine.device, snapshot)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "modules": result.stats["modules"], "init": init}


PAIRED_RUNS = 5
"""Warm forwards of each kind in :func:`measure_forward_pair` (fewer for a forward over 1 s)."""


def measure_forward_pair(spec: Spec) -> dict[str, Any]:
    """The tracer's overhead alone: plain and traced forwards alternated on one moved model.

    A single cold forward (what ``audit`` and ``baseline`` time) also pays
    one-off costs that have nothing to do with the tracer: fake tensors fill
    their dispatch cache, convolutions pick a backend, and the process's
    earlier work differs. Those swing a 0.1 s forward by 2x between processes.
    Here both kinds run in one process on the same model and inputs, each
    warmed up once, then alternated; the medians are compared.
    """
    import statistics

    import torch

    from placecheck.checks.trace import Tracer
    from placecheck.checks.walk import Snapshot, walk
    from placecheck.engines.engine import choose_engine, move_model
    from placecheck.model.inputs import move_inputs

    engine = choose_engine("cuda:0")
    model, init = _build(_factory(spec))
    with engine.session(), torch.no_grad():
        snapshot = Snapshot.take(model)
        moved = move_model(model, engine)
        result = walk(moved, engine.device, snapshot)
        args, kwargs = _inputs(spec)
        args, kwargs = move_inputs(tuple(args), engine.device), move_inputs(kwargs, engine.device)

        def plain() -> float:
            start = time.perf_counter()
            moved(*args, **kwargs)
            return time.perf_counter() - start

        def traced() -> float:
            tracer = Tracer(moved, engine.device, result, move=lambda t: move_inputs(t, engine.device))
            start = time.perf_counter()
            tracer.run(args, kwargs)
            return time.perf_counter() - start

        warm = plain() + traced()
        runs = PAIRED_RUNS if warm < 2.0 else 2
        times: dict[str, list[float]] = {"plain": [], "traced": []}
        for _ in range(runs):
            times["plain"].append(plain())
            times["traced"].append(traced())
    plain_s, traced_s = statistics.median(times["plain"]), statistics.median(times["traced"])
    return {"seconds": traced_s, "plain_s": plain_s, "traced_s": traced_s, "runs": runs,
            "ratio": traced_s / plain_s, "init": init}


MEASUREMENTS = {"audit": measure_audit, "baseline": measure_baseline, "walk": measure_walk,
                "forward_pair": measure_forward_pair}


def child(kind: str, name: str) -> None:
    result = MEASUREMENTS[kind](MODELS[name])
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print("RESULT " + json.dumps(result))


# -- the parent: run every measurement in its own process ----------------------------------------------

def run_child(kind: str, name: str) -> dict[str, Any]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", kind, name], capture_output=True,
                              text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT_S} s"}
    process_s = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    result["process_s"] = process_s
    return result


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest successful run (timings on a shared machine are noisy upwards)."""
    ok = [r for r in runs if "error" not in r]
    return min(ok, key=lambda r: r["seconds"]) if ok else runs[-1]


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.2f}{unit}" if isinstance(value, float) else str(value)


def table(results: dict[str, dict[str, Any]]) -> str:
    from tabulate import tabulate

    rows = []
    for name, res in results.items():
        a, b, w, pair = res["audit"], res["baseline"], res["walk"], res.get("forward_pair", {})
        ratio = a.get("seconds", 0) / b["seconds"] if "seconds" in a and b.get("seconds") else None
        rows.append([
            name, f"{MODELS[name].params / 1e9:.3g}B" if MODELS[name].params >= 1e9 else
            f"{MODELS[name].params / 1e6:.3g}M", b.get("init", "-"),
            _fmt(a.get("seconds")), _fmt(a.get("process_s")), _fmt(a.get("peak_rss_gib")),
            _fmt(b.get("seconds")), _fmt(b.get("peak_rss_gib")), _fmt(ratio),
            _fmt(a.get("forward_s")), _fmt(b.get("forward_s")), _fmt(res.get("forward_ratio")),
            _fmt(pair.get("traced_s")), _fmt(pair.get("plain_s")), _fmt(pair.get("ratio")),
            _fmt(w.get("seconds")), _fmt(w.get("peak_rss_gib")),
        ])
    headers = ["model", "params", "init", "audit s", "audit process s", "audit RSS GiB",
               "baseline s", "baseline RSS GiB", "audit / baseline", "cold traced fwd s",
               "cold plain fwd s", "cold fwd ratio", "warm traced fwd s", "warm plain fwd s",
               "warm fwd ratio", "walk s", "walk RSS GiB"]
    return tabulate(rows, headers=headers, tablefmt="github")


def check_targets(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for (name, kind, field), limit in TARGETS.items():
        if name not in results:
            continue
        if kind == "forward_pair":
            value = results[name][kind].get(field)
            label = f"{name}: instrumented forward / plain forward (warm, same process, median)"
        else:
            value = results[name][kind].get(field)
            label = f"{name}: {kind} {field}"
        if value is None:
            lines.append(f"- {label}: not measured (target <= {limit})")
            continue
        verdict = "met" if value <= limit else f"MISSED by {value - limit:.2f} ({value / limit:.2f}x)"
        lines.append(f"- {label} = {value:.2f} (target <= {limit}): {verdict}")
    return lines


def plot(results: dict[str, dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, label, marker in (("audit", "placecheck audit (in process)", "o"),
                                ("baseline", ".to() + forward, same engine", "s")):
        points = sorted((MODELS[n].params, r[kind]["seconds"], n) for n, r in results.items()
                        if "seconds" in r[kind])
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, label=label)
        if kind == "audit":
            for x, y, name in points:
                ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("wall time (s)")
    ax.set_title("placecheck audit time against model size (simulated CUDA, 2-core CPU)\n"
                 "many_modules_10k is slow for its size: 10,000 modules, 7,500 tensors to move", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated model names: " + ", ".join(MODELS))
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the fastest is kept")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    names = args.only.split(",") if args.only else list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)}: use {', '.join(MODELS)}")
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        results[name] = {}
        for kind in MEASUREMENTS:
            results[name][kind] = best([run_child(kind, name) for _ in range(max(1, args.repeat))])
            if "error" in results[name][kind]:
                print(f"{name} {kind}: {results[name][kind]['error']}", file=sys.stderr)
        traced, plain = results[name]["audit"].get("forward_s"), results[name]["baseline"].get("forward_s")
        results[name]["forward_ratio"] = traced / plain if traced and plain else None
    RESULTS.mkdir(parents=True, exist_ok=True)
    print(table(results))
    print()
    print("\n".join(check_targets(results)))
    payload = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "platform": platform.platform()},
               "targets": {"/".join(k): v for k, v in TARGETS.items()}, "results": results}
    (RESULTS / "scale.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    if plot(results, RESULTS / "audit_time.png"):
        print(f"\nwrote {RESULTS / 'scale.json'} and {RESULTS / 'audit_time.png'}")
    else:
        print(f"\nwrote {RESULTS / 'scale.json'} (no plot: pip install 'placecheck[bench]')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
