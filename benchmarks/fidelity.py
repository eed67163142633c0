"""Real-GPU fidelity: does the simulation find what a real GPU run finds?

Every fixture model (``tests/fixtures/{forward,walk,seeds}``), every example
model (``placecheck/examples``) and the torchvision zoo (``configs/torchvision.toml``)
is audited twice for ``cuda``: once on the real GPU (``--engine real``, the
reference) and once simulated with fake tensors (``--engine fake``); where
fake tensors stop before the end of the forward, also with real values
(``--engine tagged``), the engine ``auto`` falls back to. The findings of each
simulated audit are compared with the reference's as ``(code, where,
source)`` rows: equal sets agree; every disagreement is listed with the rows
only one side has and its reason, from :data:`KNOWN_DIFFERENCES` (a limit of
the simulation, documented there) or "unexplained" (a bug to fix).

The training examples are scripts (``placecheck/examples/train_*.py``: their
top level trains), never imported: each runs as ``python SCRIPT`` on the GPU
(the reference) and through ``placecheck run SCRIPT`` (simulated, real values),
and what is compared is where it crashes: the line of the real run's error
against the lines of ``run``'s errors (PC201, PC207), as ``raises FILE:LINE``
rows (none: it runs through).

Scale, on the GPU too: the real-engine audit of resnet50 and of a
1B-parameter Llama-shaped model (real weights on the GPU) beside the
simulated audit of the same model (fake tensors; the Llama built on the meta
device), time and findings side by side.

    python benchmarks/fidelity.py                 # make fidelity: needs a CUDA GPU
    python benchmarks/fidelity.py --only fixtures --limit 5
    python benchmarks/fidelity.py --reference tagged --engines fake --out /tmp/f.json

It runs only where a CUDA GPU is present: elsewhere it says so and exits 0,
writing nothing. ``--reference tagged`` compares two simulations on the CPU
instead (how the comparison itself is tested without a GPU); that needs an
explicit ``--out``, so that ``benchmarks/results/fidelity.json`` only ever
holds a real GPU's results. Prints a markdown table for the README.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import io
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import tomllib

from placecheck.basics.limits import fidelity_limits  # torch-free: the one table of known differences

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FIXTURE_DIRS = ("forward", "walk", "seeds")
KINDS = ("fixtures", "examples", "scripts", "zoo", "scale")
ENGINES = ("real", "fake", "tagged")

KNOWN_DIFFERENCES: dict[tuple[str, str], str] = fidelity_limits()
"""(target, engine) -> why its findings differ from the real GPU's: a documented limit of the simulation,
from the one table of them (placecheck.basics.limits, docs/simulation-limits.md). An entry that no longer
differs is reported as stale."""


@dataclasses.dataclass(frozen=True)
class Target:
    """One model to audit on every engine."""

    kind: str
    """fixtures | examples | scripts | zoo"""
    name: str
    factory: Callable[[], Any]
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of :func:`placecheck.audit` beyond the engine (inputs, init...)."""
    script: Path | None = None
    """A script to run (``python SCRIPT`` for real, ``placecheck run SCRIPT`` simulated), not a model."""


# -- the targets -------------------------------------------------------------------------------
def fixture_targets(root: Path = ROOT) -> list[Target]:
    """Every fixture file defining ``Model``, with the ``INPUTS`` it names (else the input is inferred)."""
    from placecheck.model.load import resolve

    targets = []
    for directory in FIXTURE_DIRS:
        for path in sorted((root / "tests" / "fixtures" / directory).glob("*.py")):
            if "Model" not in path.read_text(encoding="utf-8"):
                continue
            model = resolve(f"{path}:Model")  # as the CLI loads a file target
            inputs = list(getattr(sys.modules[model.__module__], "INPUTS", []))
            targets.append(Target("fixtures", f"{directory}/{path.stem}", model, {"inputs": inputs}))
    return targets


EXAMPLES = ROOT / "placecheck" / "examples"


def is_script(path: Path) -> bool:
    """True when importing ``path`` would run a loop or a ``with`` block at its top level (a training
    loop): a script, which is run, never imported. Read with ``ast``, not imported. Definitions,
    imports, assignments, a call such as ``os.environ.setdefault(...)`` and an ``if __name__ ==
    "__main__":`` block leave a module importable."""
    loops = ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith
    return any(isinstance(node, loops) for node in ast.parse(path.read_text(encoding="utf-8")).body)


def example_targets() -> list[Target]:
    """Every model class and function of ``placecheck.examples`` that needs no arguments (a block
    taking its width is part of a model, not one); the transformers ones where it is installed. The
    training scripts are :func:`script_targets`, never imported here."""
    import inspect
    import pkgutil

    import torch.nn as nn

    import placecheck.examples as examples

    targets = []
    for info in sorted(pkgutil.iter_modules(examples.__path__), key=lambda m: m.name):
        if is_script(EXAMPLES / f"{info.name}.py"):
            continue
        with _quiet():
            module = importlib.import_module(f"placecheck.examples.{info.name}")
        for attr, value in sorted(vars(module).items()):
            if attr.startswith("_") or getattr(value, "__module__", "") != module.__name__:
                continue
            if not ((isinstance(value, type) and issubclass(value, nn.Module)) or inspect.isfunction(value)):
                continue
            required = [p for p in inspect.signature(value).parameters.values()
                        if p.default is inspect.Parameter.empty
                        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            if not required:
                targets.append(Target("examples", f"{info.name}:{attr}", value))
    return targets


def script_targets(root: Path = EXAMPLES) -> list[Target]:
    """The training examples (:func:`is_script`), to run whole: ``python`` on the GPU, ``placecheck run``
    simulated."""
    return [Target("scripts", path.name, lambda: None, script=path)
            for path in sorted(root.glob("*.py")) if is_script(path)]


def zoo_targets(config: Path = ROOT / "configs" / "torchvision.toml") -> list[Target]:
    """The torchvision zoo config's entries, with their builder arguments and inputs."""
    from placecheck.model.load import build, parse_kwargs, resolve, split_target

    data = tomllib.loads(config.read_text(encoding="utf-8"))
    targets = []
    for entry in data.get("models", []):
        target = entry["target"]
        kwargs = parse_kwargs(None, entry.get("args", []))
        _, attr = split_target(target)

        def factory(target: str = target, attr: str = attr, kwargs: dict[str, Any] = kwargs) -> Any:
            return build(resolve(target), attr, kwargs)

        options: dict[str, Any] = {"inputs": list(entry.get("inputs", []))}
        if entry.get("example_inputs"):
            options["example_inputs"] = entry["example_inputs"]
        if entry.get("init"):
            options["init"] = entry["init"]
        targets.append(Target("zoo", target.split(":")[-1], factory, options))
    return targets


def targets_of(kinds: tuple[str, ...]) -> list[Target]:
    found: list[Target] = []
    if "fixtures" in kinds:
        found += fixture_targets()
    if "examples" in kinds:
        found += example_targets()
    if "scripts" in kinds:
        found += script_targets()
    if "zoo" in kinds:
        with contextlib.suppress(ImportError):
            import torchvision  # noqa: F401

            found += zoo_targets()
    return found


# -- auditing and comparing -------------------------------------------------------------------
def rows(report: Any) -> list[list[str]]:
    """A report's findings as sorted ``[code, where, source]`` rows (what fidelity compares)."""
    return sorted({(f.code, f.where, f.source) for f in report.findings})  # type: ignore[return-value]


@dataclasses.dataclass
class Audit:
    """One target audited on one engine."""

    engine: str
    rows: list[list[str]]
    seconds: float
    incomplete: str = ""
    error: str = ""
    engine_name: str = ""
    skipped: str = ""
    """Why it was not audited at all (its weights do not fit where this engine keeps them)."""

    @property
    def fake_stopped(self) -> bool:
        """Fake tensors stopped before the end of the forward (``auto`` would fall back to tagged)."""
        return self.engine == "fake" and self.incomplete.startswith("fake tensors stopped")


def state_bytes(target: Target) -> int | None:
    """Bytes of the target's parameters and buffers, from a build on the meta device (None: unknown)."""
    import torch

    from placecheck.model.construct import state_nbytes

    if target.script is not None:
        return None
    try:
        with torch.device("meta"), _quiet():
            return state_nbytes(target.factory())
    except Exception:
        return None


SIMULATED_GPUS = 8
"""How many GPUs :func:`gpus_needed` simulates while it builds a target to see which it uses."""


def gpus_needed(target: Target) -> int:
    """How many GPUs the target's own code places tensors on (``pipeline:BuggyPipeline`` puts its second
    stage on ``cuda:1``: 2); 1 for a model the audit moves to one device, a script, or a target that does
    not build on simulated CUDA. Built on :data:`SIMULATED_GPUS` simulated GPUs, as ``audit --device
    keep`` builds it: the devices its tensors are on decide, never its name."""
    if target.script is not None:
        return 1
    from placecheck.engines.engine import simulated_cuda
    from placecheck.placement.placed import devices_used, highest_gpu

    try:
        with _quiet(), simulated_cuda(gpus=SIMULATED_GPUS):
            return max(1, highest_gpu(devices_used(target.factory())) + 1)
    except Exception:
        return 1


def gpus_present() -> int:
    """The CUDA GPUs this machine has (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def room_for(engine: str) -> int | None:
    """Bytes an engine that holds the weights can give them: the GPU's free memory for ``real``,
    half the available host memory for ``tagged`` (as ``--init auto`` judges); None for ``fake``."""
    import torch

    from placecheck.model.construct import COMFORTABLE_FRACTION, available_memory

    if engine == "real":
        return int(torch.cuda.mem_get_info()[0] * 0.9)
    if engine == "tagged":
        return int(available_memory() * COMFORTABLE_FRACTION)
    return None


def audit(target: Target, engine: str) -> Audit:
    """``target`` audited for ``cuda`` on ``engine``; an audit that raises is kept as its error.

    A model whose weights do not fit where ``engine`` keeps them (``llama_70b`` on one GPU), or whose
    code places tensors on more GPUs than the machine has (``pipeline:BuggyPipeline`` on one), is
    skipped on the real engine, not run: :attr:`Audit.skipped` says why.
    """
    import placecheck

    if target.script is not None:
        return run_script(target.script, engine)
    if engine == "real":  # the reference cannot place a model on GPUs the machine lacks
        need, have = gpus_needed(target), gpus_present()
        if need > have:
            return Audit(engine, [], 0.0, skipped=f"its code places tensors on {need} GPUs (cuda:0 to "
                                                   f"cuda:{need - 1}); this machine has {have}")
    room = room_for(engine)
    if room is not None:
        need = state_bytes(target)
        if need is not None and need > room:
            return Audit(engine, [], 0.0, skipped=f"its weights ({need / 2**30:.1f} GiB) do not fit in the "
                                                   f"{room / 2**30:.1f} GiB the {engine} engine has here")
    start = time.perf_counter()
    try:
        with _quiet():
            report = placecheck.audit(target.factory, "cuda", engine=engine, target=target.name,
                                      **target.options)
    except Exception as exc:
        message = str(exc).strip().splitlines()
        return Audit(engine, [], time.perf_counter() - start,
                     error=f"{type(exc).__name__}: {message[0] if message else ''}")
    return Audit(engine, [list(r) for r in rows(report)], time.perf_counter() - start,
                 incomplete=report.incomplete, engine_name=report.engine)


SCRIPT_STEPS = 2
"""Optimizer steps ``placecheck run`` takes of a training script (where a crash shows first)."""
SCRIPT_TIMEOUT = 600.0


def run_script(path: Path, engine: str) -> Audit:
    """``path`` run whole: on ``real``, as ``python path`` on this machine (its GPU); on any simulated
    engine, through ``placecheck run`` (real values: run's only engine). Its rows are where it crashes,
    ``[["raises", "train.py:49"]]``, or none."""
    start = time.perf_counter()
    if engine == "real":
        try:
            done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=ROOT,
                                  timeout=SCRIPT_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            return Audit(engine, [], time.perf_counter() - start, error=f"ran past {SCRIPT_TIMEOUT:.0f} s")
        line = crash_line(done.stderr, path) if done.returncode else ""
        rows = [["raises", line]] if done.returncode else []
        return Audit(engine, rows, time.perf_counter() - start, engine_name="python")
    import placecheck

    try:
        with _quiet():
            report = placecheck.run(str(path), steps=SCRIPT_STEPS, timeout=SCRIPT_TIMEOUT)
    except Exception as exc:
        message = str(exc).strip().splitlines()
        return Audit(engine, [], time.perf_counter() - start,
                     error=f"{type(exc).__name__}: {message[0] if message else ''}")
    crashes = sorted({_file_line(f.source) for f in report.findings if f.code in ("PC201", "PC207")})
    return Audit(engine, [["raises", line] for line in crashes], time.perf_counter() - start,
                 engine_name="placecheck run")


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)', re.M)


def crash_line(stderr: str, path: Path) -> str:
    """``train.py:49``: the innermost frame of ``path`` in a Python traceback ("" when none is)."""
    frames = [m for m in _FRAME.finditer(stderr) if Path(m["file"]).resolve() == path.resolve()]
    return f"{path.name}:{frames[-1]['line']}" if frames else ""


def _file_line(source: str) -> str:
    """``placecheck/examples/train.py:49`` -> ``train.py:49`` (what :func:`crash_line` gives)."""
    file, _, line = source.rpartition(":")
    return f"{Path(file).name}:{line}"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Model code's own prints and warnings stay out of the table."""
    import warnings

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def compare(name: str, reference: Audit, other: Audit) -> dict[str, Any] | None:
    """None when ``other`` found exactly what ``reference`` found; else the disagreement and its reason."""
    if not reference.error and not other.error and reference.rows == other.rows:
        return None
    ref_rows = {tuple(r) for r in reference.rows}
    other_rows = {tuple(r) for r in other.rows}
    reason = KNOWN_DIFFERENCES.get((name, other.engine), "")
    if reference.error:
        why = f"the reference ({reference.engine}) could not audit it: {reference.error}"
    elif other.error:
        why = f"{other.engine} could not audit it: {other.error}"
    else:
        why = ""
    return {
        "target": name,
        "engine": other.engine,
        "only_reference": sorted(list(r) for r in ref_rows - other_rows),
        "only_engine": sorted(list(r) for r in other_rows - ref_rows),
        "incomplete": other.incomplete,
        "failure": why,
        "reason": reason or "unexplained: a bug until shown to be a limit of the simulation",
        "known": bool(reason),
    }


def run_targets(targets: list[Target], reference: str, engines: tuple[str, ...],
                progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Audit every target on ``reference`` and each of ``engines`` (tagged only where fake tensors
    stop, unless asked for outright) and compare; the payload fidelity.json holds."""
    per_engine: dict[str, dict[str, int]] = {}
    disagreements: list[dict[str, Any]] = []
    results: dict[str, dict[str, Any]] = {}
    for target in targets:
        ref = audit(target, reference)
        audits = {reference: ref}
        for engine in ("run",) if target.script is not None else engines:  # a script has one simulation
            audits[engine] = audit(target, engine)
        fake = audits.get("fake")
        if fake is not None and fake.fake_stopped and "tagged" not in audits and reference != "tagged":
            audits["tagged"] = audit(target, "tagged")  # what auto falls back to
        line = [f"{target.kind:<9}{target.name:<44}"]
        for engine, result in audits.items():
            if engine == reference:
                continue
            counts = per_engine.setdefault(engine, {"compared": 0, "agree": 0, "disagree": 0, "skipped": 0})
            if ref.skipped or result.skipped:
                counts["skipped"] += 1
                line.append(f"{engine}: skipped ({ref.skipped or result.skipped})")
                continue
            counts["compared"] += 1
            difference = compare(target.name, ref, result)
            if difference is None:
                counts["agree"] += 1
                line.append(f"{engine}: agrees")
            else:
                counts["disagree"] += 1
                difference["kind"] = target.kind
                disagreements.append(difference)
                line.append(f"{engine}: DIFFERS")
        progress("  ".join(line))
        results[target.name] = {engine: dataclasses.asdict(result) for engine, result in audits.items()}
    stale = sorted(f"{n} ({e})" for n, e in KNOWN_DIFFERENCES
                   if n in results and not any(d["target"] == n and d["engine"] == e for d in disagreements))
    return {"reference": reference, "per_engine": per_engine, "disagreements": disagreements,
            "stale_known_differences": stale, "results": results}


# -- scale --------------------------------------------------------------------------------------
def llama_1b() -> Any:
    """A Llama-3.2-1B-shaped model (16 layers, 2048 wide, GQA 32/8, 128256 vocabulary): 1.2e9 parameters."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    config = transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                      max_position_embeddings=131072, rope_theta=500000.0,
                                      tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config).eval()


def scale_targets() -> list[tuple[Target, str]]:
    """(target, how the simulated audit builds it) for the scale comparison."""
    from placecheck.model.load import build, resolve

    def resnet50() -> Any:
        return build(resolve("torchvision.models:resnet50"), "resnet50", {})

    return [
        (Target("scale", "resnet50", resnet50, {"inputs": ["float32[1,3,224,224]"]}), "cpu"),
        (Target("scale", "llama_1b", llama_1b, {"inputs": ["input_ids=int64[1,128]:0..128256"]}), "meta"),
    ]


def run_scale(reference: str, progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """The real engine (real weights on the GPU) against fake tensors, per model: time and findings."""
    out = []
    for target, simulated_init in scale_targets():
        real = audit(dataclasses.replace(target, options={**target.options, "init": "cpu"}), reference)
        fake = audit(dataclasses.replace(target, options={**target.options, "init": simulated_init}), "fake")
        same = not real.error and not fake.error and real.rows == fake.rows
        progress(f"scale    {target.name:<12}{reference} {real.seconds:7.1f} s  fake ({simulated_init} init) "
                 f"{fake.seconds:7.1f} s  findings {'agree' if same else 'DIFFER'}")
        out.append({"model": target.name, "simulated_init": simulated_init, "same_findings": same,
                    reference: dataclasses.asdict(real), "fake": dataclasses.asdict(fake)})
    return out


# -- the README table ---------------------------------------------------------------------------
def markdown(payload: dict[str, Any]) -> str:
    """The README's fidelity table: agreement per engine, then every disagreement with its reason."""
    gpu = payload["machine"].get("gpu") or "no GPU"
    lines = [f"Reference: `--engine {payload['reference']}` on {gpu}.", "",
             "| engine | compared | agree | disagree | skipped |", "| --- | ---: | ---: | ---: | ---: |"]
    for engine, c in payload["per_engine"].items():
        lines.append(f"| {engine} | {c['compared']} | {c['agree']} | {c['disagree']} "
                     f"| {c.get('skipped', 0)} |")
    if payload["disagreements"]:
        lines += ["", "| target | engine | only on the reference | only simulated | reason |",
                  "| --- | --- | --- | --- | --- |"]
        for d in payload["disagreements"]:
            ref = "; ".join(" ".join(r) for r in d["only_reference"]) or "-"
            sim = "; ".join(" ".join(r) for r in d["only_engine"]) or "-"
            reason = d["failure"] + ("; " if d["failure"] else "") + d["reason"]
            lines.append(f"| {d['target']} | {d['engine']} | {ref} | {sim} | {reason} |")
    if payload.get("scale"):
        lines += ["", "| model | reference s | fake s (init) | same findings |",
                  "| --- | ---: | ---: | --- |"]
        for s in payload["scale"]:
            ref = s[payload["reference"]]
            lines.append(f"| {s['model']} | {ref['seconds']:.1f} | {s['fake']['seconds']:.1f} "
                         f"({s['simulated_init']}) | {'yes' if s['same_findings'] else 'no'} |")
    return "\n".join(lines)


def _machine() -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return {"gpu": gpu, "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(KINDS), help=f"comma-separated: {', '.join(KINDS)}")
    parser.add_argument("--reference", default="real", choices=ENGINES,
                        help="the engine the others are compared with (real: needs a CUDA GPU)")
    parser.add_argument("--engines", default="fake", help="comma-separated engines compared with it")
    parser.add_argument("--limit", type=int, default=0, help="at most this many targets (0: all)")
    parser.add_argument("--out", default="", help="where the JSON goes (default, with --reference real: "
                                                   "benchmarks/results/fidelity.json)")
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.only.split(",") if k)
    engines = tuple(e for e in args.engines.split(",") if e)
    bad = [k for k in kinds if k not in KINDS] + [e for e in engines if e not in ENGINES]
    if bad or args.reference in engines:
        parser.error(f"unknown or repeated choice {', '.join(bad) or args.reference}: kinds are "
                     f"{', '.join(KINDS)}; engines {', '.join(ENGINES)}, the reference not among --engines")
    if args.reference != "real" and not args.out:
        parser.error("--reference other than real needs --out: benchmarks/results/fidelity.json holds "
                     "a real GPU's results only")
    import torch

    if args.reference == "real" and not torch.cuda.is_available():
        print("make fidelity needs a CUDA GPU, and this machine has none (torch.cuda.is_available() is "
              "False): nothing was audited or written. Run it on a machine with a GPU.")
        return 0
    targets = targets_of(kinds)
    if args.limit:
        targets = targets[:args.limit]
    payload: dict[str, Any] = {"machine": _machine(), **run_targets(targets, args.reference, engines)}
    if "scale" in kinds:
        payload["scale"] = run_scale(args.reference)
    out = Path(args.out) if args.out else RESULTS / "fidelity.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print()
    print(markdown(payload))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
